"""Property-based tests: rankwise.evaluate against a brute-force reference, and
determinism.

Hypothesis draws small problems full of traps: exact ties (small-integer embeddings,
duplicate rows, queries that are gallery items), junk labels (``-1``) and distractors
(``0``), same-camera matches, queries with no valid match (skipped), and a gallery
whose relevant item is the query itself.  The reference below is written from
DESIGN.md alone: the full float64 distance matrix, and for each query its valid items
sorted with ``np.lexsort`` by (distance, non-relevant before relevant, row).

Embeddings are chosen so that float32 and float64 agree exactly: for ``euclidean``
small integers (squared distances are exact integers), for ``cosine`` entries in
{-1, +1} with D = 16 (normalised entries are +-1/4, every dot product is exact).

Then: the numbers do not depend on query_block, gallery_chunk, workers, nor on the order
of the gallery rows or of the query rows; and two clean runs of the same command write
byte-identical reports.

Hypothesis runs derandomized (fixed examples, no database), ``max_examples`` modest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rankwise
from rankwise.errors import RankwiseError

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = settings(
    max_examples=100,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

KS = (1, 2, 3, 5)


# ---------------------------------------------------------------------------
# the brute-force reference (DESIGN.md)
# ---------------------------------------------------------------------------


def distances(qe: np.ndarray, ge: np.ndarray, distance: str) -> np.ndarray:
    """Full float64 (Q, G) matrix.  Squared L2 ranks like L2 and is exact on integers."""
    q, g = qe.astype(np.float64), ge.astype(np.float64)
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)
        return 1.0 - q @ g.T
    return ((q[:, None, :] - g[None, :, :]) ** 2).sum(axis=2)


def masks(protocol: str, q: pd.DataFrame, g: pd.DataFrame, junk=("-1",), gap_frames=1):
    """(valid, relevant) boolean (Q, G) matrices; relevant is within valid."""
    ql, gl = q["label"].to_numpy(str), g["label"].to_numpy(str)
    same_label = ql[:, None] == gl[None, :]
    valid = q["id"].to_numpy(str)[:, None] != g["id"].to_numpy(str)[None, :]
    if protocol == "reassociation":
        valid &= q["sequence"].to_numpy(str)[:, None] == g["sequence"].to_numpy(str)[None, :]
        valid &= q["frame"].to_numpy(int)[:, None] + gap_frames == g["frame"].to_numpy(int)[None, :]
    if protocol == "reid":
        same_cam = q["camera"].to_numpy(str)[:, None] == g["camera"].to_numpy(str)[None, :]
        valid &= ~(same_label & same_cam)
        valid &= ~np.isin(gl, list(junk))[None, :]
    return valid, valid & same_label


def reference(q, g, qe, ge, protocol, distance, ks=KS, gap_frames=1):
    """Per-query ranks and every metric, by sorting each query's valid items."""
    d = distances(qe, ge, distance)
    valid, relevant = masks(protocol, q, g, gap_frames=gap_frames)
    rows = np.arange(len(g))
    per_query = {}
    for i in range(len(q)):
        v = np.flatnonzero(valid[i])
        order = v[np.lexsort((rows[v], relevant[i, v].astype(int), d[i, v]))]
        ranks = np.flatnonzero(relevant[i, order]) + 1
        if len(ranks) and (protocol != "reassociation" or len(v) >= 2):
            per_query[i] = ranks
    if not per_query:
        return None
    idx = np.array(sorted(per_query))
    first = np.array([per_query[i][0] for i in idx])
    ap = np.array([np.mean(np.arange(1, len(r) + 1) / r) for r in map(per_query.get, idx)])
    inp = np.array([len(r) / r[-1] for r in map(per_query.get, idx)])
    at = "recall@" if protocol == "recall" else "rank"
    metrics = {f"{at}{k}": 100.0 * np.mean(first <= k) for k in ks}
    tail = {
        "map": 100.0 * ap.mean(),
        "mrr": 100.0 * np.mean(1.0 / first),
        "minp": 100.0 * inp.mean(),
    }
    if protocol == "recall":  # metric-learning families: precision@K, R-precision, MAP@R
        rs = [per_query[i] for i in idx]
        for k in ks:
            tail[f"precision@{k}"] = 100.0 * np.mean([np.sum(r <= k) / k for r in rs])
        tail["r_precision"] = 100.0 * np.mean([np.sum(r <= len(r)) / len(r) for r in rs])
        tail["map@r"] = 100.0 * np.mean(
            [np.sum((np.arange(1, len(r) + 1) / r)[r <= len(r)]) / len(r) for r in rs]
        )
    # DESIGN.md key order: recall -> recall@K, map, mrr, minp (then precision@K,
    # r_precision, map@r); reid -> rankK, map, minp, mrr; reassociation -> rankK, mrr
    for name in {
        "recall": ("map", "mrr", "minp", *[f"precision@{k}" for k in ks], "r_precision", "map@r"),
        "reid": ("map", "minp", "mrr"),
        "reassociation": ("mrr",),
    }[protocol]:
        metrics[name] = tail[name]
    junk = np.isin(g["label"].to_numpy(str), ["-1"]).sum() if protocol == "reid" else 0
    return {
        "query_index": idx,
        "first_rank": first,
        "ap": ap,
        "inp": inp,
        "rr": 1.0 / first,
        "ranks": per_query,
        "metrics": metrics,
        "num_skipped": len(q) - len(idx),
        "num_gallery": len(g) - int(junk),
    }


