"""``drop_junk``: re-ranking and AQE on the gallery without its junk rows, as torchreid's
and fast-reid's dataset loaders leave them (they drop ``pid == -1`` when they read
Market-1501/MSMT17), against the dense references of tests/reference.py run on the
gallery with those rows removed, and against rankwise on such a gallery."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zarr
from helpers import write_inputs
from reference import (
    average_query_expansion,
    evaluate_reference,
    re_ranking,
    rerank_input_distances,
)
from test_rerank import market_like

import rankwise
from rankwise.errors import RankwiseError

TOL = 1e-6  # percentage points


def _without_junk(g, ge):
    keep = (g["label"] != "-1").to_numpy()
    return g[keep].reset_index(drop=True), ge[keep], np.flatnonzero(keep)


def _reference(q, g, qe, ge, distance, rerank=None, aqe=None):
    """The published pipeline on the gallery torchreid's loader would read."""
    g, ge, _ = _without_junk(g, ge)
    if aqe is not None:
        qe, ge = average_query_expansion(qe, ge, *aqe)
    final = None
    if rerank is not None:
        final = re_ranking(*rerank_input_distances(qe, ge, distance), *rerank)
    return evaluate_reference(q, g, qe, ge, protocol="reid", distance=distance, dist=final)


def _same_ranks(a, b):
    np.testing.assert_array_equal(a.offsets, b.offsets)
    np.testing.assert_array_equal(a.ranks, b.ranks)
    np.testing.assert_array_equal(a.query_index, b.query_index)


CASES = [
    ({"rerank": "20,6,0.3"}, (20, 6, 0.3), None),
    ({"rerank": "5,3,0.1"}, (5, 3, 0.1), None),
    ({"aqe": "3,3"}, None, (3, 3.0)),
    ({"aqe": "4,2", "rerank": "10,4,0.3"}, (10, 4, 0.3), (4, 2.0)),
]


