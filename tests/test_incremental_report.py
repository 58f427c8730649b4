"""The incremental report: statistics cached by the metrics jobs, paired tests per pair.

Properties: a report assembled from the metrics jobs' summaries and the pair cache has
the numbers of one computed from the ranks stores from scratch; a cached test extended
to more sign flips has the p-value of one run with those flips from the start; adding an
encoder computes only the pairs that involve it.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from test_report import results  # noqa: F401  (the module fixture: 2 datasets x 3 encoders)

from rankwise import stats
from rankwise.cli import main
from rankwise.errors import RankwiseError
from rankwise.report import build_report
from rankwise.report.pairs import PairCache
from rankwise.stats import _cluster_sums, compare_ranks, flip_hits, flip_hits_many, paired_sums
from rankwise.store import read_ranks
from rankwise.summary import OldSummary, read_summary, summarise, write_summary

OPTIONS = {"cmc_max_rank": 20, "resamples": 200, "seed": 3, "worst_queries": 2, "top_k": 4}


def invoke(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _numbers(doc: dict) -> dict:
    """What the report says, without where it read it from."""
    return {
        "results": [
            {k: e[k] for k in ("metrics", "ci95", "cmc", "progressive", "worst_queries")}
            for e in doc["results"]
        ],
        "comparisons": doc["comparisons"],
        "statistics": doc["statistics"],
        "best": doc["best"],
    }


@pytest.fixture(scope="module")
def summarised(results, tmp_path_factory):  # noqa: F811
    """Copies of the metrics files whose metrics jobs also wrote statistics summaries
    (`rankwise metrics --stats-output`) for OPTIONS."""
    root, metrics = results
    out = []
    for path in metrics:
        data = json.loads(path.read_text())
        ranks = data["provenance"]["ranks"]
        target = tmp_path_factory.mktemp("summaries") / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        invoke(
            "metrics",
            ranks,
            "--ks",
            "1,2,5",
            "--output",
            target,
            "--stats-output",
            target.with_suffix(".stats.npz"),
            "--cmc-max-rank",
            OPTIONS["cmc_max_rank"],
            "--resamples",
            OPTIONS["resamples"],
            "--seed",
            OPTIONS["seed"],
        )
        assert json.loads(target.read_text())["provenance"]["stats"] == str(
            target.with_suffix(".stats.npz")
        )
        out.append(target)
    return out


def test_summary_report_equals_report_from_the_stores(results, summarised):  # noqa: F811
    _, metrics = results
    scratch = build_report(metrics, **OPTIONS)
    assembled = build_report(summarised, **OPTIONS)
    assert _numbers(assembled) == _numbers(scratch)


def test_summary_for_other_settings_is_not_used(results, summarised):  # noqa: F811
    _, metrics = results
    other = {**OPTIONS, "resamples": 150, "seed": 4, "cmc_max_rank": 10}
    assert _numbers(build_report(summarised, **other)) == _numbers(build_report(metrics, **other))


def test_a_summary_written_over_by_another_evaluation_is_not_used(results, summarised, tmp_path):  # noqa: F811
    """Two metrics runs given one --stats-output: the file holds the second's summary,
    which the first's JSON still names; its intervals, CMC and paired tests were
    reported as the first's (an interval not containing its own value).  The JSON
    records the summary's key; another one is computed again from the ranks store."""
    _, metrics = results
    copies = []
    for path in summarised[:2]:  # one dataset, two encoders
        target = tmp_path / path.parent.name / path.name
        target.parent.mkdir(exist_ok=True)
        shutil.copy(path, target)
        copies.append(target)
    first, second = (json.loads(p.read_text()) for p in copies)
    assert first["provenance"]["stats_key"] != second["provenance"]["stats_key"]
    # the second evaluation's summary where the first's JSON points
    shutil.copy(second["provenance"]["stats"], tmp_path / "shared.stats.npz")
    for data, target in zip((first, second), copies, strict=True):
        data["provenance"]["stats"] = str(tmp_path / "shared.stats.npz")
        target.write_text(json.dumps(data))
    assert _numbers(build_report(copies, **OPTIONS)) == _numbers(
        build_report(metrics[:2], **OPTIONS)
    )