# ---------------------------------------------------------------------------
# problems
# ---------------------------------------------------------------------------


@st.composite
def problems(draw, distance: str):
    """(query, gallery, query_emb, gallery_emb) with ties, junk, distractors, self-matches."""
    n_g = draw(st.integers(2, 14))
    n_q = draw(st.integers(1, 7))
    if distance == "cosine":
        dim = 16
        pool = draw(
            st.lists(
                st.lists(st.sampled_from([-1.0, 1.0]), min_size=dim, max_size=dim),
                min_size=1,
                max_size=5,
            )
        )
    else:
        dim = draw(st.integers(1, 3))
        pool = draw(
            st.lists(
                st.lists(st.integers(-2, 2), min_size=dim, max_size=dim), min_size=1, max_size=6
            )
        )
    pool = np.array(pool, dtype=np.float32)  # few distinct rows: many exact ties
    pick = lambda n: pool[draw(st.lists(st.integers(0, len(pool) - 1), min_size=n, max_size=n))]
    ge = pick(n_g)
    g = pd.DataFrame(
        {
            "id": [f"g{i}" for i in range(n_g)],
            "label": draw(
                st.lists(st.sampled_from(["1", "2", "3", "0", "-1"]), min_size=n_g, max_size=n_g)
            ),
            "camera": draw(st.lists(st.sampled_from(["1", "2", "3"]), min_size=n_g, max_size=n_g)),
            "sequence": draw(st.lists(st.sampled_from("AB"), min_size=n_g, max_size=n_g)),
            "frame": draw(st.lists(st.integers(0, 3), min_size=n_g, max_size=n_g)),
        }
    )
    qe = pick(n_q)
    q = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n_q)],
            "label": draw(
                st.lists(st.sampled_from(["1", "2", "3", "4"]), min_size=n_q, max_size=n_q)
            ),  # "4": never in the gallery -> skipped
            "camera": draw(st.lists(st.sampled_from(["1", "2", "3"]), min_size=n_q, max_size=n_q)),
            "sequence": draw(st.lists(st.sampled_from("AB"), min_size=n_q, max_size=n_q)),
            "frame": draw(st.lists(st.integers(0, 3), min_size=n_q, max_size=n_q)),
        }
    )
    # some queries are gallery items (same id, label, camera, embedding): never own match
    for i in range(n_q):
        j = draw(st.one_of(st.none(), st.integers(0, n_g - 1)))
        if j is not None and g.loc[j, "id"] not in set(q["id"]):
            cols = ["id", "label", "camera", "sequence", "frame"]
            q.loc[i, cols] = g.loc[j, cols].to_numpy()
            qe[i] = ge[j]
    return q, g, qe, ge


