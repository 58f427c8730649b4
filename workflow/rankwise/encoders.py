"""Encoders: a manifest's images (or precomputed vectors) -> a Zarr embedding store.

:func:`encode_manifest` is the one entry point (``rankwise encode`` calls it). It
streams the manifest's rows in batches through an encoder and writes the
``(N, D)`` float32 embeddings with :func:`rankwise.store.write_embeddings`
(temporary store renamed when complete). Images are decoded and preprocessed by a
thread pool, one batch ahead of the encoder. Store attributes::

    encoder           {"kind": ..., "options": {... with defaults filled in}}
    checkpoint_hash   sha256 of the checkpoint / model / .npy file, or null
    manifest_hash     sha256 of the manifest file
    manifest          the manifest's path, as given
    num_rows          N
    rankwise_version  the package version

Kinds (options; defaults after ``=``):

``precomputed`` {query, gallery} or {path}; split=auto
    ``.npy`` or Zarr (a group holding ``embeddings``, or an array) per split,
    ``(N, D)`` and aligned with the manifest.  With {query, gallery} the split is
    ``split`` or, by default, the manifest's file stem (``query.csv`` -> query).
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
    onnxruntime's CPUExecutionProvider; the output is flattened to ``(B, D)``.
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
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from . import __version__
from .datasets import check_options
from .errors import RankwiseError
from .hashing import file_sha256
from .store import write_embeddings
from .torch_encoders import DEFAULTS as TORCH_DEFAULTS
from .torch_encoders import REQUIRED as TORCH_REQUIRED

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

DEFAULTS: dict[str, dict[str, Any]] = {
    "precomputed": {"query": None, "gallery": None, "path": None, "split": "auto"},
    "python": {"params": {}, "checkpoint": None, "input_size": None},
    "onnx": {"input_size": None, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD),
             "channel_order": "rgb", "layout": "nchw", "input": None, "output": None},
    "pixels": {"size": [16, 16], "grayscale": False},
    "color-histogram": {"bins": 8, "space": "hsv", "joint": False, "stripes": 1},
    "hog": {"size": [64, 64], "cell": 8, "bins": 9},
    **TORCH_DEFAULTS,
}
REQUIRED: dict[str, tuple[str, ...]] = {"python": ("factory",), "onnx": ("model",),
                                        **TORCH_REQUIRED}
ENCODER_KINDS = tuple(DEFAULTS)


def default_workers() -> int:
    """Decoding threads when none are given: the CPUs this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


# ---------------------------------------------------------------- option checks

def _size(kind: str, value: Any, name: str = "size") -> tuple[int, int]:
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))
    if not ok:
        raise RankwiseError(f"{kind}: option {name} must be [height, width] (two positive "
                            f"integers), got {value!r}")
    return int(value[0]), int(value[1])


