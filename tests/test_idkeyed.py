"""Id-keyed precomputed features (issue #11 item 3).

Features exported in any row order, or with rows missing (torchreid drops junk rows),
come with one id per row (an ids file beside a .npy, or a Zarr group's ``ids`` array);
the ``precomputed`` encoder puts them in manifest order by id.  Checked here:

- hand-computed alignments, and every ids file format;
- shuffled features + ids -> the store's rows equal the manifest-order features exactly,
  for .npy + (csv | named csv column | text | .npy int | .npy str) and Zarr (group ids
  int | str, array + ids file), and ``evaluate`` gives the numbers of the manifest-order
  features (1e-12);
- ``on_missing: drop``: the numbers equal those of the manifests cut down by hand, the
  dropped count is in the store, the ranks store, the metrics JSON and the report
  header; readers that re-read a manifest by row (statistics, worst queries) see the
  same rows;
- every bad input: one line, exit status 2, nothing written (``rankwise encode`` here,
  the pipeline in tests/test_pipeline_idkeyed.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from conftest import reid_case
from helpers import run_rankwise

from rankwise import evaluate
from rankwise.api import rank
from rankwise.encoders import encode_manifest
from rankwise.errors import RankwiseError
from rankwise.feature_ids import align, read_ids
from rankwise.inputs import open_inputs, read_evaluated_manifest
from rankwise.manifest import read_manifest
from rankwise.report.markdown import _escape
from rankwise.report.worst import worst_queries_of
from rankwise.stats import query_labels
from rankwise.store import embeddings_attrs

# ---------------------------------------------------------------- alignment by hand


def test_alignment_by_hand():
    manifest = ["a", "b", "c", "d"]
    features = np.array(["c", "a", "x", "d"], dtype=object)
    found = align(manifest, features, on_missing="drop", manifest="m.csv", ids="f.txt")
    # a -> feature row 1, b -> none (dropped), c -> 0, d -> 3; x is not in the manifest
    assert found.manifest_rows.tolist() == [0, 2, 3]
    assert found.feature_rows.tolist() == [1, 0, 3]
    assert (found.dropped, found.ignored, found.dropped_example) == (1, 1, "b")
    assert found.record() == {
        "ids": "f.txt",
        "on_missing": "drop",
        "manifest_rows": 4,
        "kept_rows": 3,
        "dropped_rows": 1,
        "dropped_example": "b",
        "ignored_features": 1,
        # the kept rows 0, 2, 3 as little-endian int64, hashed
        "kept_rows_sha256": hashlib.sha256(np.array([0, 2, 3], "<i8").tobytes()).hexdigest(),
    }
    # a permutation: nothing dropped, the inverse permutation
    perm = align(
        ["a", "b", "c"],
        np.array(["b", "c", "a"], dtype=object),
        on_missing="error",
        manifest="m",
        ids="i",
    )
    assert perm.feature_rows.tolist() == [2, 0, 1] and perm.dropped == 0 and perm.ignored == 0


@pytest.mark.parametrize(
    "manifest, features, on_missing, message",
    [
        (
            ["a", "b"],
            ["a", "b", "a"],
            "drop",
            r"f\.txt: 1 id\(s\) appear on more than one feature "
            r"row, e\.g\. 'a' on rows 0 and 2 \(0-based\); ids must be unique",
        ),
        (
            ["a", "b", "c"],
            ["c", "a"],
            "error",
            r"f\.txt: 1 of the 3 ids of m\.csv have no feature "
            r"row, e\.g\. 'b'; .*on_missing: drop",
        ),
        (
            ["a", "b"],
            ["b", "z", "a", "y"],
            "error",
            r"f\.txt: 2 of the 4 feature ids are not in "
            r"m\.csv, e\.g\. 'z'; .*on_missing: drop to ignore them",
        ),
        (
            ["1", "2"],
            ["01", "02"],
            "drop",
            r"none of the 2 ids of m\.csv has a feature row .*"
            r"manifest id '1', feature id '01'.*compare as strings",
        ),
        (  # under the default too: no id in common is not rows to export or drop
            ["001", "002"],
            ["1", "2"],
            "error",
            r"none of the 2 ids of m\.csv has a feature row .*"
            r"manifest id '001', feature id '1'.*compare as strings",
        ),
        *(  # an empty export (it was an IndexError under drop)
            (["a", "b"], [], on_missing, r"f\.txt: no feature rows \(0 ids\) for the 2 ids")
            for on_missing in ("error", "drop")
        ),
    ],
)
def test_alignment_errors(manifest, features, on_missing, message):
    with pytest.raises(RankwiseError, match=message):
        align(
            manifest,
            np.array(features, dtype=object),
            on_missing=on_missing,
            manifest="m.csv",
            ids="f.txt",
        )


def test_ids_files_strip_what_manifests_strip(tmp_path: Path):
    """Spaces and tabs around an id are not part of it, as in a manifest; a no-break
    space (or another character str.strip() takes) is, in both: an id written the same
    in both files matches (it was stripped here only: a row refused, or dropped)."""
    (tmp_path / "m.csv").write_text("id,label\np1,0\np2\u00a0,1\n", encoding="utf-8")
    manifest = read_manifest(tmp_path / "m.csv")["id"].tolist()
    (tmp_path / "a.txt").write_text(" p1\t\r\np2\u00a0\r\n\r\n", encoding="utf-8", newline="")
    (tmp_path / "a.csv").write_text("id\n p1 \np2\u00a0\n", encoding="utf-8")
    for name in ("a.txt", "a.csv"):
        assert read_ids(tmp_path / name).tolist() == manifest == ["p1", "p2\u00a0"]


def test_ids_file_formats(tmp_path: Path):
    (tmp_path / "a.csv").write_text("name,id\nx, 7\ny,8\n")
    assert read_ids(tmp_path / "a.csv").tolist() == ["7", "8"]
    assert read_ids(tmp_path / "a.csv", column="name").tolist() == ["x", "y"]
    (tmp_path / "a.txt").write_text("p1\n p2 \n\n")
    assert read_ids(tmp_path / "a.txt").tolist() == ["p1", "p2"]
    np.save(tmp_path / "i.npy", np.array([3, 1, 2], dtype=np.int64))
    assert read_ids(tmp_path / "i.npy").tolist() == ["3", "1", "2"]
    np.save(tmp_path / "s.npy", np.array(["b", "a"]))
    assert read_ids(tmp_path / "s.npy").tolist() == ["b", "a"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.csv", "name\nx\n", r"a\.csv: no column 'id' \(found: name\); set options\.ids_column"),
        ("a.txt", "p1\n\np3\n", r"a\.txt: line 2: empty id"),
        ("a.csv", "id\nx\n\ny\n", None),  # pandas skips blank lines: ids x, y
        ("f.npy", np.array([1.0, 2.0]), r"f\.npy: ids have dtype float64; save them as integers"),
        ("f.npy", np.zeros((2, 2), dtype=np.int64), r"f\.npy: ids must be 1-D"),
        ("none.txt", None, r"none\.txt: ids file not found"),
    ],
)
def test_ids_file_errors(tmp_path: Path, name, content, message):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        np.save(path, content)
    if message is None:
        assert read_ids(path).tolist() == ["x", "y"]
        return
    with pytest.raises(RankwiseError, match=message):
        read_ids(path)


# ---------------------------------------------------------------- data


def _case(tmp_path: Path):
    """A reid case with integer-like string ids ("100".."1NN") on both sides, written."""
    case = reid_case(distance="cosine", kind="float", seed=3)
    case.query["id"] = [str(100 + i) for i in range(len(case.query))]
    case.gallery["id"] = [str(1000 + i) for i in range(len(case.gallery))]
    case.write(tmp_path)
    return case


def _write_features(folder: Path, split: str, ids, vectors, how: str) -> dict:
    """Features ``vectors`` with their ``ids`` (any order) in format ``how``; the options."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [str(i) for i in ids]
    npy = folder / f"{split}.npy"
    if how.startswith("zarr"):
        store = folder / f"{split}.zarr"
        if how == "zarr-array":  # a bare array and an ids file
            zarr.create_array(str(store), data=np.asarray(vectors, np.float32))
            (folder / f"{split}_ids.txt").write_text("\n".join(ids) + "\n")
            return {split: str(store), f"{split}_ids": str(folder / f"{split}_ids.txt")}
        group = zarr.open_group(str(store), mode="w")
        group.create_array("embeddings", data=np.asarray(vectors, np.float32))
        if how == "zarr-int":
            group.create_array("ids", data=np.array([int(i) for i in ids]))
        else:  # variable-length strings
            group.create_array("ids", shape=(len(ids),), dtype=str)[:] = np.array(ids, dtype=object)
        return {split: str(store)}
    np.save(npy, np.asarray(vectors, np.float32))
    if how == "csv":
        file = folder / f"{split}_ids.csv"
        pd.DataFrame({"id": ids, "other": 0}).to_csv(file, index=False)
        return {split: str(npy), f"{split}_ids": str(file)}
    if how == "csv-column":
        file = folder / f"{split}_ids.csv"
        pd.DataFrame({"n": range(len(ids)), "image": ids}).to_csv(file, index=False)
        return {split: str(npy), f"{split}_ids": str(file), "ids_column": "image"}
    if how == "txt":
        file = folder / f"{split}_ids.txt"
        file.write_text("\n".join(ids) + "\n")
        return {split: str(npy), f"{split}_ids": str(file)}
    file = folder / f"{split}_ids.npy"
    np.save(file, np.array([int(i) for i in ids]) if how == "npy-int" else np.array(ids))
    return {split: str(npy), f"{split}_ids": str(file)}


