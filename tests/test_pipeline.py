"""The Snakemake workflow, run for real on tiny offline data (about a minute on 2 cores).

One full run in a temporary working directory, then dry runs (`--dry-run`) with changed
configs or files to check which jobs Snakemake would rerun:

- a second run has nothing to do; engine settings (threads, tiles) rerun nothing;
- a new encoder runs only its encode/rank/metrics jobs and the report;
- new `ks` rerun only metrics and the report; new protocol options rerun rank;
- new bytes in a checkpoint rerun its encode and downstream; touching it reruns nothing;
- the numbers in report.json equal `rankwise evaluate` on the same embeddings.

Snakemake runs as a subprocess (`python -m snakemake`): its Python API changes between
9.x minor versions.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import helpers
import numpy as np
import pytest
import yaml
from helpers import planned_jobs

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

CONFIG = {
    "datasets": {
        "market": {
            "loader": "demo-market",
            "options": {
                "seed": 1,
                "identities": 8,
                "cameras": 3,
                "images_per_camera": 2,
                "queries_per_identity": 1,
                "distractors": 6,
                "junk": 4,
                "height": 16,
                "width": 8,
            },
            "protocol": "reid",
            "distance": "euclidean",
            "ks": [1, 5],
        },
        "sketches": {
            "loader": "demo-progressive",
            "options": {"seed": 0, "targets": 12, "sketches": 6, "steps": 3, "scale": 1},
            "protocol": "progressive",
            "ks": [1, 3],
            "encoders": ["pixels"],
        },
    },
    "encoders": {
        "pixels": {"kind": "pixels", "options": {"size": [16, 8]}},
        "net": {
            "kind": "onnx",
            "options": {"model": "checkpoints/net.onnx", "input_size": [16, 8]},
        },
    },
    # uneven tiles: the numbers must not depend on them
    "engine": {"threads": 1, "query_block": 5, "gallery_chunk": 7, "batch_size": 4},
    "report": {"cmc_max_rank": 20},
}


def write_model(path: Path, seed: int) -> None:
    """A tiny ONNX encoder: (N, 3, 16, 8) -> Flatten -> MatMul (384 x 12)."""
    from onnx import TensorProto, helper, numpy_helper

    weights = np.random.default_rng(seed).normal(size=(3 * 16 * 8, 12)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["embeddings"]),
        ],
        "net",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, 16, 8])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["N", 12])],
        initializer=[numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True):
    """Run Snakemake on `config` in `workdir`; returns the CompletedProcess."""
    proc = helpers.snakemake(workdir, config, *args, configfile="config.yaml")
    if check and proc.returncode != 0:
        pytest.fail(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def planned(workdir: Path, config: dict) -> dict[str, int]:
    """rule -> number of jobs a dry run schedules ({} when there is nothing to do)."""
    proc = snakemake(workdir, config, "--dry-run")
    return planned_jobs(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory after one complete run of CONFIG."""
    path = tmp_path_factory.mktemp("pipeline")
    write_model(path / "checkpoints" / "net.onnx", seed=0)
    snakemake(path, CONFIG)
    return path


def changed(**datasets_market) -> dict:
    config = copy.deepcopy(CONFIG)
    config["datasets"]["market"].update(datasets_market)
    return config


# ---------------------------------------------------------------- the run


def test_first_run_writes_every_stage(workdir):
    pairs = [("market", "pixels"), ("market", "net"), ("sketches", "pixels")]
    for dataset in ("market", "sketches"):
        for split in ("query", "gallery"):
            assert (workdir / f"results/manifests/{dataset}/{split}.csv").is_file()
    for dataset, encoder in pairs:
        for split in ("query", "gallery"):
            assert (workdir / f"results/embeddings/{dataset}/{encoder}/{split}.zarr").is_dir()
            assert (workdir / f"logs/embeddings/{dataset}/{encoder}/{split}.log").is_file()
        assert (workdir / f"results/ranks/{dataset}/{encoder}.zarr").is_dir()
        assert (workdir / f"results/metrics/{dataset}/{encoder}.txt").is_file()
        assert (workdir / f"results/benchmarks/ranks/{dataset}/{encoder}.tsv").is_file()
    # `encoders: [pixels]` restricts the sketches dataset
    assert not (workdir / "results/ranks/sketches/net.zarr").exists()
    for name in ("report.html", "report.md", "report.json", "report.csv", "report.tex"):
        assert (workdir / "results" / name).is_file()
    doc = json.loads((workdir / "results/report.json").read_text())
    assert [(r["dataset"], r["encoder"]) for r in doc["results"]] == pairs
    # every chart as a paper figure (SVG, PDF), listed in report.json
    charts = [(d, k) for d in ("market", "sketches") for k in ("metrics", "cmc")]
    charts.append(("sketches", "progressive"))
    written = {p.name for p in (workdir / "results/figures").iterdir()} - {".snakemake_timestamp"}
    assert written == {f"{d}-{k}.{fmt}" for d, k in charts for fmt in ("svg", "pdf")}
    assert sorted((f["dataset"], f["kind"], f["pdf"]) for f in doc["figures"]) == sorted(
        (d, k, f"results/figures/{d}-{k}.pdf") for d, k in charts
    )


