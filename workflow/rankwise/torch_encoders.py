"""Torch encoder kinds: ``reid``, ``timm`` and ``torchscript`` checkpoints -> embeddings.

Needs the optional extra ``rankwise[torch]`` (torch, timm, reid); torch and the model
libraries are imported only when one of these kinds is built, so ``import rankwise``
stays light. :func:`build` is called by :func:`rankwise.encoders.build_encoder`; the
rows are decoded and preprocessed by its thread pool one batch ahead of the forward pass.

Options (declared, with their defaults, in :data:`rankwise.encoders.OPTIONS`):

``reid`` {architecture, checkpoint, checkpoint_key=null, input_size=null,
interpolation=null, flip, device, half}
    An architecture of the ``reid`` package (``osnet_x1_0``, ..., ``fastreid_sbs_resnest50``)
    built without weights, then ``checkpoint`` (a torchreid / fast-reid ``.pth`` or a
    ``.safetensors``) loaded strictly.  The embedding is the backbone's eval-mode output,
    the feature ``reid.ReIDModel`` embeds; preprocessing is the package's own for the
    architecture (``ReIDPreprocessing.build_crop_transform``: PIL stretch resize to
    ``input_size`` [H, W], default the architecture's, ``ToTensor``, ImageNet
    ``Normalize``), so rankwise's rows equal ``ReIDModel.extract_embeddings_from_paths``.
    Its resize is bilinear (torchreid's test transform, and BoT-SORT's fast-reid
    inference); fast-reid's own test transform resizes bicubic (``Resize(...,
    interpolation=3)``): ``interpolation: bicubic`` for fast-reid's numbers.
``timm`` {model, checkpoint, checkpoint_key=null, input_size=null, mean=null, std=null,
interpolation="bilinear", flip, device, half}
    ``timm.create_model(model, pretrained=False, num_classes=0)``: the pooled pre-logits
    features; a model built for one image size (ViT, DeiT, Swin) with
    ``img_size=input_size`` when ``input_size`` is given.  ``input_size``, ``mean`` and
    ``std`` default to the model's data config; no centre crop (re-ID evaluation habit,
    unlike the config's ``crop_pct``).
``torchscript`` {model, input_size, mean=ImageNet, std=ImageNet, channel_order="rgb",
interpolation="bilinear", flip, device, half}
    A ``torch.jit.script`` / ``torch.jit.trace`` file; its output (a tensor of shape
    ``(B, ...)``, at least 2-D, checked on every batch) is flattened to ``(B, D)``.  A
    module traced in training mode (BatchNorm or dropout fixed in it) is refused
    (:func:`_traced_training_layers`).

For ``timm`` and ``torchscript`` an image becomes ``x = (resize(image, [H, W]) / 255 -
mean) / std`` as ``(3, H, W)`` float32, mean/std per RGB channel, channels reversed
after normalising when ``channel_order`` is ``bgr``.  Common options: ``device``
``auto|cpu|cuda`` (auto = cuda when available), ``half`` (float16 weights and inputs;
cuda only), ``flip``: the embedding is ``(f(x) + f(mirror(x))) / 2`` of the *raw*
features, not L2-normalised before averaging, as fast-reid's flip test does
(``inference_on_dataset``: ``(outputs + flip_outputs) / 2``; its evaluator normalises
afterwards, and rankwise's cosine distance normalises too).

Strict loading (:func:`load_checkpoint`): a bare state dict or one wrapped under
``state_dict`` / ``model`` / ``module``, ``module.`` (DataParallel) and ``_orig_mod.``
(torch.compile) prefixes stripped (:func:`_unwrapped`), a LightningModule's attribute
prefix (``model.``, also ``model._orig_mod.``) too (:func:`_under_one_attribute`),
read with ``torch.load(weights_only=True)`` with numpy scalars and arrays allowed for
that one call.  Every key must match the model by name and shape except the
classifier head (dropped for embedding) and BatchNorm ``num_batches_tracked``
counters (absent from pre-0.4.1 checkpoints; unused in eval mode); an
``AveragedModel``'s ``n_averaged`` counter is no weight either (:func:`_without_counter`).
``checkpoint_key`` (``reid``, ``timm``) picks other weights of the file, e.g. an EMA
copy: an entry (``state_dict_ema``), a key prefix (``model_ema.module``), or an entry
then a prefix (:func:`read_checkpoint`).
"""

from __future__ import annotations

import contextlib
import difflib
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RankwiseError, first_line

if TYPE_CHECKING:  # imported lazily at run time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from .encoders import _Encoder, _Rows

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
_EXTRA = "pip install 'rankwise[torch]'"
_WRAPPERS = ("state_dict", "model", "module")
# reid architecture family -> checkpoint keys of its identity classifier (after remapping
# is not possible: fast-reid's remap drops them, so they are matched on the file's names)
_REID_HEADS = {"osnet": ("classifier.",), "fastreid": ("heads.weight", "heads.classifier.")}