def evaluate(q, g, qe, ge, protocol, distance, gap_frames=1, **engine):
    return rankwise.evaluate(
        q, g, qe, ge, protocol=protocol, distance=distance, ks=KS, gap_frames=gap_frames, **engine
    )


def check_against_reference(problem, protocol, distance, gap_frames=1):
    q, g, qe, ge = problem
    ref = reference(q, g, qe, ge, protocol, distance, gap_frames=gap_frames)
    if ref is None:  # no query has a valid relevant item: a clear error
        with pytest.raises(RankwiseError, match=r"no query has a (valid match|gallery item of)"):
            evaluate(q, g, qe, ge, protocol, distance, gap_frames)
        return None
    result = evaluate(
        q, g, qe, ge, protocol, distance, gap_frames, query_block=2, gallery_chunk=3, workers=2
    )
    pq = result.per_query
    np.testing.assert_array_equal(pq["query_index"], ref["query_index"])
    np.testing.assert_array_equal(pq["first_rank"], ref["first_rank"])
    for key in ("ap", "inp", "rr"):
        np.testing.assert_allclose(pq[key], ref[key], rtol=1e-12, atol=0)
    assert list(result.metrics) == list(ref["metrics"])
    for name, value in ref["metrics"].items():
        assert result.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name
    assert result.num_queries == len(ref["query_index"])
    assert result.num_skipped == ref["num_skipped"]
    assert result.num_gallery == ref["num_gallery"]
    # the full rank lists, through the ranks store arrays
    ranks = rankwise.api.rank(
        q,
        g,
        qe,
        ge,
        protocol=protocol,
        distance=distance,
        gap_frames=gap_frames,
        query_block=3,
        gallery_chunk=2,
        workers=1,
    )
    for n, i in enumerate(ranks.query_index):
        np.testing.assert_array_equal(
            ranks.ranks[ranks.offsets[n] : ranks.offsets[n + 1]], ref["ranks"][i]
        )
    return result


# ---------------------------------------------------------------------------
# rankwise == reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["recall", "reid"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_matches_brute_force(protocol, distance):
    @SETTINGS
    @given(problem=problems(distance))
    def check(problem):
        check_against_reference(problem, protocol, distance)

    check()


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_reassociation_matches_brute_force(distance):
    """Candidates: the query's sequence at frame + gap_frames; < 2 candidates: skipped."""

    @SETTINGS
    @given(problem=problems(distance), gap_frames=st.integers(1, 2))
    def check(problem, gap_frames):
        check_against_reference(problem, "reassociation", distance, gap_frames)

    check()


def test_constant_encoder_scores_the_minimum():
    """Ties count against the query: every item at the same distance puts each relevant
    item after all non-relevant ones, whatever the row order."""
    n_g = 10
    g = pd.DataFrame({"id": [f"g{i}" for i in range(n_g)], "label": ["1", "2"] * 5})
    q = pd.DataFrame({"id": ["q"], "label": ["1"]})
    result = evaluate(q, g, np.ones((1, 4)), np.ones((n_g, 4)), "recall", "euclidean")
    assert result.per_query["first_rank"].tolist() == [6]  # 5 non-relevant, then 5 relevant
    assert result.metrics["map"] == pytest.approx(100 * np.mean(np.arange(1, 6) / np.arange(6, 11)))