def test_a_summary_of_an_earlier_format_is_computed_again(results, summarised, tmp_path):  # noqa: F811
    """A summary written by an earlier rankwise (its intervals may differ in the last
    bits) is not used, nor refused: the report computes the statistics from the store."""
    _, metrics = results
    path = summarised[0]
    data = json.loads(path.read_text())
    with np.load(data["provenance"]["stats"]) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(str(arrays["meta"]))
    arrays["meta"] = np.array(json.dumps({**meta, "format": meta["format"] - 1}))
    old = tmp_path / "old.stats.npz"
    np.savez(old, **arrays)
    with pytest.raises(OldSummary):
        read_summary(old)
    data["provenance"]["stats"] = str(old)
    copy = tmp_path / path.parent.name / path.name
    copy.parent.mkdir()
    copy.write_text(json.dumps(data))
    assert _numbers(build_report([copy, *summarised[1:]], **OPTIONS)) == _numbers(
        build_report(metrics, **OPTIONS)
    )


def test_summary_round_trip_and_key(results, tmp_path):  # noqa: F811
    _, metrics = results
    ranks = json.loads(metrics[0].read_text())["provenance"]["ranks"]
    arrays, attrs = read_ranks(ranks)
    summary = summarise(arrays, attrs, metrics=["recall@1", "map"], resamples=50, seed=1)
    write_summary(tmp_path / "s.npz", summary)
    again = read_summary(tmp_path / "s.npz")
    assert again.settings == summary.settings and again.ci95 == summary.ci95
    assert again.cmc == summary.cmc and again.key == summary.key
    np.testing.assert_array_equal(again.values, summary.values)
    other = summarise(arrays, attrs, metrics=["recall@1"], resamples=50, seed=1)
    assert other.key != summary.key  # the key covers the metrics compared
    (tmp_path / "bad.npz").write_text("not a summary")
    with pytest.raises(RankwiseError, match=r"bad\.npz: not a statistics summary"):
        read_summary(tmp_path / "bad.npz")


@pytest.mark.parametrize("clusters", [23, 300])
def test_extended_flips_equal_flips_from_scratch(clusters):
    rng = np.random.default_rng(clusters)
    sums = rng.normal(size=(clusters, 3))
    sums[:, 1] = 0.05 * sums[:, 1] + 0.02  # a small, consistent difference
    whole = flip_hits(sums, 7, 0, 5000)
    # split anywhere (also across the generator's internal blocks): the same hits
    for cut in (1, 999, 3333):
        np.testing.assert_array_equal(
            flip_hits(sums, 7, 0, cut) + flip_hits(sums, 7, cut, 5000), whole
        )
    assert not np.array_equal(flip_hits(sums, 8, 0, 5000), whole)  # the seed matters


def test_flip_signs_are_the_stream_compared_with_a_half():
    """The signs made in place are ``np.where(u < 0.5, -1.0, 1.0)`` of the same draws,
    also at 0.5, just below it and at 0 (no -0.0 anywhere)."""

    class Draws:
        def __init__(self, u):
            self.u = u

        def random(self, shape):
            return self.u.reshape(shape).copy()

    u = np.random.default_rng(0).random(4000)
    u[:4] = [0.5, np.nextafter(0.5, 0.0), 0.0, np.nextafter(0.5, 1.0)]
    signs = stats._flip_signs(Draws(u), 40, 100)
    want = np.where(u.reshape(40, 100) < 0.5, -1.0, 1.0)
    assert signs.dtype == want.dtype and signs.flags.c_contiguous
    np.testing.assert_array_equal(signs, want)
    assert list(signs[0, :4]) == [1.0, -1.0, -1.0, 1.0] and not np.signbit(signs[signs > 0]).any()


@pytest.mark.parametrize("block", [None, 1000])
def test_flips_drawn_once_for_several_tests_give_each_its_own_hits(block, monkeypatch):
    """flip_hits_many: every table's hits are flip_hits' of it alone, bit for bit (also
    across blocks of flips, and from a later flip on)."""
    if block is not None:
        monkeypatch.setattr(stats, "_BLOCK_ELEMENTS", block)
    rng = np.random.default_rng(11)
    tables = [rng.normal(size=(90, m)) for m in (3, 1, 5)]
    tables[1][:, 0] = 0.03 * tables[1][:, 0] + 0.01  # a small, consistent difference
    tables[2][:, 2] = np.round(tables[2][:, 2])  # ties: integer sums
    for start, stop in ((0, 2500), (700, 2500)):
        many = flip_hits_many(tables, 4, start, stop)
        assert len(many) == 3
        for table, hits in zip(tables, many, strict=True):
            np.testing.assert_array_equal(hits, flip_hits(table, 4, start, stop))
    assert flip_hits_many([], 4, 0, 10) == []
    with pytest.raises(RankwiseError, match=r"same number of clusters"):
        flip_hits_many([tables[0], tables[0][:10]], 4, 0, 10)