def _import(kind: str, module: str) -> Any:
    """Import ``module`` or raise the one-line 'install the extra' error."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise RankwiseError(
            f"{kind}: the {module.split('.')[0]} package is not installed; "
            f"install the extra: {_EXTRA}"
        ) from None


# ---------------------------------------------------------------- options


def resolve_device(kind: str, device: Any, half: bool) -> str:
    """``auto|cpu|cuda`` -> ``cpu`` or ``cuda``; cuda must be available, half needs cuda."""
    if device not in ("auto", "cpu", "cuda"):
        raise RankwiseError(f"{kind}: option device must be one of auto, cpu, cuda, got {device!r}")
    torch = _import(kind, "torch")
    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise RankwiseError(
            f"{kind}: option device is cuda but torch sees no CUDA device "
            f"(torch {torch.__version__}); use device: cpu or auto"
        )
    resolved = "cuda" if device == "cuda" or (device == "auto" and available) else "cpu"
    if half and resolved == "cpu":
        raise RankwiseError(
            f"{kind}: option half: true needs a CUDA device, but device "
            f"{device!r} runs on the CPU here; set half: false"
        )
    return resolved


# ---------------------------------------------------------------- checkpoints


def _numpy_globals() -> list[Any]:
    """What pickled numpy scalars and arrays need: reconstructors, dtype and its classes."""
    core = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core
    dtypes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return [core.multiarray.scalar, core.multiarray._reconstruct, np.ndarray, np.dtype, *dtypes]


def read_checkpoint(path: Path, kind: str, checkpoint_key: str | None = None) -> dict[str, Any]:
    """The state dict in ``path``: unwrapped, ``module.`` / ``_orig_mod.`` prefixes
    stripped, on the CPU.

    ``.safetensors`` files are read with safetensors; anything else with
    ``torch.load(weights_only=True)`` inside ``torch.serialization.safe_globals``
    allowing numpy scalars/arrays (nothing else; ``weights_only`` stays on).

    ``checkpoint_key`` (the option; None: the weights found as the module docstring
    says) picks the weights: an entry of the checkpoint's dict or of a wrapper inside it
    (timm's ``state_dict_ema``, DeiT's ``model_ema``), unwrapped further as usual; else
    a prefix of the state dict's keys, dots separating components (a LightningModule's
    EMA copy: ``model_ema.module``), matched after the wrapper prefixes are stripped from
    both (so ``model_ema`` selects ``model_ema.module.`` too: the remainder is stripped
    again); or leading components naming an entry, the rest a prefix inside it
    (``model_ema.module`` for torchvision's ``{"model_ema": AveragedModel.state_dict()}``).
    Named nowhere: an error listing the entries and prefixes there are.
    """
    torch = _import(kind, "torch")
    try:
        empty = path.stat().st_size == 0
    except OSError:
        empty = False  # torch.load / load_file name the error
    if empty:  # torch said only "EOFError"
        raise RankwiseError(
            f"{path}: the checkpoint is empty (0 bytes): is it still being written? Run "
            "again once it is saved"
        )
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            data: Any = load_file(str(path), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            if _safetensors_cut_short(path):
                raise RankwiseError(
                    f"{path}: not a readable safetensors file: "
                    + _cut_short("its header names more bytes than the file holds")
                ) from None
            reason = _LFS_POINTER if _head(path).startswith(b"version https://") else None
            raise RankwiseError(
                f"{path}: not a readable safetensors file "
                f"({reason or first_line(exc) + '; check options.checkpoint'})"
            ) from None
    else:
        import pickle

        try:
            with warnings.catch_warnings(), torch.serialization.safe_globals(_numpy_globals()):
                # torch warns about old pickle protocols on stderr; the file still loads
                warnings.simplefilter("ignore", UserWarning)
                data = torch.load(str(path), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            import re

            found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
            if found is None:
                raise RankwiseError(
                    f"{path}: not a readable torch checkpoint ({_unpickling_reason(path, exc)})"
                ) from None
            raise RankwiseError(
                f"{path}: the checkpoint holds a Python object ({found.group(1)}) that "
                "torch.load(weights_only=True) refuses to run; if you trust the file, save its "
                "weights alone: M = torch.nn.Module; m = torch.load(f, weights_only=False); "
                "torch.save(m.state_dict() if isinstance(m, M) else {k: v.state_dict() if "
                "isinstance(v, M) else v for k, v in m.items() if isinstance(v, (dict, M))}, "
                "'weights.pth')"
            ) from None
        except (RuntimeError, EOFError, ValueError, OSError) as exc:
            archive = _archive_kind(path)
            if archive == "cut":
                raise RankwiseError(
                    f"{path}: not a readable torch checkpoint: {_cut_short(_ZIP_WITHOUT_END)}"
                ) from None
            if archive == "torchscript":  # torch's own text advises weights_only=False
                raise RankwiseError(
                    f"{path}: a TorchScript module (torch.jit.script / trace), not a "
                    f"checkpoint of weights; evaluate it with kind torchscript (options.model "
                    f"and input_size), or give the {kind} encoder the model's state dict"
                ) from None
            raise RankwiseError(
                f"{path}: not a readable torch checkpoint ({first_line(exc)}); check "
                "options.checkpoint"
            ) from None
        except Exception as exc:  # the unpickler on other bytes: KeyError,
            # IndexError ("pop from empty list": text), struct.error (an old-format file cut
            # short), ...: whatever it raises, the file is not a whole torch.save file
            reason = f"not a file written by torch.save, or cut short: {type(exc).__name__}"
            raise RankwiseError(
                f"{path}: not a readable torch checkpoint ({reason}); check options.checkpoint"
            ) from None
    # training loops wrap the weights: {"state_dict": ..., "epoch": 60, "optimizer": ...}
    entries: list[str] = []  # the dicts inside the wrappers passed: what checkpoint_key names
    chosen = checkpoint_key is None
    rest = checkpoint_key  # of checkpoint_key, what names no entry passed: a key prefix
    while isinstance(data, Mapping) and not _is_state_dict(data, torch):
        entries += [k for k, v in data.items() if isinstance(k, str) and isinstance(v, Mapping)]
        if not chosen and rest in data:
            data, chosen = data[rest], True
            continue
        head = None if chosen or rest is None else _entry_named(data, rest)
        if head is not None:  # model_ema.module: the entry model_ema, the prefix module.
            data, rest = data[head], rest[len(head) + 1 :]
            continue
        inner = next((data[k] for k in _WRAPPERS if isinstance(data.get(k), Mapping)), None)
        if inner is None:
            break
        data = inner
    entries = list(dict.fromkeys(entries))
    if not isinstance(data, Mapping) or not _is_state_dict(data, torch):
        keys = list(data)[:8] if isinstance(data, Mapping) else type(data).__name__
        if checkpoint_key is not None and not chosen:
            raise _unknown_checkpoint_key(path, checkpoint_key, entries, [])
        if checkpoint_key is not None:
            held = (
                f"a dict of {keys}"
                if isinstance(data, Mapping)
                else f"{type(data).__name__} {repr(data)[:40]}"
            )
            raise RankwiseError(
                f"{path}: the checkpoint's entry {checkpoint_key!r} (options.checkpoint_key) "
                f"holds {held}, not a state dict; name the entry that holds the weights: "
                f"{_listing(entries, 6)}"
            )
        raise RankwiseError(
            f"{path}: no state dict found (top level: {keys}); save "
            "model.state_dict(), bare or under 'state_dict', 'model' or "
            "'module', or name the entry holding it with options.checkpoint_key"
        )
    state = {_unwrapped(key): value for key, value in _without_counter(data).items()}
    if chosen or checkpoint_key is None or rest is None:
        return state
    # what follows an entry named (model_ema.module: module), else the whole key, also
    # when the entry's keys repeat its name ({"model": {"model.backbone.*": ...}})
    for key in dict.fromkeys([rest, checkpoint_key]):
        prefix = _unwrapped(key + ".")  # "" when it names only wrappers: all of it
        selected = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if selected:
            return {_unwrapped(k): v for k, v in _without_counter(selected).items()}
    raise _unknown_checkpoint_key(path, checkpoint_key, entries, [*state])


def _entry_named(data: Mapping, key: str) -> str | None:
    """The longest of ``key``'s leading dotted components (``model_ema`` of
    ``model_ema.module``) naming a dict in ``data``, or None."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:n])
        if isinstance(data.get(head), Mapping):
            return head
    return None


