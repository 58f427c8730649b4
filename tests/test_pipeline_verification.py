"""Verification metrics in the pipeline and the report, run for real (Snakemake subprocess).

A dataset with ``verification: {fprs, bins}`` gets a ``verify`` job per encoder
(results/verification/<dataset>/<encoder>.json, equal to the library on the same
stores); the report shows TPR@FPR (HTML, Markdown, CSV, JSON) and draws the ROC curves
and distance histograms (also as paper figures).  Changing the levels reruns only
verify and the report; metrics settings never rerun verify; a dataset without it has
no verify job.  Bad settings and mismatched files: one line.
"""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import helpers
import pytest
from helpers import planned_jobs, run_rankwise

from rankwise.verification import tpr_at_fpr

CONFIG = {
    "datasets": {
        "market": {
            "loader": "demo-market",
            "options": {
                "seed": 2,
                "identities": 10,
                "cameras": 3,
                "images_per_camera": 2,
                "queries_per_identity": 1,
                "distractors": 8,
                "junk": 4,
                "height": 16,
                "width": 8,
            },
            "protocol": "reid",
            "distance": "euclidean",
            "ks": [1, 5],
            "verification": {"fprs": [0.01, 0.1], "bins": 12},
        },
        "plain": {
            "loader": "demo-market",
            "options": {"seed": 3, "identities": 6, "height": 16, "width": 8},
            "protocol": "reid",
            "encoders": ["pixels"],
        },
    },
    "encoders": {
        "pixels": {"kind": "pixels", "options": {"size": [16, 8]}},
        "hist": {"kind": "color-histogram", "options": {"bins": 4}},
    },
    "engine": {"threads": 1, "query_block": 5, "gallery_chunk": 7, "batch_size": 8},
    "report": {"cmc_max_rank": 10, "resamples": 200},
}


def snakemake(workdir: Path, config: dict, *args: str):
    proc = helpers.snakemake(workdir, config, *args, configfile="config.yaml")
    return proc