def test_pair_cache_tests_pairs_together_as_one_at_a_time(results, summarised, tmp_path):  # noqa: F811
    """compare_all (the flips of a dataset's tests drawn once) gives every pair's
    numbers, counts and cache files as compare() one pair at a time, when computing,
    extending (from the cached flips) and reusing."""
    _, metrics = results
    toy = [p for p in metrics if p.parent.name == metrics[0].parent.name]
    stores = [read_ranks(json.loads(p.read_text())["provenance"]["ranks"]) for p in toy]
    names = ["recall@1", "map"]
    sa, sb, sc = (summarise(*s, metrics=names, resamples=100, seed=5) for s in stores)
    pairs = [(sa, sb, names), (sa, sc, names), (sb, sc, ["map"]), (sa, sb, names)]
    settings = {"resamples": 100, "seed": 5, "confidence": 0.95, "exact_max": 0}
    together, alone = PairCache(tmp_path / "together"), PairCache(tmp_path / "alone")
    for flips in (300, 300, 1200, 500):
        got = together.compare_all(pairs, flips=flips, **settings)
        want = [alone.compare(a, b, m, flips=flips, **settings) for a, b, m in pairs]
        for (est, p, test), (est_1, p_1, test_1) in zip(got, want, strict=True):
            assert est == est_1 and test == test_1 == "sign-flip"
            np.testing.assert_array_equal(p, p_1)
        counts = (together.computed, together.extended, together.reused)
        assert counts == (alone.computed, alone.extended, alone.reused)
        files = {f.name: f.read_bytes() for f in (tmp_path / "together").iterdir()}
        assert files == {f.name: f.read_bytes() for f in (tmp_path / "alone").iterdir()}
    assert counts == (3, 6, 7)  # the repeated pair: reused both ways


def test_pair_cache_extends_and_reuses(results, summarised, tmp_path):  # noqa: F811
    _, metrics = results
    path_a, path_b = metrics[0], metrics[1]  # toy: enc-a, enc-b
    stores = [
        read_ranks(json.loads(p.read_text())["provenance"]["ranks"]) for p in (path_a, path_b)
    ]
    names = ["recall@1", "map"]
    sa, sb = (summarise(*s, metrics=names, resamples=100, seed=5) for s in stores)
    cache = PairCache(tmp_path / "pairs")
    settings = {"resamples": 100, "seed": 5, "confidence": 0.95, "exact_max": 0}
    for flips, counts in ((300, (1, 0, 0)), (300, (1, 0, 1)), (1200, (1, 1, 1)), (500, (1, 2, 1))):
        estimates, p, test = cache.compare(sa, sb, names, flips=flips, **settings)
        assert (cache.computed, cache.extended, cache.reused) == counts
        rows = compare_ranks(
            *stores[0], *stores[1], metrics=names, resamples=100, seed=5, exact_max=0, flips=flips
        )
        assert test == "sign-flip"
        assert list(p) == [r["p_value"] for r in rows]
        assert [estimates["ci"][0][j] for j in range(2)] == [r["ci95"][0] for r in rows]
    # a damaged entry is recomputed, not trusted
    for entry in (tmp_path / "pairs").iterdir():
        entry.write_text("{")
    fresh = PairCache(tmp_path / "pairs")
    _, p, _ = fresh.compare(sa, sb, names, flips=500, **settings)
    assert fresh.computed == 1 and list(p) == [r["p_value"] for r in rows]


def test_new_encoder_computes_only_its_pairs(results, summarised, tmp_path):  # noqa: F811
    # toy and sketchy, each with enc-a, enc-b, enc-c (all pairs: three encoders <= 4)
    first_two = [p for p in summarised if p.stem != "enc-c"]
    cache = PairCache(tmp_path / "cache")
    build_report(first_two, **OPTIONS, cache=cache)
    assert (cache.computed, cache.extended, cache.reused) == (2, 0, 0)  # a-b per dataset
    cache = PairCache(tmp_path / "cache")
    doc = build_report(summarised, **OPTIONS, cache=cache)
    # a-c and b-c are new; a-b is kept (extended when the larger report needs more flips)
    assert cache.computed == 4 and cache.extended + cache.reused == 2
    assert _numbers(doc) == _numbers(build_report(summarised, **OPTIONS))
    # once more: every test (and every worst-queries list) comes from the cache
    cache = PairCache(tmp_path / "cache")
    again = build_report(summarised, **OPTIONS, cache=cache)
    assert (cache.computed, cache.extended) == (0, 0)
    assert _numbers(again) == _numbers(doc)


