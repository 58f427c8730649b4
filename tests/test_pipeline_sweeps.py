"""Checkpoint sweeps (issue #10 item 3): `checkpoints: <glob>` in real Snakemake runs.

Two tiny ONNX checkpoints are evaluated; a third file appearing schedules exactly its own
encode (query, gallery), rank and metrics jobs and the report; a removed file drops out
of the report.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
from pathlib import Path

import pytest
from helpers import planned_jobs

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_pipeline import write_model
from test_pipeline_trust import error_lines, run_ok, snakemake

CONFIG = {
    "datasets": {
        "market": {
            "loader": "demo-market",
            "options": {
                "seed": 1,
                "identities": 6,
                "cameras": 2,
                "images_per_camera": 2,
                "queries_per_identity": 1,
                "distractors": 3,
                "junk": 2,
                "height": 16,
                "width": 8,
            },
            "protocol": "reid",
            "ks": [1],
        },
    },
    "encoders": {
        "run": {
            "kind": "onnx",
            "checkpoints": "runs/baseline/epoch_*.onnx",
            "options": {"input_size": [16, 8]},
        },
    },
    "engine": {"threads": 1},
    "report": {"resamples": 0, "worst_queries": 0},
}
NEW_CHECKPOINT = {"encode": 2, "rank": 1, "metrics": 1, "report": 1, "all": 1}


def planned(workdir: Path, config: dict = CONFIG) -> dict[str, int]:
    return planned_jobs(run_ok(workdir, config, "--dry-run"))


def reported(workdir: Path) -> list[str]:
    doc = json.loads((workdir / "results/report.json").read_text())
    return [entry["encoder"] for entry in doc["results"]]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep")
    for seed, epoch in enumerate((10, 2)):
        write_model(path / f"runs/baseline/epoch_{epoch}.onnx", seed=seed)
    run_ok(path, CONFIG)
    return path


def test_each_file_is_one_encoder_in_natural_order(workdir):
    assert reported(workdir) == ["run@epoch_2", "run@epoch_10"]
    doc = json.loads((workdir / "results/report.json").read_text())
    for entry in doc["results"]:
        file = workdir / f"runs/baseline/{entry['encoder'].split('@')[1]}.onnx"
        assert (
            entry["provenance"]["checkpoint_hash"] == hashlib.sha256(file.read_bytes()).hexdigest()
        )
    assert (workdir / "results/embeddings/market/run@epoch_10/gallery.zarr").is_dir()
    assert planned(workdir) == {}


def test_a_new_checkpoint_runs_only_its_jobs_then_a_removed_one_leaves_the_report(workdir):
    new = workdir / "runs/baseline/epoch_3.onnx"
    write_model(new, seed=3)
    assert planned(workdir) == NEW_CHECKPOINT
    run_ok(workdir, CONFIG)
    assert reported(workdir) == ["run@epoch_2", "run@epoch_3", "run@epoch_10"]
    (workdir / "runs/baseline/epoch_10.onnx").unlink()
    assert planned(workdir) == {"report": 1, "all": 1}
    run_ok(workdir, CONFIG)
    assert reported(workdir) == ["run@epoch_2", "run@epoch_3"]


def test_a_dataset_naming_the_entry_gets_the_whole_sweep(workdir):
    config = copy.deepcopy(CONFIG)
    config["encoders"]["pixels"] = {"kind": "pixels", "options": {"size": [8, 4]}}
    config["datasets"]["market"]["encoders"] = ["run"]
    assert planned(workdir, config) == {}  # every checkpoint of `run`, and not pixels


def test_a_dataset_can_name_one_checkpoint_of_a_sweep(workdir):
    """`encoders: [run@epoch_2]`, the name the sweep gives that file, was refused as
    "cannot be a folder name"; now that checkpoint alone (here the report changes only:
    the other one drops out), and a stem the sweep does not have is named."""
    config = copy.deepcopy(CONFIG)
    config["datasets"]["market"]["encoders"] = ["run@epoch_2"]
    assert planned(workdir, config) == {"report": 1, "all": 1}
    config["datasets"]["market"]["encoders"] = ["run@epoch_9"]
    lines = error_lines(snakemake(workdir, config, "--dry-run"))
    assert len(lines) == 1, lines
    assert (
        "datasets.market.encoders: 'run@epoch_9': the sweep 'run' has no checkpoint 'epoch_9'"
        in lines[0]
    ), lines
    config["datasets"]["market"]["encoders"] = ["run@@x"]
    lines = error_lines(snakemake(workdir, config, "--dry-run"))
    assert len(lines) == 1 and "is neither an encoder name nor entry@name" in lines[0], lines


def test_a_glob_matching_nothing_names_the_pattern(workdir):
    config = copy.deepcopy(CONFIG)
    config["encoders"]["run"]["checkpoints"] = "runs/baseline/epoch_*.pth"
    lines = error_lines(snakemake(workdir, config, "--dry-run"))
    assert len(lines) == 1, lines
    assert "encoders.run.checkpoints: 'runs/baseline/epoch_*.pth' matches no file" in lines[0]


def test_lightning_and_hugging_face_checkpoints_run_under_their_sweep_names(tmp_path):
    """A real run over PyTorch Lightning's file names (``epoch=1-step=100``: ``=`` as
    ``-``) and Hugging Face's folders (``checkpoint-500/model.*``: one stem, named by
    the folder): each file is one encoder, in step order; the report's provenance and
    its CSV's checkpoint column keep the file as it is named; nothing is left to do."""
    files = {
        "pl@epoch-0-step-50": "lightning_logs/version_0/checkpoints/epoch=0-step=50.onnx",
        "pl@epoch-1-step-100": "lightning_logs/version_0/checkpoints/epoch=1-step=100.onnx",
        "hf@checkpoint-500-model": "hf/checkpoint-500/model.onnx",
        "hf@checkpoint-1000-model": "hf/checkpoint-1000/model.onnx",
    }
    for seed, file in enumerate(files.values()):
        write_model(tmp_path / file, seed=seed)
    config = copy.deepcopy(CONFIG)
    config["encoders"] = {
        "pl": {**CONFIG["encoders"]["run"], "checkpoints": "lightning_logs/*/checkpoints/*.onnx"},
        "hf": {**CONFIG["encoders"]["run"], "checkpoints": "hf/checkpoint-*/model.onnx"},
    }
    assert planned(tmp_path, config) == {"prepare": 1, "encode": 8, "rank": 4, "metrics": 4,
                                         "report": 1, "all": 1}  # fmt: skip
    run_ok(tmp_path, config)
    assert reported(tmp_path) == list(files)
    doc = json.loads((tmp_path / "results/report.json").read_text())
    for entry in doc["results"]:
        file = files[entry["encoder"]]
        assert entry["provenance"]["checkpoint"] == file
        digest = hashlib.sha256((tmp_path / file).read_bytes()).hexdigest()
        assert entry["provenance"]["checkpoint_hash"] == digest
    with open(tmp_path / "results/report.csv", newline="") as f:
        rows = {(row["encoder"], row["checkpoint"]) for row in csv.DictReader(f)}
    assert rows == set(files.items())
    assert (tmp_path / "results/metrics/market/pl@epoch-1-step-100.json").is_file()
    assert planned(tmp_path, config) == {}