# ---------------------------------------------------------------------------
# invariance: tiling, threads, row order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol, distance", [("reid", "euclidean"), ("recall", "cosine")])
def test_same_numbers_for_every_tiling_and_row_order(protocol, distance):
    @settings(
        max_examples=50,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        problem=problems(distance),
        query_block=st.integers(1, 5),
        gallery_chunk=st.integers(1, 6),
        workers=st.integers(1, 3),
        seed=st.integers(0, 99),
    )
    def check(problem, query_block, gallery_chunk, workers, seed):
        q, g, qe, ge = problem
        if reference(q, g, qe, ge, protocol, distance) is None:
            return
        base = evaluate(q, g, qe, ge, protocol, distance)
        tiled = evaluate(
            q,
            g,
            qe,
            ge,
            protocol,
            distance,
            query_block=query_block,
            gallery_chunk=gallery_chunk,
            workers=workers,
        )
        assert tiled.to_json() == base.to_json()  # exactly equal, not approximately
        for key in ("query_index", "first_rank", "ap", "inp", "rr"):
            np.testing.assert_array_equal(tiled.per_query[key], base.per_query[key])
        # shuffled gallery rows: per-query values identical
        rng = np.random.default_rng(seed)
        gp = rng.permutation(len(g))
        shuffled = evaluate(
            q,
            g.iloc[gp].reset_index(drop=True),
            qe,
            ge[gp],
            protocol,
            distance,
            query_block=query_block,
            gallery_chunk=gallery_chunk,
        )
        for key in ("query_index", "first_rank", "ap", "inp", "rr"):
            np.testing.assert_array_equal(shuffled.per_query[key], base.per_query[key])
        assert shuffled.metrics == base.metrics
        # shuffled query rows: the same per-query values, moved with their query
        qp = rng.permutation(len(q))
        moved = evaluate(q.iloc[qp].reset_index(drop=True), g, qe[qp], ge, protocol, distance)
        back = {int(qp[i]): n for n, i in enumerate(moved.per_query["query_index"])}
        order = [back[int(i)] for i in base.per_query["query_index"]]
        for key in ("first_rank", "ap", "inp", "rr"):
            np.testing.assert_array_equal(moved.per_query[key][order], base.per_query[key])
        for name, value in base.metrics.items():  # only the summation order may differ
            assert moved.metrics[name] == pytest.approx(value, rel=1e-12, abs=1e-12)

    check()


# ---------------------------------------------------------------------------
# two clean runs of the same command
# ---------------------------------------------------------------------------


def test_two_clean_runs_write_identical_reports(tmp_path):
    """Float data, small uneven tiles, 2 threads: the JSON and text reports are
    byte-identical across runs."""
    rng = np.random.default_rng(11)
    n_q, n_g, dim = 60, 700, 24
    pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n_q)],
            "label": rng.integers(0, 30, n_q),
            "camera": rng.integers(1, 4, n_q),
        }
    ).to_csv(tmp_path / "q.csv", index=False)
    pd.DataFrame(
        {
            "id": [f"g{i}" for i in range(n_g)],
            "label": rng.integers(-1, 30, n_g),
            "camera": rng.integers(1, 4, n_g),
        }
    ).to_csv(tmp_path / "g.csv", index=False)
    np.save(tmp_path / "q.npy", rng.normal(size=(n_q, dim)).astype(np.float32))
    np.save(tmp_path / "g.npy", rng.normal(size=(n_g, dim)).astype(np.float32))
    exe = Path(sys.executable).parent / "rankwise"
    outputs = []
    for run in (1, 2):
        out = tmp_path / f"report{run}.json"
        proc = subprocess.run(
            [
                str(exe),
                "evaluate",
                "--query",
                tmp_path / "q.csv",
                "--gallery",
                tmp_path / "g.csv",
                "--query-embeddings",
                tmp_path / "q.npy",
                "--gallery-embeddings",
                tmp_path / "g.npy",
                "--protocol",
                "reid",
                "--distance",
                "cosine",
                "--ks",
                "1,5,10",
                "--query-block",
                "7",
                "--gallery-chunk",
                "33",
                "--workers",
                "2",
                "--output",
                out,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        outputs.append((proc.stdout, out.read_bytes()))
    assert outputs[0] == outputs[1]
    report = json.loads(outputs[0][1])
    assert report["num_queries"] > 0 and 0 < report["metrics"]["map"] < 100
