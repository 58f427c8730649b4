"""Bootstrap intervals, the paired sign-flip test, Holm, and ``rankwise compare``.

Reference computations are written here independently: per-resample loops for the
bootstrap, ``itertools.product`` over all sign flips, Holm by hand.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import progressive_case, read_json, reassociation_case, reid_case

import rankwise
from rankwise import stats
from rankwise.cli import main
from rankwise.errors import RankwiseError
from rankwise.metrics import compute_metrics, metric_names, per_unit, unit_scores
from rankwise.registry import get_protocol
from rankwise.store import read_ranks, write_ranks


def _streams(seed):
    """The documented generators: SeedSequence(seed).spawn(2) -> (bootstrap, flips)."""
    boot, flip = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(boot), np.random.default_rng(flip)


def synthetic_ranks(difficulty, n_rel, delta, rng, n_gallery=80):
    """A reid ranks store: query q's relevant items score ``difficulty[q] + delta + noise``,
    the others ``noise``; ranks follow from the scores (higher = closer)."""
    offsets, ranks = [0], []
    for d, g in zip(difficulty, n_rel, strict=True):
        rel = np.sort(d + delta + rng.normal(0, 1, g))[::-1]
        non = rng.normal(0, 1, n_gallery - g)
        ranks.append(1 + (non[None, :] >= rel[:, None]).sum(axis=1) + np.arange(g))
        offsets.append(offsets[-1] + g)
    n = len(n_rel)
    arrays = {
        "offsets": np.array(offsets),
        "ranks": np.concatenate(ranks),
        "query_index": np.arange(n),
        "group": np.full(n, -1),
        "step": np.zeros(n, int),
    }
    attrs = {
        "protocol": "reid",
        "distance": "cosine",
        "num_queries": n,
        "num_skipped": 0,
        "num_gallery": n_gallery,
        "embedding_dim": 8,
    }
    return arrays, attrs


def synthetic_pair(seed, delta_b, n_persons=20, per_person=3):
    """Encoders A and B on the same queries; B's relevant items are ``delta_b`` closer."""
    rng = np.random.default_rng([seed, 7])
    person = np.repeat(np.arange(n_persons), per_person)
    n = len(person)
    difficulty = rng.normal(1.0, 1.0, n_persons)[person] + rng.normal(0, 0.5, n)
    n_rel = rng.integers(1, 4, n)
    a = synthetic_ranks(difficulty, n_rel, 0.0, rng)
    b = synthetic_ranks(difficulty, n_rel, delta_b, rng)
    return a, b, person.astype(str)


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_ci_matches_per_resample_loop():
    values = np.random.default_rng(11).random(37)
    boot_rng, _ = _streams(3)
    means = [values[boot_rng.integers(0, 37, size=37)].mean() for _ in range(500)]
    expected = np.percentile(means, [2.5, 97.5])
    got = stats.bootstrap_ci(values, resamples=500, seed=3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert got[0] < values.mean() < got[1]
    # another coverage: 2.5% .. 97.5% -> 5% .. 95%
    np.testing.assert_allclose(
        stats.bootstrap_ci(values, resamples=500, seed=3, confidence=0.9),
        np.percentile(means, [5, 95]),
        rtol=0,
        atol=1e-12,
    )


def test_cluster_bootstrap_matches_per_resample_loop():
    rng = np.random.default_rng(5)
    labels = rng.choice(np.array(["p3", "p1", "p7", "p2", "p9"]), 23)
    values = rng.random(23)
    ids = np.unique(labels)  # clusters are numbered in sorted label order
    boot_rng, _ = _streams(8)
    means = []
    for _ in range(400):
        chosen = boot_rng.integers(0, len(ids), size=len(ids))
        means.append(np.concatenate([values[labels == ids[c]] for c in chosen]).mean())
    got = stats.bootstrap_ci(values, clusters=labels, resamples=400, seed=8)
    np.testing.assert_allclose(got, np.percentile(means, [2.5, 97.5]), rtol=0, atol=1e-12)


def test_bootstrap_does_not_depend_on_block_size(monkeypatch):
    a, _, person = synthetic_pair(0, 0.0)
    kw = dict(resamples=333, seed=4, by="identity", labels=person)
    whole = stats.metric_cis(*a, **kw)
    monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", 7)
    assert stats.metric_cis(*a, **kw) == whole
    monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", 1)
    assert stats.metric_cis(*a, **kw) == whole


def test_metric_cis_are_bootstrap_ci_of_per_query_scores():
    a, _, _ = synthetic_pair(1, 0.0)
    cis = stats.metric_cis(*a, ks=(1, 5), resamples=300, seed=2)
    pq = unit_scores(*a, ks=(1, 5))
    columns = {
        "rank1": pq["hit@1"],
        "rank5": pq["hit@5"],
        "map": pq["ap"],
        "minp": pq["inp"],
        "mrr": pq["rr"],
    }
    assert list(cis) == metric_names("reid", (1, 5))
    metrics, _ = compute_metrics(*a, ks=(1, 5))
    for name, column in columns.items():
        assert 100 * np.mean(column) == pytest.approx(metrics[name], abs=1e-9)
        expected = 100 * np.array(stats.bootstrap_ci(column, resamples=300, seed=2))
        np.testing.assert_allclose(cis[name], expected, rtol=0, atol=1e-9)
        assert cis[name][0] <= metrics[name] <= cis[name][1]


def test_progressive_units_are_sketches():
    case = progressive_case()
    result = rankwise.rank(*case.args(), protocol="progressive", distance="euclidean")
    arrays, attrs = result.arrays(), result.attrs
    metrics, _ = compute_metrics(arrays, attrs, ks=(1, 3))
    pq = unit_scores(arrays, attrs, ks=(1, 3))
    assert len(pq["sketch"]) == attrs["num_queries"]
    assert 100 * pq["hit@1"].mean() == pytest.approx(metrics["acc@1"])
    assert 100 * pq["wm@B"].mean() == pytest.approx(metrics["wm@B"])
    first = case.query.groupby("sketch")["step"].idxmin()
    assert set(pq["query_index"]) == set(first)
    cis = stats.metric_cis(arrays, attrs, ks=(1, 3), resamples=200)
    for name, value in metrics.items():
        assert cis[name][0] <= value <= cis[name][1]
    labels = case.query["label"].to_numpy()
    by_target = stats.metric_cis(
        arrays, attrs, ks=(1, 3), resamples=200, by="identity", labels=labels
    )
    assert set(by_target) == set(metrics)


def test_progressive_curve_band_resamples_targets_by_identity():
    """With by="identity" the completion curve's band resampled sketches, not targets (two
    sketches of one target counted as independent), while the metrics' intervals resampled
    targets; the report captions every interval "by identity" (audit, 2026-12-02)."""
    from rankwise.summary import progressive_curve, summarise

    case = progressive_case()  # target t3 has two sketches
    result = rankwise.rank(*case.args(), protocol="progressive", distance="euclidean")
    arrays, attrs = result.arrays(), result.attrs
    labels = case.query["label"].to_numpy()
    got = progressive_curve(arrays, attrs, resamples=300, seed=5, by="identity", labels=labels)
    # per rendering: completion t / T of its sketch, 1 / rank, its target's label
    group, step = arrays["group"], arrays["step"]
    first = arrays["ranks"][arrays["offsets"][:-1]].astype(np.float64)
    size = {g: int((group == g).sum()) for g in set(group.tolist())}
    t = [int((step[group == g] <= s).sum()) for g, s in zip(group, step, strict=True)]
    level = np.round([100.0 * k / size[g] for k, g in zip(t, group, strict=True)], 6)
    target = labels[arrays["query_index"]]
    expected = []
    for value in np.unique(level):
        x, lab = 1.0 / first[level == value], target[level == value]
        ids = np.unique(lab)  # clusters in sorted label order
        boot_rng, _ = _streams(5)
        means = []
        for _ in range(300):
            chosen = boot_rng.integers(0, len(ids), size=len(ids))
            means.append(np.concatenate([x[lab == ids[c]] for c in chosen]).mean())
        expected.append(100 * np.percentile(means, [2.5, 97.5]))
    np.testing.assert_allclose(got["ci95"], expected, rtol=0, atol=1e-9)
    by_sketch = progressive_curve(arrays, attrs, resamples=300, seed=5)
    assert by_sketch["ci95"] != got["ci95"]
    summary = summarise(
        arrays, attrs, metrics=["m@B"], resamples=300, seed=5, by="identity", labels=labels
    )
    assert summary.progressive["ci95"] == got["ci95"]


def test_labels_of_another_manifest_are_refused():
    """--by identity with another manifest's labels (the gallery's: more rows than the
    queries ranked) was accepted, clustering the queries by the wrong labels.  The ranks
    record how many query rows they came from."""
    case = progressive_case()
    result = rankwise.rank(*case.args(), protocol="progressive", distance="euclidean")
    arrays, attrs = result.arrays(), result.attrs
    assert attrs["num_query_rows"] == len(case.query)
    labels = case.query["label"].to_numpy()
    stats.metric_cis(arrays, attrs, resamples=20, by="identity", labels=labels)
    with pytest.raises(RankwiseError, match=r"rows, but the ranks store's queries came from"):
        wrong = np.r_[labels, labels[:3]]
        stats.metric_cis(arrays, attrs, resamples=20, by="identity", labels=wrong)


# ---------------------------------------------------------------- sign-flip test


def _exact_p(d, clusters=None):
    """Fraction of all sign flips (of whole clusters) with |sum| >= the observed |sum|."""
    groups = (
        [d[clusters == c] for c in np.unique(clusters)]
        if clusters is not None
        else [d[i : i + 1] for i in range(len(d))]
    )
    sums = [g.sum() for g in groups]
    observed = abs(sum(sums))
    flips = list(itertools.product((1.0, -1.0), repeat=len(sums)))
    return sum(
        abs(sum(s * x for s, x in zip(signs, sums, strict=True))) >= observed for signs in flips
    ) / len(flips)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_sign_flip_p_value(seed):
    d = np.random.default_rng(seed).integers(-4, 5, 11) / 8.0  # exact sums, many ties
    assert stats.sign_flip_test(d, resamples=10) == _exact_p(d)


def test_exact_sign_flip_by_cluster():
    rng = np.random.default_rng(9)
    d = rng.integers(-6, 7, 30) / 16.0
    clusters = rng.integers(0, 9, 30)
    assert stats.sign_flip_test(d, clusters=clusters) == _exact_p(d, clusters)


def test_hand_example_sign_flip():
    # d = (1, 1, 1): |sum| = 3 is reached by the identity and the all-flipped vector only
    assert stats.sign_flip_test([1.0, 1.0, 1.0]) == pytest.approx(2 / 8)
    # no difference at all: every flip ties -> p = 1
    assert stats.sign_flip_test(np.zeros(40), resamples=99) == 1.0


def test_monte_carlo_sign_flip_matches_per_resample_loop():
    d = np.random.default_rng(4).normal(0.1, 1.0, 30)
    _, flip_rng = _streams(6)
    observed = abs(d.sum())
    hits = 0
    for _ in range(700):
        flip = flip_rng.random(30) < 0.5
        hits += abs(np.where(flip, -d, d).sum()) >= observed * (1 - 1e-12)
    assert stats.sign_flip_test(d, resamples=700, seed=6) == pytest.approx(
        (hits + 1) / 701, abs=1e-15
    )


def test_monte_carlo_agrees_with_exact():
    d = np.random.default_rng(3).normal(0.3, 1.0, 14)
    exact = _exact_p(d)
    mc = stats.sign_flip_test(d, resamples=20000, seed=1, exact_max=0)
    assert 0.05 < exact < 0.95
    assert abs(mc - exact) < 0.015  # 4.5 standard errors at most


# ---------------------------------------------------------------- Holm


def test_holm_hand_example():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> max(0.06, 0.04)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0]
    assert stats.holm([0.2]) == [0.2]
    assert stats.holm([]) == []
    rows = [{"metric": "m", "p_value": p, "p_holm": p} for p in (0.01, 0.04, 0.03, 0.005)]
    assert [r["p_holm"] for r in stats.with_holm(rows)] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rows[0]["p_holm"] == 0.01  # not mutated


