"""TPR at fixed FPR over all valid query-gallery pairs: against scikit-learn's ROC curve
(every threshold) and a sorted brute force, on generated Market-like data; ties by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from reference import distance_matrix, protocol_masks
from test_rerank import market_like

from rankwise import verification
from rankwise.errors import RankwiseError
from rankwise.verification import ROC_FPRS, tpr_at_fpr

FPRS = (1e-4, 1e-3, 1e-2, 0.05, 0.3)


def _brute_force(d, valid, relevant, x):
    negatives = np.sort(d[valid & ~relevant])
    v = negatives[math.floor(x * len(negatives))]
    return 100.0 * np.mean(d[relevant] < v)


def _sklearn(d, valid, relevant, x):
    """Max TPR over ROC points with FPR <= x (scores: -distance; every threshold)."""
    roc_curve = pytest.importorskip("sklearn.metrics").roc_curve
    fpr, tpr, _ = roc_curve(relevant[valid], -d[valid], drop_intermediate=False)
    return 100.0 * tpr[fpr <= x].max()


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_roc_curve_and_a_sorted_brute_force(seed, distance):
    q, g, qe, ge = market_like(seed, distance)
    got = tpr_at_fpr(q, g, qe, ge, protocol="reid", distance=distance, fprs=FPRS)
    d = distance_matrix(qe, ge, distance)
    valid, relevant = protocol_masks("reid", q, g)
    assert got["num_positive_pairs"] == relevant.sum()
    assert got["num_negative_pairs"] == (valid & ~relevant).sum()
    for x in FPRS:
        want = _brute_force(d, valid, relevant, x)
        assert got["tpr@fpr"][f"{x:g}"] == pytest.approx(want, abs=1e-9)
        assert want == pytest.approx(_sklearn(d, valid, relevant, x), abs=1e-9)
    assert len(set(got["tpr@fpr"].values())) > 1  # the levels differ on this data


def _canonical_distances(qe, ge, distance):
    """Pair distances as rankwise defines them: float32 rows (cosine: normalised in
    float64, stored float32), products and sums in float64."""
    q = np.asarray(qe, np.float64)
    g = np.asarray(ge, np.float64)
    if distance == "cosine":
        q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32).astype(np.float64)
        g = (g / np.linalg.norm(g, axis=1, keepdims=True)).astype(np.float32).astype(np.float64)
        return 1.0 - q @ g.T
    return np.sqrt(((q[:, None, :] - g[None, :, :]) ** 2).sum(axis=2))


def _check_everything(got, qe, ge, valid, relevant, distance):
    """ROC at every level, thresholds and both histograms against brute force."""
    d = _canonical_distances(qe, ge, distance)
    negatives = np.sort(d[valid & ~relevant])
    positives = d[relevant]
    assert got["num_negative_pairs"] == len(negatives)
    assert got["num_positive_pairs"] == len(positives)
    for x, tpr in zip(got["roc"]["fpr"], got["roc"]["tpr"], strict=True):
        v = negatives[math.floor(x * len(negatives))]
        assert tpr == pytest.approx(100.0 * np.mean(positives < v), abs=1e-9), x
    for level, threshold in got["threshold@fpr"].items():
        want = negatives[math.floor(float(level) * len(negatives))]
        assert threshold == pytest.approx(want, rel=1e-9, abs=1e-9)
    hist = got["histogram"]
    edges = np.array(hist["edges"])
    assert edges[0] <= min(negatives[0], positives.min()) + 1e-9
    assert edges[-1] >= max(negatives[-1], positives.max()) - 1e-9
    for values, counts in ((negatives, hist["negative"]), (positives, hist["positive"])):
        b = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, len(edges) - 2)
        assert counts == np.bincount(b, minlength=len(edges) - 1).tolist()
    # the curve is a staircase envelope: never decreasing
    assert np.all(np.diff(got["roc"]["tpr"]) >= 0)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_roc_curve_thresholds_and_histograms_equal_brute_force(distance):
    q, g, qe, ge = market_like(3, distance)
    got = tpr_at_fpr(q, g, qe, ge, protocol="reid", distance=distance, fprs=FPRS, bins=17)
    valid, relevant = protocol_masks("reid", q, g)
    _check_everything(got, qe, ge, valid, relevant, distance)
    assert len(got["histogram"]["edges"]) == 18
    n = got["num_negative_pairs"]
    assert got["roc"]["fpr"] == [x for x in sorted(set(FPRS) | set(ROC_FPRS)) if x * n >= 1]


def _many_pairs(seed, distance, quantised):
    """~200 x 3000 recall pairs, overlapping classes; ``quantised``: integer
    embeddings with duplicated gallery rows, so distances tie in bulk and many sit on a
    bracket or bin edge."""
    rng = np.random.default_rng(seed)
    n_q, n_g, dim, n_cls = 200, 3000, 6, 25
    centres = rng.normal(size=(n_cls, dim))
    ql, gl = rng.integers(0, n_cls, n_q), rng.integers(0, n_cls, n_g)
    qe = centres[ql] + 1.2 * rng.normal(size=(n_q, dim))
    ge = centres[gl] + 1.2 * rng.normal(size=(n_g, dim))
    if quantised:
        qe, ge = np.round(qe), np.round(ge)
        ge[1::3] = ge[::3][: len(ge[1::3])]  # copied rows: exact ties
        gl[1::3] = gl[::3][: len(gl[1::3])]
        qe[qe.sum(axis=1) == 0, 0] = 1.0  # no zero vector under cosine
        ge[ge.sum(axis=1) == 0, 0] = 1.0
        qe[np.all(qe == 0, axis=1), 0] = 1.0
        ge[np.all(ge == 0, axis=1), 0] = 1.0
    q = pd.DataFrame({"id": [f"q{i}" for i in range(n_q)], "label": ql.astype(str)})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(n_g)], "label": gl.astype(str)})
    return q, g, qe.astype(np.float32), ge.astype(np.float32)


@pytest.mark.parametrize("fine_bins", [None, 2, 7])
@pytest.mark.parametrize("quantised", [False, True])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_many_pairs_and_bulk_ties_equal_brute_force(distance, quantised, fine_bins, monkeypatch):
    # a coarse first-pass histogram makes wide brackets (2 bins: open-ended ones):
    # the exact selection must not depend on it
    if fine_bins is not None:
        monkeypatch.setattr(verification, "FINE_BINS", fine_bins)
    q, g, qe, ge = _many_pairs(4, distance, quantised)
    got = tpr_at_fpr(
        q, g, qe, ge, protocol="recall", distance=distance, fprs=(1e-5, 1e-3, 0.2),
        query_block=64, gallery_chunk=1000,
    )  # fmt: skip
    valid, relevant = protocol_masks("recall", q, g)
    _check_everything(got, qe, ge, valid, relevant, distance)
    assert len(set(got["roc"]["tpr"])) > 5  # a real curve


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_row_order_never_changes_a_number(distance):
    q, g, qe, ge = _many_pairs(5, distance, quantised=True)
    base = tpr_at_fpr(q, g, qe, ge, protocol="recall", distance=distance, fprs=FPRS)
    rng = np.random.default_rng(0)
    qp, gp = rng.permutation(len(q)), rng.permutation(len(g))
    shuffled = tpr_at_fpr(
        q.iloc[qp].reset_index(drop=True), g.iloc[gp].reset_index(drop=True), qe[qp], ge[gp],
        protocol="recall", distance=distance, fprs=FPRS, query_block=37, gallery_chunk=501,
    )  # fmt: skip
    assert shuffled == base


@pytest.mark.parametrize("block,chunk,workers", [(1, 1, 1), (3, 5, 2), (1000, 1000, 3)])
def test_tiles_and_workers_never_change_a_number(block, chunk, workers):
    q, g, qe, ge = market_like(2)
    base = tpr_at_fpr(q, g, qe, ge, distance="euclidean", fprs=FPRS, workers=1)
    other = tpr_at_fpr(
        q, g, qe, ge, distance="euclidean", fprs=FPRS, query_block=block, gallery_chunk=chunk,
        workers=workers,
    )  # fmt: skip
    assert other == base


def test_ties_at_the_threshold_count_against_the_encoder():
    # one query at 0; gallery on a line: negatives at 1, 2, 3, 4 and positives at 1, 5.
    # FPR 0.3: m = floor(1.2) = 1 -> threshold below n_2 = 2: the positive at 1 is in,
    # TPR 50 %.  FPR 0.2: m = 0 -> below n_1 = 1: the positive tied with it is out, 0 %.
    q = pd.DataFrame({"id": ["q"], "label": ["a"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(6)], "label": list("bbbbaa")})
    ge = np.array([[1.0], [2.0], [3.0], [4.0], [1.0], [5.0]], np.float32)
    got = tpr_at_fpr(
        q, g, np.zeros((1, 1), np.float32), ge, protocol="recall", distance="euclidean",
        fprs=(0.2, 0.3, 0.5, 0.99),
    )  # fmt: skip
    assert got["tpr@fpr"] == {"0.2": 0.0, "0.3": 50.0, "0.5": 50.0, "0.99": 50.0}


def test_level_times_n_is_exact_where_the_float_product_falls_short():
    # 100 negatives at 1..100, one positive at 29.5: FPR 29/100 = 0.29 is allowed, so
    # the threshold is n_30 = 30 and TPR@FPR=0.29 is 100 %.  In floats 0.29 * 100 is
    # 28.999999999999996: floor 28 took n_29 = 29 and reported 0 %.
    q = pd.DataFrame({"id": ["q"], "label": ["a"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(101)], "label": ["b"] * 100 + ["a"]})
    ge = np.array([[float(i)] for i in range(1, 101)] + [[29.5]], np.float32)
    got = tpr_at_fpr(
        q, g, np.zeros((1, 1), np.float32), ge, protocol="recall", distance="euclidean",
        fprs=(0.28, 0.29, 0.3),
    )  # fmt: skip
    assert got["tpr@fpr"] == {"0.28": 0.0, "0.29": 100.0, "0.3": 100.0}
    assert got["threshold@fpr"] == {"0.28": 29.0, "0.29": 30.0, "0.3": 31.0}


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"fprs": (0.0,)}, "fprs must be numbers between 0 and 1"),
        ({"fprs": (1.0,)}, "fprs must be numbers between 0 and 1"),
        ({"protocol": "progressive"}, "tpr_at_fpr does not apply to protocol 'progressive'"),
    ],
)
def test_bad_input(make_case, kwargs, message):
    protocol = kwargs.get("protocol", "reid")
    case = make_case(protocol)
    with pytest.raises(RankwiseError, match=message):
        tpr_at_fpr(*case.args(), **{"protocol": protocol, **kwargs})


def test_no_negative_pair_is_an_error():
    q = pd.DataFrame({"id": ["q"], "label": ["a"]})
    g = pd.DataFrame({"id": ["g0", "g1"], "label": ["a", "a"]})
    emb = np.eye(2, dtype=np.float32)
    with pytest.raises(RankwiseError, match="query table, gallery table: no negative pair"):
        tpr_at_fpr(q, g, emb[:1], emb, protocol="recall")


def _write(tmp_path, q, g, qe, ge) -> list:
    q.to_csv(tmp_path / "q.csv", index=False)
    g.to_csv(tmp_path / "g.csv", index=False)
    np.save(tmp_path / "q.npy", qe)
    np.save(tmp_path / "g.npy", ge)
    return [
        "--query", tmp_path / "q.csv", "--gallery", tmp_path / "g.csv",
        "--query-embeddings", tmp_path / "q.npy", "--gallery-embeddings", tmp_path / "g.npy",
    ]  # fmt: skip


def test_cli_verify_prints_and_writes_the_library_numbers(tmp_path, cli):
    import json

    q, g, qe, ge = market_like(0)
    out = tmp_path / "v.json"
    proc = cli("verify", *_write(tmp_path, q, g, qe, ge), "--distance", "euclidean",
               "--fprs", "1e-2,0.1", "--output", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    want = tpr_at_fpr(q, g, qe, ge, distance="euclidean", fprs=(0.01, 0.1))
    got = json.loads(out.read_text())
    assert got.pop("inputs") == {
        "query_manifest": str(tmp_path / "q.csv"),
        "gallery_manifest": str(tmp_path / "g.csv"),
        "query_embeddings": str(tmp_path / "q.npy"),
        "gallery_embeddings": str(tmp_path / "g.npy"),
        "protocol": "reid",
        "junk_labels": ["-1"],
        "exclude_same_camera": True,
    }
    assert got == json.loads(json.dumps(want))
    assert f"TPR@FPR=0.1: {want['tpr@fpr']['0.1']:.2f}" in proc.stdout


@pytest.mark.parametrize(
    "options,message",
    [
        (["--fprs", "0"], "--fprs must be numbers between 0 and 1"),
        (["--fprs", "x"], "--fprs must be"),
        # one JSON key for both: one level was dropped silently (audit 2026-12-02)
        (["--fprs", "0.24999999,0.25"], "--fprs: 0.24999999 and 0.25 are both reported as"),
        # no upper bound: 10^9 bins grew past 15 GB (audit 2026-12-04)
        (["--bins", "10001"], "--bins must be an integer in 1..10000, got 10001"),
    ],
)
def test_cli_verify_refuses_in_one_line(tmp_path, cli, options, message):
    q, g, qe, ge = market_like(0)
    out = tmp_path / "v.json"
    proc = cli("verify", *_write(tmp_path, q, g, qe, ge), *options, "--output", out)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert not out.exists()


def test_cli_verify_without_negative_pairs_exits_2(tmp_path, cli):
    q = pd.DataFrame({"id": ["q"], "label": ["a"]})
    g = pd.DataFrame({"id": ["g0", "g1"], "label": ["a", "a"]})
    emb = np.eye(2, dtype=np.float32)
    proc = cli("verify", *_write(tmp_path, q, g, emb[:1], emb), "--protocol", "recall")
    assert proc.returncode == 2 and "no negative pair" in proc.stderr


def test_a_pair_on_a_histogram_edge_counts_in_the_bin_above():
    """Bin b is [edges[b], edges[b+1]) in distance. The bins were filled by squared
    distance with edge keys d * d, which round above the key of a pair at distance d:
    the positive at exactly sqrt(8) = edges[1] was counted in bin 0 (audit 2026-12-02)."""
    q = pd.DataFrame({"id": ["q0"], "label": ["1"], "camera": ["0"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(4)], "label": ["1", "1", "1", "2"],
                      "camera": ["1"] * 4})  # fmt: skip
    qe = np.array([[1, 1]], np.float32)
    ge = np.array([[1, 1], [5, 5], [3, 3], [2, 1]], np.float32)  # d = 0, sqrt(32), sqrt(8)
    got = tpr_at_fpr(q, g, qe, ge, protocol="reid", distance="euclidean", fprs=(0.5,), bins=2)
    assert got["histogram"]["edges"][1] == math.sqrt(8.0)
    assert got["histogram"]["positive"] == [1, 2]
    # integer data in bulk: every pair binned by its distance against the printed edges
    for distance in ("euclidean", "cosine"):
        q, g, qe, ge = _many_pairs(5, distance, quantised=True)
        got = tpr_at_fpr(q, g, qe, ge, protocol="recall", distance=distance, bins=13)
        valid, relevant = protocol_masks("recall", q, g)
        d = distance_matrix(qe, ge, distance)
        edges = np.array(got["histogram"]["edges"])
        for mask, key in ((valid & relevant, "positive"), (valid & ~relevant, "negative")):
            b = np.clip(np.searchsorted(edges, d[mask], side="right") - 1, 0, len(edges) - 2)
            assert got["histogram"][key] == np.bincount(b, minlength=len(edges) - 1).tolist()


def test_all_zero_embeddings_under_euclidean():
    """Every distance 0 (a collapsed encoder): ZeroDivisionError in the first pass before;
    now the tie rule's answer, TPR 0 at threshold 0, every pair in one bin."""
    q = pd.DataFrame({"id": ["q0", "q1"], "label": ["1", "2"]})
    g = pd.DataFrame({"id": ["g0", "g1", "g2"], "label": ["1", "2", "3"]})
    got = tpr_at_fpr(q, g, np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32),
                     protocol="recall", distance="euclidean", fprs=(0.01, 0.5), bins=5)  # fmt: skip
    assert got["tpr@fpr"] == {"0.01": 0.0, "0.5": 0.0}
    assert got["threshold@fpr"] == {"0.01": 0.0, "0.5": 0.0}
    assert sum(got["histogram"]["positive"]) == 2 and sum(got["histogram"]["negative"]) == 4
    assert max(got["histogram"]["negative"]) == 4


@pytest.mark.parametrize("junk", ["-1", -1, ["-1"]])
def test_junk_labels_are_read_as_rankwise_rank_reads_them(junk):
    """``junk_labels="-1"`` was split into the labels '-' and '1' (label 1 dropped as
    junk); ``-1`` raised TypeError."""
    q = pd.DataFrame({"id": ["q0", "q1"], "label": ["1", "2"], "camera": ["a", "a"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(5)], "label": ["1", "1", "2", "-1", "3"],
                      "camera": ["b"] * 5})  # fmt: skip
    rng = np.random.default_rng(0)
    qe, ge = rng.normal(size=(2, 4)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    want = tpr_at_fpr(q, g, qe, ge, protocol="reid", distance="euclidean", junk_labels=("-1",))
    got = tpr_at_fpr(q, g, qe, ge, protocol="reid", distance="euclidean", junk_labels=junk)
    assert got == want
    assert (got["num_positive_pairs"], got["num_negative_pairs"]) == (3, 5)
