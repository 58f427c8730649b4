"""top_items agrees with a brute-force sort and with the engine's first ranks."""

import numpy as np
import pandas as pd
import pytest

import rankwise
from rankwise.errors import RankwiseError
from rankwise.neighbours import top_items


def test_top_items_match_brute_force_and_ranks():
    rng = np.random.default_rng(5)
    n_q, n_g = 12, 90
    qlab, glab = rng.integers(0, 8, n_q), rng.integers(0, 8, n_g)
    qcam, gcam = rng.integers(0, 3, n_q), rng.integers(0, 3, n_g)
    query = pd.DataFrame({"id": [f"q{i}" for i in range(n_q)], "label": qlab, "camera": qcam})
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(n_g)], "label": glab, "camera": gcam})
    qe = rng.integers(-2, 3, (n_q, 4)).astype(np.float32)
    ge = rng.integers(-2, 3, (n_g, 4)).astype(np.float32)
    result = rankwise.evaluate(query, gallery, qe, ge, protocol="reid", distance="euclidean")
    evaluated = result.per_query["query_index"]
    tops = top_items(
        query, gallery, qe, ge, evaluated, protocol="reid", distance="euclidean", k=5, chunk=7
    )
    for top, first in zip(tops, result.per_query["first_rank"], strict=True):
        q = top["query_index"]
        d = ((qe[q].astype(float) - ge.astype(float)) ** 2).sum(1)
        valid = ~((glab == qlab[q]) & (gcam == qcam[q]))
        rel = glab == qlab[q]
        idx = np.flatnonzero(valid)
        ids = gallery["id"].to_numpy(str)  # ties: the smaller id ("g10" < "g2"), not the row
        order = idx[np.lexsort((ids[idx], rel[idx], d[idx]))][:5]
        np.testing.assert_array_equal(top["gallery_index"], order)
        np.testing.assert_array_equal(top["relevant"], rel[order])
        np.testing.assert_allclose(top["distance_key"], d[order])
        if first <= 5:  # the engine's first rank is where the first relevant item shows
            assert np.flatnonzero(top["relevant"])[0] + 1 == first
        else:
            assert not top["relevant"].any()


def _toy(n_q=4, n_g=20, dim=3, seed=2):
    rng = np.random.default_rng(seed)
    query = pd.DataFrame(
        {"id": [f"q{i}" for i in range(n_q)], "label": [str(i % 2) for i in range(n_q)]}
    )
    gallery = pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_g)], "label": [str(i % 3) for i in range(n_g)]}
    )
    return (
        query,
        gallery,
        rng.normal(size=(n_q, dim)).astype(np.float32),
        rng.normal(size=(n_g, dim)).astype(np.float32),
    )


@pytest.mark.parametrize(
    "side, row, value, distance, message",
    [
        (
            "gallery",
            13,
            np.nan,
            "cosine",
            r"gallery embeddings row 13 \(0-based\) contains NaN or inf",
        ),
        ("gallery", 5, 0.0, "cosine", r"gallery embeddings row 5 \(0-based\) is a zero vector"),
        (
            "query",
            2,
            np.inf,
            "euclidean",
            r"query embeddings row 2 \(0-based\) contains NaN or inf",
        ),
        ("query", 1, 0.0, "cosine", r"query embeddings row 1 \(0-based\) is a zero vector"),
    ],
)
def test_bad_row_is_an_error(side, row, value, distance, message):
    """A NaN/inf row, or a zero row under cosine, stops top_items with the engine's
    message (before, the bad-row flag was ignored and garbage neighbours came back)."""
    query, gallery, qe, ge = _toy()
    (qe if side == "query" else ge)[row] = value
    with pytest.raises(RankwiseError, match=message):
        top_items(
            query, gallery, qe, ge, [0, 1, 2, 3], protocol="recall", distance=distance, chunk=8
        )


def test_zero_row_is_fine_under_euclidean():
    query, gallery, qe, ge = _toy()
    ge[5] = 0
    tops = top_items(query, gallery, qe, ge, [0], protocol="recall", distance="euclidean", k=20)
    assert 5 in tops[0]["gallery_index"]


def test_query_row_outside_the_manifest():
    query, gallery, qe, ge = _toy()
    with pytest.raises(RankwiseError, match=r"query_rows: row 4 is not a row of query table"):
        top_items(query, gallery, qe, ge, [0, 4], protocol="recall")