def test_lint_is_clean(workdir):
    proc = snakemake(workdir, CONFIG, "--lint", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


# ---------------------------------------------------------------- rerun semantics


def test_second_run_has_nothing_to_do(workdir):
    assert planned(workdir, CONFIG) == {}


def test_engine_settings_rerun_nothing(workdir):
    config = copy.deepcopy(CONFIG)
    config["engine"] = {"threads": 2, "query_block": 64, "gallery_chunk": 1000, "batch_size": 16}
    assert planned(workdir, config) == {}


def test_new_encoder_runs_only_its_jobs(workdir):
    config = copy.deepcopy(CONFIG)
    config["encoders"]["gray"] = {"kind": "pixels", "options": {"size": [8, 4], "grayscale": True}}
    # only on `market`: `sketches` is restricted to [pixels]
    assert planned(workdir, config) == {"encode": 2, "rank": 1, "metrics": 1, "report": 1, "all": 1}


def test_new_ks_rerun_only_metrics(workdir):
    assert planned(workdir, changed(ks=[1, 3, 10])) == {"metrics": 2, "report": 1, "all": 1}


def test_new_ap_variant_reruns_only_metrics(workdir):
    assert planned(workdir, changed(ap="trapezoid")) == {"metrics": 2, "report": 1, "all": 1}


@pytest.mark.parametrize(
    "option",
    [
        {"distance": "cosine"},
        {"junk_labels": []},
        {"exclude_same_camera": False},
        {"multi_query": "mean"},
        {"single_gallery_shot": True},
        {"protocol": "recall"},
        {"rerank": {"k1": 6, "k2": 3, "lambda": 0.3}},
        {"aqe": {"k": 3, "alpha": 3.0}},
    ],
)
def test_new_protocol_options_rerun_rank(workdir, option):
    assert planned(workdir, changed(**option)) == {"rank": 2, "metrics": 2, "report": 1, "all": 1}


def test_new_loader_options_rerun_everything_of_the_dataset(workdir):
    assert planned(
        workdir, changed(options={**CONFIG["datasets"]["market"]["options"], "seed": 2})
    ) == {"prepare": 1, "encode": 4, "rank": 2, "metrics": 2, "report": 1, "all": 1}


def test_checkpoint_bytes_not_mtime_decide(workdir):
    model = workdir / "checkpoints" / "net.onnx"
    original = model.read_bytes()
    stamp = model.stat().st_mtime_ns
    try:
        # touched: same bytes, newer mtime -> nothing
        os.utime(model, ns=(stamp + 10**10, stamp + 10**10))
        assert planned(workdir, CONFIG) == {}
        # new bytes (another "epoch") -> its encode jobs and what follows
        write_model(model, seed=1)
        assert model.read_bytes() != original
        assert planned(workdir, CONFIG) == {
            "encode": 2,
            "rank": 1,
            "metrics": 1,
            "report": 1,
            "all": 1,
        }
    finally:
        model.write_bytes(original)
    # the original bytes back, with yet another mtime -> nothing again
    assert planned(workdir, CONFIG) == {}


def test_report_statistics_rerun_metrics_other_report_keys_only_the_report(workdir):
    # the intervals, CMC and per-query values are computed in the metrics jobs
    config = copy.deepcopy(CONFIG)
    config["report"] = {**CONFIG["report"], "resamples": 500}
    assert planned(workdir, config) == {"metrics": 3, "report": 1, "all": 1}
    config["report"] = {**CONFIG["report"], "title": "Another title", "top_k": 3}
    assert planned(workdir, config) == {"report": 1, "all": 1}


def test_report_assembles_the_metrics_jobs_statistics(workdir, tmp_path, monkeypatch):
    from rankwise.report import build_report

    doc = json.loads((workdir / "results/report.json").read_text())
    assert (
        "paired tests: 1 computed, 0 extended, 0 reused"
        in (workdir / "logs/report.log").read_text()
    )  # market: pixels vs net; sketches has one encoder
    copies = []
    for entry in doc["results"]:
        raw = entry["provenance"]["raw"]
        assert (workdir / raw["stats"]).is_file()
        data = json.loads((workdir / entry["source"]).read_text())
        del data["provenance"]["stats"]  # this copy makes the report read the ranks store
        copy_path = tmp_path / entry["dataset"] / f"{entry['encoder']}.json"
        copy_path.parent.mkdir(exist_ok=True)
        copy_path.write_text(json.dumps(data))
        copies.append(copy_path)
    monkeypatch.chdir(workdir)  # the provenance's paths are relative to the run folder
    stats = doc["statistics"]
    scratch = build_report(
        copies,
        title=CONFIG.get("report", {}).get("title", "rankwise report"),
        cmc_max_rank=doc["cmc_max_rank"],
        resamples=stats["resamples"],
        seed=stats["seed"],
        by=stats["by"],
    )
    for key in ("comparisons", "best"):
        assert scratch[key] == doc[key], key
    for ours, theirs in zip(doc["results"], scratch["results"], strict=True):
        for key in ("metrics", "ci95", "cmc", "progressive", "worst_queries"):
            assert ours[key] == theirs[key], key


def test_new_encoder_computes_only_its_paired_tests(workdir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(workdir, run, symlinks=True)
    config = copy.deepcopy(CONFIG)
    config["encoders"]["gray"] = {"kind": "pixels", "options": {"size": [8, 4], "grayscale": True}}
    snakemake(run, config)
    log = (run / "logs/report.log").read_text()
    # market: pixels-gray and net-gray are new; pixels-net is kept (extended to the flips
    # of the larger report, or reused as it is)
    assert "paired tests: 2 computed" in log
    assert "3 results" not in log and "4 results" in log


# ---------------------------------------------------------------- numbers


def test_report_numbers_equal_evaluate(workdir, tmp_path):
    import zarr

    doc = json.loads((workdir / "results/report.json").read_text())
    assert len(doc["results"]) == 3
    for entry in doc["results"]:
        dataset, encoder = entry["dataset"], entry["encoder"]
        spec = CONFIG["datasets"][dataset]
        args = []
        for split in ("query", "gallery"):
            store = workdir / f"results/embeddings/{dataset}/{encoder}/{split}.zarr"
            npy = tmp_path / f"{dataset}-{encoder}-{split}.npy"
            np.save(npy, zarr.open_group(str(store), mode="r")["embeddings"][...])
            args += [
                f"--{split}",
                str(workdir / f"results/manifests/{dataset}/{split}.csv"),
                f"--{split}-embeddings",
                str(npy),
            ]
        out = tmp_path / f"{dataset}-{encoder}.json"
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "rankwise"),
                "evaluate",
                *args,
                "--protocol",
                spec["protocol"],
                "--distance",
                spec.get("distance", "cosine"),
                "--ks",
                ",".join(map(str, spec["ks"])),
                "--output",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        expected = json.loads(out.read_text())
        assert entry["metrics"] == pytest.approx(expected["metrics"], abs=1e-9)
        for key in (
            "protocol",
            "distance",
            "num_queries",
            "num_skipped",
            "num_gallery",
            "embedding_dim",
        ):
            assert entry[key] == expected[key], key
        prov = entry["provenance"]
        if encoder == "net":
            digest = hashlib.sha256((workdir / "checkpoints/net.onnx").read_bytes()).hexdigest()
            assert prov["checkpoint_hash"] == digest
        assert prov["manifest_hash"]["query"] and prov["manifest_hash"]["gallery"]


# ---------------------------------------------------------------- config


def test_misspelt_key_is_an_error(tmp_path):
    config = copy.deepcopy(CONFIG)
    config["datasets"]["market"]["distanse"] = "cosine"
    proc = snakemake(tmp_path, config, "--dry-run", check=False)
    assert proc.returncode != 0
    assert "distanse" in proc.stdout + proc.stderr


def test_unknown_encoder_in_dataset_list_is_an_error(tmp_path):
    config = copy.deepcopy(CONFIG)
    config["datasets"]["sketches"]["encoders"] = ["pixles"]
    proc = snakemake(tmp_path, config, "--dry-run", check=False)
    assert proc.returncode != 0
    assert "pixles" in proc.stdout + proc.stderr


def _schema():
    return yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())


@pytest.mark.parametrize(
    "path",
    [
        "config/config.yaml",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "config/examples").glob("*.yaml")),
    ],
)
def test_shipped_configs_are_valid(path):
    from jsonschema import Draft202012Validator

    from rankwise.pipeline_config import load_yaml, mark_sweeps

    config = load_yaml(ROOT / path)  # no duplicated keys either
    mark_sweeps(config.get("encoders") or {})  # a sweep's file stands in for its option
    Draft202012Validator(_schema()).validate(config)


def test_schema_defaults_match_the_package():
    from rankwise import datasets, demo, encoders

    defs = _schema()["$defs"]

    def defaults(name):
        return {k: v["default"] for k, v in defs[name]["properties"].items() if "default" in v}

    for loader, values in demo.DEFAULTS.items():
        assert defaults("loader_" + loader.replace("-", "_")) == values, loader
    for loader in ("market1501", "msmt17", "folder", "manifest"):
        expected = {
            k: v
            for k, v in datasets.LOADERS[loader].defaults.items()
            if not (loader == "manifest" and k == "protocol")
        }
        assert defaults("loader_" + loader) == expected, loader
    for kind, values in encoders.DEFAULTS.items():
        assert defaults("encoder_" + kind.replace("-", "_")) == values, kind