#: ``torch.optim.swa_utils.AveragedModel``'s counter of averaged steps, beside the
#: averaged network's weights under ``module.``
_AVERAGED_COUNTER = "n_averaged"


def _without_counter(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state`` without AveragedModel's ``n_averaged`` when it is an AveragedModel's state
    dict (every other key under ``module.``; torchvision's reference ``train.py`` saves
    one as ``model_ema``): a counter, not a weight, as BatchNorm's ``num_batches_tracked``
    counters are ignored."""
    others = [k for k in state if k != _AVERAGED_COUNTER]
    if _AVERAGED_COUNTER in state and others and all(k.startswith("module.") for k in others):
        return {k: state[k] for k in others}
    return state


def _unknown_checkpoint_key(
    path: Path, checkpoint_key: str, entries: list[str], keys: list[str]
) -> RankwiseError:
    """``checkpoint_key`` names no entry and no key prefix: what there is, and the fix."""
    prefixes = list(
        dict.fromkeys(".".join(k.split(".")[:n]) for k in keys for n in (1, 2) if k.count(".") >= n)
    )
    heads = [p for p in prefixes if "." not in p]
    there = "; ".join(
        f"{name}: {_listing(names, 6)}"
        for name, names in (("entries", entries), ("key prefixes", heads))
        if names
    )
    close = difflib.get_close_matches(checkpoint_key, entries + prefixes, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return RankwiseError(
        f"{path}: options.checkpoint_key {checkpoint_key!r} names no entry of the checkpoint "
        f"and no prefix of its weights' keys ({there or 'it has neither'}): set it to one of "
        "these (a prefix's components separated by dots: model_ema.module) or to null for the "
        f"weights found automatically{hint}"
    )


#: DataParallel / DistributedDataParallel's ``module.``, torch.compile's ``_orig_mod.``
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _unwrapped(key: str) -> str:
    """``key`` without the wrapper prefixes at its start (:data:`_WRAPPER_PREFIXES`, in
    any order and number): ``module._orig_mod.conv1.weight`` -> ``conv1.weight``.  The
    one rule for a whole key and for what follows a LightningModule's attribute."""
    while key.startswith(_WRAPPER_PREFIXES):
        key = key.partition(".")[2]
    return key


def _is_state_dict(data: Mapping, torch: Any) -> bool:
    return len(data) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in data.items()
    )