# ---------------------------------------------------------------- paired comparison


def test_compare_ranks_paired_bootstrap_and_rows():
    a, b, person = synthetic_pair(2, 0.5)
    rows = stats.compare_ranks(
        *a, *b, metrics="map,rank1", resamples=400, seed=5, dataset="toy", names=("base", "new")
    )
    ma, _ = compute_metrics(*a)
    mb, _ = compute_metrics(*b)
    assert [r["metric"] for r in rows] == ["map", "rank1"]
    va = per_unit(*a, ["map", "rank1"]).values
    vb = per_unit(*b, ["map", "rank1"]).values
    for j, row in enumerate(rows):
        assert {"dataset", "metric", "a", "b", "diff", "ci95", "p_value", "p_holm"} <= set(row)
        assert (row["dataset"], row["encoder_a"], row["encoder_b"]) == ("toy", "base", "new")
        assert row["a"] == pytest.approx(ma[row["metric"]])
        assert row["b"] == pytest.approx(mb[row["metric"]])
        assert row["diff"] == pytest.approx(row["b"] - row["a"])
        # paired: the bootstrap of the per-query differences, same resamples
        expected = 100 * np.array(stats.bootstrap_ci(vb[:, j] - va[:, j], resamples=400, seed=5))
        np.testing.assert_allclose(row["ci95"], expected, rtol=0, atol=1e-9)
        assert row["p_value"] == stats.sign_flip_test(vb[:, j] - va[:, j], resamples=400, seed=5)
    assert [r["p_holm"] for r in rows] == stats.holm([r["p_value"] for r in rows])
    by_id = stats.compare_ranks(
        *a, *b, metrics="map", resamples=400, seed=5, by="identity", labels=person
    )
    assert by_id[0]["num_clusters"] == 20 and by_id[0]["num_units"] == 60
    assert by_id[0]["ci95"] != rows[0]["ci95"]


