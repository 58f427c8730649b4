"""MOTChallenge sequences -> person crops and re-association manifests (loader ``mot``).

``mot`` {root, split="train", sequences=null, frames="all", classes=[1],
min_visibility=0.0, min_size=0}

Input, the MOTChallenge layout (MOT16/17/20, DanceTrack, SportsMOT)::

    <root>/<split>/<seq>/seqinfo.ini     [Sequence] seqLength, imWidth, imHeight, imExt (imDir)
    <root>/<split>/<seq>/img1/000001.jpg frames, 6-digit (or 8-digit) numbers from 1
    <root>/<split>/<seq>/gt/gt.txt       frame, id, left, top, width, height, conf, class,
                                         visibility (one box per line)

Rows kept, in this order of tests (the ``reid`` package's ``generate_mot_patches``
rules, so the crops are the ones it writes; where it skips a box wholly outside its
image or a missing frame image, or overwrites a duplicated (frame, track) crop, rankwise
stops with an error naming it): ``conf`` flag > 0 (0 = ignore);
``class`` in ``classes`` (MOT17: 1 = pedestrian; ``null`` keeps every class); the
frame in ``frames`` (below); ``visibility >= min_visibility``; then the box is cut
to pixel columns ``round(left) .. round(left + width)`` and rows ``round(top) ..
round(top + height)`` (Python's ``round``, as the ``reid`` package), clipped to the
image; a box with nothing left inside the image is an error; ``min(crop width, crop
height) >= min_size``.  ``frames``: ``all``; ``first-half`` = frames 1 ..
``seqLength // 2 + 1``; ``second-half`` = the frames after it.  That is the
``reid`` package's ``train_half`` / ``val_half`` cut, ByteTrack's MOT17 half split
(0-based frames ``0 .. seqLength // 2`` for the first half).

MOT17 ships every sequence three times, once per public detector (``MOT17-02-DPM``,
``-FRCNN``, ``-SDP``) with the same frames and ground truth: a sequence is counted
once, under its base name (``MOT17-02``), from its first variant in name order; the
variants' ``gt.txt`` must be identical.  ``sequences`` lists folder or base names
(``null`` = every sequence of the split).

Output: ``out_dir/crops/<seq>_<track>/<seq>_<frame:06d>.<imExt>`` (the ``reid``
package's identity-folder layout, so ``identity-folders`` reads it too), written
once into a temporary folder renamed on success, and one manifest row per crop:
``id`` = ``<seq>_<track>_<frame:06d>``, ``label`` = ``<seq>_<track>`` (track ids
restart in every sequence, so the sequence keeps two people apart), ``sequence``,
``frame``, ``path``.  Query and gallery are the same crops with the same ids: the
``reassociation`` protocol compares each query with the crops of its sequence
``gap_frames`` later, so an item is never its own candidate.

Bad input (a folder that is not a sequence, a ``seqinfo.ini`` key missing, a
``gt.txt`` line with a non-integer frame or id, too few fields, a frame beyond
``seqLength``, a box outside the image, a missing frame image, a duplicate (frame,
track)) is one RankwiseError naming the file and line, and nothing is written.
"""

from __future__ import annotations

import configparser
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from .errors import RankwiseError, first_line
from .manifest import read_utf8_text
from .options import Option, OptionSet

if TYPE_CHECKING:
    from PIL import Image

FRAME_RANGES = ("all", "first-half", "second-half")
DETECTOR_SUFFIXES = ("-DPM", "-FRCNN", "-SDP")
MOT_OPTIONS = OptionSet(
    "mot",
    (
        Option(
            "root", "string", required=True, help="MOTChallenge folder holding <split>/<sequence>/"
        ),
        Option("split", "string", "train", help="folder under root (needs gt/gt.txt)"),
        Option(
            "sequences",
            "labels",
            None,
            nullable=True,
            help="sequence folder or base names (MOT17-02); null = all; detector variants "
            "count once",
        ),
        Option(
            "frames",
            "enum",
            "all",
            choices=FRAME_RANGES,
            help="first-half = frames 1..seqLength//2+1, second-half = the rest (the reid "
            "package's train/val halves)",
        ),
        Option(
            "classes",
            "cutoffs",
            (1,),
            nullable=True,
            help="gt classes kept (MOT17 1 = pedestrian); null = all",
        ),
        Option(
            "min_visibility",
            "number",
            0.0,
            minimum=0,
            maximum=1,
            help="smallest gt visibility kept",
        ),
        Option(
            "min_size", "integer", 0, minimum=0, help="smallest crop side in pixels after clipping"
        ),
    ),
)

