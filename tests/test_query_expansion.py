"""Average query expansion (``aqe``, fast-reid's AQE) against a dense brute force
(tests/reference.py), alone and before k-reciprocal re-ranking; invariances; bad input."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
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


def _check(got, ref):
    assert (got.num_queries, got.num_skipped) == (ref.num_queries, ref.num_skipped)
    assert set(got.metrics) == set(ref.metrics)
    for name, value in ref.metrics.items():
        assert got.metrics[name] == pytest.approx(value, abs=TOL), name


@pytest.mark.parametrize("k,alpha", [(5, 3.0), (2, 0.0), (10, 1.5)])
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("protocol", ["reid", "recall"])
def test_equals_the_dense_brute_force(protocol, distance, k, alpha):
    q, g, qe, ge = market_like(4, distance)
    if protocol == "recall":
        q, g = q.drop(columns="camera"), g.drop(columns="camera")
    got = rankwise.evaluate(
        q, g, qe, ge, protocol=protocol, distance=distance, aqe={"k": k, "alpha": alpha}
    )
    eq, eg = average_query_expansion(qe, ge, k, alpha)
    _check(got, evaluate_reference(q, g, eq, eg, protocol=protocol, distance=distance))
    plain = rankwise.evaluate(q, g, qe, ge, protocol=protocol, distance=distance)
    assert got.metrics != plain.metrics


def test_before_reranking_as_fast_reid_does():
    q, g, qe, ge = market_like(5)
    got = rankwise.evaluate(
        q, g, qe, ge, protocol="reid", distance="euclidean", aqe="3,3", rerank="10,4,0.3"
    )
    eq, eg = average_query_expansion(qe, ge, 3, 3.0)
    final = re_ranking(*rerank_input_distances(eq, eg, "euclidean"), 10, 4, 0.3)
    ref = evaluate_reference(q, g, eq, eg, protocol="reid", distance="euclidean", dist=final)
    _check(got, ref)


def test_one_neighbour_under_cosine_is_the_plain_ranking():
    """k = 1: each row becomes cos(i, i)^alpha x(i), a rescaling cosine ignores."""
    q, g, qe, ge = market_like(6, "cosine")
    plain = rankwise.rank(q, g, qe, ge, protocol="reid", distance="cosine")
    one = rankwise.rank(q, g, qe, ge, protocol="reid", distance="cosine", aqe="1,3")
    np.testing.assert_array_equal(plain.ranks, one.ranks)
    assert one.attrs["protocol_options"]["aqe"] == {"k": 1, "alpha": 3.0}


def test_each_item_is_first_in_its_own_neighbours_even_when_tied():
    """Gallery row g0 = 3 x the query: they tie exactly under cosine, and the query (the
    lower item) came first in g0's list, so `aqe=1,1` replaced g0 by the query (recall@1
    0 -> 100). The item itself is always first: k = 1 changes nothing."""
    q = pd.DataFrame({"id": ["q0"], "label": ["A"]})
    g = pd.DataFrame({"id": ["g0", "g1"], "label": ["A", "B"]})
    qe = np.array([[1.0, 0.0]], np.float32)
    ge = np.array([[3.0, 0.0], [1.5, 0.3]], np.float32)
    plain = rankwise.evaluate(q, g, qe, ge, distance="euclidean", ks=(1,))
    one = rankwise.evaluate(q, g, qe, ge, distance="euclidean", ks=(1,), aqe="1,1")
    assert plain.metrics["recall@1"] == 0.0
    assert one.metrics == plain.metrics


@pytest.mark.parametrize(
    "engine",
    [{"query_block": 1, "gallery_chunk": 2, "workers": 1}, {"query_block": 7, "workers": 2}],
)
def test_tiles_and_workers_never_change_a_number(engine):
    q, g, qe, ge = market_like(7)
    base = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean", aqe="5,3")
    other = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean", aqe="5,3", **engine)
    np.testing.assert_array_equal(base.ranks, other.ranks)
    np.testing.assert_array_equal(base.offsets, other.offsets)


@pytest.mark.parametrize(
    "value,message",
    [
        ("0,3", r"aqe k must be a positive integer, got 0"),
        ("5,-1", r"aqe alpha must be a non-negative number, got -1"),
        ("5", r"aqe must be k,alpha \(e.g. 5,3\)"),
        # inf zeroed every weight and was reported as "a zero vector" of the expanded rows
        ("5,inf", r"aqe alpha must be a non-negative number, got inf"),
    ],
)
def test_library_refuses_bad_settings(value, message):
    q, g, qe, ge = market_like(0)
    with pytest.raises(RankwiseError, match=message):
        rankwise.rank(q, g, qe, ge, protocol="reid", aqe=value)


def test_progressive_refuses(make_case):
    case = make_case("progressive")
    with pytest.raises(RankwiseError, match="aqe does not apply to protocol 'progressive'"):
        rankwise.rank(*case.args(), protocol="progressive", aqe="5,3")


@pytest.mark.parametrize(
    "protocol,value,message",
    [
        ("reid", "0,3", r"--aqe k must be a positive integer, got 0"),
        ("reassociation", "5,3", r"--aqe does not apply to protocol 'reassociation'"),
    ],
)
def test_cli_refuses_in_one_line_and_writes_nothing(
    tmp_path, make_case, cli, protocol, value, message
):
    inputs = make_case(protocol).write(tmp_path)
    out = tmp_path / "ranks.zarr"
    proc = cli("rank", "--protocol", protocol, "--aqe", value, "--out", out, options=inputs)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), proc.stderr
    assert not list(tmp_path.glob("ranks.zarr*"))


def test_config_checks_and_fills_aqe():
    from rankwise import pipeline_config as pc

    datasets = {"m": {"protocol": "recall", "aqe": {"alpha": 1}}}
    pc.check_reranking(datasets)
    assert datasets["m"]["aqe"] == {"k": 5, "alpha": 1.0}
    with pytest.raises(RankwiseError, match=r"^datasets\.s\.aqe: aqe does not apply to protocol"):
        pc.check_reranking({"s": {"protocol": "reassociation", "aqe": {}}})


def test_fractional_alpha_on_a_negative_cosine_is_an_error_naming_the_rows():
    """cos^2.5 of a negative cosine has no real value (fast-reid's aqe: NaN); an integer
    alpha is defined there and still equals the brute force."""
    rng = np.random.default_rng(0)
    q = pd.DataFrame({"id": [f"q{i}" for i in range(10)], "label": [str(i % 3) for i in range(10)]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(30)], "label": [str(i % 3) for i in range(30)]})
    qe = rng.normal(size=(10, 6)).astype(np.float32)
    ge = rng.normal(size=(30, 6)).astype(np.float32)
    message = r"row \d+ \(0-based\) has a neighbour .* and aqe alpha 2.5 is not an integer"
    with pytest.raises(RankwiseError, match=message):
        rankwise.evaluate(q, g, qe, ge, protocol="recall", aqe={"k": 40, "alpha": 2.5})
    got = rankwise.evaluate(q, g, qe, ge, protocol="recall", aqe={"k": 40, "alpha": 3})
    eq, eg = average_query_expansion(qe, ge, 40, 3.0)
    _check(got, evaluate_reference(q, g, eq, eg, protocol="recall", distance="cosine"))


def test_cli_messages_name_the_files_and_fit_query_expansion(tmp_path, cli):
    """The rows are named in their files; a zero row is an error under AQE whatever the
    ranking distance (it weighs neighbours by cosine), so "use --distance euclidean"
    would not help."""
    rng = np.random.default_rng(0)
    q = pd.DataFrame({"id": [f"q{i}" for i in range(10)], "label": [str(i % 3) for i in range(10)]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(30)], "label": [str(i % 3) for i in range(30)]})
    qe = rng.normal(size=(10, 6)).astype(np.float32)
    ge = rng.normal(size=(30, 6)).astype(np.float32)
    inputs = write_inputs(tmp_path / "a", q, g, qe, ge)
    proc = cli("evaluate", *inputs, "--protocol", "recall", "--aqe", "40,2.5")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(r"/a/[qg]\.npy: (query|gallery) embeddings row \d+ \(0-based\)", proc.stderr)
    assert "(--aqe k,alpha)" in proc.stderr
    ge[4] = 0.0
    inputs = write_inputs(tmp_path / "b", q, g, qe, ge)
    args = ("--protocol", "recall", "--distance", "euclidean")
    proc = cli("evaluate", *inputs, *args, "--aqe", "3,3")
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        r"error: \S+/b/g\.npy: gallery embeddings row 4 \(0-based\) is a zero vector, which has "
        r"no cosine distance; fix that item or drop query expansion \(--aqe\), which weighs rows "
        r"by their cosine\n",
        proc.stderr,
    ), proc.stderr
    assert cli("evaluate", *inputs, *args).returncode == 0  # without AQE the row is fine
