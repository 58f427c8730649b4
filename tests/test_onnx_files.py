"""ONNX models whose weights are files of their own (``model.onnx.data``: torch.onnx.export's
default since torch 2.9).  The ``.onnx`` file then holds the graph only, the same bytes for
every epoch: the weights files must count wherever the model file does (its recorded hash,
the changed-while-encoding check, the pipeline's rerun check and inputs).

The reference for which files a model names is the ``onnx`` package's own reading of it
(``onnx.external_data_helper``), on models with weights in the main graph, in a
subgraph (an ``If`` branch) and in a sparse initializer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import planned_jobs, run_rankwise
from PIL import Image

from rankwise.encoders import encode_manifest
from rankwise.errors import RankwiseError
from rankwise.onnx_files import external_data_files, model_sha256
from rankwise.store import embeddings_attrs

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SIZE, DIM = 6, 4


def _graph(seed: int) -> onnx.ModelProto:
    """images (N, 3, 6, 6) -> Flatten -> MatMul W -> If(always true: + B, else: - B)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(3 * SIZE * SIZE, DIM)).astype(np.float32)
    b = rng.normal(size=(DIM,)).astype(np.float32)
    then = helper.make_graph(
        [helper.make_node("Add", ["raw", "B"], ["out_then"])],
        "then",
        [],
        [helper.make_tensor_value_info("out_then", TensorProto.FLOAT, ["N", DIM])],
        [numpy_helper.from_array(b, "B")],
    )
    other = helper.make_graph(
        [helper.make_node("Sub", ["raw", "B2"], ["out_else"])],
        "else",
        [],
        [helper.make_tensor_value_info("out_else", TensorProto.FLOAT, ["N", DIM])],
        [numpy_helper.from_array(b, "B2")],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["raw"]),
            helper.make_node("Constant", [], ["yes"], value_int=1),
            helper.make_node("Cast", ["yes"], ["cond"], to=TensorProto.BOOL),
            helper.make_node("If", ["cond"], ["embedding"], then_branch=then, else_branch=other),
        ],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", DIM])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _save(model: onnx.ModelProto, path: Path, location: str | None) -> None:
    """``location`` None: weights embedded; else all in that file beside the model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if location is None:
        onnx.save_model(model, str(path))
    else:
        # onnx appends to an existing data file (the offsets would move): a new one, as
        # torch.onnx.export writes it
        (path.parent / location).unlink(missing_ok=True)
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=location,
            size_threshold=0,
        )


def _onnx_says(path: Path) -> list[Path]:
    """The external data files the onnx package finds in ``path``, in first-use order."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    found: dict[str, None] = {}
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            found.setdefault(ExternalDataInfo(tensor).location)
    return [path.parent / location for location in found]