_GT_EXAMPLE = (
    "'1,1,912,484,97,109,1,1,1' (frame, id, left, top, width, height, conf, class, visibility)"
)
_SEQINFO_EXAMPLE = (
    "[Sequence] name=MOT17-02 imDir=img1 seqLength=600 imWidth=1920 imHeight=1080 imExt=.jpg"
)
_INTEGER = re.compile(r"^-?\d+(\.0*)?$")


@dataclass(frozen=True)
class Sequence:
    """One sequence folder and its ``seqinfo.ini``."""

    name: str  # the base name (detector suffix removed)
    folder: Path
    length: int
    width: int
    height: int
    images: Path
    extension: str  # ".jpg"


@dataclass(frozen=True)
class Box:
    """One kept ground-truth box, clipped: pixels ``[x1, x2) x [y1, y2)``."""

    track: int
    frame: int
    x1: int
    y1: int
    x2: int
    y2: int


def base_name(name: str) -> str:
    """``MOT17-02-SDP`` -> ``MOT17-02``; other names unchanged."""
    for suffix in DETECTOR_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def half_cutoff(length: int) -> int:
    """Last frame of the first half: ``length // 2 + 1`` (ByteTrack / ``reid``)."""
    return length // 2 + 1


# ---------------------------------------------------------------- options


def _check_options(opts: dict[str, Any]) -> dict[str, Any]:
    from .datasets_reid import choice_option, int_option

    choice_option("mot", opts, "frames", FRAME_RANGES)
    int_option("mot", opts, "min_size", 0)
    visibility = opts["min_visibility"]
    if (
        isinstance(visibility, bool)
        or not isinstance(visibility, (int, float))
        or not 0.0 <= visibility <= 1.0
    ):
        raise RankwiseError(
            f"mot: option min_visibility must be a number in [0, 1], got {visibility!r}"
        )
    classes = opts["classes"]
    if classes is not None and (
        not isinstance(classes, (list, tuple))
        or not classes
        or any(isinstance(c, bool) or not isinstance(c, int) for c in classes)
    ):
        raise RankwiseError(
            f"mot: option classes must be a non-empty list of integer class ids "
            f"(MOT17 pedestrians: [1]) or null for all, got {classes!r}"
        )
    sequences = opts["sequences"]
    if sequences is not None and (
        not isinstance(sequences, (list, tuple))
        or not sequences
        or any(not isinstance(s, str) or not s for s in sequences)
    ):
        raise RankwiseError(
            f"mot: option sequences must be a non-empty list of sequence names "
            f'(e.g. ["MOT17-02"]) or null for all, got {sequences!r}'
        )
    if not isinstance(opts["split"], str) or not opts["split"] or "/" in opts["split"]:
        raise RankwiseError(
            f"mot: option split must be a folder name under root such as "
            f"train, got {opts['split']!r}"
        )
    return opts


# ---------------------------------------------------------------- the tree


def read_seqinfo(folder: Path) -> Sequence:
    """Parse ``folder/seqinfo.ini``; every problem names the file and the key."""
    path = folder / "seqinfo.ini"
    if not path.is_file():
        raise RankwiseError(
            f"{path}: not found; {folder} is not a MOTChallenge sequence "
            f"(expected seqinfo.ini, img1/000001.jpg and gt/gt.txt in it)"
        )
    parser = configparser.ConfigParser()
    try:
        parser.read_string(read_utf8_text(path, "seqinfo.ini"), source=str(path))
    except configparser.Error as exc:
        raise RankwiseError(
            f"{path}: not a valid ini file ({first_line(exc)}); expected {_SEQINFO_EXAMPLE}"
        ) from None
    if "Sequence" not in parser:
        raise RankwiseError(f"{path}: no [Sequence] section; expected {_SEQINFO_EXAMPLE}")
    section = parser["Sequence"]
    values = {}
    for key in ("seqLength", "imWidth", "imHeight"):
        text = section.get(key, "").strip()
        if not text.isdecimal() or int(text) < 1:  # '²' is isdigit, not int()
            raise RankwiseError(
                f"{path}: {key} must be a positive integer, found {text!r}; "
                f"expected {_SEQINFO_EXAMPLE}"
            )
        values[key] = int(text)
    extension = section.get("imExt", "").strip()
    if not extension.startswith(".") or len(extension) < 2:
        raise RankwiseError(
            f"{path}: imExt must be a file extension such as .jpg, found {extension!r}"
        )
    return Sequence(
        base_name(folder.name),
        folder,
        values["seqLength"],
        values["imWidth"],
        values["imHeight"],
        folder / section.get("imDir", "img1").strip(),
        extension,
    )