def test_calibration_noise_vs_real_difference():
    metrics = "rank1,map,mrr"
    null_p, null_cover, better_p = [], [], []
    for seed in range(50):
        a, b, _ = synthetic_pair(seed, 0.0)
        rows = stats.compare_ranks(*a, *b, metrics=metrics, resamples=1000, seed=seed)
        null_p.append([r["p_value"] for r in rows])
        null_cover.append([r["ci95"][0] <= 0 <= r["ci95"][1] for r in rows])
        a, b, _ = synthetic_pair(seed, 1.5)
        better_p.append(
            [
                r["p_value"]
                for r in stats.compare_ranks(*a, *b, metrics=metrics, resamples=1000, seed=seed)
            ]
        )
    null_p, better_p = np.array(null_p), np.array(better_p)
    assert ((null_p > 0.05).mean(axis=0) >= 0.85).all()
    assert (np.mean(null_cover, axis=0) >= 0.85).all()
    assert ((better_p < 0.01).mean(axis=0) >= 0.94).all()


_SCRIPT = """
import json, sys
import numpy as np
from threadpoolctl import threadpool_limits
sys.path.insert(0, {tests!r})
from test_stats import synthetic_pair
from rankwise import stats
with threadpool_limits(int(sys.argv[1])):
    a, b, person = synthetic_pair(3, 0.3)
    out = {{"cis": stats.metric_cis(*a, resamples=2000, seed=7, by="identity", labels=person),
           "rows": stats.compare_ranks(*a, *b, resamples=2000, seed=7, exact_max=0)}}
print(json.dumps(out))
"""


