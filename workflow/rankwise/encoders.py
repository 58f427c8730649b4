"""Encoders: a manifest's images (or precomputed vectors) -> a Zarr embedding store.

:func:`encode_manifest` is the one entry point (``rankwise encode`` calls it). It
streams the manifest's rows in batches through an encoder and writes the
``(N, D)`` float32 embeddings with :func:`rankwise.store.write_embeddings`
(temporary store renamed when complete). Images are decoded and preprocessed by a
thread pool, one batch ahead of the encoder. Store attributes::

    encoder           {"kind": ..., "options": {... with defaults filled in}}; an option
                      added later at its default (checkpoint_key: null, reid's
                      interpolation: null) left out
                      (OptionSet.recorded: such stores read as before it existed)
    checkpoint_hash   sha256 of the checkpoint / model / .npy file, or null (the bytes
                      read: a file changed while encoding is an error); an ONNX model
                      with external data files: rankwise.onnx_files.model_sha256
    manifest_hash     sha256 of the manifest file
    manifest_csv_sha256  sha256 of the manifest CSV's bytes: checked whenever the store
                      is opened with a manifest (rankwise.embeddings.check_manifest)
    manifest          the manifest's path, as given
    num_rows          N (rows stored: fewer than the manifest's if id-keyed rows were dropped)
    id_alignment      id-keyed precomputed features only: ids (file), ids_sha256,
                      on_missing, manifest_rows, kept_rows, dropped_rows,
                      dropped_example, ignored_features, kept_rows_sha256 (which rows)
    rankwise_version  the package version

Kinds (options; defaults after ``=``):

``precomputed`` {query, gallery} or {path}; split=auto, ids / query_ids / gallery_ids=null,
ids_column="id", on_missing="error"
    ``.npy`` or Zarr (a group holding ``embeddings``, or an array) per split,
    ``(N, D)``.  With {query, gallery} the split is ``split`` or, by default, the
    manifest's file stem (``query.csv`` -> query).  Without ids the rows are in manifest
    order.  With ids (the ``ids`` file for {path}, ``query_ids`` / ``gallery_ids`` for
    {query, gallery}; or a Zarr group's ``ids`` array) the rows are put in manifest order
    by id, and ids missing on either side are an error, or with ``on_missing: drop``
    manifest rows without features are dropped and features of other ids ignored
    (:mod:`rankwise.feature_ids`).  A store with dropped rows records them (array
    ``manifest_row``, attribute ``id_alignment``); ranking evaluates only those rows,
    and the report's dataset header says how many were dropped.
``python`` {factory: "module:function" or "path/file.py:function", params={},
checkpoint=null, input_size=null}
    ``factory(**params)`` returns ``fn(images) -> (B, D)`` where ``images`` is a list of
    ``(H, W, 3)`` uint8 RGB arrays (resized to ``input_size`` [H, W] if given).  If
    ``checkpoint`` is set, the file must exist, its hash is recorded, and it is passed
    to the factory as ``checkpoint=<path>`` when the factory accepts that keyword.
    When ``fn`` accepts a ``texts`` keyword it is called ``fn(images, texts=...)`` with
    the batch's values of the manifest's ``text`` column (a list of str), or
    ``texts=None`` when the manifest has no ``text`` column (multimodal queries).
``onnx`` {model, input_size=from the model, mean=ImageNet, std=ImageNet,
channel_order="rgb", layout="nchw", input=null, output=null}
    Bilinear resize to ``input_size`` [H, W], ``(x / 255 - mean) / std``, run with
    onnxruntime's CPUExecutionProvider; the output ``(B, ...)`` is flattened to ``(B, D)``
    (a 1-D output is refused, as the torch kinds refuse it).
    Needs the optional extra ``rankwise[onnx]``.
``pixels`` {size=[16, 16], grayscale=false}
    Bilinear resize, flatten, scale to [0, 1].
``color-histogram`` {bins=8, space="hsv", joint=false, stripes=1}
    Per horizontal stripe, per-channel (``bins`` x 3) or joint (``bins`` ** 3)
    histogram in HSV or RGB, each normalised to sum 1, concatenated.
``hog`` {size=[64, 64], cell=8, bins=9}
    Histogram of oriented gradients (unsigned, ``bins`` orientations per ``cell`` x
    ``cell`` pixels, 2 x 2-cell blocks, L2-Hys normalisation), numpy only.

``reid``, ``timm``, ``torchscript`` (extra ``rankwise[torch]``)
    Torch checkpoints, loaded strictly; options and preprocessing in
    :mod:`rankwise.torch_encoders`.  Their store also records ``preprocessing``: the
    input size, resize, interpolation, mean/std, channel order, flip, device and half
    actually applied.

Rows are never skipped: a missing or unreadable image is an error naming the file
and the manifest row, because embeddings must stay aligned with the manifest.

The manifest is read by :func:`rankwise.manifest.read_manifest`, the reader ranking
uses: without a protocol it checks what every protocol needs (``id``, ``label``,
non-empty values, unique ids, at least one row), plus a non-empty ``path`` for image
encoders, so a manifest no protocol could rank fails here, before any encoding.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from . import __version__
from .embeddings import (
    ID_ALIGNMENT,
    MANIFEST_ROW,
    MANIFEST_SHA256,
    EmbeddingSource,
    check_rows,
    open_embeddings,
)
from .errors import RankwiseError, first_line
from .feature_ids import ON_MISSING, Alignment
from .hashing import file_sha256
from .manifest import check_nonempty, read_manifest
from .options import BATCH_SIZE, CHECKPOINT_KEY, REID_INTERPOLATION, WORKERS, Option, OptionSet
from .png_data import check_png_complete
from .store import write_embeddings

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_SIZE_HELP = "[height, width] the images are resized to"

#: kind -> its options (the config schema's ``encoder_<kind>`` fragments).
# The input normalisation of exported models (onnx, torchscript): ImageNet by default.
_NORMALISATION = (
    Option(
        "mean", "numbers", IMAGENET_MEAN, length=3, help="per-channel mean of x / 255 (ImageNet)"
    ),
    Option(
        "std",
        "numbers",
        IMAGENET_STD,
        length=3,
        above=0,
        help="per-channel standard deviation of x / 255 (ImageNet)",
    ),
    Option(
        "channel_order",
        "enum",
        "rgb",
        choices=("rgb", "bgr"),
        help="channel order the model expects",
    ),
)
_TORCH_COMMON = (
    Option(
        "flip",
        "boolean",
        False,
        help="average the embeddings of the image and its horizontal mirror",
    ),
    Option(
        "device", "enum", "auto", choices=("auto", "cpu", "cuda"), help="auto = cuda when available"
    ),
    Option("half", "boolean", False, help="float16 inference (cuda only)"),
)
OPTIONS: dict[str, OptionSet] = {
    "precomputed": OptionSet(
        "precomputed",
        (
            Option("query", "string", None, nullable=True, help="query embeddings (.npy or Zarr)"),
            Option(
                "gallery", "string", None, nullable=True, help="gallery embeddings (.npy or Zarr)"
            ),
            Option(
                "path",
                "string",
                None,
                nullable=True,
                help="one file for whichever split is encoded",
            ),
            Option(
                "split",
                "enum",
                "auto",
                choices=("auto", "query", "gallery"),
                help="which of query / gallery this manifest is; auto = its file name",
            ),
            Option(
                "ids",
                "string",
                None,
                nullable=True,
                help="the id of each row of path: .csv (ids_column), .npy or text (one a line)",
            ),
            Option("query_ids", "string", None, nullable=True, help="ids of the query rows"),
            Option("gallery_ids", "string", None, nullable=True, help="ids of the gallery rows"),
            Option("ids_column", "string", "id", help="the ids' column in a .csv ids file"),
            Option(
                "on_missing",
                "enum",
                "error",
                choices=ON_MISSING,
                help="ids missing on either side: error, or drop (keep the ids both have)",
            ),
        ),
        description="{query, gallery}: .npy or Zarr per split; or {path}: one file; ids: by id",
    ),
    "python": OptionSet(
        "python",
        (
            Option(
                "factory", "string", required=True, help="module:function or path/file.py:function"
            ),
            Option("params", "object", {}, help="keyword arguments of the factory"),
            Option("checkpoint", "string", None, nullable=True, help="weights file"),
            Option(
                "input_size", "size", None, nullable=True, help=_SIZE_HELP + "; null = as decoded"
            ),
        ),
    ),
    "onnx": OptionSet(
        "onnx",
        (
            Option("model", "string", required=True, help=".onnx file"),
            Option(
                "input_size",
                "size",
                None,
                nullable=True,
                help=_SIZE_HELP + "; null = from the model",
            ),
            *_NORMALISATION,
            Option(
                "layout",
                "enum",
                "nchw",
                choices=("nchw", "nhwc"),
                help="input layout the model expects",
            ),
            Option("input", "string", None, nullable=True, help="input name; null = the first"),
            Option("output", "string", None, nullable=True, help="output name; null = the first"),
        ),
    ),
    "pixels": OptionSet(
        "pixels",
        (
            Option("size", "size", (16, 16), help=_SIZE_HELP),
            Option("grayscale", "boolean", False, help="one channel instead of RGB"),
        ),
    ),
    "color-histogram": OptionSet(
        "color-histogram",
        (
            Option("bins", "integer", 8, minimum=1, maximum=256, help="bins per channel"),
            Option("space", "enum", "hsv", choices=("hsv", "rgb"), help="colour space"),
            Option(
                "joint", "boolean", False, help="one bins^3 joint histogram instead of 3 x bins"
            ),
            Option(
                "stripes", "integer", 1, minimum=1, help="horizontal stripes, one histogram each"
            ),
        ),
    ),
    "hog": OptionSet(
        "hog",
        (
            Option("size", "size", (64, 64), help=_SIZE_HELP),
            Option("cell", "integer", 8, minimum=1, help="pixels per cell side"),
            Option("bins", "integer", 9, minimum=1, help="orientation bins"),
        ),
    ),
    # torch kinds (extra rankwise[torch]; rankwise.torch_encoders): the embedding is the
    # pre-classifier feature; preprocessing resizes straight to input_size (no centre crop)
    "reid": OptionSet(
        "reid",
        (
            Option(
                "architecture",
                "string",
                required=True,
                help="a reid package architecture, e.g. osnet_x1_0",
            ),
            Option(
                "checkpoint",
                "string",
                required=True,
                help="torchreid / fast-reid .pth (or .safetensors), loaded strictly",
            ),
            CHECKPOINT_KEY,
            Option(
                "input_size",
                "size",
                None,
                nullable=True,
                help=_SIZE_HELP + "; null = the architecture's",
            ),
            REID_INTERPOLATION,
            *_TORCH_COMMON,
        ),
    ),
    "timm": OptionSet(
        "timm",
        (
            Option("model", "string", required=True, help="a timm model name, e.g. resnet50"),
            Option(
                "checkpoint",
                "string",
                required=True,
                help="local weights, loaded strictly (nothing is ever downloaded)",
            ),
            CHECKPOINT_KEY,
            Option(
                "input_size",
                "size",
                None,
                nullable=True,
                help=_SIZE_HELP + "; null = the model's data config",
            ),
            Option(
                "mean",
                "numbers",
                None,
                length=3,
                nullable=True,
                help="per-channel mean of x / 255; null = the model's data config",
            ),
            Option(
                "std",
                "numbers",
                None,
                length=3,
                above=0,
                nullable=True,
                help="per-channel standard deviation of x / 255; null = the model's",
            ),
            Option(
                "interpolation",
                "enum",
                "bilinear",
                choices=("bilinear", "bicubic", "nearest"),
                help="resize interpolation",
            ),
            *_TORCH_COMMON,
        ),
    ),
    "torchscript": OptionSet(
        "torchscript",
        (
            Option("model", "string", required=True, help="a scripted or traced module file"),
            Option("input_size", "size", required=True, help=_SIZE_HELP),
            *_NORMALISATION,
            Option(
                "interpolation",
                "enum",
                "bilinear",
                choices=("bilinear", "bicubic", "nearest"),
                help="resize interpolation",
            ),
            *_TORCH_COMMON,
        ),
    ),
}
#: kind -> its option defaults.
DEFAULTS: dict[str, dict[str, Any]] = {kind: spec.defaults for kind, spec in OPTIONS.items()}
REQUIRED: dict[str, tuple[str, ...]] = {kind: spec.required for kind, spec in OPTIONS.items()}
ENCODER_KINDS = tuple(OPTIONS)


def default_workers() -> int:
    """Decoding threads when none are given: the CPUs this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