def _int(kind: str, value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RankwiseError(f"{kind}: option {name} must be an integer >= {minimum}, got "
                            f"{value!r}")
    return value


def _choice(kind: str, value: Any, name: str, valid: Sequence[str]) -> str:
    if value not in valid:
        raise RankwiseError(f"{kind}: option {name} must be one of {', '.join(valid)}, got "
                            f"{value!r}")
    return value


def _checkpoint(kind: str, value: Any, name: str) -> Path:
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise RankwiseError(f"{path}: {kind} {name} file not found; check options.{name} "
                            f"(relative paths start from {Path.cwd()})")
    return path


# ---------------------------------------------------------------- images

@dataclass
class _Rows:
    """The manifest rows being encoded, for file access and error messages."""

    manifest: Path
    ids: list[str]
    paths: list[str] = field(default_factory=list)
    texts: list[str] | None = None  # the manifest's 'text' column, if any

    def where(self, i: int) -> str:
        return f"{self.manifest}: row {i + 2} (id {self.ids[i]!r})"

    def read(self, i: int, size: tuple[int, int] | None = None, mode: str = "RGB",
             resample: int = Image.Resampling.BILINEAR) -> Image.Image:
        """Decode row ``i``'s image, converted to ``mode`` and resized to [H, W]."""
        raw = self.paths[i]
        if not raw:
            raise RankwiseError(f"{self.where(i)}: empty 'path'; every row needs an image")
        path = Path(raw)
        if not path.is_absolute():
            path = self.manifest.parent / path
        try:
            with Image.open(path) as image:
                # PIL converts to HSV from RGB only
                image = image.convert("RGB").convert("HSV") if mode == "HSV" \
                    else image.convert(mode)
        except FileNotFoundError:
            raise RankwiseError(f"{self.where(i)}: image {raw!r} not found (looked for "
                                f"{path}); fix the 'path' column or restore the file") from None
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise RankwiseError(f"{self.where(i)}: cannot decode image {path} "
                                f"({type(exc).__name__}: {exc}); replace the file") from None
        if size is not None and image.size != (size[1], size[0]):
            image = image.resize((size[1], size[0]), resample)
        return image


def _image_batches(rows: _Rows, per_image: Callable[[int], Any], batch_size: int,
                   pool: ThreadPoolExecutor) -> Iterator[list[Any]]:
    """Yield ``[per_image(i) for i in batch]`` per batch, decoding one batch ahead."""
    n = len(rows.ids)
    pending: list[Future] = []
    futures: list[Future] = []
    try:
        for start in range(0, n, batch_size):
            futures = [pool.submit(per_image, i) for i in range(start, min(start + batch_size, n))]
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


def _colour_histogram(rows: _Rows, i: int, bins: int, space: str, joint: bool,
                      stripes: int) -> np.ndarray:
    image = np.asarray(rows.read(i, None, "HSV" if space == "hsv" else "RGB"))
    quant = (image.astype(np.int64) * bins) >> 8  # 0..bins-1 per channel
    parts = []
    for band in np.array_split(quant, stripes, axis=0):
        flat = band.reshape(-1, 3)
        if joint:
            hist = np.bincount((flat[:, 0] * bins + flat[:, 1]) * bins + flat[:, 2],
                               minlength=bins ** 3)
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
        raise RankwiseError(f"hog: cell {cell} is larger than the image {gray.shape}; use a "
                            "smaller cell or a larger size")
    h, w = cy * cell, cx * cell
    cell_index = (np.arange(h)[:, None] // cell) * cx + (np.arange(w)[None, :] // cell)
    hist = np.bincount((cell_index * bins + orient[:h, :w]).ravel(),
                       weights=magnitude[:h, :w].ravel(), minlength=cy * cx * bins)
    hist = hist.reshape(cy, cx, bins)
    by, bx = min(2, cy), min(2, cx)
    blocks = []
    for y in range(cy - by + 1):
        for x in range(cx - bx + 1):
            block = hist[y:y + by, x:x + bx].ravel()
            block = block / np.sqrt(np.sum(block ** 2) + 1e-6)
            block = np.minimum(block, 0.2)
            blocks.append(block / np.sqrt(np.sum(block ** 2) + 1e-6))
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


def _builtin(kind: str, opts: dict[str, Any]) -> _Encoder:
    if kind == "pixels":
        size = _size(kind, opts["size"])
        if not isinstance(opts["grayscale"], bool):
            raise RankwiseError(f"pixels: option grayscale must be true or false, got "
                                f"{opts['grayscale']!r}")

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _pixels(rows, i, size, opts["grayscale"])
    elif kind == "color-histogram":
        bins = _int(kind, opts["bins"], "bins")
        if bins > 256:
            raise RankwiseError(f"color-histogram: option bins must be at most 256, got {bins}")
        space = _choice(kind, opts["space"], "space", ("hsv", "rgb"))
        stripes = _int(kind, opts["stripes"], "stripes")
        if not isinstance(opts["joint"], bool):
            raise RankwiseError(f"color-histogram: option joint must be true or false, got "
                                f"{opts['joint']!r}")

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _colour_histogram(rows, i, bins, space, opts["joint"], stripes)
    else:
        size = _size(kind, opts["size"])
        cell = _int(kind, opts["cell"], "cell")
        bins = _int(kind, opts["bins"], "bins")

        def feature(rows: _Rows, i: int) -> np.ndarray:
            return _hog(rows, i, size, cell, bins)

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        for batch in _image_batches(rows, lambda i: feature(rows, i), batch_size, pool):
            yield np.stack(batch)

    return _Encoder(opts, None, batches)


def _load_factory(spec: Any) -> Callable[..., Any]:
    if not isinstance(spec, str) or ":" not in spec:
        raise RankwiseError(f"python: option factory must be 'module:function' or "
                            f"'path/to/file.py:function', got {spec!r}")
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
                raise RankwiseError(f"python: module {module_name!r} of options.factory not "
                                    "found; add its folder to PYTHONPATH or give "
                                    "'path/to/file.py:function'") from None
            sys.path.insert(0, os.getcwd())  # console scripts do not put the cwd on the path
            return _load_factory(spec)
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise RankwiseError(f"python: {module_name!r} has no attribute {attr!r} "
                            f"(options.factory {spec!r})") from None
    if not callable(factory):
        raise RankwiseError(f"python: options.factory {spec!r} is not callable")
    return factory


def _accepts_keyword(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               or p.kind == p.VAR_KEYWORD for p in parameters)


def _as_matrix(output: Any, n: int, what: str) -> np.ndarray:
    if hasattr(output, "detach"):  # a torch tensor
        output = output.detach().cpu().numpy()
    array = np.asarray(output, dtype=np.float32)
    if array.ndim == 1 and n == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[0] != n:
        raise RankwiseError(f"{what} returned an array of shape {array.shape} for a batch of "
                            f"{n} images; it must return (batch, dim)")
    return array


def _python(opts: dict[str, Any]) -> _Encoder:
    if not isinstance(opts["params"], dict):
        raise RankwiseError(f"python: option params must be an object, got {opts['params']!r}")
    size = None if opts["input_size"] is None else _size("python", opts["input_size"],
                                                         "input_size")
    checkpoint = None if opts["checkpoint"] is None else _checkpoint("python", opts["checkpoint"],
                                                                     "checkpoint")
    factory = _load_factory(opts["factory"])
    params = dict(opts["params"])
    if checkpoint is not None and "checkpoint" not in params \
            and _accepts_keyword(factory, "checkpoint"):
        params["checkpoint"] = str(checkpoint)
    encoder_fn = factory(**params)
    if not callable(encoder_fn):
        raise RankwiseError(f"python: factory {opts['factory']!r} returned "
                            f"{type(encoder_fn).__name__}, not a callable "
                            "images -> (batch, dim)")

    with_texts = _accepts_keyword(encoder_fn, "texts")

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        decode = lambda i: np.asarray(rows.read(i, size))  # noqa: E731
        start = 0
        for images in _image_batches(rows, decode, batch_size, pool):
            if with_texts:
                texts = None if rows.texts is None else rows.texts[start:start + len(images)]
                output = encoder_fn(images, texts=texts)
            else:
                output = encoder_fn(images)
            start += len(images)
            yield _as_matrix(output, len(images), f"factory {opts['factory']!r}")

    return _Encoder(opts, checkpoint, batches)


def _onnx(opts: dict[str, Any], threads: int) -> _Encoder:
    model = _checkpoint("onnx", opts["model"], "model")
    try:
        import onnxruntime as ort
    except ImportError:
        raise RankwiseError("onnx: the onnxruntime package is not installed; install the "
                            "extra: pip install 'rankwise[onnx]'") from None
    channel_order = _choice("onnx", opts["channel_order"], "channel_order", ("rgb", "bgr"))
    layout = _choice("onnx", opts["layout"], "layout", ("nchw", "nhwc"))
    mean, std = (np.asarray(opts[k], dtype=np.float32) for k in ("mean", "std"))
    if mean.shape != (3,) or std.shape != (3,) or not (std > 0).all():
        raise RankwiseError(f"onnx: options mean and std must be 3 numbers each (std > 0), got "
                            f"{opts['mean']!r} and {opts['std']!r}")
    settings = ort.SessionOptions()
    settings.intra_op_num_threads = threads
    settings.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(model), sess_options=settings,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RankwiseError(f"{model}: onnxruntime cannot load the model ({first})") from None
    inputs = {i.name: i for i in session.get_inputs()}
    input_name = opts["input"] or next(iter(inputs))
    if input_name not in inputs:
        raise RankwiseError(f"{model}: no input named {input_name!r}; inputs: "
                            f"{', '.join(inputs)}")
    outputs = [o.name for o in session.get_outputs()]
    output_name = opts["output"] or outputs[0]
    if output_name not in outputs:
        raise RankwiseError(f"{model}: no output named {output_name!r}; outputs: "
                            f"{', '.join(outputs)}")
    shape = list(inputs[input_name].shape)
    if len(shape) != 4:
        raise RankwiseError(f"{model}: input {input_name!r} has shape {shape}; expected a "
                            "4-D image batch")
    spatial = shape[2:4] if layout == "nchw" else shape[1:3]
    if opts["input_size"] is None:
        if not all(isinstance(v, int) for v in spatial):
            raise RankwiseError(f"{model}: the model's input size is dynamic ({spatial}); set "
                                "options.input_size to [height, width]")
        size = (int(spatial[0]), int(spatial[1]))
    else:
        size = _size("onnx", opts["input_size"], "input_size")
    opts = {**opts, "input_size": list(size), "input": input_name, "output": output_name}
    fixed_batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else None

    def preprocess(rows: _Rows, i: int) -> np.ndarray:
        x = np.asarray(rows.read(i, size), dtype=np.float32) / 255.0
        x = (x - mean) / std
        if channel_order == "bgr":
            x = x[:, :, ::-1]
        return np.ascontiguousarray(x.transpose(2, 0, 1) if layout == "nchw" else x)

    def run(x: np.ndarray) -> np.ndarray:
        if fixed_batch is None:
            return session.run([output_name], {input_name: x})[0]
        parts = []
        for start in range(0, len(x), fixed_batch):
            part = x[start:start + fixed_batch]
            pad = fixed_batch - len(part)
            if pad:
                part = np.concatenate([part, np.zeros((pad,) + part.shape[1:], part.dtype)])
            parts.append(session.run([output_name], {input_name: part})[0][:fixed_batch - pad])
        return np.concatenate(parts)

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        for batch in _image_batches(rows, lambda i: preprocess(rows, i), batch_size, pool):
            out = np.asarray(run(np.stack(batch)))
            yield _as_matrix(out.reshape(len(batch), -1), len(batch), f"{model}")

    return _Encoder(opts, model, batches, threads=threads)


def _open_vectors(source: Path) -> Any:
    """An ``(N, D)`` array-like from a .npy file or a Zarr store."""
    if not source.exists():
        raise RankwiseError(f"{source}: precomputed embeddings not found; check the options")
    if source.is_file():
        if source.suffix != ".npy":
            raise RankwiseError(f"{source}: precomputed embeddings must be a .npy file or a "
                                "Zarr store")
        try:
            return np.load(source, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise RankwiseError(f"{source}: not a readable .npy file ({exc})") from None
    import zarr

    try:
        node = zarr.open(str(source), mode="r")
    except Exception as exc:  # zarr raises several types for non-stores
        raise RankwiseError(f"{source}: not a readable Zarr store ({type(exc).__name__}); "
                            "give a .npy file or a Zarr store") from None
    if isinstance(node, zarr.Group):
        if "embeddings" not in node:
            raise RankwiseError(f"{source}: Zarr group without an 'embeddings' array; "
                                "store the (N, D) array as 'embeddings'")
        node = node["embeddings"]
    return node


def _precomputed(opts: dict[str, Any], manifest: Path, out: Path) -> _Encoder:
    given = [k for k in ("query", "gallery", "path") if opts[k] is not None]
    if opts["path"] is not None:
        if given != ["path"]:
            raise RankwiseError("precomputed: give either {path} or {query, gallery}, not both")
        source = Path(str(opts["path"])).expanduser()
    elif not given:
        raise RankwiseError("precomputed: missing option path (or query and gallery)")
    else:
        split = opts["split"]
        if split in (None, "auto"):
            split = next((s for s in (manifest.stem, out.name.split(".")[0])
                          if s in ("query", "gallery")), None)
            if split is None:
                raise RankwiseError(f"precomputed: cannot tell whether {manifest} is the query "
                                    "or the gallery; set options.split or options.path")
        _choice("precomputed", split, "split", ("query", "gallery"))
        if opts[split] is None:
            raise RankwiseError(f"precomputed: missing option {split} (embeddings for the "
                                f"{split} manifest {manifest})")
        source = Path(str(opts[split])).expanduser()
    vectors = _open_vectors(source)
    checkpoint = source if source.is_file() else None

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        n = len(rows.ids)
        if len(vectors.shape) != 2 or vectors.shape[0] != n:
            raise RankwiseError(f"{source}: {vectors.shape[0] if vectors.shape else 0} rows "
                                f"(shape {tuple(vectors.shape)}) but manifest {rows.manifest} "
                                f"has {n} rows; give (N, D) embeddings aligned row by row "
                                "with the manifest")
        step = max(batch_size, 8192)
        for start in range(0, n, step):
            yield np.asarray(vectors[start:start + step], dtype=np.float32)

    return _Encoder(opts, checkpoint, batches, needs_images=False)


def checkpoint_file(kind: str, options: dict[str, Any] | None,
                    split: str | None = None) -> str | None:
    """The file whose content identifies the encoder (for Snakemake inputs), or None.

    ``python``, ``reid``, ``timm`` -> ``checkpoint``, ``onnx``, ``torchscript`` ->
    ``model``, ``precomputed`` -> ``path`` or the ``split``'s file; built-in kinds have
    none.  Nothing is checked or opened.
    """
    options = options or {}
    if kind in ("python", "reid", "timm"):
        return options.get("checkpoint")
    if kind in ("onnx", "torchscript"):
        return options.get("model")
    if kind == "precomputed":
        return options.get("path") or (options.get(split) if split else None)
    return None


def build_encoder(kind: str, options: dict[str, Any] | None, *, manifest: Path, out: Path,
                  threads: int) -> _Encoder:
    """Check ``options`` for ``kind`` and return the configured encoder."""
    if kind not in DEFAULTS:
        raise RankwiseError(f"unknown encoder kind {kind!r}; valid kinds: "
                            f"{', '.join(ENCODER_KINDS)}")
    opts = check_options(kind, options, DEFAULTS[kind], REQUIRED.get(kind, ()))
    if kind == "precomputed":
        return _precomputed(opts, manifest, out)
    if kind == "python":
        return _python(opts)
    if kind == "onnx":
        return _onnx(opts, threads)
    if kind in TORCH_DEFAULTS:
        from .torch_encoders import build

        return build(kind, opts, threads)
    return _builtin(kind, opts)


# ---------------------------------------------------------------- entry point

def encode_manifest(manifest_csv: str | os.PathLike, kind: str, options: dict[str, Any] | None,
                    out_store: str | os.PathLike, batch_size: int = 64,
                    workers: int | None = None, *, progress: bool = True) -> dict[str, Any]:
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

    Returns
    -------
    The store's attributes plus ``shape`` ``[N, D]``.
    """
    manifest, out = Path(manifest_csv), Path(out_store)
    if not manifest.is_file():
        raise RankwiseError(f"{manifest}: manifest not found; run `rankwise prepare` or check "
                            "the path")
    batch_size = _int("encode", batch_size, "batch_size")
    workers = default_workers() if workers is None else _int("encode", workers, "workers")
    try:
        table = pd.read_csv(manifest, dtype=str, keep_default_na=False, na_filter=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise RankwiseError(f"{manifest}: not a readable CSV manifest "
                            f"({type(exc).__name__}); write a header line and one row per "
                            "item") from None
    table.columns = [str(c).strip() for c in table.columns]
    if "id" not in table.columns:
        raise RankwiseError(f"{manifest}: missing column 'id'; every manifest needs id and label")
    if len(table) == 0:
        raise RankwiseError(f"{manifest}: no rows to encode")
    encoder = build_encoder(kind, options, manifest=manifest, out=out, threads=workers)
    rows = _Rows(manifest, table["id"].tolist())
    if encoder.needs_images:
        if "path" not in table.columns:
            raise RankwiseError(f"{manifest}: missing column 'path' needed by the {kind} "
                                "encoder; add image paths (relative to the manifest's folder) "
                                "or use kind precomputed")
        rows.paths = table["path"].str.strip().tolist()
    if "text" in table.columns:
        rows.texts = table["text"].tolist()
    attrs = {
        "encoder": {"kind": kind, "options": encoder.options},
        "checkpoint_hash": None if encoder.checkpoint is None else file_sha256(encoder.checkpoint),
        "checkpoint": None if encoder.checkpoint is None else str(encoder.checkpoint),
        "manifest_hash": file_sha256(manifest),
        "manifest": str(manifest),
        "num_rows": len(table),
        "rankwise_version": __version__,
    }
    if encoder.preprocessing is not None:
        attrs["preprocessing"] = encoder.preprocessing
    shape = [len(table), 0]

    def checked(pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        from tqdm import tqdm

        start = 0
        with tqdm(total=len(table), desc=f"encode {kind} {manifest.name}", unit="row",
                  file=sys.stderr, disable=not progress, mininterval=1.0) as bar:
            for batch in encoder.batches(rows, batch_size, pool):
                bad = ~np.isfinite(batch).all(axis=1) if batch.ndim == 2 else None
                if bad is not None and bad.any():
                    i = start + int(np.flatnonzero(bad)[0])
                    raise RankwiseError(f"{rows.where(i)}: the {kind} encoder produced "
                                        "NaN or infinite values; check the input and the model")
                if batch.ndim == 2:
                    if start and batch.shape[1] != shape[1]:
                        raise RankwiseError(f"{rows.where(start)}: the {kind} encoder returned "
                                            f"dimension {batch.shape[1]} after {shape[1]}; "
                                            "every batch must have the same dimension")
                    shape[1] = int(batch.shape[1])
                start += len(batch)
                bar.update(len(batch))
                yield batch

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rankwise-decode") as pool:
        try:
            write_embeddings(out, checked(pool), len(table), attrs=attrs)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return {**attrs, "shape": shape}