def test_same_numbers_with_one_and_two_threads():
    script = _SCRIPT.format(tests=str(Path(__file__).parent))
    outputs = []
    for threads in ("1", "2"):
        env = dict(
            os.environ,
            OMP_NUM_THREADS=threads,
            OPENBLAS_NUM_THREADS=threads,
            MKL_NUM_THREADS=threads,
            NUMBA_NUM_THREADS=threads,
        )
        done = subprocess.run(
            [sys.executable, "-c", script, threads],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["rows"][0]["test"] == "sign-flip"


# ---------------------------------------------------------------- input errors


def _other_queries():
    a, _, _ = synthetic_pair(0, 0.0)
    arrays = dict(a[0], query_index=a[0]["query_index"] + 1)
    return arrays, a[1]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a, b: (a, _other_queries()), "query_index"),
        (lambda a, b: (a, (b[0], {**b[1], "protocol": "recall"})), "protocol"),
        (lambda a, b: (a, (b[0], {**b[1], "num_gallery": 81})), "num_gallery"),
    ],
)
def test_compare_refuses_different_queries(change, message):
    a, b, _ = synthetic_pair(0, 0.0)
    a, b = change(a, b)
    with pytest.raises(RankwiseError, match=message):
        stats.compare_ranks(*a, *b, resamples=10)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"metrics": "map,recall@1"}, "unknown metric 'recall@1'.*valid metrics"),
        ({"resamples": 0}, r"^resamples must be an integer in 1\.\.10000000, got 0"),
        ({"seed": -1}, "^seed must be a non-negative integer"),
        ({"confidence": 1.5}, "^confidence must be between 0 and 1"),
        ({"by": "person"}, "^by must be one of query, identity"),
        ({"by": "identity"}, "needs the query labels.*labels="),
        ({"by": "identity", "labels": ["1", "2"]}, "one label per query manifest row"),
        ({"by": "identity", "labels": "missing.csv"}, "missing.csv: query manifest not found"),
        ({"ap": "11point"}, "unknown AP variant"),
    ],
)
def test_option_errors(options, message):
    a, b, _ = synthetic_pair(0, 0.0)
    with pytest.raises(RankwiseError, match=message):
        stats.compare_ranks(*a, *b, **{"resamples": 10, **options})
    if "metrics" not in options:
        with pytest.raises(RankwiseError, match=message):
            stats.metric_cis(*a, **{"resamples": 10, **options})


# ---------------------------------------------------------------- command line


@pytest.fixture
def stores(tmp_path):
    """Two ranks stores of the reid toy case written by the real engine, and a third
    ranked on a subset of the queries."""
    case = reid_case()
    case.query.to_csv(tmp_path / "q.csv", index=False)
    case.gallery.to_csv(tmp_path / "g.csv", index=False)
    noisy = case.query_emb + np.random.default_rng(1).integers(-2, 3, case.query_emb.shape)
    paths = {}
    for name, query, emb in [
        ("a", case.query, case.query_emb),
        ("b", case.query, noisy.astype(np.float32)),
        ("sub", case.query.iloc[:-3], case.query_emb[:-3]),
    ]:
        result = rankwise.rank(
            query, case.gallery, emb, case.gallery_emb, protocol="reid", distance="euclidean"
        )
        attrs = dict(
            result.attrs,
            query_manifest=str(tmp_path / "q.csv"),
            gallery_manifest=str(tmp_path / "g.csv"),
        )
        paths[name] = tmp_path / f"{name}.zarr"
        write_ranks(paths[name], result.arrays(), attrs)
    return paths, case


def test_cli_compare(stores, tmp_path, cli):
    paths, case = stores
    out = tmp_path / "cmp.json"
    done = cli("compare", paths["a"], paths["b"], "--resamples", 300, "--seed", 1, "--output", out)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[3].split()
    assert header == ["metric", "A", "B", "diff", "95%", "CI", "p", "p_holm"]
    doc = read_json(out)
    rows = doc["comparisons"]
    assert [r["metric"] for r in rows] == metric_names("reid", (1, 5, 10))
    ma, _ = compute_metrics(*read_ranks(paths["a"]))
    mb, _ = compute_metrics(*read_ranks(paths["b"]))
    for row in rows:
        assert row["a"] == pytest.approx(ma[row["metric"]])
        assert row["b"] == pytest.approx(mb[row["metric"]])
        assert row["diff"] == pytest.approx(row["b"] - row["a"])
        assert row["ci95"][0] <= row["ci95"][1]
        assert 0 < row["p_value"] <= row["p_holm"] <= 1
        assert f"{row['a']:.2f}" in done.stdout
    # the same command gives the same file
    again = tmp_path / "again.json"
    assert (
        cli(
            "compare", paths["a"], paths["b"], "--resamples", 300, "--seed", 1, "--output", again
        ).returncode
        == 0
    )
    assert again.read_text() == out.read_text()