def _encode(manifest: Path, options: dict, out: Path) -> Path:
    encode_manifest(manifest, "precomputed", options, out, progress=False)
    return out


def _read(store: Path) -> np.ndarray:
    return np.asarray(zarr.open_group(str(store), mode="r")["embeddings"][...])


FORMATS = ["csv", "csv-column", "txt", "npy-int", "npy-str", "zarr-int", "zarr-str", "zarr-array"]


# ---------------------------------------------------------------- any row order


@pytest.mark.parametrize("how", FORMATS)
def test_shuffled_features_are_put_in_manifest_order(tmp_path: Path, how):
    case = _case(tmp_path)
    rng = np.random.default_rng(7)
    stores = {}
    for split, table, vectors in (
        ("query", case.query, case.query_emb),
        ("gallery", case.gallery, case.gallery_emb),
    ):
        order = rng.permutation(len(table))
        options = _write_features(
            tmp_path / "feat", split, table["id"].to_numpy()[order], vectors[order], how
        )
        manifest = tmp_path / ("q.csv" if split == "query" else "g.csv")
        stores[split] = _encode(manifest, {**options, "split": split}, tmp_path / f"{split}.zarr")
        np.testing.assert_array_equal(_read(stores[split]), vectors)  # exactly, row by row
        attrs = embeddings_attrs(stores[split])
        assert attrs["num_rows"] == len(table)
        assert attrs["id_alignment"]["dropped_rows"] == 0
        assert "manifest_row" not in zarr.open_group(str(stores[split]), mode="r")
    by_id = evaluate(
        tmp_path / "q.csv", tmp_path / "g.csv", stores["query"], stores["gallery"], **case.kwargs()
    )
    in_order = evaluate(
        tmp_path / "q.csv",
        tmp_path / "g.csv",
        tmp_path / "q.npy",
        tmp_path / "g.npy",
        **case.kwargs(),
    )
    assert by_id.metrics.keys() == in_order.metrics.keys()
    for name, value in in_order.metrics.items():
        assert by_id.metrics[name] == pytest.approx(value, abs=1e-12), name
    assert (by_id.num_queries, by_id.num_skipped, by_id.num_gallery) == (
        in_order.num_queries,
        in_order.num_skipped,
        in_order.num_gallery,
    )


