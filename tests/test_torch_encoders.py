"""Torch encoder kinds (reid, timm, torchscript) against direct forward passes.

Every model is built here with random weights (nothing is downloaded) and saved the way
a training loop saves it: wrapped in a dict with the epoch, a numpy scalar metric and
DataParallel ``module.`` prefixes. The reference preprocessing below is written from the
spec (PIL resize straight to [H, W], /255, (x - mean) / std, CHW), not imported.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import zarr
from click.testing import CliRunner
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))

from helpers import (
    ROOT,
    float32_settings,
    ieee_float32_settings,
    planned_jobs,
    run_rankwise,
    snakemake,
)

from rankwise.encoders import DEFAULTS as _ALL_DEFAULTS
from rankwise.encoders import encode_manifest
from rankwise.errors import RankwiseError
from rankwise.hashing import file_sha256
from rankwise.store import embeddings_attrs

DEFAULTS = {k: _ALL_DEFAULTS[k] for k in ("reid", "timm", "torchscript")}

N_ROWS = 5
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
TOL = 1e-5  # max abs difference allowed against a direct forward pass on the CPU


# ---------------------------------------------------------------- models and files


class TinyCNN(torch.nn.Module):
    """A small scriptable CNN: conv-BN-ReLU, conv, global average pool -> (B, 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 6, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        return self.conv2(x).mean(dim=(2, 3))


def _randomise_bn(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics, so a checkpoint that failed to load shows."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            n = module.running_mean.numel()
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            module.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)
    return model.eval()


def _save_like_training(state: dict, path: Path, epoch: int = 60) -> Path:
    """Save as a training loop does: wrapped, DataParallel prefixes, numpy scalars."""
    torch.save(
        {
            "epoch": epoch,
            "rank1": np.float64(0.875),
            "num_steps": np.int64(1200),
            "state_dict": {f"module.{k}": v for k, v in state.items()},
            "optimizer": {"state": {}, "param_groups": [{"lr": 3.5e-4}]},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def timm_model() -> tuple[torch.nn.Module, dict]:
    """resnet10t with a 7-identity classifier (as trained), and its full state dict."""
    torch.manual_seed(0)
    trained = _randomise_bn(timm.create_model("resnet10t", num_classes=7), 1)
    embedder = timm.create_model("resnet10t", num_classes=0).eval()
    state = trained.state_dict()
    embedder.load_state_dict({k: v for k, v in state.items() if not k.startswith("fc.")})
    return embedder, state


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    """N_ROWS RGB images of different sizes and aspect ratios, paths relative."""
    rng = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    rows = []
    for i in range(N_ROWS):
        h, w = 40 + 9 * i, 20 + 5 * i
        # a left-to-right gradient plus noise: the mirror really is another input
        base = np.linspace(0, 255, w)[None, :, None] * np.array([1.0, 0.5, 0.2])
        image = np.clip(base + rng.normal(0, 40, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(image).save(tmp_path / "images" / f"p{i}.png")
        rows.append({"id": f"q{i}", "label": str(i % 2), "path": f"images/p{i}.png"})
    table = tmp_path / "query.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    return table


def _paths(manifest: Path) -> list[Path]:
    return [manifest.parent / p for p in pd.read_csv(manifest, dtype=str)["path"]]


def _reference_inputs(
    manifest: Path, size, mean, std, resample=Image.Resampling.BILINEAR, bgr: bool = False
) -> torch.Tensor:
    """The spec's preprocessing, written independently of the package: (N, 3, H, W)."""
    batch = []
    for path in _paths(manifest):
        image = Image.open(path).convert("RGB").resize((size[1], size[0]), resample)
        x = (np.asarray(image, np.float32) / 255 - np.float32(mean)) / np.float32(std)
        if bgr:
            x = x[:, :, ::-1]
        batch.append(np.ascontiguousarray(x.transpose(2, 0, 1)))
    return torch.from_numpy(np.stack(batch))


def _forward(model, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        return model(x).reshape(len(x), -1).numpy()


def _read(store: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")["embeddings"][...])


def _embed(
    manifest: Path, checkpoint: Path, out: Path, size: tuple[int, int], **more
) -> np.ndarray:
    """The manifest encoded by the timm kind (resnet10t at ``size``) from ``checkpoint``,
    with ``more`` options."""
    options = {"model": "resnet10t", "checkpoint": str(checkpoint), "input_size": list(size)}
    options.update(more)
    encode_manifest(manifest, "timm", options, out, progress=False)
    return _read(out)


def _assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    assert np.abs(actual - expected).max() <= TOL


# ---------------------------------------------------------------- timm


def test_timm_equals_direct_forward(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    ckpt = _save_like_training(state, tmp_path / "epoch_060.pth")
    out = tmp_path / "emb" / "query.zarr"
    info = encode_manifest(
        manifest,
        "timm",
        {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [64, 32], "device": "cpu"},
        out,
        batch_size=2,
        workers=2,
        progress=False,
    )
    expected = _forward(embedder, _reference_inputs(manifest, (64, 32), *IMAGENET))
    _assert_close(_read(out), expected)
    assert info["shape"] == [N_ROWS, 512]  # resnet10t's pooled pre-logits features
    attrs = embeddings_attrs(out)
    assert attrs["checkpoint_hash"] == file_sha256(ckpt)
    assert attrs["preprocessing"] == {
        "input_size": [64, 32],
        "resize": "stretch",
        "interpolation": "bilinear",
        "mean": IMAGENET[0],
        "std": IMAGENET[1],
        "channel_order": "rgb",
        "flip": False,
        "device": "cpu",
        "half": False,
    }
    json.dumps(attrs)


def test_timm_vit_trained_at_re_id_size(manifest: Path, tmp_path: Path):
    """A ViT trained at a re-ID size (timm's img_size: 64 x 32 here, 256 x 128 in papers;
    its pos_embed has 9 tokens, not 197) is built for input_size, loads and equals the
    same model's forward; at the default 224 x 224 the checkpoint is refused naming
    pos_embed."""
    torch.manual_seed(4)
    trained = timm.create_model("vit_tiny_patch16_224", num_classes=5, img_size=(64, 32))
    state = trained.eval().state_dict()
    embedder = timm.create_model("vit_tiny_patch16_224", num_classes=0, img_size=(64, 32))
    embedder.load_state_dict({k: v for k, v in state.items() if not k.startswith("head.")})
    ckpt = _save_like_training(state, tmp_path / "vit.pth")
    options = {"model": "vit_tiny_patch16_224", "checkpoint": str(ckpt), "input_size": [64, 32]}
    out = tmp_path / "vit.zarr"
    encode_manifest(manifest, "timm", options, out, batch_size=4, progress=False)
    config = timm.data.resolve_model_data_config(embedder)
    norm = (list(config["mean"]), list(config["std"]))
    expected = _forward(embedder.eval(), _reference_inputs(manifest, (64, 32), *norm))
    _assert_close(_read(out), expected)
    with pytest.raises(RankwiseError, match=r"vit\.pth.*pos_embed"):
        encode_manifest(
            manifest, "timm", {**options, "input_size": None}, tmp_path / "v.zarr", progress=False
        )


def test_timm_flip_is_the_mean_of_both_passes(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    ckpt = _save_like_training(state, tmp_path / "w.pth")
    out = tmp_path / "flip.zarr"
    encode_manifest(
        manifest,
        "timm",
        {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [48, 24], "flip": True},
        out,
        batch_size=3,
        workers=2,
        progress=False,
    )
    x = _reference_inputs(manifest, (48, 24), *IMAGENET)
    plain, mirrored = _forward(embedder, x), _forward(embedder, x.flip(3))
    assert np.abs(plain - mirrored).max() > 1e-2  # the mirror really is another input
    _assert_close(_read(out), (plain + mirrored) / 2)  # raw features, not normalised first
    assert embeddings_attrs(out)["preprocessing"]["flip"] is True


def test_timm_defaults_come_from_the_data_config_without_centre_crop(
    timm_model, manifest: Path, tmp_path: Path
):
    embedder, state = timm_model
    torch.save(state, tmp_path / "bare.pth")  # a bare state dict, head included
    out = tmp_path / "d.zarr"
    encode_manifest(
        manifest,
        "timm",
        {
            "model": "resnet10t",
            "checkpoint": str(tmp_path / "bare.pth"),
            "interpolation": "bicubic",
        },
        out,
        batch_size=4,
        workers=2,
        progress=False,
    )
    record = embeddings_attrs(out)["preprocessing"]
    size = tuple(embedder.pretrained_cfg["input_size"][1:])  # (176, 176) for resnet10t
    assert record["input_size"] == list(size) and record["interpolation"] == "bicubic"
    assert (record["mean"], record["std"]) == IMAGENET
    expected = _forward(
        embedder, _reference_inputs(manifest, size, *IMAGENET, resample=Image.Resampling.BICUBIC)
    )
    _assert_close(_read(out), expected)


def test_checkpoint_without_classifier_head_loads(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    no_head = {k: v for k, v in state.items() if not k.startswith("fc.")}
    ckpt = _save_like_training(no_head, tmp_path / "no_head.pth")
    _assert_close(
        _embed(manifest, ckpt, tmp_path / "h.zarr", (32, 32)),
        _forward(embedder, _reference_inputs(manifest, (32, 32), *IMAGENET)),
    )


def test_a_neck_trained_inside_the_classifier_is_refused(manifest: Path, tmp_path: Path):
    """resnet10t whose ``fc`` is Linear -> BatchNorm -> Linear (an embedding neck trained
    under the classifier's name): every ``fc.*`` key was dropped as the classifier, so
    the embedding silently became the pooled backbone feature, not the neck's."""
    net = timm.create_model("resnet10t", num_classes=7)
    net.fc = torch.nn.Sequential(
        torch.nn.Linear(512, 256), torch.nn.BatchNorm1d(256), torch.nn.Linear(256, 7)
    )
    ckpt = _save_like_training(net.state_dict(), tmp_path / "neck.pth")
    with pytest.raises(
        RankwiseError,
        match=r"neck\.pth: the checkpoint's classifier 'fc' holds more than one layer "
        r"\(fc\.0\.weight, fc\.0\.bias, fc\.1\.weight, .*kind torchscript\)$",
    ):
        _embed(manifest, ckpt, tmp_path / "n.zarr", (32, 32))


def test_compiled_model_checkpoint_loads(timm_model, manifest: Path, tmp_path: Path):
    """The state dict of a torch.compile'd model (keys under ``_orig_mod.``), also inside
    DistributedDataParallel (``module._orig_mod.``), loads like the plain one."""
    embedder, state = timm_model
    compiled = torch.compile(timm.create_model("resnet10t", num_classes=7))
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())  # torch's naming
    want = _forward(embedder, _reference_inputs(manifest, (32, 32), *IMAGENET))
    for i, prefix in enumerate(("_orig_mod.", "module._orig_mod.")):
        ckpt = tmp_path / f"c{i}.pth"
        torch.save({f"{prefix}{k}": v for k, v in state.items()}, ckpt)
        _assert_close(_embed(manifest, ckpt, tmp_path / f"c{i}.zarr", (32, 32)), want)


def test_safetensors_checkpoint(timm_model, manifest: Path, tmp_path: Path):
    from safetensors.torch import save_file

    embedder, state = timm_model
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "w.safetensors")
    _assert_close(
        _embed(manifest, tmp_path / "w.safetensors", tmp_path / "s.zarr", (32, 16)),
        _forward(embedder, _reference_inputs(manifest, (32, 16), *IMAGENET)),
    )


# ---------------------------------------------------------------- strict loading


def _timm_error(manifest: Path, tmp_path: Path, state: dict, **save) -> str:
    ckpt = tmp_path / "bad.pth"
    torch.save(state, ckpt) if save.get("bare") else _save_like_training(state, ckpt)
    out = tmp_path / "bad.zarr"
    with pytest.raises(RankwiseError) as info:
        encode_manifest(
            manifest,
            "timm",
            {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [32, 16]},
            out,
            progress=False,
        )
    assert not out.exists() and not Path(f"{out}.tmp").exists()
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(ckpt))
    return message


def test_one_backbone_key_removed_is_named(timm_model, manifest: Path, tmp_path: Path):
    _, state = timm_model
    broken = {k: v for k, v in state.items() if k != "layer3.0.conv1.weight"}
    message = _timm_error(manifest, tmp_path, broken)
    assert "checkpoint does not match the timm model 'resnet10t'" in message
    assert "1 missing key(s): layer3.0.conv1.weight;" in message
    assert "unexpected" not in message


def test_unexpected_keys_are_listed_with_a_count(timm_model, manifest: Path, tmp_path: Path):
    _, state = timm_model
    renamed = {k.replace("layer4.", "stage4."): v for k, v in state.items()}
    n = sum(k.startswith("layer4.") for k in state)
    message = _timm_error(manifest, tmp_path, renamed)
    assert "missing key(s): layer4." in message and f"({n} in all)" in message
    assert f"{n} unexpected key(s): stage4." in message


def test_shape_mismatch_names_key_and_shapes(timm_model, manifest: Path, tmp_path: Path):
    _, state = timm_model
    broken = dict(state)
    broken["layer1.0.conv1.weight"] = broken["layer1.0.conv1.weight"][:-1]
    shape = tuple(state["layer1.0.conv1.weight"].shape)
    message = _timm_error(manifest, tmp_path, broken)
    cut = (shape[0] - 1,) + shape[1:]
    assert message.endswith(
        f"resnet10t': 1 shape mismatch(es) (checkpoint vs model): "
        f"layer1.0.conv1.weight {cut} vs {shape}; check that the options "
        "name the architecture (and variant) this checkpoint was trained "
        "with"
    )


def test_checkpoint_of_another_architecture(manifest: Path, tmp_path: Path):
    other = timm.create_model("resnet14t", num_classes=0).state_dict()
    message = _timm_error(manifest, tmp_path, other, bare=True)
    assert "unexpected key(s): layer1.0.conv3.weight" in message  # bottleneck blocks
    assert "shape mismatch(es) (checkpoint vs model): " in message


@pytest.mark.parametrize("saved", ["dict with args", "whole model", "model under a key"])
def test_pickled_python_object_is_refused_not_executed(
    saved, timm_model, manifest: Path, tmp_path: Path, monkeypatch
):
    """Refused, and the advised re-save works for both (it said m['state_dict'], which a
    whole model saved with torch.save(model) cannot take); timm's train.py checkpoint
    (its args a Namespace) keeps its EMA copy, for checkpoint_key."""
    model, state = timm_model
    ckpt = tmp_path / "args.pth"
    ema = {k: v * 2 if v.is_floating_point() else v for k, v in state.items()}
    if saved == "whole model":
        torch.save(model, ckpt)
        name = r"timm\.models\.\w+\.\w+"
    elif saved == "model under a key":  # as YOLO-style trainers save it, beside int keys
        torch.save({"model": model, "epoch": 3, 7: "seven"}, ckpt)
        name = r"timm\.models\.\w+\.\w+"
    else:
        torch.save(
            {"args": argparse.Namespace(lr=0.1), "state_dict": state, "state_dict_ema": ema}, ckpt
        )
        name = r"argparse\.Namespace"
    options = {"model": "resnet10t", "checkpoint": str(ckpt)}
    with pytest.raises(RankwiseError) as info:
        encode_manifest(manifest, "timm", options, tmp_path / "x.zarr", progress=False)
    message = str(info.value)
    assert re.match(
        rf"\S+args\.pth: the checkpoint holds a Python object \({name}\) that torch\.load\("
        r"weights_only=True\) refuses",
        message,
    ), message
    monkeypatch.chdir(tmp_path)
    exec(message.split("save its weights alone: ")[1], {"torch": torch, "f": str(ckpt)})
    options["checkpoint"] = str(tmp_path / "weights.pth")
    encode_manifest(manifest, "timm", options, tmp_path / "x.zarr", progress=False)
    assert (tmp_path / "x.zarr").is_dir()
    if saved == "dict with args":
        _assert_weights(_load_timm(tmp_path / "weights.pth", checkpoint_key="state_dict_ema"), ema)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a checkpoint", r"junk\.pth: not a readable torch checkpoint"),
        (b"hello", r"junk\.pth: not a readable torch checkpoint \(not a file written by torch"),
        # the unpickler's IndexError / struct.error were tracebacks (exit 1, no file named)
        (b"training notes: lr 0.1", r"junk\.pth: .*\(not a file written by torch\.save, or cut"),
        ("old format, cut at 1", r"junk\.pth: .*\(not a file written by torch\.save, or cut"),
        ("old format, cut at 18", r"junk\.pth: .*\(not a file written by torch\.save, or cut"),
        # other bytes were said to be "pickle protocol 4 or later", advising to unpickle them
        (b'{"lr": 0.1}\n', r"junk\.pth: .*\(not a file written by torch\.save; check options"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", r"junk\.pth: .*\(not a file written by torch\.save;"),
        (
            b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 94371\n",
            r"junk\.pth: .*\(it is a Git LFS pointer, not the weights: fetch them with git lfs",
        ),
        (b"", r"junk\.pth: the checkpoint is empty \(0 bytes\): is it still being written\?"),
        # torch.save's zip being written (a sweep's newest epoch): a miniz error or Errno 22
        ("zip format, cut at 4096", r"junk\.pth: not a readable torch checkpoint: it is cut "),
        ("zip format, cut at -30", r"junk\.pth: .*cut short .*: is it still being written\?"),
        # torch's text advised weights_only=False
        ("torchscript", r"^\S+junk\.pth: a TorchScript module \(.*\).*kind torchscript"),
        ("protocol4", r"junk\.pth: .*pickle protocol 4 or later.*re-save it"),
        ("safetensors", r"junk\.pth: .*\(it is a safetensors file; name it \.safetensors\)$"),
        ("npy", r"junk\.pth: .*\(it is a \.npy array, not a checkpoint"),
        (
            {"epoch": 3, "note": "x"},
            r"junk\.pth: no state dict found \(top level: \['epoch', "
            r"'note'\]\)",
        ),
    ],
)
def test_unreadable_checkpoints(content, message, manifest: Path, tmp_path: Path):
    """One line with the reason and the fix (never torch's advice to turn weights_only
    off), and no torch warning on stderr."""
    ckpt = tmp_path / "junk.pth"
    state = timm.create_model("resnet10t", num_classes=0).state_dict()
    if content == "protocol4":
        torch.save({"state_dict": state}, ckpt, pickle_protocol=4)
    elif content == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt))
    elif content == "npy":
        with open(ckpt, "wb") as f:
            np.save(f, np.zeros((2, 3), np.float32))
    elif content == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            torch.jit.script(TinyCNN().eval()).save(str(ckpt))
    elif isinstance(content, str) and content.startswith("zip format"):
        torch.save({"state_dict": state}, ckpt)
        ckpt.write_bytes(ckpt.read_bytes()[: int(content.rsplit(" ", 1)[1])])  # still saving
    elif isinstance(content, str) and content.startswith("old format"):
        torch.save({"state_dict": state}, ckpt, _use_new_zipfile_serialization=False)
        ckpt.write_bytes(ckpt.read_bytes()[: int(content.rsplit(" ", 1)[1])])  # killed mid-save
    elif isinstance(content, bytes):
        ckpt.write_bytes(content)
    else:
        torch.save(content, ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torch warning would reach the user's terminal
        with pytest.raises(RankwiseError, match=message) as caught:
            _encode_resnet10t(manifest, ckpt, tmp_path / "x.zarr")
    assert "weights_only` set to `False" not in str(caught.value)


def _encode_resnet10t(manifest: Path, checkpoint: Path, out: Path) -> None:
    options = {"model": "resnet10t", "checkpoint": str(checkpoint)}
    encode_manifest(manifest, "timm", options, out, progress=False)


def test_a_git_lfs_pointer_named_safetensors_is_said_to_be_one(manifest: Path, tmp_path: Path):
    """A clone without ``git lfs pull`` holds pointers where the weights should be:
    safetensors' own message ("header too large") did not say so."""
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 94371\n")
    with pytest.raises(RankwiseError, match=r"model\.safetensors: .*Git LFS pointer.*lfs pull"):
        _encode_resnet10t(manifest, ckpt, tmp_path / "x.zarr")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_a_safetensors_file_cut_short_says_so(timm_model, manifest: Path, tmp_path, keep):
    """A sweep's newest epoch still being written: safetensors said "incomplete metadata,
    file not fully covered; check options.checkpoint"."""
    from safetensors.torch import save_file

    _, state = timm_model
    ckpt = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, ckpt)
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(RankwiseError) as info:
        _encode_resnet10t(manifest, ckpt, tmp_path / "x.zarr")
    assert str(info.value) == (
        f"{ckpt}: not a readable safetensors file: it is cut short (its header names more "
        "bytes than the file holds): is it still being written? Run again once it is "
        "saved, or save it again"
    )


def test_old_pickle_protocol_loads_without_warnings(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    ckpt = tmp_path / "proto3.pth"
    torch.save({"state_dict": state}, ckpt, pickle_protocol=3)
    out = tmp_path / "p3.zarr"
    options = {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [32, 16]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode_manifest(manifest, "timm", options, out, progress=False)
    _assert_close(_read(out), _forward(embedder, _reference_inputs(manifest, (32, 16), *IMAGENET)))


# ---------------------------------------------------------------- reid


@pytest.fixture(scope="module")
def osnet_checkpoint(tmp_path_factory) -> Path:
    """osnet_x0_25 trained with an 11-identity classifier, saved by a training loop."""
    from reid.architectures import build_architecture

    torch.manual_seed(2)
    model = _randomise_bn(build_architecture("osnet_x0_25", num_classes=11), 3)
    assert any(k.startswith("classifier.") for k in model.state_dict())
    return _save_like_training(
        model.state_dict(), tmp_path_factory.mktemp("osnet") / "model.pth.tar-60"
    )


def _reid_package(checkpoint: Path, **kwargs):
    from reid import ReIDModel

    with warnings.catch_warnings():  # its loader warns, then unpickles the numpy scalars
        warnings.simplefilter("ignore")
        return ReIDModel.from_pretrained(
            str(checkpoint), architecture="osnet_x0_25", device="cpu", **kwargs
        )


def test_reid_equals_the_package_own_extraction(
    osnet_checkpoint: Path, manifest: Path, tmp_path: Path
):
    out = tmp_path / "reid.zarr"
    encode_manifest(
        manifest,
        "reid",
        {"architecture": "osnet_x0_25", "checkpoint": str(osnet_checkpoint)},
        out,
        batch_size=2,
        workers=2,
        progress=False,
    )
    package = _reid_package(osnet_checkpoint)
    expected = package.extract_embeddings_from_paths(
        [str(p) for p in _paths(manifest)], batch_size=N_ROWS
    )
    assert expected.shape == (N_ROWS, 512)
    _assert_close(_read(out), expected)
    assert embeddings_attrs(out)["preprocessing"] == {
        "input_size": [256, 128],
        "resize": "stretch",
        "interpolation": "bilinear",
        "mean": IMAGENET[0],
        "std": IMAGENET[1],
        "channel_order": "rgb",
        "flip": False,
        "device": "cuda" if torch.cuda.is_available() else "cpu",  # auto
        "half": False,
    }


def test_reid_input_size_and_flip(osnet_checkpoint: Path, manifest: Path, tmp_path: Path):
    from reid import ReIDPreprocessing

    out = tmp_path / "reid.zarr"
    encode_manifest(
        manifest,
        "reid",
        {
            "architecture": "osnet_x0_25",
            "flip": True,
            "checkpoint": str(osnet_checkpoint),
            "input_size": [128, 64],
        },
        out,
        batch_size=3,
        workers=2,
        progress=False,
    )
    package = _reid_package(osnet_checkpoint, preprocessing=ReIDPreprocessing(input_size=(128, 64)))
    transform = package.preprocessing.build_crop_transform()
    x = torch.stack([transform(Image.open(p).convert("RGB")) for p in _paths(manifest)])
    backbone = package._backbone  # the module ReIDModel embeds with
    _assert_close(_read(out), (_forward(backbone, x) + _forward(backbone, x.flip(3))) / 2)


def test_reid_interpolation_for_fastreid_numbers(
    osnet_checkpoint: Path, manifest: Path, tmp_path: Path
):
    """fast-reid's test transform resizes bicubic (``Resize(size, interpolation=3)``),
    the reid package (and torchreid) bilinear: the option picks it, the record says it,
    and the rows equal the package's extraction with that interpolation."""
    from reid import ReIDPreprocessing

    rows = {}
    for interpolation in ("bicubic", None):
        out = tmp_path / f"reid-{interpolation}.zarr"
        options = {"architecture": "osnet_x0_25", "checkpoint": str(osnet_checkpoint)}
        encode_manifest(
            manifest, "reid", {**options, "interpolation": interpolation}, out, progress=False
        )
        rows[interpolation] = _read(out)
        record = embeddings_attrs(out)["preprocessing"]
        assert record["interpolation"] == (interpolation or "bilinear")
    preprocessing = ReIDPreprocessing(input_size=(256, 128), interpolation="bicubic")
    package = _reid_package(osnet_checkpoint, preprocessing=preprocessing)
    expected = package.extract_embeddings_from_paths([str(p) for p in _paths(manifest)])
    _assert_close(rows["bicubic"], expected)
    assert np.abs(rows["bicubic"] - rows[None]).max() > 100 * TOL  # not the bilinear rows


def test_reid_checkpoint_of_another_width(manifest: Path, tmp_path: Path):
    from reid.architectures import build_architecture

    ckpt = _save_like_training(build_architecture("osnet_x0_5").state_dict(), tmp_path / "x0_5.pth")
    with pytest.raises(
        RankwiseError,
        match=r"x0_5\.pth: checkpoint does not match the reid "
        r"architecture 'osnet_x0_25': \d+ shape "
        r"mismatch\(es\) \(checkpoint vs model\): "
        r"conv1\.conv\.weight \(32, 3, 7, 7\) vs "
        r"\(16, 3, 7, 7\)",
    ):
        encode_manifest(
            manifest,
            "reid",
            {"architecture": "osnet_x0_25", "checkpoint": str(ckpt)},
            tmp_path / "x.zarr",
            progress=False,
        )


def test_fastreid_layout_loads_through_the_architecture_remap(tmp_path: Path):
    """A fast-reid SBS checkpoint (heads.* names, identity classifier) loads; extras fail."""
    from reid.architectures import build_architecture, checkpoint_remap_for_architecture

    from rankwise.torch_encoders import _REID_HEADS, load_checkpoint

    name = "fastreid_sbs_resnest50"
    source = build_architecture(name)
    fastreid = {}
    for key, value in source.state_dict().items():
        if key == "pool.p":
            key, value = "heads.pool_layer.p", value + 1.25  # trained GeM power
        elif key.startswith("bottleneck."):
            key = "heads.bottleneck.0." + key[len("bottleneck.") :]
        fastreid[key] = value
    fastreid["heads.weight"] = torch.randn(751, 2048)  # the identity classifier
    torch.save(
        {"model": {f"module.{k}": v for k, v in fastreid.items()}, "iteration": 9},
        tmp_path / "model_final.pth",
    )
    target = build_architecture(name)
    kwargs = {
        "kind": "reid",
        "what": f"reid architecture {name!r}",
        "heads": _REID_HEADS["fastreid"],
        "remap": checkpoint_remap_for_architecture(name),
    }
    load_checkpoint(target, tmp_path / "model_final.pth", **kwargs)
    assert float(target.pool.p.detach()) == float(source.pool.p.detach()) + 1.25
    for key, value in source.state_dict().items():
        if key != "pool.p":
            assert torch.equal(target.state_dict()[key], value), key
    fastreid["heads.extra.weight"] = torch.ones(2)
    del fastreid["backbone.conv1.0.weight"]
    torch.save(fastreid, tmp_path / "broken.pth")
    with pytest.raises(
        RankwiseError,
        match=r"1 missing key\(s\): backbone\.conv1\.0\.weight; "
        r"1 unexpected key\(s\): heads\.extra\.weight;",
    ):
        load_checkpoint(target, tmp_path / "broken.pth", **kwargs)


def test_an_older_fastreid_checkpoint_brings_its_normalisation(manifest: Path, tmp_path: Path):
    """fast-reid saved ``pixel_mean`` / ``pixel_std`` buffers (0-255 scale, (1, 3, 1, 1))
    in every checkpoint before its commit 883fd4a (2021-03-23): they were refused as
    unexpected keys ("check that the options name the architecture"); they now load, as
    the normalisation the model was trained with, and the record says it."""
    from reid.architectures import build_architecture

    name = "fastreid_sbs_resnest50"
    torch.manual_seed(5)
    source = build_architecture(name).eval()
    fastreid = {}
    for key, value in source.state_dict().items():
        if key == "pool.p":
            key = "heads.pool_layer.p"
        elif key.startswith("bottleneck."):
            key = "heads.bottleneck.0." + key[len("bottleneck.") :]
        fastreid[key] = value
    mean, std = [100.0, 110.0, 120.0], [50.0, 60.0, 70.0]  # not ImageNet's: visible
    fastreid["pixel_mean"] = torch.tensor(mean).view(1, 3, 1, 1)
    fastreid["pixel_std"] = torch.tensor(std).view(1, 3, 1, 1)
    checkpoint = tmp_path / "model_final.pth"
    torch.save({"model": {f"module.{k}": v for k, v in fastreid.items()}}, checkpoint)
    out = tmp_path / "old.zarr"
    options = {"architecture": name, "checkpoint": str(checkpoint), "input_size": [64, 32]}
    encode_manifest(manifest, "reid", options, out, progress=False)
    x = _reference_inputs(manifest, (64, 32), [m / 255 for m in mean], [s / 255 for s in std])
    _assert_close(_read(out), _forward(source, x))
    record = embeddings_attrs(out)["preprocessing"]
    assert record["mean"] == [m / 255 for m in mean] and record["std"] == [s / 255 for s in std]
    del fastreid["pixel_std"]
    torch.save(fastreid, tmp_path / "half.pth")
    with pytest.raises(RankwiseError, match=r"half\.pth: the checkpoint holds pixel_mean without "):
        encode_manifest(
            manifest, "reid", {**options, "checkpoint": str(tmp_path / "half.pth")},
            tmp_path / "half.zarr", progress=False,
        )  # fmt: skip


# ---------------------------------------------------------------- torchscript


@pytest.mark.parametrize("export", ["script", "trace"])
def test_torchscript_equals_direct_forward(export, manifest: Path, tmp_path: Path):
    torch.manual_seed(4)
    model = _randomise_bn(TinyCNN(), 5)
    with warnings.catch_warnings():  # torch.jit is flagged as deprecated in torch >= 2.9
        warnings.simplefilter("ignore", FutureWarning)
        scripted = (
            torch.jit.script(model)
            if export == "script"
            else torch.jit.trace(model, torch.zeros(1, 3, 24, 12))
        )
    scripted.save(str(tmp_path / "tiny.pt"))
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    out = tmp_path / "ts.zarr"
    encode_manifest(
        manifest,
        "torchscript",
        {
            "model": str(tmp_path / "tiny.pt"),
            "input_size": [24, 12],
            "mean": mean,
            "std": std,
            "channel_order": "bgr",
            "interpolation": "nearest",
            "flip": True,
        },
        out,
        batch_size=2,
        workers=2,
        progress=False,
    )
    x = _reference_inputs(manifest, (24, 12), mean, std, Image.Resampling.NEAREST, bgr=True)
    expected = (_forward(model, x) + _forward(model, x.flip(3))) / 2
    _assert_close(_read(out), expected)
    record = embeddings_attrs(out)["preprocessing"]
    assert record["channel_order"] == "bgr" and record["interpolation"] == "nearest"
    assert embeddings_attrs(out)["checkpoint_hash"] == file_sha256(tmp_path / "tiny.pt")


def test_model_failing_on_the_input_size(manifest: Path, tmp_path: Path):
    flat = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.trace(flat, torch.zeros(1, 3, 8, 8)).save(str(tmp_path / "flat.pt"))
    out = tmp_path / "f.zarr"
    with pytest.raises(
        RankwiseError,
        match=r"flat\.pt: the model failed on a float32 batch of shape "
        r"\(2, 3, 9, 9\) \(.*\); check options\.input_size",
    ):
        encode_manifest(
            manifest,
            "torchscript",
            {"model": str(tmp_path / "flat.pt"), "input_size": [9, 9]},
            out,
            batch_size=2,
            progress=False,
        )
    assert not out.exists()


def test_a_torchscript_error_names_its_reason_not_the_interpreter(manifest: Path, tmp_path):
    """TorchScript's errors start with the interpreter's preamble ("The following
    operation failed in the TorchScript interpreter."); the message gives the reason,
    its last line (a model for one-channel input fed RGB)."""
    gray = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(gray).save(str(tmp_path / "gray.pt"))
    with pytest.raises(RankwiseError) as info:
        encode_manifest(
            manifest,
            "torchscript",
            {"model": str(tmp_path / "gray.pt"), "input_size": [8, 8]},
            tmp_path / "g.zarr",
            batch_size=2,
            progress=False,
        )
    message = str(info.value)
    assert "to have 1 channels, but got 3 channels" in message, message
    assert "TorchScript interpreter" not in message and "\n" not in message


class _ChannelMeans(torch.nn.Module):
    """Per-channel means over the whole batch, (3,): no batch axis at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(0, 2, 3))


class _Transposed(torch.nn.Module):
    """Per-image channel means, transposed: (3, B), the batch on the second axis."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)).t()


def _rows(manifest: Path, n: int) -> Path:
    """A manifest of ``n`` rows cycling over ``manifest``'s images."""
    table = pd.read_csv(manifest, dtype=str)
    rows = table.iloc[[i % len(table) for i in range(n)]].reset_index(drop=True)
    rows["id"] = [f"r{i}" for i in range(n)]
    path = manifest.with_name(f"rows{n}.csv")
    rows.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    "module, n_rows, batch_size, message",
    [
        # every batch of 3: (3,) has the batch's size, but no axis after it; stored as
        # 6 rows x 1 dim of values mixed across images, exit 0
        (
            _ChannelMeans,
            6,
            3,
            r"shape \(3,\) for a batch of 3: a single axis, the "
            r"batch's or the embedding's, not both; save the module with outputs of shape "
            r"\(batch, dim\)",
        ),
        # a RuntimeError traceback from reshape (3 values into 4 rows)
        (
            _ChannelMeans,
            6,
            4,
            r"shape \(3,\) for a batch of 4: its first axis is not the "
            r"batch; save the module with outputs of shape \(batch, \.\.\.\)",
        ),
        # batches of 3 then 2: (3, 3) cannot be told from (B, D), the last batch's (3, 2)
        # can (the first batch's rows were stored transposed, silently)
        (
            _Transposed,
            5,
            3,
            r"shape \(3, 2\) for a batch of 2: its first axis is not the "
            r"batch; save the module with outputs of shape \(batch, \.\.\.\)",
        ),
    ],
)
def test_an_output_whose_first_axis_is_not_the_batch_is_refused(
    module, n_rows, batch_size, message, manifest: Path, tmp_path: Path
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(module().eval()).save(str(tmp_path / "m.pt"))
    options = {"model": str(tmp_path / "m.pt"), "input_size": [8, 8]}
    out = tmp_path / "e.zarr"
    with pytest.raises(RankwiseError) as info:
        encode_manifest(
            _rows(manifest, n_rows),
            "torchscript",
            options,
            out,
            batch_size=batch_size,
            progress=False,
        )
    assert re.fullmatch(
        re.escape(str(tmp_path / "m.pt")) + ": the model returned " + message, str(info.value)
    ), info.value
    assert not out.exists() and not Path(f"{out}.tmp").exists()


def test_cli_output_whose_first_axis_is_not_the_batch_exits_2(manifest: Path, tmp_path: Path):
    from rankwise.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(_ChannelMeans().eval()).save(str(tmp_path / "m.pt"))
    out = tmp_path / "x.zarr"
    options = {"model": str(tmp_path / "m.pt"), "input_size": [8, 8]}
    args = ["encode", "--manifest", str(manifest), "--kind", "torchscript"]
    args += [
        "--options",
        json.dumps(options),
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--no-progress",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: {tmp_path / 'm.pt'}: the model returned shape (3,) for a batch of 4: its "
        "first axis is not the batch; save the module with outputs of shape (batch, ...)"
    ]
    assert not out.exists() and not Path(f"{out}.tmp").exists()


class _DropoutHead(torch.nn.Module):
    """TinyCNN's features through dropout: random in training mode, the identity in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.drop = TinyCNN(), torch.nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.body(x))


@pytest.mark.parametrize("train", [True, False])
def test_a_module_traced_in_training_mode_is_refused(train, manifest: Path, tmp_path: Path):
    """torch.jit.trace fixes the training flag as a constant: a module traced in training
    mode kept normalising by each batch's statistics and dropping at random after eval(),
    so its embeddings changed with the batch size and from run to run (no error). Traced
    in eval mode it loads, also beside a BatchNorm that never tracks running statistics."""
    torch.manual_seed(6)
    model = _DropoutHead()
    model.body.bn = torch.nn.BatchNorm2d(8, track_running_stats=False)  # batch stats by design
    model.body.conv1 = torch.nn.Sequential(model.body.conv1, torch.nn.BatchNorm2d(8))
    model.train(train)
    with warnings.catch_warnings():  # deprecation; in training mode, the outputs differ
        warnings.simplefilter("ignore")
        torch.jit.trace(model, torch.zeros(2, 3, 24, 12)).save(str(tmp_path / "t.pt"))
    options = {"model": str(tmp_path / "t.pt"), "input_size": [24, 12]}
    if not train:
        encode_manifest(manifest, "torchscript", options, tmp_path / "e.zarr", progress=False)
        expected = _forward(model, _reference_inputs(manifest, (24, 12), *IMAGENET))
        _assert_close(_read(tmp_path / "e.zarr"), expected)  # one batch: the same statistics
        return
    with pytest.raises(RankwiseError) as info:
        encode_manifest(manifest, "torchscript", options, tmp_path / "e.zarr", progress=False)
    assert re.fullmatch(
        r"\S+t\.pt: the module was traced in training mode \(1 BatchNorm and 1 dropout "
        r"layer\(s\) fixed in it\): .*; trace it again after model\.eval\(\)",
        str(info.value),
    ), info.value
    assert not (tmp_path / "e.zarr").exists()


def test_a_torchscript_file_cut_short_says_so(manifest: Path, tmp_path: Path):
    """A module file still being written (a sweep's newest file): torch's miniz error
    said the file was likely corrupt, and the message to save a TorchScript module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.script(TinyCNN().eval()).save(str(tmp_path / "m.pt"))
    (tmp_path / "m.pt").write_bytes((tmp_path / "m.pt").read_bytes()[:-100])
    options = {"model": str(tmp_path / "m.pt"), "input_size": [8, 8]}
    with pytest.raises(RankwiseError) as info:
        encode_manifest(manifest, "torchscript", options, tmp_path / "e.zarr", progress=False)
    assert str(info.value) == (
        f"{tmp_path / 'm.pt'}: not a readable TorchScript module: it is cut short (a zip "
        "archive without its end): is it still being written? Run again once it is saved, "
        "or save it again"
    )


# ---------------------------------------------------------------- bad input


def _files(tmp_path: Path) -> dict[str, str]:
    """A real timm checkpoint and a state dict that is not a TorchScript module."""
    ckpt = tmp_path / "ok.pth"
    torch.save(timm.create_model("resnet10t", num_classes=0).state_dict(), ckpt)
    return {"ckpt": str(ckpt), "sd": str(ckpt)}


BAD = [
    (
        "timm",
        {"model": "resnet10t", "checkpoint": "gone/epoch_9.pth"},
        r"^gone/epoch_9\.pth: timm checkpoint file not found; check options\.checkpoint",
    ),
    (
        "timm",
        {"model": "resnet10x", "checkpoint": "{ckpt}"},
        r"^timm: unknown model 'resnet10x' in options\.model; close names: .*resnet10t",
    ),
    (
        "reid",
        {"architecture": "osnet_x025", "checkpoint": "{ckpt}"},
        r"^reid: unknown architecture 'osnet_x025' in options\.architecture; close names: "
        r"osnet_x0_25",
    ),
    (
        "timm",
        {"model": "resnet10t", "checkpoint": "{ckpt}", "device": "cpu", "half": True},
        r"^timm: option half: true needs a CUDA device, but device 'cpu' runs on the CPU",
    ),
    (
        "torchscript",
        {"model": "{sd}", "input_size": [8, 8]},
        r"ok\.pth: not a TorchScript module \(it is a torch\.save checkpoint: weights without "
        r"the code\); save one with torch\.jit\.script",
    ),
    ("torchscript", {"model": "{sd}"}, r"^torchscript: missing option\(s\) input_size"),
    (
        "timm",
        {"model": "resnet10t", "checkpoint": "{ckpt}", "flip": "yes"},
        r"^timm: option flip must be true or false, got 'yes'",
    ),
    (
        "timm",
        {"model": "resnet10t", "checkpoint": "{ckpt}", "interpolation": "lanczos"},
        r"^timm: option interpolation must be one of bilinear, bicubic, nearest",
    ),
    (
        "timm",
        {"model": "resnet10t", "checkpoint": "{ckpt}", "device": "tpu"},
        r"^timm: option device must be one of auto, cpu, cuda, got 'tpu'",
    ),
    (
        "torchscript",
        {"model": "{sd}", "input_size": [8, 8], "std": [1, 0, 1]},
        r"^torchscript: option std must be a list of 3 numbers \(each > 0\)",
    ),
    (
        "reid",
        {"architecture": "osnet_x0_25", "checkpoint": "{ckpt}", "pretrained": True},
        r"^reid: unknown option\(s\) pretrained",
    ),
]


@pytest.mark.parametrize("kind, options, message", BAD)
def test_bad_input_is_one_line_and_writes_nothing(
    kind, options, message, manifest: Path, tmp_path: Path
):
    files = _files(tmp_path)
    options = {k: v.format(**files) if isinstance(v, str) else v for k, v in options.items()}
    out = tmp_path / "e.zarr"
    with pytest.raises(RankwiseError, match=message) as info:
        encode_manifest(manifest, kind, options, out, progress=False)
    assert "\n" not in str(info.value)
    assert not out.exists() and not Path(f"{out}.tmp").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(manifest: Path, tmp_path: Path):
    with pytest.raises(
        RankwiseError,
        match=r"timm: option device is cuda but torch sees no "
        r"CUDA device",
    ):
        encode_manifest(
            manifest,
            "timm",
            {"model": "resnet10t", "device": "cuda", "checkpoint": _files(tmp_path)["ckpt"]},
            tmp_path / "e.zarr",
            progress=False,
        )


def test_encoding_is_ieee_float32_and_leaves_the_caller_settings(
    tf32_on, timm_model, manifest: Path, tmp_path: Path
):
    embedder, state = timm_model
    seen = []

    def spy(module, inputs, output):  # inside the encoder's forward pass
        seen.append(float32_settings(torch))

    ckpt = _save_like_training(state, tmp_path / "epoch_060.pth")
    hook = torch.nn.modules.module.register_module_forward_hook(spy)  # every module
    try:
        got = _embed(manifest, ckpt, tmp_path / "e.zarr", (64, 32))
    finally:
        hook.remove()
    assert seen and all(s == ieee_float32_settings(torch) for s in seen)
    assert float32_settings(torch) == tf32_on
    assert torch.backends.cudnn.allow_tf32 is True  # legacy getters still answer
    expected = _forward(embedder, _reference_inputs(manifest, (64, 32), *IMAGENET))
    _assert_close(got, expected)


@pytest.fixture
def caller_threads():
    """A library caller's own torch thread count, distinctive (5), put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(5)
    yield 5
    torch.set_num_threads(before)


def test_encoding_leaves_the_caller_thread_count(
    caller_threads, timm_model, manifest: Path, tmp_path: Path
):
    """The encoder ran on ``workers`` threads and left them set in the caller's process
    (torch.set_num_threads is process-wide), after a finished encode and a failed one."""
    embedder, state = timm_model
    seen = []

    def spy(module, inputs, output):  # inside the encoder's forward pass
        seen.append(torch.get_num_threads())

    ckpt = _save_like_training(state, tmp_path / "epoch_060.pth")
    options = {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [32, 16]}
    hook = torch.nn.modules.module.register_module_forward_hook(spy)
    try:
        encode_manifest(manifest, "timm", options, tmp_path / "e.zarr", workers=1, progress=False)
    finally:
        hook.remove()
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == caller_threads
    expected = _forward(embedder, _reference_inputs(manifest, (32, 16), *IMAGENET))
    _assert_close(_read(tmp_path / "e.zarr"), expected)

    table = pd.read_csv(manifest, dtype=str)
    table.loc[3, "path"] = "images/gone.png"  # the second batch fails
    table.to_csv(tmp_path / "missing.csv", index=False)
    with pytest.raises(RankwiseError, match=r"image 'images/gone\.png' not found"):
        encode_manifest(
            tmp_path / "missing.csv",
            "timm",
            options,
            tmp_path / "f.zarr",
            batch_size=2,
            workers=1,
            progress=False,
        )
    assert torch.get_num_threads() == caller_threads
    assert not (tmp_path / "f.zarr").exists()


# ---------------------------------------------------------------- on a GPU (skipped without)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@needs_cuda
@pytest.mark.parametrize("flip", [False, True])
def test_timm_on_cuda_equals_the_cpu_forward(
    tf32_on, timm_model, manifest: Path, tmp_path: Path, flip
):
    """device: cuda is a float32 encoding: the CPU forward's numbers up to summation order
    (TF32 convolutions, torch's default, were ~1e-3 away), even when the caller turned
    TF32 on, and the same bits on a second run."""
    embedder, state = timm_model
    ckpt = _save_like_training(state, tmp_path / "epoch_060.pth")
    got = _embed(manifest, ckpt, tmp_path / "a.zarr", (64, 32), device="cuda", flip=flip)
    again = _embed(manifest, ckpt, tmp_path / "b.zarr", (64, 32), device="cuda", flip=flip)
    assert float32_settings(torch) == tf32_on
    x = _reference_inputs(manifest, (64, 32), *IMAGENET)
    expected = _forward(embedder, x)
    if flip:
        expected = (expected + _forward(embedder, x.flip(3))) / 2
    _assert_close(got, expected)
    np.testing.assert_array_equal(got, again)
    assert embeddings_attrs(tmp_path / "a.zarr")["preprocessing"]["device"] == "cuda"


@needs_cuda
def test_half_on_cuda_is_float16_and_close(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    ckpt = _save_like_training(state, tmp_path / "epoch_060.pth")
    got = _embed(manifest, ckpt, tmp_path / "h.zarr", (64, 32), device="cuda", half=True)
    expected = _forward(embedder, _reference_inputs(manifest, (64, 32), *IMAGENET))
    assert got.dtype == np.float32 and got.shape == expected.shape
    relative = np.abs(got - expected).max() / np.abs(expected).max()
    assert 1e-5 < relative < 2e-2  # really float16 (not float32), and still the model
    assert embeddings_attrs(tmp_path / "h.zarr")["preprocessing"]["half"] is True


@needs_cuda
def test_reid_on_cuda_equals_the_package_on_the_cpu(
    osnet_checkpoint: Path, manifest: Path, tmp_path: Path
):
    out = tmp_path / "reid.zarr"
    options = {"architecture": "osnet_x0_25", "checkpoint": str(osnet_checkpoint)}
    encode_manifest(
        manifest, "reid", {**options, "device": "cuda"}, out, batch_size=2, progress=False
    )
    expected = _reid_package(osnet_checkpoint).extract_embeddings_from_paths(
        [str(p) for p in _paths(manifest)], batch_size=N_ROWS
    )
    _assert_close(_read(out), expected)


@pytest.mark.parametrize(
    "kind, module", [("timm", "timm"), ("reid", "reid"), ("torchscript", "torch")]
)
def test_missing_extra(kind, module, manifest: Path, tmp_path: Path, monkeypatch):
    files = _files(tmp_path)
    options = {
        "timm": {"model": "resnet10t", "checkpoint": files["ckpt"], "device": "cpu"},
        "reid": {"architecture": "osnet_x0_25", "checkpoint": files["ckpt"], "device": "cpu"},
        "torchscript": {"model": files["sd"], "input_size": [8, 8]},
    }[kind]
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(
        RankwiseError,
        match=rf"^{kind}: the {module} package is not installed; "
        r"install the extra: pip install "
        r"'rankwise\[torch\]'$",
    ):
        encode_manifest(manifest, kind, options, tmp_path / "e.zarr", progress=False)


def test_importing_rankwise_does_not_import_torch():
    code = (
        "import sys, rankwise, rankwise.encoders, rankwise.torch_encoders, rankwise.cli; "
        "print(sorted(m for m in ('torch', 'timm', 'reid') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------- command line


def test_cli_encode_timm(timm_model, manifest: Path, tmp_path: Path):
    embedder, state = timm_model
    ckpt = _save_like_training(state, tmp_path / "epoch_010.pth", epoch=10)
    out = tmp_path / "cli.zarr"
    options = {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [32, 16]}
    proc = run_rankwise(
        "encode",
        "--manifest",
        manifest,
        "--kind",
        "timm",
        "--options",
        json.dumps(options),
        "--out",
        out,
        "--batch-size",
        "2",
        "--threads",
        "2",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"encoded {N_ROWS} rows x 512 dims with timm -> {out}"
    _assert_close(_read(out), _forward(embedder, _reference_inputs(manifest, (32, 16), *IMAGENET)))


def test_cli_bad_input_exits_2_with_one_line(manifest: Path, tmp_path: Path):
    from rankwise.cli import main

    out = tmp_path / "x.zarr"
    options = {
        "model": "resnet10t",
        "checkpoint": _files(tmp_path)["ckpt"],
        "device": "cpu",
        "half": True,
    }
    result = CliRunner().invoke(
        main,
        [
            "encode",
            "--manifest",
            str(manifest),
            "--kind",
            "timm",
            "--options",
            json.dumps(options),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: timm: option half: true needs a CUDA device, but device 'cpu' runs on the CPU "
        "here; set half: false"
    ]
    assert not out.exists()


def test_the_workflow_tracks_the_checkpoint_files_of_torch_kinds():
    from rankwise.pipeline_config import CHECKPOINT_OPTION, encoder_paths

    assert encoder_paths("reid", {"architecture": "osnet_x1_0", "checkpoint": "a.pth"}) == ["a.pth"]
    assert encoder_paths("timm", {"model": "resnet50", "checkpoint": "b.pth"}) == ["b.pth"]
    assert encoder_paths("torchscript", {"model": "c.pt", "input_size": [8, 8]}) == ["c.pt"]
    assert {CHECKPOINT_OPTION[k] for k in ("reid", "timm")} == {"checkpoint"}
    assert CHECKPOINT_OPTION["torchscript"] == "model"


# ---------------------------------------------------------------- the workflow


def test_snakemake_runs_torch_encoders(timm_model, osnet_checkpoint: Path, tmp_path: Path):
    """A real Snakemake run: schema, encode rule and CLI accept the kinds end to end."""

    _, state = timm_model
    (tmp_path / "runs" / "timm").mkdir(parents=True)
    _save_like_training(state, tmp_path / "runs" / "timm" / "epoch_005.pth", epoch=5)
    config = {
        "datasets": {
            "market": {
                "loader": "demo-market",
                "protocol": "reid",
                "ks": [1, 5],
                "options": {
                    "seed": 1,
                    "identities": 6,
                    "cameras": 2,
                    "images_per_camera": 2,
                    "queries_per_identity": 1,
                    "distractors": 3,
                    "junk": 2,
                    "height": 32,
                    "width": 16,
                },
            }
        },
        "encoders": {
            "resnet": {
                "kind": "timm",
                "options": {
                    "model": "resnet10t",
                    "checkpoint": "runs/timm/epoch_005.pth",
                    "input_size": [32, 16],
                    "flip": True,
                    "device": "cpu",
                },
            },
            "osnet": {
                "kind": "reid",
                "options": {
                    "architecture": "osnet_x0_25",
                    "checkpoint": str(osnet_checkpoint),
                    "input_size": [64, 32],
                    "device": "cpu",
                },
            },
        },
        "engine": {"threads": 1, "batch_size": 8},
    }
    proc = snakemake(tmp_path, config, "-p", configfile="config.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the encode jobs' --options, as a config written before checkpoint_key existed gave
    printed = proc.stdout + proc.stderr
    assert printed.count("rankwise encode ") == 4 and "checkpoint_key" not in printed
    report = (tmp_path / "results" / "report.json").read_text()
    assert '"resnet"' in report and '"osnet"' in report
    provenance = {r["encoder"]: r["provenance"] for r in json.loads(report)["results"]}
    assert provenance["resnet"]["preprocessing"]["input_size"] == [32, 16]
    assert provenance["resnet"]["preprocessing"]["flip"] is True
    assert provenance["osnet"]["preprocessing"]["input_size"] == [64, 32]
    for encoder, dim in (("resnet", 512), ("osnet", 512)):
        store = tmp_path / "results" / "embeddings" / "market" / encoder / "query.zarr"
        attrs = embeddings_attrs(store)
        assert _read(store).shape[1] == dim
        assert attrs["preprocessing"]["device"] == "cpu"
    assert (
        embeddings_attrs(tmp_path / "results" / "embeddings" / "market" / "resnet" / "query.zarr")[
            "preprocessing"
        ]["flip"]
        is True
    )

    # checkpoint_key: null is the option left out (nothing reruns: the encode params are
    # those of a config written before the option existed); set, it reruns that encoder
    def dry_run(key: str | None) -> dict[str, int]:
        config["encoders"]["resnet"]["options"]["checkpoint_key"] = key
        dry = snakemake(tmp_path, config, "--dry-run", configfile="config.yaml")
        return planned_jobs(dry.stdout + dry.stderr)

    assert dry_run(None) == {}
    assert dry_run("state_dict")["encode"] == 2  # the resnet's query and gallery


# ---------------------------------------------------------------- config schema


def test_schema_accepts_the_kinds_and_rejects_misspelt_options():
    import yaml
    from jsonschema import Draft202012Validator, ValidationError

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    validator = Draft202012Validator(schema)
    encoders = {
        "osnet": {
            "kind": "reid",
            "options": {
                "architecture": "osnet_x1_0",
                "checkpoint": "log/model.pth.tar-60",
                "flip": True,
            },
        },
        "vit": {
            "kind": "timm",
            "options": {
                "model": "resnet50",
                "checkpoint": "w.pth",
                "input_size": [256, 128],
                "half": True,
                "device": "cuda",
            },
        },
        "ts": {
            "kind": "torchscript",
            "options": {"model": "m.pt", "input_size": [256, 128], "channel_order": "bgr"},
        },
    }
    validator.validate({"encoders": encoders})
    for kind, options in DEFAULTS.items():
        assert set(options) <= set(schema["$defs"][f"encoder_{kind}"]["properties"])
    with pytest.raises(ValidationError):
        validator.validate(
            {
                "encoders": {
                    "x": {
                        "kind": "timm",
                        "options": {"model": "resnet50", "checkpoint": "w.pth", "pretrained": True},
                    }
                }
            }
        )
    with pytest.raises(ValidationError):
        validator.validate(
            {"encoders": {"x": {"kind": "torchscript", "options": {"model": "m.pt"}}}}
        )


# ---------------------------------------------------------------- multimodal (python kind)
# Factories referenced as f"{__file__}:<name>" (issue #10 item 5: texts= beside images).


def sketch_and_text():
    """Encoder taking texts=: (mean pixel, length of the text or -1 when absent)."""

    def encode(images, texts=None):
        lengths = [-1.0] * len(images) if texts is None else [float(len(t)) for t in texts]
        return np.array([[float(im.mean()), n] for im, n in zip(images, lengths, strict=True)])

    return encode


def images_only():
    return lambda images: np.array([[float(im.mean())] for im in images])


def test_python_factory_receives_the_text_column(manifest: Path, tmp_path: Path):
    table = pd.read_csv(manifest, dtype=str)
    texts = ["a man in red", "", "blue bag", "x" * 17, "a woman with, a comma"]
    table["text"] = texts
    with_text = tmp_path / "query_text.csv"
    table.to_csv(with_text, index=False)
    out = tmp_path / "t.zarr"
    encode_manifest(
        with_text,
        "python",
        {"factory": f"{__file__}:sketch_and_text"},
        out,
        batch_size=2,
        workers=2,
        progress=False,
    )
    means = [float(np.asarray(Image.open(p).convert("RGB")).mean()) for p in _paths(manifest)]
    np.testing.assert_allclose(
        _read(out), np.array([[m, len(t)] for m, t in zip(means, texts, strict=True)]), rtol=1e-6
    )
    # no text column: texts=None; a factory without texts= ignores the column
    encode_manifest(
        manifest, "python", {"factory": f"{__file__}:sketch_and_text"}, out, progress=False
    )
    np.testing.assert_array_equal(_read(out)[:, 1], -1.0)
    encode_manifest(
        with_text, "python", {"factory": f"{__file__}:images_only"}, out, progress=False
    )
    np.testing.assert_allclose(_read(out)[:, 0], means, rtol=1e-6)


def test_lightning_checkpoint_loads_the_model_attribute(timm_model, manifest: Path, tmp_path):
    """A LightningModule's checkpoint: the network's weights under its attribute
    (``self.model`` -> ``model.``), beside a loss's parameters and an EMA copy, all
    under ``state_dict`` with the trainer's state: the ``model.`` weights load."""
    embedder, state = timm_model
    want = _forward(embedder, _reference_inputs(manifest, (32, 32), *IMAGENET))
    weights = {f"model.{k}": v for k, v in state.items()}
    weights["criterion.weight"] = torch.zeros(7, 512)  # an ArcFace-style loss parameter
    weights.update({f"model_ema.module.{k}": torch.zeros_like(v) for k, v in state.items()})
    ckpt = tmp_path / "epoch=3-step=120.ckpt"
    torch.save(
        {"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
         "state_dict": weights, "optimizer_states": [], "lr_schedulers": []},
        ckpt,
    )  # fmt: skip
    _assert_close(_embed(manifest, ckpt, tmp_path / "l.zarr", (32, 32)), want)
    # a student and a teacher: which one is meant cannot be told
    weights.update({f"teacher.{k}": v for k, v in state.items()})
    torch.save({"state_dict": weights}, ckpt)
    with pytest.raises(RankwiseError, match=r"under 'model\.' and 'teacher\.'; which one"):
        _embed(manifest, ckpt, tmp_path / "t.zarr", (32, 32))
    # under one attribute, but not the model's weights: the strict error, not a guess
    torch.save({"state_dict": {f"model.{k}": v for k, v in list(state.items())[:5]}}, ckpt)
    with pytest.raises(RankwiseError, match=r"checkpoint does not match the timm model"):
        _embed(manifest, ckpt, tmp_path / "u.zarr", (32, 32))


class _LitModule(torch.nn.Module):
    """What a LightningModule's state dict holds: the network under ``self.model`` (as
    given: compiled, inside DataParallel), a loss's parameters and timm's EMA copy
    (``ModelEmaV3``: the copy under ``model_ema.module.``)."""

    def __init__(self, model: torch.nn.Module, ema: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self.criterion = torch.nn.Linear(512, 7, bias=False)  # an ArcFace-style weight
        if ema is not None:
            self.model_ema = ema


def _trained(state: dict) -> torch.nn.Module:
    net = timm.create_model("resnet10t", num_classes=7)
    net.load_state_dict(state)
    return net.eval()


def _ema_of(net: torch.nn.Module, scale: float = 0.5) -> torch.nn.Module:
    """timm's EMA wrapper around a copy of ``net`` whose weights are not ``net``'s."""
    from timm.utils import ModelEmaV3

    ema = ModelEmaV3(net)
    with torch.no_grad():
        for value in ema.module.state_dict().values():
            if value.is_floating_point():
                value.mul_(scale)
    return ema


def _load_timm(ckpt: Path, **options) -> dict:
    """``ckpt`` loaded by the timm kind's loader into a fresh resnet10t: its state dict."""
    from rankwise.torch_encoders import load_checkpoint

    model = timm.create_model("resnet10t", num_classes=0)
    load_checkpoint(model, ckpt, kind="timm", what="timm model", heads=("fc.",), **options)
    return model.state_dict()


def _assert_weights(loaded: dict, state: dict) -> None:
    assert all(torch.equal(value, state[key]) for key, value in loaded.items())


@pytest.mark.parametrize(
    "build, prefix",
    [
        (lambda net, ema: _LitModule(torch.compile(net), ema), "model._orig_mod."),
        (  # DistributedDataParallel's module. around the compiled network
            lambda net, ema: _LitModule(torch.nn.DataParallel(torch.compile(net)), ema),
            "model.module._orig_mod.",
        ),
        (lambda net, ema: torch.compile(_LitModule(net, ema)), "_orig_mod.model."),
    ],
    ids=["compiled", "ddp-compiled", "module-compiled"],
)
def test_lightning_checkpoint_of_a_compiled_model_loads(
    build, prefix, timm_model, manifest: Path, tmp_path: Path
):
    """A LightningModule holding a torch.compile'd network saves its weights under
    ``model._orig_mod.`` (DDP inside: ``model.module._orig_mod.``; the module compiled:
    ``_orig_mod.model.``): they load as the plain network's, its EMA copy left out.
    (Building the compiled wrappers compiles nothing: no compiler is needed.)"""
    embedder, state = timm_model
    net = _trained(state)
    lit = build(net, _ema_of(net))
    weights = lit.state_dict()
    assert f"{prefix}conv1.0.weight" in weights  # torch's own naming
    ckpt = tmp_path / "epoch=3-step=120.ckpt"
    torch.save({"epoch": 3, "global_step": 120, "state_dict": weights}, ckpt)
    _assert_weights(_load_timm(ckpt), state)
    want = _forward(embedder, _reference_inputs(manifest, (32, 32), *IMAGENET))
    _assert_close(_embed(manifest, ckpt, tmp_path / "l.zarr", (32, 32)), want)


def test_lightning_checkpoint_of_a_compiled_model_loads_strictly(timm_model, tmp_path: Path):
    """Stripping the wrappers under the attribute loosens nothing: a key missing is the
    one-line strict error, and two compiled copies (a student and a teacher) are
    refused."""
    _, state = timm_model
    weights = _LitModule(torch.compile(_trained(state))).state_dict()
    ckpt = tmp_path / "l.ckpt"
    torch.save(
        {"state_dict": {k: v for k, v in weights.items() if "layer3.0.conv1." not in k}}, ckpt
    )
    with pytest.raises(RankwiseError) as info:
        _load_timm(ckpt)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{ckpt}: checkpoint does not match")
    assert "1 missing key(s): layer3.0.conv1.weight;" in message
    teacher = torch.compile(_trained(state)).state_dict()
    weights.update({f"teacher.{k}": v for k, v in teacher.items()})
    torch.save({"state_dict": weights}, ckpt)
    with pytest.raises(RankwiseError, match=r"under 'model\.' and 'teacher\.'; which one"):
        _load_timm(ckpt)


# ---------------------------------------------------------------- checkpoint_key: EMA weights


def _timm_train_checkpoint(state: dict, ema_state: dict, path: Path) -> Path:
    """As timm's train.py saves (its CheckpointSaver, ``args`` left out: weights_only
    refuses a Namespace): the weights and the EMA copy's side by side."""
    torch.save(
        {"epoch": 12, "arch": "resnet10t", "state_dict": state, "state_dict_ema": ema_state,
         "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}, "version": 2,
         "metric": np.float64(71.5)},
        path,
    )  # fmt: skip
    return path


def test_checkpoint_key_selects_timms_ema_weights(timm_model, manifest: Path, tmp_path: Path):
    """timm's train.py checkpoint: ``state_dict`` by default, the EMA copy with
    ``checkpoint_key: state_dict_ema``: the EMA model's own forward.  The store records
    the option when set, and reads as before there was the option when not."""
    embedder, state = timm_model
    ema = _ema_of(_trained(state))
    ckpt = _timm_train_checkpoint(state, ema.module.state_dict(), tmp_path / "last.pth.tar")
    ema.module.reset_classifier(0)  # its pooled pre-logits features
    x = _reference_inputs(manifest, (32, 32), *IMAGENET)
    want, want_ema = _forward(embedder, x), _forward(ema.module.eval(), x)
    assert np.abs(want - want_ema).max() > 1e-2  # the two copies really differ
    _assert_close(_embed(manifest, ckpt, tmp_path / "d.zarr", (32, 32)), want)
    assert "checkpoint_key" not in embeddings_attrs(tmp_path / "d.zarr")["encoder"]["options"]
    out = tmp_path / "ema.zarr"
    _assert_close(_embed(manifest, ckpt, out, (32, 32), checkpoint_key="state_dict_ema"), want_ema)
    assert embeddings_attrs(out)["encoder"]["options"]["checkpoint_key"] == "state_dict_ema"


def test_checkpoint_key_selects_a_lightning_ema_copy_by_prefix(timm_model, tmp_path: Path):
    """A LightningModule's flat state dict (``model.``, ``criterion.``, timm's EMA copy
    under ``model_ema.module.``): the model by default, the EMA copy by its prefix, with
    or without the wrapper's ``module`` (stripped from the remainder either way), also
    beside a compiled model; a student and a teacher: refused by default, each
    selectable."""
    _, state = timm_model
    net = _trained(state)
    ema = _ema_of(net)
    ema_state = {k: v.clone() for k, v in ema.module.state_dict().items()}
    ckpt = tmp_path / "epoch=3-step=120.ckpt"
    for model in (net, torch.compile(net)):
        torch.save({"epoch": 3, "state_dict": _LitModule(model, ema).state_dict()}, ckpt)
        _assert_weights(_load_timm(ckpt), state)
        _assert_weights(_load_timm(ckpt, checkpoint_key="model"), state)
        for key in ("model_ema.module", "model_ema"):
            _assert_weights(_load_timm(ckpt, checkpoint_key=key), ema_state)
    weights = _LitModule(net).state_dict()
    weights.update({f"teacher.{k}": v for k, v in ema_state.items()})
    torch.save({"state_dict": weights}, ckpt)
    with pytest.raises(
        RankwiseError, match=r"set options\.checkpoint_key to one of model, teacher$"
    ):
        _load_timm(ckpt)
    _assert_weights(_load_timm(ckpt, checkpoint_key="teacher"), ema_state)


class _TorchvisionEMA(torch.optim.swa_utils.AveragedModel):
    """torchvision's reference ``ExponentialMovingAverage`` (references/classification/
    utils.py): an AveragedModel with its own averaging function, its buffers averaged."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        def ema_avg(averaged, current, num_averaged):
            return decay * averaged + (1 - decay) * current

        super().__init__(model, "cpu", ema_avg, use_buffers=True)


@pytest.mark.parametrize(
    "build",
    [
        lambda net: torch.optim.swa_utils.AveragedModel(
            net, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999), use_buffers=True
        ),
        lambda net: _TorchvisionEMA(net, decay=0.999),
    ],
    ids=["averaged-model", "torchvision-ema"],
)
def test_torchs_averaged_model_ema_loads(build, timm_model, manifest: Path, tmp_path: Path):
    """torch's own EMA, ``torch.optim.swa_utils.AveragedModel``, as torchvision's
    reference ``train.py`` saves it (``checkpoint["model_ema"] =
    model_ema.state_dict()``; its ``args`` left out: weights_only refuses a Namespace):
    ``n_averaged`` beside the copy's weights under ``module.``.  ``checkpoint_key:
    model_ema``, or ``model_ema.module`` (the entry, then the prefix), embeds with the EMA
    copy: timm's pre-logits feature of ``ema.module``; the counter is ignored there, in a
    bare AveragedModel state dict and under a LightningModule's attribute, and nowhere
    else (beside unprefixed weights it is an unexpected key)."""
    embedder, state = timm_model
    net = _trained(state)
    ema = build(net)
    with torch.no_grad():  # two training steps: the copy averages weights net no longer has
        for scale in (0.5, 0.8):
            for value in net.state_dict().values():
                if value.is_floating_point():
                    value.mul_(scale)
            ema.update_parameters(net)
    assert int(ema.n_averaged) == 2 and "n_averaged" in ema.state_dict()
    ckpt = tmp_path / "checkpoint.pth"
    torch.save(
        {"model": state, "model_ema": ema.state_dict(), "epoch": 9,
         "optimizer": {"state": {}, "param_groups": [{"lr": 0.1}]}},
        ckpt,
    )  # fmt: skip
    x = _reference_inputs(manifest, (32, 32), *IMAGENET)
    with torch.inference_mode():
        module = ema.module.eval()
        want_ema = module.forward_head(module.forward_features(x), pre_logits=True).numpy()
    assert np.abs(want_ema - _forward(embedder, x)).max() > 1e-2  # the copies really differ
    _assert_close(_embed(manifest, ckpt, tmp_path / "d.zarr", (32, 32)), _forward(embedder, x))
    for key in ("model_ema", "model_ema.module"):
        out = tmp_path / f"{key}.zarr"
        _assert_close(_embed(manifest, ckpt, out, (32, 32), checkpoint_key=key), want_ema)
    ema_state = ema.module.state_dict()
    torch.save(ema.state_dict(), ckpt)  # the AveragedModel's state dict alone
    _assert_weights(_load_timm(ckpt), ema_state)
    torch.save({"state_dict": _LitModule(net, ema).state_dict()}, ckpt)  # its attribute
    _assert_weights(_load_timm(ckpt, checkpoint_key="model_ema"), ema_state)
    # an entry whose keys repeat its name: the whole key is still their prefix, as before
    torch.save({"model": {f"model.ema.{k}": v for k, v in ema_state.items()}}, ckpt)
    _assert_weights(_load_timm(ckpt, checkpoint_key="model.ema"), ema_state)
    torch.save({**state, "n_averaged": ema.n_averaged}, ckpt)
    with pytest.raises(RankwiseError, match=r"1 unexpected key\(s\): n_averaged;"):
        _load_timm(ckpt)


_NOT_THERE = (
    r"names no entry of the checkpoint and no prefix of its weights' keys \({}\): set it "
    r"to one of these \(a prefix's components separated by dots: model_ema\.module\) or to "
    r"null for the weights found automatically"
)


@pytest.mark.parametrize(
    "layout, key, message",
    [
        (
            "timm",
            "state_dict_emma",
            r"options\.checkpoint_key 'state_dict_emma' "
            + _NOT_THERE.format(
                r"entries: state_dict, state_dict_ema, optimizer; key prefixes: conv1, bn1, "
                r"layer1, layer2, layer3, layer4, \.\.\. \(7 in all\)"
            )
            + r"; did you mean 'state_dict_ema'\?$",
        ),
        (
            "lightning",
            "model_emma.module",
            r"options\.checkpoint_key 'model_emma\.module' "
            + _NOT_THERE.format(r"entries: state_dict; key prefixes: model, criterion, model_ema")
            + r"; did you mean 'model_ema\.module'\?$",
        ),
        (
            "timm",
            "epoch",
            r"the checkpoint's entry 'epoch' \(options\.checkpoint_key\) holds int 12, not a "
            r"state dict; name the entry that holds the weights: state_dict, state_dict_ema, "
            r"optimizer$",
        ),
        (  # not a file name either (it was stat'ed as one: "File name too long")
            "timm",
            "k" * 300,
            r"options\.checkpoint_key 'k{300}' names no entry of the checkpoint",
        ),
        (  # a prefix that is there but holds other weights: the strict error
            "lightning",
            "criterion",
            r"checkpoint does not match the timm model 'resnet10t': \d+ missing key\(s\): "
            r"conv1\.0\.weight, .*; 1 unexpected key\(s\): weight;",
        ),
    ],
)
def test_checkpoint_key_errors_are_one_line(
    layout, key, message, timm_model, manifest: Path, tmp_path: Path
):
    _, state = timm_model
    net = _trained(state)
    ema = _ema_of(net)
    ckpt = tmp_path / "w.ckpt"
    if layout == "timm":
        _timm_train_checkpoint(state, ema.module.state_dict(), ckpt)
    else:
        torch.save({"state_dict": _LitModule(net, ema).state_dict()}, ckpt)
    out = tmp_path / "e.zarr"
    with pytest.raises(RankwiseError) as info:
        _embed(manifest, ckpt, out, (32, 32), checkpoint_key=key)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{ckpt}: ")
    assert re.search(message, text), text
    assert not out.exists() and not Path(f"{out}.tmp").exists()


def test_cli_encode_with_checkpoint_key(timm_model, manifest: Path, tmp_path: Path):
    """``rankwise encode --options '{..., "checkpoint_key": "state_dict_ema"}'`` embeds
    with the EMA weights; a misspelt key exits 2 with one line and writes nothing."""
    _, state = timm_model
    ema = _ema_of(_trained(state))
    ckpt = _timm_train_checkpoint(state, ema.module.state_dict(), tmp_path / "last.pth.tar")
    ema.module.reset_classifier(0)
    options = {"model": "resnet10t", "checkpoint": str(ckpt), "input_size": [32, 16]}

    def encode(key: str, out: Path) -> subprocess.CompletedProcess:
        return run_rankwise(
            "encode", "--manifest", manifest, "--kind", "timm",
            "--options", json.dumps({**options, "checkpoint_key": key}), "--out", out,
            "--threads", "2", "--no-progress",
        )  # fmt: skip

    out = tmp_path / "ema.zarr"
    proc = encode("state_dict_ema", out)
    assert proc.returncode == 0, proc.stderr
    x = _reference_inputs(manifest, (32, 16), *IMAGENET)
    _assert_close(_read(out), _forward(ema.module.eval(), x))
    proc = encode("state_dict_emma", tmp_path / "typo.zarr")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        f"error: {ckpt}: options.checkpoint_key 'state_dict_emma' names no entry"
    ), proc.stderr
    assert proc.stderr.endswith("; did you mean 'state_dict_ema'?\n")
    assert not (tmp_path / "typo.zarr").exists()


def test_reid_checkpoint_key(osnet_checkpoint: Path, manifest: Path, tmp_path: Path):
    """The reid kind takes the option too: the EMA entry embeds as the same weights
    saved alone, not as the file's ``state_dict``."""
    from reid.architectures import build_architecture

    from rankwise.torch_encoders import read_checkpoint

    torch.manual_seed(5)
    other = build_architecture("osnet_x0_25", num_classes=11).state_dict()
    ema = tmp_path / "ema.pth.tar"
    _timm_train_checkpoint(other, read_checkpoint(osnet_checkpoint, "reid"), ema)
    options = {"architecture": "osnet_x0_25", "input_size": [64, 32]}
    embedded = {}
    for name, checkpoint, key in (
        ("alone", osnet_checkpoint, None),
        ("ema", ema, "state_dict_ema"),
        ("plain", ema, None),
    ):
        out = tmp_path / f"{name}.zarr"
        opts = {**options, "checkpoint": str(checkpoint), "checkpoint_key": key}
        encode_manifest(manifest, "reid", opts, out, progress=False)
        embedded[name] = _read(out)
    _assert_close(embedded["ema"], embedded["alone"])
    assert np.abs(embedded["plain"] - embedded["alone"]).max() > 1e-3