@pytest.mark.parametrize("options,rerank,aqe", CASES, ids=["rk", "rk-small", "aqe", "aqe+rk"])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_the_reference_on_the_gallery_without_junk(seed, distance, options, rerank, aqe):
    q, g, qe, ge = market_like(seed, distance)
    got = rankwise.rank(q, g, qe, ge, protocol="reid", distance=distance, drop_junk=True, **options)
    ref = _reference(q, g, qe, ge, distance, rerank, aqe)
    for mine, theirs in zip(np.split(got.ranks, got.offsets[1:-1]), ref.ranks, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    result = rankwise.api.result_from_ranks(got)
    assert result.num_gallery == ref.num_gallery  # junk was never a rankable row
    for name, value in ref.metrics.items():
        assert result.metrics[name] == pytest.approx(value, abs=TOL), name
    assert got.attrs["protocol_options"]["drop_junk"] is True

    # rankwise itself on the gallery without the junk rows: the same ranks, and the same
    # nearest items once numbered in the whole gallery
    g2, ge2, kept = _without_junk(g, ge)
    cut = rankwise.rank(q, g2, qe, ge2, protocol="reid", distance=distance, **options)
    _same_ranks(got, cut)
    top = cut.extra["top_items"]
    np.testing.assert_array_equal(
        got.extra["top_items"], np.where(top >= 0, kept[np.maximum(top, 0)], -1)
    )
    assert (
        g["label"].to_numpy()[got.extra["top_items"][got.extra["top_items"] >= 0]] != "-1"
    ).all()


def test_the_junk_rows_change_the_numbers_only_through_the_neighbour_sets():
    """Kept (the default), the junk rows are neighbours; the plain ranking is the same
    either way (junk is never ranked), so drop_junk without re-ranking/AQE is refused."""
    q, g, qe, ge = market_like(0)
    kept = rankwise.evaluate(q, g, qe, ge, protocol="reid", rerank="20,6,0.3")
    dropped = rankwise.evaluate(q, g, qe, ge, protocol="reid", rerank="20,6,0.3", drop_junk=True)
    assert kept.metrics != dropped.metrics
    g2, ge2, _ = _without_junk(g, ge)
    plain = rankwise.evaluate(q, g, qe, ge, protocol="reid")
    assert rankwise.evaluate(q, g2, qe, ge2, protocol="reid").metrics == plain.metrics
    with pytest.raises(RankwiseError, match="drop_junk only changes the neighbour sets"):
        rankwise.rank(q, g, qe, ge, protocol="reid", drop_junk=True)
    q, g = q.drop(columns="camera"), g.drop(columns="camera")
    with pytest.raises(RankwiseError, match="drop_junk applies to protocol reid only"):
        rankwise.rank(q, g, qe, ge, protocol="recall", aqe="3,3", drop_junk=True)


def test_tiles_and_workers_never_change_a_number():
    q, g, qe, ge = market_like(1)
    options = dict(protocol="reid", aqe="3,3", rerank="8,3,0.3", drop_junk=True)
    one = rankwise.rank(q, g, qe, ge, **options)
    other = rankwise.rank(q, g, qe, ge, query_block=3, gallery_chunk=5, workers=2, **options)
    _same_ranks(one, other)
    np.testing.assert_array_equal(one.extra["top_items"], other.extra["top_items"])


def test_a_bad_row_is_named_by_its_row_in_the_file(tmp_path):
    """The kept rows are read into memory; a NaN among them is still named by its row of
    the .npy, not by its place among the kept rows."""
    q, g, qe, ge = market_like(0)
    junk = np.flatnonzero((g["label"] == "-1").to_numpy())
    bad = int(np.flatnonzero((g["label"] != "-1").to_numpy())[-1])
    assert bad > junk[0]  # its place among the kept rows differs from its row
    ge = ge.copy()
    ge[bad, 2] = np.nan
    np.save(tmp_path / "g.npy", ge)
    with pytest.raises(RankwiseError, match=rf"g\.npy: gallery embeddings row {bad} \(0-based\)"):
        rankwise.rank(q, g, qe, tmp_path / "g.npy", protocol="reid", aqe="3,3", drop_junk=True)


def test_store_pairs_with_the_plain_one():
    from rankwise import stats

    q, g, qe, ge = market_like(0)
    plain = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean")
    rk = rankwise.rank(
        q, g, qe, ge, protocol="reid", distance="euclidean", rerank="20,6,0.3", drop_junk=True
    )
    rows = stats.compare_ranks(
        plain.arrays(), plain.attrs, rk.arrays(), rk.attrs, metrics="map", resamples=50
    )
    want = rankwise.api.result_from_ranks(rk).metrics["map"]
    assert rows[0]["b"] == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--protocol", "reid"], r"--drop-junk only changes .*: add --rerank or --aqe, or remove"),
        (
            ["--protocol", "recall", "--aqe", "3,3"],
            r"--drop-junk applies to protocol reid only, not 'recall'",
        ),
    ],
)
def test_cli_refuses_in_one_line_and_writes_nothing(tmp_path, cli, args, message):
    q, g, qe, ge = market_like(0)
    inputs = write_inputs(tmp_path, q, g, qe, ge)
    out = tmp_path / "ranks.zarr"
    proc = cli("rank", *args, "--drop-junk", "--out", out, *inputs)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not list(tmp_path.glob("ranks.zarr*"))
    proc = cli(
        "rank", "--protocol", "reid", "--rerank", "20,6,0.3", "--drop-junk", "--out", out,
        *inputs,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert dict(zarr.open_group(out, mode="r").attrs)["protocol_options"]["drop_junk"] is True


def test_config_passes_it_to_rank_only_with_reranking_or_aqe():
    """The rank rule's flags: without rerank/aqe the key changes nothing, not even a
    rerun, like an option the protocol does not take (recall)."""
    from rankwise import pipeline_config as pc

    rk = {"k1": 20, "k2": 6, "lambda": 0.3}
    for protocol, aqe, rerank, drop, want in [
        ("reid", None, None, True, ""),
        ("reid", {"k": 3, "alpha": 3.0}, None, True, "--aqe 3,3.0 --drop-junk"),
        ("reid", None, rk, True, "--rerank 20,6,0.3 --drop-junk"),
        ("reid", None, rk, False, "--rerank 20,6,0.3"),
        ("recall", None, rk, True, "--rerank 20,6,0.3"),
    ]:
        entry = {"protocol": protocol, "aqe": aqe, "rerank": rerank, "drop_junk": drop}
        pc.check_reranking({"m": entry})  # accepted in every case
        assert pc.rerank_flags(entry) == want


def test_a_gallery_subset_keeps_every_rule_on_the_rows_it_keeps():
    """Problem.gallery_subset: on the kept rows, valid/relevant are the whole problem's
    (multi-query twins included, keyed by the new row numbers); pairs renumbered."""
    from test_multi_query import multi_case

    from rankwise.inputs import open_inputs
    from rankwise.protocols import dense_masks

    query, gallery, qe, ge = multi_case(3, "int", twins=True)
    inputs = open_inputs(query, gallery, qe, ge, protocol="reid").pool("mean", distance="cosine")
    problem = inputs.problem()
    assert len(problem.twins)
    rng = np.random.default_rng(0)
    n_g = len(problem.glab)
    keep = np.union1d(problem.pair_g, rng.choice(n_g, n_g // 2, replace=False))
    twin_rows = np.unique(problem.twins % n_g)
    keep = np.union1d(keep, twin_rows[::2])  # some twins kept, others left out
    assert 0 < len(keep) < n_g
    sub = problem.gallery_subset(keep)
    q = np.arange(len(problem.qlab))[:, None]
    np.testing.assert_array_equal(
        np.stack(dense_masks(sub, q, np.arange(len(keep))[None, :])),
        np.stack(dense_masks(problem, q, keep[None, :])),
    )
    np.testing.assert_array_equal(keep[sub.pair_g], problem.pair_g)
    assert sub.num_gallery == problem.num_gallery
    with pytest.raises(ValueError, match="not kept"):
        problem.gallery_subset(np.setdiff1d(np.arange(n_g), problem.pair_g[:1]))
