"""The per-unit table (``rankwise.metrics.per_unit``): the one "ranks -> per-unit value".

- hand-computed toy stores (queries, and sketches with shuffled steps);
- its means are ``compute_metrics`` exactly, for every protocol, metric and AP variant,
  and equal the pre-refactor averaging written out here as a reference;
- the statistics built on it are unchanged: ``tests/data/stats_before_per_unit.json``
  holds intervals and comparisons computed by the code before the per-unit table
  existed (the same inputs are rebuilt below), compared exactly;
- one default number of resamples everywhere.
"""

from __future__ import annotations

import inspect
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import MAKERS
from test_stats import synthetic_pair

import rankwise
from rankwise import stats
from rankwise.errors import RankwiseError
from rankwise.metrics import (
    cmc,
    completion_curve,
    compute_metrics,
    mean,
    metric_names,
    per_unit,
    unit_scores,
)

GOLDEN = Path(__file__).parent / "data" / "stats_before_per_unit.json"
ROOT = Path(__file__).parent.parent


def _store(offsets, ranks, *, protocol="reid", group=None, step=None, num_gallery=10):
    n = len(offsets) - 1
    arrays = {
        "offsets": np.array(offsets),
        "ranks": np.array(ranks),
        "query_index": np.arange(n) * 2,  # manifest rows 0, 2, 4... (some skipped)
        "group": np.array(group if group is not None else [-1] * n),
        "step": np.array(step if step is not None else [0] * n),
    }
    return arrays, {"protocol": protocol, "num_gallery": num_gallery}


