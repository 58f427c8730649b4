"""Whether a PNG file's image data holds every row its header promises.

PIL decodes a PNG whose zlib stream ends (cleanly) before the last row without an error:
the rows never sent stay zero, a black band that would be encoded as if it were the
person.  A complete file's IDAT data inflate to exactly

    sum over passes p of  h_p * (1 + ceil(w_p * bits / 8))

bytes (one filter byte a row; ``bits`` = bit depth x channels of the colour type; one pass
of ``w x h`` when not interlaced, the seven Adam7 sub-images otherwise, of which those with
no column or no row send nothing).  :func:`missing_bytes` inflates at most that many bytes
and says how many are missing: about half the cost of PIL's own decoding, so
:func:`check_png_complete` runs it only where rows may be missing: a file whose decoded last
row is all zero bytes (missing rows stay zero: PIL allocates the image zeroed, and a
stream ending before the last row never writes it) or an interlaced one (where a missing
pass leaves every other row, not the last, zero).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import RankwiseError

if TYPE_CHECKING:
    from PIL import Image

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples a pixel
#: Adam7 passes: (first column, first row, column step, row step)
_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def expected_bytes(width: int, height: int, depth: int, colour_type: int, interlace: int) -> int:
    """Bytes the image data of a complete PNG with this header inflate to."""
    bits = depth * _CHANNELS[colour_type]
    if not interlace:
        return height * (1 + (width * bits + 7) // 8)
    total = 0
    for x0, y0, dx, dy in _ADAM7:
        w, h = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if w > 0 and h > 0:
            total += h * (1 + (w * bits + 7) // 8)
    return total


def missing_bytes(data: bytes) -> tuple[int, int] | None:
    """``(missing, expected)`` bytes of the image data of the PNG file ``data``, or None
    when it is not a PNG whose header and chunks this can read (PIL has judged those).

    Raises ``zlib.error`` when the image data do not inflate.
    """
    if not data.startswith(_SIGNATURE) or data[12:16] != b"IHDR" or len(data) < 29:
        return None
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    if colour_type not in _CHANNELS:
        return None
    expected = expected_bytes(width, height, depth, colour_type, interlace)
    if expected == 0:  # no pixels (PIL refuses such a file); zlib reads max_length 0 as "all"
        return None
    # IDAT chunks are consecutive (PNG spec 5.6); APNG's later frames are fdAT, not read
    parts: list[bytes] = []
    at = 8
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        if kind == b"IDAT":
            parts.append(data[at + 8 : at + 8 + length])
        elif parts or kind == b"IEND":
            break
        at += 12 + length
    # max_length: never more than the image needs, however the stream was made
    inflated = len(zlib.decompressobj().decompress(b"".join(parts), expected))
    return expected - inflated, expected


def check_png_complete(image: Image.Image, path: Path, where: str) -> None:
    """Raise a one-line :class:`RankwiseError` (prefixed by ``where``) when ``image``, the
    PNG file ``path`` as PIL opened and decoded it, lacks rows or its image data do not
    inflate.  A file PIL did not read as a PNG is not looked at."""
    if image.format != "PNG":
        return
    width, height = image.size
    last_row = image.crop((0, height - 1, width, height)).tobytes()
    if not image.info.get("interlace") and any(last_row):
        return  # the last row was written: the stream did not end early
    try:
        short = missing_bytes(path.read_bytes())
    except zlib.error as exc:
        raise RankwiseError(
            f"{where}: cannot decode image {path} (its image data do not inflate: {exc}); "
            "replace the file"
        ) from None
    if short is not None and short[0] > 0:
        raise RankwiseError(
            f"{where}: cannot decode image {path} (its image data end {short[0]} of "
            f"{short[1]} bytes early: the last rows were never written and would be read "
            "as black); replace the file"
        )