def select_sequences(split_dir: Path, wanted: list[str] | None) -> list[Sequence]:
    """The sequences to read: one per base name, MOT17 detector variants counted once."""
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise RankwiseError(
            f"{split_dir}: no sequence folders; expected "
            f"{split_dir}/MOT17-02-FRCNN/seqinfo.ini, img1/, gt/gt.txt"
        )
    by_base: dict[str, list[Path]] = {}
    for folder in folders:
        by_base.setdefault(base_name(folder.name), []).append(folder)
    if wanted is None:
        bases = sorted(by_base)
    else:
        bases = []
        names = {f.name: base_name(f.name) for f in folders}
        for name in wanted:
            base = names.get(name, name if name in by_base else None)
            if base is None:
                raise RankwiseError(
                    f"mot: option sequences names {name!r}, not found in "
                    f"{split_dir}; found {', '.join(sorted(by_base))}"
                )
            if base not in bases:
                bases.append(base)
    sequences = []
    for base in bases:
        variants = by_base[base]
        gts = [v / "gt" / "gt.txt" for v in variants]
        for gt in gts:
            if not gt.is_file():
                raise RankwiseError(
                    f"{gt}: not found; {gt.parent.parent} is not a MOTChallenge "
                    "sequence with ground truth (expected gt/gt.txt with lines "
                    f"such as {_GT_EXAMPLE})"
                )
        digests = [hashlib.sha256(gt.read_bytes()).hexdigest() for gt in gts]
        if len(set(digests)) > 1:
            odd = next(g for g, d in zip(gts, digests, strict=True) if d != digests[0])
            raise RankwiseError(
                f"{odd}: differs from {gts[0]}; detector variants of {base} "
                "must share one ground truth to be counted once"
            )
        sequences.append(read_seqinfo(variants[0]))
    return sequences


def frame_path(sequence: Sequence, frame: int) -> Path | None:
    """``img1/000001.jpg`` (MOT) or ``img1/00000001.jpg`` (DanceTrack); None if absent."""
    for width in (6, 8):
        path = sequence.images / f"{frame:0{width}d}{sequence.extension}"
        if path.is_file():
            return path
    return None


def _number(text: str, where: str, what: str, integer: bool) -> float:
    text = text.strip()
    if integer and not _INTEGER.match(text):
        raise RankwiseError(
            f"{where}: {what} must be an integer, found {text!r}; expected "
            f"lines such as {_GT_EXAMPLE}"
        )
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    # nan/inf too: a nan visibility or conf passes every "<" filter, a nan box crashes
    if not math.isfinite(value):
        raise RankwiseError(
            f"{where}: {what} must be a finite number, found {text!r}; expected lines "
            f"such as {_GT_EXAMPLE}"
        )
    return value