# ---------------------------------------------------------------- option checks


def _checkpoint(kind: str, value: Any, name: str) -> Path:
    path = Path(str(value)).expanduser()
    if path.is_dir():  # a Hugging Face Trainer's checkpoint-500/: it exists
        from .pipeline_config import folder_advice

        raise RankwiseError(
            f"{path}: options.{name} of the {kind} encoder names a folder, not a file; "
            f"{folder_advice(str(path))}"
        )
    if not path.is_file():
        raise RankwiseError(
            f"{path}: {kind} {name} file not found; check options.{name} "
            f"(relative paths start from {Path.cwd()})"
        )
    return path


# ---------------------------------------------------------------- images


#: What PIL raises for an image file it cannot decode (UnidentifiedImageError is an
#: OSError; SyntaxError: its PNG reader on a broken chunk; EOFError: some truncated files).
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError)

#: PIL modes holding more than 8 bits a channel (integer or float).
_WIDE_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N", "F"})


@dataclass
class _Rows:
    """The manifest rows being encoded, for file access and error messages."""

    manifest: Path
    ids: list[str]
    paths: list[str] = field(default_factory=list)
    texts: list[str] | None = None  # the manifest's 'text' column, if any
    # id-keyed precomputed features: the manifest row and the feature row of each row
    manifest_rows: np.ndarray | None = None
    feature_rows: np.ndarray | None = None

    def where(self, i: int) -> str:
        row = i if self.manifest_rows is None else int(self.manifest_rows[i])
        return f"{self.manifest}: row {row + 2} (id {self.ids[i]!r})"

    def read(
        self,
        i: int,
        size: tuple[int, int] | None = None,
        mode: str = "RGB",
        resample: int = Image.Resampling.BILINEAR,
    ) -> Image.Image:
        """Decode row ``i``'s image, converted to ``mode`` and resized to [H, W]."""
        raw = self.paths[i]  # never empty: checked when the manifest is read
        path = Path(raw)
        if not path.is_absolute():
            path = self.manifest.parent / path
        try:
            if not stat.S_ISREG(os.stat(path).st_mode) and not path.is_dir():
                # a FIFO blocked the decoding thread for good (Ctrl-C waited on it)
                raise RankwiseError(
                    f"{self.where(i)}: image {raw!r} is a pipe or device ({path}), not an "
                    "image file; fix the 'path' column"
                )
            with Image.open(path) as opened:
                if opened.mode in _WIDE_MODES:
                    # PIL's convert clips 16-bit values at 255 and floats in [0, 1] to 0 or
                    # 1: a silently white or black image (torchreid's and timm's loaders,
                    # which call convert("RGB") too, would see the same)
                    raise RankwiseError(
                        f"{self.where(i)}: image {path} has {opened.mode!r} pixels (16-bit or "
                        "floating point), which 8-bit conversion would clip; save it as an "
                        "8-bit RGB or greyscale image"
                    )
                # PIL converts to HSV from RGB only (convert loads `opened`)
                image = (
                    opened.convert("RGB").convert("HSV") if mode == "HSV" else opened.convert(mode)
                )
                check_png_complete(opened, path, self.where(i))
        except RankwiseError:
            raise
        except FileNotFoundError:
            raise RankwiseError(
                f"{self.where(i)}: image {raw!r} not found (looked for "
                f"{path}); fix the 'path' column or restore the file"
            ) from None
        except IsADirectoryError:
            raise RankwiseError(
                f"{self.where(i)}: image {raw!r} is a folder ({path}), not an image file; "
                "fix the 'path' column"
            ) from None
        except DECODE_ERRORS as exc:
            raise RankwiseError(
                f"{self.where(i)}: cannot decode image {path} "
                f"({type(exc).__name__}: {exc}); replace the file"
            ) from None
        except Image.DecompressionBombError as exc:  # not an OSError: PIL's size guard
            raise RankwiseError(
                f"{self.where(i)}: image {path} is too large to decode safely ({exc}); "
                "downscale the file"
            ) from None
        if size is not None and image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), resample)
        return image


