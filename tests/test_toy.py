"""Hand-computed toy tables: every expected number below is worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from conftest import read_json

import rankwise

TOL = 1e-6  # percentage points


def _frame(**cols) -> pd.DataFrame:
    df = pd.DataFrame(cols)
    for c in ("id", "label", "sketch", "sequence"):
        if c in df:
            df[c] = df[c].astype(str)
    return df


def _ids(prefix, n):
    return [f"{prefix}{i}" for i in range(n)]


def _check(metrics: dict, expected: dict):
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, abs=TOL), name


# ---------------------------------------------------------------------------
# the seed's worked example: seven matches at ranks 1-6 and 72
# ---------------------------------------------------------------------------


def _worked_example(seed=0):
    """1-D euclidean: the query sits at 0; matches at 1..6 and 72, others at 7..71."""
    pos = np.arange(1, 73, dtype=np.float32)
    labels = np.where((pos <= 6) | (pos == 72), "1", "2")
    perm = np.random.default_rng(seed).permutation(len(pos))  # rows in no particular order
    gallery = _frame(id=_ids("g", 72), label=labels[perm], camera=np.full(72, 2))
    query = _frame(id=["q0"], label=["1"], camera=[1])
    return query, gallery, np.zeros((1, 1), np.float32), pos[perm][:, None]


AP_EXAMPLE = 100 * (6 + 7 / 72) / 7  # 87.10...
INP_EXAMPLE = 100 * 7 / 72  # 9.72...


@pytest.mark.parametrize("protocol", ["reid", "recall"])
def test_seed_worked_example(protocol):
    res = rankwise.evaluate(
        *_worked_example(), protocol=protocol, distance="euclidean", ks=(1, 5, 10)
    )
    key = "rank{}" if protocol == "reid" else "recall@{}"
    # recall adds the metric-learning metrics: 6 of the top 10 are matches; R = 7 and
    # the top 7 hold 6 matches, each at precision 1 (MAP@R = 6/7)
    recall_only = {
        "precision@1": 100,
        "precision@5": 100,
        "precision@10": 60,
        "r_precision": 100 * 6 / 7,
        "map@r": 100 * 6 / 7,
    }
    _check(
        res.metrics,
        {
            key.format(1): 100,
            key.format(5): 100,
            key.format(10): 100,
            "map": AP_EXAMPLE,
            "minp": INP_EXAMPLE,
            "mrr": 100,
            **(recall_only if protocol == "recall" else {}),
        },
    )
    assert round(res.metrics["map"], 1) == 87.1
    assert round(res.metrics["minp"], 1) == 9.7
    assert (res.num_queries, res.num_skipped, res.num_gallery, res.embedding_dim) == (1, 0, 72, 1)


def test_seed_worked_example_trapezoid():
    """Official Market-1501 AP: sum_i ((i-1)/(r_i-1) + i/r_i) / 2G, first term 1 at r=1."""
    res = rankwise.evaluate(
        *_worked_example(1), protocol="reid", distance="euclidean", ap="trapezoid"
    )
    assert res.metrics["map"] == pytest.approx(100 * (12 + 6 / 71 + 7 / 72) / 14, abs=TOL)


# ---------------------------------------------------------------------------
# constant encoder: the minimum, whatever the row order
# ---------------------------------------------------------------------------

# gallery labels a,a,b,b,b,c,c,d; queries a, b, c (evaluated) and e (absent -> skipped).
# Every distance is equal, so each query's G relevant items come after its
# V - G = 8 - G valid non-relevant ones: r_i = 8 - G + i.
CONST_G_LABELS = ["a", "a", "b", "b", "b", "c", "c", "d"]
CONST_Q_LABELS = ["a", "b", "c", "e"]
AP_A = (1 / 7 + 2 / 8) / 2  # ranks 7, 8
AP_B = (1 / 6 + 2 / 7 + 3 / 8) / 3  # ranks 6, 7, 8
CONST_EXPECTED = {
    "recall@1": 0.0,
    "recall@5": 0.0,
    "recall@6": 100 / 3,  # only b's first match (rank 6)
    "recall@7": 100.0,
    "map": 100 * (AP_A + AP_B + AP_A) / 3,
    "minp": 100 * (2 / 8 + 3 / 8 + 2 / 8) / 3,
    "mrr": 100 * (1 / 7 + 1 / 6 + 1 / 7) / 3,
    "precision@1": 0.0,
    "precision@5": 0.0,
    "precision@6": 100 * (0 + 1 / 6 + 0) / 3,  # b: rank 6
    "precision@7": 100 * (1 / 7 + 2 / 7 + 1 / 7) / 3,  # a, c: rank 7; b: ranks 6, 7
    "r_precision": 0.0,  # no query has a match within its top G
    "map@r": 0.0,
}


def _constant_case(perm_seed, distance):
    rng = np.random.default_rng(perm_seed)
    gp, qp = rng.permutation(8), rng.permutation(4)
    g = _frame(id=np.array(_ids("g", 8))[gp], label=np.array(CONST_G_LABELS)[gp])
    q = _frame(id=np.array(_ids("q", 4))[qp], label=np.array(CONST_Q_LABELS)[qp])
    vec = np.array([0.5, -1.0, 2.0], np.float32)
    return q, g, np.tile(vec, (4, 1)), np.tile(vec, (8, 1))


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("perm_seed", [0, 1, 2, 3])
def test_constant_encoder_scores_the_minimum(distance, perm_seed):
    res = rankwise.evaluate(
        *_constant_case(perm_seed, distance), protocol="recall", distance=distance, ks=(1, 5, 6, 7)
    )
    _check(res.metrics, CONST_EXPECTED)
    assert (res.num_queries, res.num_skipped, res.num_gallery) == (3, 1, 8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_encoder_scores_at_least_the_constant_one(seed):
    q, g, _, _ = _constant_case(0, "euclidean")
    rng = np.random.default_rng(seed)
    qe = rng.integers(-3, 4, (4, 6)).astype(np.float32)
    ge = rng.integers(-3, 4, (8, 6)).astype(np.float32)
    res = rankwise.evaluate(q, g, qe, ge, protocol="recall", distance="euclidean", ks=(1, 5, 6, 7))
    for name, low in CONST_EXPECTED.items():
        assert res.metrics[name] >= low - TOL, name


def test_constant_encoder_reid():
    """Junk and same-camera matches removed, distractor kept; hand-computed ranks.

    gallery: a/c1, a/c2, a/c3, b/c2, 0/c2, -1/c2, b/c1.
    query a/c1: valid a/c2, a/c3, b/c2, 0/c2, b/c1 -> V=5, G=2, ranks 4, 5.
    query b/c1: valid a x3, b/c2, 0/c2           -> V=5, G=1, rank 5.
    """
    g = _frame(
        id=_ids("g", 7), label=["a", "a", "a", "b", "0", "-1", "b"], camera=[1, 2, 3, 2, 2, 2, 1]
    )
    q = _frame(id=["qa", "qb"], label=["a", "b"], camera=[1, 1])
    res = rankwise.evaluate(
        q,
        g,
        np.ones((2, 4), np.float32),
        np.ones((7, 4), np.float32),
        protocol="reid",
        distance="euclidean",
        ks=(1, 4, 5),
    )
    _check(
        res.metrics,
        {
            "rank1": 0,
            "rank4": 50,
            "rank5": 100,
            "map": 100 * ((1 / 4 + 2 / 5) / 2 + 1 / 5) / 2,
            "minp": 100 * (2 / 5 + 1 / 5) / 2,
            "mrr": 100 * (1 / 4 + 1 / 5) / 2,
        },
    )
    assert (res.num_queries, res.num_skipped, res.num_gallery) == (2, 0, 6)


# ---------------------------------------------------------------------------
# ties count against the query
# ---------------------------------------------------------------------------


#: recall, one match at rank 2, ks (1, 2).
ONE_MATCH_AT_RANK_2 = {
    "recall@1": 0,
    "recall@2": 100,
    "map": 50,
    "minp": 50,
    "mrr": 50,
    "precision@1": 0,
    "precision@2": 50,
    "r_precision": 0,  # R = 1
    "map@r": 0,
}


@pytest.mark.parametrize("order", [["rel", "non"], ["non", "rel"]])
@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_tie_between_relevant_and_nonrelevant_counts_against(order, distance):
    labels = {"rel": "a", "non": "b"}
    g = _frame(id=["g0", "g1", "g2"], label=[labels[o] for o in order] + ["c"])
    q = _frame(id=["q0"], label=["a"])
    ge = np.array([[1, 1], [1, 1], [-1, 0]], np.float32)  # g0, g1 tie; g2 is far
    res = rankwise.evaluate(
        q, g, np.array([[1, 1]], np.float32), ge, protocol="recall", distance=distance, ks=(1, 2)
    )
    _check(res.metrics, ONE_MATCH_AT_RANK_2)


def test_tie_among_relevant_items_costs_nothing():
    g = _frame(id=["g0", "g1", "g2"], label=["a", "a", "b"])
    q = _frame(id=["q0"], label=["a"])
    ge = np.array([[2, 0], [2, 0], [5, 0]], np.float32)
    res = rankwise.evaluate(
        q, g, np.array([[0, 0]], np.float32), ge, protocol="recall", distance="euclidean", ks=(1,)
    )
    _check(
        res.metrics,
        {
            "recall@1": 100,
            "map": 100,
            "minp": 100,
            "mrr": 100,
            "precision@1": 100,
            "r_precision": 100,
            "map@r": 100,
        },
    )


# ---------------------------------------------------------------------------
# perfect rankings
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_perfect_ranking_recall_and_reid(distance):
    """One-hot label embeddings: every relevant item at distance 0, all others farther."""
    g_labels = ["1", "1", "2", "2", "2", "3", "0", "0", "-1", "4"]
    g_cams = [1, 2, 1, 3, 2, 2, 1, 3, 1, 1]
    q_labels, q_cams = ["1", "2", "3", "4"], [1, 1, 1, 3]
    alphabet = sorted(set(g_labels))
    onehot = np.eye(len(alphabet), dtype=np.float32)
    ge = onehot[[alphabet.index(x) for x in g_labels]]
    qe = onehot[[alphabet.index(x) for x in q_labels]]
    g = _frame(id=_ids("g", 10), label=g_labels, camera=g_cams)
    q = _frame(id=_ids("q", 4), label=q_labels, camera=q_cams)
    for protocol, key in (("recall", "recall@{}"), ("reid", "rank{}")):
        res = rankwise.evaluate(q, g, qe, ge, protocol=protocol, distance=distance, ks=(1, 5))
        # recall: G = 2, 3, 1, 1 relevant items, so precision@5 is (2 + 3 + 1 + 1) / 20
        recall_only = {"precision@1": 100, "precision@5": 35, "r_precision": 100, "map@r": 100}
        _check(
            res.metrics,
            {
                key.format(1): 100,
                key.format(5): 100,
                "map": 100,
                "minp": 100,
                "mrr": 100,
                **(recall_only if protocol == "recall" else {}),
            },
        )
        assert res.num_queries == 4


def test_perfect_ranking_reassociation():
    rows = [
        ("A", 1, "1"),
        ("A", 1, "2"),
        ("A", 2, "1"),
        ("A", 2, "2"),
        ("A", 2, "3"),
        ("B", 1, "1"),
        ("B", 2, "1"),
        ("B", 2, "2"),
    ]
    df = _frame(
        id=_ids("d", 8),
        sequence=[r[0] for r in rows],
        frame=[r[1] for r in rows],
        label=[r[2] for r in rows],
    )
    emb = np.eye(3, dtype=np.float32)[[int(r[2]) - 1 for r in rows]]
    res = rankwise.evaluate(
        df, df, emb, emb, protocol="reassociation", distance="euclidean", ks=(1, 2)
    )
    _check(res.metrics, {"rank1": 100, "rank2": 100, "mrr": 100})
    # A1 "1", A1 "2", B1 "1" are evaluated; frame-2 queries have no frame 3
    assert (res.num_queries, res.num_skipped) == (3, 5)


def test_perfect_ranking_progressive():
    """Target at rank 1 at every step: m@A, m@B, acc@K are 100; the weighted
    versions are (1/T) sum_t exp(1 - t/T)/e < 100 by DESIGN.md's definition."""
    g = _frame(id=_ids("g", 4), label=["t1", "t2", "x", "y"])
    ge = np.eye(4, dtype=np.float32)
    q = _frame(
        id=_ids("q", 5),
        label=["t1", "t1", "t2", "t2", "t2"],
        sketch=["s1", "s1", "s2", "s2", "s2"],
        step=[2, 1, 1, 3, 2],
    )
    qe = ge[[0, 0, 1, 1, 1]]
    res = rankwise.evaluate(q, g, qe, ge, protocol="progressive", distance="cosine", ks=(1,))
    w2 = (math.exp(-1 / 2) + math.exp(-1)) / 2
    w3 = (math.exp(-1 / 3) + math.exp(-2 / 3) + math.exp(-1)) / 3
    _check(
        res.metrics,
        {
            "m@A": 100,
            "m@B": 100,
            "acc@1": 100,
            "wm@A": 100 * (w2 + w3) / 2,
            "wm@B": 100 * (w2 + w3) / 2,
        },
    )
    assert res.num_queries == 2