def test_ids_in_manifest_order_change_nothing(tmp_path: Path):
    """Ids listing the manifest order give the store that positional features give."""
    case = _case(tmp_path)
    options = _write_features(tmp_path / "f", "query", case.query["id"], case.query_emb, "txt")
    keyed = _encode(tmp_path / "q.csv", {**options, "split": "query"}, tmp_path / "k.zarr")
    plain = _encode(tmp_path / "q.csv", {"path": str(tmp_path / "q.npy")}, tmp_path / "p.zarr")
    np.testing.assert_array_equal(_read(keyed), _read(plain))


def test_shuffled_rows_across_many_storage_chunks(tmp_path: Path):
    """A random order across 18 Zarr storage chunks (read chunk by chunk): still exact."""
    n, dim = 70_000, 2
    ids = np.array([f"x{i}" for i in range(n)])
    pd.DataFrame({"id": ids, "label": np.arange(n) % 5}).to_csv(tmp_path / "m.csv", index=False)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    order = rng.permutation(n)
    group = zarr.open_group(str(tmp_path / "f.zarr"), mode="w")
    group.create_array("embeddings", data=vectors[order], chunks=(4096, dim))
    group.create_array("ids", shape=(n,), dtype=str)[:] = ids[order].astype(object)
    out = tmp_path / "out.zarr"
    encode_manifest(
        tmp_path / "m.csv",
        "precomputed",
        {"path": str(tmp_path / "f.zarr")},
        out,
        batch_size=50_000,
        progress=False,
    )
    np.testing.assert_array_equal(_read(out), vectors)


# ---------------------------------------------------------------- on_missing: drop


def _dropped_case(tmp_path: Path, how: str = "csv"):
    """Features for all but some query / gallery rows, plus rows of unknown ids, shuffled."""
    case = _case(tmp_path)
    rng = np.random.default_rng(11)
    kept = {}
    options = {"on_missing": "drop"}
    for split, table, vectors, drop in (
        ("query", case.query, case.query_emb, 3),
        ("gallery", case.gallery, case.gallery_emb, 5),
    ):
        keep = np.sort(rng.choice(len(table), len(table) - drop, replace=False))
        kept[split] = keep
        ids = list(table["id"].to_numpy()[keep]) + ["9999001", "9999002"]
        extra = rng.normal(size=(2, vectors.shape[1])).astype(np.float32)
        feats = np.concatenate([vectors[keep], extra])
        order = rng.permutation(len(ids))
        options |= _write_features(tmp_path / "f", split, np.array(ids)[order], feats[order], how)
    return case, kept, options


