"""Results do not depend on tiling, worker count, row order, or on going through
the ranks store (`rankwise rank` + `rankwise metrics`) instead of `evaluate`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_json

import rankwise

PROTOCOL_CASES = {
    "recall": ("recall", "cosine", "sign", 3),
    "reid": ("reid", "euclidean", "int", 3),
    "reassociation": ("reassociation", "euclidean", "int", 3),
    "progressive": ("progressive", "cosine", "sign", 3),
}
# (query_block, gallery_chunk): size 1, uneven sizes, one tile, and mixtures
TILES = [(1, 1), (1, 8192), (8192, 1), (7, 13), (4, 5), (3, 64), (64, 3)]


def _case(make_case, protocol):
    p, d, k, s = PROTOCOL_CASES[protocol]
    return make_case(p, d, k, s)


def _assert_identical(a, b):
    """Exact equality: counts, metrics, per-query arrays."""
    assert a.to_json() == b.to_json()
    assert a.metrics == b.metrics
    _assert_same_arrays(a.per_query, b.per_query)


def _assert_same_arrays(a: dict, b: dict):
    assert set(a) == set(b)
    for key in a:
        if isinstance(a[key], dict):
            _assert_same_arrays(a[key], b[key])
            continue
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.shape == y.shape and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), key


@pytest.mark.parametrize("protocol", list(PROTOCOL_CASES))
@pytest.mark.parametrize("query_block,gallery_chunk", TILES)
def test_tile_sizes_change_nothing(make_case, protocol, query_block, gallery_chunk):
    case = _case(make_case, protocol)
    base = rankwise.evaluate(*case.args(), **case.kwargs(workers=1))
    assert base.num_queries > 0
    res = rankwise.evaluate(
        *case.args(), **case.kwargs(query_block=query_block, gallery_chunk=gallery_chunk, workers=1)
    )
    _assert_identical(res, base)


@pytest.mark.parametrize("protocol", list(PROTOCOL_CASES))
@pytest.mark.parametrize("query_block,gallery_chunk", [(5, 7), (1024, 8192)])
def test_worker_count_changes_nothing(make_case, protocol, query_block, gallery_chunk):
    case = _case(make_case, protocol)
    one = rankwise.evaluate(
        *case.args(), **case.kwargs(query_block=query_block, gallery_chunk=gallery_chunk, workers=1)
    )
    two = rankwise.evaluate(
        *case.args(), **case.kwargs(query_block=query_block, gallery_chunk=gallery_chunk, workers=2)
    )
    _assert_identical(one, two)


def _assert_close(a, b):
    ja, jb = a.to_json(), b.to_json()
    ma, mb = ja.pop("metrics"), jb.pop("metrics")
    assert ja == jb
    assert set(ma) == set(mb)
    for name in ma:
        assert ma[name] == pytest.approx(mb[name], abs=1e-9), name


@pytest.mark.parametrize("protocol", list(PROTOCOL_CASES))
@pytest.mark.parametrize("seed", [10, 11])
@pytest.mark.parametrize("which", ["queries", "gallery", "both"])
def test_row_permutations_change_nothing(make_case, protocol, seed, which):
    case = _case(make_case, protocol)
    perm, qp, gp = case.permuted(seed, queries=which != "gallery", gallery=which != "queries")
    base = rankwise.evaluate(*case.args(), **case.kwargs())
    res = rankwise.evaluate(*perm.args(), **perm.kwargs())
    # the same bits: ranks are exact and each mean is a correctly rounded sum (fsum)
    assert res.to_json() == base.to_json()
    if protocol != "progressive":
        # the same queries get the same first-match ranks, whatever the row order
        b_idx = np.asarray(base.per_query["query_index"])
        r_idx = qp[np.asarray(res.per_query["query_index"])]  # back to original rows
        order = np.argsort(r_idx)
        np.testing.assert_array_equal(r_idx[order], np.sort(b_idx))
        np.testing.assert_array_equal(
            np.asarray(res.per_query["first_rank"])[order],
            np.asarray(base.per_query["first_rank"])[np.argsort(b_idx)],
        )


def test_paths_and_dataframes_give_the_same_result(make_case, tmp_path):
    case = _case(make_case, "reid")
    opts = case.write(tmp_path)
    from_files = rankwise.evaluate(
        opts["--query"],
        opts["--gallery"],
        opts["--query-embeddings"],
        opts["--gallery-embeddings"],
        **case.kwargs(),
    )
    _assert_identical(from_files, rankwise.evaluate(*case.args(), **case.kwargs()))


def _rank_store(cli, case, tmp_path):
    """Write the case, run `rankwise rank`; return the shared CLI options and ks."""
    inputs = case.write(tmp_path)
    common = {
        **inputs,
        "--protocol": case.protocol,
        "--distance": case.distance,
        "--query-block": 6,
        "--gallery-chunk": 17,
    }
    proc = cli("rank", "--out", tmp_path / "ranks.zarr", options=common)
    assert proc.returncode == 0, proc.stderr
    return common, ",".join(map(str, case.options["ks"]))


@pytest.mark.parametrize("protocol", ["reid", "progressive"])
def test_rank_then_metrics_equals_evaluate(make_case, cli, tmp_path, protocol):
    case = _case(make_case, protocol)
    common, ks = _rank_store(cli, case, tmp_path)
    proc = cli("evaluate", "--ks", ks, "--output", tmp_path / "eval.json", options=common)
    assert proc.returncode == 0, proc.stderr
    proc = cli("metrics", tmp_path / "ranks.zarr", "--ks", ks, "--output", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    ev, me = read_json(tmp_path / "eval.json"), read_json(tmp_path / "m.json")
    assert isinstance(me.pop("provenance"), dict)
    assert me == ev
    assert "[metrics]" in proc.stdout


def test_metrics_with_other_ks_and_ap_from_the_same_ranks(make_case, cli, tmp_path):
    """Changing ks / ap needs only `metrics`: same numbers as a fresh evaluate."""
    case = _case(make_case, "reid")
    _rank_store(cli, case, tmp_path)
    proc = cli(
        "metrics",
        tmp_path / "ranks.zarr",
        "--ks",
        "2,4",
        "--ap",
        "trapezoid",
        "--output",
        tmp_path / "m2.json",
    )
    assert proc.returncode == 0, proc.stderr
    got = read_json(tmp_path / "m2.json")
    got.pop("provenance")
    assert got.pop("ap") == "trapezoid"  # named: not the standard AP (api.variant_keys)
    api = rankwise.evaluate(*case.args(), **case.kwargs(ks=(2, 4), ap="trapezoid")).to_json()
    standard = rankwise.evaluate(*case.args(), **case.kwargs(ks=(2, 4))).to_json()
    assert api["metrics"]["map"] != standard["metrics"]["map"]
    assert api.pop("ap") == "trapezoid"  # the Python API's JSON report says so too
    assert set(got) == set(api) and set(got["metrics"]) == {"rank2", "rank4", "map", "minp", "mrr"}
    for name in api["metrics"]:
        assert got["metrics"][name] == pytest.approx(api["metrics"][name], abs=1e-9), name


# ---------------------------------------------------------------- statistics


def _noisy(case, seed):
    """Embeddings of a second "encoder" on the same manifests."""
    rng = np.random.default_rng(seed)
    return (
        case.query_emb + 0.5 * rng.standard_normal(case.query_emb.shape).astype(np.float32),
        case.gallery_emb + 0.5 * rng.standard_normal(case.gallery_emb.shape).astype(np.float32),
    )


def _statistics(case, other, by, old=False):
    """Intervals, a paired comparison with random sign flips, and (progressive) the
    completion curve of ``case`` and a second encoder's embeddings ``other``.
    ``old``: stores as written before unit keys (units in store order)."""
    from rankwise import stats
    from rankwise.summary import progressive_curve

    options = {k: v for k, v in case.kwargs().items() if k != "ks"}
    stores = []
    for qe, ge in ((case.query_emb, case.gallery_emb), other):
        result = rankwise.rank(case.query, case.gallery, qe, ge, **options)
        arrays = result.arrays()
        if old:
            arrays.pop("unit_key")
        stores.append((arrays, result.attrs))
    labels = case.query if by == "identity" else None
    common = {"ks": (1, 2), "resamples": 300, "seed": 7, "by": by, "labels": labels}
    out = {
        "cis": stats.metric_cis(*stores[0], **common),
        "compare": stats.compare_ranks(*stores[0], *stores[1], exact_max=0, **common),
    }
    if case.protocol == "progressive":
        out["curve"] = progressive_curve(*stores[0], resamples=300, seed=7)
    return out


@pytest.mark.parametrize("protocol", list(PROTOCOL_CASES))
@pytest.mark.parametrize("by", ["query", "identity"])
def test_row_order_changes_no_interval_or_test(make_case, protocol, by):
    """The statistics number their units by query id (the store's ``unit_key``), so the
    same manifests in another row order give the same bits at the same seed; before,
    a permuted query manifest moved intervals and random-flip p-values (audit,
    2026-12-02; e.g. mrr's interval [40.86, 63.13] vs [40.88, 63.97])."""
    case = _case(make_case, protocol)
    other = _noisy(case, 1)
    base = _statistics(case, other, by)
    perm, qp, gp = case.permuted(12)
    got = _statistics(perm, (other[0][qp], other[1][gp]), by)
    assert got == base
    # without unit keys (a store of an earlier version) the row order shows
    old = _statistics(case, other, by, old=True)
    moved = _statistics(perm, (other[0][qp], other[1][gp]), by, old=True)
    if by == "query":
        assert moved["cis"] != old["cis"]


_PAIRED = {"resamples": 300, "seed": 7, "exact_max": 0}


def _old_and_new(make_case):
    """Two rankings of one reid case (rows permuted, ids not in row order), and their
    arrays as stores written before unit keys hold them."""
    case = _case(make_case, "reid").permuted(3, gallery=False)[0]
    options = {k: v for k, v in case.kwargs().items() if k != "ks"}
    a = rankwise.rank(*case.args(), **options)
    b = rankwise.rank(case.query, case.gallery, *_noisy(case, 2), **options)
    old_a = {k: v for k, v in a.arrays().items() if k != "unit_key"}
    old_b = {k: v for k, v in b.arrays().items() if k != "unit_key"}
    return a, b, old_a, old_b


def test_a_store_without_unit_keys_pairs_with_one_that_has_them(make_case):
    """A project ranked before unit keys gains a new checkpoint: the paired comparison
    aligns the new store's units to the old one's by query row (the report likewise, by
    its summaries' rows), giving the numbers of two old stores."""
    from rankwise import stats
    from rankwise.summary import summarise

    a, b, old_a, old_b = _old_and_new(make_case)
    common = _PAIRED
    both_old = stats.compare_ranks(old_a, a.attrs, old_b, b.attrs, **common)
    mixed = stats.compare_ranks(old_a, a.attrs, b.arrays(), b.attrs, **common)
    assert mixed == both_old
    new = stats.compare_ranks(a.arrays(), a.attrs, b.arrays(), b.attrs, **common)
    assert new != both_old  # the ids are not in row order: another numbering of units

    names = ["map", "rank1"]
    sa = summarise(old_a, a.attrs, metrics=names, resamples=0)
    sb = summarise(b.arrays(), b.attrs, metrics=names, resamples=0)
    assert not np.array_equal(sa.rows, sb.rows)
    aligned = sb.aligned(sa.rows)
    np.testing.assert_array_equal(aligned.rows, sa.rows)
    np.testing.assert_array_equal(
        aligned.values, summarise(old_b, b.attrs, metrics=names, resamples=0).values
    )
    assert sb.aligned(sa.rows[:-1]) is None


def test_a_mixed_pair_takes_the_old_stores_order_on_either_side(make_case, tmp_path):
    """An old store (no unit keys) as B and a new one as A: `compare` and the report took
    A's unit-key order (the numbers of two new stores), while the old store as A gave
    those of two old stores; the README promises the old store's order on either side
    (audit, 2026-12-02: an (epoch, old best) pair of a sweep's report)."""
    from rankwise import stats
    from rankwise.report.comparisons import compare_encoders
    from rankwise.summary import read_summary, summarise, write_summary

    a, b, old_a, old_b = _old_and_new(make_case)
    common = _PAIRED
    both_old = stats.compare_ranks(old_a, a.attrs, old_b, b.attrs, **common)
    assert both_old != stats.compare_ranks(a.arrays(), a.attrs, b.arrays(), b.attrs, **common)
    assert stats.compare_ranks(a.arrays(), a.attrs, old_b, b.attrs, **common) == both_old

    names = ["map", "rank1"]
    entries = [
        {
            "encoder": name,
            "source": f"{name}.json",
            "protocol": "reid",
            "num_gallery": a.attrs["num_gallery"],
            "metrics": {n: 0.0 for n in names},
            "provenance": {"ap": None, "protocol_options": None},
        }
        for name in ("a", "b")
    ]

    def report(arrays_a, arrays_b):
        summaries = {}
        for name, arrays, attrs in (("a", arrays_a, a.attrs), ("b", arrays_b, b.attrs)):
            path = tmp_path / f"{name}.stats.npz"  # through the file the metrics job writes
            write_summary(path, summarise(arrays, attrs, metrics=names, resamples=0))
            summaries["toy", name] = read_summary(path)
        rows, _, _ = compare_encoders(
            [("toy", entries)], summaries, resamples=300, seed=7, by="query"
        )
        return [(r["ci95"], r["p_value"]) for r in rows]

    assert report(old_a, old_b) != report(a.arrays(), b.arrays())
    assert report(a.arrays(), old_b) == report(old_a, old_b)
    assert report(old_a, b.arrays()) == report(old_a, old_b)


@pytest.mark.parametrize(
    "option, value", [("--resamples", "5"), ("--seed", "3"), ("--by", "identity"),
                      ("--cmc-max-rank", "7")],
)  # fmt: skip
def test_metrics_refuses_statistics_options_without_stats_output(
    make_case, cli, tmp_path, option, value
):
    """`rankwise metrics --resamples 5` computed no statistics and said nothing (audit,
    2026-12-02): an option that would be ignored is one line and exit 2; its default
    typed out (as the pipeline's metrics rule does, always with --stats-output) is fine."""
    _rank_store(cli, _case(make_case, "reid"), tmp_path)
    store = tmp_path / "ranks.zarr"
    proc = cli("metrics", store, option, value)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {option} sets the statistics of --stats-output, which is not given: it "
        f"would be ignored; add --stats-output FILE.npz (or use `rankwise ci`), or drop {option}"
    ]
    assert cli("metrics", store, "--resamples", "10000", "--by", "query").returncode == 0
    given = cli("metrics", store, option, value, "--stats-output", tmp_path / "s.npz")
    assert given.returncode == 0, given.stderr


def test_progressive_curve_with_grouped_levels_is_row_order_free():
    """Sketches of 23, 7 and 31 renderings: more than 20 completion levels, grouped into
    tenths, so a level averages renderings of several sketches; its mean reciprocal rank
    was np.mean's (row-order dependent in the last digit, review 2026-12-02), now
    :func:`rankwise.metrics.mean`'s; its interval numbers sketches by key."""
    import pandas as pd

    from rankwise.summary import progressive_curve

    rng = np.random.default_rng(0)
    dim, n_gallery = 8, 30
    ge = rng.standard_normal((n_gallery, dim)).astype(np.float32)
    g = pd.DataFrame({"id": [f"g{i}" for i in range(n_gallery)],
                      "label": [f"L{i}" for i in range(n_gallery)]})  # fmt: skip
    rows, emb = [], []
    for s in range(12):
        steps, target = [23, 7, 31][s % 3], int(rng.integers(n_gallery))
        for t in range(steps):
            rows.append({"id": f"s{s}_{t}", "sketch": f"S{s}", "step": t, "label": f"L{target}"})
            noise = (steps - t) / steps * 3 * rng.standard_normal(dim)
            emb.append(ge[target] + noise.astype(np.float32))
    q, qe = pd.DataFrame(rows), np.array(emb, np.float32)

    def curve(q, qe, g, ge):
        result = rankwise.rank(q, g, qe, ge, protocol="progressive", distance="cosine")
        return progressive_curve(result.arrays(), result.attrs, resamples=300, seed=4)

    base = curve(q, qe, g, ge)
    assert len(base["completion"]) == 10  # grouped
    for seed in range(3):
        qp = np.random.default_rng(seed).permutation(len(q))
        gp = np.random.default_rng(seed + 10).permutation(n_gallery)
        moved = curve(q.iloc[qp].reset_index(drop=True), qe[qp],
                      g.iloc[gp].reset_index(drop=True), ge[gp])  # fmt: skip
        assert moved == base, seed


def test_reused_tile_buffers_change_nothing(make_case):
    """The numpy path writes each tile into a reused scratch buffer (stale values of a
    larger earlier tile in it): the tiles equal fresh ``q @ g.T`` products bit for bit,
    and no buffer outlives the run."""
    from rankwise import devices

    tiles = devices.NumpyTiles()
    rng = np.random.default_rng(0)
    g = rng.standard_normal((70, 16)).astype(np.float32)
    for rows, cols in [(9, 70), (4, 33), (9, 70), (1, 1), (5, 69)]:
        q = rng.standard_normal((rows, 16)).astype(np.float32)
        sim = tiles.similarities(q, g[:cols])
        assert sim.shape == (rows, cols) and np.array_equal(sim, q @ g[:cols].T)
        tiles.release(sim)
    assert len(devices._SCRATCH) == 1  # one worker: one buffer, reused
    # two workers' buffers, a big one and a small one (a last, narrower chunk): a small
    # tile takes the small one, so the big tile after it needs no third buffer
    tiles.clear()
    big, small = tiles.similarities(q, g), tiles.similarities(q[:1], g[:3])
    tiles.release(big)
    tiles.release(small)
    narrow = tiles.similarities(q[:1], g[:2])  # one worker's narrow tile and, meanwhile,
    wide = tiles.similarities(q, g)  # the other's full one
    tiles.release(narrow)
    tiles.release(wide)
    assert sorted(b.size for b in devices._SCRATCH) == [3, q.shape[0] * 70]
    tiles.clear()
    case = _case(make_case, "reid")
    base = rankwise.evaluate(*case.args(), **case.kwargs(workers=1))
    # uneven tiles: the last block / chunk of a pass is smaller than the buffer it reuses
    res = rankwise.evaluate(*case.args(), **case.kwargs(query_block=4, gallery_chunk=7, workers=2))
    assert devices._SCRATCH == []  # cleared at the end of the run
    _assert_identical(res, base)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_pass_reads_a_chunk_only_when_it_may(make_case, monkeypatch, workers):
    """Each pass is one Dask graph (no worker waits at a barrier between groups of
    chunks). Memory stays flat because a gallery chunk is read only once the chunk
    ``workers + 1`` places before it is used up (pass 1: its keys computed; pass 2: all
    its tiles counted), so at most ``workers + 1`` prepared chunks are alive; and the
    counts are unchanged.  Pass 1's last ``workers + 1`` chunks, alive when it ends, are
    pass 2's first, not read again."""
    import threading

    from rankwise import ranking

    case = _case(make_case, "reid")
    base = rankwise.evaluate(*case.args(), **case.kwargs(workers=1))
    chunk_rows, n_blocks = 3, -(-len(case.query) // 4)
    n_chunks = -(-len(case.gallery) // chunk_rows)
    lock, events, chunk_of = threading.Lock(), [], {}
    prepare, count, pair_keys = ranking.prepare_chunk, ranking._count_task, ranking._pair_keys_task
    packed = ranking._packed_chunk

    def prepare_logged(source, start, stop, *args, **kwargs):
        prep = prepare(source, start, stop, *args, **kwargs)
        if "gallery" in source.name:
            with lock:
                events.append(("read", start // chunk_rows))
                chunk_of[id(prep[0])] = start // chunk_rows
        return prep

    def packed_logged(rows, sq):  # every chunk of pass 2, read again or carried over
        with lock:
            events.append(("pack", chunk_of[id(rows)]))
        return packed(rows, sq)

    def logged(fn, kind):
        def run(prep, *args):
            out = fn(prep, *args)
            with lock:
                events.append((kind, chunk_of[id(prep[0])]))
            return out

        return run

    monkeypatch.setattr(ranking, "prepare_chunk", prepare_logged)
    monkeypatch.setattr(ranking, "_packed_chunk", packed_logged)
    monkeypatch.setattr(ranking, "_count_task", logged(count, "tile"))
    monkeypatch.setattr(ranking, "_pair_keys_task", logged(pair_keys, "keys"))
    res = rankwise.evaluate(
        *case.args(), **case.kwargs(query_block=4, gallery_chunk=chunk_rows, workers=workers)
    )
    _assert_identical(res, base)
    ahead = workers + 1
    carried = list(range(n_chunks - ahead, n_chunks))
    second = next(i for i, e in enumerate(events) if e[0] == "pack")  # pass 2 begins
    first_pass = events[:second]
    second_pass = [(w, c) for w, c in events[second:] if w != "read"]  # arrival: packing
    assert sorted(c for w, c in events[second:] if w == "read") == list(range(n_chunks - ahead))
    orders = (list(range(n_chunks)), carried + list(range(n_chunks - ahead)))
    for kind, uses, passed, order in (
        ("keys", 1, first_pass, orders[0]),
        ("tile", n_blocks, second_pass, orders[1]),
    ):
        assert sorted(c for what, c in passed if what in ("read", "pack")) == sorted(order)
        done, alive, most = {}, set(), 0
        for what, c in passed:
            if what in ("read", "pack"):  # the chunk p-th in the pass's order arrives
                p = order.index(c)
                assert p < ahead or done.get(order[p - ahead]) == uses, (kind, c, done)
                alive.add(c)
            elif what == kind:
                done[c] = done.get(c, 0) + 1
                if done[c] == uses:
                    alive.discard(c)
            most = max(most, len(alive))
        assert most <= ahead, (kind, most)
        assert n_chunks > 2 * ahead  # the bound was tested


@pytest.mark.parametrize(
    "n,most,multiple",
    [(3368, 1024, 12), (11659, 1024, 12), (1, 1024, 12), (1024, 1024, 12), (1025, 1024, 12),
     (7, 3, 1), (10, 4, 4), (13, 5, 12), (5, 5, 2), (100, 1, 12)],
)  # fmt: skip
def test_query_blocks_are_even_and_within_the_block_size(n, most, multiple):
    """Pass 2 cuts the evaluated queries into the fewest blocks of at most ``query_block``
    rows, equal (a multiple of the fused kernel's panel height where that fits) but the
    last, so no worker's last tile is a long one while the other idles."""
    from rankwise.ranking import _even_cuts

    cuts = _even_cuts(n, most, multiple)
    sizes = np.diff(cuts)
    assert cuts[0] == 0 and cuts[-1] == n and (sizes > 0).all() and (sizes <= most).all()
    assert len(sizes) == -(-n // most)  # as few blocks as before
    assert len(set(sizes[:-1].tolist())) <= 1 and sizes[-1] <= sizes[0]
    if -(-sizes[0] // multiple) * multiple <= most and len(sizes) > 1:
        assert sizes[0] % multiple == 0
    assert sizes[0] - sizes[-1] < max(multiple, 1) * len(sizes)  # even, not 1024 + 1


def test_no_query_rows_make_no_blocks():
    from rankwise.ranking import _even_cuts

    assert _even_cuts(0, 1024, 12).tolist() == [0]


@pytest.mark.parametrize("sorted_queries", [True, False])
def test_thresholds_by_query_equal_a_lexsort(sorted_queries):
    """Pass 2's thresholds: the pairs' keys grouped by query, each query's ascending;
    against np.lexsort, with ties across and within queries, negative keys (cosine),
    queries in any pair order and queries without pairs."""
    from rankwise.ranking import _thresholds_by_query

    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 50, 5000):
        pair_q = rng.integers(0, max(1, n // 7), n).astype(np.int64)
        if sorted_queries:
            pair_q.sort()
        keys = rng.choice(np.array([-2.5, -0.0, 0.0, 1.0, 1.0 + 2**-52, 3.0]), n)
        keys[: n // 2] = rng.standard_normal(n // 2)
        got = _thresholds_by_query(keys, pair_q)
        want = keys[np.lexsort((keys, pair_q))]
        assert got.dtype == np.float64 and np.array_equal(got, want)


@pytest.mark.parametrize("protocol", ["reid", "recall"])
def test_pairs_in_any_order_give_the_same_ranks(make_case, protocol):
    """Pass 2 sorts each query block's thresholds in a task of its own, taking the block's
    pairs as one span: build_problem's pairs come grouped by query, and pairs in any other
    order (shuffled here) are grouped first, to the same ranks."""
    import dataclasses

    from rankwise.inputs import open_inputs
    from rankwise.ranking import EngineOptions, compute_ranks

    case = _case(make_case, protocol)
    inputs = open_inputs(*case.args(), protocol=protocol)
    problem = inputs.problem()
    distance = PROTOCOL_CASES[protocol][1]
    options = EngineOptions(query_block=3, gallery_chunk=11, workers=2)
    base = compute_ranks(
        problem, inputs.query_embeddings, inputs.gallery_embeddings, distance=distance,
        options=options,
    )  # fmt: skip
    assert (np.diff(problem.pair_q) >= 0).all() and len(problem.pair_q) > 20
    order = np.random.default_rng(1).permutation(len(problem.pair_q))
    shuffled = dataclasses.replace(
        problem,
        pair_q=problem.pair_q[order],
        pair_g=problem.pair_g[order],
        pair_rel=problem.pair_rel[order],
    )
    res = compute_ranks(
        shuffled, inputs.query_embeddings, inputs.gallery_embeddings, distance=distance,
        options=options,
    )  # fmt: skip
    assert np.array_equal(res.offsets, base.offsets) and np.array_equal(res.ranks, base.ranks)