def test_external_data_files_are_the_ones_onnx_reads(tmp_path):
    # a fresh model each time: onnx.save_model converts the one it is given in place
    _save(_graph(0), tmp_path / "embedded.onnx", None)
    assert external_data_files(tmp_path / "embedded.onnx") == []
    assert _onnx_says(tmp_path / "embedded.onnx") == []
    _save(_graph(0), tmp_path / "one.onnx", "one.onnx.data")
    assert external_data_files(tmp_path / "one.onnx") == [tmp_path / "one.onnx.data"]
    assert external_data_files(tmp_path / "one.onnx") == _onnx_says(tmp_path / "one.onnx")
    # one file per tensor, the If branches' initializers among them
    (tmp_path / "many").mkdir()
    onnx.save_model(
        _graph(0),
        str(tmp_path / "many" / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    found = external_data_files(tmp_path / "many" / "m.onnx")
    assert len(found) == 3 and sorted(found) == sorted(_onnx_says(tmp_path / "many" / "m.onnx"))
    # not an ONNX file, an empty one: nothing (onnxruntime says what is wrong)
    (tmp_path / "text.onnx").write_text("not a model")
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert external_data_files(tmp_path / "text.onnx") == []
    assert external_data_files(tmp_path / "empty.onnx") == []


def test_a_location_outside_the_models_folder_is_refused(tmp_path):
    _save(_graph(0), tmp_path / "sub" / "m.onnx", "w.data")
    model = onnx.load(str(tmp_path / "sub" / "m.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:  # onnx itself refuses to write it
        if entry.key == "location":
            entry.value = "../w.data"
    (tmp_path / "sub" / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(RankwiseError, match=r"external data location '\.\./w\.data' is outside"):
        external_data_files(tmp_path / "sub" / "m.onnx")


def test_the_hash_covers_the_weights(tmp_path):
    _save(_graph(0), tmp_path / "embedded.onnx", None)
    embedded = (tmp_path / "embedded.onnx").read_bytes()
    # embedded weights: the file's own sha256, as recorded before external data counted
    assert model_sha256(tmp_path / "embedded.onnx") == hashlib.sha256(embedded).hexdigest()
    hashes = []
    for seed in (0, 1):
        _save(_graph(seed), tmp_path / "m.onnx", "m.onnx.data")
        hashes.append(model_sha256(tmp_path / "m.onnx"))
    graph = (tmp_path / "m.onnx").read_bytes()
    _save(_graph(0), tmp_path / "m.onnx", "m.onnx.data")
    assert (tmp_path / "m.onnx").read_bytes() == graph  # the graph file alone is the same
    assert hashes[0] != hashes[1] and model_sha256(tmp_path / "m.onnx") == hashes[0]
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(RankwiseError, match=r"external data file .*m\.onnx\.data is missing"):
        model_sha256(tmp_path / "m.onnx")


def _manifest(folder: Path) -> Path:
    rng = np.random.default_rng(0)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    lines = ["id,label,path"]
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)).save(
            folder / "img" / f"{i}.png"
        )
        lines.append(f"x{i},{i % 2},img/{i}.png")
    (folder / "m.csv").write_text("\n".join(lines) + "\n")
    return folder / "m.csv"


def test_encode_records_and_checks_the_weights(tmp_path):
    pytest.importorskip("onnxruntime")
    manifest = _manifest(tmp_path)
    model = tmp_path / "run" / "last.onnx"
    stores = []
    for seed in (0, 1):  # training saves over last.onnx: the graph file stays the same
        _save(_graph(seed), model, "last.onnx.data")
        stores.append(tmp_path / f"s{seed}.zarr")
        encode_manifest(manifest, "onnx", {"model": str(model)}, stores[-1], progress=False)
    a, b = (embeddings_attrs(s)["checkpoint_hash"] for s in stores)
    assert a != b and b == model_sha256(model)  # the two stores' weights differ
    from rankwise.embeddings import open_embeddings

    rows = [open_embeddings(str(s), name="x").read(0, 5) for s in stores]
    assert not np.array_equal(rows[0], rows[1])
    (tmp_path / "run" / "last.onnx.data").unlink()
    proc = run_rankwise(
        "encode", "--manifest", manifest, "--kind", "onnx", "--options",
        json.dumps({"model": str(model)}), "--out", tmp_path / "x.zarr", "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {model}: its external data file {model.parent / 'last.onnx.data'} is "
        "missing; copy it beside the model (torch.onnx.export writes it next to the .onnx "
        "file)"
    ]


def test_pipeline_reruns_encode_when_only_the_weights_change(tmp_path):
    """New bytes in last.onnx.data (the graph file unchanged) rerun the encode jobs; the
    weights file is an input of the job and is checked like the model."""
    pytest.importorskip("onnxruntime")
    from helpers import snakemake

    manifest = _manifest(tmp_path)
    shutil.copy(manifest, tmp_path / "g.csv")
    _save(_graph(0), tmp_path / "run" / "last.onnx", "last.onnx.data")
    config = {
        "datasets": {
            "d": {
                "loader": "manifest",
                "options": {"query": "m.csv", "gallery": "g.csv"},
                "protocol": "recall",
            }
        },
        "encoders": {"e": {"kind": "onnx", "options": {"model": "run/last.onnx"}}},
        "report": {"resamples": 0},
    }
    first = snakemake(tmp_path, config, replace=True)
    assert first.returncode == 0, first.stderr[-3000:]
    dry = snakemake(tmp_path, config, "-n", replace=True)
    assert planned_jobs(dry.stdout + dry.stderr) == {}
    _save(_graph(1), tmp_path / "run" / "last.onnx", "last.onnx.data")
    dry = snakemake(tmp_path, config, "-n", replace=True)
    jobs = planned_jobs(dry.stdout + dry.stderr)
    assert jobs.get("encode") == 2, jobs
    os.remove(tmp_path / "run" / "last.onnx.data")
    missing = snakemake(tmp_path, config, "-n", replace=True)
    assert missing.returncode != 0
    assert "run/last.onnx.data not found" in missing.stderr, missing.stderr[-2000:]