def test_report_cli_cache_flag(summarised, tmp_path):
    def report() -> str:
        return invoke(
            "report",
            *summarised,
            "--json",
            tmp_path / "r.json",
            "--resamples",
            OPTIONS["resamples"],
            "--seed",
            OPTIONS["seed"],
            "--cmc-max-rank",
            OPTIONS["cmc_max_rank"],
            "--cache",
            tmp_path / "cache",
        )

    assert "paired tests: 6 computed, 0 extended, 0 reused" in report()
    first = (tmp_path / "r.json").read_bytes()
    assert "paired tests: 0 computed, 0 extended, 6 reused" in report()
    assert (tmp_path / "r.json").read_bytes() == first  # cached or not: the same bytes
    shutil.rmtree(tmp_path / "cache")
    assert "paired tests: 6 computed" in report()  # a deleted cache is simply rebuilt
    assert (tmp_path / "r.json").read_bytes() == first


def test_cluster_sums_of_differences():
    va = np.array([[1.0], [0.0], [1.0]])
    vb = np.array([[0.0], [1.0], [1.0]])
    np.testing.assert_array_equal(paired_sums(va, vb, np.array([0, 0, 1])), [[0.0], [0.0]])
    np.testing.assert_array_equal(_cluster_sums(vb - va, np.array([0, 1, 1]))[0], [[-1.0], [1.0]])


def test_store_without_evaluated_queries():
    """Nothing to resample (rank refuses such inputs, a hand-made store can have none):
    without resampling it still summarises, with resampling it says why not."""
    arrays = {"query_index": np.zeros(0, np.int64), "offsets": np.zeros(1, np.int64)}
    arrays["ranks"] = np.zeros(0, np.int64)
    attrs = {"protocol": "recall", "num_gallery": 5}
    summary = summarise(arrays, attrs, metrics=["recall@1", "map"], resamples=0)
    assert summary.values.shape == (0, 2) and summary.ci95 is None
    assert summary.cmc == [0.0] * 50
    with pytest.raises(RankwiseError, match="no evaluated query; there is nothing to resample"):
        summarise(arrays, attrs, metrics=["recall@1", "map"], resamples=10)


@pytest.mark.parametrize("touched", ["query_embeddings", "query_manifest"])
def test_worst_queries_recomputed_when_a_file_they_read_changes(summarised, tmp_path, touched):
    """The nearest items come from the embedding stores, the ids, labels and images from
    the manifests: one written again (even with the same ranks) is a new key. The key
    lacked the manifests: an edited one kept its old ids from the cache (exit 0) where a
    cold report refused the stores encoded from the old one (found by review)."""
    import os

    cache_dir = tmp_path / "cache"
    doc = build_report(summarised, **OPTIONS, cache=PairCache(cache_dir))
    before = set(cache_dir.iterdir())
    assert _numbers(build_report(summarised, **OPTIONS, cache=PairCache(cache_dir))) == _numbers(
        doc
    )
    assert set(cache_dir.iterdir()) == before  # everything reused
    shown = [e for e in doc["results"] if e["worst_queries"]]
    path = shown[0]["provenance"]["files"][touched]
    stamp = os.stat(path).st_mtime_ns + 10**9
    os.utime(path, ns=(stamp, stamp))
    again = build_report(summarised, **OPTIONS, cache=PairCache(cache_dir))
    assert len(set(cache_dir.iterdir()) - before) == 1
    assert _numbers(again) == _numbers(doc)