_LFS_POINTER = "it is a Git LFS pointer, not the weights: fetch them with git lfs pull"


def _head(path: Path) -> bytes:
    """The first 16 bytes of ``path`` (what kind of file it is), or none if unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(16)
    except OSError:
        return b""


def _safetensors_cut_short(path: Path) -> bool:
    """Whether ``path`` is the start of a safetensors file: its header (8 bytes of
    little-endian length, then that much JSON) reads, but its tensors' ``data_offsets``
    end beyond the file (safetensors says only "incomplete metadata, file not fully
    covered")."""
    import json
    import struct

    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 100_000_000:  # not a header: another file
                return False
            header = json.loads(handle.read(length))
        size = path.stat().st_size
    except (OSError, struct.error, ValueError):
        return False
    if not isinstance(header, dict):
        return False
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__"
        and isinstance(v, dict)
        and isinstance(v.get("data_offsets"), list)
        and len(v["data_offsets"]) == 2
        and isinstance(v["data_offsets"][1], int)
    ]
    return bool(ends) and 8 + length + max(ends) > size


_ZIP_WITHOUT_END = "a zip archive without its end"


def _cut_short(evidence: str) -> str:
    """The end of the message for a file cut short (a sweep's newest epoch still being
    saved), ``evidence`` saying how that shows."""
    return (
        f"it is cut short ({evidence}): is it still being written? Run again once it is "
        "saved, or save it again"
    )


def _archive_kind(path: Path) -> str | None:
    """What a zip-format file (torch.save's default since torch 1.6, and TorchScript's)
    is, by its entries: ``"cut"`` (a zip's start without its end: still being written, or
    a copy cut short), ``"torchscript"`` (``constants.pkl``: a scripted or traced module),
    ``"torch.save"`` (``data.pkl`` alone: a checkpoint); None for any other file."""
    import zipfile

    if not _head(path).startswith(b"PK\x03\x04"):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:  # no end of central directory
        return "cut"
    except OSError:
        return None
    if any(name.rpartition("/")[2] == "constants.pkl" for name in names):
        return "torchscript"
    return "torch.save" if any(n.rpartition("/")[2] == "data.pkl" for n in names) else None


