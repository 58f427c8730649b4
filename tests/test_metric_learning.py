"""precision@K, R-precision and MAP@R (protocol ``recall``) as pytorch-metric-learning
defines them.

pytorch-metric-learning is not installed here, so its ``AccuracyCalculator`` formulas
(``get_relevance_mask``, ``r_precision``, ``mean_average_precision(at_r=True)``,
``precision_at_k``, the "lone query" mask, ``avg_of_avgs=False``, ``k=None``) are
re-written below in their matrix form over a k-nearest-neighbour label table, and
compared with rankwise on tie-free data.  With ties the ranks follow DESIGN.md (ties
count against the query), checked on a hand-computed constant-encoder case; the
generated cases of test_reference.py / test_properties.py (ties included) compare the
same metrics with per-query brute force.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import rankwise
from rankwise import metrics, stats

KS = (1, 2, 5, 10)


def _pml_metrics(emb: np.ndarray, labels: np.ndarray, ks) -> dict[str, float]:
    """PML's AccuracyCalculator on ``query is reference`` (self removed), in percent.

    knn: each row's neighbours by ascending euclidean distance, self excluded; ``num_k``
    = max(max label count, max(ks)).  Relevance mask: the first ``count - 1`` columns of a
    row whose label has ``count`` items (R = count - 1).  Rows with a lone label are left
    out of every metric.
    """
    d = ((emb[:, None, :] - emb[None, :, :]) ** 2).sum(axis=2)
    np.fill_diagonal(d, np.inf)
    uniq, counts = np.unique(labels, return_counts=True)
    num_k = max(int(counts.max()), max(ks))
    knn = np.argsort(d, axis=1, kind="stable")[:, :num_k]
    knn_labels = labels[knn]
    count_of = dict(zip(uniq, counts, strict=True))
    keep = np.array([count_of[label] > 1 for label in labels])
    knn_labels, gt = knn_labels[keep], labels[keep][:, None]
    relevance = np.zeros(knn_labels.shape, dtype=np.int64)
    for label, count in zip(uniq, counts, strict=True):
        relevance[np.flatnonzero(gt[:, 0] == label), : count - 1] = 1
    same = gt == knn_labels
    # r_precision
    rp = np.sum(same * relevance.astype(bool), axis=1) / np.sum(relevance, axis=1)
    # mean_average_precision(at_r=True)
    equality = same * relevance.astype(bool)
    cumulative = np.cumsum(equality, axis=1)
    k_idx = np.tile(np.arange(1, num_k + 1), (len(gt), 1))
    precision_at_ks = cumulative * equality / k_idx
    map_r = np.sum(precision_at_ks * relevance, axis=1) / np.sum(relevance, axis=1)
    out = {f"precision@{k}": 100.0 * np.mean(np.sum(same[:, :k], axis=1) / k) for k in ks}
    out["r_precision"] = 100.0 * np.mean(rp)
    out["map@r"] = 100.0 * np.mean(map_r)
    return out


def _blobs(seed: int, n_classes: int = 12, dim: int = 6):
    """Tie-free float embeddings, classes of 1..9 items (some lone), rows shuffled."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 10, size=n_classes)
    labels = np.repeat(np.arange(n_classes), sizes).astype(str)
    centres = rng.normal(size=(n_classes, dim))
    emb = centres[np.repeat(np.arange(n_classes), sizes)] + 0.9 * rng.normal(
        size=(len(labels), dim)
    )
    order = rng.permutation(len(labels))
    return emb[order], labels[order]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_pml_accuracy_calculator_on_tie_free_data(seed):
    emb, labels = _blobs(seed)
    table = pd.DataFrame({"id": [f"i{i}" for i in range(len(labels))], "label": labels})
    got = rankwise.evaluate(
        table, table, emb, emb, protocol="recall", distance="euclidean", ks=KS, query_block=5
    )
    want = _pml_metrics(emb, labels, KS)
    assert got.num_skipped == int(sum(np.sum(labels == x) == 1 for x in labels))
    for name, value in want.items():
        assert got.metrics[name] == pytest.approx(value, abs=1e-9), name
    # the data exercise the definitions: R differs between queries, the metrics differ
    assert len({got.metrics["map@r"], got.metrics["r_precision"], got.metrics["map"]}) == 3