def test_pair_cache_entries_swapped_are_computed_again(results, summarised, tmp_path):  # noqa: F811
    """Each entry holds its own key: two files swapped (copied or renamed over each
    other) gave each other's p-values and intervals, exit 0 (found by review)."""
    cache_dir = tmp_path / "cache"
    doc = build_report(summarised, **OPTIONS, cache=PairCache(cache_dir))
    by_size: dict[int, list] = {}  # two tests of as many metrics: each passes as the other
    for path in sorted(cache_dir.iterdir()):
        entry = json.loads(path.read_text())
        if "estimates" in entry:
            by_size.setdefault(len(entry["estimates"]["a"]), []).append(path)
    pairs = next(paths for paths in by_size.values() if len(paths) >= 2)
    first, second = pairs[0].read_bytes(), pairs[1].read_bytes()
    pairs[0].write_bytes(second)
    pairs[1].write_bytes(first)
    cache = PairCache(cache_dir)
    again = build_report(summarised, **OPTIONS, cache=cache)
    assert cache.computed == 2
    assert _numbers(again) == _numbers(doc)


def test_a_pair_cache_entry_edited_is_computed_again(results, summarised, tmp_path):  # noqa: F811
    """Each entry holds its body's sha256: a number changed inside a file that keeps
    its key and format (by hand, or a flipped bit) was reported as it stood."""
    cache_dir = tmp_path / "cache"
    doc = build_report(summarised, **OPTIONS, cache=PairCache(cache_dir))
    edited = 0
    for path in sorted(cache_dir.glob("*.json")):
        entry = json.loads(path.read_text())
        if "estimates" in entry:
            entry["estimates"]["a"][0] += 1.0
        elif "value" in entry and isinstance(entry["value"], dict):
            entry["value"]["queries"][0]["score"] += 1.0  # a worst-queries list
        else:
            continue
        path.write_text(json.dumps(entry))
        edited += 1
    assert edited >= 2
    cache = PairCache(cache_dir)
    again = build_report(summarised, **OPTIONS, cache=cache)
    assert cache.computed >= 1
    assert _numbers(again) == _numbers(doc)
    assert [r["worst_queries"] for r in again["results"]] == [
        r["worst_queries"] for r in doc["results"]
    ]
    # unedited, every entry is read back: the checksum holds for what was written
    cache = PairCache(cache_dir)
    build_report(summarised, **OPTIONS, cache=cache)
    assert (cache.computed, cache.extended) == (0, 0)


def test_unpairable_evaluations_are_refused_in_one_line(results, summarised, tmp_path):  # noqa: F811
    """The report and `compare_ranks` share one check (stats.check_pairable)."""
    _, metrics = results
    by_name = {(p.parent.name, p.stem): p for p in summarised}
    folder = tmp_path / "toy"
    folder.mkdir()
    # a progressive evaluation filed under the recall dataset
    shutil.copy(by_name["toy", "enc-a"], folder / "enc-a.json")
    shutil.copy(by_name["sketchy", "enc-b"], folder / "enc-b.json")
    with pytest.raises(RankwiseError, match=r"enc-b\.json: protocol 'progressive' differs from "):
        build_report([folder / "enc-a.json", folder / "enc-b.json"], **OPTIONS)
    stores = {
        (p.parent.name, p.stem): read_ranks(json.loads(p.read_text())["provenance"]["ranks"])
        for p in metrics
    }
    arrays, attrs = stores["toy", "enc-b"]
    fewer = {**arrays, "query_index": arrays["query_index"][:-1]}
    with pytest.raises(
        RankwiseError, match=r"^B: its evaluated queries \(query_index, 7 queries\)"
    ):
        compare_ranks(*stores["toy", "enc-a"], fewer, attrs, resamples=10)
    other = {**attrs, "num_gallery": attrs["num_gallery"] + 1}
    with pytest.raises(RankwiseError, match=r"^B: num_gallery \d+ differs from A's"):
        compare_ranks(*stores["toy", "enc-a"], arrays, other, resamples=10)


def test_an_unwritable_pair_cache_only_loses_the_cache(tmp_path, monkeypatch):
    """The cache is advisory ("can be deleted at any time"): a write that fails (a full
    disk: ENOSPC on the write) computes the value anyway and leaves no temporary file
    (it used to stop the report with `error: No space left on device` and leave
    `.<key>.json.<pid>.tmp`)."""
    import errno
    from pathlib import Path as _Path

    from rankwise.report.pairs import PairCache

    real = _Path.write_text

    def full(self, *args, **kwargs):
        real(self, "")  # the file is created, then the write fails, as on a full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_Path, "write_text", full)
    cache = PairCache(tmp_path / "pairs")
    assert cache.remember("x", 1, lambda: 42) == 42
    assert list((tmp_path / "pairs").iterdir()) == []