def test_reassociation_toy_after_a_skipped_query():
    """qa has one candidate (skipped, < 2); qb's match is second among its two."""
    q = _frame(id=["qa", "qb"], label=["x", "y"], sequence=["A", "B"], frame=[1, 1])
    g = _frame(
        id=["ga", "gbx", "gby"], label=["x", "x", "y"], sequence=["A", "B", "B"], frame=[2, 2, 2]
    )
    qe = np.array([[0.0], [0.0]], np.float32)
    ge = np.array([[0.5], [1.0], [2.0]], np.float32)
    res = rankwise.evaluate(q, g, qe, ge, protocol="reassociation", distance="euclidean", ks=(1, 2))
    _check(res.metrics, {"rank1": 0, "rank2": 100, "mrr": 50})
    assert (res.num_queries, res.num_skipped) == (1, 1)


# ---------------------------------------------------------------------------
# a tiny progressive case
# ---------------------------------------------------------------------------


def test_progressive_toy():
    """1-D gallery at 0, 10, 20, 30, 40 (N = 5); targets t (at 0) and u (at 40).

    sketch s (target t, T = 3): queries at 14, 6, 1 -> ranks 3, 2, 1
    sketch v (target u, T = 2): queries at 27, 34   -> ranks 3, 2
    """
    g = _frame(id=_ids("g", 5), label=["t", "x1", "x2", "x3", "u"])
    ge = np.array([[0], [10], [20], [30], [40]], np.float32)
    q = _frame(
        id=_ids("q", 5),
        label=["u", "t", "t", "u", "t"],
        sketch=["v", "s", "s", "v", "s"],
        step=[2, 3, 1, 1, 2],
    )
    qe = np.array([[34], [1], [14], [27], [6]], np.float32)
    res = rankwise.evaluate(q, g, qe, ge, protocol="progressive", distance="euclidean", ks=(1, 2))
    e = math.exp
    s_a = [2 / 4, 3 / 4, 4 / 4]  # (N - r)/(N - 1) for r = 3, 2, 1
    s_b = [1 / 3, 1 / 2, 1]
    v_a = [2 / 4, 3 / 4]  # r = 3, 2
    v_b = [1 / 3, 1 / 2]
    ws, wv = [e(-1 / 3), e(-2 / 3), e(-1)], [e(-1 / 2), e(-1)]
    expected = {
        "m@A": 100 * (sum(s_a) / 3 + sum(v_a) / 2) / 2,  # (0.75 + 0.625) / 2
        "m@B": 100 * (sum(s_b) / 3 + sum(v_b) / 2) / 2,
        "wm@A": 100
        * (
            sum(w * a for w, a in zip(ws, s_a, strict=True)) / 3
            + sum(w * a for w, a in zip(wv, v_a, strict=True)) / 2
        )
        / 2,
        "wm@B": 100
        * (
            sum(w * b for w, b in zip(ws, s_b, strict=True)) / 3
            + sum(w * b for w, b in zip(wv, v_b, strict=True)) / 2
        )
        / 2,
        "acc@1": 50.0,  # s ends at rank 1, v at rank 2
        "acc@2": 100.0,
    }
    assert expected["m@A"] == pytest.approx(68.75)
    _check(res.metrics, expected)
    assert (res.num_queries, res.num_skipped, res.num_gallery) == (2, 0, 5)