def test_a_new_run_repeating_an_epoch_reruns_only_that_epoch(tmp_path):
    """`runs/*/epoch_*.onnx`: a second run folder whose epoch_2 repeats the first run's
    renames that one file (run@a-epoch_2) and adds its own (run@b-epoch_2): exactly
    their jobs are planned; epoch_1 keeps its name and its results (it used to be
    renamed too, and so evaluated again)."""
    for seed, epoch in enumerate((1, 2)):
        write_model(tmp_path / f"runs/a/epoch_{epoch}.onnx", seed=seed)
    config = copy.deepcopy(CONFIG)
    config["encoders"]["run"]["checkpoints"] = "runs/*/epoch_*.onnx"
    run_ok(tmp_path, config)
    assert reported(tmp_path) == ["run@epoch_1", "run@epoch_2"]
    write_model(tmp_path / "runs/b/epoch_2.onnx", seed=5)
    # two checkpoints' jobs (the renamed one, the new one), one report
    assert planned(tmp_path, config) == {"encode": 4, "rank": 2, "metrics": 2, "report": 1,
                                         "all": 1}  # fmt: skip
    run_ok(tmp_path, config)
    assert reported(tmp_path) == ["run@epoch_1", "run@a-epoch_2", "run@b-epoch_2"]
    assert planned(tmp_path, config) == {}