def read_boxes(sequence: Sequence, opts: dict[str, Any]) -> list[Box]:
    """The kept, clipped boxes of one sequence (see the module docstring), frame-major."""
    gt = sequence.folder / "gt" / "gt.txt"
    classes = None if opts["classes"] is None else set(opts["classes"])
    cutoff = half_cutoff(sequence.length)
    boxes: list[Box] = []
    seen: dict[tuple[int, int], int] = {}  # (frame, track) -> line
    frames_found: dict[int, bool] = {}
    for number, line in enumerate(read_utf8_text(gt, "MOT ground truth").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{gt}: line {number}"
        fields = line.split(",")
        needed = 9 if opts["min_visibility"] > 0 else 8 if classes is not None else 6
        if len(fields) < needed:
            raise RankwiseError(
                f"{where}: {len(fields)} fields, {needed} needed (class for "
                "options.classes, visibility for options.min_visibility); "
                f"expected lines such as {_GT_EXAMPLE}"
            )
        frame = int(_number(fields[0], where, "frame", True))
        track = int(_number(fields[1], where, "id", True))
        left, top, width, height = (_number(f, where, "box", False) for f in fields[2:6])
        conf = _number(fields[6], where, "conf", False) if len(fields) > 6 else 1.0
        if not 1 <= frame <= sequence.length:
            raise RankwiseError(
                f"{where}: frame {frame} is outside 1..{sequence.length} "
                f"(seqLength in {sequence.folder / 'seqinfo.ini'})"
            )
        if conf <= 0:  # MOTChallenge's flag for boxes to ignore
            continue
        if classes is not None and int(_number(fields[7], where, "class", True)) not in classes:
            continue
        if (opts["frames"] == "first-half" and frame > cutoff) or (
            opts["frames"] == "second-half" and frame <= cutoff
        ):
            continue
        if (
            len(fields) > 8
            and _number(fields[8], where, "visibility", False) < opts["min_visibility"]
        ):
            continue
        x1, y1 = max(0, round(left)), max(0, round(top))
        x2 = min(sequence.width, round(left + width))
        y2 = min(sequence.height, round(top + height))
        if x2 <= x1 or y2 <= y1:
            raise RankwiseError(
                f"{where}: box (left {fields[2].strip()}, top "
                f"{fields[3].strip()}, width {fields[4].strip()}, height "
                f"{fields[5].strip()}) has no pixel inside the "
                f"{sequence.width}x{sequence.height} image; fix the line, or "
                "filter it with options.classes / min_visibility"
            )
        if min(x2 - x1, y2 - y1) < opts["min_size"]:
            continue
        if (frame, track) in seen:
            raise RankwiseError(
                f"{where}: track {track} already has a box in frame {frame} "
                f"(line {seen[frame, track]}); one box per track and frame"
            )
        seen[frame, track] = number
        if frame not in frames_found:
            frames_found[frame] = frame_path(sequence, frame) is not None
        if not frames_found[frame]:
            raise RankwiseError(
                f"{where}: frame image "
                f"{sequence.images / f'{frame:06d}{sequence.extension}'} not "
                "found"
            )
        boxes.append(Box(track, frame, x1, y1, x2, y2))
    boxes.sort(key=lambda b: (b.frame, b.track))
    return boxes


# ---------------------------------------------------------------- crops


def _read_frame(source: Path, sequence: Sequence) -> Image.Image:
    """Decode one frame (RGB or L), its size checked against seqinfo.ini."""
    from PIL import Image

    from .encoders import DECODE_ERRORS
    from .png_data import check_png_complete

    try:
        with Image.open(source) as opened:
            if opened.size != (sequence.width, sequence.height):
                raise RankwiseError(
                    f"{source}: image is {opened.size[0]}x{opened.size[1]}, "
                    f"seqinfo.ini says {sequence.width}x{sequence.height}; "
                    "fix imWidth / imHeight"
                )
            image = opened.convert("RGB") if opened.mode not in ("RGB", "L") else opened.copy()
            check_png_complete(opened, source, sequence.name)  # PIL's black rows
    except DECODE_ERRORS as exc:
        raise RankwiseError(
            f"{source}: cannot decode frame ({type(exc).__name__}: {exc}); replace the file"
        ) from None
    return image


def _write_crops(sequence: Sequence, boxes: list[Box], crops_dir: Path) -> list[dict[str, Any]]:
    """Cut every box from its frame (each frame decoded once) and save the crops."""

    rows: list[dict[str, Any]] = []
    image: Image.Image | None = None
    current = None
    for box in boxes:
        if image is None or box.frame != current:
            source = frame_path(sequence, box.frame)
            assert source is not None  # read_boxes checked every frame file
            image = _read_frame(source, sequence)
            current = box.frame
        label = f"{sequence.name}_{box.track}"
        path = crops_dir / label / f"{sequence.name}_{box.frame:06d}{sequence.extension}"
        path.parent.mkdir(exist_ok=True)
        crop = image.crop((box.x1, box.y1, box.x2, box.y2))
        if sequence.extension.lower() in (".jpg", ".jpeg"):
            crop.save(path, quality=95)
        else:
            crop.save(path)
        rows.append(
            {
                "id": f"{label}_{box.frame:06d}",
                "label": label,
                "sequence": sequence.name,
                "frame": box.frame,
                "path": str(path.absolute()),
            }
        )
    return rows


def load_mot(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    """Crop the kept ground-truth boxes; query = gallery = every crop (``reassociation``)."""
    from .datasets import _existing_dir, _relative_paths
    from .store import atomic_directory

    opts = _check_options(opts)
    root = _existing_dir(opts["root"], "MOTChallenge root")
    split_dir = root / opts["split"]
    if not split_dir.is_dir():
        raise RankwiseError(
            f"{split_dir}: split folder not found; options.root must hold "
            f"{opts['split']}/<sequence>/ (e.g. MOT17/train/MOT17-02-FRCNN)"
        )
    sequences = select_sequences(split_dir, opts["sequences"])
    # Every line of every gt.txt is checked before the first crop is written.
    boxes = {s.name: read_boxes(s, opts) for s in sequences}
    if not any(boxes.values()):
        raise RankwiseError(
            f"{split_dir}: no ground-truth box is left after the filters "
            f"(frames={opts['frames']}, classes={opts['classes']}, "
            f"min_visibility={opts['min_visibility']}, "
            f"min_size={opts['min_size']}); relax them"
        )
    rows = []
    with atomic_directory(out / "crops") as tmp:
        for sequence in sequences:
            rows += _write_crops(sequence, boxes[sequence.name], tmp)
    final = (out / "crops").absolute()
    for row in rows:  # written under crops.tmp/, now renamed to crops/
        row["path"] = str(final / Path(row["path"]).relative_to(tmp.absolute()))
    table = pd.DataFrame(rows)
    return _relative_paths({"query": table, "gallery": table.copy()}, out)