def test_store_of_another_manifest_is_refused(tmp_path):
    """top_items opens its inputs like ranking: a store opened with a manifest other than
    the one it was encoded from is refused, naming both files."""
    from rankwise.encoders import encode_manifest

    query, gallery, qe, ge = _toy()
    query.to_csv(tmp_path / "query.csv", index=False)
    gallery.to_csv(tmp_path / "gallery.csv", index=False)
    np.save(tmp_path / "g.npy", ge)
    encode_manifest(
        tmp_path / "gallery.csv",
        "precomputed",
        {"path": str(tmp_path / "g.npy")},
        tmp_path / "g.zarr",
        progress=False,
    )
    gallery.iloc[::-1].to_csv(tmp_path / "sorted.csv", index=False)
    ok = top_items(
        tmp_path / "query.csv",
        tmp_path / "gallery.csv",
        qe,
        tmp_path / "g.zarr",
        [0],
        protocol="recall",
        k=3,
    )
    same = top_items(query, gallery, qe, ge, [0], protocol="recall", k=3)
    np.testing.assert_array_equal(ok[0]["gallery_index"], same[0]["gallery_index"])
    with pytest.raises(
        RankwiseError,
        match=r"g\.zarr: gallery embeddings were encoded from "
        r"\S*gallery\.csv .*but \S*sorted\.csv has other "
        r"content",
    ):
        top_items(
            tmp_path / "query.csv",
            tmp_path / "sorted.csv",
            qe,
            tmp_path / "g.zarr",
            [0],
            protocol="recall",
        )


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("block,chunk", [(1, 1), (3, 7), (64, 1000)])
def test_tiled_top_items_equal_the_exact_scan_for_every_query(distance, block, chunk):
    """The rank stage's tiled top items (BLAS screen + canonical keys) equal the exact
    per-query scan of :func:`nearest_items`, ties included (integer embeddings, copied
    gallery rows, fewer valid items than k for some queries), for any tiling."""
    from dataclasses import replace

    from rankwise.inputs import open_inputs
    from rankwise.neighbours import nearest_items, tiled_top_items
    from rankwise.protocols import id_keys
    from rankwise.ranking import prepare_chunk

    rng = np.random.default_rng(7)
    n_q, n_g, dim = 12, 40, 3
    ge = rng.integers(-2, 3, (n_g, dim)).astype(np.float32)
    ge[1::4] = ge[::4][: len(ge[1::4])]  # exact ties
    ge[np.all(ge == 0, axis=1), 0] = 1.0
    qe = rng.integers(-2, 3, (n_q, dim)).astype(np.float32)
    qe[np.all(qe == 0, axis=1), 0] = 1.0
    q = pd.DataFrame({"id": [f"q{i}" for i in range(n_q)], "label": rng.integers(0, 4, n_q),
                      "camera": rng.integers(0, 2, n_q)})  # fmt: skip
    # ids not in row order, so that a tie broken by row would show
    g = pd.DataFrame({"id": [f"g{i}" for i in rng.permutation(n_g)], "label":
                      rng.integers(0, 4, n_g), "camera": rng.integers(0, 2, n_g)})  # fmt: skip
    g.loc[:5, "label"] = -1  # junk: fewer valid items
    inputs = open_inputs(q, g, qe, ge, protocol="reid")
    # ties by gallery id, as the rank stage lays them out (api.rank sets gkey for AQE)
    problem = replace(inputs.problem(), gkey=id_keys(g["id"].to_numpy()))
    cosine = distance == "cosine"
    qrows, qsq = prepare_chunk(inputs.query_embeddings, 0, n_q, cosine)
    rows = np.flatnonzero(~problem.skip).astype(np.int64)
    k = 30  # more than some queries have
    got = tiled_top_items(
        problem, rows, qrows, qsq, inputs.gallery_embeddings, cosine=cosine, k=k,
        block=block, chunk=chunk,
    )  # fmt: skip
    want = nearest_items(inputs, rows, distance=distance, k=k)
    for t, entry in enumerate(want):
        listed = entry["gallery_index"].tolist()
        assert got[t].tolist() == listed + [-1] * (k - len(listed))
    assert (got == -1).any() and (got >= 0).sum() > len(rows)