def test_query_units_by_hand():
    # query 0: relevant at ranks 1, 3; query 1: at 2; query 2: at 4, 5, 6
    arrays, attrs = _store([0, 2, 3, 6], [1, 3, 2, 4, 5, 6])
    table = per_unit(arrays, attrs, ["rank1", "rank4", "map", "minp", "mrr"])
    assert table.unit == "query" and len(table) == 3
    np.testing.assert_array_equal(table.index, [0, 2, 4])
    np.testing.assert_array_equal(table.rows, [0, 2, 4])
    np.testing.assert_array_equal(table.rank, [1, 2, 4])
    np.testing.assert_array_equal(table.num_relevant, [2, 1, 3])
    expected = np.array(
        [
            [1, 1, (1 + 2 / 3) / 2, 2 / 3, 1],
            [0, 1, 1 / 2, 1 / 2, 1 / 2],
            [0, 1, (1 / 4 + 2 / 5 + 3 / 6) / 3, 3 / 6, 1 / 4],
        ]
    )
    np.testing.assert_allclose(table.values, expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(table.column("mrr"), expected[:, 4])
    means = table.means()
    assert means["rank1"] == pytest.approx(100 / 3)
    assert means["map"] == pytest.approx(100 * expected[:, 2].mean())
    # CMC over r_1 = 1, 2, 4
    assert cmc(arrays, attrs, 5) == pytest.approx([100 / 3, 200 / 3, 200 / 3, 100, 100])


def test_sketch_units_by_hand():
    # two sketches given out of order: sketch 7 (steps 2, 1), sketch 3 (steps 3, 1, 2);
    # the target's rank at each rendering; N = 5 gallery items
    arrays, attrs = _store(
        [0, 1, 2, 3, 4, 5],
        [2, 4, 5, 1, 3],
        protocol="progressive",
        group=[7, 7, 3, 3, 3],
        step=[2, 1, 3, 1, 2],
        num_gallery=5,
    )
    table = per_unit(arrays, attrs, ["m@A", "m@B", "wm@B", "acc@1", "acc@3"])
    assert table.unit == "sketch"
    np.testing.assert_array_equal(table.index, [3, 7])
    # sketch 3: steps 1, 2, 3 at manifest rows 6, 8, 4 with ranks 1, 3, 5
    # sketch 7: steps 1, 2 at rows 2, 0 with ranks 4, 2
    np.testing.assert_array_equal(table.rows, [6, 2])
    np.testing.assert_array_equal(table.last_rows, [4, 0])
    np.testing.assert_array_equal(table.rank, [5, 2])
    np.testing.assert_array_equal(table.num_relevant, [1, 1])
    m_a = [((5 - 1) / 4 + (5 - 3) / 4 + 0 / 4) / 3, ((5 - 4) / 4 + (5 - 2) / 4) / 2]
    m_b = [(1 + 1 / 3 + 1 / 5) / 3, (1 / 4 + 1 / 2) / 2]
    w3 = [np.exp(1 - t / 3) / np.e for t in (1, 2, 3)]
    w2 = [np.exp(1 - t / 2) / np.e for t in (1, 2)]
    wm_b = [(w3[0] / 1 + w3[1] / 3 + w3[2] / 5) / 3, (w2[0] / 4 + w2[1] / 2) / 2]
    expected = np.array([m_a, m_b, wm_b, [0, 0], [0, 1]]).T
    np.testing.assert_allclose(table.values, expected, rtol=0, atol=1e-15)
    assert cmc(arrays, attrs, 3) == pytest.approx([0, 50, 50])
    scores = unit_scores(arrays, attrs, ks=(2,))
    assert list(scores) == [
        "sketch",
        "query_index",
        "m@A",
        "m@B",
        "wm@A",
        "wm@B",
        "last_rank",
        "hit@2",
    ]
    np.testing.assert_array_equal(scores["hit@2"], [False, True])
    curve = completion_curve(arrays)
    # completion 100 t / T: 33.3 (sketch 3, t=1), 50 (sketch 7, t=1), 66.7, 100 (both)
    assert curve["completion"] == pytest.approx([33.333333, 50, 66.666667, 100])
    assert curve["num_renderings"] == [1, 1, 1, 2]
    assert curve["mean_reciprocal_rank"] == pytest.approx([100, 25, 100 / 3, 35])
    assert curve["median_rank"] == [1, 4, 3, 3.5]


def _old_average(pq: dict, name: str, protocol: str) -> float:
    """compute_metrics before the per-unit table: ``metrics._average`` and the old
    per-sketch grouping, written out again."""
    if protocol == "progressive":
        first, group, step, n = pq["first"], pq["group"], pq["step"], pq["num_gallery"]
        order = np.lexsort((step, group))
        g, r = group[order], first[order].astype(np.float64)
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        sizes = np.diff(np.r_[starts, len(g)])
        T = np.repeat(sizes, sizes).astype(np.float64)
        t = np.arange(len(g)) - np.repeat(starts, sizes) + 1.0
        pct = (n - r) / (n - 1)
        w = np.exp(1.0 - t / T) / np.e
        mean = lambda x: np.add.reduceat(x, starts) / sizes
        sk = {
            "m@A": mean(pct),
            "m@B": mean(1.0 / r),
            "wm@A": mean(w * pct),
            "wm@B": mean(w / r),
            "last_rank": r[starts + sizes - 1].astype(np.int64),
        }
        if name.startswith("acc@"):
            return np.mean(sk["last_rank"] <= int(name[4:]))
        return np.mean(sk[name])
    for prefix in ("recall@", "rank"):
        if name.startswith(prefix):
            return np.mean(pq["first_rank"] <= int(name[len(prefix) :]))
    if name in ("map", "minp", "mrr"):
        return np.mean(pq[{"map": "ap", "minp": "inp", "mrr": "rr"}[name]])
    # the metric-learning families (added after the refactor), query by query
    lists = np.split(pq["ranks"], pq["offsets"][1:-1])
    if name.startswith("precision@"):
        k = int(name[len("precision@") :])
        return np.mean([np.sum(r <= k) / k for r in lists])
    if name == "r_precision":
        return np.mean([np.sum(r <= len(r)) / len(r) for r in lists])
    return np.mean([sum(i / x for i, x in enumerate(r, 1) if x <= len(r)) / len(r) for r in lists])


@pytest.mark.parametrize("protocol", list(MAKERS))
@pytest.mark.parametrize("ap", ["standard", "trapezoid"])
def test_means_are_compute_metrics_for_every_metric(protocol, ap):
    case, _, _ = MAKERS[protocol]().permuted(5, gallery=False)  # sketches' steps shuffled
    options = {k: v for k, v in case.options.items() if k != "ks"}
    result = rankwise.rank(*case.args(), protocol=protocol, distance=case.distance, **options)
    arrays, attrs = result.arrays(), result.attrs
    ks = (1, 2, 5)
    names = metric_names(protocol, ks)
    metrics, pq = compute_metrics(arrays, attrs, ks=ks, ap=ap)
    table = per_unit(arrays, attrs, names, ap=ap)
    assert table.means() == metrics  # exactly: compute_metrics is its mean
    assert len(table) == attrs["num_queries"]
    old = dict(
        pq,
        first=pq["first_rank"],
        group=arrays["group"],
        step=arrays["step"],
        num_gallery=float(attrs["num_gallery"]),
        offsets=arrays["offsets"],
        ranks=arrays["ranks"],
    )
    for j, name in enumerate(names):
        # the old code's np.mean sums in another order than rankwise.metrics.mean
        want = pytest.approx(100.0 * float(_old_average(old, name, protocol)), rel=1e-12, abs=1e-12)
        assert metrics[name] == want, name
        column = table.values[:, j]
        exact = sum(Fraction(float(v)) for v in column) / len(column)
        assert abs(Fraction(mean(column)) - exact) <= abs(exact) * 2**-52  # within an ulp
        assert 100.0 * mean(column) == metrics[name]


@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.7, 1 / 19, 5e-324])
@pytest.mark.parametrize("n", [1, 3, 7, 1000])
def test_mean_of_a_constant_is_the_constant_and_order_free(value, n):
    """fsum(x) / n alone misses a constant by an ulp (3 x 0.1 / 3); its interval then lay
    an ulp below the metric (helper probe, 2026-12-01)."""
    assert mean(np.full(n, value)) == value
    assert stats.bootstrap_ci(np.full(n, value), resamples=50) == [value, value]
    rng = np.random.default_rng(n)
    x = rng.random(n) / 7
    assert all(mean(rng.permutation(x)) == mean(x) for _ in range(5))


