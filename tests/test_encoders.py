"""Encoders end to end: real images, real Zarr stores, a real ONNX model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from click.testing import CliRunner
from helpers import png_file, png_scanlines, run_rankwise
from PIL import Image

import rankwise
from rankwise import encoders
from rankwise.encoders import ENCODER_KINDS, encode_manifest, hog_features
from rankwise.errors import RankwiseError
from rankwise.hashing import file_sha256
from rankwise.store import embeddings_attrs

N_ROWS = 7


# ---------------------------------------------------------------- python factories
# Referenced by the tests as f"{__file__}:<name>".


def mean_colour(scale: float = 1.0):
    """Factory: images -> (B, 3) mean RGB times ``scale``."""

    def encode(images):
        assert all(im.dtype == np.uint8 and im.ndim == 3 and im.shape[2] == 3 for im in images)
        return np.stack([im.reshape(-1, 3).mean(axis=0) * scale for im in images])

    return encode


def with_checkpoint(checkpoint: str):
    """Factory reading its 'weights' (one float) from the checkpoint file."""
    weight = float(Path(checkpoint).read_text())

    def encode(images):
        return np.stack([[weight, float(im.mean()) + 1.0] for im in images])

    return encode


def saved_over_after_load(checkpoint: str):
    """Factory: reads its weight, then a training run saves the next epoch over the file."""
    weight = float(Path(checkpoint).read_text())
    Path(checkpoint).write_text(str(weight + 1.0))

    def encode(images):
        return np.stack([[weight, float(im.mean())] for im in images])

    return encode


def saved_over_while_encoding(checkpoint: str):
    """Factory: the file is saved over during the second batch."""
    weight = float(Path(checkpoint).read_text())
    calls = []

    def encode(images):
        calls.append(1)
        if len(calls) == 2:
            Path(checkpoint).write_text(str(weight + 1.0))
        return np.stack([[weight, float(im.mean())] for im in images])

    return encode


def fails_on_second_batch():
    calls = []

    def encode(images):
        calls.append(len(images))
        if len(calls) == 2:
            raise RuntimeError("model crashed")
        return np.ones((len(images), 2))

    return encode


def gives_nan():
    def encode(images):
        out = np.ones((len(images), 2))
        out[-1, 0] = np.nan
        return out

    return encode


def gives_bfloat16():
    import torch

    return lambda images: torch.arange(len(images) * 3, dtype=torch.bfloat16).reshape(-1, 3)


def gives_ragged_rows():
    return lambda images: [np.zeros(3)] + [np.zeros(4)] * (len(images) - 1)


def gives_no_values():
    return lambda images: np.zeros((len(images), 0))


def gives_text():
    return lambda images: np.full((len(images), 2), "a")


def gives_huge_float64():
    return lambda images: np.full((len(images), 2), 1e39)


FACTORIES = __file__


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    """A manifest of N_ROWS RGB images of various sizes; paths relative to its folder."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N_ROWS):
        h, w = 12 + 2 * i, 8 + i
        image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        path = tmp_path / "data" / f"img{i}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(image).save(path)
        rows.append({"id": f"x{i}", "label": str(i % 3), "path": f"../data/img{i}.png"})
    table = tmp_path / "manifests" / "query.csv"
    table.parent.mkdir()
    pd.DataFrame(rows).to_csv(table, index=False)
    return table


def _images(manifest: Path) -> list[Image.Image]:
    table = pd.read_csv(manifest, dtype=str)
    return [Image.open(manifest.parent / p).convert("RGB") for p in table["path"]]


