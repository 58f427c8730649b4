"""`rankwise report`: files, self-contained HTML, JSON provenance, CMC, intervals,
paired comparisons, the epochs plot, worst queries, determinism, errors.

Inputs are made the way the pipeline makes them: embedding stores with provenance
attributes, `rankwise rank`, then `rankwise metrics`, in the layout
results/metrics/<dataset>/<encoder>.json. Three encoders play a series of checkpoints
(epochs); the recall dataset has images (thumbnails), the progressive one has none (ids).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from rankwise import __version__
from rankwise.cli import main
from rankwise.errors import RankwiseError
from rankwise.report import build_report, cmc_curve, comparison_pairs, render_html
from rankwise.stats import holm
from rankwise.store import read_ranks, store_attrs, write_embeddings, write_ranks

sys.path.insert(0, str(Path(__file__).parent))

from helpers import run_rankwise

# name -> noise: checkpoints of increasing quality, given in this (config) order
ENCODERS = {"enc-a": 1.5, "enc-b": 0.6, "enc-c": 0.3}
CHECKPOINT = {"enc-a": "a1" * 32, "enc-b": "b2" * 32, "enc-c": "c3" * 32}
WORST = 3  # --worst-queries of the report fixture


def invoke(*args: str) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _image(path: Path, value: int) -> str:
    """A tiny grey PNG; returns its path relative to the manifest's folder."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (12, 16), color=int(value) % 256).save(path)
    return f"images/{path.name}"


def _manifests(folder: Path, protocol: str, rng) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    """Toy manifests and 'true' embeddings: 8 labels, 4 gallery items each.

    recall: images under images/ (a `path` column); progressive: no images."""
    folder.mkdir(parents=True, exist_ok=True)
    centres = rng.normal(size=(8, 6))
    g_labels = np.repeat(np.arange(8), 4)
    if protocol == "progressive":  # each sketch: 3 steps of one label
        g_lines = ["id,label"] + [f"g{i},{lab}" for i, lab in enumerate(g_labels)]
        q_labels = np.repeat(np.arange(8), 3)
        q_lines = ["id,label,sketch,step"] + [
            f"q{i},{lab},s{lab},{i % 3 + 1}" for i, lab in enumerate(q_labels)
        ]
    else:
        g_lines = ["id,label,path"] + [
            f"g{i},{lab},{_image(folder / 'images' / f'g{i}.png', 30 * lab)}"
            for i, lab in enumerate(g_labels)
        ]
        q_labels = np.arange(8)
        q_lines = ["id,label,path"] + [
            f"q{i},{lab},{_image(folder / 'images' / f'q{i}.png', 30 * lab)}"
            for i, lab in enumerate(q_labels)
        ]
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
                write_embeddings(
                    stores[split],
                    iter([emb]),
                    len(emb),
                    attrs={
                        "encoder": {"kind": "onnx", "options": {"model": f"{encoder}.onnx"}},
                        "checkpoint": f"{encoder}.onnx",
                        "checkpoint_hash": CHECKPOINT[encoder],
                        "manifest_hash": f"{split}-hash",
                        "manifest": str(csv),
                        "num_rows": len(emb),
                        "rankwise_version": __version__,
                    },
                )
            ranks = root / "ranks" / dataset / f"{encoder}.zarr"
            invoke(
                "rank",
                "--query",
                q_csv,
                "--gallery",
                g_csv,
                "--query-embeddings",
                stores["query"],
                "--gallery-embeddings",
                stores["gallery"],
                "--protocol",
                protocol,
                "--out",
                ranks,
            )
            out = root / "metrics" / dataset / f"{encoder}.json"
            invoke("metrics", ranks, "--ks", "1,2,5", "--output", out)
            metrics.append(out)
    return root, metrics


@pytest.fixture(scope="module")
def report(results):
    root, metrics = results
    invoke(
        "report",
        *metrics,
        "--out-dir",
        root,
        "--title",
        "Toy <report>",
        "--cmc-max-rank",
        "20",
        "--resamples",
        "300",
        "--worst-queries",
        str(WORST),
        "--top-k",
        "5",
    )
    return root


@pytest.fixture(scope="module")
def doc(report):
    return json.loads((report / "report.json").read_text())


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
    # plots and thumbnails are inline PNG
    for alt in (
        "metrics across encoders on toy",
        "CMC curves on toy",
        "metrics across encoders on sketchy",
        "CMC curves on sketchy",
        "rank against completion on sketchy",
    ):
        assert re.search(f'<img alt="{alt}" src="data:image/png;base64,[A-Za-z0-9+/=]+"', text)
    assert "Toy &lt;report&gt;" in text and "Toy <report>" not in text
    # long sections are collapsed
    assert text.count("<details") >= 2 * 3


def test_json_has_every_metric_and_provenance(results, report):
    _, metrics = results
    doc = json.loads((report / "report.json").read_text())
    assert doc["datasets"] == ["toy", "sketchy"]
    assert doc["encoders"] == list(ENCODERS)
    assert len(doc["results"]) == 6
    for path, entry in zip(metrics, doc["results"], strict=True):
        source = json.loads(path.read_text())
        assert (entry["dataset"], entry["encoder"]) == (path.parent.name, path.stem)
        assert entry["metrics"] == source["metrics"]
        for key in (
            "protocol",
            "distance",
            "num_queries",
            "num_skipped",
            "num_gallery",
            "embedding_dim",
        ):
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
        assert all(a <= b for a, b in zip(cmc[:-1], cmc[1:], strict=True))
        prefix = {"recall": "recall@", "progressive": "acc@"}[entry["protocol"]]
        for k in (1, 2, 5):
            assert cmc[k - 1] == pytest.approx(entry["metrics"][f"{prefix}{k}"])


def test_markdown_tables(report):
    text = (report / "report.md").read_text()
    assert text.startswith("# Toy \\<report\\>")  # escaped: not an HTML tag
    for heading in ("## Overview", "## toy", "## sketchy"):
        assert heading in text
    assert "| encoder | recall@1 | recall@2 | recall@5 | map | mrr | minp |" in text
    assert "| encoder | m@A | m@B | wm@A | wm@B | acc@1 | acc@2 | acc@5 |" in text
    assert CHECKPOINT["enc-a"][:12] in text


@pytest.mark.parametrize("max_rank, ks", [(3, [1, 3]), (7, [1, 5, 7]), (20, [1, 5, 10, 20])])
def test_markdown_cmc_table_ends_at_cmc_max_rank(results, tmp_path, max_rank, ks):
    """The CMC table's last column is --cmc-max-rank where that is not one of its usual
    ranks (3: k=1 alone before), and its cells are the JSON's curve."""
    _, metrics = results
    invoke(
        "report", *metrics[:2], "--out-dir", tmp_path, "--cmc-max-rank", str(max_rank),
        "--resamples", "0", "--worst-queries", "0",
    )  # fmt: skip
    text = (tmp_path / "report.md").read_text()
    doc = json.loads((tmp_path / "report.json").read_text())
    header = "| encoder | " + " | ".join(f"k={k}" for k in ks) + " |"
    assert header in text
    lines = text.splitlines()
    for entry in doc["results"]:
        row = next(
            line for line in lines[lines.index(header) :] if f"| {entry['encoder']} |" in line
        )
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells == [f"{entry['cmc'][k - 1]:.2f}" for k in ks]


def test_same_inputs_same_bytes(results, tmp_path):
    _, metrics = results
    for out in ("one", "two"):
        invoke(
            "report",
            *metrics,
            "--out-dir",
            tmp_path / out,
            "--resamples",
            "200",
            "--worst-queries",
            "2",
        )
    for name in ("report.html", "report.md", "report.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_explicit_paths(results, tmp_path):
    _, metrics = results
    invoke("report", *metrics[:2], "--json", tmp_path / "only.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["only.json"]


def test_cmc_curve_by_hand(tmp_path):
    # first ranks 1, 3, 2 (and 7 for a second relevant item, which CMC ignores)
    store = tmp_path / "ranks.zarr"
    write_ranks(
        store,
        {
            "offsets": np.array([0, 2, 3, 5]),
            "ranks": np.array([1, 4, 3, 2, 7]),
            "query_index": np.arange(3),
            "group": -np.ones(3),
            "step": np.zeros(3),
        },
        {
            "protocol": "recall",
            "distance": "cosine",
            "num_queries": 3,
            "num_skipped": 0,
            "num_gallery": 10,
            "embedding_dim": 2,
        },
    )
    assert cmc_curve(store, 4) == pytest.approx([100 / 3, 200 / 3, 100.0, 100.0])


def _metrics_json(**keys) -> str:
    """A minimal metrics JSON with ``keys`` added (or replaced)."""
    return json.dumps({"protocol": "recall", "metrics": {"map": 50.0}, **keys})


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not a JSON file"),
        ('{"protocol": "recall"}', "no 'metrics' object"),
        ('{"metrics": {"map": 50.0}}', "e.json: 'protocol' is missing"),
        (
            '{"protocol": "x", "metrics": {}}',
            "e.json: 'protocol' must be one of recall, reid, reassociation, progressive, got \"x\"",
        ),
        ('{"protocol": "recall", "metrics": {"map": null}}', "'metrics.map' must be a number"),
        ('{"protocol": "recall", "metrics": {"map": "abc"}}', "'metrics.map' must be a number"),
        (_metrics_json(num_queries="8"), "'num_queries' must be a non-negative integer"),
        (_metrics_json(provenance=[1, 2]), "'provenance' must be an object"),
        (
            _metrics_json(provenance={"query_embeddings": [1]}),
            "'provenance.query_embeddings' must be an object",
        ),
        (_metrics_json(provenance={"ranks": 5}), "'provenance.ranks' must be a path"),
    ],
)
def test_bad_metrics_file(tmp_path, content, message):
    bad = tmp_path / "d" / "e.json"
    bad.parent.mkdir()
    bad.write_text(content)
    result = CliRunner().invoke(main, ["report", str(bad), "--out-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output
    assert result.output.startswith(f"error: {bad}: ")  # one line naming the file
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "report.html").exists()


def test_a_metrics_file_given_in_its_folder_names_the_folder_as_dataset(results, monkeypatch):
    _, metrics = results
    monkeypatch.chdir(metrics[0].parent)
    given = [metrics[0].name, f"../toy/{metrics[1].name}"]
    doc = build_report(given, resamples=0, worst_queries=0)
    assert [(r["dataset"], r["encoder"]) for r in doc["results"]] == [
        ("toy", "enc-a"),
        ("toy", "enc-b"),
    ]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read the verify file"),
        ("not json", "not a JSON file; pass the --output of `rankwise verify`"),
        ('{"metrics": {}}', "no 'tpr@fpr' object; pass the --output of `rankwise verify`"),
    ],
)
def test_bad_verification_file(results, tmp_path, content, message):
    _, metrics = results
    bad = tmp_path / "d" / "e.json"
    bad.parent.mkdir()
    if content is not None:
        bad.write_text(content)
    with pytest.raises(RankwiseError, match=re.escape(message)):
        build_report([metrics[0]], verification=[bad])