def test_cli_compare_by_identity_and_metrics(stores, tmp_path):
    paths, case = stores
    out = tmp_path / "cmp.json"
    runner = CliRunner()
    done = runner.invoke(
        main,
        [
            "compare",
            str(paths["a"]),
            str(paths["b"]),
            "--by",
            "identity",
            "--metrics",
            "map,rank1",
            "--resamples",
            "200",
            "--dataset",
            "toy",
            "--output",
            str(out),
        ],
    )
    assert done.exit_code == 0, done.output
    rows = read_json(out)["comparisons"]
    arrays, _ = read_ranks(paths["a"])
    persons = case.query["label"].to_numpy()[arrays["query_index"]]
    assert [r["metric"] for r in rows] == ["map", "rank1"]
    assert rows[0]["num_clusters"] == len(set(persons)) <= 16
    assert rows[0]["test"] == "exact" and rows[0]["dataset"] == "toy"
    assert "identities" in done.output
    assert "no difference can reach" not in done.output  # 2^(1 - C) x 2 < 0.05


def test_an_empty_metrics_list_is_named_as_the_caller_wrote_it(stores):
    """The command line's flag on the command line, the argument's name from Python."""
    paths, _ = stores
    done = CliRunner().invoke(main, ["ci", str(paths["a"]), "--metrics", " , "])
    assert done.exit_code == 2
    assert "--metrics is empty; give names such as " in done.output
    with pytest.raises(RankwiseError, match=r"^metrics is empty; give names such as rank1,map,"):
        stats.resolve_metrics("reid", " , ")


def test_cli_compare_says_when_few_identities_rule_out_significance(tmp_path):
    """4 persons: the exact test's p is at least 2^(1 - 4) = 0.125 whatever the data."""
    rng = np.random.default_rng(0)
    q = pd.DataFrame({"id": [f"q{i}" for i in range(8)], "label": [str(i % 4) for i in range(8)]})
    q["camera"] = 1
    g = pd.DataFrame({"id": [f"g{i}" for i in range(20)], "label": [str(i % 4) for i in range(20)]})
    g["camera"] = 2
    centres = rng.normal(size=(4, 6))
    ge = (centres[np.arange(20) % 4] + rng.normal(size=(20, 6))).astype(np.float32)
    q.to_csv(tmp_path / "q.csv", index=False)
    paths = []
    for name, noise in (("a", 0.3), ("b", 3.0)):
        qe = (centres[np.arange(8) % 4] + noise * rng.normal(size=(8, 6))).astype(np.float32)
        result = rankwise.rank(q, g, qe, ge, protocol="reid")
        attrs = dict(result.attrs, query_manifest=str(tmp_path / "q.csv"))
        paths.append(str(tmp_path / f"{name}.zarr"))
        write_ranks(paths[-1], result.arrays(), attrs)
    args = ["compare", *paths, "--resamples", "200", "--metrics", "map"]
    done = CliRunner().invoke(main, [*args, "--by", "identity"])
    assert done.exit_code == 0, done.output
    assert (
        "note: no difference can reach p_holm < 0.05: with 4 identities the paired sign-flip "
        "test gives p >= 0.125, and significance needs p < 0.05; compare by query or on more "
        "identities" in done.output
    )
    by_query = CliRunner().invoke(main, args)  # 8 queries: p can reach 2^-7
    assert by_query.exit_code == 0 and "no difference can reach" not in by_query.output
    # 9 metrics: Holm's first step needs p < 0.0056, and 8 queries give 2^-7 at best
    many = CliRunner().invoke(
        main, ["compare", *paths, "--resamples", "200", "--ks", "1,2,3,4,5,10"]
    )
    assert many.exit_code == 0, many.output
    assert (
        "with 8 queries the paired sign-flip test gives p >= 0.00781, and Holm over 9 tests "
        "needs p < 0.0056; use more queries" in many.output
    )
    # random flips: the floor is 1 / (flips + 1), whatever the queries
    few = CliRunner().invoke(main, [*args, "--exact-max", "1", "--resamples", "10"])
    assert few.exit_code == 0, few.output
    assert (
        "with 10 random sign flips the paired test gives p >= 0.0909, and significance needs "
        "p < 0.05; use more resamples" in few.output
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["sub"], "query_index"),
        (["b", "--metrics", "map,acc@1"], "unknown metric 'acc@1'"),
        (["b", "--resamples", "0"], "--resamples"),
        (["b", "--by", "identity", "--labels", "nowhere.csv"], "nowhere.csv"),
        # labels without --by identity were ignored: a by-query answer that looked clustered
        (["b", "--labels", "nowhere.csv"], "only with by='identity' (--by identity)"),
        (["b", "--resamples", "100000000000000000000"], "--resamples must be"),
    ],
)
def test_cli_compare_errors(stores, args, message):
    paths, _ = stores
    done = CliRunner().invoke(main, ["compare", str(paths["a"]), str(paths[args[0]]), *args[1:]])
    assert done.exit_code == 2
    assert "error:" in done.output and message in done.output


