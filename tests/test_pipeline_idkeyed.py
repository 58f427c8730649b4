"""Id-keyed precomputed features in the pipeline: real Snakemake runs in a temporary folder.

- a precomputed encoder with ids (a .npy + ids CSV for the query, a Zarr group with an
  ``ids`` array for the gallery, both shuffled, rows missing, unknown ids present) and
  ``on_missing: drop``: report.json's numbers equal ``rankwise.evaluate`` on the
  manifests cut down by hand, and the report's dataset header says how many rows were
  dropped;
- new bytes in an ids file rerun that split's encode and what follows;
- under ``on_missing: error`` the missing ids fail the encode job: its one-line error
  reaches the terminal, no embedding store is written;
- an ids file the config names that does not exist stops the run before any job.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import helpers
import numpy as np
import pandas as pd
import pytest
import zarr
from conftest import reid_case
from helpers import planned_jobs

from rankwise import evaluate
from rankwise.report.markdown import _escape

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"

ENCODER = {
    "kind": "precomputed",
    "options": {
        "query": "feat/query.npy",
        "query_ids": "feat/query_ids.csv",
        "ids_column": "image",
        "gallery": "feat/gallery.zarr",
        "on_missing": "drop",
    },
}
CONFIG = {
    "datasets": {
        "own": {
            "loader": "manifest",
            "options": {"query": "data/query.csv", "gallery": "data/gallery.csv"},
            "protocol": "reid",
            "distance": "cosine",
            "ks": [1, 5],
        }
    },
    "encoders": {"byid": ENCODER},
    "engine": {"threads": 1},
    "report": {"resamples": 0},
}
DROPPED = {"query": 2, "gallery": 4}


def write_data(root: Path):
    """Manifests, and shuffled features with ids for all but DROPPED rows of each split."""
    case = reid_case(distance="cosine", kind="float", seed=5)
    (root / "data").mkdir(parents=True)
    (root / "feat").mkdir()
    case.query.to_csv(root / "data/query.csv", index=False)
    case.gallery.to_csv(root / "data/gallery.csv", index=False)
    rng = np.random.default_rng(1)
    kept = {}
    for split, table, vectors in (
        ("query", case.query, case.query_emb),
        ("gallery", case.gallery, case.gallery_emb),
    ):
        keep = np.sort(rng.choice(len(table), len(table) - DROPPED[split], replace=False))
        kept[split] = keep
        ids = np.array([*table["id"].to_numpy()[keep], "unknown-1"], dtype=object)
        feats = np.concatenate([vectors[keep], vectors[:1]]).astype(np.float32)
        order = rng.permutation(len(ids))
        if split == "query":
            np.save(root / "feat/query.npy", feats[order])
            pd.DataFrame({"n": range(len(ids)), "image": ids[order]}).to_csv(
                root / "feat/query_ids.csv", index=False
            )
        else:
            group = zarr.open_group(str(root / "feat/gallery.zarr"), mode="w")
            group.create_array("embeddings", data=feats[order])
            group.create_array("ids", shape=(len(ids),), dtype=str)[:] = ids[order]
    return case, kept


def snakemake(workdir: Path, config: dict, *args: str):
    return helpers.snakemake(workdir, config, *args, replace=True)


def run_ok(workdir: Path, config: dict, *args: str) -> str:
    proc = snakemake(workdir, config, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("idkeyed")
    case, kept = write_data(path)
    run_ok(path, CONFIG)
    return path, case, kept


def test_drop_numbers_equal_the_manifests_cut_by_hand(workdir):
    path, case, kept = workdir
    report = json.loads((path / "results/report.json").read_text())
    entry = next(e for e in report["results"] if e["encoder"] == "byid")
    q_cut = case.query.iloc[kept["query"]].reset_index(drop=True)
    g_cut = case.gallery.iloc[kept["gallery"]].reset_index(drop=True)
    expected = evaluate(
        q_cut,
        g_cut,
        case.query_emb[kept["query"]],
        case.gallery_emb[kept["gallery"]],
        protocol="reid",
        distance="cosine",
        ks=(1, 5),
    )
    assert entry["metrics"].keys() == expected.metrics.keys()
    for name, value in expected.metrics.items():
        assert entry["metrics"][name] == pytest.approx(value, abs=1e-12), name
    assert (entry["num_queries"], entry["num_skipped"], entry["num_gallery"]) == (
        expected.num_queries,
        expected.num_skipped,
        expected.num_gallery,
    )
    aligned = entry["provenance"]["id_alignment"]
    assert aligned["query"]["dropped_rows"] == DROPPED["query"]
    assert aligned["gallery"]["dropped_rows"] == DROPPED["gallery"]
    assert aligned["query"]["ignored_features"] == aligned["gallery"]["ignored_features"] == 1
    note = (
        "Manifest rows without features left out (on_missing: drop): byid: "
        f"{DROPPED['query']} of {len(case.query)} query and {DROPPED['gallery']} of "
        f"{len(case.gallery)} gallery rows."
    )
    assert _escape(note) in (path / "results/report.md").read_text()  # "on\\_missing"
    assert note in (path / "results/report.html").read_text()


def test_new_bytes_in_an_ids_file_rerun_that_split(workdir):
    path, _, _ = workdir
    assert planned_jobs(run_ok(path, CONFIG, "--dry-run")) == {}
    ids = path / "feat/query_ids.csv"
    original = ids.read_bytes()
    try:
        ids.write_bytes(original)  # same bytes, new mtime: nothing to do
        assert planned_jobs(run_ok(path, CONFIG, "--dry-run")) == {}
        table = pd.read_csv(ids, dtype=str)
        table["n"] = table["n"] + "0"  # other bytes, same ids
        table.to_csv(ids, index=False)
        jobs = planned_jobs(run_ok(path, CONFIG, "--dry-run"))
        assert jobs == {"encode": 1, "rank": 1, "metrics": 1, "report": 1, "all": 1}
    finally:
        ids.write_bytes(original)


def test_missing_ids_under_error_fail_the_encode_job_in_one_line(tmp_path):
    write_data(tmp_path)
    config = copy.deepcopy(CONFIG)
    config["encoders"]["byid"]["options"]["on_missing"] = "error"
    proc = snakemake(tmp_path, config)
    assert proc.returncode != 0
    logs = sorted((tmp_path / "logs/embeddings/own/byid").glob("*.log"))
    last = {log.stem: log.read_text().strip().splitlines()[-1] for log in logs}
    assert last, proc.stderr
    line = next(iter(last.values()))
    assert line.startswith("error: ")
    assert "have no feature row, e.g." in line and "on_missing: drop" in line
    assert line in proc.stderr  # the log's last line, verbatim, on the terminal
    for split in ("query", "gallery"):
        store = tmp_path / f"results/embeddings/own/byid/{split}.zarr"
        assert not store.exists() and not store.with_name(f"{split}.zarr.tmp").exists()
    assert not (tmp_path / "results/report.json").exists()


def test_a_missing_ids_file_fails_before_any_job(tmp_path):
    write_data(tmp_path)
    config = copy.deepcopy(CONFIG)
    config["encoders"]["byid"]["options"]["query_ids"] = "feat/typo.csv"
    proc = snakemake(tmp_path, config)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode != 0 and len(lines) == 1, lines
    assert "encoders.byid.options.query_ids: feat/typo.csv not found" in lines[0]
    assert not (tmp_path / "results").exists()