def test_duplicate_pair_is_an_error(results):
    _, metrics = results
    with pytest.raises(ValueError, match="also given by"):
        build_report([metrics[0], metrics[0]])


# ---------------------------------------------------------------- statistics


def test_ci95_for_every_metric_contains_the_value(doc):
    assert doc["statistics"]["resamples"] == 300 and doc["statistics"]["seed"] == 0
    for entry in doc["results"]:
        assert list(entry["ci95"]) == list(entry["metrics"])
        for name, value in entry["metrics"].items():
            low, high = entry["ci95"][name]
            # every metric is a mean of per-query (per-sketch) values
            assert 0.0 <= low <= value + 1e-9 and value - 1e-9 <= high <= 100.0, name


def test_comparisons_cover_every_pair_and_metric(doc):
    rows = doc["comparisons"]
    by_pair = {}
    for row in rows:
        by_pair.setdefault((row["dataset"], row["a"], row["b"]), []).append(row["metric"])
    encoders = list(ENCODERS)
    expected_pairs = [(a, b) for i, a in enumerate(encoders) for b in encoders[i + 1 :]]
    assert list(by_pair) == [(d, a, b) for d in ("toy", "sketchy") for a, b in expected_pairs]
    values = {(r["dataset"], r["encoder"]): r["metrics"] for r in doc["results"]}
    for (dataset, a, b), names in by_pair.items():
        assert names == list(values[dataset, a])
    for row in rows:
        assert 0.0 < row["p_value"] <= 1.0
        assert row["p_value"] <= row["p_holm"] <= 1.0
        assert row["significant"] == (row["p_holm"] < 0.05)
        assert row["value_a"] == pytest.approx(values[row["dataset"], row["a"]][row["metric"]])
        assert row["value_b"] == pytest.approx(values[row["dataset"], row["b"]][row["metric"]])
        assert row["diff"] == pytest.approx(row["value_b"] - row["value_a"])
        assert row["ci95"][0] <= row["ci95"][1]
    # Holm across everything shown together
    assert [r["p_holm"] for r in rows] == pytest.approx(holm([r["p_value"] for r in rows]))
    assert doc["statistics"]["num_tests"] == len(rows)
    # the weakest against the best checkpoint on recall@1: a large, significant gain
    gain = next(
        r
        for r in rows
        if (r["dataset"], r["a"], r["b"], r["metric"]) == ("toy", "enc-a", "enc-c", "map")
    )
    assert gain["diff"] > 0