@pytest.mark.parametrize("how", ["csv", "zarr-str"])
def test_drop_evaluates_the_rows_with_features(tmp_path: Path, how):
    case, kept, options = _dropped_case(tmp_path, how)
    stores = {
        s: _encode(tmp_path / f"{s[0]}.csv", {**options, "split": s}, tmp_path / f"{s}.zarr")
        for s in ("query", "gallery")
    }
    for split, vectors in (("query", case.query_emb), ("gallery", case.gallery_emb)):
        np.testing.assert_array_equal(_read(stores[split]), vectors[kept[split]])
        rows = zarr.open_group(str(stores[split]), mode="r")["manifest_row"][...]
        assert rows.tolist() == kept[split].tolist()
        aligned = embeddings_attrs(stores[split])["id_alignment"]
        total = len(case.query if split == "query" else case.gallery)
        assert (aligned["dropped_rows"], aligned["ignored_features"]) == (
            total - len(kept[split]),
            2,
        )
        assert aligned["kept_rows"] == len(kept[split]) and aligned["manifest_rows"] == total
    # the reference: manifests cut down by hand, features in their order
    q_cut = case.query.iloc[kept["query"]].reset_index(drop=True)
    g_cut = case.gallery.iloc[kept["gallery"]].reset_index(drop=True)
    expected = evaluate(
        q_cut,
        g_cut,
        case.query_emb[kept["query"]],
        case.gallery_emb[kept["gallery"]],
        **case.kwargs(),
    )
    got = evaluate(
        tmp_path / "q.csv", tmp_path / "g.csv", stores["query"], stores["gallery"], **case.kwargs()
    )
    for name, value in expected.metrics.items():
        assert got.metrics[name] == pytest.approx(value, abs=1e-12), name
    assert (got.num_queries, got.num_skipped, got.num_gallery) == (
        expected.num_queries,
        expected.num_skipped,
        expected.num_gallery,
    )
    # per query: the API names the manifest's rows (the cut manifest's row i is kept[i]),
    # not the kept rows' count, so q_df.iloc[query_index] is the query
    assert got.per_query["query_index"].tolist() == (
        kept["query"][expected.per_query["query_index"]].tolist()
    )
    for name in ("first_rank", "ap", "num_relevant"):
        np.testing.assert_array_equal(got.per_query[name], expected.per_query[name])
    # the one reader keeps the rows the store holds, in manifest order
    inputs = open_inputs(
        tmp_path / "q.csv", tmp_path / "g.csv", stores["query"], stores["gallery"], protocol="reid"
    )
    assert inputs.query["id"].tolist() == q_cut["id"].tolist()
    assert inputs.gallery["id"].tolist() == g_cut["id"].tolist()


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_drop_names_the_manifest_rows_of_pooled_queries(tmp_path: Path, pooling):
    """multi_query: a pooled query's query_index is its representative's manifest row
    (the pooled source is an array: the manifest rows are taken before pooling)."""
    case, kept, options = _dropped_case(tmp_path)
    stores = {
        s: _encode(tmp_path / f"{s[0]}.csv", {**options, "split": s}, tmp_path / f"{s}.zarr")
        for s in ("query", "gallery")
    }
    q_cut = case.query.iloc[kept["query"]].reset_index(drop=True)
    g_cut = case.gallery.iloc[kept["gallery"]].reset_index(drop=True)
    kwargs = case.kwargs(multi_query=pooling)
    expected = evaluate(
        q_cut, g_cut, case.query_emb[kept["query"]], case.gallery_emb[kept["gallery"]], **kwargs
    )
    got = evaluate(
        tmp_path / "q.csv", tmp_path / "g.csv", stores["query"], stores["gallery"], **kwargs
    )
    assert got.per_query["query_index"].tolist() == (
        kept["query"][expected.per_query["query_index"]].tolist()
    )
    np.testing.assert_array_equal(got.per_query["ap"], expected.per_query["ap"])