def test_top_items_and_worst_queries_do_not_follow_row_order(tmp_path):
    """Exact ties -- identical gallery vectors of one label, queries with equal AP -- go
    to the smaller id, so the report's worst queries and their top items are the same
    for the manifests' rows in any order (ids chosen so that string order is not row
    order)."""
    from rankwise.report.worst import worst_queries_of

    rng = np.random.default_rng(3)
    n_q, n_g = 6, 12
    q = pd.DataFrame({"id": [f"q{i}" for i in (7, 10, 2, 30, 5, 1)], "label": list("aabbcc"),
                      "camera": [0] * n_q})  # fmt: skip
    g = pd.DataFrame({"id": [f"g{i}" for i in range(3, 3 + n_g)], "label": list("abcxyz" * 2),
                      "camera": [1] * n_g})  # fmt: skip
    ge = rng.normal(size=(n_g, 4)).astype(np.float32)
    ge[6:] = ge[:6]  # every gallery vector twice, with its label: exact ties
    qe = np.repeat(ge[:3], 2, axis=0)  # two queries per label, identical: equal APs

    def worst(perm_q, perm_g, folder):
        folder.mkdir()
        paths = []
        for name, table, emb, perm in (("q", q, qe, perm_q), ("g", g, ge, perm_g)):
            table.iloc[perm].to_csv(folder / f"{name}.csv", index=False)
            np.save(folder / f"{name}.npy", emb[perm])
            paths += [folder / f"{name}.csv", folder / f"{name}.npy"]
        result = rankwise.rank(*paths[::2], *paths[1::2], protocol="reid", distance="euclidean")
        attrs = dict(result.attrs, query_manifest=str(paths[0]), gallery_manifest=str(paths[2]),
                     query_embeddings={"path": str(paths[1])},
                     gallery_embeddings={"path": str(paths[3])})  # fmt: skip
        found = worst_queries_of(result.arrays(), attrs, n=4, top_k=8)["queries"]
        return [(x["id"], x["score"], [(t["id"], t["relevant"]) for t in x["top"]]) for x in found]

    plain = worst(np.arange(n_q), np.arange(n_g), tmp_path / "a")
    shuffled = worst(rng.permutation(n_q), rng.permutation(n_g), tmp_path / "b")
    assert plain == shuffled
    # every AP is 1: the four smallest ids in string order, not the first four rows
    assert [x[0] for x in plain] == ["q1", "q10", "q2", "q30"]
    # q1 (label c) meets its two identical gallery vectors at distance 0: by id
    assert plain[0][2][:2] == [("g11", True), ("g5", True)]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_top_items_take_the_process_kernels_and_are_the_same_with_numbas(distance, monkeypatch):
    """The canonical keys come from the process's kernel set (the C kernels where they
    build, so a report does not import numba): the same lists, keys bit for bit, as
    with numba's kernels."""
    from rankwise import kernels, native

    if not isinstance(native.engine_kernels(), native.NativeKernels):
        pytest.skip(f"no C kernels here: {native.why_not_native()}")
    rng = np.random.default_rng(9)
    query, gallery, qe, ge = _toy(n_q=8, n_g=60, dim=5, seed=4)
    ge[1::5] = ge[::5][: len(ge[1::5])]  # exact ties
    rows = list(range(len(query)))
    args = dict(protocol="recall", distance=distance, k=12, chunk=int(rng.integers(5, 20)))
    native_tops = top_items(query, gallery, qe, ge, rows, **args)
    monkeypatch.setattr(native, "_CHOSEN", kernels)
    numba_tops = top_items(query, gallery, qe, ge, rows, **args)
    for a, b in zip(native_tops, numba_tops, strict=True):
        np.testing.assert_array_equal(a["gallery_index"], b["gallery_index"])
        assert a["distance_key"].tobytes() == b["distance_key"].tobytes()


def test_the_worst_queries_nearest_items_do_not_import_numba(tmp_path):
    """Where the C kernels build, listing the worst queries' nearest items no longer
    imports numba and loads its compiled kernels (~0.45 s of the report job)."""
    import subprocess
    import sys

    from rankwise import native

    if not isinstance(native.engine_kernels(), native.NativeKernels):
        pytest.skip(f"no C kernels here: {native.why_not_native()}")
    query, gallery, qe, ge = _toy(n_q=6, n_g=30, dim=4, seed=1)
    for name, table in (("q.csv", query), ("g.csv", gallery)):
        table.to_csv(tmp_path / name, index=False)
    np.save(tmp_path / "qe.npy", qe)
    np.save(tmp_path / "ge.npy", ge)
    code = (
        "import sys, numpy as np, pandas as pd\n"
        "from rankwise.report.worst import worst_queries_of\n"
        "from rankwise.neighbours import top_items\n"
        "q, g = pd.read_csv('q.csv', dtype=str), pd.read_csv('g.csv', dtype=str)\n"
        "tops = top_items(q, g, np.load('qe.npy'), np.load('ge.npy'), range(len(q)),\n"
        "                 protocol='recall', k=3)\n"
        "assert len(tops) == len(q)\n"
        "print('numba' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