def _unpickling_reason(path: Path, exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` could not unpickle ``path``, and the fix
    (torch's own text advises turning ``weights_only`` off, which rankwise never does)."""
    head = _head(path)
    if head[8:10] == b'{"':  # an 8-byte header length, then the JSON header
        return "it is a safetensors file; name it .safetensors"
    if head.startswith(b"\x93NUMPY"):
        return "it is a .npy array, not a checkpoint; check options.checkpoint"
    if head.startswith(b"version https://"):  # git-lfs.github.com/spec/v1
        return _LFS_POINTER
    text = str(exc)
    if "Unsupported operand 149" in text:  # FRAME: protocols 4 and 5 only
        return (
            "written with pickle protocol 4 or later, which torch.load(weights_only=True) "
            "cannot read; if you trust the file, re-save it with torch.save's default "
            "protocol: torch.save(torch.load(f, weights_only=False), 'weights.pth')"
        )
    import re

    cause = re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    what = cause.group(1).strip()[:120] if cause else "not a file written by torch.save"
    return f"{what}; check options.checkpoint"


def _listing(keys: list[str], shown: int = 5) -> str:
    more = f", ... ({len(keys)} in all)" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def load_checkpoint(
    model: torch.nn.Module,
    path: Path,
    *,
    kind: str,
    what: str,
    heads: tuple[str, ...] = (),
    remap: Callable[[dict], dict] | None = None,
    checkpoint_key: str | None = None,
    extras: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Load ``path`` into ``model`` strictly (see the module docstring); returns the
    checkpoint's values of the keys ``extras`` that it holds (not the model's weights:
    an older fast-reid model's ``pixel_mean`` / ``pixel_std`` buffers).

    ``heads``: key prefixes of the classifier head, ignored when the model has no such key.
    ``remap``: a per-key renaming (``{key: tensor} -> {new_key: tensor}`` or ``{}``) from
    the checkpoint's layout to the model's; a key it drops is unexpected unless a head.
    ``what`` names the model in messages (e.g. ``timm model 'resnet10t'``).
    ``checkpoint_key``: the option, which weights of the file (:func:`read_checkpoint`).
    """
    target = model.state_dict()
    state = read_checkpoint(path, kind, checkpoint_key)
    if remap is None:  # a remapped layout (fast-reid's) is not the model's key for key
        state = _under_one_attribute(state, target, path)
    loaded, unexpected, found = {}, [], {}
    for key, value in state.items():
        if key in extras and key not in target:
            found[key] = value
            continue
        if key.startswith(heads) and key not in target:  # the classifier, dropped for embedding
            continue
        mapped = remap({key: value}) if remap is not None else {key: value}
        if not mapped:
            unexpected.append(key)
        for new_key, new_value in mapped.items():
            if new_key in target:
                loaded[new_key] = new_value
            else:
                unexpected.append(key)
    missing = [k for k in target if k not in loaded and not k.endswith("num_batches_tracked")]
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in loaded.items()
        if v.shape != target[k].shape
    ]
    if missing or unexpected or wrong:
        # the classifier's name (fc) from its keys (fc.weight), where heads lists them
        places = {h.rsplit(".", 1)[0] for h in heads if h.endswith((".weight", ".bias"))}
        inside = [k for k in unexpected if any(k.startswith(f"{p}.") for p in places)]
        if inside and not missing and not wrong and len(inside) == len(unexpected):
            raise RankwiseError(
                f"{path}: the checkpoint's classifier {'/'.join(sorted(places))!r} holds more "
                f"than one layer ({_listing(inside)}): a head trained under its name (a neck "
                "before the identity layer) would be left out of the embedding, which is the "
                f"{what}'s pre-classifier feature; export the network up to the feature you "
                "evaluate as a TorchScript file (kind torchscript)"
            )
        parts = [
            f"{len(keys)} {name}: {_listing(keys, 3 if keys is wrong else 5)}"
            for name, keys in (
                ("missing key(s)", missing),
                ("unexpected key(s)", unexpected),
                ("shape mismatch(es) (checkpoint vs model)", wrong),
            )
            if keys
        ]
        raise RankwiseError(
            f"{path}: checkpoint does not match the {what}: "
            f"{'; '.join(parts)}; check that the options name the architecture "
            "(and variant) this checkpoint was trained with"
        )
    model.load_state_dict(loaded, strict=False)  # completeness checked above
    return found


def _under_one_attribute(state: dict[str, Any], target: Mapping, path: Path) -> dict[str, Any]:
    """A LightningModule's checkpoint holds the network under the attribute that keeps
    it (``model.conv1.weight`` for ``self.model``), beside other attributes' weights (a
    loss's parameters, an EMA copy under ``model_ema.module.``).  When no key matches the
    model as it is, the keys under the one first component whose remainders (wrapper
    prefixes stripped: ``model._orig_mod.`` for ``self.model = torch.compile(net)``) name
    at least half of the model's keys, stripped of it; loading then checks them strictly.
    Of several such components, an EMA copy's (:func:`_is_ema`) is left out, as timm's
    ``state_dict_ema`` is; two others (a student and a teacher) are refused: which one is
    meant cannot be told.
    """
    if any(key in target for key in state):
        return state
    groups: dict[str, dict[str, Any]] = {}
    for key, value in state.items():
        head, dot, rest = key.partition(".")
        if dot:
            groups.setdefault(head, {})[_unwrapped(rest)] = value
    found = {head: sum(k in target for k in keys) for head, keys in groups.items()}
    matching = [head for head, n in found.items() if n > 0 and 2 * n >= len(target)]
    if len(matching) > 1:
        matching = [head for head in matching if not _is_ema(head)] or matching
    if len(matching) > 1:
        raise RankwiseError(
            f"{path}: the checkpoint holds the model's weights under "
            f"{' and '.join(repr(h + '.') for h in matching)}; which one to evaluate cannot be "
            f"told: set options.checkpoint_key to one of {', '.join(matching)}"
        )
    return groups[matching[0]] if matching else state


def _is_ema(attribute: str) -> bool:
    """Whether a module attribute's name says it holds an EMA copy: ``ema`` is one of its
    ``_``-separated words (``model_ema``, ``ema``, ``ema_model``)."""
    return "ema" in attribute.lower().split("_")


# ---------------------------------------------------------------- models


def _close(name: str, valid: list[str], hint: str) -> str:
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.6)
    return f"close names: {', '.join(close)}" if close else hint


def _reid_model(opts: dict[str, Any], checkpoint: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The reid backbone with its checkpoint, its crop transform, and the record."""
    import dataclasses

    _import("reid", "torch")
    architectures = _import("reid", "reid.architectures")
    name = opts["architecture"]
    valid = architectures.list_architectures()
    if name not in valid:
        raise RankwiseError(
            f"reid: unknown architecture {name!r} in options.architecture; "
            f"{_close(str(name), valid, 'valid: ' + ', '.join(valid))} (timm "
            "models: use kind timm)"
        )
    preprocessing = architectures.default_preprocessing_for_architecture(name)
    if opts["input_size"] is not None:
        size = tuple(opts["input_size"])
        preprocessing = dataclasses.replace(preprocessing, input_size=size)
    if opts["interpolation"] is not None:  # fast-reid's test transform: bicubic
        preprocessing = dataclasses.replace(preprocessing, interpolation=opts["interpolation"])
    model = architectures.build_architecture(name, pretrained=False)
    family = "fastreid" if name.startswith("fastreid") else "osnet"
    pixel = load_checkpoint(
        model,
        checkpoint,
        kind="reid",
        what=f"reid architecture {name!r}",
        heads=_REID_HEADS[family],
        remap=architectures.checkpoint_remap_for_architecture(name),
        checkpoint_key=opts["checkpoint_key"],
        extras=_FASTREID_PIXEL if family == "fastreid" else (),
    )
    if pixel:  # the normalisation the model was trained with (cfg.MODEL.PIXEL_MEAN / _STD)
        preprocessing = dataclasses.replace(
            preprocessing, **_pixel_normalisation(pixel, checkpoint)
        )
    record = {
        "input_size": list(preprocessing.input_size),
        "resize": preprocessing.resize_mode,
        "interpolation": preprocessing.interpolation.value,
        "mean": list(preprocessing.mean),
        "std": list(preprocessing.std),
        "channel_order": "rgb",
    }
    return model, preprocessing.build_crop_transform(), record


#: fast-reid's ``Baseline`` saved these buffers (cfg.MODEL.PIXEL_MEAN / PIXEL_STD, on
#: the 0-255 scale, shape (1, 3, 1, 1)) until its commit 883fd4a (2021-03-23).
_FASTREID_PIXEL = ("pixel_mean", "pixel_std")


def _pixel_normalisation(pixel: dict[str, Any], checkpoint: Path) -> dict[str, tuple]:
    """``mean`` / ``std`` (of x / 255, RGB) from an older fast-reid checkpoint's buffers."""
    if set(pixel) != set(_FASTREID_PIXEL):
        raise RankwiseError(
            f"{checkpoint}: the checkpoint holds {', '.join(sorted(pixel))} without "
            f"{', '.join(sorted(set(_FASTREID_PIXEL) - set(pixel)))}; fast-reid saves both"
        )
    values = {}
    for key, name in (("pixel_mean", "mean"), ("pixel_std", "std")):
        v = np.asarray(pixel[key].detach().cpu(), np.float64).reshape(-1)
        if v.shape != (3,) or not np.all(np.isfinite(v)) or (name == "std" and np.any(v <= 0)):
            raise RankwiseError(
                f"{checkpoint}: its {key} buffer is {v.tolist()}; expected three "
                f"{'positive ' if name == 'std' else ''}numbers on the 0-255 scale"
            )
        values[name] = tuple(float(x) / 255.0 for x in v)
    return values


def _timm_model(opts: dict[str, Any], checkpoint: Path) -> tuple[Any, dict[str, Any]]:
    """The timm model (no classifier) with its checkpoint, and its data config."""
    timm = _import("timm", "timm")
    name = opts["model"]
    if not isinstance(name, str) or not timm.is_model(name):
        raise RankwiseError(
            f"timm: unknown model {name!r} in options.model; "
            f"{_close(str(name), timm.list_models(), 'see timm.list_models()')}"
        )
    try:
        # a model built for one image size (ViT, DeiT, Swin: timm's img_size) is built for
        # input_size, so a ViT trained at 256 x 128 loads; the others take any size
        size = {} if opts["input_size"] is None else {"img_size": tuple(opts["input_size"])}
        model = timm.create_model(name, pretrained=False, num_classes=0, **size)
    except TypeError:  # no img_size argument (CNNs)
        model = timm.create_model(name, pretrained=False, num_classes=0)
    head = model.pretrained_cfg.get("classifier") or ()
    # the classifier's weight and bias alone: keys deeper under its name (fc.0.weight: a
    # neck trained inside fc) are layers the embedding would silently leave out
    heads = tuple(
        f"{h}.{p}" for h in ([head] if isinstance(head, str) else head) for p in ("weight", "bias")
    )
    load_checkpoint(
        model,
        checkpoint,
        kind="timm",
        what=f"timm model {name!r}",
        heads=heads,
        checkpoint_key=opts["checkpoint_key"],
    )
    return model, timm.data.resolve_model_data_config(model)


def _torchscript_model(path: Path) -> Any:
    torch = _import("torchscript", "torch")
    try:
        with warnings.catch_warnings():  # torch >= 2.9 flags torch.jit as deprecated
            warnings.simplefilter("ignore", FutureWarning)
            model = torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError, OSError) as exc:
        archive = _archive_kind(path)
        if archive == "cut":
            raise RankwiseError(
                f"{path}: not a readable TorchScript module: {_cut_short(_ZIP_WITHOUT_END)}"
            ) from None
        reason = (
            "it is a torch.save checkpoint: weights without the code"
            if archive == "torch.save"
            else first_line(exc)
        )
        raise RankwiseError(
            f"{path}: not a TorchScript module ({reason}); save one "
            "with torch.jit.script(model).save(path) or torch.jit.trace, or "
            "use kind timm / reid for a state dict"
        ) from None
    layers = _traced_training_layers(model)
    if layers:
        raise RankwiseError(
            f"{path}: the module was traced in training mode ({' and '.join(layers)} "
            "layer(s) fixed in it): a trace keeps that mode whatever eval() says, so "
            "BatchNorm would normalise by each batch's own statistics and dropout would drop "
            "at random, and the embeddings would depend on the batch; trace it again after "
            "model.eval()"
        )
    return model


#: ``aten`` ops taking a ``training`` flag: op -> (its index, the index of the input that
#: decides whether the flag matters: BatchNorm's running mean (None: batch statistics by
#: design, ``track_running_stats=False``), dropout's probability (0: a no-op))
_TRAINING_FLAG = {
    "aten::batch_norm": (5, 3),
    **{
        f"aten::{op}{inplace}": (2, 1)
        for op in ("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
        for inplace in ("", "_")
    },
}


def _traced_training_layers(model: Any) -> list[str]:
    """How many layers of each kind (``["14 BatchNorm", "1 dropout"]``) of a TorchScript
    module have a training flag that is a constant ``True``: a module traced in training
    mode (``torch.jit.trace`` records ``self.training`` as a constant; a scripted module
    reads the attribute, which ``eval()`` sets)."""
    try:
        graph = model.inlined_graph
    except (RuntimeError, AttributeError):  # no forward graph to inspect
        return []
    found = []
    for op, (flag, other) in _TRAINING_FLAG.items():
        for node in graph.findAllNodes(op, True):
            inputs = list(node.inputs())
            if len(inputs) <= max(flag, other) or inputs[flag].node().kind() != "prim::Constant":
                continue
            if inputs[flag].toIValue() is not True:
                continue
            decides = inputs[other]
            # ... (not None, not 0): a value computed when the module runs
            value = decides.toIValue() if decides.node().kind() == "prim::Constant" else ...
            if value is None or (isinstance(value, (int, float)) and value == 0):
                continue  # no running statistics, or p = 0: eval mode would do the same
            found.append("BatchNorm" if op == "aten::batch_norm" else "dropout")
    return [f"{found.count(name)} {name}" for name in dict.fromkeys(found)]


# ---------------------------------------------------------------- the encoder


#: The first line of every error of TorchScript's interpreter; the reason is its last.
_TORCHSCRIPT = "The following operation failed in the TorchScript interpreter"


def _reason(exc: BaseException) -> str:
    """The line of a model's error that says what went wrong: a TorchScript error's last
    line (``RuntimeError: expected input[6, 3, 32, 16] to have 1 channels ...``, its
    type dropped) rather than its first, which is always the interpreter's preamble."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith(_TORCHSCRIPT):
        last = re.sub(r"^[A-Za-z_.]*(Error|Exception):\s*", "", lines[-1])
        return first_line(RuntimeError(last))
    return first_line(exc)


def build(kind: str, opts: dict[str, Any], threads: int) -> _Encoder:
    """Check ``opts`` (defaults filled in) and return the configured torch encoder."""
    from PIL import Image

    from .devices import ieee_float32
    from .encoders import _checkpoint, _Encoder, _image_batches, batch_axis_problem

    # opts were checked against rankwise.encoders.OPTIONS[kind] by build_encoder
    flip, half = bool(opts["flip"]), bool(opts["half"])
    file_option = "model" if kind == "torchscript" else "checkpoint"
    file = _checkpoint(kind, opts[file_option], file_option)
    if kind != "reid":
        interpolation = opts["interpolation"]
        resample = getattr(Image.Resampling, interpolation.upper())
    if kind == "torchscript":
        size = tuple(opts["input_size"])
        mean = [float(v) for v in opts["mean"]]
        std = [float(v) for v in opts["std"]]
        channel_order = opts["channel_order"]
    device = resolve_device(kind, opts["device"], half)
    torch = _import(kind, "torch")

    if kind == "reid":
        model, transform, record = _reid_model(opts, file)

        def preprocess(rows: _Rows, i: int) -> torch.Tensor:
            return transform(rows.read(i))  # reid's own crop transform, PIL RGB in

        def to_input(batch: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(batch).to(device, non_blocking=True)
    else:
        if kind == "timm":
            model, config = _timm_model(opts, file)
            size = (
                tuple(config["input_size"][1:])
                if opts["input_size"] is None
                else tuple(opts["input_size"])
            )
            mean = (
                list(config["mean"]) if opts["mean"] is None else [float(v) for v in opts["mean"]]
            )
            std = list(config["std"]) if opts["std"] is None else [float(v) for v in opts["std"]]
            channel_order = "rgb"
        else:
            model = _torchscript_model(file)
        record = {
            "input_size": [int(size[0]), int(size[1])],
            "resize": "stretch",
            "interpolation": interpolation,
            "mean": [float(m) for m in mean],
            "std": [float(s) for s in std],
            "channel_order": channel_order,
        }
        mean_t = torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1)
        std_t = torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1)

        def preprocess(rows: _Rows, i: int) -> np.ndarray:
            return np.asarray(rows.read(i, size, resample=resample))  # (H, W, 3) uint8

        def to_input(batch: list[np.ndarray]) -> torch.Tensor:
            # uint8 to the device (4x less to copy), then (x / 255 - mean) / std there,
            # the same float32 operations in the same order as the per-image formula
            x = torch.from_numpy(np.stack(batch)).to(device, non_blocking=True)
            x = x.permute(0, 3, 1, 2).contiguous().float().div_(255).sub_(mean_t).div_(std_t)
            return x.flip(1) if channel_order == "bgr" else x

    model.eval().to(device)
    if half:
        model.half()

    def forward(x: torch.Tensor) -> torch.Tensor:
        try:
            out = model(x)
        # e.g. a traced model fixed to another input size (timm's fixed-size models
        # assert it: AssertionError)
        except (RuntimeError, AssertionError) as exc:
            raise RankwiseError(
                f"{file}: the model failed on a {str(x.dtype).removeprefix('torch.')} batch "
                f"of shape {tuple(x.shape)} ({_reason(exc)}); check options.input_size and "
                "the model file"
            ) from None
        if not isinstance(out, torch.Tensor):
            raise RankwiseError(
                f"{file}: the model returned {type(out).__name__}, not a "
                "tensor; export a module that returns the embedding"
            )
        # (D,) or (D, B): reshaping it to (B, -1) would mix the images' values, or fail
        # only when the sizes do not divide; checked on every batch (the last one has
        # another size, which tells (D, B) from (B, D) when B == D elsewhere).  A 1-D
        # output (D,) cannot be told from one value per image when D == B: refused too
        problem = batch_axis_problem(tuple(out.shape), len(x))
        if problem is not None:
            why, wanted = problem
            fix = (
                f"save the module with outputs of shape {wanted}"
                if kind == "torchscript"
                else f"the {kind} model must return outputs of shape {wanted}"
            )
            raise RankwiseError(
                f"{file}: the model returned shape {tuple(out.shape)} for a batch of "
                f"{len(x)}: {why}; {fix}"
            )
        return out.float().reshape(len(x), -1)

    def embed(batch: list[Any]) -> np.ndarray:
        # in IEEE float32 (:func:`settings`); half: float16
        with torch.inference_mode():
            x = to_input(batch)
            x = x.half() if half else x
            out = forward(x)
            if flip:  # fast-reid's flip test: raw features averaged, normalised later
                out = (out + forward(x.flip(3))) / 2
        return out.cpu().numpy()

    def batches(rows: _Rows, batch_size: int, pool: ThreadPoolExecutor) -> Iterator[np.ndarray]:
        # on the CPU the forward pass uses every core: decode between batches, not beside
        ahead = device != "cpu"
        for batch in _image_batches(rows, lambda i: preprocess(rows, i), batch_size, pool, ahead):
            yield embed(batch)

    @contextlib.contextmanager
    def settings() -> Iterator[None]:
        # torch's process-wide settings for the whole encode, the caller's put back when
        # it ends (also on an error): IEEE float32 (torch lets cuDNN convolve in TF32 by
        # default: embeddings ~4e-4 away from the CPU's, relative, on a resnet50; ~5e-7
        # without), and on the CPU the forward pass on ``threads`` cores
        with contextlib.ExitStack() as stack:
            stack.enter_context(ieee_float32(torch))
            if device == "cpu":
                stack.enter_context(_num_threads(torch, threads))
            yield

    record.update({"flip": flip, "device": device, "half": half})
    return _Encoder(opts, file, batches, threads=threads, preprocessing=record, settings=settings)


@contextlib.contextmanager
def _num_threads(torch: Any, threads: int) -> Iterator[None]:
    """Within: ``torch.set_num_threads(threads)``; the count there was is put back on
    exit, as :func:`rankwise.devices.ieee_float32` puts back precision settings."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