def _read(store: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")["embeddings"][...])


# ---------------------------------------------------------------- built-in encoders


def test_pixels(manifest: Path, tmp_path: Path):
    out = tmp_path / "emb" / "pixels.zarr"
    info = encode_manifest(
        manifest, "pixels", {"size": [4, 3]}, out, batch_size=3, workers=2, progress=False
    )
    emb = _read(out)
    expected = np.stack(
        [
            np.asarray(im.resize((3, 4), Image.Resampling.BILINEAR), dtype=np.float32).ravel() / 255
            for im in _images(manifest)
        ]
    )
    assert emb.dtype == np.float32 and info["shape"] == [N_ROWS, 36]
    np.testing.assert_allclose(emb, expected, rtol=1e-6)


@pytest.mark.parametrize(
    "options, dim",
    [({}, 24), ({"joint": True, "bins": 4}, 64), ({"space": "rgb", "stripes": 3}, 72)],
)
def test_color_histogram(options, dim, manifest: Path, tmp_path: Path):
    out = tmp_path / "hist.zarr"
    encode_manifest(manifest, "color-histogram", options, out, batch_size=4, progress=False)
    emb = _read(out)
    assert emb.shape == (N_ROWS, dim)
    np.testing.assert_allclose(emb.sum(axis=1), 1.0, rtol=1e-5)
    assert (emb >= 0).all()


def test_color_histogram_rgb_values(tmp_path: Path):
    Image.fromarray(np.array([[[255, 0, 0], [0, 0, 255]]], np.uint8)).save(tmp_path / "a.png")
    pd.DataFrame({"id": ["a"], "label": ["1"], "path": ["a.png"]}).to_csv(
        tmp_path / "m.csv", index=False
    )
    encode_manifest(
        tmp_path / "m.csv",
        "color-histogram",
        {"space": "rgb", "bins": 2},
        tmp_path / "h.zarr",
        progress=False,
    )
    # channel R: one pixel low, one high; G: both low; B: one low, one high
    np.testing.assert_allclose(_read(tmp_path / "h.zarr")[0], np.array([1, 1, 2, 0, 1, 1]) / 6)


def test_hog(manifest: Path, tmp_path: Path):
    encode_manifest(
        manifest,
        "hog",
        {"size": [16, 8], "cell": 4, "bins": 6},
        tmp_path / "h.zarr",
        progress=False,
    )
    # 4 x 2 cells -> 3 x 1 blocks of 2 x 2 cells x 6 bins
    assert _read(tmp_path / "h.zarr").shape == (N_ROWS, 3 * 1 * 4 * 6)


def test_hog_orientation():
    image = np.zeros((16, 16), np.float32)
    image[:, 8:] = 1.0  # a vertical edge: horizontal gradient, orientation 0 degrees
    feature = hog_features(image, cell=8, bins=9).reshape(-1, 9)
    assert feature.sum(axis=0).argmax() == 0
    image = image.T  # a horizontal edge: 90 degrees
    assert hog_features(image, cell=8, bins=9).reshape(-1, 9).sum(axis=0).argmax() == 4


# ---------------------------------------------------------------- python


def test_python_factory_from_file(manifest: Path, tmp_path: Path):
    out = tmp_path / "py.zarr"
    options = {"factory": f"{FACTORIES}:mean_colour", "params": {"scale": 2.0}}
    encode_manifest(manifest, "python", options, out, batch_size=3, progress=False)
    expected = np.stack(
        [np.asarray(im, np.float64).reshape(-1, 3).mean(0) * 2 for im in _images(manifest)]
    )
    np.testing.assert_allclose(_read(out), expected, rtol=1e-5)
    attrs = embeddings_attrs(out)
    assert attrs["encoder"] == {
        "kind": "python",
        "options": {
            "factory": options["factory"],
            "params": {"scale": 2.0},
            "checkpoint": None,
            "input_size": None,
        },
    }
    assert attrs["checkpoint_hash"] is None
    # what a model's forward pass may round by: recorded to reproduce the bytes
    assert attrs["forward"] == {"batch_size": 3, "threads": encoders.default_workers()}


def test_python_factory_module(manifest: Path, tmp_path: Path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "my_encoder_mod.py").write_text(
        "import numpy as np\n"
        "def build(dim=3):\n"
        "    return lambda images: np.stack([np.full(dim, im.shape[0]) for im in images])\n"
    )
    monkeypatch.syspath_prepend(str(package))
    encode_manifest(
        manifest,
        "python",
        {"factory": "my_encoder_mod:build", "params": {"dim": 5}, "input_size": [9, 4]},
        tmp_path / "m.zarr",
        progress=False,
    )
    np.testing.assert_array_equal(_read(tmp_path / "m.zarr"), np.full((N_ROWS, 5), 9.0))


@pytest.mark.parametrize(
    "factory, message",
    [
        ("no_such_module_xyz:f", r"module 'no_such_module_xyz' of options.factory not found"),
        (f"{FACTORIES}:nothing_here", r"has no attribute 'nothing_here'"),
        ("missing/file.py:f", r"missing/file\.py: factory file not found"),
        ("no-colon", r"factory must be 'module:function'"),
    ],
)
def test_python_factory_errors(factory, message, manifest: Path, tmp_path: Path):
    with pytest.raises(RankwiseError, match=message):
        encode_manifest(
            manifest, "python", {"factory": factory}, tmp_path / "e.zarr", progress=False
        )
    assert not (tmp_path / "e.zarr").exists()


@pytest.mark.parametrize(
    "factory, message",
    [
        ("gives_ragged_rows", r"returned rows of unequal length for a batch of \d+ images"),
        ("gives_no_values", r"returned an array of shape \(\d+, 0\) .* with dim >= 1"),
        ("gives_text", r"returned values of type <U1 for a batch"),
        (
            "gives_huge_float64",
            r"returned values beyond float32's range \(largest magnitude 1e\+39",
        ),
    ],
)
def test_factory_outputs_that_are_no_embeddings_are_one_line(factory, message, manifest, tmp_path):
    """Ragged rows and text were tracebacks; (B, 0) was written as a complete store that
    ranking refused later; 1e39 (finite in float64) became inf with numpy's warning."""
    with pytest.raises(RankwiseError, match=rf"^factory '.*:{factory}' {message}"):
        encode_manifest(
            manifest,
            "python",
            {"factory": f"{FACTORIES}:{factory}"},
            tmp_path / "e.zarr",
            progress=False,
        )
    assert not (tmp_path / "e.zarr").exists()


def gives_binary_codes():
    return lambda images: np.arange(len(images) * 4).reshape(-1, 4) % 3 == 0


def test_binary_codes_are_read_as_zeros_and_ones(manifest: Path, tmp_path: Path):
    encode_manifest(manifest, "python", {"factory": f"{FACTORIES}:gives_binary_codes"},
                    tmp_path / "e.zarr", batch_size=N_ROWS, progress=False)  # fmt: skip
    expected = (np.arange(N_ROWS * 4).reshape(-1, 4) % 3 == 0).astype(np.float32)
    np.testing.assert_array_equal(_read(tmp_path / "e.zarr"), expected)


@pytest.mark.parametrize("source", ["npy", "zarr", "array"])
def test_precomputed_binary_codes_are_read_as_a_factorys_are(source, manifest, tmp_path):
    """A factory's boolean output (binary codes) is read as 0 / 1; the same codes saved
    by the user were refused ("have dtype bool; expected numbers (float32)")."""
    from rankwise.embeddings import open_embeddings

    codes = np.arange(N_ROWS * 4).reshape(-1, 4) % 3 == 0
    encode_manifest(manifest, "python", {"factory": f"{FACTORIES}:gives_binary_codes"},
                    tmp_path / "e.zarr", batch_size=N_ROWS, progress=False)  # fmt: skip
    if source == "array":
        read = open_embeddings(codes, name="query embeddings", n_rows=N_ROWS).read(0, N_ROWS)
        np.testing.assert_array_equal(read, _read(tmp_path / "e.zarr"))
        return
    path = tmp_path / f"codes.{source}"
    if source == "npy":
        np.save(path, codes)
    else:
        zarr.open_group(str(path), mode="w").create_array("embeddings", data=codes)
    out = tmp_path / "p.zarr"
    encode_manifest(manifest, "precomputed", {"path": str(path)}, out, progress=False)
    np.testing.assert_array_equal(_read(out), _read(tmp_path / "e.zarr"))
    assert _read(out).dtype == np.float32


def test_a_bfloat16_tensor_is_read_as_its_values(manifest: Path, tmp_path: Path):
    """numpy has no bfloat16: `.numpy()` raised a TypeError (models run under bf16
    autocast return such tensors); the values are exact in float32."""
    pytest.importorskip("torch")
    encode_manifest(
        manifest,
        "python",
        {"factory": f"{FACTORIES}:gives_bfloat16"},
        tmp_path / "e.zarr",
        batch_size=N_ROWS,
        progress=False,
    )
    np.testing.assert_array_equal(
        _read(tmp_path / "e.zarr"), np.arange(N_ROWS * 3, dtype=np.float32).reshape(-1, 3)
    )


def test_checkpoint_hash_follows_content_not_mtime(manifest: Path, tmp_path: Path):
    ckpt = tmp_path / "weights.txt"
    ckpt.write_text("1.5")
    options = {"factory": f"{FACTORIES}:with_checkpoint", "checkpoint": str(ckpt)}

    def encode() -> dict:
        out = tmp_path / "ck.zarr"
        encode_manifest(manifest, "python", options, out, progress=False)
        return embeddings_attrs(out)

    first = encode()
    assert first["checkpoint_hash"] == hashlib.sha256(b"1.5").hexdigest()
    assert _read(tmp_path / "ck.zarr")[0, 0] == 1.5  # the factory got the checkpoint path
    stat = ckpt.stat()
    os.utime(ckpt, ns=(stat.st_atime_ns + 10**9, stat.st_mtime_ns + 10**9))  # touch
    assert encode()["checkpoint_hash"] == first["checkpoint_hash"]
    ckpt.write_text("2.5")
    second = encode()
    assert second["checkpoint_hash"] == hashlib.sha256(b"2.5").hexdigest()
    assert second["manifest_hash"] == first["manifest_hash"]


def test_query_and_gallery_of_a_rewritten_checkpoint_are_not_ranked(manifest: Path, tmp_path: Path):
    """A checkpoint saved over (a training run's last.pth) between the query and the
    gallery encode jobs gave stores of one encoder from two checkpoints, ranked against
    each other without a word; now that is one line naming both stores."""
    from rankwise.inputs import open_inputs

    ckpt = tmp_path / "last.pth"
    options = {"factory": f"{FACTORIES}:with_checkpoint", "checkpoint": str(ckpt)}
    stores = {}
    for split, weight in (("query", "1.5"), ("gallery", "1.5")):
        ckpt.write_text(weight)
        stores[split] = tmp_path / f"{split}.zarr"
        encode_manifest(manifest, "python", options, stores[split], progress=False)
    args = (manifest, manifest, stores["query"], stores["gallery"])
    open_inputs(*args, protocol="recall")  # the same bytes: fine
    encode_manifest(manifest, "python", options, stores["gallery"], progress=False)
    ckpt.write_text("2.5")
    encode_manifest(manifest, "python", options, stores["query"], progress=False)
    with pytest.raises(
        RankwiseError,
        match=r"query\.zarr and .*gallery\.zarr: encoded from "
        r"different contents of .*last\.pth \(sha256 [0-9a-f]{12} vs",
    ):
        open_inputs(*args, protocol="recall")
    proc = run_rankwise(
        "evaluate",
        "--query",
        manifest,
        "--gallery",
        manifest,
        "--query-embeddings",
        stores["query"],
        "--gallery-embeddings",
        stores["gallery"],
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_checkpoint_saved_over_while_loaded_leaves_no_store(manifest: Path, tmp_path: Path):
    """The store recorded the hash of the bytes found after loading: a checkpoint saved
    over between the load and the hash gave a store whose checkpoint_hash named weights it
    was not encoded with."""
    ckpt = tmp_path / "last.pth"
    ckpt.write_text("1.5")
    out = tmp_path / "e.zarr"
    options = {"factory": f"{FACTORIES}:saved_over_after_load", "checkpoint": str(ckpt)}
    with pytest.raises(RankwiseError, match=r"last\.pth: the file changed while rankwise encode"):
        encode_manifest(manifest, "python", options, out, batch_size=3, progress=False)
    assert not out.exists() and not Path(f"{out}.tmp").exists()
    # saved over after the load and the hash: the weights used are the hashed ones
    ckpt.write_text("1.5")
    options["factory"] = f"{FACTORIES}:saved_over_while_encoding"
    encode_manifest(manifest, "python", options, out, batch_size=3, progress=False)
    assert embeddings_attrs(out)["checkpoint_hash"] == hashlib.sha256(b"1.5").hexdigest()
    assert (_read(out)[:, 0] == 1.5).all() and ckpt.read_text() == "2.5"
    shutil.rmtree(out)
    # the same through the command (the factory in a file of its own: this module imports
    # the tests' helpers): one line, exit 2
    ckpt.write_text("1.5")
    factories = tmp_path / "factories.py"
    factories.write_text(
        "from pathlib import Path\nimport numpy as np\n\n"
        "def saved_over(checkpoint):\n"
        "    Path(checkpoint).write_text('2.5')\n"
        "    return lambda images: np.ones((len(images), 2))\n"
    )
    options = {"factory": f"{factories}:saved_over", "checkpoint": str(ckpt)}
    proc = run_rankwise(
        "encode", "--manifest", manifest, "--kind", "python", "--options", json.dumps(options),
        "--out", out, "--batch-size", "3", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "the file changed while rankwise encode read it" in proc.stderr
    assert not out.exists()


def test_precomputed_file_saved_over_while_read_leaves_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Precomputed features are opened before their hash is taken."""
    ids = [f"i{k}" for k in range(6)]
    pd.DataFrame({"id": ids, "label": range(6)}).to_csv(tmp_path / "query.csv", index=False)
    features = tmp_path / "q.npy"
    np.save(features, np.arange(12, dtype=np.float32).reshape(6, 2))
    manifest, out = tmp_path / "query.csv", tmp_path / "q.zarr"
    encode_manifest(manifest, "precomputed", {"path": str(features)}, out, progress=False)
    assert embeddings_attrs(out)["checkpoint_hash"] == file_sha256(features)
    real_open = encoders._open_vectors

    def saved_over_after_open(source, manifest):
        vectors = real_open(source, manifest)
        np.save(tmp_path / "new.npy", np.zeros((6, 2), np.float32))
        os.replace(tmp_path / "new.npy", features)  # another job writes its new features
        return vectors

    monkeypatch.setattr(encoders, "_open_vectors", saved_over_after_open)
    # the reader's own check (rankwise.embeddings: the file is no longer the one opened)
    # sees it first; the encoder's look at the end would (the next case)
    changed = r"q\.npy: the (file|precomputed embeddings) changed (while|during the run)"
    with pytest.raises(RankwiseError, match=changed):
        encode_manifest(manifest, "precomputed", {"path": str(features)}, out, progress=False)
    assert embeddings_attrs(out)["checkpoint_hash"] != file_sha256(features)  # the old store
    # saved over in place (same size) after its hash was taken, while it is read batch
    # by batch: the look at the end of the reading sees it (the store would hold the new
    # rows under the old bytes' hash)
    np.save(features, np.arange(12, dtype=np.float32).reshape(6, 2))

    def saved_over_while_read(source, manifest):
        vectors = real_open(source, manifest)
        real_read = vectors.read

        def read(start, stop):
            time.sleep(0.02)  # a later timestamp tick than the hash's look
            with open(features, "r+b") as handle:
                handle.seek(-8, os.SEEK_END)
                handle.write(np.float32([7, 7]).tobytes())
            return real_read(start, stop)

        vectors.read = read
        return vectors

    monkeypatch.setattr(encoders, "_open_vectors", saved_over_while_read)
    with pytest.raises(RankwiseError, match=changed):
        encode_manifest(manifest, "precomputed", {"path": str(features)}, out, progress=False)
    assert _read(out).sum() == 66  # the first store, untouched


def test_missing_checkpoint_names_it(manifest: Path, tmp_path: Path):
    options = {"factory": f"{FACTORIES}:with_checkpoint", "checkpoint": "gone/weights.pt"}
    with pytest.raises(
        RankwiseError,
        match=r"gone/weights\.pt: python checkpoint file not "
        r"found",
    ):
        encode_manifest(manifest, "python", options, tmp_path / "x.zarr", progress=False)


def test_a_checkpoint_folder_is_said_to_be_one(manifest: Path, tmp_path: Path):
    """A Hugging Face Trainer's checkpoint-500/ named as the checkpoint: it was "not
    found", which it is not; the message names the weights file inside."""
    folder = tmp_path / "checkpoint-500"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"x")
    (folder / "trainer_state.json").write_text("{}")
    options = {"factory": f"{FACTORIES}:with_checkpoint", "checkpoint": str(folder)}
    with pytest.raises(RankwiseError) as info:
        encode_manifest(manifest, "python", options, tmp_path / "x.zarr", progress=False)
    assert str(info.value) == (
        f"{folder}: options.checkpoint of the python encoder names a folder, not a file; "
        f"name the file itself: {folder / 'pytorch_model.bin'}"
    )
    assert not (tmp_path / "x.zarr").exists()


def test_failing_encoder_leaves_no_store(manifest: Path, tmp_path: Path):
    out = tmp_path / "emb" / "query.zarr"
    with pytest.raises(RuntimeError, match="model crashed"):
        encode_manifest(
            manifest,
            "python",
            {"factory": f"{FACTORIES}:fails_on_second_batch"},
            out,
            batch_size=3,
            progress=False,
        )
    assert not out.exists() and not Path(f"{out}.tmp").exists()
    # over an existing complete store: the old store survives untouched
    encode_manifest(manifest, "pixels", {"size": [2, 2]}, out, progress=False)
    before = _read(out)
    with pytest.raises(RuntimeError, match="model crashed"):
        encode_manifest(
            manifest,
            "python",
            {"factory": f"{FACTORIES}:fails_on_second_batch"},
            out,
            batch_size=3,
            progress=False,
        )
    np.testing.assert_array_equal(_read(out), before)
    assert embeddings_attrs(out)["encoder"]["kind"] == "pixels"


def test_non_finite_output_is_an_error(manifest: Path, tmp_path: Path):
    with pytest.raises(
        RankwiseError,
        match=r"query\.csv: row 4 \(id 'x2'\): the python encoder "
        r"produced NaN",
    ):
        encode_manifest(
            manifest,
            "python",
            {"factory": f"{FACTORIES}:gives_nan"},
            tmp_path / "nan.zarr",
            batch_size=3,
            progress=False,
        )
    assert not (tmp_path / "nan.zarr").exists()


# ---------------------------------------------------------------- onnx


def _onnx_model(path: Path, size: int = 6, dim: int = 4, batch: int | str = "N") -> np.ndarray:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(1).normal(size=(3 * size * size, dim)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["embedding"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, size, size])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [batch, dim])],
        [numpy_helper.from_array(weights, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return weights


@pytest.mark.parametrize("batch", ["N", 1])
def test_onnx(batch, manifest: Path, tmp_path: Path):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "tiny.onnx"
    weights = _onnx_model(model, batch=batch)
    out = tmp_path / "onnx.zarr"
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    encode_manifest(
        manifest,
        "onnx",
        {"model": str(model), "mean": mean, "std": std, "channel_order": "bgr"},
        out,
        batch_size=3,
        workers=2,
        progress=False,
    )
    x = np.stack(
        [
            np.asarray(im.resize((6, 6), Image.Resampling.BILINEAR), np.float32) / 255
            for im in _images(manifest)
        ]
    )
    x = ((x - np.float32(mean)) / np.float32(std))[..., ::-1].transpose(0, 3, 1, 2)
    np.testing.assert_allclose(_read(out), x.reshape(N_ROWS, -1) @ weights, rtol=1e-4, atol=1e-4)
    attrs = embeddings_attrs(out)
    assert attrs["checkpoint_hash"] == hashlib.sha256(model.read_bytes()).hexdigest()
    assert attrs["encoder"]["options"]["input_size"] == [6, 6]  # read from the model


def _onnx_variant(path: Path, variant: str) -> None:
    """A tiny model (flatten, then a 6x6x3 -> 4 matrix) in one of the shapes and types an
    exported model can have: ``half`` (float16 in and out), ``gray`` (one channel),
    ``uint8`` (raw pixels), ``squeezed`` (batch 1, output (4,)), ``transposed`` (output
    (4, N)), ``one-per-image`` (output (N,), each embedding's largest value),
    ``unknown`` / ``unknown-fixed`` (an output shape onnxruntime cannot tell
    before running; a dynamic / fixed batch of 2), ``dynamic`` (any height and width)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    float16 = variant == "half"
    kinds = {"half": TensorProto.FLOAT16, "uint8": TensorProto.UINT8}
    elem = kinds.get(variant, TensorProto.FLOAT)
    out_elem = TensorProto.FLOAT16 if float16 else TensorProto.FLOAT
    channels = 1 if variant == "gray" else 3
    batch = {"squeezed": 1, "unknown-fixed": 2}.get(variant, "N")
    height = "H" if variant == "dynamic" else 6
    weights = np.random.default_rng(1).normal(size=(channels * 36, 4))
    nodes = [
        helper.make_node("Flatten", ["images"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["embedding"]),
    ]
    out_shape: list | None = [batch, 4]
    if variant == "squeezed":
        nodes.append(helper.make_node("Flatten", ["embedding"], ["e2"], axis=0))
        nodes.append(helper.make_node("Squeeze", ["e2", "zero"], ["out"]))
        out_shape = [4]
    elif variant == "transposed":
        nodes.append(helper.make_node("Transpose", ["embedding"], ["out"], perm=[1, 0]))
        out_shape = [4, batch]
    elif variant == "one-per-image":
        nodes.append(helper.make_node("ReduceMax", ["embedding"], ["out"], axes=[1], keepdims=0))
        out_shape = [batch]
    elif variant.startswith("unknown"):
        # reshaped by a shape computed from the pixels (always [-1, 4]): onnxruntime cannot
        # tell the output's shape before running it
        nodes += [
            helper.make_node("ReduceMax", ["images"], ["top"], keepdims=0),
            helper.make_node("Mul", ["top", "nought"], ["none"]),
            helper.make_node("Cast", ["none"], ["zeros"], to=TensorProto.INT64),
            helper.make_node("Add", ["minus_one_four", "zeros"], ["to"]),
            helper.make_node("Reshape", ["embedding", "to"], ["out"]),
        ]
        out_shape = None
    else:
        nodes.append(helper.make_node("Identity", ["embedding"], ["out"]))
    if variant == "uint8":
        nodes.insert(0, helper.make_node("Cast", ["raw"], ["images"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes,
        variant,
        [
            helper.make_tensor_value_info(
                "raw" if variant == "uint8" else "images", elem, [batch, channels, height, 6]
            )
        ],
        [helper.make_tensor_value_info("out", out_elem, out_shape)],
        [numpy_helper.from_array(weights.astype(np.float16 if float16 else np.float32), "W")]
        + ([numpy_helper.from_array(np.array([0], np.int64), "zero")] if batch == 1 else [])
        + (
            [
                numpy_helper.from_array(np.float32(0), "nought"),
                numpy_helper.from_array(np.array([-1, 4], np.int64), "minus_one_four"),
            ]
            if variant.startswith("unknown")
            else []
        ),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


@pytest.mark.parametrize(
    "variant, options, message",
    [
        ("gray", {}, r"input 'images' has shape \['N', 1, 6, 6\]: 1 channels \(nchw\), but"),
        ("uint8", {}, r"input 'raw' takes tensor\(uint8\); the encoder feeds normalised"),
        ("half", {"input_size": [8, 8]},
         r"the model's input size is fixed at \[6, 6\], not options\.input_size \[8, 8\]"),
        ("squeezed", {},
         r"output 'out' has shape \[4\] for input shape \[1, 3, 6, 6\]: its first axis is not"),
        ("transposed", {}, r"output 'out' has shape \[4, 'N'\] .*: its first axis is not the"),
        # (3,) for a batch of 3 was stored as 3 rows of dim 1, exit 0
        ("one-per-image", {},
         r"output 'out' has shape \(3,\) for a batch of 3: a single axis, the batch's or the "
         r"embedding's, not both; export the model with outputs of shape \(batch, dim\)$"),
        ("dynamic", {"input_size": [8, 6]},
         r"onnxruntime failed on a batch of shape \(3, 3, 8, 6\) \(.*\); check options"),
    ],
)  # fmt: skip
def test_onnx_models_that_do_not_take_the_batch_are_one_line(
    variant, options, message, manifest: Path, tmp_path: Path
):
    """Each was a traceback (onnxruntime's InvalidArgument) or, for an output whose first
    axis is not the batch, a store of mixed-up values with exit 0."""
    pytest.importorskip("onnxruntime")
    model = tmp_path / f"{variant}.onnx"
    _onnx_variant(model, variant)
    with pytest.raises(RankwiseError, match=rf"^{model}: {message}"):
        encode_manifest(
            manifest,
            "onnx",
            {"model": str(model), **options},
            tmp_path / "o.zarr",
            batch_size=3,
            progress=False,
        )
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("variant", ["half", "unknown", "unknown-fixed"])
def test_onnx_float16_and_undeclared_outputs_equal_onnxruntime(variant, manifest, tmp_path):
    """A float16 model gets the normalised batch cast to float16; an output whose shape
    onnxruntime cannot tell before running (None) is checked on each batch's output, not
    refused up front (a fixed batch of 2: the last batch padded).  Reference:
    onnxruntime run by hand on the same preprocessing, one image at a time."""
    ort = pytest.importorskip("onnxruntime")
    model = tmp_path / f"{variant}.onnx"
    _onnx_variant(model, variant)
    encode_manifest(manifest, "onnx", {"model": str(model)}, tmp_path / "o.zarr", batch_size=3,
                    progress=False)  # fmt: skip
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    x = np.stack(
        [
            np.asarray(im.resize((6, 6), Image.Resampling.BILINEAR), np.float32) / 255
            for im in _images(manifest)
        ]
    )
    x = ((x - mean) / std).transpose(0, 3, 1, 2)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert variant == "half" or session.get_outputs()[0].shape in (None, [], [None, None])
    x = x.astype(np.float16 if variant == "half" else np.float32)
    size = 2 if variant == "unknown-fixed" else 1  # each image alone, padded with zeros
    expected = np.concatenate(
        [
            session.run(
                None, {"images": np.concatenate([x[i : i + 1]] + [0 * x[:1]] * (size - 1))}
            )[0][:1]
            for i in range(len(x))
        ]
    ).astype(np.float32)
    np.testing.assert_array_equal(_read(tmp_path / "o.zarr"), expected)


def test_onnx_missing_model(manifest: Path, tmp_path: Path):
    with pytest.raises(RankwiseError, match=r"nope\.onnx: onnx model file not found"):
        encode_manifest(
            manifest, "onnx", {"model": "nope.onnx"}, tmp_path / "o.zarr", progress=False
        )


# ---------------------------------------------------------------- precomputed


def test_precomputed_npy_and_zarr(manifest: Path, tmp_path: Path):
    vectors = np.random.default_rng(2).normal(size=(N_ROWS, 5))
    np.save(tmp_path / "q.npy", vectors)
    out = tmp_path / "emb" / "query.zarr"
    encode_manifest(
        manifest,
        "precomputed",
        {"query": str(tmp_path / "q.npy"), "gallery": "unused.npy"},
        out,
        progress=False,
    )
    np.testing.assert_allclose(_read(out), vectors.astype(np.float32))
    assert embeddings_attrs(out)["checkpoint_hash"] == file_sha256(tmp_path / "q.npy")
    # a Zarr group holding 'embeddings' (e.g. another rankwise store) as {path}
    again = tmp_path / "again.zarr"
    encode_manifest(manifest, "precomputed", {"path": str(out)}, again, progress=False)
    np.testing.assert_array_equal(_read(again), _read(out))
    assert embeddings_attrs(again)["checkpoint_hash"] is None


def test_precomputed_length_mismatch(manifest: Path, tmp_path: Path):
    np.save(tmp_path / "short.npy", np.zeros((N_ROWS - 2, 4)))
    with pytest.raises(RankwiseError) as info:
        encode_manifest(
            manifest,
            "precomputed",
            {"path": str(tmp_path / "short.npy")},
            tmp_path / "p.zarr",
            progress=False,
        )
    message = str(info.value)
    assert "short.npy" in message and "query.csv" in message
    assert f"{N_ROWS - 2} rows" in message and f"has {N_ROWS} rows" in message
    assert not (tmp_path / "p.zarr").exists()


@pytest.mark.parametrize("keyed", [False, True])
def test_precomputed_non_finite_row_names_the_file_and_its_row(manifest, tmp_path, keyed):
    """A NaN in the user's features named the manifest's row and blamed "the model";
    the file and its own row are what to fix (by id: the row of the file, not of the
    manifest, which differ when the rows come in another order)."""
    vectors = np.random.default_rng(3).normal(size=(N_ROWS, 4))
    ids = [f"x{i}" for i in range(N_ROWS)]
    if keyed:  # the file's rows in reverse manifest order, matched by id
        vectors, ids = vectors[::-1].copy(), ids[::-1]
        (tmp_path / "ids.txt").write_text("\n".join(ids) + "\n")
    vectors[2, 1] = np.nan  # the file's row 2: manifest row 2, or row 4 when reversed
    np.save(tmp_path / "f.npy", vectors)
    options = {"path": str(tmp_path / "f.npy")}
    if keyed:
        options["ids"] = str(tmp_path / "ids.txt")
    manifest_row = N_ROWS - 1 - 2 if keyed else 2
    with pytest.raises(RankwiseError) as info:
        encode_manifest(manifest, "precomputed", options, tmp_path / "p.zarr", progress=False)
    assert str(info.value) == (
        f"{tmp_path / 'f.npy'}: row 2 (0-based; {manifest}: row {manifest_row + 2} "
        f"(id 'x{manifest_row}')) holds NaN or infinite values; fix or recompute those "
        "embeddings"
    )
    assert not (tmp_path / "p.zarr").exists()


def test_a_bad_row_of_a_precomputed_store_names_the_file_it_came_from(tmp_path: Path):
    """In the pipeline the rank job reads stores the precomputed encoder wrote: a zero
    row or another dimension named only results/embeddings/..., not the user's file."""
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(6, 4)).astype("f4")
    gallery[3] = 0.0
    np.save(tmp_path / "g.npy", gallery)
    np.save(tmp_path / "q.npy", rng.normal(size=(3, 5)).astype("f4"))
    (tmp_path / "query.csv").write_text("id,label\n" + "".join(f"q{i},{i}\n" for i in range(3)))
    (tmp_path / "gallery.csv").write_text(
        "id,label\n" + "".join(f"g{i},{i % 3}\n" for i in range(6))
    )
    files = {"query": str(tmp_path / "q.npy"), "gallery": str(tmp_path / "g.npy")}
    for split in ("query", "gallery"):
        encode_manifest(
            tmp_path / f"{split}.csv", "precomputed", files, tmp_path / f"{split}.zarr",
            progress=False,
        )  # fmt: skip
    np.save(tmp_path / "q4.npy", rng.normal(size=(3, 4)).astype("f4"))
    inputs = ["--query", tmp_path / "query.csv", "--gallery", tmp_path / "gallery.csv"]
    for query, distance, expected in (
        (
            "q4.npy",
            "cosine",
            f"{tmp_path / 'gallery.zarr'}: gallery embeddings row 3 (0-based; "
            f"{tmp_path / 'gallery.csv'}: row 5 (id 'g3')) (encoded from {tmp_path / 'g.npy'}) "
            "is a zero vector",
        ),
        (
            "query.zarr",
            "euclidean",
            f"{tmp_path / 'query.zarr'} (encoded from {tmp_path / 'q.npy'}) has dimension 5 "
            f"but {tmp_path / 'gallery.zarr'} (encoded from {tmp_path / 'g.npy'}) has 4",
        ),
    ):
        proc = run_rankwise(
            "evaluate", *inputs, "--query-embeddings", tmp_path / query,
            "--gallery-embeddings", tmp_path / "gallery.zarr", "--distance", distance,
        )  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: {expected}"), proc.stderr


def test_a_zero_embedding_row_names_the_manifest_row_and_id(manifest: Path, tmp_path: Path):
    """A black image under the pixels baseline is a zero vector, which cosine cannot rank:
    the message named only the store's row (results/embeddings/... in the pipeline); it
    names the manifest's row and id too, unless the manifest has changed since."""
    Image.new("RGB", (9, 14)).save(tmp_path / "data" / "img3.png")  # black: all zero
    store = tmp_path / "e.zarr"
    encode_manifest(manifest, "pixels", {"size": [4, 4]}, store, progress=False)
    args = ["--query", manifest, "--gallery", manifest, "--query-embeddings", store]
    proc = run_rankwise("evaluate", *args, "--gallery-embeddings", store)
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        f"error: {store}: query embeddings row 3 (0-based; {manifest}: row 5 (id 'x3')) is a "
        "zero vector"
    ), proc.stderr
    moved = tmp_path / "moved.csv"  # the recorded manifest gone: the store's row alone
    manifest.rename(moved)
    proc = run_rankwise("evaluate", "--query", moved, "--gallery", moved, "--query-embeddings",
                        store, "--gallery-embeddings", store)  # fmt: skip
    assert proc.stderr.startswith(f"error: {store}: query embeddings row 3 (0-based) is a zero")


def test_precomputed_needs_a_split(manifest: Path, tmp_path: Path):
    other = manifest.with_name("items.csv")
    other.write_bytes(manifest.read_bytes())
    with pytest.raises(RankwiseError, match=r"cannot tell whether .*items\.csv is the query"):
        encode_manifest(
            other,
            "precomputed",
            {"query": "q.npy", "gallery": "g.npy"},
            tmp_path / "store.zarr",
            progress=False,
        )


# ---------------------------------------------------------------- images and options


def test_missing_image_names_file_and_row(manifest: Path, tmp_path: Path):
    (tmp_path / "data" / "img4.png").unlink()
    with pytest.raises(
        RankwiseError,
        match=r"query\.csv: row 6 \(id 'x4'\): image "
        r"'\.\./data/img4\.png' not found",
    ):
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", batch_size=2, progress=False)
    assert not (tmp_path / "e.zarr").exists() and not (tmp_path / "e.zarr.tmp").exists()


def test_unreadable_image(manifest: Path, tmp_path: Path):
    (tmp_path / "data" / "img1.png").write_bytes(b"not a png")
    with pytest.raises(RankwiseError, match=r"row 3 \(id 'x1'\): cannot decode image .*img1"):
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", progress=False)


def test_a_store_left_by_a_crash_is_incomplete_not_foreign(manifest: Path, tmp_path: Path):
    """A killed encode leaves `<out>.tmp`; given as an input it was a Zarr store without
    rankwise's attributes, read as it stood (rows not yet written as zeros, a complete
    copy by `precomputed`).  It carries its kind from the start: incomplete."""
    from rankwise.embeddings import open_embeddings
    from rankwise.store import atomic_store

    writing = atomic_store(tmp_path / "k.zarr", "embeddings")
    group = writing.__enter__()  # never left: the process dies here
    group.create_array("embeddings", data=np.ones((N_ROWS, 2), np.float32))
    tmp = tmp_path / "k.zarr.tmp"
    with pytest.raises(RankwiseError, match=r"k\.zarr\.tmp: incomplete embedding store"):
        open_embeddings(tmp, name="gallery embeddings")
    with pytest.raises(RankwiseError, match=r"k\.zarr\.tmp: incomplete embedding store"):
        encode_manifest(
            manifest, "precomputed", {"path": str(tmp)}, tmp_path / "c.zarr", progress=False
        )
    assert not (tmp_path / "c.zarr").exists()


def test_a_broken_png_chunk_is_one_line(manifest: Path, tmp_path: Path):
    """PIL raises SyntaxError (not an OSError) for a PNG whose IDAT length is wrong."""
    image = tmp_path / "data" / "img1.png"
    data = bytearray(image.read_bytes())
    at = data.find(b"IDAT")
    length = int.from_bytes(data[at - 4 : at], "big")
    data[at - 4 : at] = (length - 15).to_bytes(4, "big")
    image.write_bytes(bytes(data))
    with pytest.raises(
        RankwiseError, match=r"row 3 \(id 'x1'\): cannot decode image .*SyntaxError"
    ):
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", progress=False)


@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("cut", ["rows", "mid-row"])
def test_a_png_lacking_rows_is_an_error_not_black_rows(interlace, cut, manifest, tmp_path):
    """A PNG whose zlib stream ends (cleanly) after a whole row, before its last: PIL
    decodes it with no error, the rows never sent black, and that image's embedding was
    stored, exit 0.  (Ended within a row, PIL itself says "truncated".)"""
    pixels = np.full((14, 9, 3), 200, np.uint8)  # img1's size
    lines = png_scanlines(pixels, interlace)
    # 7 rows of 1 + 9 * 3 bytes: the last 7 rows, or Adam7's last pass (rows 1, 3, .., 13)
    keep = len(lines) - 7 * 28 + (14 if cut == "mid-row" else 0)
    image = tmp_path / "data" / "img1.png"
    image.write_bytes(png_file(9, 14, lines[:keep], interlace))
    if cut == "rows":
        decoded = np.asarray(Image.open(image).convert("RGB"))  # the premise: no error ...
        assert (decoded == 0).sum() == 7 * 9 * 3  # ... and black rows
    with pytest.raises(
        RankwiseError,
        match=r"row 3 \(id 'x1'\): cannot decode image .*img1\.png \(",
    ) as error:
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", progress=False)
    if cut == "rows":
        assert f"its image data end {len(lines) - keep} of {len(lines)} bytes early" in str(
            error.value
        )
    assert not (tmp_path / "e.zarr").exists()


def test_complete_interlaced_pngs_encode_as_their_pixels(manifest: Path, tmp_path: Path):
    """Adam7 files (every pass size, empty passes included) are complete: the same
    embeddings as the same pixels saved plainly."""
    rng = np.random.default_rng(1)
    table = pd.read_csv(manifest, dtype=str)
    for i in range(N_ROWS):
        h, w = (1, 1, 2, 5, 8, 9, 14)[i], (1, 3, 2, 4, 8, 17, 6)[i]
        pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        plain, interlaced = tmp_path / "data" / f"p{i}.png", tmp_path / "data" / f"a{i}.png"
        Image.fromarray(pixels).save(plain)
        interlaced.write_bytes(png_file(w, h, png_scanlines(pixels, True), interlace=True))
        assert np.array_equal(np.asarray(Image.open(interlaced)), pixels)  # a true Adam7 file
    stores = {}
    for prefix in ("p", "a"):
        table["path"] = [f"../data/{prefix}{i}.png" for i in range(N_ROWS)]
        table.to_csv(manifest, index=False)
        stores[prefix] = tmp_path / f"{prefix}.zarr"
        encode_manifest(manifest, "pixels", {"size": [4, 4]}, stores[prefix], progress=False)
    assert np.array_equal(_read(stores["a"]), _read(stores["p"]))


def test_a_complete_png_with_a_black_last_row_is_read(tmp_path: Path):
    """A black last row is what a stream ending early leaves: the file is then inflated
    and counted, and is complete; with its last row not sent it is refused."""
    from rankwise.png_data import check_png_complete

    pixels = np.full((6, 5, 3), 90, np.uint8)
    pixels[-1] = 0
    lines = png_scanlines(pixels)
    for keep, refused in ((len(lines), False), (len(lines) - 16, True)):
        path = tmp_path / f"{keep}.png"
        path.write_bytes(png_file(5, 6, lines[:keep]))
        with Image.open(path) as image:
            assert np.array_equal(np.asarray(image.convert("RGB")), pixels)  # the same pixels
            if refused:
                with pytest.raises(RankwiseError, match=r"end 16 of 96 bytes early"):
                    check_png_complete(image, path, "here")
            else:
                check_png_complete(image, path, "here")


@pytest.mark.parametrize(
    "mode, size, options",
    [
        ("1", (13, 5), {}),  # 1 bit a pixel, rows not a whole number of bytes
        ("L", (7, 3), {}),
        ("LA", (5, 4), {}),
        ("P", (11, 3), {"bits": 2}),
        ("P", (6, 6), {}),
        ("RGB", (9, 2), {}),
        ("RGBA", (3, 7), {}),
        ("I;16", (5, 5), {}),
        ("RGB", (400, 300), {}),  # noise: several IDAT chunks
    ],
)
def test_png_data_size_of_complete_files(mode, size, options, tmp_path: Path):
    """expected_bytes is what every complete file's IDAT data inflate to (PIL's files of
    every colour type and depth it writes), so no complete PNG is refused."""
    import struct
    import zlib

    from rankwise.png_data import missing_bytes

    rng = np.random.default_rng(2)
    image = Image.fromarray(rng.integers(0, 256, size=size[::-1] + (3,), dtype=np.uint8))
    image = image.convert(mode) if mode != "I;16" else Image.new("I;16", size, 40000)
    path = tmp_path / "x.png"
    image.save(path, **options)
    data = path.read_bytes()
    parts, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        if data[at + 4 : at + 8] == b"IDAT":
            parts.append(data[at + 8 : at + 8 + length])
        at += 12 + length
    assert len(parts) > 1 or size != (400, 300)
    assert missing_bytes(data) == (0, len(zlib.decompress(b"".join(parts))))


def test_image_beyond_pils_size_guard_is_one_line(manifest: Path, tmp_path: Path, monkeypatch):
    """PIL refuses images above twice MAX_IMAGE_PIXELS (a decompression-bomb guard) with an
    error that is not an OSError: still one line naming the row."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the others: at most 30 x 17
    Image.new("RGB", (80, 30)).save(tmp_path / "data" / "img1.png")
    with pytest.raises(RankwiseError, match=r"row 3 \(id 'x1'\): image .*img1\.png is too large"):
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", progress=False)
    assert not (tmp_path / "e.zarr").exists()


@pytest.mark.parametrize(
    "array, name",
    [
        (np.linspace(134, 65314, 12 * 8).reshape(12, 8).astype(np.uint16), "img2.png"),  # I;16
        (np.linspace(0, 1, 12 * 8).reshape(12, 8).astype(np.float32), "img2.tif"),  # F
    ],
)
def test_wide_pixels_are_an_error_not_a_clipped_image(array, name, manifest: Path, tmp_path):
    """PIL's convert("RGB") clips 16-bit values at 255 (99.6 % white) and floats in [0, 1]
    to black: the embedding of a blank image, stored with exit status 0."""
    Image.fromarray(array).save(tmp_path / "data" / name)
    assert Image.open(tmp_path / "data" / name).mode in ("I;16", "F")
    table = pd.read_csv(manifest, dtype=str)
    table.loc[2, "path"] = f"../data/{name}"
    table.to_csv(manifest, index=False)
    with pytest.raises(
        RankwiseError, match=r"row 4 \(id 'x2'\): image .* has '(I;16|F)' pixels .*8-bit RGB"
    ):
        encode_manifest(manifest, "pixels", {}, tmp_path / "e.zarr", progress=False)
    assert not (tmp_path / "e.zarr").exists()


@pytest.mark.parametrize("kind", ["array", "npy"])
def test_float64_values_beyond_float32_are_an_error_naming_the_row(kind, tmp_path: Path):
    emb = np.ones((4, 3))
    emb[2, 1] = 1e39  # finite in float64, inf in float32
    source = emb
    if kind == "npy":
        source = str(tmp_path / "g.npy")
        np.save(source, emb)
    table = pd.DataFrame({"id": ["a", "b", "c", "d"], "label": ["1", "1", "2", "2"]})
    with pytest.raises(RankwiseError, match=r"row 2 \(0-based\) .* holds 1e\+39, beyond float32"):
        rankwise.evaluate(table, table, np.ones((4, 3), np.float32), source)


@pytest.mark.parametrize(
    "kind, options, message",
    [
        (
            "resnet",
            {},
            r"unknown encoder kind 'resnet'; valid kinds: precomputed, python, onnx, "
            r"pixels, color-histogram, hog",
        ),
        (
            "pixels",
            {"sise": [2, 2]},
            r"pixels: unknown option\(s\) sise; valid options: "
            r"grayscale, size",
        ),
        ("pixels", {"size": 4}, r"option size must be \[height, width\]"),
        ("color-histogram", {"space": "lab"}, r"option space must be one of hsv, rgb"),
        ("python", {}, r"python: missing option\(s\) factory"),
    ],
)
def test_option_errors(kind, options, message, manifest: Path, tmp_path: Path):
    with pytest.raises(RankwiseError, match=message):
        encode_manifest(manifest, kind, options, tmp_path / "e.zarr", progress=False)


def test_store_attrs(manifest: Path, tmp_path: Path):
    out = tmp_path / "a.zarr"
    encode_manifest(manifest, "color-histogram", {"bins": 4}, out, progress=False)
    attrs = embeddings_attrs(out)
    assert attrs["kind"] == "embeddings" and attrs["complete"] is True
    assert attrs["encoder"] == {
        "kind": "color-histogram",
        "options": {"bins": 4, "space": "hsv", "joint": False, "stripes": 1},
    }
    assert attrs["manifest_hash"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert attrs["manifest_csv_sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert attrs["checkpoint_hash"] is None
    assert attrs["rankwise_version"] == rankwise.__version__
    assert attrs["num_rows"] == N_ROWS
    json.dumps(attrs)


def test_every_kind_is_documented():
    import rankwise.encoders as encoders

    for kind in ENCODER_KINDS:
        assert f"``{kind}``" in encoders.__doc__


# ---------------------------------------------------------------- hashing


def test_hash_cache(tmp_path: Path):
    cache = tmp_path / "cache" / "hashes.json"
    file = tmp_path / "big.bin"
    file.write_bytes(b"a" * 1000)
    digest = file_sha256(file, cache_path=cache, min_cached_size=0)
    assert digest == hashlib.sha256(b"a" * 1000).hexdigest()
    entry = json.loads(cache.read_text())["entries"][str(file.resolve())]
    assert entry["sha256"] == digest and entry["size"] == 1000
    os.utime(file, ns=(entry["mtime_ns"] + 10**9, entry["mtime_ns"] + 10**9))
    assert file_sha256(file, cache_path=cache, min_cached_size=0) == digest
    file.write_bytes(b"b" * 1000)
    new = file_sha256(file, cache_path=cache, min_cached_size=0)
    assert new == hashlib.sha256(b"b" * 1000).hexdigest()
    # a stale entry whose stamp matches is trusted: the cache really is consulted
    data = json.loads(cache.read_text())
    data["entries"][str(file.resolve())]["sha256"] = "f" * 64
    cache.write_text(json.dumps(data))
    assert file_sha256(file, cache_path=cache, min_cached_size=0) == "f" * 64
    cache.write_text("{corrupt")
    assert file_sha256(file, cache_path=cache, min_cached_size=0) == new


def test_hash_cache_stays_out_of_a_users_folder(tmp_path: Path, monkeypatch):
    """`rankwise rank` on a manifest over 1 MB made ./.snakemake/ in whatever folder it ran
    in; the cache is there only where a pipeline made that folder, else in the user's
    rankwise cache."""
    monkeypatch.delenv("RANKWISE_HASH_CACHE", raising=False)
    monkeypatch.setenv("RANKWISE_CACHE_DIR", str(tmp_path / "user-cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    file = work / "gallery.csv"
    file.write_bytes(b"x" * (2 << 20))
    digest = hashlib.sha256(b"x" * (2 << 20)).hexdigest()
    assert file_sha256(file) == digest
    assert [p.name for p in work.iterdir()] == ["gallery.csv"]
    cached = json.loads((tmp_path / "user-cache" / "hash-cache.json").read_text())
    assert cached["entries"][str(file.resolve())]["sha256"] == digest
    (work / ".snakemake").mkdir()  # a pipeline's folder: its jobs share its cache
    assert file_sha256(file) == digest
    assert (work / ".snakemake" / "rankwise-hash-cache.json").is_file()


def test_the_user_cache_folder_follows_the_xdg_rules_and_survives_no_home(
    tmp_path: Path, monkeypatch
):
    """RANKWISE_CACHE_DIR first; XDG_CACHE_HOME only when absolute (the spec ignores a
    relative one: it named a folder below wherever a command ran); without a home
    directory (no $HOME, a user id without a passwd entry) no user cache: the hash cache
    falls back to the working folder's and the compiled kernels stay beside the package
    (native's list of folders raised RuntimeError)."""
    from rankwise import hashing, native
    from rankwise.cache_dir import user_cache_dir

    monkeypatch.delenv("RANKWISE_HASH_CACHE", raising=False)
    monkeypatch.setenv("RANKWISE_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "mine"
    assert native._cache_dirs() == [tmp_path / "mine"]
    monkeypatch.delenv("RANKWISE_CACHE_DIR")
    assert user_cache_dir() == tmp_path / "xdg" / "rankwise"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache_dir() == tmp_path / "home" / ".cache" / "rankwise"

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert user_cache_dir() is None
    assert native._cache_dirs() == [native.SOURCE.parent / "__pycache__"]
    monkeypatch.chdir(tmp_path)
    assert hashing._cache_location(None) == hashing.DEFAULT_CACHE


def test_hash_cache_sees_a_same_size_rewrite_with_its_mtime_restored(tmp_path: Path):
    """`cp -p` / `touch -r` over a file keep size, mtime and inode; the change time moves."""
    cache = tmp_path / "hashes.json"
    file = tmp_path / "epoch.pth"
    file.write_bytes(b"a" * 1000)
    before = file.stat()
    sha = file_sha256(file, cache_path=cache, min_cached_size=0)
    assert sha == hashlib.sha256(b"a" * 1000).hexdigest()
    with open(file, "r+b") as handle:  # in place: the inode stays
        handle.write(b"b" * 1000)
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))
    deadline = time.monotonic() + 3.0  # file systems with coarse (up to 1 s) timestamps
    while file.stat().st_ctime_ns == before.st_ctime_ns and time.monotonic() < deadline:
        time.sleep(0.05)
        os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns))  # moves ctime only
    after = file.stat()
    assert after.st_ctime_ns != before.st_ctime_ns
    stamp = ("st_size", "st_mtime_ns", "st_ino")
    assert [getattr(after, k) for k in stamp] == [getattr(before, k) for k in stamp]
    sha = file_sha256(file, cache_path=cache, min_cached_size=0)
    assert sha == hashlib.sha256(b"b" * 1000).hexdigest()