def _image_batches(
    rows: _Rows,
    per_image: Callable[[int], Any],
    batch_size: int,
    pool: ThreadPoolExecutor,
    ahead: bool = True,
) -> Iterator[list[Any]]:
    """Yield ``[per_image(i) for i in batch]`` per batch, each batch's images decoded on the
    pool's threads.

    ``ahead``: decode the next batch while the consumer works on this one, which pays when
    the consumer leaves the CPU idle (a forward pass on a GPU). A forward pass on the CPU
    already keeps every core busy: decoding beside it only competes for them, so there
    ``ahead=False`` decodes each batch on all threads between forward passes
    (benchmarks/bench_encode.py, 2 cores: CPU-time ratio to the bare forward pass 0.97
    against 0.93 decoding ahead, 512 images; the same within noise at 2,048).
    """
    n = len(rows.ids)
    pending: list[Future] = []
    futures: list[Future] = []
    try:
        for start in range(0, n, batch_size):
            futures = [pool.submit(per_image, i) for i in range(start, min(start + batch_size, n))]
            if not ahead:
                pending, futures = futures, []
            if pending:
                yield [f.result() for f in pending]
            pending = futures
        if pending:
            yield [f.result() for f in pending]
    finally:  # stop decoding ahead when the consumer stops early (an error)
        for future in pending + futures:
            future.cancel()