# ---------------------------------------------------------------------------
# labels are strings
# ---------------------------------------------------------------------------


def test_labels_compared_as_strings_in_csv(tmp_path):
    """ "07" and "7" are different labels, even read from a CSV file."""
    (tmp_path / "q.csv").write_text("id,label\nq0,7\n")
    (tmp_path / "g.csv").write_text("id,label\ng0,07\ng1,7\ng2,8\n")
    np.save(tmp_path / "q.npy", np.array([[0, 0]], np.float32))
    np.save(tmp_path / "g.npy", np.array([[1, 0], [2, 0], [3, 0]], np.float32))
    res = rankwise.evaluate(
        tmp_path / "q.csv",
        tmp_path / "g.csv",
        tmp_path / "q.npy",
        tmp_path / "g.npy",
        protocol="recall",
        distance="euclidean",
        ks=(1, 2),
    )
    _check(res.metrics, ONE_MATCH_AT_RANK_2)


# ---------------------------------------------------------------------------
# a few input errors (the CLI: exit 2, one line "error: ...", no traceback)
# ---------------------------------------------------------------------------


@pytest.fixture
def toy_inputs(tmp_path):
    (tmp_path / "q.csv").write_text("id,label\nq0,a\nq1,b\n")
    (tmp_path / "g.csv").write_text("id,label\ng0,a\ng1,b\ng2,c\n")
    np.save(tmp_path / "q.npy", np.array([[1, 0], [0, 1]], np.float32))
    np.save(tmp_path / "g.npy", np.array([[1, 0], [0, 1], [1, 1]], np.float32))
    return {
        "--query": tmp_path / "q.csv",
        "--gallery": tmp_path / "g.csv",
        "--query-embeddings": tmp_path / "q.npy",
        "--gallery-embeddings": tmp_path / "g.npy",
        "--output": tmp_path / "r.json",
    }