def test_unknown_metric_names_the_parameter():
    arrays, attrs = _store([0, 1], [1])
    with pytest.raises(RankwiseError, match=r"metrics: unknown metric 'm@A' for query units"):
        per_unit(arrays, attrs, ["m@A"])
    # '²' is a digit to str.isdigit, not to int(): a ValueError traceback before
    with pytest.raises(RankwiseError, match=r"metrics: unknown metric 'rank²' for query units"):
        per_unit(arrays, attrs, ["rank²"])
    with pytest.raises(RankwiseError, match="unknown AP variant"):
        per_unit(arrays, attrs, ["map"], ap="11point")


def _golden_inputs():
    """The inputs the golden file was computed from (see tests/data)."""
    a, b, person = synthetic_pair(3, 0.3)
    out = {
        "reid_cis": lambda: stats.metric_cis(*a, ks=(1, 5), resamples=500, seed=4),
        "reid_cis_identity": lambda: stats.metric_cis(
            *a, ks=(1, 5), resamples=500, seed=4, by="identity", labels=person
        ),
        "reid_compare": lambda: stats.compare_ranks(
            *a, *b, ks=(1, 5), resamples=500, seed=4, by="identity", labels=person
        ),
        "reid_compare_mc": lambda: stats.compare_ranks(
            *a, *b, ks=(1, 5), resamples=500, seed=4, exact_max=0
        ),
    }
    return out


def _same(got, want, path="") -> None:
    """``got == want``, floats to 1e-12 percentage points: the means are fsum's since
    the golden file was written (correctly rounded, a few ulp from np.mean's)."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for key in want:
            _same(got[key], want[key], f"{path}/{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{path}/{i}")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=0, abs=1e-12), path
    else:
        assert got == want, path


def test_statistics_unchanged_since_before_the_per_unit_table():
    golden = json.loads(GOLDEN.read_text())
    for key, compute in _golden_inputs().items():
        _same(json.loads(json.dumps(compute())), golden[key], key)
    for protocol, make in MAKERS.items():
        case, _, _ = make().permuted(5, gallery=False)
        options = {k: v for k, v in case.options.items() if k != "ks"}
        result = rankwise.rank(*case.args(), protocol=protocol, distance=case.distance, **options)
        # the golden numbers number the units in store order, as a store written before
        # unit keys does (the permuted manifests' ids are not in row order; the unit-key
        # order is tested in test_invariance.py)
        arrays = {k: v for k, v in result.arrays().items() if k != "unit_key"}
        attrs = result.attrs
        labels = case.query["label"].to_numpy()
        got = {
            "cis": stats.metric_cis(arrays, attrs, ks=(1, 2, 5), resamples=300, seed=9),
            "cis_identity": stats.metric_cis(
                arrays, attrs, ks=(1, 2, 5), resamples=300, seed=9, by="identity", labels=labels
            ),
        }
        # metrics added since (recall's precision@K, r_precision, map@r) are not in the
        # golden file; resampling draws do not depend on the number of metrics
        got = {
            key: {name: value[name] for name in golden[protocol][key]} for key, value in got.items()
        }
        _same(json.loads(json.dumps(got)), golden[protocol], protocol)


def test_one_default_number_of_resamples():
    from rankwise import report
    from rankwise.cli import main

    assert stats.DEFAULT_RESAMPLES == 10000
    functions = [
        stats.bootstrap_ci,
        stats.metric_cis,
        stats.sign_flip_test,
        stats.compare_ranks,
        report.build_report,
        report.progressive_curve,
    ]
    for function in functions:
        default = inspect.signature(function).parameters["resamples"].default
        assert default == stats.DEFAULT_RESAMPLES, function.__name__
    for command in ("ci", "compare", "report"):
        option = next(p for p in main.commands[command].params if p.name == "resamples")
        assert option.default == stats.DEFAULT_RESAMPLES, command
    # the demo keeps its report at 1000 resamples explicitly (its numbers stay put)
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert config["report"]["resamples"] == 1000
