"""`rankwise report`: files, self-contained HTML, JSON provenance, CMC, errors.

Inputs are made the way the pipeline makes them: embedding stores with provenance
attributes, `rankwise rank`, then `rankwise metrics`, in the layout
results/metrics/<dataset>/<encoder>.json.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rankwise import __version__
from rankwise.cli import main
from rankwise.report import build_report, cmc_curve
from rankwise.store import write_embeddings, write_ranks

ENCODERS = {"enc-a": 0.3, "enc-b": 1.5}  # name -> noise: two encoders of different quality
CHECKPOINT = {"enc-a": "a1" * 32, "enc-b": "b2" * 32}


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _manifests(folder: Path, protocol: str, rng) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """Toy manifests and 'true' embeddings: 8 labels, 4 gallery items each."""
    folder.mkdir(parents=True, exist_ok=True)
    centres = rng.normal(size=(8, 6))
    g_labels = np.repeat(np.arange(8), 4)
    g_lines = ["id,label"] + [f"g{i},{lab}" for i, lab in enumerate(g_labels)]
    if protocol == "progressive":  # each sketch: 3 steps of one label
        q_labels = np.repeat(np.arange(8), 3)
        q_lines = ["id,label,sketch,step"] + [
            f"q{i},{lab},s{lab},{i % 3 + 1}" for i, lab in enumerate(q_labels)]
    else:
        q_labels = np.arange(8)
        q_lines = ["id,label"] + [f"q{i},{lab}" for i, lab in enumerate(q_labels)]
    (folder / "query.csv").write_text("\n".join(q_lines) + "\n")
    (folder / "gallery.csv").write_text("\n".join(g_lines) + "\n")
    return folder / "query.csv", folder / "gallery.csv", centres[q_labels], centres[g_labels]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """results/ with two datasets (recall, progressive) x two encoders, ks 1,2,5."""
    root = tmp_path_factory.mktemp("report") / "results"
    rng = np.random.default_rng(0)
    metrics = []
    for dataset, protocol in (("toy", "recall"), ("sketchy", "progressive")):
        q_csv, g_csv, q_true, g_true = _manifests(root / "manifests" / dataset, protocol, rng)
        for encoder, noise in ENCODERS.items():
            stores = {}
            for split, csv, true in (("query", q_csv, q_true), ("gallery", g_csv, g_true)):
                emb = (true + noise * rng.normal(size=true.shape)).astype(np.float32)
                stores[split] = root / "embeddings" / dataset / encoder / f"{split}.zarr"
                write_embeddings(stores[split], iter([emb]), len(emb), attrs={
                    "encoder": {"kind": "onnx", "options": {"model": f"{encoder}.onnx"}},
                    "checkpoint": f"{encoder}.onnx", "checkpoint_hash": CHECKPOINT[encoder],
                    "manifest_hash": f"{split}-hash", "manifest": str(csv),
                    "num_rows": len(emb), "rankwise_version": __version__})
            ranks = root / "ranks" / dataset / f"{encoder}.zarr"
            invoke("rank", "--query", q_csv, "--gallery", g_csv, "--query-embeddings",
                   stores["query"], "--gallery-embeddings", stores["gallery"], "--protocol",
                   protocol, "--out", ranks)
            out = root / "metrics" / dataset / f"{encoder}.json"
            invoke("metrics", ranks, "--ks", "1,2,5", "--output", out)
            metrics.append(out)
    return root, metrics


@pytest.fixture(scope="module")
def report(results):
    root, metrics = results
    invoke("report", *metrics, "--out-dir", root, "--title", "Toy <report>",
           "--cmc-max-rank", "20")
    return root


def test_writes_the_three_files(report):
    for name in ("report.html", "report.md", "report.json"):
        assert (report / name).stat().st_size > 0


def test_html_is_self_contained(report):
    text = (report / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    links = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", text, flags=re.I)
    assert links, "expected embedded plots"
    assert all(link.startswith(("data:", "#")) for link in links), links
    assert not re.search(r"<(script|link|iframe)\b|url\(|@import", text, flags=re.I)
    # per dataset: a metrics bar chart and a CMC plot, as inline PNG
    assert text.count('src="data:image/png;base64,') == 4
    assert "Toy &lt;report&gt;" in text and "Toy <report>" not in text


def test_json_has_every_metric_and_provenance(results, report):
    _, metrics = results
    doc = json.loads((report / "report.json").read_text())
    assert doc["datasets"] == ["toy", "sketchy"]
    assert doc["encoders"] == list(ENCODERS)
    assert len(doc["results"]) == 4
    for path, entry in zip(metrics, doc["results"]):
        source = json.loads(path.read_text())
        assert (entry["dataset"], entry["encoder"]) == (path.parent.name, path.stem)
        assert entry["metrics"] == source["metrics"]
        for key in ("protocol", "distance", "num_queries", "num_skipped", "num_gallery",
                    "embedding_dim"):
            assert entry[key] == source[key]
        prov = entry["provenance"]
        assert prov["encoder"] == entry["encoder"]
        assert prov["encoder_kind"] == "onnx"
        assert prov["checkpoint_hash"] == CHECKPOINT[entry["encoder"]]
        assert prov["manifest_hash"] == {"query": "query-hash", "gallery": "gallery-hash"}
        assert prov["rankwise_version"] == __version__
        assert prov["protocol"] == entry["protocol"]
        assert isinstance(prov["protocol_options"], dict)
        assert prov["ks"] == [1, 2, 5]
        assert Path(prov["files"]["ranks"]).is_dir()


def test_cmc_agrees_with_rank_k(report):
    doc = json.loads((report / "report.json").read_text())
    for entry in doc["results"]:
        cmc = entry["cmc"]
        assert len(cmc) == 20
        assert all(a <= b for a, b in zip(cmc, cmc[1:]))
        prefix = {"recall": "recall@", "progressive": "acc@"}[entry["protocol"]]
        for k in (1, 2, 5):
            assert cmc[k - 1] == pytest.approx(entry["metrics"][f"{prefix}{k}"])


def test_markdown_tables(report):
    text = (report / "report.md").read_text()
    assert text.startswith("# Toy <report>")
    for heading in ("## Overview", "## toy", "## sketchy"):
        assert heading in text
    assert "| encoder | recall@1 | recall@2 | recall@5 | map | mrr | minp |" in text
    assert "| encoder | m@A | m@B | wm@A | wm@B | acc@1 | acc@2 | acc@5 |" in text
    assert CHECKPOINT["enc-a"][:12] in text


def test_same_inputs_same_bytes(results, tmp_path):
    _, metrics = results
    for out in ("one", "two"):
        invoke("report", *metrics, "--out-dir", tmp_path / out)
    for name in ("report.html", "report.md", "report.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_explicit_paths(results, tmp_path):
    _, metrics = results
    invoke("report", *metrics[:2], "--json", tmp_path / "only.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["only.json"]


def test_cmc_curve_by_hand(tmp_path):
    # first ranks 1, 3, 2 (and 7 for a second relevant item, which CMC ignores)
    store = tmp_path / "ranks.zarr"
    write_ranks(store, {"offsets": np.array([0, 2, 3, 5]), "ranks": np.array([1, 4, 3, 2, 7]),
                        "query_index": np.arange(3), "group": -np.ones(3), "step": np.zeros(3)},
                {"protocol": "recall", "distance": "cosine", "num_queries": 3,
                 "num_skipped": 0, "num_gallery": 10, "embedding_dim": 2})
    assert cmc_curve(store, 4) == pytest.approx([100 / 3, 200 / 3, 100.0, 100.0])


@pytest.mark.parametrize("content, message", [
    ("not json", "not a JSON file"),
    ('{"protocol": "recall"}', "no 'metrics' object"),
])
def test_bad_metrics_file(tmp_path, content, message):
    bad = tmp_path / "d" / "e.json"
    bad.parent.mkdir()
    bad.write_text(content)
    result = CliRunner().invoke(main, ["report", str(bad), "--out-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "report.html").exists()


def test_duplicate_pair_is_an_error(results):
    _, metrics = results
    with pytest.raises(ValueError, match="also given by"):
        build_report([metrics[0], metrics[0]])