def _store(offsets, ranks):
    offsets, ranks = np.asarray(offsets, np.int64), np.asarray(ranks, np.int64)
    arrays = {"offsets": offsets, "ranks": ranks, "query_index": np.arange(len(offsets) - 1)}
    return arrays, {"protocol": "recall", "num_gallery": 10}


def test_hand_computed_toy():
    # q0: G = 3 at ranks 1, 3, 6; q1: G = 1 at rank 2; q2: G = 2 at ranks 1, 2
    arrays, attrs = _store([0, 3, 4, 6], [1, 3, 6, 2, 1, 2])
    got, _ = metrics.compute_metrics(arrays, attrs, ks=(1, 2, 5))
    want = {
        "precision@1": 100 * (1 + 0 + 1) / 3,
        "precision@2": 100 * (1 / 2 + 1 / 2 + 2 / 2) / 3,
        "precision@5": 100 * (2 / 5 + 1 / 5 + 2 / 5) / 3,
        "r_precision": 100 * (2 / 3 + 0 / 1 + 2 / 2) / 3,
        # q0: (1/1 + 2/3) / 3 (rank 6 > R = 3 is not counted); q1: rank 2 > R = 1
        "map@r": 100 * ((1 + 2 / 3) / 3 + 0 + (1 + 1) / 2) / 3,
    }
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    # a perfect ranking scores 100 on R-precision and MAP@R, and precision@K <= G/K
    perfect, _ = metrics.compute_metrics(*_store([0, 3, 4], [1, 2, 3, 1]), ks=(1, 4))
    assert perfect["r_precision"] == perfect["map@r"] == 100.0
    assert perfect["precision@4"] == pytest.approx(100 * (3 / 4 + 1 / 4) / 2)


def test_ties_count_against_the_query():
    # a constant encoder: every valid item is tied, so each query's G relevant items
    # take the last G of its N - 1 ranks (DESIGN.md tie rule)
    labels = np.array(list("aaabbc"))
    table = pd.DataFrame({"id": [f"i{i}" for i in range(6)], "label": labels})
    emb = np.ones((6, 3))
    got = rankwise.evaluate(table, table, emb, emb, distance="euclidean", ks=(1, 5))
    # a-queries: G = 2 at ranks 4, 5; b-queries: G = 1 at rank 5; c is skipped
    assert got.num_skipped == 1
    assert got.metrics["r_precision"] == 0.0 and got.metrics["map@r"] == 0.0
    assert got.metrics["precision@1"] == 0.0
    assert got.metrics["precision@5"] == pytest.approx(100 * (3 * 2 / 5 + 2 * 1 / 5) / 5)


def test_names_parse_and_feed_intervals():
    assert metrics.parse_metric("precision@5", "recall") == ("precision", 5)
    assert metrics.parse_metric("map@r", "recall") == ("map@r", None)
    assert metrics.parse_metric("r_precision", "recall") == ("r_precision", None)
    with pytest.raises(rankwise.RankwiseError, match="unknown metric 'map@r' for protocol 'reid'"):
        metrics.parse_metric("map@r", "reid")
    names = metrics.metric_names("recall", (1, 5))
    assert names[-4:] == ["precision@1", "precision@5", "r_precision", "map@r"]
    arrays, attrs = _store([0, 3, 4, 6], [1, 3, 6, 2, 1, 2])
    table = metrics.per_unit(arrays, attrs, ["precision@5", "map@r"])
    np.testing.assert_allclose(table.column("precision@5"), [2 / 5, 1 / 5, 2 / 5])
    cis = stats.metric_cis(arrays, attrs, metrics="map@r,r_precision", resamples=200)
    means = table.means()
    assert cis["map@r"][0] <= means["map@r"] <= cis["map@r"][1]
