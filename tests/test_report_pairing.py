"""Which evaluations the report pairs, and on which labels: never other queries.

- evaluations ranked on other query/gallery manifests (re-sorted rows, other files) are
  refused by the report as by `rankwise compare` (the report paired them by row number);
- ``--by identity`` reads the query manifest by row: a manifest edited or re-sorted
  since ranking is refused (it silently clustered the queries by other labels);
- an encoder whose id-keyed features dropped query rows (``on_missing: drop``) is
  reported, its pairs with the others not tested, and the report says why (the whole
  report failed); two that dropped as many query rows, not the same ones, are not paired
  row by row (they were, by the report and by `rankwise compare`);
- the best checkpoint does not depend on the order of the files when their metric sets
  differ; the CMC's points are the bits of ``recall@K``; Markdown names are escaped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from helpers import run_rankwise

from rankwise.metrics import cmc, mean
from rankwise.report import render_latex
from rankwise.report.markdown import _escape

N_QUERY, N_GALLERY = 18, 24  # 6 labels: 3 queries and 4 gallery items each


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """q.csv / g.csv with two query embeddings (q.npy, q2.npy, the weaker), random ones
    (qr.npy), and the same queries re-sorted (qp.csv, qp.npy, q2p.npy)."""
    root = tmp_path_factory.mktemp("pairing")
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(6, 4))
    q_labels, g_labels = np.repeat(np.arange(6), 3), np.repeat(np.arange(6), 4)
    query = pd.DataFrame({"id": [f"q{i}" for i in range(N_QUERY)], "label": q_labels})
    query.to_csv(root / "q.csv", index=False)
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(N_GALLERY)], "label": g_labels})
    gallery.to_csv(root / "g.csv", index=False)
    q = (centres[q_labels] + rng.normal(size=(N_QUERY, 4))).astype(np.float32)
    q2 = (centres[q_labels] + 1.5 * rng.normal(size=(N_QUERY, 4))).astype(np.float32)
    np.save(root / "q.npy", q)
    np.save(root / "q2.npy", q2)
    np.save(root / "qr.npy", rng.normal(size=(N_QUERY, 4)).astype(np.float32))
    np.save(root / "g.npy", (centres[g_labels] + rng.normal(size=(N_GALLERY, 4))).astype("f4"))
    order = rng.permutation(N_QUERY)
    query.iloc[order].to_csv(root / "qp.csv", index=False)
    np.save(root / "qp.npy", q[order])
    np.save(root / "q2p.npy", q2[order])
    return root


def ok(*args) -> str:
    proc = run_rankwise(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def one_error_line(*args) -> str:
    proc = run_rankwise(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def rank(data: Path, out: Path, query: str = "q.csv", embeddings: str = "q.npy") -> Path:
    ok(
        "rank", "--query", data / query, "--query-embeddings", data / embeddings,
        "--gallery", data / "g.csv", "--gallery-embeddings", data / "g.npy", "--out", out,
    )  # fmt: skip
    return out


def metrics(store: Path, out: Path, *options: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    ok("metrics", store, "--output", out, *options)
    return out


def report(tmp_path: Path, *files: Path, resamples: int = 200) -> dict:
    out = tmp_path / "out"
    ok(
        "report", *files, "--json", out / "r.json", "--md", out / "r.md", "--html",
        out / "r.html", "--resamples", resamples, "--worst-queries", 0,
    )  # fmt: skip
    return json.loads((out / "r.json").read_text())


def test_the_report_refuses_evaluations_of_another_query_manifest(data, tmp_path):
    """B and Bp are the same embeddings of the same queries, Bp's rows re-sorted: the
    report paired them row by row (difference interval [-14, 14] instead of [0, 0])."""
    a = rank(data, tmp_path / "A.zarr")
    bp = rank(data, tmp_path / "Bp.zarr", "qp.csv", "q2p.npy")
    files = [metrics(s, tmp_path / "m" / "ds" / f"{s.stem}.json") for s in (a, bp)]
    line = one_error_line(
        "report", *files, "--json", tmp_path / "r.json", "--md", tmp_path / "r.md",
        "--html", tmp_path / "r.html", "--resamples", 200, "--worst-queries", 0,
    )  # fmt: skip
    assert "ranked on another query manifest than A" in line
    # as `rankwise compare` says
    assert "ranked on another query manifest" in one_error_line("compare", a, bp)


def test_by_identity_refuses_a_query_manifest_changed_since_ranking(data, tmp_path):
    (tmp_path / "q.csv").write_bytes((data / "q.csv").read_bytes())
    ok(
        "rank", "--query", tmp_path / "q.csv", "--query-embeddings", data / "q.npy",
        "--gallery", data / "g.csv", "--gallery-embeddings", data / "g.npy",
        "--out", tmp_path / "A.zarr",
    )  # fmt: skip
    store = tmp_path / "A.zarr"
    ci = ["ci", store, "--by", "identity", "--resamples", 300, "--metrics", "map"]
    before = ok(*ci)
    shutil.copy(data / "q.csv", tmp_path / "copy.csv")  # the same bytes elsewhere: fine
    assert ok(*ci, "--labels", tmp_path / "copy.csv") == before
    line = one_error_line(*ci, "--labels", data / "qp.csv")  # as many rows, re-sorted
    assert f"{data / 'qp.csv'}: not the query manifest the ranks were computed from" in line
    shutil.copy(data / "qp.csv", tmp_path / "q.csv")  # the manifest itself re-sorted
    line = one_error_line(*ci)
    assert f"{tmp_path / 'q.csv'}: not the query manifest the ranks were computed from" in line


def _ranked_without_query_rows(data: Path, tmp_path: Path, name: str, drop: list[int]) -> Path:
    """A ranks store ``<name>.zarr`` of id-keyed query features (q2.npy) lacking the rows
    ``drop`` of q.csv, against g.npy."""
    table = pd.read_csv(data / "q.csv", dtype=str)
    keep = [i for i in range(N_QUERY) if i not in drop]
    np.save(tmp_path / f"{name}-q.npy", np.load(data / "q2.npy")[keep])
    (tmp_path / f"{name}-q.txt").write_text("\n".join(table["id"].iloc[keep]) + "\n")
    options = {
        "path": str(tmp_path / f"{name}-q.npy"),
        "ids": str(tmp_path / f"{name}-q.txt"),
        "on_missing": "drop",
    }
    ok(
        "encode", "--kind", "precomputed", "--options", json.dumps(options),
        "--manifest", data / "q.csv", "--out", tmp_path / f"{name}-q.zarr",
    )  # fmt: skip
    return rank(data, tmp_path / f"{name}.zarr", embeddings=str(tmp_path / f"{name}-q.zarr"))


def test_an_encoder_that_dropped_query_rows_is_reported_not_compared(data, tmp_path):
    """One query row without features (on_missing: drop): the report failed ("its
    evaluated queries differ ... ranked on the same manifests", which they were)."""
    stores = {
        "A": rank(data, tmp_path / "A.zarr"),
        "B": rank(data, tmp_path / "B.zarr", embeddings="q2.npy"),
        "D": _ranked_without_query_rows(data, tmp_path, "D", [5]),
    }
    files = [metrics(s, tmp_path / "m" / "ds" / f"{n}.json") for n, s in stores.items()]
    doc = report(tmp_path, *files)
    tested = {(c["a"], c["b"]) for c in doc["comparisons"]}
    assert tested == {("A", "B")}
    skipped = doc["statistics"]["not_compared"]
    assert [(s["a"], s["b"]) for s in skipped] == [("A", "D"), ("B", "D")]
    assert skipped[0]["reason"].startswith("their evaluated queries differ (18 and 17;")
    # the dataset's counts are each encoder's, not the first one's (A: 18 queries)
    counts = "; ".join(
        f"{name}: {n} queries (0 skipped), {N_GALLERY} gallery items"
        for name, n in (("A", N_QUERY), ("B", N_QUERY), ("D", N_QUERY - 1))
    )
    for name in ("r.md", "r.html"):
        text = (tmp_path / "out" / name).read_text()
        assert "Not compared: A and D: their evaluated queries differ (18 and 17;" in text
        assert counts in text
    assert f"ds: protocol recall, distance cosine, {counts}. " in render_latex(doc)
    # `rankwise compare` said A's features were id-keyed too ("its id-keyed features and
    # those of A.zarr lack different query rows"): A kept every row
    line = one_error_line("compare", stores["A"], stores["D"])
    assert f"{stores['D']}: its id-keyed features lack query rows that {stores['A']} has" in line
    line = one_error_line("compare", stores["D"], stores["A"])
    assert f"{stores['A']}: it has query rows that {stores['D']}'s id-keyed features lack" in line


def test_as_many_dropped_query_rows_are_compared_only_when_the_same(data, tmp_path):
    """Two encoders whose id-keyed features each lacked one query row, not the same one,
    were paired row by row (the units count the kept rows: the same numbers, other
    queries), by `rankwise compare` and by the report."""
    stores = {
        "D": _ranked_without_query_rows(data, tmp_path, "D", [5]),
        "E": _ranked_without_query_rows(data, tmp_path, "E", [5]),  # the same row
        "F": _ranked_without_query_rows(data, tmp_path, "F", [6]),  # as many, another
    }
    files = [metrics(s, tmp_path / "m" / "ds" / f"{n}.json") for n, s in stores.items()]
    doc = report(tmp_path, *files)
    assert {(c["a"], c["b"]) for c in doc["comparisons"]} == {("D", "E")}
    skipped = {(s["a"], s["b"]): s["reason"] for s in doc["statistics"]["not_compared"]}
    assert set(skipped) == {("D", "F"), ("E", "F")}
    reason = "their evaluated queries differ (17 and 17, not the same ones; a paired test"
    assert all(r.startswith(reason) for r in skipped.values()), skipped
    assert f"Not compared: D and F: {reason}" in render_latex(doc)  # not only MD and HTML
    ok("compare", stores["D"], stores["E"])
    line = one_error_line("compare", stores["D"], stores["F"])
    assert f"{stores['F']}: its id-keyed features and those of {stores['D']}" in line
    assert "lack different query rows (on_missing: drop)" in line
    # a store of an earlier rankwise (no record of which rows): never paired
    group = zarr.open_group(stores["E"], mode="r+")
    attrs = dict(group.attrs)
    del attrs["query_embeddings"]["id_alignment"]["kept_rows_sha256"]
    group.attrs.update(attrs)
    line = one_error_line("compare", stores["D"], stores["E"])
    assert "which query rows" in line and "is not recorded" in line


def _ranked_without_gallery_rows(
    data: Path, tmp_path: Path, name: str, drop: list[int], gallery: Path | None = None
) -> Path:
    """A ranks store ``<name>.zarr`` of q.npy against id-keyed gallery features lacking the
    rows ``drop`` of ``gallery`` (default g.csv; another manifest: rows of g.csv by id)."""
    full = pd.read_csv(data / "g.csv", dtype=str)
    table = full if gallery is None else pd.read_csv(gallery, dtype=str)
    vectors = np.load(data / "g.npy")[pd.Index(full["id"]).get_indexer(table["id"])]
    keep = [i for i in range(len(table)) if i not in drop]
    np.save(tmp_path / f"{name}.npy", vectors[keep])
    (tmp_path / f"{name}.txt").write_text("\n".join(table["id"].iloc[keep]) + "\n")
    options = {
        "path": str(tmp_path / f"{name}.npy"),
        "ids": str(tmp_path / f"{name}.txt"),
        "on_missing": "drop",
    }
    manifest = gallery or data / "g.csv"
    ok(
        "encode", "--kind", "precomputed", "--options", json.dumps(options),
        "--manifest", manifest, "--out", tmp_path / f"{name}-g.zarr",
    )  # fmt: skip
    ok(
        "rank", "--query", data / "q.csv", "--query-embeddings", data / "q.npy",
        "--gallery", manifest, "--gallery-embeddings", tmp_path / f"{name}-g.zarr",
        "--out", tmp_path / f"{name}.zarr",
    )  # fmt: skip
    return tmp_path / f"{name}.zarr"


def test_an_encoder_that_dropped_gallery_rows_is_reported_not_compared(data, tmp_path):
    """Gallery rows without features (on_missing: drop, as for torchreid's features of a
    gallery without its junk rows) stopped the whole report: "num_gallery 21 differs
    from A's 24"."""
    dropped = _ranked_without_gallery_rows(data, tmp_path, "D", [0, 1, 2])
    stores = {"A": rank(data, tmp_path / "A.zarr"), "D": dropped}
    stores["B"] = rank(data, tmp_path / "B.zarr", embeddings="q2.npy")
    files = [metrics(s, tmp_path / "m" / "ds" / f"{n}.json") for n, s in stores.items()]
    doc = report(tmp_path, *files)
    assert {(c["a"], c["b"]) for c in doc["comparisons"]} == {("A", "B")}
    skipped = doc["statistics"]["not_compared"]
    assert [(s["a"], s["b"]) for s in skipped] == [("A", "D"), ("D", "B")]
    reason = "they ranked different galleries (D left out 3 gallery rows without features;"
    assert all(s["reason"].startswith(reason) for s in skipped), skipped
    assert f"Not compared: A and D: {reason}" in (tmp_path / "out" / "r.md").read_text()
    # asked for directly, the pair is still refused, in one line
    line = one_error_line("compare", stores["A"], stores["D"])
    assert "num_gallery 21 differs from" in line


def test_as_many_dropped_gallery_rows_are_compared_only_when_the_same(data, tmp_path):
    """Two encoders whose id-keyed features each lacked 3 gallery rows were paired (the
    same num_gallery) though they ranked different galleries; the stores now record which
    rows they kept (id_alignment.kept_rows_sha256)."""
    stores = {
        "E": _ranked_without_gallery_rows(data, tmp_path, "E", [0, 1, 2]),
        "F": _ranked_without_gallery_rows(data, tmp_path, "F", [0, 1, 2]),  # the same rows
        "G": _ranked_without_gallery_rows(data, tmp_path, "G", [3, 4, 5]),  # as many, others
    }
    files = [metrics(s, tmp_path / "m" / "ds" / f"{n}.json") for n, s in stores.items()]
    doc = report(tmp_path, *files)
    assert {(c["a"], c["b"]) for c in doc["comparisons"]} == {("E", "F")}
    skipped = {(s["a"], s["b"]): s["reason"] for s in doc["statistics"]["not_compared"]}
    assert set(skipped) == {("E", "G"), ("F", "G")}
    assert skipped["E", "G"].startswith(
        "they ranked different galleries (E left out 3 gallery rows and G left out 3 gallery "
        "rows without features, not the same ones;"
    )
    ok("compare", stores["E"], stores["F"])
    line = one_error_line("compare", stores["E"], stores["G"])
    assert "its id-keyed features and those of" in line and "lack different gallery rows" in line
    # a store of an earlier rankwise (no record of which rows): never paired
    group = zarr.open_group(tmp_path / "F.zarr", mode="r+")
    attrs = dict(group.attrs)
    del attrs["gallery_embeddings"]["id_alignment"]["kept_rows_sha256"]
    group.attrs.update(attrs)
    line = one_error_line("compare", stores["E"], stores["F"])
    assert "is not recorded (a store encoded before rankwise recorded it)" in line


def test_dropped_gallery_rows_do_not_hide_another_gallery_manifest(data, tmp_path):
    """An id-keyed store that dropped gallery rows of *another* gallery manifest (re-sorted
    rows) is an error, as without dropped rows, not a pair listed as not compared."""
    order = np.random.default_rng(2).permutation(N_GALLERY)
    pd.read_csv(data / "g.csv", dtype=str).iloc[order].to_csv(tmp_path / "gp.csv", index=False)
    _ranked_without_gallery_rows(data, tmp_path, "D", [0, 1, 2], gallery=tmp_path / "gp.csv")
    stores = {"A": rank(data, tmp_path / "A.zarr"), "D": tmp_path / "D.zarr"}
    files = [metrics(s, tmp_path / "m" / "ds" / f"{n}.json") for n, s in stores.items()]
    line = one_error_line(
        "report", *files, "--json", tmp_path / "r.json", "--resamples", 200,
        "--worst-queries", 0,
    )  # fmt: skip
    assert "ranked on another gallery manifest than A" in line, line


def test_the_best_checkpoint_does_not_depend_on_the_order_of_the_files(data, tmp_path):
    """'good' (scored without recall@1) is higher on every metric both have than 'weak'
    (random queries); given second, 'weak' was named best by recall@1, which 'good'
    lacks."""
    good_store = rank(data, tmp_path / "good.zarr")
    weak_store = rank(data, tmp_path / "weak.zarr", embeddings="qr.npy")
    good = metrics(good_store, tmp_path / "m" / "ds" / "good.json", "--ks", "5,10")
    weak = metrics(weak_store, tmp_path / "m" / "ds" / "weak.json", "--ks", "1,5,10")
    values = [json.loads(f.read_text())["metrics"] for f in (good, weak)]
    shared = set(values[0]) & set(values[1])
    assert all(values[0][n] >= values[1][n] for n in shared), values
    assert any(values[0][n] > values[1][n] for n in shared), values
    for order in ((good, weak), (weak, good)):
        (best,) = report(tmp_path / order[0].stem, *order, resamples=0)["best"]
        assert best["encoder"] == "good", best
        assert best["metric"] in shared


def test_cmc_points_are_the_bits_of_recall_at_k(data, tmp_path):
    """100 * count / n rounds once, 100 * mean(hits) twice: 2 of 3 gave 66.66666666666667
    on the CMC and 66.66666666666666 as recall@K."""
    hits = np.array([1.0, 1.0, 0.0])
    assert 100.0 * mean(hits) != 100.0 * 2 / 3  # the case itself
    arrays = {
        "offsets": np.array([0, 1, 2, 3]),
        "ranks": np.array([1, 2, 7]),
        "query_index": np.arange(3),
        "group": np.zeros(3, np.int64),
        "step": np.zeros(3, np.int64),
    }
    curve = cmc(arrays, {"protocol": "recall", "num_queries": 3}, max_rank=3)
    assert curve[1] == 100.0 * mean(hits)
    store = rank(data, tmp_path / "A.zarr", embeddings="q2.npy")
    file = metrics(store, tmp_path / "m" / "ds" / "A.json", "--ks", "1,2,3,4,5,10")
    (entry,) = report(tmp_path, file, resamples=0)["results"]
    for k in (1, 2, 3, 4, 5, 10):
        assert entry["cmc"][k - 1] == entry["metrics"][f"recall@{k}"], k


def test_markdown_escapes_markup_in_names():
    """`x|y<z>` lost '<z>' in Markdown renderers (read as an HTML tag); `__init__` was
    bold, `#1` at a line's start a heading, `&lt;` the character '<', `$x$` math on
    GitHub."""
    assert _escape("x|y<z> a*b [c] `d` ~e~ \\ epoch_60 __init__ #1 &lt;\nz $x$") == (
        "x\\|y\\<z\\> a\\*b \\[c\\] \\`d\\` \\~e\\~ \\\\ epoch\\_60 \\_\\_init\\_\\_ \\#1 \\&lt; z "
        "\\$x\\$"
    )