def test_comparison_pairs_all_up_to_four_then_previous_and_best():
    assert comparison_pairs(["a"]) == []
    assert comparison_pairs(list("abcd")) == [
        ("a", "b"),
        ("a", "c"),
        ("a", "d"),
        ("b", "c"),
        ("b", "d"),
        ("c", "d"),
    ]
    assert comparison_pairs(list("abcd"), "c") == comparison_pairs(list("abcd"))
    # beyond four: each against the previous one (epoch to epoch) ...
    assert comparison_pairs(list("abcde")) == [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")]
    # ... and the best against every encoder it is not already next to
    assert comparison_pairs(list("abcdef"), "c") == [
        ("a", "b"),
        ("b", "c"),
        ("c", "d"),
        ("d", "e"),
        ("e", "f"),
        ("a", "c"),
        ("e", "c"),
        ("f", "c"),
    ]
    pairs = comparison_pairs([f"e{i}" for i in range(16)], "e7")
    assert len(pairs) == 15 + 13 and len(set(pairs)) == len(pairs)  # linear, no repeats


def test_a_best_without_statistics_is_left_out_of_the_tests():
    """Six encoders, the best by the headline metric without statistics (no ranks store
    left): the others are compared epoch to epoch, the best in no test (it raised
    AssertionError)."""
    from rankwise.report.comparisons import compare_encoders
    from rankwise.summary import Summary

    rng = np.random.default_rng(0)
    names = [f"e{i}" for i in range(6)]
    entries = [
        {
            "encoder": name,
            "source": f"{name}.json",
            "protocol": "recall",
            "num_gallery": 50,
            "metrics": {"map": 0.0, "mrr": 0.0},
            "provenance": {"ap": None, "protocol_options": None},
        }
        for name in names
    ]
    summaries = {
        ("toy", name): None
        if name == "e2"
        else Summary(
            settings={"metrics": ["map", "mrr"]},
            ci95=None,
            cmc=[],
            progressive=None,
            values=rng.random((20, 2)),
            rows=np.arange(20),
            cluster=np.arange(20),
        )
        for name in names
    }
    rows, _, _ = compare_encoders(
        [("toy", entries)], summaries, resamples=100, seed=0, by="query", best={"toy": "e2"}
    )
    pairs = {(r["a"], r["b"]) for r in rows}
    assert pairs == {("e0", "e1"), ("e1", "e3"), ("e3", "e4"), ("e4", "e5")}


def test_html_marks_significant_differences(doc, report):
    text = (report / "report.html").read_text()
    assert "Differences b &minus; a" in text
    significant = [r for r in doc["comparisons"] if r["significant"]]
    marked = re.findall(r'<td class="(up|down)"[^>]*>[^<]*\*</td>', text)
    assert len(marked) == len(significant)
    assert marked.count("up") == sum(r["diff"] > 0 for r in significant)


def test_progressive_curve(doc):
    for entry in doc["results"]:
        curve = entry["progressive"]
        if entry["protocol"] != "progressive":
            assert curve is None
            continue
        assert curve["completion"] == pytest.approx([100 / 3, 200 / 3, 100.0])
        assert curve["num_renderings"] == [8, 8, 8]
        # every sketch has the same number of steps: m@B is the curve's mean
        assert np.mean(curve["mean_reciprocal_rank"]) == pytest.approx(entry["metrics"]["m@B"])
        for value, (low, high) in zip(curve["mean_reciprocal_rank"], curve["ci95"], strict=True):
            assert low <= value <= high


def test_epochs_plot_needs_two_encoders(results, tmp_path):
    _, metrics = results
    doc = build_report(metrics[:1], resamples=50, worst_queries=0)
    text = render_html(doc)
    assert "metrics across encoders" not in text
    assert 'alt="metrics on toy"' in text  # bar chart with error bars instead
    assert doc["comparisons"] == []
    assert "No paired tests in this report." in text and "sign-flip" not in text


# ---------------------------------------------------------------- worst queries


def _independent_scores(ranks_path: str) -> dict[int, float]:
    """manifest row -> AP (%) of every evaluated query, or -> m@B (%) of every sketch
    keyed by its complete rendering's row; from the raw CSR arrays."""
    arrays, attrs = read_ranks(ranks_path)
    offsets, ranks, rows = arrays["offsets"], arrays["ranks"], arrays["query_index"]
    if attrs["protocol"] != "progressive":
        out = {}
        for q in range(len(rows)):
            r = ranks[offsets[q] : offsets[q + 1]].astype(float)
            out[int(rows[q])] = 100 * float(np.mean(np.arange(1, len(r) + 1) / r))
        return out
    sketches: dict[int, list[tuple[int, int, float]]] = {}
    for q in range(len(rows)):
        sketches.setdefault(int(arrays["group"][q]), []).append(
            (int(arrays["step"][q]), int(rows[q]), 1.0 / ranks[offsets[q]])
        )
    return {
        max(items)[1]: 100 * float(np.mean([x[2] for x in items])) for items in sketches.values()
    }


def test_worst_queries_are_the_lowest(doc, report):
    html_text = (report / "report.html").read_text()
    for dataset in ("toy", "sketchy"):
        entries = [r for r in doc["results"] if r["dataset"] == dataset]
        shown = [r for r in entries if r["worst_queries"]]
        # only the best encoder (highest headline metric) is shown
        headline = "recall@1" if dataset == "toy" else "m@A"
        best = max(entries, key=lambda r: r["metrics"][headline])
        assert [r["encoder"] for r in shown] == [best["encoder"]]
        worst = best["worst_queries"]
        assert worst["score"] == ("ap" if dataset == "toy" else "m@B")
        scores = _independent_scores(best["provenance"]["files"]["ranks"])
        listed = worst["queries"]
        assert len(listed) == WORST
        query_csv = Path(best["provenance"]["files"]["query_manifest"])
        ids = query_csv.read_text().splitlines()[1:]
        for q in listed:
            assert q["query_index"] in scores
            assert q["score"] == pytest.approx(scores[q["query_index"]])
            assert q["id"] == ids[q["query_index"]].split(",")[0]
            assert f"<code>{q['id']}</code>" in html_text
            # top items: the first relevant one sits at the query's first rank
            relevant = [t["rank"] for t in q["top"] if t["relevant"]]
            assert len(q["top"]) == 5
            if q["rank"] <= 5:
                assert relevant[0] == q["rank"]
            else:
                assert relevant == []
        assert sorted(q["score"] for q in listed) == pytest.approx(sorted(scores.values())[:WORST])
        assert [q["score"] for q in listed] == sorted(q["score"] for q in listed)


def test_worst_queries_thumbnails_or_ids(doc, report):
    text = (report / "report.html").read_text()
    toy, sketchy = text.split('<h2 id="sketchy">')
    # toy has images: green/red bordered thumbnails; sketchy has none: id boxes
    assert re.search(
        r'<span class="item (rel|non)"[^>]*><img alt="g\d+" width="48" '
        r'height="64" src="data:image/png;base64,',
        toy,
    )
    assert 'class="idbox"' not in toy
    assert re.search(r'<span class="item (rel|non)"[^>]*><span class="idbox">g\d+</span>', sketchy)


def test_worst_encoders_all_and_none(results):
    _, metrics = results
    doc = build_report(metrics, resamples=20, worst_queries=2, worst_encoders="all", top_k=3)
    assert all(len(r["worst_queries"]["queries"]) == 2 for r in doc["results"])
    doc = build_report(metrics, resamples=0, worst_queries=0)
    assert all(r["worst_queries"] is None and r["ci95"] is None for r in doc["results"])
    assert doc["comparisons"] == []
    render_html(doc)  # renders without statistics


def test_without_a_ranks_store_the_report_says_so_and_claims_no_intervals(results, tmp_path):
    """Metrics files whose ranks store is gone (a report run from another folder): no
    statistics, a note on stderr and in each document naming the store, and no caption
    that claims intervals."""
    from rankwise.report.latex import _tex
    from rankwise.report.markdown import _escape as _md_escape

    _, metrics = results
    given = []
    for path in metrics[:2]:
        data = json.loads(path.read_text())
        data["provenance"]["ranks"] = str(tmp_path / "gone" / f"{path.stem}.zarr")
        given.append(tmp_path / "toy" / path.name)
        given[-1].parent.mkdir(exist_ok=True)
        given[-1].write_text(json.dumps(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main, ["report", *map(str, given), "--out-dir", str(out), "--tex", str(out / "r.tex")]
    )
    assert result.exit_code == 0, result.output
    note = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(note) == 1 and f"toy/enc-a (ranks store {tmp_path}/gone/enc-a.zarr" in note[0]
    doc = json.loads((out / "report.json").read_text())
    assert not any(r["ci95"] or r["cmc"] or r["worst_queries"] for r in doc["results"])
    assert [m["encoder"] for m in doc["statistics"]["without_statistics"]] == ["enc-a", "enc-b"]
    md, html, tex = [(out / name).read_text() for name in ("report.md", "report.html", "r.tex")]
    for text, escape in ((md, _md_escape), (html, str), (tex, _tex)):
        assert escape(f"enc-b: ranks store {tmp_path}/gone/enc-b.zarr not found") in text
        assert "Intervals:" not in text and "No intervals or tests: no statistics" in text
    assert "[low, high]" not in md and "[low, high]" not in tex
    assert "interval below each value" not in html


def test_without_resamples_no_caption_claims_intervals(results, tmp_path):
    from rankwise.report import render_latex, render_markdown

    _, metrics = results
    doc = build_report(metrics[:2], resamples=0, worst_queries=0)
    assert all(r["cmc"] and r["ci95"] is None for r in doc["results"])
    for text in (render_markdown(doc), render_html(doc), render_latex(doc)):
        assert "No intervals or tests (resamples = 0)." in text
        assert "[low, high]" not in text and "interval below each value" not in text


def test_the_statistics_sentence_names_each_protocols_unit(doc):
    """A progressive dataset resamples (and flips) sketches: its sentence said queries."""
    from rankwise.report import view

    def rows(dataset):
        return [r for r in doc["results"] if r["dataset"] == dataset]

    assert doc["statistics"]["by"] == "query"
    assert "resamples by query, seed" in view.stats_sentence(doc, rows("toy"))
    sketchy = view.stats_sentence(doc, rows("sketchy"))
    assert "resamples by sketch, seed" in sketchy and "quer" not in sketchy
    assert "resamples by query or sketch, seed" in view.stats_sentence(doc)


def test_the_metrics_chart_caption_names_the_metrics_drawn_without_intervals(doc):
    """trend_chart draws a metric's interval bars only when every encoder has that
    metric's interval: with recall@5 computed for one encoder only (other ks), the
    caption claimed bars for every metric."""
    from rankwise.report.plots import dataset_plots

    rows = json.loads(json.dumps([r for r in doc["results"] if r["dataset"] == "toy"]))
    assert len(rows) == 3 and all(r["ci95"] for r in rows)

    def caption(rows):
        return next(p.caption for p in dataset_plots(doc, rows) if p.kind == "metrics")

    assert "bars: 95% interval; ringed" in caption(rows)
    del rows[1]["metrics"]["recall@5"], rows[1]["ci95"]["recall@5"]
    assert "bars: 95% interval, none for recall@5 (not every encoder has them)" in caption(rows)
    del rows[0]["ci95"]["recall@1"]
    assert "none for recall@1, recall@5 (" in caption(rows)


@pytest.mark.parametrize(
    "metrics, message",
    [
        ({"recall@1": 95.0, "foo": 1.0}, r"paper\.json: metrics: unknown metric 'foo' for"),
        ({"rank1": 95.0}, r"paper\.json: metrics: unknown metric 'rank1' for protocol 'recall'"),
        (
            {"recall@1": 95.0, "recall@01": 95.0},
            r"paper\.json: metrics 'recall@1' and 'recall@01' are one metric \(recall@1\)",
        ),
        ({}, r"paper\.json: the metrics object is empty; give at least one metric \(e\.g\."),
        # NaN was reported (bare NaN in report.json, "nan" in every document) and named
        # the dataset's best checkpoint; 150 was the bold best of its column
        ({"recall@1": float("nan")}, r"paper\.json: metrics: 'recall@1' is nan; every metric"),
        ({"recall@1": float("inf")}, r"paper\.json: metrics: 'recall@1' is inf; every metric"),
        ({"map": 150.0}, r"paper\.json: metrics: 'map' is 150; every metric is a percentage"),
        ({"map": -3}, r"paper\.json: metrics: 'map' is -3; every metric is a percentage"),
    ],
)
def test_a_hand_written_metrics_file_names_known_metrics(results, tmp_path, metrics, message):
    """A paper's numbers typed by hand: an unknown name, a metric twice, or none at all
    were accepted (a column of their own, a table with no metric column)."""
    _, files = results
    paper = tmp_path / "toy" / "paper.json"
    paper.parent.mkdir()
    paper.write_text(json.dumps({"protocol": "recall", "metrics": metrics}))
    with pytest.raises(RankwiseError, match=message):
        build_report([paper, *files], resamples=0, worst_queries=0)


def test_a_hand_written_metric_spelt_otherwise_shares_the_computed_column(results, tmp_path):
    """``recall@01`` in a paper's file is recall@1: the paper's number sits in the
    computed encoders' recall@1 column, not in a column of its own."""
    _, files = results
    paper = tmp_path / "toy" / "paper.json"
    paper.parent.mkdir()
    paper.write_text(json.dumps({"protocol": "recall", "metrics": {"recall@01": 95.0}}))
    doc = build_report([paper, *files], resamples=0, worst_queries=0)
    entry = next(r for r in doc["results"] if r["encoder"] == "paper")
    assert entry["metrics"] == {"recall@1": 95.0}


def test_a_hand_written_metrics_file_beside_computed_ones(results, tmp_path):
    """A paper's numbers typed into a metrics file (protocol and metrics alone) beside
    computed evaluations: the header printed "paper: None queries (None skipped), None
    gallery items" and "distance None (paper)", and the metrics chart's caption claimed
    "bars: 95% interval" though no interval is drawn unless every encoder has one; the
    LaTeX caption left out the pairs not compared."""
    from rankwise.report import render_latex, render_markdown, view
    from rankwise.report.plots import dataset_plots

    _, metrics = results
    toy = [p for p in metrics if p.parent.name == "toy"]
    paper = tmp_path / "toy" / "paper.json"
    paper.parent.mkdir()
    paper.write_text(json.dumps({"protocol": "recall", "metrics": {"recall@1": 95.0, "map": 88.0}}))
    doc = build_report([paper, *toy], resamples=50, worst_queries=0)
    rows = [r for r in doc["results"] if r["dataset"] == "toy"]
    counts, distance = view.counts(rows), view.distance(rows)
    assert counts.startswith("paper: counts not given; ") and "None" not in counts
    assert distance.startswith("not given (paper), ") and "None" not in distance
    caption = next(p.caption for p in dataset_plots(doc, rows) if p.kind == "metrics")
    assert "interval" not in caption.replace("no intervals drawn (paper: none computed)", "")
    assert "no intervals drawn (paper: none computed)" in caption
    for text in (render_markdown(doc), render_html(doc), render_latex(doc)):
        assert "None" not in text
    # every note Markdown gives under the dataset is in the LaTeX caption too
    notes = [view.dropped_rows_note(rows), view.no_statistics_note(doc, "toy")]
    notes += [view.not_compared_note(doc, "toy"), view.unattainable_note(doc, "toy")]
    # the paper's two numbers are what it has: no "missing metrics" note for it
    assert view.missing_metrics_note(rows) is None
    tex = render_latex(doc)
    from rankwise.report.latex import _tex

    assert all(_tex(n) in tex for n in notes if n)


def test_a_metrics_file_lacking_some_metrics_is_named(results, tmp_path):
    """An older rankwise's metrics file (without precision@K / map@r) beside newer ones:
    its "-" cells are explained under the dataset, in the LaTeX caption and on the
    terminal (they were silent, and the overview left a missing headline metric out
    without a word)."""
    from rankwise.report import render_latex, view
    from rankwise.report.latex import _tex

    _, metrics = results
    toy = [p for p in metrics if p.parent.name == "toy"]
    folder = tmp_path / "toy"
    folder.mkdir()
    for path in toy:
        data = json.loads(path.read_text())
        if path.stem == "enc-b":
            old = ("map@r", "precision@1")
            data["metrics"] = {k: v for k, v in data["metrics"].items() if k not in old}
        (folder / path.name).write_text(json.dumps(data))
    files = [folder / p.name for p in toy]
    proc = run_rankwise("report", *files, "--resamples", "50", "--out-dir", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "metrics missing" in line]
    assert notes == [
        "note: metrics missing from some metrics files (shown as -, no paired test or "
        "overview column with them): toy/enc-b (precision@1, map@r); `rankwise metrics` "
        "on their ranks stores again computes them"
    ]
    sentence = (
        'Not in every metrics file ("-": no paired test or overview column with them): '
        "enc-b: precision@1, map@r."
    )
    assert sentence in (tmp_path / "out" / "report.md").read_text()
    assert html.escape(sentence) in (tmp_path / "out" / "report.html").read_text()
    doc = build_report(files, resamples=50, worst_queries=0)
    rows = [r for r in doc["results"] if r["dataset"] == "toy"]
    assert _tex(view.missing_metrics_note(rows)) in render_latex(doc)
    # every file complete: no note
    complete = run_rankwise("report", *toy, "--resamples", "50", "--out-dir", tmp_path / "all")
    assert complete.returncode == 0 and "metrics missing" not in complete.stderr
    assert "Not in every metrics file" not in (tmp_path / "all" / "report.md").read_text()


def test_a_paper_metric_beyond_the_computed_ones_names_no_computed_file(results, tmp_path):
    """A paper's numbers with a K the evaluations were not run with (recall@10 beside
    ks 1,2,5): the note named every computed file as lacking recall@10, from "an older
    rankwise or other --ks", though all of them are complete and alike."""
    from rankwise.report import view

    _, metrics = results
    toy = [p for p in metrics if p.parent.name == "toy"]
    paper = tmp_path / "toy" / "paper.json"
    paper.parent.mkdir()
    numbers = {"recall@1": 95.0, "recall@10": 99.0, "map": 88.0}
    paper.write_text(json.dumps({"protocol": "recall", "metrics": numbers}))
    doc = build_report([paper, *toy], resamples=50, worst_queries=0)
    rows = [r for r in doc["results"] if r["dataset"] == "toy"]
    assert "recall@10" in view.metric_names(rows)
    assert view.missing_metrics_note(rows) is None
    assert view.missing_metrics_line(doc) is None


def test_beyond_four_encoders_a_best_without_statistics_gives_way_to_the_next(results, tmp_path):
    """Six encoders of one dataset, the best by the headline metric a paper's hand-written
    numbers (no statistics): the best of the five computed ones is tested against every
    other (it was against none, silently: only epoch-to-epoch tests were left)."""
    _, metrics = results
    toy = {p.stem: json.loads(p.read_text()) for p in metrics if p.parent.name == "toy"}
    folder = tmp_path / "toy"
    folder.mkdir()
    # e3 is enc-b (the better encoder), the rest enc-a: e3 is the best with statistics
    for i in range(5):
        (folder / f"e{i}.json").write_text(json.dumps(toy["enc-b" if i == 3 else "enc-a"]))
    paper = folder / "paper.json"
    paper.write_text(json.dumps({"protocol": "recall", "metrics": {"recall@1": 100.0}}))
    doc = build_report([*sorted(folder.glob("e*.json")), paper], resamples=50, worst_queries=0)
    assert [b["encoder"] for b in doc["best"]] == ["paper"]
    pairs = {(r["a"], r["b"]) for r in doc["comparisons"]}
    assert pairs == {
        ("e0", "e1"),
        ("e1", "e2"),
        ("e2", "e3"),
        ("e3", "e4"),
        ("e0", "e3"),
        ("e1", "e3"),
    }
    assert "the best (of those with statistics)" in doc["statistics"]["pairs"]


def test_a_dataset_whose_floor_holm_keeps_above_alpha_is_said_so():
    """25 tests: 7 on a dataset of 10 clusters (exact floor 2^-9 = 0.00195), 18 on one of
    8 identities (2^-7 = 0.0078). 25 x 0.00195 < 0.05, so the report-wide check passed;
    but at most 7 tests can precede the 8-identity dataset's in Holm's order, so its
    smallest p is multiplied by at least 18: 18 x 0.0078 = 0.14, never significant."""
    from rankwise.report import view

    def tests(dataset: str, n: int, clusters: int) -> list[dict]:
        return [{"dataset": dataset, "test": "exact", "num_clusters": clusters}] * n

    doc = {
        "statistics": {"flip_resamples": 1000, "num_tests": 25, "by": "identity", "alpha": 0.05},
        "comparisons": tests("small", 18, 8) + tests("large", 7, 10),
        "results": [
            {"dataset": "small", "protocol": "reid"},
            {"dataset": "large", "protocol": "progressive"},
        ],
    }
    note = view.unattainable_note(doc, "small")
    assert note == (
        "No difference on small can be significant: with 8 identities the paired sign-flip "
        "test gives p >= 0.00781, and Holm over 25 tests, 7 of which can have a smaller p, "
        "needs p < 0.0028; compare by query or on more identities."
    )
    assert view.unattainable_note(doc, "large") is None  # 25 x 0.00195 < 0.05
    doc["comparisons"] = tests("small", 18, 8) + tests("large", 7, 12)  # more, still below
    assert "7 of which can have a smaller p" in view.unattainable_note(doc, "small")
    doc["comparisons"] = tests("small", 3, 8) + tests("large", 22, 10)  # 3 x 0.0078 < 0.05
    assert view.unattainable_note(doc, "small") is None


def test_the_statistics_sentence_names_the_tests_that_ran(doc):
    """It said "1000 random sign flips" when every test was exact (few clusters)."""
    import copy

    from rankwise.report import view

    changed = copy.deepcopy(doc)
    assert changed["comparisons"]
    for tests, said, unsaid in (
        (["exact"], "every sign flip enumerated: at most 16 queries or sketches each", "random"),
        (["sign-flip"], f"({changed['statistics']['flip_resamples']} random sign flips)", "every"),
        (
            ["exact", "sign-flip"],
            "random sign flips; every flip with at most 16 queries or sketches",
            "each",
        ),
    ):
        for i, c in enumerate(changed["comparisons"]):
            c["test"] = tests[i % len(tests)]
        sentence = view.stats_sentence(changed)
        assert said in sentence and unsaid not in sentence.split("Differences:")[1], sentence
        # an interval excluding 0 beside an unmarked difference is no contradiction: said
        assert sentence.endswith("(the intervals of the differences are not adjusted for "
                                 "the number of tests).")  # fmt: skip


def test_a_dataset_header_names_each_encoders_distance_when_they_differ(doc):
    """Metrics files of other runs given to `rankwise report` may differ in distance:
    the header gave the first encoder's as the dataset's."""
    import copy

    from rankwise.report import render_latex, render_markdown, view

    changed = copy.deepcopy(doc)
    rows = [r for r in changed["results"] if r["dataset"] == "toy"]
    assert view.distance(rows) == rows[0]["distance"]  # one distance: said once
    rows[-1]["distance"] = "euclidean" if rows[0]["distance"] == "cosine" else "cosine"
    said = view.distance(rows)
    assert said == (
        f"{rows[0]['distance']} ({', '.join(r['encoder'] for r in rows[:-1])}), "
        f"{rows[-1]['distance']} ({rows[-1]['encoder']})"
    )
    assert f"distance <code>{said}</code>" in render_html(changed)
    assert f"distance `{said}`" in render_markdown(changed)
    assert said in render_latex(changed).replace("\\_", "_")


def test_by_identity(results):
    _, metrics = results
    doc = build_report(metrics[:2], resamples=100, by="identity", worst_queries=0)
    assert doc["statistics"]["by"] == "identity"
    assert all(r["ci95"] for r in doc["results"])
    assert {r["by"] for r in doc["comparisons"]} == {"identity"}


def test_a_note_says_when_few_clusters_rule_out_significance(results):
    """With C clusters the exact sign-flip test's p is at least 2^(1 - C) (the observed
    signs and their mirror image); Holm multiplies the smallest by the number of tests."""
    from rankwise.report import render_markdown, view

    def doc(*datasets, flips=10_000):
        rows = [
            {"dataset": d, "test": t, "num_clusters": c, "p_value": 1.0}
            for d, t, c, n in datasets
            for _ in range(n)
        ]
        return {
            "statistics": {
                "alpha": 0.05,
                "num_tests": len(rows),
                "flip_resamples": flips,
                "by": "identity",
            },
            "comparisons": rows,
            "results": [{"dataset": d, "protocol": "reid"} for d, *_ in datasets],
        }

    five = view.unattainable_note(doc(("a", "exact", 5, 1)), "a")
    assert five == (
        "No difference on a can be significant: with 5 identities the paired sign-flip test "
        "gives p >= 0.0625, and significance needs p < 0.05; compare by query or on more "
        "identities."
    )
    assert view.unattainable_note(doc(("a", "exact", 6, 1)), "a") is None  # 0.03125
    # 0.03125 x 2 tests: Holm's first step already fails, for every dataset of the report
    two = doc(("a", "exact", 6, 1), ("b", "exact", 6, 1))
    assert "gives p >= 0.0312, and Holm over 2 tests needs p < 0.025;" in view.unattainable_note(
        two, "b"
    )
    assert view.unattainable_note(doc(("a", "exact", 6, 1), ("b", "exact", 7, 1)), "a") is None
    # one dataset with many units keeps the others' chances: only the raw bound remains
    mixed = doc(("a", "exact", 6, 1), ("b", "sign-flip", 300, 1))
    assert view.unattainable_note(mixed, "a") is None
    assert view.unattainable_note(mixed, "b") is None
    # the real report: where the note appears, nothing of that dataset is significant
    _, metrics = results
    for by in ("identity", "query"):
        real = build_report(metrics, resamples=200, by=by, worst_queries=0)
        for dataset in {r["dataset"] for r in real["results"]}:
            note = view.unattainable_note(real, dataset)
            rows = [c for c in real["comparisons"] if c["dataset"] == dataset]
            if note:
                assert not any(c["significant"] for c in rows)
                assert f"No difference on {dataset} can be significant" in render_markdown(real)
            assert note is None or all(c["p_holm"] >= 0.05 for c in rows)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--resamples", "-1"], "--resamples must be an integer in 0..10000000"),
        (["--resamples", "100000000"], "--resamples must be an integer in 0..10000000"),
        (["--top-k", "0"], "--top-k must be at least 1"),
        (["--worst-queries", "-2"], "--worst-queries must be a non-negative integer"),
        (["--cmc-max-rank", str(10**12)], "--cmc-max-rank must be an integer in 1..100000"),
    ],
)
def test_bad_options(results, tmp_path, args, message):
    _, metrics = results
    result = CliRunner().invoke(
        main, ["report", *map(str, metrics[:2]), "--out-dir", str(tmp_path), *args]
    )
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "report.html").exists()