def _assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_cli_ok_on_toy_inputs(cli, toy_inputs):
    """Control for the error tests: the same inputs succeed."""
    proc = cli("evaluate", options=toy_inputs)
    assert proc.returncode == 0, proc.stderr
    got = read_json(toy_inputs["--output"])
    assert got["metrics"]["recall@1"] == 100.0 and got["num_queries"] == 2


def test_cli_unknown_protocol_lists_valid_ones(cli, toy_inputs):
    proc = cli("evaluate", "--protocol", "bogus", options=toy_inputs)
    _assert_one_line_error(proc, "bogus", "recall", "reid", "reassociation", "progressive")
    assert not toy_inputs["--output"].exists()


@pytest.mark.parametrize("ks", ["0,5", "1,x"])
def test_cli_ks_must_be_positive_integers(cli, toy_inputs, ks):
    proc = cli("evaluate", "--ks", ks, options=toy_inputs)
    _assert_one_line_error(proc)
    assert not toy_inputs["--output"].exists()


def test_cli_embedding_rows_must_match_manifest(cli, toy_inputs):
    np.save(toy_inputs["--query-embeddings"], np.array([[1, 0]], np.float32))  # 1 row, 2 in csv
    proc = cli("evaluate", options=toy_inputs)
    _assert_one_line_error(proc)
    assert "q.npy" in proc.stderr or "q.csv" in proc.stderr
    assert not toy_inputs["--output"].exists()