def planned(workdir: Path, config: dict) -> dict[str, int]:
    proc = snakemake(workdir, config, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return planned_jobs(proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("verification")
    proc = snakemake(path, CONFIG)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return path


def changed(**market) -> dict:
    config = copy.deepcopy(CONFIG)
    config["datasets"]["market"].update(market)
    return config


def test_verify_jobs_equal_the_library_on_the_same_stores(workdir):
    results = workdir / "results"
    assert sorted(p.name for p in (results / "verification").iterdir()) == ["market"]
    for encoder in ("pixels", "hist"):
        got = json.loads((results / f"verification/market/{encoder}.json").read_text())
        stores = [results / f"embeddings/market/{encoder}/{s}.zarr" for s in ("query", "gallery")]
        manifests = [results / f"manifests/market/{s}.csv" for s in ("query", "gallery")]
        want = tpr_at_fpr(
            *manifests, *stores, protocol="reid", distance="euclidean", fprs=(0.01, 0.1), bins=12
        )
        inputs = got.pop("inputs")
        assert got == json.loads(json.dumps(want))
        assert inputs["gallery_embeddings"] == f"results/embeddings/market/{encoder}/gallery.zarr"
        assert len(got["histogram"]["positive"]) == 12


def test_report_shows_tpr_roc_and_histograms(workdir):
    results = workdir / "results"
    doc = json.loads((results / "report.json").read_text())
    for entry in doc["results"]:
        if entry["dataset"] == "plain":
            assert entry["verification"] is None
            continue
        path = results / f"verification/market/{entry['encoder']}.json"
        assert entry["verification"] == json.loads(path.read_text())
    md = (results / "report.md").read_text()
    pixels = json.loads((results / "verification/market/pixels.json").read_text())
    assert "| encoder | TPR@FPR=0.01 | TPR@FPR=0.1 |" in md
    assert f"{pixels['tpr@fpr']['0.1']:.2f}" in md
    assert f"{pixels['num_negative_pairs']:,} negative pairs" in md
    html = (results / "report.html").read_text()
    assert "TPR@FPR=0.01" in html and "ROC curves on market" in html
    rows = list(csv.DictReader(io.StringIO((results / "report.csv").read_text())))
    tpr = {(r["encoder"], r["metric"]): float(r["value"]) for r in rows if "tpr" in r["metric"]}
    assert tpr[("pixels", "tpr@fpr=0.1")] == pixels["tpr@fpr"]["0.1"]
    assert {k for _, k in tpr} == {"tpr@fpr=0.01", "tpr@fpr=0.1"}
    kinds = {(f["dataset"], f["kind"]) for f in doc["figures"]}
    assert {("market", "roc"), ("market", "distances")} <= kinds
    assert ("plain", "roc") not in kinds
    for kind in ("roc", "distances"):
        for fmt in ("svg", "pdf"):
            assert (results / f"figures/market-{kind}.{fmt}").stat().st_size > 1000


def test_second_run_has_nothing_to_do(workdir):
    assert planned(workdir, CONFIG) == {}


def test_engine_settings_rerun_nothing(workdir):
    config = copy.deepcopy(CONFIG)
    config["engine"] = {"threads": 2, "query_block": 64, "gallery_chunk": 1000, "batch_size": 16}
    assert planned(workdir, config) == {}


def test_new_levels_rerun_only_verify_and_the_report(workdir):
    config = changed(verification={"fprs": [0.001, 0.1], "bins": 12})
    assert planned(workdir, config) == {"verify": 2, "report": 1, "all": 1}


def test_metrics_settings_never_rerun_verify(workdir):
    assert planned(workdir, changed(ks=[1, 3])) == {"metrics": 2, "report": 1, "all": 1}


def test_protocol_options_rerun_rank_and_verify(workdir):
    assert planned(workdir, changed(exclude_same_camera=False)) == {
        "rank": 2,
        "metrics": 2,
        "verify": 2,
        "report": 1,
        "all": 1,
    }


def test_switching_it_off_reruns_only_the_report(workdir):
    assert planned(workdir, changed(verification=None)) == {"report": 1, "all": 1}


@pytest.mark.parametrize(
    "setting,message",
    [
        ({"verification": {"fprs": [0.0]}}, "fprs"),
        ({"verification": {"fprs": [1e-3], "bins": 0}}, "bins"),
        ({"verification": {"fpr": [1e-3]}}, "fpr"),
        (
            {"verification": {"fprs": [1e-3]}, "multi_query": "mean"},
            "verification does not combine with multi_query",
        ),
        (
            {"verification": {"fprs": [1e-3]}, "protocol": "progressive"},
            "verification does not apply to protocol 'progressive'",
        ),
    ],
)
def test_bad_settings_are_one_line(tmp_path, setting, message):
    config = copy.deepcopy(CONFIG)
    market = config["datasets"]["market"]
    market.update(setting)
    if setting.get("protocol") == "progressive":
        market["loader"] = "demo-progressive"
        market["options"] = {"seed": 0}
    proc = snakemake(tmp_path, config, "--dry-run")
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()]
    assert errors and message in errors[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_report_refuses_a_verification_file_of_other_embeddings(workdir, tmp_path):
    results = workdir / "results"
    other = tmp_path / "market" / "pixels.json"
    other.parent.mkdir()
    data = json.loads((results / "verification/market/hist.json").read_text())
    other.write_text(json.dumps(data))  # hist's numbers under pixels' name
    proc = run_rankwise(
        "report", "results/metrics/market/pixels.json", "--verification", other,
        "--json", tmp_path / "r.json", "--resamples", "0", "--worst-queries", "0",
        cwd=workdir,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "computed from query_embeddings" in lines[0]
    assert not (tmp_path / "r.json").exists()
    # a file for a pair the report does not hold
    lost = tmp_path / "nowhere" / "pixels.json"
    lost.parent.mkdir()
    lost.write_text(json.dumps(data))
    proc = run_rankwise(
        "report", "results/metrics/market/pixels.json", "--verification", lost,
        "--json", tmp_path / "r.json", "--resamples", "0", cwd=workdir,
    )  # fmt: skip
    assert proc.returncode == 2 and "no metrics file of dataset 'nowhere'" in proc.stderr