# ---------------------------------------------------------------- one view-model


def _markdown_rows(text: str, heading: str) -> list[list[str]]:
    """The body cells of the first table after ``heading``."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        table.append([c.strip() for c in line.strip("|").split(" | ")][1:])
    return table


def _html_rows(text: str, heading: str) -> list[list[str]]:
    """The body cells of the first table after ``heading``: '<td class=...>text'."""
    body = text.split(heading, 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td([^>]*)>(.*?)</td>", row)[1:] for row in body.split("</tr>") if row]


def test_markdown_and_html_share_the_cells(doc):
    """Every overview and metrics cell: the same best flag, value and interval in both
    renderers (the Markdown overview now bolds the best value too)."""
    from rankwise.report import render_markdown, view

    md, page = render_markdown(doc), render_html(doc)
    header, body = view.overview(doc)
    tables = [("## Overview", "<h2>Overview</h2>", body)]
    tables += [
        (f"## {d}\n", f'<h2 id="{d}">', view.metrics_table(rows)[1])
        for d, rows in view.by_dataset(doc)
    ]
    flagged = 0
    for md_heading, html_heading, rows in tables:
        md_rows, html_rows = _markdown_rows(md, md_heading), _html_rows(page, html_heading)
        assert len(md_rows) == len(html_rows) == len(rows)
        for (_, cells), md_row, html_row in zip(rows, md_rows, html_rows, strict=True):
            for cell, md_cell, (attrs, html_cell) in zip(cells, md_row, html_row, strict=True):
                flagged += cell.best
                assert md_cell.startswith(f"**{cell.text}**") == cell.best
                assert ('class="best"' in attrs) == cell.best
                assert html_cell.startswith(cell.text)
                if cell.ci:
                    assert md_cell.endswith(f"[{cell.ci[0]:.1f}, {cell.ci[1]:.1f}]")
                    assert f"{cell.ci[0]:.1f}&ndash;{cell.ci[1]:.1f}" in html_cell
    assert flagged >= 2 + len(doc["datasets"])  # overview and tables both flag a best


def test_markdown_escapes_every_name(doc):
    """Titles, headings, overview headers, the best checkpoint, the worst queries'
    caption and labels: a name's ``|`` broke the tables, ``<x>`` vanished (an HTML tag),
    ``__init__`` was bold; ids in code spans keep their backticks."""
    from rankwise.report import render_markdown

    best = doc["best"][0]["encoder"]
    text = json.dumps(doc).replace('"toy"', '"a|b<x>"').replace(f'"{best}"', '"__init__"')
    doc = json.loads(text)
    doc["title"] = "t_1 *x* [y](z)"
    for entry in doc["results"]:
        for q in (entry.get("worst_queries") or {"queries": []})["queries"]:
            q["label"], q["id"] = "l|1", "q`1"
    md = render_markdown(doc)
    assert "# t\\_1 \\*x\\* \\[y\\](z)\n" in md
    assert "\n## a\\|b\\<x\\>\n" in md
    assert "| a\\|b\\<x\\> (recall@1) |" in md
    assert "Best checkpoint per dataset: a\\|b\\<x\\>: **\\_\\_init\\_\\_** (" in md
    assert "Worst 3 queries (lowest AP) of \\_\\_init\\_\\_ (top items" in md
    assert "1. ``q`1`` (label l\\|1): AP" in md
    assert "__init__" not in md and "<x>" not in md
    # every table row has as many unescaped | as its header
    for table in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):
        cells = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(cells) == 1, table
    from rankwise.report.markdown import _code

    assert _code("a`b") == "``a`b``" and _code("`a") == "`` `a ``"
    assert _code("a|b", table=True) == "`a\\|b`"


def test_renderers_read_the_settings_from_the_document(doc):
    """ "95%" and "p(Holm) < 0.05" are not retyped: another confidence and alpha in the
    document change every sentence of both renderers."""
    from rankwise.report import render_markdown
    from rankwise.stats import EXACT_MAX

    changed = json.loads(json.dumps(doc))
    changed["statistics"].update(confidence=0.9, alpha=0.01)
    for text, less in ((render_markdown(changed), "<"), (render_html(changed), "&lt;")):
        assert "95%" not in text and f"p(Holm) {less} 0.05" not in text
        assert "90%" in text and f"p(Holm) {less} 0.01" in text
        assert f"at most {EXACT_MAX} queries" in text
    assert "90% CI" in render_html(changed)


def test_markdown_counts_sketches(report):
    text = (report / "report.md").read_text()
    sketchy = text.split("## sketchy", 1)[1]
    assert "8 sketches (0 skipped)" in sketchy
    assert "CMC (% of complete sketches" in sketchy


def test_css_is_package_data(report):
    from importlib import resources

    css = resources.files("rankwise.report").joinpath("report.css").read_text()
    assert css.startswith("body {")
    assert f"<style>\n{css}</style>" in (report / "report.html").read_text()


# ---------------------------------------------------------------- overview, CSV, LaTeX


def test_a_tie_on_the_first_headline_metric_goes_to_the_next_one_not_to_the_file_order():
    """rank1 100 for all three (easy data), mAP 100 / 100 / 99.17: whichever order the
    files come in, the best has mAP 100 and is the first of the two full ties."""
    from rankwise.report.document import best_encoder, best_index

    def entry(name, rank1, mAP):
        return {"encoder": name, "protocol": "reid", "metrics": {"rank1": rank1, "map": mAP}}

    a, b, c = entry("pixels", 100.0, 100.0), entry("hist", 100.0, 100.0), entry("py", 100.0, 99.17)
    assert best_encoder([c, a, b]) == "pixels" and best_index([c, a, b]) == 1
    assert best_encoder([a, b, c]) == "pixels" and best_encoder([b, c, a]) == "hist"
    assert best_encoder([entry("x", 90.0, 10.0), entry("y", 91.0, 5.0)]) == "y"  # rank1 first


def test_overview_shows_every_headline_metric_and_the_best_checkpoint(doc, report):
    from rankwise.registry import get_protocol
    from rankwise.report import view

    header, _ = view.overview(doc)
    expected = [
        (d, name)
        for d in doc["datasets"]
        for name in get_protocol(
            next(r["protocol"] for r in doc["results"] if r["dataset"] == d)
        ).headline
    ]
    assert header == expected  # recall: recall@1, map; progressive: m@A, m@B
    assert [b["dataset"] for b in doc["best"]] == doc["datasets"]
    for best in doc["best"]:
        entries = [r for r in doc["results"] if r["dataset"] == best["dataset"]]
        names = [n for d, n in header if d == best["dataset"]]
        values = [r["metrics"][best["metric"]] for r in entries]
        assert best["metric"] == names[0]
        assert best["value"] == max(values)
        # the first headline metric, the next ones on ties, the first entry on full ties
        keys = [tuple(r["metrics"][n] for n in names) for r in entries]
        assert best["encoder"] == entries[keys.index(max(keys))]["encoder"]
        assert best["checkpoint"] == f"{best['encoder']}.onnx"
    md = (report / "report.md").read_text()
    html_text = (report / "report.html").read_text()
    for best in doc["best"]:
        assert f"{best['dataset']}: **{best['encoder']}**" in md
        assert f"{best['dataset']}: <b>{best['encoder']}</b>" in html_text


def test_csv_round_trips_through_pandas(doc):
    import io

    import pandas as pd

    from rankwise.report import render_csv

    table = pd.read_csv(io.StringIO(render_csv(doc)), keep_default_na=False)
    assert list(table.columns) == [
        "dataset",
        "encoder",
        "checkpoint",
        "metric",
        "value",
        "ci_low",
        "ci_high",
        "num_queries",
        "num_skipped",
    ]
    expected = [(e, name) for e in doc["results"] for name in e["metrics"]]
    assert len(table) == len(expected)
    for row, (entry, name) in zip(table.itertuples(index=False), expected, strict=True):
        assert (row.dataset, row.encoder, row.metric) == (entry["dataset"], entry["encoder"], name)
        assert row.checkpoint == entry["provenance"]["checkpoint"]
        assert row.value == entry["metrics"][name]  # exactly: the numbers of report.json
        assert [row.ci_low, row.ci_high] == entry["ci95"][name]
        assert (row.num_queries, row.num_skipped) == (entry["num_queries"], entry["num_skipped"])


def test_latex_tables(doc, tmp_path):
    from rankwise.report import render_latex, view

    # every LaTeX special character in a name is escaped (the document still compiles)
    doc = dict(doc, title="Toy_1 & 50% #2 {x} ~^ $y$ \\ <z>")
    text = render_latex(doc)
    assert (
        r"\section*{Toy\_1 \& 50\% \#2 \{x\} \textasciitilde{}\textasciicircum{} "
        r"\$y\$ \textbackslash{} $<$z$>$}"
    ) in text
    # best values in bold: as many as the view-model flags (overview + dataset tables)
    flags = sum(c.best for _, cells in view.overview(doc)[1] for c in cells)
    flags += sum(
        c.best
        for _, rows in view.by_dataset(doc)
        for _, cells in view.metrics_table(rows)[1]
        for c in cells
    )
    assert text.count(r"\textbf{") == flags
    assert text.count("$^{*}$") == sum(c["significant"] for c in doc["comparisons"])
    assert text.count(r"\begin{table}") == 1 + len(doc["datasets"])
    assert text.count(r"\begin{tabular}") == text.count(r"\begin{rankwisefit}")
    for dataset in doc["datasets"]:
        assert f"{dataset}: protocol" in text
    assert "(0 skipped)" in text and "p(Holm) $<$ 0.05" in text
    _assert_compiles(text, tmp_path)
    assert (tmp_path / "report.pdf").stat().st_size > 0


def test_latex_tables_fit_the_page(doc, tmp_path):
    """The toy recall dataset's 11 metric columns (recall@1,2,5 ... map@r) ran far past
    the margin (the demo's digits table ~270 pt): a dataset's columns are now split over
    as many tabulars as fit 17 cm, each column once, in order, the differences too; a
    tabular still too wide (a 300-character encoder name) is scaled down to the line.
    pdflatex reports no overfull box."""
    from rankwise.report import render_latex, view

    text = render_latex(doc)
    log = _assert_compiles(text, tmp_path)
    assert "Overfull" not in log, log[log.index("Overfull") :][:500]
    tables = text.split(r"\begin{table}")[2:]  # the datasets' (the overview first)

    def headers(table: str, first: str) -> list[list[str]]:
        return [
            [cell.strip() for cell in line.removesuffix(r" \\").split(" & ")[1:]]
            for line in table.splitlines()
            if line.startswith("{}" + first + " & ")
        ]

    for (dataset, rows), table in zip(view.by_dataset(doc), tables, strict=True):
        names = [n.replace("_", r"\_") for n in view.metric_names(rows)]
        values, differences = headers(table, "encoder"), headers(table, "b - a")
        assert [h for line in values for h in line] == names  # every column once, in order
        compared = bool(view.dataset_comparisons(doc, dataset))
        assert [h for line in differences for h in line] == (names if compared else [])
        if len(names) == 11:  # the toy recall dataset: split
            assert len(values) > 1 and all(len(v) < 11 for v in values)
    long = json.loads(json.dumps(doc))
    long["results"][0]["encoder"] = "very-long-encoder-name-" * 13
    log = _assert_compiles(render_latex(long), tmp_path)
    assert "Overfull" not in log


def test_latex_column_groups_are_the_fewest_and_narrowest_that_fit():
    """Brute force over every split of up to 8 units: the groups are as few as a split
    whose multi-unit groups fit the room allows (a unit wider than the room alone is a
    group of its own), and of those the widest is the narrowest. A unit too wide alone
    once let the other groups grow to its width, past the room (a tabular scaled down
    when a split that fits existed)."""
    import itertools
    import random

    from rankwise.report.latex import _COLUMN_SEP_PT, TABLE_WIDTH_PT, _packed

    rng = random.Random(0)
    for _ in range(1500):
        n, first = rng.randint(1, 8), rng.uniform(20, 200)
        widths = [rng.choice((rng.uniform(20, 150), rng.uniform(150, 500))) for _ in range(n)]
        units, column = [], 0
        for w in widths:
            size = rng.randint(1, 3)
            units.append((list(range(column, column + size)), w))
            column += size
        room = TABLE_WIDTH_PT - first - _COLUMN_SEP_PT
        best = None
        for cuts in itertools.product((False, True), repeat=n - 1):
            parts, part = [], [0]
            for i, cut in enumerate(cuts, 1):
                if cut:
                    parts.append(part)
                    part = []
                part.append(i)
            parts.append(part)
            sums = [sum(widths[i] for i in part) for part in parts]
            if all(w <= room or len(part) == 1 for w, part in zip(sums, parts, strict=True)):
                key = (len(parts), max(sums))
                best = key if best is None or key < best else best
        groups = _packed(first, units)
        assert [c for g in groups for c in g] == list(range(column))  # each once, in order
        unit_of = {c: i for i, (columns, _) in enumerate(units) for c in columns}
        members = [sorted({unit_of[c] for c in g}) for g in groups]
        sums = [sum(widths[i] for i in m) for m in members]
        assert all(w <= room or len(m) == 1 for w, m in zip(sums, members, strict=True)), (
            widths,
            room,
        )
        assert len(groups) == best[0] and max(sums) == pytest.approx(best[1]), (widths, room)


def _assert_compiles(text: str, folder) -> str:
    """``text`` as report.tex in ``folder`` compiles with pdflatex (skip without it);
    returns pdflatex's log."""
    import shutil
    import subprocess

    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: texlive-latex-recommended)")
    (folder / "report.tex").write_text(text)
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "report.tex"],
        cwd=folder,
        capture_output=True,
        encoding="utf-8",
        errors="replace",  # TeX echoes 8-bit bytes of the input
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return (folder / "report.log").read_text(errors="replace")