def test_api_unknown_protocol_raises_listing_valid_ones():
    q = _frame(id=["q0"], label=["a"])
    g = _frame(id=["g0"], label=["a"])
    e = np.ones((1, 2), np.float32)
    with pytest.raises(rankwise.RankwiseError, match="bogus") as info:
        rankwise.evaluate(q, g, e, e, protocol="bogus")
    for name in ("recall", "reid", "reassociation", "progressive"):
        assert name in str(info.value)


def test_several_items_with_the_query_label_count_the_first_of_them():
    """README: where several gallery items carry a sketch's label, r_t is the first of
    them (so in reassociation for a label twice in one frame).  1-D gallery at 0, 10,
    20, 30 (N = 4), label t at 0 and at 30.  Step 1 at 24: order 20, 30, 10, 0, the
    first t second (the last one fourth); step 2 at 12: order 10, 20, 0, 30, the first
    t third.  Reassociation of the query at 24 against that frame: rank 2."""
    g = _frame(id=_ids("g", 4), label=["t", "x", "y", "t"])
    ge = np.array([[0], [10], [20], [30]], np.float32)
    q = _frame(id=_ids("q", 2), label=["t", "t"], sketch=["s", "s"], step=[1, 2])
    qe = np.array([[24], [12]], np.float32)
    res = rankwise.evaluate(q, g, qe, ge, protocol="progressive", distance="euclidean", ks=(1, 2))
    w1, w2 = math.exp(-1 / 2), math.exp(-1)  # exp(1 - t/T) / e, T = 2
    a, b = [2 / 3, 1 / 3], [1 / 2, 1 / 3]  # (N - r)/(N - 1) and 1/r for r = 2, 3
    expected = {
        "m@A": 100 * sum(a) / 2,
        "m@B": 100 * sum(b) / 2,
        "wm@A": 100 * (w1 * a[0] + w2 * a[1]) / 2,
        "wm@B": 100 * (w1 * b[0] + w2 * b[1]) / 2,
        "acc@1": 0.0,
        "acc@2": 0.0,  # the complete rendering's first t is third
    }
    _check(res.metrics, expected)
    g = g.assign(sequence=["A"] * 4, frame=[2] * 4)
    q = _frame(id=["qa"], label=["t"], sequence=["A"], frame=[1])
    res = rankwise.evaluate(
        q, g, qe[:1], ge, protocol="reassociation", distance="euclidean", ks=(1, 2)
    )
    _check(res.metrics, {"rank1": 0.0, "rank2": 100.0, "mrr": 50.0})


def test_progressive_one_item_gallery_counts_m_at_a_as_one():
    """m@A = (N - r)/(N - 1) is 0/0 with one gallery item; the README's convention: 1
    (the target can only be first), so m@A = m@B = 100."""
    q = pd.DataFrame(
        {"id": ["s0", "s1"], "label": ["t", "t"], "sketch": ["a", "a"], "step": [1, 2]}
    )
    g = pd.DataFrame({"id": ["g0"], "label": ["t"]})
    emb = np.array([[1.0, 0.0], [0.6, 0.8]], np.float32)
    got = rankwise.evaluate(q, g, emb, emb[:1] * 2, protocol="progressive", distance="cosine")
    assert got.metrics["m@A"] == 100.0 and got.metrics["m@B"] == 100.0