def test_drop_names_the_manifest_rows_of_sketches(tmp_path: Path):
    """progressive: per_query["sketches"]' query_index / last_query_index are manifest
    rows too, the join keys of per_query's own query_index."""
    rng = np.random.default_rng(2)
    rows = [(f"s{s}_{t}", s, f"sk{s}", t) for s in range(5) for t in range(4)]
    query = pd.DataFrame(rows, columns=["id", "label", "sketch", "step"])
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(8)], "label": range(8)})
    query.to_csv(tmp_path / "q.csv", index=False)
    gallery.to_csv(tmp_path / "g.csv", index=False)
    q = rng.normal(size=(len(query), 5)).astype(np.float32)
    g = rng.normal(size=(len(gallery), 5)).astype(np.float32)
    np.save(tmp_path / "g.npy", g)
    # a step left out of a sketch whose other renderings are kept: refused (it made a
    # shorter sketch, its last kept rendering scored as the complete one, exit 0)
    keep = np.array([i for i in range(len(query)) if i not in (0, 5, 9, 15)])
    options = _write_features(tmp_path / "p", "query", query["id"].to_numpy()[keep], q[keep], "txt")
    store = _encode(tmp_path / "q.csv", {**options, "split": "query", "on_missing": "drop"},
                    tmp_path / "p.zarr")  # fmt: skip
    with pytest.raises(
        RankwiseError,
        match=r"left out step 0 of sketch .sk0. \(.*q\.csv line 2\) but kept its other renderings",
    ):
        evaluate(tmp_path / "q.csv", tmp_path / "g.csv", store, tmp_path / "g.npy",
                 protocol="progressive")  # fmt: skip
    # whole sketches left out (sk1, sk3): evaluated as the manifest without them
    keep = np.array([i for i in range(len(query)) if i // 4 not in (1, 3)])
    options = _write_features(tmp_path / "f", "query", query["id"].to_numpy()[keep], q[keep], "txt")
    store = _encode(tmp_path / "q.csv", {**options, "split": "query", "on_missing": "drop"},
                    tmp_path / "q.zarr")  # fmt: skip
    got = evaluate(tmp_path / "q.csv", tmp_path / "g.csv", store, tmp_path / "g.npy",
                   protocol="progressive")  # fmt: skip
    expected = evaluate(query.iloc[keep].reset_index(drop=True), gallery, q[keep], g,
                        protocol="progressive")  # fmt: skip
    sketches, want = got.per_query["sketches"], expected.per_query["sketches"]
    for name in ("query_index", "last_query_index"):
        assert np.asarray(sketches[name]).tolist() == keep[np.asarray(want[name])].tolist()
    assert set(np.asarray(sketches["query_index"]).tolist()) <= set(
        got.per_query["query_index"].tolist()
    )


def test_drop_count_reaches_metrics_json_and_report(tmp_path: Path):
    case, kept, options = _dropped_case(tmp_path)
    for split in ("query", "gallery"):
        proc = run_rankwise(
            "encode",
            "--manifest",
            tmp_path / f"{split[0]}.csv",
            "--kind",
            "precomputed",
            "--options",
            json.dumps({**options, "split": split}),
            "--out",
            tmp_path / f"{split}.zarr",
            "--no-progress",
        )
        assert proc.returncode == 0, proc.stderr
        total = len(case.query if split == "query" else case.gallery)
        dropped = total - len(kept[split])
        assert f"on_missing drop: {dropped} of the {total} manifest rows have no features" in (
            proc.stdout
        )
    ranks = tmp_path / "ranks" / "enc.zarr"
    proc = run_rankwise(
        "rank",
        "--query",
        tmp_path / "q.csv",
        "--gallery",
        tmp_path / "g.csv",
        "--query-embeddings",
        tmp_path / "query.zarr",
        "--gallery-embeddings",
        tmp_path / "gallery.zarr",
        "--protocol",
        "reid",
        "--out",
        ranks,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = tmp_path / "metrics" / "ds" / "enc.json"
    proc = run_rankwise("metrics", ranks, "--output", metrics)
    assert proc.returncode == 0, proc.stderr
    prov = json.loads(metrics.read_text())["provenance"]
    assert prov["query_embeddings"]["id_alignment"]["dropped_rows"] == 3
    assert prov["gallery_embeddings"]["id_alignment"]["dropped_rows"] == 5
    out = tmp_path / "report"
    proc = run_rankwise("report", metrics, "--out-dir", out)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    n_q, n_g = len(case.query), len(case.gallery)
    note = (
        "Manifest rows without features left out (on_missing: drop): "
        f"enc: 3 of {n_q} query and 5 of {n_g} gallery rows."
    )
    assert _escape(note) in (out / "report.md").read_text()  # "on\\_missing"
    assert note in (out / "report.html").read_text()
    doc = json.loads((out / "report.json").read_text())
    entry = next(e for e in doc["results"] if e["dataset"] == "ds")
    assert entry["provenance"]["id_alignment"]["query"]["dropped_rows"] == 3
    # the worst queries name manifest rows as evaluated: each id carries its own label
    label_of = dict(zip(case.query["id"], case.query["label"], strict=True))
    dropped_ids = set(case.query["id"]) - set(case.query["id"].to_numpy()[kept["query"]])
    worst = entry["worst_queries"]["queries"]
    assert worst
    for q in worst:
        assert q["id"] not in dropped_ids and q["label"] == label_of[q["id"]]
        g_label = dict(zip(case.gallery["id"], case.gallery["label"], strict=True))
        for t in q["top"]:
            assert t["label"] == g_label[t["id"]]
            assert t["relevant"] == (t["label"] == q["label"])


def test_readers_by_row_see_the_evaluated_rows(tmp_path: Path):
    """Statistics by identity re-read the query manifest: without the dropped rows."""
    case, kept, options = _dropped_case(tmp_path)
    store = _encode(tmp_path / "q.csv", {**options, "split": "query"}, tmp_path / "query.zarr")
    table = read_evaluated_manifest(tmp_path / "q.csv", store, protocol="reid", role="query")
    assert table["id"].tolist() == case.query["id"].to_numpy()[kept["query"]].tolist()
    attrs = {
        "protocol": "reid",
        "query_manifest": str(tmp_path / "q.csv"),
        "query_embeddings": {"path": str(store)},
    }
    labels = query_labels(attrs)
    assert labels.tolist() == case.query["label"].to_numpy()[kept["query"]].tolist()
    # a store without dropped rows: the manifest as it is
    full = read_evaluated_manifest(tmp_path / "q.csv", None, protocol="reid", role="query")
    assert len(full) == len(case.query)
    # labels given as a sequence: one per evaluated row, never the whole manifest's
    attrs["query_embeddings"] = embeddings_attrs(store) | {"path": str(store)}
    n_kept = len(kept["query"])
    assert len(query_labels(attrs, labels=["a"] * n_kept)) == n_kept
    with pytest.raises(
        RankwiseError,
        match=rf"labels: {len(case.query)} labels, but the query "
        rf"embeddings hold {n_kept} of the manifest's {len(case.query)} rows",
    ):
        query_labels(attrs, labels=case.query["label"].tolist())
    # the store saying which rows were evaluated is gone: an error, never misaligned labels
    shutil.rmtree(store)
    with pytest.raises(RankwiseError, match=r"query\.zarr: query embeddings not found; .*drop"):
        query_labels(attrs)


def test_labels_by_identity_find_a_dropped_rows_store_from_another_folder(tmp_path, monkeypatch):
    """`--by identity` from another folder on a ranks store with relative paths and
    dropped rows: the store saying which rows were evaluated is looked for from the
    folder it was ranked in, as the manifest is (it was looked for from here alone:
    "query embeddings not found", exit 2)."""
    case, kept, options = _dropped_case(tmp_path)
    store = _encode(tmp_path / "q.csv", {**options, "split": "query"}, tmp_path / "query.zarr")
    attrs = {
        "protocol": "reid",
        "working_directory": str(tmp_path),
        "query_manifest": "q.csv",
        "query_embeddings": embeddings_attrs(store) | {"path": "query.zarr"},
    }
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    labels = query_labels(attrs)
    assert labels.tolist() == case.query["label"].to_numpy()[kept["query"]].tolist()


def test_worst_queries_without_the_store_give_no_manifest_rows(tmp_path: Path):
    """Rows were dropped and the store saying which is gone: rows, not wrong ids."""
    case, kept, options = _dropped_case(tmp_path)
    stores = {
        s: _encode(tmp_path / f"{s[0]}.csv", {**options, "split": s}, tmp_path / f"{s}.zarr")
        for s in ("query", "gallery")
    }
    result = rank(
        tmp_path / "q.csv",
        tmp_path / "g.csv",
        stores["query"],
        stores["gallery"],
        protocol="reid",
        distance="cosine",
    )
    attrs = dict(result.attrs)
    for side in ("query", "gallery"):
        attrs[f"{side}_manifest"] = str(tmp_path / f"{side[0]}.csv")
        attrs[f"{side}_embeddings"] = embeddings_attrs(stores[side]) | {"path": str(stores[side])}
    label_of = dict(zip(case.query["id"], case.query["label"], strict=True))
    worst = worst_queries_of(result.arrays(), attrs, n=3)
    assert all(q["label"] == label_of[q["id"]] and q["top"] for q in worst["queries"])
    shutil.rmtree(stores["query"])
    worst = worst_queries_of(result.arrays(), attrs, n=3)
    assert all(q["id"].startswith("row ") and q["top"] is None for q in worst["queries"])


def test_a_store_with_dropped_rows_needs_its_manifest(tmp_path: Path):
    case, kept, options = _dropped_case(tmp_path)
    store = _encode(tmp_path / "q.csv", {**options, "split": "query"}, tmp_path / "query.zarr")
    other = tmp_path / "other.csv"
    case.query.iloc[::-1].to_csv(other, index=False)  # same rows, another order
    with pytest.raises(RankwiseError, match=r"query\.zarr: .* were encoded from .*q\.csv"):
        open_inputs(other, tmp_path / "g.csv", store, tmp_path / "g.npy", protocol="reid")
    # as a table (no file to hash): the row count must still be the encoded manifest's
    with pytest.raises(RankwiseError, match=r"hold \d+ of the \d+ rows .* has \d+ rows"):
        open_inputs(
            case.query.iloc[:-1], tmp_path / "g.csv", store, tmp_path / "g.npy", protocol="reid"
        )


# ---------------------------------------------------------------- bad input on the command line


def _bad_inputs(tmp_path: Path):
    """(name, options) pairs for `rankwise encode` on q.csv, each wrong in one way."""
    case = _case(tmp_path)
    ids = case.query["id"].to_numpy()
    f = tmp_path / "bad"
    f.mkdir()
    np.save(f / "q.npy", case.query_emb)
    np.save(f / "short.npy", case.query_emb[:-2])
    (f / "all.txt").write_text("\n".join(ids) + "\n")
    (f / "short.txt").write_text("\n".join(ids[:-2]) + "\n")
    (f / "dup.txt").write_text("\n".join([*ids[:-1], ids[0]]) + "\n")
    (f / "extra.txt").write_text("\n".join([*ids[:-1], "zz"]) + "\n")
    (f / "nocol.csv").write_text("name\n" + "\n".join(ids) + "\n")
    np.save(f / "float.npy", np.arange(len(ids), dtype=np.float64))
    group = zarr.open_group(str(f / "dup.zarr"), mode="w")
    group.create_array("embeddings", data=case.query_emb)
    group.create_array("ids", shape=(len(ids),), dtype=str)[:] = np.array(
        [*ids[:-1], ids[1]], dtype=object
    )
    q = str(f / "q.npy")
    return case, [
        (
            "duplicate ids",
            {"path": q, "ids": str(f / "dup.txt"), "on_missing": "drop"},
            rf"dup\.txt: 1 id\(s\) appear on more than one feature row, e\.g\. '{ids[0]}'",
        ),
        (
            "zarr duplicate ids",
            {"path": str(f / "dup.zarr")},
            rf"dup\.zarr/ids: 1 id\(s\) appear on more than one feature row, e\.g\. '{ids[1]}'",
        ),
        (
            "missing features",
            {"path": str(f / "short.npy"), "ids": str(f / "short.txt")},
            rf"short\.txt: 2 of the {len(ids)} ids of .*q\.csv have no feature row, e\.g\. "
            rf"'{ids[-2]}'",
        ),
        (
            "unknown feature ids",
            {"path": q, "ids": str(f / "extra.txt")},
            rf"extra\.txt: 1 of the {len(ids)} ids of .*q\.csv have no feature row, e\.g\. "
            rf"'{ids[-1]}'",
        ),
        (
            "ids vs rows",
            {"path": q, "ids": str(f / "short.txt")},
            rf"short\.txt: {len(ids) - 2} ids for the {len(ids)} rows of .*q\.npy; give one id "
            "per feature row",
        ),
        (
            "no ids column",
            {"path": q, "ids": str(f / "nocol.csv")},
            r"nocol\.csv: no column 'id' \(found: name\)",
        ),
        (
            "float ids",
            {"path": q, "ids": str(f / "float.npy")},
            r"float\.npy: ids have dtype float64",
        ),
        (
            "ids file missing",
            {"path": q, "ids": str(f / "none.txt")},
            r"none\.txt: ids file not found",
        ),
        (
            "drop without ids",
            {"path": q, "on_missing": "drop"},
            r"precomputed: on_missing: drop needs the ids of the rows of .*q\.npy; set "
            r"options\.ids",
        ),
        (
            "ids with split files",
            {"query": q, "split": "query", "ids": str(f / "all.txt")},
            r"precomputed: options\.ids does not go with \{query, gallery\}; use "
            r"options\.query_ids",
        ),
        (
            "split ids with path",
            {"path": q, "query_ids": str(f / "all.txt")},
            r"precomputed: options\.query_ids does not go with \{path\}; use options\.ids",
        ),
        (
            "bad on_missing",
            {"path": q, "ids": str(f / "all.txt"), "on_missing": "skip"},
            r"on_missing must be one of error, drop",
        ),
    ]


def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path):
    case, bad = _bad_inputs(tmp_path)
    # the unknown-id case under `error`: the manifest id without a feature is named first
    for name, options, message in bad:
        out = tmp_path / "out" / "q.zarr"
        proc = run_rankwise(
            "encode",
            "--manifest",
            tmp_path / "q.csv",
            "--kind",
            "precomputed",
            "--options",
            json.dumps(options),
            "--out",
            out,
            "--no-progress",
        )
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2, (name, proc.stderr)
        assert len(lines) == 1, (name, proc.stderr)
        assert lines[0].startswith("error: "), name
        assert re.search(message, lines[0]), (name, lines[0])
        assert not out.exists() and not out.with_name("q.zarr.tmp").exists(), name


def test_unknown_feature_ids_alone_are_an_error_unless_drop(tmp_path: Path):
    case = _case(tmp_path)
    ids = list(case.query["id"]) + ["zz"]
    feats = np.concatenate([case.query_emb, case.query_emb[:1]])
    options = _write_features(tmp_path / "f", "query", ids, feats, "txt")
    options = {"path": options["query"], "ids": options["query_ids"]}
    with pytest.raises(RankwiseError, match=r"1 of the \d+ feature ids are not in .*'zz'"):
        _encode(tmp_path / "q.csv", options, tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()
    store = _encode(tmp_path / "q.csv", {**options, "on_missing": "drop"}, tmp_path / "y.zarr")
    np.testing.assert_array_equal(_read(store), case.query_emb)
    aligned = embeddings_attrs(store)["id_alignment"]
    assert (aligned["dropped_rows"], aligned["ignored_features"]) == (0, 1)
    assert "manifest_row" not in zarr.open_group(str(store), mode="r")


def test_readme_example_is_a_valid_encoder_entry():
    """The README's id-keyed example passes the encoder's option checks as written."""
    import yaml

    from rankwise.encoders import OPTIONS

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = text[text.index("encoders:\n  exported:") :]
    block = block[: block.index("```")]
    entry = yaml.safe_load(block)["encoders"]["exported"]
    assert entry["kind"] == "precomputed"
    checked = OPTIONS["precomputed"].check(entry["options"])
    assert checked["on_missing"] == "error" and checked["ids_column"] == "id"


def test_a_keyed_zarr_group_given_straight_to_ranking(tmp_path: Path):
    """Its ids are checked row by row: in manifest order it ranks, otherwise one line."""
    case = _case(tmp_path)
    ids = case.query["id"].to_numpy()
    same = _write_features(tmp_path / "same", "query", ids, case.query_emb, "zarr-str")
    got = evaluate(
        tmp_path / "q.csv", tmp_path / "g.csv", same["query"], tmp_path / "g.npy", **case.kwargs()
    )
    want = evaluate(
        tmp_path / "q.csv",
        tmp_path / "g.csv",
        tmp_path / "q.npy",
        tmp_path / "g.npy",
        **case.kwargs(),
    )
    assert got.metrics == want.metrics
    order = np.arange(len(ids))
    order[[0, 1]] = [1, 0]
    swapped = _write_features(
        tmp_path / "swap", "query", ids[order], case.query_emb[order], "zarr-int"
    )
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank",
        "--query",
        tmp_path / "q.csv",
        "--gallery",
        tmp_path / "g.csv",
        "--query-embeddings",
        swapped["query"],
        "--gallery-embeddings",
        tmp_path / "g.npy",
        "--protocol",
        "reid",
        "--out",
        out,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert re.search(
        rf"swap/query\.zarr/ids: the features' ids are not the ids of .*q\.csv in order \(row 0 "
        rf"\(0-based\) has id '{ids[1]}', the manifest '{ids[0]}'\); .*rankwise encode --kind "
        "precomputed",
        lines[0],
    ), lines[0]
    assert not out.exists()


def test_a_nan_feature_names_its_manifest_line_after_drops(tmp_path: Path):
    case = _case(tmp_path)
    ids = case.query["id"].to_numpy()
    keep = np.arange(3, len(ids))  # manifest rows 0-2 have no features
    vectors = case.query_emb[keep].copy()
    vectors[2, 0] = np.nan  # manifest row 5: CSV line 7
    options = _write_features(tmp_path / "f", "query", ids[keep][::-1], vectors[::-1], "txt")
    options = {"path": options["query"], "ids": options["query_ids"], "on_missing": "drop"}
    # the file's own row (its rows reversed: the last but two) and the manifest's line
    file_row = len(keep) - 1 - 2
    with pytest.raises(
        RankwiseError,
        match=rf"query\.npy: row {file_row} \(0-based; .*q\.csv: row 7 \(id '{ids[5]}'\)\) "
        "holds NaN",
    ):
        _encode(tmp_path / "q.csv", options, tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()


def test_the_pipeline_tracks_each_splits_ids_file():
    """encode's input files (existence checked, bytes hashed) include the split's ids."""
    from rankwise.pipeline_config import encoder_paths

    options = {"query": "q.npy", "query_ids": "q.csv", "gallery": "g.zarr", "gallery_ids": "g.txt"}
    assert encoder_paths("precomputed", options, "query") == ["q.npy", "q.csv"]
    assert encoder_paths("precomputed", options, "gallery") == ["g.zarr", "g.txt"]
    assert encoder_paths("precomputed", {"path": "f.npy", "ids": "f.txt"}, "query") == [
        "f.npy",
        "f.txt",
    ]


def test_a_foreign_store_with_a_manifest_row_array_is_refused(tmp_path):
    """rankwise reads a store's rows in manifest order; a 'manifest_row' array in a store
    it did not write was ignored, the rows silently misaligned."""
    import zarr

    from rankwise.embeddings import open_embeddings

    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    group = zarr.open_group(str(tmp_path / "e.zarr"), mode="w", zarr_format=3)
    group.create_array("embeddings", data=rows[[1, 0, 3, 2]])
    group.create_array("manifest_row", data=np.array([1, 0, 3, 2]))
    with pytest.raises(RankwiseError, match=r"e\.zarr: has a 'manifest_row' array but is not an"):
        open_embeddings(tmp_path / "e.zarr", name="gallery embeddings")