def test_too_few_resamples_are_said_in_every_document(doc, tmp_path):
    """With fewer resamples than a 95% interval needs (40) the sentence on how the
    intervals were made says so in the LaTeX caption (which still compiles), the
    Markdown and the HTML."""
    from rankwise.report import render_html, render_latex, render_markdown

    doc = json.loads(json.dumps(doc))
    doc["statistics"]["resamples"] = 10
    note = "Note: 10 resamples are too few for 95% intervals"
    assert note.replace("%", r"\%") in render_latex(doc)
    assert note in render_markdown(doc) and note in render_html(doc)
    _assert_compiles(render_latex(doc), tmp_path)


def test_latex_compiles_with_any_character_in_names(doc, tmp_path):
    """Greek (math mode), CJK and emoji (their code point), Latin-1 and Latin Extended-A,
    ``|`` and ``"``: report.tex still compiles with pdflatex's default fonts."""
    from rankwise.report import render_latex
    from rankwise.report.latex import _MATH, _TEXT

    encoder = doc["results"][0]["encoder"]
    tricky = 'vit_\u03bb0.5 \u6a21\u578b \U0001f600 a|b "q" caf\u00e9'
    doc = json.loads(json.dumps(doc).replace(json.dumps(encoder), json.dumps(tricky)))
    doc["title"] = "".join(sorted(_TEXT)) + "".join(_MATH)
    text = render_latex(doc)
    assert r"vit\_\ensuremath{\lambda}0.5 \texttt{[U+6A21]}\texttt{[U+578B]}" in text
    assert r"\texttt{[U+1F600]} a\textbar{}b {\ttfamily\char34}q" in text
    _assert_compiles(text, tmp_path)