def test_api_refuses_what_would_give_a_wrong_p_value():
    """Labels of another length paired the wrong units (a p of 1 became 0.002); a NaN
    made every flip compare false (p = 0, "highly significant")."""
    d = np.r_[np.full(10, 0.5), np.full(10, -0.5)]
    assert stats.sign_flip_test(d) == 1.0
    for clusters in (np.arange(5), np.arange(30), np.zeros((20, 1))):
        with pytest.raises(RankwiseError, match="clusters must have one entry per value"):
            stats.sign_flip_test(d, clusters=clusters)
    for bad in ([0.1, -0.2, np.nan, 0.3], [0.1, np.inf]):
        with pytest.raises(RankwiseError, match=r"differences\[\d\] is (nan|inf); every value"):
            stats.sign_flip_test(bad)
        with pytest.raises(RankwiseError, match=r"values\[\d\] is (nan|inf)"):
            stats.bootstrap_ci(bad)


def test_cli_interval_header_never_rounds_to_100_percent(stores):
    paths, _ = stores
    done = CliRunner().invoke(
        main, ["ci", str(paths["a"]), "--resamples", "50", "--confidence", "0.9999999"]
    )
    assert done.exit_code == 0, done.output
    assert "99.99999% CI" in done.output and "100% CI" not in done.output


def test_too_few_resamples_for_the_confidence_get_a_note():
    """A 95% percentile interval needs each 2.5% tail to hold a resample (40 of them):
    below that its ends are the extreme resamples, and `ci`, `compare` and `report` say
    so on stderr (one line) while still printing them, the report's documents too; 40
    and more: no note."""
    assert stats.coarse_interval(40, 0.95) is None
    assert stats.coarse_interval(2000, 0.999) is None
    why = stats.coarse_interval(39, 0.95)
    assert why.startswith("39 resamples are too few for 95% intervals") and "at least 40" in why
    assert "at least 2,000" in stats.coarse_interval(1999, 0.999)
    assert stats.coarse_interval(1, 0.95).startswith("1 resample is too few")
    assert "lower the confidence" in stats.coarse_interval(10**7, 1 - 1e-8)
    # exactly one resample a tail, whatever the rounding of 1 - confidence
    # (20 * (1 - 0.9) / 2 = 0.9999999999999998: the note said "use at least 20")
    for resamples, confidence in ((20, 0.9), (10, 0.8), (200, 0.99), (2000, 0.999)):
        assert stats.coarse_interval(resamples, confidence) is None, (resamples, confidence)
        assert stats.coarse_interval(resamples - 1, confidence) is not None


def test_random_flips_are_not_held_to_the_exact_floor():
    """Five queries, every one better in B: the exact test's p is 2^(1 - 5) = 0.0625,
    but random flips fall below it by chance, so `compare --exact-max 0` printed p 0.049
    beside "no difference can reach p_holm < 0.05 ... p >= 0.0625"."""
    sums = np.arange(1.0, 6.0)[:, None]
    assert stats.exact_pvalues(sums)[0] == 0.0625
    p = [stats.monte_carlo_pvalues(stats.flip_hits(sums, s, 0, 1000), 1000)[0] for s in range(60)]
    assert min(p) < 0.05  # so no floor of 0.0625 may be claimed for random flips
    assert stats.never_significant("sign-flip", 5, 1000, 1, by="query", units="queries") is None
    why = stats.never_significant("exact", 5, 1000, 1, by="query", units="queries")
    assert "p >= 0.0625" in why and why.endswith("use more queries")
    # a floor of its own: too few flips, and too few queries for the exact test as well
    why = stats.never_significant("sign-flip", 5, 10, 1, by="query", units="queries")
    assert "10 random sign flips" in why and why.endswith("use more resamples and more queries")


def test_one_metric_spelled_two_ways_is_listed_once():
    """recall@01 is recall@1: listed twice, each row counted in Holm's family (map's
    p_holm four times its p for two distinct tests); a Unicode digit ('²' passes
    str.isdigit) raised a traceback instead of naming the metric."""
    names = stats.resolve_metrics("recall", "map,recall@01,recall@1,recall@001")
    assert names == ["map", "recall@1"]
    assert stats.resolve_metrics("reid", "rank05,map,rank5") == ["rank5", "map"]
    for name in ("recall@\u00b2", "rank\u0665"):  # superscript two, Arabic-Indic five
        with pytest.raises(RankwiseError, match="unknown metric"):
            stats.resolve_metrics("recall", name)