def test_hash_missing_file(tmp_path: Path):
    with pytest.raises(RankwiseError, match=r"nope\.bin: file not found"):
        file_sha256(tmp_path / "nope.bin")


# ---------------------------------------------------------------- command line


def test_cli_encode(manifest: Path, tmp_path: Path):
    from rankwise.cli import main

    out = tmp_path / "cli.zarr"
    result = CliRunner().invoke(
        main,
        [
            "encode",
            "--manifest",
            str(manifest),
            "--kind",
            "pixels",
            "--options",
            '{"size": [2, 3]}',
            "--out",
            str(out),
            "--batch-size",
            "4",
            "--threads",
            "2",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"encoded {N_ROWS} rows x 18 dims with pixels -> {out}"
    assert _read(out).shape == (N_ROWS, 18)


def test_cli_encode_error(manifest: Path, tmp_path: Path):
    from rankwise.cli import main

    result = CliRunner().invoke(
        main,
        [
            "encode",
            "--manifest",
            str(manifest),
            "--kind",
            "python",
            "--options",
            '{"factory": "nope_mod:f"}',
            "--out",
            str(tmp_path / "x.zarr"),
        ],
    )
    assert result.exit_code == 2
    assert "error: python: module 'nope_mod' of options.factory not found" in result.output


@pytest.mark.parametrize("ahead", [True, False])
def test_image_batches_order_and_decoding_ahead(ahead):
    """Both modes yield every image once, in manifest order, in batches of ``batch_size``;
    without ``ahead`` no image of the next batch is decoded before this one is consumed
    (the CPU forward pass then has the cores to itself)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from rankwise.encoders import _image_batches

    lock, started = threading.Lock(), []

    def per_image(i):
        with lock:
            started.append(i)
        return i * i

    rows = SimpleNamespace(ids=list(range(10)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        batches = []
        for batch in _image_batches(rows, per_image, 3, pool, ahead=ahead):
            batches.append(batch)
            if not ahead:
                end = 3 * len(batches)
                with lock:
                    assert max(started) < end, (batches, started)
    assert batches == [[0, 1, 4], [9, 16, 25], [36, 49, 64], [81]]
    assert sorted(started) == list(range(10))


def test_an_onnx_model_of_two_inputs_is_one_line(manifest: Path, tmp_path: Path):
    """The second input was missing at the first batch, with the advice to check
    input_size and layout; inputs backed by an initializer (old exporters list the
    weights as inputs) are not required, and such a model encodes."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def model(path: Path, weights_as_input: bool) -> None:
        w = numpy_helper.from_array(np.ones((3 * 6 * 6, 4), np.float32), "W")
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])]
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [108, 4]))
        graph = helper.make_graph(
            [
                helper.make_node("Flatten", ["x"], ["f"], axis=1),
                helper.make_node("MatMul", ["f", "W"], ["y"]),
            ],
            "two",
            inputs,
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
            [w] if weights_as_input else [],
        )
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        proto.ir_version = 8
        onnx.save(proto, str(path))

    model(tmp_path / "two.onnx", weights_as_input=False)
    with pytest.raises(
        RankwiseError,
        match=r"two\.onnx: the model takes 2 inputs \(x, W\); the onnx encoder feeds one image "
        r"batch: export the model with the images as its only input$",
    ):
        encode_manifest(manifest, "onnx", {"model": str(tmp_path / "two.onnx")},
                        tmp_path / "e.zarr", progress=False)  # fmt: skip
    model(tmp_path / "old.onnx", weights_as_input=True)
    encode_manifest(manifest, "onnx", {"model": str(tmp_path / "old.onnx")},
                    tmp_path / "e.zarr", progress=False)  # fmt: skip
    assert _read(tmp_path / "e.zarr").shape == (N_ROWS, 4)