# ---------------------------------------------------------------- built-in features


def _pixels(rows: _Rows, i: int, size: tuple[int, int], grayscale: bool) -> np.ndarray:
    image = rows.read(i, size, "L" if grayscale else "RGB")
    return np.asarray(image, dtype=np.float32).ravel() / 255.0


def _colour_histogram(
    rows: _Rows, i: int, bins: int, space: str, joint: bool, stripes: int
) -> np.ndarray:
    image = np.asarray(rows.read(i, None, "HSV" if space == "hsv" else "RGB"))
    quant = (image.astype(np.int64) * bins) >> 8  # 0..bins-1 per channel
    parts = []
    for band in np.array_split(quant, stripes, axis=0):
        flat = band.reshape(-1, 3)
        if joint:
            hist = np.bincount(
                (flat[:, 0] * bins + flat[:, 1]) * bins + flat[:, 2], minlength=bins**3
            )
        else:
            hist = np.concatenate([np.bincount(flat[:, c], minlength=bins) for c in range(3)])
        hist = hist.astype(np.float32)
        parts.append(hist / max(float(hist.sum()), 1.0))
    return np.concatenate(parts) / stripes


def hog_features(gray: np.ndarray, cell: int, bins: int) -> np.ndarray:
    """HOG of a 2-D float image: unsigned orientations, 2x2-cell blocks, L2-Hys.

    Returns a 1-D float32 vector of ``(cy - by + 1) * (cx - bx + 1) * by * bx * bins``
    values, with ``cy, cx`` cells per column / row and blocks of ``by x bx`` cells
    (2, or 1 when there is a single cell along that axis).
    """
    gy = np.zeros_like(gray)
    gx = np.zeros_like(gray)
    gy[1:-1, :] = gray[2:, :] - gray[:-2, :]
    gx[:, 1:-1] = gray[:, 2:] - gray[:, :-2]
    magnitude = np.hypot(gx, gy)
    angle = np.rad2deg(np.arctan2(gy, gx)) % 180.0
    orient = np.minimum((angle * bins / 180.0).astype(np.int64), bins - 1)
    cy, cx = gray.shape[0] // cell, gray.shape[1] // cell
    if cy == 0 or cx == 0:
        raise RankwiseError(
            f"hog: cell {cell} is larger than the image {gray.shape}; use a "
            "smaller cell or a larger size"
        )
    h, w = cy * cell, cx * cell
    cell_index = (np.arange(h)[:, None] // cell) * cx + (np.arange(w)[None, :] // cell)
    hist = np.bincount(
        (cell_index * bins + orient[:h, :w]).ravel(),
        weights=magnitude[:h, :w].ravel(),
        minlength=cy * cx * bins,
    )
    hist = hist.reshape(cy, cx, bins)
    by, bx = min(2, cy), min(2, cx)
    blocks = []
    for y in range(cy - by + 1):
        for x in range(cx - bx + 1):
            block = hist[y : y + by, x : x + bx].ravel()
            block = block / np.sqrt(np.sum(block**2) + 1e-6)
            block = np.minimum(block, 0.2)
            blocks.append(block / np.sqrt(np.sum(block**2) + 1e-6))
    return np.concatenate(blocks).astype(np.float32)


def _hog(rows: _Rows, i: int, size: tuple[int, int], cell: int, bins: int) -> np.ndarray:
    gray = np.asarray(rows.read(i, size, "L"), dtype=np.float32) / 255.0
    return hog_features(gray, cell, bins)


# ---------------------------------------------------------------- encoders


@dataclass
class _Encoder:
    """A configured encoder: resolved options, checkpoint file, and a batch stream."""

    options: dict[str, Any]
    checkpoint: Path | None
    batches: Callable[[_Rows, int, ThreadPoolExecutor], Iterator[np.ndarray]]
    needs_images: bool = True
    threads: int = 1
    preprocessing: dict[str, Any] | None = None  # recorded in the store when set
    # id-keyed precomputed features: manifest ids -> the rows kept (before any batch)
    align: Callable[[list[str]], Alignment] | None = None
    # files the checkpoint is made of besides itself (an ONNX model's external data)
    checkpoint_files: list[Path] = field(default_factory=list)
    # precomputed: the file or Zarr store read, whose rows a message about values names
    source: Path | None = None
    # entered around the whole encode (every batch, the writing): process-wide settings
    # the forward passes need (torch: IEEE float32, thread count), the caller's put back on exit
    settings: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def _builtin(kind: str, opts: dict[str, Any]) -> _Encoder:
    if kind == "pixels":
        size = tuple(opts["size"])

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _pixels(rows, i, size, opts["grayscale"])
    elif kind == "color-histogram":
        bins, space, stripes = opts["bins"], opts["space"], opts["stripes"]

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _colour_histogram(rows, i, bins, space, opts["joint"], stripes)
    else:
        size, cell, bins = tuple(opts["size"]), opts["cell"], opts["bins"]

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _hog(rows, i, size, cell, bins)

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        for batch in _image_batches(rows, lambda i: feature(rows, i), batch_size, pool):
            yield np.stack(batch)

    return _Encoder(opts, None, batches)


def _load_factory(spec: Any) -> Callable[..., Any]:
    if not isinstance(spec, str) or ":" not in spec:
        raise RankwiseError(
            f"python: option factory must be 'module:function' or "
            f"'path/to/file.py:function', got {spec!r}"
        )
    module_name, _, attr = spec.rpartition(":")
    if module_name.endswith(".py"):
        file = Path(module_name).expanduser()
        if not file.is_file():
            raise RankwiseError(f"{file}: factory file not found (options.factory {spec!r})")
        unique = f"rankwise_factory_{zlib.crc32(str(file.resolve()).encode()):08x}"
        module_spec = importlib.util.spec_from_file_location(unique, file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[unique] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name and not module_name.startswith(f"{exc.name}."):
                raise  # the module itself imports something missing: show it
            if os.getcwd() in sys.path:
                raise RankwiseError(
                    f"python: module {module_name!r} of options.factory not "
                    "found; add its folder to PYTHONPATH or give "
                    "'path/to/file.py:function'"
                ) from None
            sys.path.insert(0, os.getcwd())  # console scripts do not put the cwd on the path
            return _load_factory(spec)
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise RankwiseError(
            f"python: {module_name!r} has no attribute {attr!r} (options.factory {spec!r})"
        ) from None
    if not callable(factory):
        raise RankwiseError(f"python: options.factory {spec!r} is not callable")
    return factory


def _accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        or p.kind == p.VAR_KEYWORD
        for p in parameters
    )


def _as_matrix(output: Any, n: int, what: str) -> np.ndarray:
    """An encoder's output for a batch of ``n`` images as ``(n, D)`` float32, D >= 1;
    anything else is one line naming ``what``."""
    if hasattr(output, "detach"):  # a torch tensor
        output = output.detach().cpu()
        if str(output.dtype) == "torch.bfloat16":  # no numpy dtype; exact in float32
            output = output.float()
        output = output.numpy()
    try:
        array = np.asarray(output)
    except ValueError:  # rows of unequal length
        array = None
    if array is None or not (
        np.issubdtype(array.dtype, np.floating)
        or np.issubdtype(array.dtype, np.integer)
        or array.dtype == np.bool_  # binary codes
    ):
        kind = "rows of unequal length" if array is None else f"values of type {array.dtype}"
        raise RankwiseError(
            f"{what} returned {kind} for a batch of {n} images; it must return numbers of "
            "shape (batch, dim)"
        )
    if array.ndim == 1 and n == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[0] != n or array.shape[1] == 0:
        raise RankwiseError(
            f"{what} returned an array of shape {array.shape} for a batch of "
            f"{n} images; it must return (batch, dim) with dim >= 1"
        )
    if np.issubdtype(array.dtype, np.floating) and array.dtype.itemsize > 4:
        finite = array[np.isfinite(array)]
        if finite.size and np.abs(finite).max() > np.finfo(np.float32).max:
            raise RankwiseError(
                f"{what} returned values beyond float32's range (largest magnitude "
                f"{np.abs(finite).max():.3g}); the stores hold float32: scale the embeddings"
            )
    return array.astype(np.float32)


def _python(opts: dict[str, Any]) -> _Encoder:
    size = None if opts["input_size"] is None else tuple(opts["input_size"])
    checkpoint = (
        None
        if opts["checkpoint"] is None
        else _checkpoint("python", opts["checkpoint"], "checkpoint")
    )
    factory = _load_factory(opts["factory"])
    params = dict(opts["params"])
    if (
        checkpoint is not None
        and "checkpoint" not in params
        and _accepts_keyword(factory, "checkpoint")
    ):
        params["checkpoint"] = str(checkpoint)
    encoder_fn = factory(**params)
    if not callable(encoder_fn):
        raise RankwiseError(
            f"python: factory {opts['factory']!r} returned "
            f"{type(encoder_fn).__name__}, not a callable "
            "images -> (batch, dim)"
        )

    with_texts = _accepts_keyword(encoder_fn, "texts")

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        decode = lambda i: np.asarray(rows.read(i, size))
        start = 0
        for images in _image_batches(rows, decode, batch_size, pool):
            if with_texts:
                texts = None if rows.texts is None else rows.texts[start : start + len(images)]
                output = encoder_fn(images, texts=texts)
            else:
                output = encoder_fn(images)
            start += len(images)
            yield _as_matrix(output, len(images), f"factory {opts['factory']!r}")

    return _Encoder(opts, checkpoint, batches)


def batch_axis_problem(shape: tuple[int, ...], batch: int) -> tuple[str, str] | None:
    """Why a model's output of ``shape`` for ``batch`` images is not ``(batch, ...)``, and
    the shape to export instead; None when it is. ``(D,)`` / ``(D, B)`` reshaped to
    ``(B, -1)`` would mix the images' values; a 1-D output is refused even when its length
    is the batch's: one value per image cannot be told from one embedding of D == B."""
    if len(shape) >= 2 and shape[0] == batch:
        return None
    if len(shape) == 0 or shape[0] != batch:
        return "its first axis is not the batch", "(batch, ...)"
    return "a single axis, the batch's or the embedding's, not both", "(batch, dim)"


def _onnx(opts: dict[str, Any], threads: int) -> _Encoder:
    from .onnx_files import external_data_files

    model = _checkpoint("onnx", opts["model"], "model")
    weights = external_data_files(model)
    for data in weights:  # onnxruntime's message names it past its first line
        if not data.is_file():
            raise RankwiseError(
                f"{model}: its external data file {data} is missing; copy it beside the "
                "model (torch.onnx.export writes it next to the .onnx file)"
            )
    try:
        import onnxruntime as ort
    except ImportError:
        raise RankwiseError(
            "onnx: the onnxruntime package is not installed; install the "
            "extra: pip install 'rankwise[onnx]'"
        ) from None
    channel_order, layout = opts["channel_order"], opts["layout"]
    mean, std = (np.asarray(opts[k], dtype=np.float32) for k in ("mean", "std"))
    settings = ort.SessionOptions()
    settings.intra_op_num_threads = threads
    settings.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(
            str(model), sess_options=settings, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own exception types
        raise RankwiseError(
            f"{model}: onnxruntime cannot load the model ({first_line(exc)})"
        ) from None
    inputs = {i.name: i for i in session.get_inputs()}
    input_name = opts["input"] or next(iter(inputs))
    if input_name not in inputs:
        raise RankwiseError(f"{model}: no input named {input_name!r}; inputs: {', '.join(inputs)}")
    if len(inputs) > 1:  # each is required (initializers are not listed): a batch fails
        raise RankwiseError(
            f"{model}: the model takes {len(inputs)} inputs ({', '.join(inputs)}); the onnx "
            "encoder feeds one image batch: export the model with the images as its only input"
        )
    outputs = [o.name for o in session.get_outputs()]
    output_name = opts["output"] or outputs[0]
    if output_name not in outputs:
        raise RankwiseError(
            f"{model}: no output named {output_name!r}; outputs: {', '.join(outputs)}"
        )
    shape = list(inputs[input_name].shape)
    if len(shape) != 4:
        raise RankwiseError(
            f"{model}: input {input_name!r} has shape {shape}; expected a 4-D image batch"
        )
    spatial = shape[2:4] if layout == "nchw" else shape[1:3]
    channels = shape[1] if layout == "nchw" else shape[3]
    if isinstance(channels, int) and channels != 3:
        raise RankwiseError(
            f"{model}: input {input_name!r} has shape {shape}: {channels} channels "
            f"({layout}), but the encoder feeds RGB images (3); export the model for "
            "3-channel input, or check options.layout"
        )
    # the element type the model takes: float32, or float16 (the batch is cast to it)
    dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}.get(
        inputs[input_name].type
    )
    if dtype is None:
        raise RankwiseError(
            f"{model}: input {input_name!r} takes {inputs[input_name].type}; the encoder "
            "feeds normalised float32 (or float16) images: export the model with a float input"
        )
    fixed = [int(v) if isinstance(v, int) else None for v in spatial]
    if opts["input_size"] is None:
        if None in fixed:
            raise RankwiseError(
                f"{model}: the model's input size is dynamic ({spatial}); set "
                "options.input_size to [height, width]"
            )
        size = (int(spatial[0]), int(spatial[1]))
    else:
        size = tuple(opts["input_size"])
        if any(f is not None and f != v for f, v in zip(fixed, size, strict=True)):
            raise RankwiseError(
                f"{model}: the model's input size is fixed at {spatial}, not "
                f"options.input_size {list(size)}; drop input_size or set it to {spatial}"
            )
    opts = {**opts, "input_size": list(size), "input": input_name, "output": output_name}
    fixed_batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None
    out_shape = next(o.shape for o in session.get_outputs() if o.name == output_name)
    # a size, a name (dynamic) or None (unknown: left to the check of every batch run)
    out_batch = out_shape[0] if out_shape else None
    # (16, B) or (16,): the output's first axis is not the batch's; cutting and reshaping
    # it as if it were would mix the images' values.  A declared 1 beside a dynamic input
    # batch may be an exporter's annotation only: the run's own shape decides.
    declared = out_batch if fixed_batch is not None or out_batch != 1 else None
    if isinstance(declared, int) and declared != fixed_batch:
        raise RankwiseError(
            f"{model}: output {output_name!r} has shape {out_shape} for input shape "
            f"{shape}: its first axis is not the batch; export the model with outputs of "
            "shape (batch, ...)"
        )

    def session_run(x: np.ndarray) -> np.ndarray:
        try:
            feed = {input_name: x.astype(dtype, copy=False)}
            out = np.asarray(session.run([output_name], feed)[0])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise RankwiseError(
                f"{model}: onnxruntime failed on a batch of shape {x.shape} "
                f"({first_line(exc)}); check options.input_size and options.layout"
            ) from None
        # (B,) was written as a store of D = 1, exit 0 (batch_axis_problem)
        problem = batch_axis_problem(out.shape, len(x))
        if problem is not None:
            why, wanted = problem
            raise RankwiseError(
                f"{model}: output {output_name!r} has shape {out.shape} for a batch of "
                f"{len(x)}: {why}; export the model with outputs of shape {wanted}"
            )
        return out

    def preprocess(rows: _Rows, i: int) -> np.ndarray:
        x = np.asarray(rows.read(i, size), dtype=np.float32) / 255.0
        x = (x - mean) / std
        if channel_order == "bgr":
            x = x[:, :, ::-1]
        return np.ascontiguousarray(x.transpose(2, 0, 1) if layout == "nchw" else x)

    def run(x: np.ndarray) -> np.ndarray:
        if fixed_batch is None:
            return session_run(x)
        parts = []
        for start in range(0, len(x), fixed_batch):
            part = x[start : start + fixed_batch]
            pad = fixed_batch - len(part)
            if pad:
                part = np.concatenate([part, np.zeros((pad,) + part.shape[1:], part.dtype)])
            parts.append(session_run(part)[: fixed_batch - pad])
        return np.concatenate(parts)

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        for batch in _image_batches(rows, lambda i: preprocess(rows, i), batch_size, pool):
            out = np.asarray(run(np.stack(batch)))
            yield _as_matrix(out.reshape(len(batch), -1), len(batch), f"{model}")

    return _Encoder(opts, model, batches, threads=threads, checkpoint_files=weights)


def _open_vectors(source: Path, manifest: Path) -> EmbeddingSource:
    """The precomputed ``(N, D)`` vectors, through the one embeddings reader.

    So they get every check ranking applies (dtype, completeness mark, the manifest a
    rankwise store was encoded from) and are read chunk by chunk with the
    missing/corrupt-chunk checks: a deleted chunk file is an error, never rows of zeros.
    """
    return open_embeddings(source, name="precomputed embeddings", manifest=manifest)


def _precomputed(opts: dict[str, Any], manifest: Path, out: Path) -> _Encoder:
    given = [k for k in ("query", "gallery", "path") if opts[k] is not None]
    ids_key = "ids"
    if opts["path"] is not None:
        if given != ["path"]:
            raise RankwiseError("precomputed: give either {path} or {query, gallery}, not both")
        source = Path(str(opts["path"])).expanduser()
    elif not given:
        raise RankwiseError("precomputed: missing option path (or query and gallery)")
    else:
        split = opts["split"]
        if split in (None, "auto"):
            split = next(
                (s for s in (manifest.stem, out.name.split(".")[0]) if s in ("query", "gallery")),
                None,
            )
            if split is None:
                raise RankwiseError(
                    f"precomputed: cannot tell whether {manifest} is the query "
                    "or the gallery; set options.split or options.path"
                )
        if opts[split] is None:
            raise RankwiseError(
                f"precomputed: missing option {split} (embeddings for the "
                f"{split} manifest {manifest})"
            )
        source = Path(str(opts[split])).expanduser()
        ids_key = f"{split}_ids"
    # ids go with their features: ids with {path}; query_ids, gallery_ids with {query, gallery}
    for key, form, fix in (
        ("ids", "{query, gallery}", "query_ids / gallery_ids"),
        ("query_ids", "{path}", "ids"),
        ("gallery_ids", "{path}", "ids"),
    ):
        if opts[key] is not None and (key == "ids") != (ids_key == "ids"):
            raise RankwiseError(
                f"precomputed: options.{key} does not go with {form}; use options.{fix}"
            )
    vectors = _open_vectors(source, manifest)
    checkpoint = source if source.is_file() else None

    def align(manifest_ids: list[str]) -> Alignment:
        """The ids file given, else the Zarr group's ids array, matched to the manifest."""
        from .feature_ids import align as align_ids
        from .feature_ids import read_ids, zarr_ids

        if opts[ids_key] is not None:
            ids_file = str(Path(str(opts[ids_key])).expanduser())
            feature_ids = read_ids(ids_file, column=opts["ids_column"])
        elif vectors.ids_array is not None:
            ids_file = f"{source}/{vectors.ids_array}"
            feature_ids = zarr_ids(source)
        else:
            raise RankwiseError(
                f"precomputed: on_missing: drop needs the ids of the rows of {source}; "
                f"set options.{ids_key} (or store an 'ids' array in the Zarr group)"
            )
        if len(feature_ids) != vectors.shape[0]:
            raise RankwiseError(
                f"{ids_file}: {len(feature_ids)} ids for the {vectors.shape[0]} rows of "
                f"{source}; give one id per feature row, in the same order"
            )
        return align_ids(
            manifest_ids,
            feature_ids,
            on_missing=opts["on_missing"],
            manifest=str(manifest),
            ids=ids_file,
        )

    keyed = (
        opts[ids_key] is not None or opts["on_missing"] != "error" or vectors.ids_array is not None
    )

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        n = len(rows.ids)
        if rows.feature_rows is not None:
            # Feature rows in manifest order: random reads, so large batches (~256 MB)
            # keep the number of times a storage chunk is decoded small.
            order = rows.feature_rows
            step = max(batch_size, (256 << 20) // (4 * vectors.shape[1]))
            for start in range(0, n, step):
                yield vectors.take(order[start : start + step])
            return
        if vectors.manifest_rows is not None:
            raise RankwiseError(
                f"{source}: this store holds {vectors.shape[0]} of its manifest's "
                f"{vectors.num_manifest_rows} rows; encode from the original features instead"
            )
        check_rows(vectors, n, rows.manifest)
        # Whole storage chunks per read: no chunk is decoded twice.
        step = max(batch_size, 8192)
        if vectors.chunk_rows:
            step = max(vectors.chunk_rows, step // vectors.chunk_rows * vectors.chunk_rows)
        for start in range(0, n, step):
            yield vectors.read(start, min(start + step, n))

    return _Encoder(
        opts,
        checkpoint,
        batches,
        needs_images=False,
        align=align if keyed else None,
        source=source,
    )


def build_encoder(
    kind: str, options: dict[str, Any] | None, *, manifest: Path, out: Path, threads: int
) -> _Encoder:
    """Check ``options`` for ``kind`` and return the configured encoder."""
    if kind not in OPTIONS:
        raise RankwiseError(
            f"unknown encoder kind {kind!r}; valid kinds: {', '.join(ENCODER_KINDS)}"
        )
    opts = OPTIONS[kind].check(options)
    if kind == "precomputed":
        return _precomputed(opts, manifest, out)
    if kind == "python":
        return _python(opts)
    if kind == "onnx":
        return _onnx(opts, threads)
    if kind in ("reid", "timm", "torchscript"):
        from .torch_encoders import build

        return build(kind, opts, threads)
    return _builtin(kind, opts)


# ---------------------------------------------------------------- entry point


def _named_files(kind: str, options: dict[str, Any] | None) -> list[Path]:
    """The files an encoder's options name (checkpoint, model, embeddings:
    :data:`rankwise.pipeline_config.ENCODER_FILE_OPTIONS`), resolved as the encoders
    resolve them (from the working directory)."""
    from .pipeline_config import ENCODER_FILE_OPTIONS

    values = [(options or {}).get(key) for key in ENCODER_FILE_OPTIONS.get(kind, ())]
    files = [
        path
        for value in values
        if isinstance(value, str) and (path := Path(value).expanduser()).is_file()
    ]
    if kind == "onnx" and files:  # the model's external weights
        from .onnx_files import external_data_files

        files += [p for p in external_data_files(files[0]) if p.is_file()]
    return files


def _file_states(paths: list[Path]) -> dict[Path, tuple[int, int, int] | None]:
    """``(size, mtime_ns, inode)`` per path (None when unreadable): a rewrite, in place
    or by rename, changes at least one of them, unless it keeps the size and lands within
    one tick of the filesystem's timestamps (nanoseconds on ext4 and xfs)."""
    states: dict[Path, tuple[int, int, int] | None] = {}
    for path in paths:
        try:
            st = path.stat()
            states[path] = (st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            states[path] = None
    return states


def _check_unchanged(paths: list[Path], before: dict, after: dict) -> None:
    """Refuse a file that changed between two looks at it (paths not looked at before
    are not compared)."""
    for path in paths:
        if path in before and before[path] != after.get(path):
            raise RankwiseError(
                f"{path}: the file changed while rankwise encode read it (a training run "
                "saving over it?); run again once it is saved"
            )


def encode_manifest(
    manifest_csv: str | os.PathLike,
    kind: str,
    options: dict[str, Any] | None,
    out_store: str | os.PathLike,
    batch_size: int = BATCH_SIZE.default,
    workers: int | None = None,
    *,
    progress: bool = True,
    protocol: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """Encode every row of a manifest into the embedding store ``out_store``.

    Parameters
    ----------
    manifest_csv : the manifest (CSV with ``id`` and, for image encoders, ``path``).
    kind : one of ``ENCODER_KINDS``.
    options : the encoder's options (module docstring); unknown keys are errors.
    out_store : the Zarr store to write, atomically (``<out_store>.tmp`` then renamed).
    batch_size : images per encoder call.
    workers : decoding threads (and onnxruntime threads); default :func:`default_workers`.
    progress : show a tqdm progress bar on stderr.
    protocol, role : when known, the manifest is also checked for that protocol's
        columns in that role (``query``/``gallery``), as ranking will; by default only
        what every protocol needs (module docstring).

    Returns
    -------
    The store's attributes plus ``shape`` ``[N, D]``.
    """
    manifest, out = Path(manifest_csv), Path(out_store)
    batch_size = BATCH_SIZE.check(batch_size)
    workers = default_workers() if workers is None else WORKERS.check(workers)
    # the files whose hashes the store records, as they were before being read: a file
    # rewritten while it is read (a training run saving over the checkpoint) must not
    # leave a store whose hash names other bytes than the ones encoded
    before = _file_states([manifest, *_named_files(kind, options)])
    table = read_manifest(manifest, protocol=protocol, role=role)
    encoder = build_encoder(kind, options, manifest=manifest, out=out, threads=workers)
    rows = _Rows(manifest, table["id"].tolist())
    alignment = encoder.align(rows.ids) if encoder.align is not None else None
    if alignment is not None:
        rows.ids = [rows.ids[i] for i in alignment.manifest_rows]
        rows.manifest_rows, rows.feature_rows = alignment.manifest_rows, alignment.feature_rows
    if encoder.needs_images:
        if "path" not in table.columns:
            raise RankwiseError(
                f"{manifest}: missing column 'path' needed by the {kind} "
                "encoder; add image paths (relative to the manifest's folder) "
                "or use kind precomputed"
            )
        check_nonempty(table, ["path"], str(manifest))
        rows.paths = [str(p).strip() for p in table["path"]]
    if "text" in table.columns:
        rows.texts = table["text"].tolist()
    hashed = [manifest] + ([encoder.checkpoint] if encoder.checkpoint is not None else [])
    hashed += encoder.checkpoint_files
    manifest_sha256 = file_sha256(manifest)
    checkpoint_sha256 = None
    if encoder.checkpoint is not None:
        from .onnx_files import model_sha256

        checkpoint_sha256 = (  # an ONNX model with its weights files: one hash of all
            model_sha256(encoder.checkpoint, encoder.checkpoint_files)
            if encoder.checkpoint_files
            else file_sha256(encoder.checkpoint)
        )
    states = _file_states(hashed)
    _check_unchanged(hashed, before, states)
    attrs = {
        "encoder": {"kind": kind, "options": OPTIONS[kind].recorded(encoder.options)},
        "checkpoint_hash": checkpoint_sha256,
        "checkpoint": None if encoder.checkpoint is None else str(encoder.checkpoint),
        "manifest_hash": manifest_sha256,
        MANIFEST_SHA256: manifest_sha256,
        "manifest": str(manifest),
        "num_rows": len(rows.ids),
        "rankwise_version": __version__,
    }
    if encoder.preprocessing is not None:
        attrs["preprocessing"] = encoder.preprocessing
    # a model's forward pass (torch's and onnxruntime's CPU kernels) can round differently
    # with the batch's size and the thread count (~1e-7): what reproduces these bytes
    attrs["forward"] = {"batch_size": batch_size, "threads": workers}
    extra = None
    if alignment is not None:
        ids_file = Path(alignment.ids)
        attrs[ID_ALIGNMENT] = {
            **alignment.record(),
            "ids_sha256": file_sha256(ids_file) if ids_file.is_file() else None,
        }
        if alignment.dropped:
            extra = {MANIFEST_ROW: alignment.manifest_rows}
    n_rows = len(rows.ids)
    shape = [n_rows, 0]

    def checked(pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        from tqdm import tqdm

        start = 0
        with tqdm(
            total=n_rows,
            desc=f"encode {kind} {manifest.name}",
            unit="row",
            file=sys.stderr,
            disable=not progress,
            mininterval=1.0,
        ) as bar:
            for batch in encoder.batches(rows, batch_size, pool):
                bad = ~np.isfinite(batch).all(axis=1) if batch.ndim == 2 else None
                if bad is not None and bad.any():
                    i = start + int(np.flatnonzero(bad)[0])
                    if encoder.source is not None:  # the user's file, not a model's output
                        row = i if rows.feature_rows is None else int(rows.feature_rows[i])
                        raise RankwiseError(
                            f"{encoder.source}: row {row} (0-based; {rows.where(i)}) holds "
                            "NaN or infinite values; fix or recompute those embeddings"
                        )
                    raise RankwiseError(
                        f"{rows.where(i)}: the {kind} encoder produced "
                        "NaN or infinite values; check the input and the model"
                    )
                if batch.ndim == 2:
                    if start and batch.shape[1] != shape[1]:
                        raise RankwiseError(
                            f"{rows.where(start)}: the {kind} encoder returned "
                            f"dimension {batch.shape[1]} after {shape[1]}; "
                            "every batch must have the same dimension"
                        )
                    shape[1] = int(batch.shape[1])
                start += len(batch)
                bar.update(len(batch))
                yield batch
        if kind == "precomputed":  # its file is read batch by batch, not loaded at once
            _check_unchanged(hashed, states, _file_states(hashed))

    with (
        encoder.settings(),
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rankwise-decode") as pool,
    ):
        try:
            write_embeddings(out, checked(pool), n_rows, attrs=attrs, arrays=extra)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return {**attrs, "shape": shape}