@pytest.mark.parametrize("resamples", [10, 40])
def test_cli_notes_too_few_resamples(stores, tmp_path, resamples):
    paths, _ = stores
    runner = CliRunner()
    metrics = [tmp_path / "m" / f"{name}.json" for name in ("a", "b")]
    for store, out in zip((paths["a"], paths["b"]), metrics, strict=True):
        done = runner.invoke(main, ["metrics", str(store), "--output", str(out)])
        assert done.exit_code == 0, done.output
    for args in (
        ["ci", str(paths["a"])],
        ["compare", str(paths["a"]), str(paths["b"])],
        ["report", *map(str, metrics), "--out-dir", str(tmp_path / "rep")],
    ):
        done = runner.invoke(main, [*args, "--resamples", str(resamples)])
        assert done.exit_code == 0, done.output
        notes = [x for x in done.stderr.splitlines() if "too few for 95% intervals" in x]
        if resamples == 10:
            assert notes == [
                "note: 10 resamples are too few for 95% intervals (each 2.5% tail holds 0.25 "
                "of a resample): their ends are the most extreme resamples; use at least 40 "
                "(the default is 10,000)"
            ], args[0]
        else:
            assert notes == [], args[0]
    # and the report's documents, in the sentence saying how the intervals were made
    for name in ("report.md", "report.html"):
        text = (tmp_path / "rep" / name).read_text()
        assert ("Note: 10 resamples are too few for 95% intervals" in text) == (resamples == 10)


def test_cli_ci_and_scores(stores, tmp_path):
    paths, _ = stores
    runner = CliRunner()
    out = tmp_path / "ci.json"
    done = runner.invoke(main, ["ci", str(paths["a"]), "--resamples", "200", "--output", str(out)])
    assert done.exit_code == 0, done.output
    doc = read_json(out)
    metrics, _ = compute_metrics(*read_ranks(paths["a"]))
    assert list(doc["ci95"]) == list(metrics)
    for name, (low, high) in doc["ci95"].items():
        assert low <= metrics[name] <= high
        assert doc["metrics"][name] == pytest.approx(metrics[name])
    csv = tmp_path / "scores.csv"
    done = runner.invoke(main, ["scores", str(paths["a"]), "--ks", "1,3", "--output", str(csv)])
    assert done.exit_code == 0, done.output
    table = pd.read_csv(csv)
    assert list(table.columns) == [
        "query_index",
        "num_relevant",
        "first_rank",
        "ap",
        "inp",
        "rr",
        "hit@1",
        "hit@3",
    ]
    assert 100 * table["hit@3"].mean() == pytest.approx(
        compute_metrics(*read_ranks(paths["a"]), ks=(3,))[0]["rank3"]
    )
    assert 100 * table["ap"].mean() == pytest.approx(metrics["map"], abs=1e-6)


def test_cli_scores_read_back_as_the_same_floats(stores, tmp_path):
    """`rankwise scores` wrote floats with "%.10g": read back, a column's mean missed the
    metric by ~1e-9 points, and a float column whose values are all whole (a perfect
    query's ap, inp, rr; a single-shot hit probability of 0 or 1) was written "1" and
    read back as integers."""
    from rankwise.metrics import mean

    paths, _ = stores
    arrays, attrs = read_ranks(paths["a"])
    csv = tmp_path / "scores.csv"
    done = CliRunner().invoke(main, ["scores", str(paths["a"]), "--output", str(csv)])
    assert done.exit_code == 0, done.output
    table = pd.read_csv(csv)
    expected = unit_scores(arrays, attrs)
    metrics, _ = compute_metrics(arrays, attrs)
    for column, metric in (("ap", "map"), ("inp", "minp"), ("rr", "mrr")):
        assert table[column].dtype == np.float64
        np.testing.assert_array_equal(table[column].to_numpy(), expected[column])
        assert 100 * mean(table[column]) == metrics[metric]
    # every query's relevant items first: ap = inp = rr = 1 for each
    offsets = arrays["offsets"]
    first = np.arange(offsets[-1]) - np.repeat(offsets[:-1], np.diff(offsets)) + 1
    write_ranks(tmp_path / "perfect.zarr", dict(arrays, ranks=first), attrs)
    csv = tmp_path / "perfect.csv"
    argv = ["scores", str(tmp_path / "perfect.zarr"), "--output", str(csv)]
    done = CliRunner().invoke(main, argv)
    assert done.exit_code == 0, done.output
    table = pd.read_csv(csv)
    for column in ("ap", "inp", "rr"):
        assert table[column].dtype == np.float64 and (table[column] == 1.0).all()
    assert table["hit@1"].dtype == np.int64