def test_latex_rows_may_start_with_a_bracket_or_a_star(doc, tmp_path):
    """A first cell ``[v1] r50`` after ``\\\\`` or ``\\midrule`` was read as an optional
    argument (pdflatex failed); ``*best`` as ``\\\\*`` (the star vanished)."""
    from rankwise.report import render_latex

    names = {"enc-a": "[v1] r50", "enc-b": "*best"}
    text = json.dumps(doc)
    for old, new in names.items():
        text = text.replace(json.dumps(old), json.dumps(new))
    tex = render_latex(json.loads(text))
    assert "{}[v1] r50 & " in tex and "{}*best & " in tex
    rows = [line for line in tex.splitlines() if line.endswith(r" \\")]
    assert rows and all(line.startswith("{}") for line in rows)
    _assert_compiles(tex, tmp_path)


def test_cli_writes_csv_and_tex(results, tmp_path):
    from rankwise.report import render_csv, render_latex

    _, metrics = results
    invoke(
        "report",
        *metrics[:2],
        "--resamples",
        "40",
        "--worst-queries",
        "0",
        "--json",
        tmp_path / "r.json",
        "--csv",
        tmp_path / "r.csv",
        "--tex",
        tmp_path / "r.tex",
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (tmp_path / "r.csv").read_text() == render_csv(doc)
    assert (tmp_path / "r.tex").read_text() == render_latex(doc)
    assert not (tmp_path / "report.html").exists()


def _rows(names, values, protocol="reid"):
    return [
        {"encoder": n, "protocol": protocol, "metrics": {"rank1": v, "map": v / 2}}
        for n, v in zip(names, values, strict=True)
    ]


def test_sweep_positions_are_the_numbers_in_the_checkpoint_names():
    from rankwise.report.view import sweep_positions

    rows = _rows(["r50@epoch_2", "r50@epoch_10", "r50@epoch_60"], [1, 2, 3])
    assert sweep_positions(rows) == [2, 10, 60]
    assert sweep_positions(_rows(["osnet@model-5", "osnet@model-20"], [1, 2])) == [5, 20]
    # not one sweep, a name without a number, or out of order: no numeric axis
    assert sweep_positions(_rows(["a@epoch_1", "b@epoch_2"], [1, 2])) is None
    assert sweep_positions(_rows(["r50@epoch_1", "r50@final"], [1, 2])) is None
    assert sweep_positions(_rows(["r50@epoch_9", "r50@epoch_3"], [1, 2])) is None
    assert sweep_positions(_rows(["pixels", "hog"], [1, 2])) is None


def test_best_row_is_the_highest_headline_metric_first_on_ties():
    from rankwise.report.view import best_row

    assert best_row(_rows(["a", "b", "c"], [50.0, 70.0, 60.0])) == 1
    assert best_row(_rows(["a", "b", "c"], [70.0, 70.0, 60.0])) == 0
    recall = [
        {"encoder": n, "protocol": "recall", "metrics": {"recall@1": v, "map": 100 - v}}
        for n, v in (("a", 10.0), ("b", 30.0))
    ]
    assert best_row(recall) == 1


def test_trend_chart_draws_sweeps_as_lines_and_other_encoders_as_points(monkeypatch):
    import rankwise.report.plots as plots

    drawn = []
    real = plots._figure

    def spy(*args, **kwargs):
        fig, ax = real(*args, **kwargs)
        drawn.append(ax)
        return fig, ax

    monkeypatch.setattr(plots, "_figure", spy)
    plots.trend_chart(_rows(["r@epoch_1", "r@epoch_5", "r@epoch_9"], [10.0, 30.0, 20.0]))
    plots.trend_chart(_rows(["pixels", "hog", "color"], [10.0, 30.0, 20.0]))
    sweep, unordered = drawn
    lines = [ln for ln in sweep.get_lines() if ln.get_label() in ("rank1", "map")]
    assert [list(ln.get_xdata()) for ln in lines] == [[1, 5, 9], [1, 5, 9]]
    assert all(ln.get_linestyle() == "-" for ln in lines)
    ringed = next(ln for ln in sweep.get_lines() if ln.get_label() == "best (rank1)")
    assert list(ringed.get_xdata()) == [5] and list(ringed.get_ydata()) == [30.0]
    points = [c for c in unordered.containers if c.get_label() in ("rank1", "map")]
    assert len(points) == 2  # errorbar containers: markers, never joined by a line
    assert all(c.lines[0].get_linestyle() == "None" for c in points)
    # equal values of two metrics sit side by side, not on top of each other
    assert list(points[0].lines[0].get_xdata()) != list(points[1].lines[0].get_xdata())
    ring = next(ln for ln in unordered.get_lines() if ln.get_label() == "best (rank1)")
    rank1 = next(c for c in points if c.get_label() == "rank1").lines[0]
    assert list(ring.get_xdata()) == [rank1.get_xdata()[1]]  # on hog's rank1 point
    assert sweep.get_xlabel().startswith("checkpoint")


def test_metric_colours_never_reuse_encoder_colours():
    from rankwise.report.plots import _colors, _metric_colors

    encoders = set(_colors([f"e{i}" for i in range(20)]).values())
    metrics = list(_metric_colors(["rank1", "rank5", "rank10", "map", "minp", "mrr"]).values())
    assert len(set(metrics)) == 6 and not encoders & set(metrics)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_report_that_fails_to_write_one_file_writes_none(results, tmp_path, workers):
    """A full disk at the third document left the first two (and the figures) new and
    the rest old, exit 2; every file is now staged and renamed in only when all are
    written (README: a failure writes nothing).  The disk "fills" by a file-size limit
    that the figures and the smaller documents fit and the HTML does not."""
    import resource
    import subprocess

    from helpers import RANKWISE

    _, metrics = results
    out = tmp_path / "out"
    args = [*metrics, "--resamples", "20", "--worst-queries", "0", "--workers", workers]
    args += ["--figures", out / "figures", "--figure-formats", "svg", "--out-dir", out]
    invoke("report", *args, "--title", "OLD")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert any(p.suffix == ".svg" for p in before) and (out / "report.md") in before
    sizes = sorted(len(data) for data in before.values())
    assert before[out / "report.html"] == max(before.values(), key=len)
    limit = (sizes[-1] + sizes[-2]) // 2  # the HTML alone over it

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [RANKWISE, "report", *map(str, args), "--title", "NEW"],
        capture_output=True, text=True, timeout=300, preexec_fn=small_files,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "report.html" in proc.stderr and "File too large" in proc.stderr, proc.stderr
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # no new document or figure, no temporary file left


def test_an_interrupt_while_waiting_for_the_figure_child_leaves_no_temporary_file(
    results, tmp_path, monkeypatch
):
    """A KeyboardInterrupt in the parent only (a notebook kernel's interrupt) while it
    waited for the child drawing figures discarded the staged files, but the child went
    on staging its own: .tmp files left beside the figures.  The interrupt comes once
    the child has staged a figure (those are discarded too) and is drawing the next."""
    import os
    import signal
    import threading
    import time

    from rankwise.report import figures, write_report

    _, metrics = results
    wait = figures.DrawInBackground.wait
    out = tmp_path / "figures"

    def interrupt_once_a_figure_is_staged() -> None:
        deadline = time.monotonic() + 60
        while not list(out.glob(".*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    def interrupted_wait(self):
        threading.Thread(target=interrupt_once_a_figure_is_staged, daemon=True).start()
        return wait(self)

    monkeypatch.setattr(figures.DrawInBackground, "wait", interrupted_wait)
    # every figure left to the child: it is still drawing when the interrupt comes
    monkeypatch.setattr(figures.DrawInBackground, "draw_rest", lambda self: None)
    with pytest.raises(KeyboardInterrupt):
        write_report(metrics, json_path=tmp_path / "r.json", figures_dir=out, workers=2,
                     resamples=20, worst_queries=0)  # fmt: skip
    time.sleep(3)  # the process lives on; a child still drawing would write now
    assert not [p.name for p in out.glob(".*.tmp")]


def test_staged_files_refuse_one_file_written_twice(tmp_path):
    # a document path naming one of the figures: the second write failed with "cannot
    # write a temporary file beside it (File exists)"
    from rankwise.errors import RankwiseError
    from rankwise.store import StagedFiles

    (tmp_path / "link.svg").symlink_to("a.svg")
    for second in ("a.svg", "link.svg"):
        files = StagedFiles()
        files.write(tmp_path / "a.svg", b"figure")
        with pytest.raises(RankwiseError, match=r"two outputs of this command name this file"):
            files.write(tmp_path / second, b"document")
        files.discard()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["link.svg"]
    files = StagedFiles()
    files.write(tmp_path / "a.svg", b"figure")
    files.write(tmp_path / "b.json", b"{}")
    assert not (tmp_path / "a.svg").exists()  # nothing under a final name before commit
    files.commit()
    assert (tmp_path / "a.svg").read_bytes() == b"figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.svg", "b.json", "link.svg"]


def test_a_report_run_from_another_folder_finds_the_evaluations_stores(results, tmp_path):
    """Metrics files with relative paths (the pipeline's), given to `rankwise report` from
    another folder: the ranks stores and statistics summaries are also looked for from the
    folder the evaluation ran in (its recorded working_directory), so the report has every
    interval, CMC and test, equal to the one run where the files were written (it had
    none: "run the report where the pipeline ran"), also when the other folder holds
    another evaluation's store under the same relative path (never read for it)."""
    root, _ = results
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    manifests = root / "manifests" / "toy"
    project.mkdir()
    metrics = []
    for encoder in ("enc-a", "enc-b"):
        ranks = f"results/ranks/toy/{encoder}.zarr"
        embeddings = root / "embeddings" / "toy" / encoder
        ranked = run_rankwise(
            *("rank", "--query", manifests / "query.csv", "--gallery"),
            *(manifests / "gallery.csv", "--query-embeddings", embeddings / "query.zarr"),
            *("--gallery-embeddings", embeddings / "gallery.zarr", "--out", ranks),
            cwd=project,
        )
        assert ranked.returncode == 0, ranked.stderr
        out = f"results/metrics/toy/{encoder}"
        measured = run_rankwise(
            *("metrics", ranks, "--ks", "1,2,5", "--output", f"{out}.json"),
            *("--stats-output", f"{out}.stats.npz", "--resamples", "50"),
            cwd=project,
        )
        assert measured.returncode == 0, measured.stderr
        metrics.append(project / f"{out}.json")
    # another folder with a store of the same relative name: enc-b's where enc-a's is
    (elsewhere / "results" / "ranks" / "toy").mkdir(parents=True)
    shutil.copytree(
        project / "results/ranks/toy/enc-b.zarr", elsewhere / "results/ranks/toy/enc-a.zarr"
    )
    docs = {}
    for folder in (project, elsewhere):
        done = run_rankwise(
            *("report", *metrics, "--resamples", "50", "--json", folder / "r.json"), cwd=folder
        )
        assert done.returncode == 0, done.stderr
        assert "note: no intervals" not in done.stderr
        docs[folder] = json.loads((folder / "r.json").read_text())
    there, here = docs[project], docs[elsewhere]
    assert here["statistics"]["without_statistics"] == []
    for a, b in zip(there["results"], here["results"], strict=True):
        assert a["ci95"] and a["ci95"] == b["ci95"] and a["cmc"] == b["cmc"]
    assert here["comparisons"] == there["comparisons"] != []
    # the project moved, its metrics files given from the other folder: its stores are
    # found from the metrics files' folders (they were looked for from here and from
    # the recorded folder, now gone, alone: no intervals, no tests)
    moved = project.rename(tmp_path / "moved")
    metrics = [moved / path.relative_to(project) for path in metrics]
    done = run_rankwise(
        *("report", *metrics, "--resamples", "50", "--json", elsewhere / "m.json"), cwd=elsewhere
    )
    assert done.returncode == 0, done.stderr
    assert "note: no intervals" not in done.stderr
    away = json.loads((elsewhere / "m.json").read_text())
    assert away["statistics"]["without_statistics"] == []
    for a, b in zip(there["results"], away["results"], strict=True):
        assert a["ci95"] and a["ci95"] == b["ci95"] and a["cmc"] == b["cmc"]
    assert away["comparisons"] == there["comparisons"]


def _encode_again(project: Path, rng: np.random.Generator) -> None:
    """The project's data/{query,gallery}.zarr written again with other rows and the same
    attributes but the rows' digest (its images rewritten and encoded again)."""
    for split in ("query", "gallery"):
        store = project / f"data/{split}.zarr"
        kept = {k: v for k, v in store_attrs(store).items() if k not in ("kind", "complete")}
        rows = np.asarray(zarr.open_group(str(store), mode="r")["embeddings"])
        shutil.rmtree(store)
        other = rng.normal(size=rows.shape).astype(np.float32)
        write_embeddings(store, iter([other]), len(other), attrs=kept)


def test_a_moved_project_lists_its_worst_queries_by_id(results, tmp_path):
    """A project moved to another folder (its stores still name the old one as their
    working directory): the report run there, with no cache, finds the manifests and
    embeddings it names by the same relative paths, so the worst queries keep their ids
    and nearest items (they were "row N" with none: the old folder was looked in
    alone), also when the old folder holds another project's files of the same names
    and attributes (never read for it: the embeddings' digest differs, and the ranks
    store found from here sends the search here first).  A manifest that is not the one
    ranked (re-sorted: same rows, other order) is refused in one line: rows are matched
    by position."""
    root, _ = results
    project = tmp_path / "project"
    toy = project / "data"
    shutil.copytree(root / "manifests" / "toy", toy)
    for split in ("query", "gallery"):
        shutil.copytree(root / f"embeddings/toy/enc-a/{split}.zarr", toy / f"{split}.zarr")
    ranked = run_rankwise(
        *("rank", "--query", "data/query.csv", "--gallery", "data/gallery.csv"),
        *("--query-embeddings", "data/query.zarr", "--gallery-embeddings", "data/gallery.zarr"),
        *("--out", "ranks.zarr"),
        cwd=project,
    )
    assert ranked.returncode == 0, ranked.stderr
    measured = run_rankwise("metrics", "ranks.zarr", "--output", "m.json", cwd=project)
    assert measured.returncode == 0, measured.stderr

    def worst(folder: Path) -> list[dict]:
        args = ("report", "m.json", "--resamples", "0", "--worst-queries", "3")
        done = run_rankwise(*args, "--json", "r.json", cwd=folder)
        assert done.returncode == 0, done.stderr
        (entry,) = json.loads((folder / "r.json").read_text())["results"]
        return entry["worst_queries"]["queries"]

    def listed(queries: list[dict]) -> list:
        return [(q["id"], q["label"], [t["id"] for t in q["top"]]) for q in queries]

    def identity_ci(folder: Path) -> dict:
        args = ("ci", "ranks.zarr", "--by", "identity", "--resamples", "50")
        done = run_rankwise(*args, "--output", "ci.json", cwd=folder)
        assert done.returncode == 0, done.stderr
        return json.loads((folder / "ci.json").read_text())

    before, ci = worst(project), identity_ci(project)
    assert all(q["top"] and not q["id"].startswith("row ") for q in before)
    moved = project.rename(tmp_path / "moved")
    assert listed(worst(moved)) == listed(before)
    # another project at the old folder: the same manifests (bytes), embeddings of the
    # same attributes but other rows (its images rewritten and encoded again): never
    # read for the moved one's ranks, neither for nearest items nor for image paths
    shutil.copytree(moved, project)
    before_digest = store_attrs(project / "data/gallery.zarr")["embeddings_sha256"]
    _encode_again(project, np.random.default_rng(7))
    assert store_attrs(project / "data/gallery.zarr")["embeddings_sha256"] != before_digest
    after = worst(moved)
    assert listed(after) == listed(before)
    assert not any(str(project) in (q["image"] or "") for q in after)
    assert identity_ci(moved)["metrics"] == ci["metrics"]
    # from a third folder: the moved project's files are found from its metrics file's
    # folder (the old folder's, found first, are not the ones ranked: passed over); they
    # were not looked for there, and the old folder's were refused, exit 2
    (tmp_path / "elsewhere").mkdir()
    args = ("report", moved / "m.json", "--worst-queries", "3", "--by", "identity")
    done = run_rankwise(*args, "--resamples", "50", "--json", "x.json", cwd=tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    (entry,) = json.loads((tmp_path / "elsewhere/x.json").read_text())["results"]
    assert listed(entry["worst_queries"]["queries"]) == listed(before)
    assert not any(str(project) in (q["image"] or "") for q in entry["worst_queries"]["queries"])
    # its intervals by identity: the moved project's query labels (a report run in it)
    there = run_rankwise(*args, "--resamples", "50", "--json", "y.json", cwd=moved)
    assert there.returncode == 0, there.stderr
    (same,) = json.loads((moved / "y.json").read_text())["results"]
    assert entry["ci95"] and entry["ci95"] == same["ci95"]
    # the moved project's own manifest re-sorted, the old folder gone: no file holds the
    # ranked rows
    shutil.rmtree(project)
    lines = (moved / "data/query.csv").read_text().splitlines()
    (moved / "data/query.csv").write_text("\n".join([lines[0], *reversed(lines[1:])]) + "\n")
    args = ("report", "m.json", "--resamples", "0", "--worst-queries", "3", "--json", "x.json")
    done = run_rankwise(*args, cwd=moved)
    assert done.returncode == 2 and not (moved / "x.json").exists()
    assert "query.csv: not the query manifest the ranks were computed from" in done.stderr


def test_a_copied_projects_report_run_from_the_original_shows_the_copys_images(results, tmp_path):
    """A project copied, its copy encoded and ranked again (the same manifests, byte for
    byte; other embeddings): the copy's metrics file reported from inside the original
    finds the copy's ranks store (the original's, found first under the same relative
    name, differs from its provenance), and the manifests and embeddings from the copy's
    folder too.  Before, the original's folder was searched first for them (its store
    exists there, though not the one read): the original's manifests were taken (same
    sha256), so the worst queries and their nearest items showed the original's
    images."""
    root, _ = results
    original, copy = tmp_path / "original", tmp_path / "copy"
    shutil.copytree(root / "manifests" / "toy", original / "data")
    for split in ("query", "gallery"):
        store = root / f"embeddings/toy/enc-a/{split}.zarr"
        shutil.copytree(store, original / f"data/{split}.zarr")

    def evaluate(project: Path) -> None:
        shutil.rmtree(project / "ranks.zarr", ignore_errors=True)
        ranked = run_rankwise(
            *("rank", "--query", "data/query.csv", "--gallery", "data/gallery.csv"),
            *("--query-embeddings", "data/query.zarr"),
            *("--gallery-embeddings", "data/gallery.zarr", "--out", "ranks.zarr"),
            cwd=project,
        )
        assert ranked.returncode == 0, ranked.stderr
        measured = run_rankwise("metrics", "ranks.zarr", "--output", "m.json", cwd=project)
        assert measured.returncode == 0, measured.stderr

    evaluate(original)
    shutil.copytree(original, copy)
    _encode_again(copy, np.random.default_rng(3))
    evaluate(copy)

    def worst(folder: Path) -> list[dict]:
        args = ("report", copy / "m.json", "--resamples", "0", "--worst-queries", "3")
        done = run_rankwise(*args, "--json", folder / "r.json", cwd=folder)
        assert done.returncode == 0, done.stderr
        (entry,) = json.loads((folder / "r.json").read_text())["results"]
        return entry["worst_queries"]["queries"]

    own, away = worst(copy), worst(original)
    assert [(q["id"], [t["id"] for t in q["top"]]) for q in away] == [
        (q["id"], [t["id"] for t in q["top"]]) for q in own
    ]
    images = [q["image"] for q in away] + [t["image"] for q in away for t in q["top"]]
    assert all(images)
    # an image path is relative to the folder the report ran in: the copy's images
    assert all((original / image).resolve().is_relative_to(copy) for image in images), images


def test_a_ranks_store_of_another_evaluation_at_the_named_path_is_not_read(results, tmp_path):
    """A metrics file whose relative ranks path names, from the folder the report runs
    in, another evaluation's store (another pipeline folder's results/ranks/... of the
    same name) gets no statistics from it: before, its intervals, CMC and tests were
    that store's (an interval that did not hold the file's own value), exit 0."""
    _, metrics = results
    source = {p.stem: p for p in metrics if p.parent.name == "toy"}
    other = json.loads(source["enc-a"].read_text())["provenance"]["ranks"]
    data = json.loads(source["enc-b"].read_text())
    data["provenance"]["ranks"] = other  # enc-a's store where enc-b's is looked for
    data["provenance"].pop("stats", None)
    given = tmp_path / "toy" / "enc-b.json"
    given.parent.mkdir()
    given.write_text(json.dumps(data))
    doc = build_report([given], resamples=50, worst_queries=2)
    (entry,) = doc["results"]
    assert entry["ci95"] is None and entry["cmc"] is None and entry["worst_queries"] is None
    (why,) = doc["statistics"]["without_statistics"]
    assert "is not the one it was computed from" in why["reason"]
    assert "'gallery_embeddings' differs" in why["reason"]