@pytest.mark.parametrize("protocol", ["progressive", "reassociation"])
def test_cli_scores_refuses_ap_where_the_protocol_reports_none(tmp_path, protocol):
    """`scores --ap trapezoid` on a protocol without AP was accepted: ignored under
    progressive, and under reassociation it changed the ap column; `metrics`, `ci` and
    `compare` refuse it."""
    case = progressive_case() if protocol == "progressive" else reassociation_case()
    result = rankwise.rank(*case.args(), protocol=protocol, distance="euclidean")
    write_ranks(tmp_path / "r.zarr", result.arrays(), result.attrs)
    runner = CliRunner()
    for command in ("scores", "metrics"):
        done = runner.invoke(main, [command, str(tmp_path / "r.zarr"), "--ap", "trapezoid"])
        assert done.exit_code == 2, done.output
        assert done.output.strip().splitlines() == [
            f"error: --ap trapezoid does not apply to protocol {protocol!r}: it reports no AP "
            f"({', '.join(get_protocol(protocol).metric_families)}); drop --ap"
        ]
    done = runner.invoke(main, ["scores", str(tmp_path / "r.zarr"), "--ap", "standard"])
    assert done.exit_code == 0, done.output


def test_cli_scores_says_the_sketch_column_is_a_number_not_the_manifests_id(tmp_path):
    """Progressive `scores` has a `sketch` column that holds the store's sketch number
    (order of first appearance), not the manifest's sketch value: with integer sketch
    ids in another order, a join on `sketch` matched the wrong sketches, and the help
    said only "sketch".  It says so now, and query_index joins back."""
    case = progressive_case()
    query = case.query.copy()
    names = list(dict.fromkeys(query["sketch"]))
    query["sketch"] = query["sketch"].map({n: len(names) - 1 - i for i, n in enumerate(names)})
    result = rankwise.rank(
        query, case.gallery, case.query_emb, case.gallery_emb, protocol="progressive"
    )
    write_ranks(tmp_path / "r.zarr", result.arrays(), result.attrs)
    runner = CliRunner()
    done = runner.invoke(main, ["scores", str(tmp_path / "r.zarr")])
    assert done.exit_code == 0, done.output
    table = pd.read_csv(io.StringIO(done.output))
    joined = query.loc[table["query_index"], "sketch"].to_numpy()
    np.testing.assert_array_equal(joined, len(names) - 1 - table["sketch"].to_numpy())
    assert (query.loc[table["query_index"], "step"].to_numpy() == 1).all()  # first rendering
    help_text = " ".join(runner.invoke(main, ["scores", "--help"]).output.split())
    assert "not the manifest's sketch value: join on query_index" in help_text
    assert "a skipped query has none" in help_text


def test_an_interval_bound_on_zero_is_exactly_zero():
    """A paired difference that only a few units change, and a metric that few units
    hit: the resamples that draw only unchanged (or missed) units are exactly 0, so a
    bound there is 0.0, not +-1e-17 (centred resampling gave "[-0.30, -0.00]")."""
    rng = np.random.default_rng(3)
    hits = np.zeros(400)
    hits[:3] = 1.0
    low, high = stats.bootstrap_ci(hits, resamples=2000, seed=1)
    assert low == 0.0 and high > 0
    ap = rng.random(400)
    better = ap.copy()
    better[:3] += 0.25  # three queries improve, the rest are unchanged
    est = stats.paired_estimates(
        ap[:, None], better[:, None], np.arange(400), resamples=2000, seed=1
    )
    assert est["ci"][0][0] == 0.0 and est["ci"][1][0] > 0
    # a constant column still resamples to exactly its value
    assert stats.bootstrap_ci(np.full(9, 0.1), resamples=50) == [0.1, 0.1]


def test_too_few_clusters_are_named_whatever_the_flips():
    """One query compared with random flips: p is 1 however many flips (every flip of
    one cluster is as large as the observed sum), so the advice is more queries, not
    more resamples; with enough queries, too few flips is named."""
    why = stats.never_significant("sign-flip", 1, 1000, 1, by="query", units="queries")
    assert why is not None and "p >= 1" in why and why.endswith("use more queries")
    assert why.startswith("with 1 query the paired sign-flip test")  # not "1 queries"
    why = stats.never_significant("sign-flip", 200, 10, 1, by="query", units="queries")
    assert why is not None and why.endswith("use more resamples")
    assert stats.never_significant("sign-flip", 200, 1000, 1, by="query", units="queries") is None
    # Holm's step set by every test's flips (smallest_in_all): more flips still help
    why = stats.never_significant(
        "sign-flip", 200, 100, 20, by="query", units="queries", smallest_in_all=1 / 101
    )
    assert why is not None and why.endswith("use more resamples")


def test_tracks_are_told_apart_whatever_their_names():
    """A reassociation track is (sequence, label): sequence "a/b" with label "c" and
    sequence "a" with label "b/c" are two tracks (joined with "/" they were one)."""
    query = pd.DataFrame(
        {
            "id": ["x1", "x2", "x3", "x4", "x5"],
            "label": ["c", "b/c", "c", "b/c", "1"],
            "sequence": ["a/b", "a", "a/b", "a", "MOT17-02"],
            "frame": ["1", "1", "2", "2", "1"],
        }
    )
    attrs = {"protocol": "reassociation", "num_queries": 5, "num_skipped": 0}
    tracks = stats.query_labels(attrs, query)
    assert len(set(tracks)) == 3 and tracks[0] == tracks[2] and tracks[1] == tracks[3]
    assert tracks[4] == "MOT17-02/1"  # names without "/" read as before
