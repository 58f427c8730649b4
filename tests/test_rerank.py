"""k-reciprocal re-ranking (``rerank``) against a float64 port of the published
``re_ranking`` (tests/reference.py), plus invariances and bad input.

The port ranks by its dense (Q x G) re-ranked matrix with DESIGN.md's tie rule
(``evaluate_reference(dist=...)``); rankwise never holds that matrix.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from conftest import recall_case, reid_case
from helpers import write_inputs
from reference import evaluate_reference, re_ranking, rerank_input_distances

import rankwise
from rankwise.errors import RankwiseError

TOL = 1e-6  # percentage points
ROOT = Path(__file__).resolve().parents[1]
SETTINGS = [(20, 6, 0.3), (5, 3, 0.5), (7, 1, 0.1), (4, 4, 0.0), (12, 2, 1.0)]


def market_like(seed: int, distance: str = "euclidean"):
    """Persons with several cameras, distractors ("0"), junk ("-1"), skipped queries;
    continuous embeddings with no exact ties (no copied rows)."""
    rng = np.random.default_rng(seed)
    dim = 8
    q_rows, g_rows, q_emb, g_emb = [], [], [], []
    for person in range(1, 16):
        centre = rng.normal(size=dim)
        for _ in range(rng.integers(1, 6)):
            g_rows.append((f"g{len(g_rows)}", str(person), int(rng.integers(1, 5))))
            g_emb.append(centre + 0.7 * rng.normal(size=dim))
        for _ in range(rng.integers(0, 3)):
            q_rows.append((f"q{len(q_rows)}", str(person), int(rng.integers(1, 5))))
            q_emb.append(centre + 0.7 * rng.normal(size=dim))
    for label, n in (("0", 15), ("-1", 6)):
        for _ in range(n):
            g_rows.append((f"g{len(g_rows)}", label, int(rng.integers(1, 5))))
            g_emb.append(rng.normal(size=dim))
    q_rows.append((f"q{len(q_rows)}", "99", 1))  # absent from the gallery: skipped
    q_emb.append(rng.normal(size=dim))
    frame = lambda rows: pd.DataFrame(rows, columns=["id", "label", "camera"])
    qp, gp = rng.permutation(len(q_rows)), rng.permutation(len(g_rows))
    return (
        frame(q_rows).iloc[qp].reset_index(drop=True),
        frame(g_rows).iloc[gp].reset_index(drop=True),
        np.asarray(q_emb, np.float32)[qp],
        np.asarray(g_emb, np.float32)[gp],
    )


def in_id_order(q, g, qe, ge):
    """The inputs with query and gallery rows sorted by id, and the query order: the
    item layout of rankwise's re-ranking and AQE (queries, then gallery, each by id), so
    that a port breaks exact ties and sums its terms the same way."""
    qo = np.argsort(q["id"].astype(str).to_numpy(), kind="stable")
    go = np.argsort(g["id"].astype(str).to_numpy(), kind="stable")
    frames = (q.iloc[qo].reset_index(drop=True), g.iloc[go].reset_index(drop=True))
    return (*frames, qe[qo], ge[go]), qo


def _reference(q, g, qe, ge, protocol, distance, setting, ks=(1, 5, 10)):
    """The port of torchreid's re_ranking on the items in rankwise's order
    (:func:`in_id_order`), its per-query results given back in the callers' row order."""
    k1, k2, lam = setting
    (q, g, qe, ge), qo = in_id_order(q, g, qe, ge)
    final = re_ranking(*rerank_input_distances(qe, ge, distance), k1=k1, k2=k2, lambda_value=lam)
    ref = evaluate_reference(q, g, qe, ge, protocol=protocol, distance=distance, ks=ks, dist=final)
    rows = qo[ref.query_index]
    back = np.argsort(rows, kind="stable")
    ref.query_index, ref.first_rank = rows[back], np.asarray(ref.first_rank)[back]
    ref.ranks = [ref.ranks[i] for i in back]
    return ref


def _check(got, ref):
    assert (got.num_queries, got.num_skipped, got.num_gallery) == (
        ref.num_queries,
        ref.num_skipped,
        ref.num_gallery,
    )
    np.testing.assert_array_equal(got.per_query["query_index"], ref.query_index)
    offsets = np.r_[0, np.cumsum(got.per_query["num_relevant"])]
    assert set(got.metrics) == set(ref.metrics)
    for name, value in ref.metrics.items():
        assert got.metrics[name] == pytest.approx(value, abs=TOL), name
    return offsets


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1])
def test_reid_equals_the_reference_port(seed, distance, setting):
    q, g, qe, ge = market_like(seed, distance)
    k1, k2, lam = setting
    rerank = {"k1": k1, "k2": k2, "lambda": lam}
    got = rankwise.rank(q, g, qe, ge, protocol="reid", distance=distance, rerank=rerank)
    ref = _reference(q, g, qe, ge, "reid", distance, setting)
    result = rankwise.api.result_from_ranks(got, ks=(1, 5, 10))
    _check(result, ref)
    # the ranks themselves, query by query
    lists = np.split(got.ranks, got.offsets[1:-1])
    for mine, theirs in zip(lists, ref.ranks, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert got.attrs["protocol_options"]["rerank"] == rerank  # the default variant: not recorded


@pytest.mark.parametrize("setting", [(20, 6, 0.3), (6, 3, 0.0)])
@pytest.mark.parametrize("maker,protocol", [(reid_case, "reid"), (recall_case, "recall")])
def test_shared_test_cases_with_exact_duplicates_equal_the_port(maker, protocol, setting):
    """conftest's cases hold exact duplicates (distance-0 junk and distractors, shared
    query/gallery items, one-ulp-free copies): exactly tied neighbours are taken in
    id order in both (:func:`in_id_order`), and the ranks still agree."""
    case = maker(distance="euclidean", kind="float", seed=0)
    k1, k2, lam = setting
    ks = case.options["ks"]
    got = rankwise.evaluate(
        *case.args(),
        protocol=protocol,
        distance="euclidean",
        ks=ks,
        rerank={"k1": k1, "k2": k2, "lambda": lam},
    )
    _check(got, _reference(*case.args(), protocol, "euclidean", setting, ks=ks))


def test_lambda_one_is_the_plain_ranking():
    """lambda = 1 leaves o(q, g) = d^2 / M_q, which orders like d: the plain ranks."""
    q, g, qe, ge = market_like(3)
    plain = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean")
    reranked = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean", rerank="9,3,1")
    for key in ("offsets", "ranks", "query_index"):
        np.testing.assert_array_equal(getattr(plain, key), getattr(reranked, key))


def test_reranking_changes_the_numbers():
    q, g, qe, ge = market_like(0)
    plain = rankwise.evaluate(q, g, qe, ge, protocol="reid", distance="euclidean")
    reranked = rankwise.evaluate(
        q, g, qe, ge, protocol="reid", distance="euclidean", rerank="20,6,0.3"
    )
    assert reranked.metrics["map"] != plain.metrics["map"]


@pytest.mark.parametrize(
    "engine",
    [
        {"query_block": 1, "gallery_chunk": 1, "workers": 1},
        {"query_block": 3, "gallery_chunk": 7, "workers": 2},
        {"query_block": 1000, "gallery_chunk": 1000, "workers": 2},
    ],
)
def test_tiles_and_workers_never_change_a_number(engine):
    q, g, qe, ge = market_like(1, "cosine")
    base = rankwise.rank(q, g, qe, ge, protocol="reid", distance="cosine", rerank="8,4,0.3")
    other = rankwise.rank(
        q, g, qe, ge, protocol="reid", distance="cosine", rerank="8,4,0.3", **engine
    )
    for key in ("offsets", "ranks", "query_index"):
        np.testing.assert_array_equal(getattr(base, key), getattr(other, key))


@pytest.mark.parametrize("perm_seed", [0, 1])
def test_gallery_and_query_row_order_never_change_a_number(perm_seed):
    """Without exactly tied neighbours, the item order only renumbers the items."""
    q, g, qe, ge = market_like(2)
    rng = np.random.default_rng(perm_seed)
    qp, gp = rng.permutation(len(q)), rng.permutation(len(g))
    kwargs = {"protocol": "reid", "distance": "euclidean", "rerank": "10,5,0.3"}
    base = rankwise.rank(q, g, qe, ge, **kwargs)
    moved = rankwise.rank(
        q.iloc[qp].reset_index(drop=True),
        g.iloc[gp].reset_index(drop=True),
        qe[qp],
        ge[gp],
        **kwargs,
    )
    mine = dict(zip(base.query_index, np.split(base.ranks, base.offsets[1:-1]), strict=True))
    theirs = np.split(moved.ranks, moved.offsets[1:-1])
    assert len(theirs) == len(mine)
    for row, ranks in zip(qp[moved.query_index], theirs, strict=True):
        np.testing.assert_array_equal(ranks, mine[row])


def few_persons(seed: int, nq: int, ng: int):
    """5 persons in 4 dimensions, 3 junk and 3 distractor rows: tight clusters where
    several items have the same k2 nearest neighbours (in another order)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, 4))
    rows = {"q": [], "g": []}
    emb = {"q": [], "g": []}
    for side, n in (("q", nq), ("g", ng)):
        for i in range(n):
            person = int(rng.integers(1, 6))
            rows[side].append((f"{side}{i}", str(person), int(rng.integers(1, 4))))
            emb[side].append(centres[person] + 0.8 * rng.normal(size=4))
    for label in ("-1", "0"):
        for i in range(3):
            rows["g"].append((f"x{label}{i}", label, int(rng.integers(1, 4))))
            emb["g"].append(rng.normal(size=4))
    frame = lambda r: pd.DataFrame(r, columns=["id", "label", "camera"])
    return frame(rows["q"]), frame(rows["g"]), *(np.asarray(emb[s], np.float32) for s in "qg")


@pytest.mark.parametrize(
    "seed, sizes, protocol, rerank, order",
    [
        (0, (8, 20), "recall", "5,5,0", "reversed"),
        (10, (10, 30), "reid", "20,6,0,fastreid", "shuffled"),
    ],
)
def test_lambda_zero_ties_of_equal_neighbour_lists_survive_any_row_order(
    seed, sizes, protocol, rerank, order
):
    """At lambda = 0 only the Jaccard distance counts; two items whose k2 neighbours are
    the same items in another order have mathematically equal expanded rows, so an exact
    tie the tie rule decides. Summed in neighbour order they differed by one rounding,
    and which side won depended on the gallery's row order (mAP moved by 3 points)."""
    q, g, qe, ge = few_persons(seed, *sizes)
    p = (
        np.arange(len(g))[::-1]
        if order == "reversed"
        else np.random.default_rng(seed).permutation(len(g))
    )
    kwargs = {"protocol": protocol, "distance": "cosine", "rerank": rerank, "ks": (1, 5)}
    base = rankwise.evaluate(q, g, qe, ge, **kwargs).metrics
    moved = rankwise.evaluate(q, g.iloc[p].reset_index(drop=True), qe, ge[p], **kwargs).metrics
    assert moved == base
    if not rerank.endswith("fastreid"):
        k1, k2, lam = map(float, rerank.split(","))
        setting = (int(k1), int(k2), lam)
        ref = _reference(q, g, qe, ge, protocol, "cosine", setting, ks=(1, 5))
        assert base == pytest.approx(ref.metrics, abs=TOL)


def mirror_pairs(seed: int):
    """Gallery items in mirror-image pairs (coordinate 1 negated; the mirror has another
    label) and queries on the mirror plane: every item ties exactly with its mirror, for
    every query, so the k cuts of re-ranking and AQE meet exact ties of distinct vectors."""
    rng = np.random.default_rng(seed)
    n, dim = 12, 6
    half = rng.standard_normal((n, dim)).astype(np.float32)
    half[:, 1] = np.abs(half[:, 1]) + 0.1
    mirror = half.copy()
    mirror[:, 1] *= -1
    qe = rng.standard_normal((6, dim)).astype(np.float32)
    qe[:, 1] = 0
    q = pd.DataFrame({"id": [f"q{i}" for i in range(6)], "label": ["R", "S"] * 3})
    labels = [("R", "N"), ("S", "M")]
    g = pd.DataFrame(
        {
            "id": [f"g{i}" for i in range(2 * n)],
            "label": [labels[i % 2][0] for i in range(n)] + [labels[i % 2][1] for i in range(n)],
        }
    )
    return q, g, qe, np.concatenate([half, mirror])


def _shuffled_metrics(q, g, qe, ge, seed, **kwargs):
    """The metrics of the same inputs with query and gallery rows shuffled by ``seed``."""
    rng = np.random.default_rng(seed)
    qp, gp = rng.permutation(len(q)), rng.permutation(len(g))
    return rankwise.evaluate(
        q.iloc[qp].reset_index(drop=True), g.iloc[gp].reset_index(drop=True),
        qe[qp], ge[gp], **kwargs,
    ).metrics  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        {"rerank": "20,6,0.3"},
        {"rerank": "20,6,0.3,fastreid"},
        {"rerank": "5,3,0"},
        {"aqe": "5,3"},
        {"aqe": "2,3", "rerank": "4,2,0.3"},
    ],
)
def test_exactly_tied_neighbours_never_follow_the_row_order(options):
    """Re-ranking and AQE lay their items out in id order (queries, then gallery), so a
    neighbour kept at a k cut among exactly tied distinct vectors, and every sum over
    neighbours, is the same whatever the manifests' row order (audit, 2026-12-02: mAP
    52.37 / 52.33 with the halves of such a gallery swapped at 20,6,0.3; AQE rank-1 0 or
    100 on a three-row gallery)."""
    q, g, qe, ge = mirror_pairs(4)
    kwargs = {"protocol": "recall", "distance": "euclidean", "ks": (1, 5), **options}
    base = rankwise.evaluate(q, g, qe, ge, **kwargs).metrics
    for seed in range(4):
        assert _shuffled_metrics(q, g, qe, ge, seed, **kwargs) == base, seed


@pytest.mark.parametrize("rerank", ["5,5,0", "6,3,0", "20,6,0,fastreid"])
def test_lambda_zero_never_follows_the_row_order(rerank):
    """At lambda = 0 mathematically equal Jaccard distances (m = shared / k2) are sums of
    different rounded terms; their order followed the gallery's row order (14 of 480
    scanned tiny cases changed a metric when shuffled). Summed in id order, a shuffle
    changes nothing."""
    kwargs = {"protocol": "recall", "distance": "cosine", "rerank": rerank, "ks": (1, 5)}
    for seed in range(12):
        q, g, qe, ge = few_persons(seed, 8, 24)
        base = rankwise.evaluate(q, g, qe, ge, **kwargs).metrics
        assert _shuffled_metrics(q, g, qe, ge, 100 + seed, **kwargs) == base, seed


# ------------------------------------------------------------------ bad input

BAD = [
    ({"k1": 0, "k2": 1, "lambda": 0.3}, "rerank k1 must be a positive integer, got 0"),
    ({"k1": 5, "k2": 6, "lambda": 0.3}, "rerank: k2 must be at most k1, got k2=6 > k1=5"),
    ({"k1": 5, "k2": 2, "lambda": 1.5}, r"rerank lambda must be a number >= 0 and <= 1, got 1.5"),
    ({"k1": 5, "k2": 2, "lambda": -0.1}, r"rerank lambda must be a number >= 0 and <= 1"),
    ("20,6", r"rerank must be k1,k2,lambda\[,variant\] \(e.g. 20,6,0.3\)"),
    ("20,6,0.3,zhong", r"rerank variant must be one of torchreid, fastreid, got 'zhong'"),
    ({"k3": 1}, r"rerank: unknown key\(s\) k3; valid keys: k1, k2, lambda"),
]


@pytest.mark.parametrize("value,message", BAD)
def test_library_refuses_bad_settings(value, message):
    q, g, qe, ge = market_like(0)
    with pytest.raises(RankwiseError, match=message):
        rankwise.rank(q, g, qe, ge, protocol="reid", rerank=value)


@pytest.mark.parametrize("protocol", ["reassociation", "progressive"])
def test_protocols_without_a_whole_gallery_ranking_refuse(make_case, protocol):
    case = make_case(protocol)
    with pytest.raises(RankwiseError, match=f"rerank does not apply to protocol '{protocol}'"):
        rankwise.rank(*case.args(), protocol=protocol, rerank="5,2,0.3")


@pytest.mark.parametrize(
    "options,message",
    [
        (
            {"rerank": "5,2,0.3", "multi_query": "mean"},
            "rerank cannot be combined with multi_query",
        ),
        ({"aqe": "3,3", "single_gallery_shot": True}, "aqe cannot be combined with single_gallery"),
        (
            {"rerank": "5,2,0.3", "aqe": "3,3", "multi_query": "max", "single_gallery_shot": True},
            "rerank and aqe cannot be combined with multi_query and single_gallery_shot",
        ),
    ],
)
def test_not_combined_with_multi_query_or_single_gallery_shot(options, message):
    q, g, qe, ge = market_like(0)
    with pytest.raises(RankwiseError, match=message):
        rankwise.rank(q, g, qe, ge, protocol="reid", **options)


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ("--rerank", "5,2,0.3", "--multi-query", "mean"),
            "--rerank cannot be combined with --multi-query",
        ),
        (
            ("--aqe", "3,3", "--single-gallery-shot"),
            "--aqe cannot be combined with --single-gallery-shot",
        ),
    ],
)
def test_cli_refusal_of_the_combination_names_flags(tmp_path, make_case, cli, flags, message):
    inputs = make_case("reid").write(tmp_path)
    proc = cli("rank", "--protocol", "reid", *flags, "--out", tmp_path / "r.zarr", options=inputs)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


@pytest.mark.parametrize(
    "protocol,value,message",
    [
        ("reid", "0,1,0.3", r"--rerank k1 must be a positive integer, got 0"),
        ("reid", "5,6,0.3", r"--rerank: k2 must be at most k1"),
        ("reid", "5,2,2", r"--rerank lambda must be a number >= 0 and <= 1, got 2"),
        ("progressive", "5,2,0.3", r"--rerank does not apply to protocol 'progressive'"),
        ("reassociation", "5,2,0.3", r"--rerank does not apply to protocol 'reassociation'"),
        # the flag takes only the text form: no "or a mapping with keys" advice
        ("reid", "20,6", r"--rerank must be k1,k2,lambda\[,variant\] \(e\.g\. 20,6,0\.3\), got"),
    ],
)
def test_cli_refuses_in_one_line_and_writes_nothing(
    tmp_path, make_case, cli, protocol, value, message
):
    case = make_case(protocol)
    inputs = case.write(tmp_path)
    out = tmp_path / "ranks.zarr"
    proc = cli("rank", "--protocol", protocol, "--rerank", value, "--out", out, options=inputs)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.glob("ranks.zarr*"))


def test_cli_records_rerank_in_the_store_and_the_report(tmp_path, cli):
    q, g, qe, ge = market_like(0)
    inputs = write_inputs(tmp_path, q, g, qe, ge)
    out = tmp_path / "ranks.zarr"
    proc = cli(
        "rank",
        "--protocol",
        "reid",
        "--distance",
        "euclidean",
        "--rerank",
        "20,6,0.3",
        "--out",
        out,
        *inputs,
    )
    assert proc.returncode == 0, proc.stderr
    attrs = dict(zarr.open_group(out, mode="r").attrs)
    assert attrs["protocol_options"]["rerank"] == {"k1": 20, "k2": 6, "lambda": 0.3}
    proc = cli("metrics", out, "--output", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    report = pd.read_json(tmp_path / "m.json", typ="series")
    want = rankwise.evaluate(q, g, qe, ge, protocol="reid", distance="euclidean", rerank="20,6,0.3")
    assert report["metrics"] == pytest.approx(want.metrics, abs=1e-12)
    assert report["provenance"]["protocol_options"]["rerank"]["k1"] == 20


# ------------------------------------------------------------------ the pipeline


def test_config_checks_what_the_schema_cannot():
    from rankwise import pipeline_config as pc

    datasets = {"m": {"protocol": "reid", "rerank": {"k1": 10}}, "n": {"protocol": "recall"}}
    pc.check_reranking(datasets)
    assert datasets["m"]["rerank"] == {  # defaults filled
        "k1": 10,
        "k2": 6,
        "lambda": 0.3,
        "variant": "torchreid",
    }
    with pytest.raises(
        RankwiseError,
        match=r"^datasets\.m\.rerank: rerank: k2 must be at most k1, got k2=6 > k1=5 "
        r"\(k2 is the default 6: set it\)$",
    ):
        pc.check_reranking({"m": {"protocol": "reid", "rerank": {"k1": 5}}})
    with pytest.raises(
        RankwiseError,
        match=r"^datasets\.s\.rerank: rerank does not apply to protocol 'progressive'",
    ):
        pc.check_reranking({"s": {"protocol": "progressive", "rerank": {}}})


def test_schema_refuses_out_of_range_values():
    import yaml

    from rankwise import pipeline_config as pc

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    config = {
        "datasets": {
            "m": {"loader": "demo-market", "protocol": "reid", "rerank": {"k1": 20, "lambda": 2}}
        },
        "encoders": {"pixels": {"kind": "pixels"}},
    }
    with pytest.raises(RankwiseError, match=r"datasets\.m\.rerank"):
        pc.check_config(config, schema)


def _snakemake(workdir, config, *args):
    import subprocess
    import sys

    import yaml

    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        "2",
        "--workflow-profile",
        "none",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_pipeline_reranks_in_the_rank_stage(tmp_path):
    """A real Snakemake run: the report's numbers are rankwise.evaluate's with the same
    rerank; a new rerank setting reruns rank (and what follows), nothing else."""
    import json

    from helpers import planned_jobs

    options = {
        "seed": 1,
        "identities": 8,
        "cameras": 3,
        "images_per_camera": 2,
        "queries_per_identity": 1,
        "distractors": 6,
        "junk": 4,
        "height": 16,
        "width": 8,
    }
    config = {
        "datasets": {
            "market": {
                "loader": "demo-market",
                "options": options,
                "protocol": "reid",
                "distance": "euclidean",
                "ks": [1, 5],
                "rerank": {"k1": 6, "k2": 3, "lambda": 0.3},
            }
        },
        "encoders": {"pixels": {"kind": "pixels", "options": {"size": [16, 8]}}},
        "engine": {"threads": 1, "query_block": 5, "gallery_chunk": 7, "batch_size": 4},
    }
    proc = _snakemake(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "results/report.json").read_text())
    (entry,) = doc["results"]
    embeddings = [
        zarr.open_group(str(tmp_path / f"results/embeddings/market/pixels/{s}.zarr"), mode="r")[
            "embeddings"
        ][...]
        for s in ("query", "gallery")
    ]
    manifests = [str(tmp_path / f"results/manifests/market/{s}.csv") for s in ("query", "gallery")]
    want = rankwise.evaluate(
        *manifests, *embeddings, protocol="reid", distance="euclidean", ks=(1, 5), rerank="6,3,0.3"
    )
    plain = rankwise.evaluate(
        *manifests, *embeddings, protocol="reid", distance="euclidean", ks=(1, 5)
    )
    assert entry["metrics"] == pytest.approx(want.metrics, abs=1e-9)
    assert entry["metrics"] != pytest.approx(plain.metrics, abs=1e-9)
    # junk rows out of the neighbour sets (torchreid's loaders): rank and what follows
    config["datasets"]["market"]["drop_junk"] = True
    proc = _snakemake(tmp_path, config, "--dry-run")
    assert planned_jobs(proc.stdout + proc.stderr) == {
        "rank": 1,
        "metrics": 1,
        "report": 1,
        "all": 1,
    }
    proc = _snakemake(tmp_path, config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = json.loads((tmp_path / "results/report.json").read_text())["results"]
    dropped = rankwise.evaluate(
        *manifests, *embeddings, protocol="reid", distance="euclidean", ks=(1, 5),
        rerank="6,3,0.3", drop_junk=True,
    )  # fmt: skip
    assert entry["metrics"] == pytest.approx(dropped.metrics, abs=1e-9)
    assert entry["metrics"] != pytest.approx(want.metrics, abs=1e-9)
    # the default variant named: the same flags, nothing reruns; fast-reid's: rank on
    config["datasets"]["market"]["rerank"]["variant"] = "torchreid"
    assert planned_jobs(_snakemake(tmp_path, config, "--dry-run").stdout) == {}
    config["datasets"]["market"]["rerank"]["variant"] = "fastreid"
    proc = _snakemake(tmp_path, config, "--dry-run")
    assert planned_jobs(proc.stdout + proc.stderr) == {
        "rank": 1,
        "metrics": 1,
        "report": 1,
        "all": 1,
    }
    config["datasets"]["market"]["rerank"] = {"k1": 8, "k2": 3, "lambda": 0.3}
    proc = _snakemake(tmp_path, config, "--dry-run")
    assert planned_jobs(proc.stdout + proc.stderr) == {
        "rank": 1,
        "metrics": 1,
        "report": 1,
        "all": 1,
    }
    config["datasets"]["market"]["protocol"] = "recall"
    config["datasets"]["market"].pop("drop_junk")  # reid's: refused under recall
    config["datasets"]["market"]["rerank"] = {"k1": 8, "k2": 9}
    proc = _snakemake(tmp_path, config, "--dry-run")
    assert proc.returncode != 0
    assert "datasets.market.rerank: rerank: k2 must be at most k1, got k2=9 > k1=8" in proc.stderr


def test_re_ranked_store_pairs_with_the_plain_one():
    """ "+RK" (and "+AQE") against the same encoder: a paired comparison and intervals
    work on it; a different protocol option still refuses."""
    from rankwise import stats

    q, g, qe, ge = market_like(0)
    plain = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean")
    rk = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean", rerank="20,6,0.3")
    result = lambda store: rankwise.api.result_from_ranks(store).metrics
    rows = stats.compare_ranks(
        plain.arrays(), plain.attrs, rk.arrays(), rk.attrs, metrics="map,rank1", resamples=200
    )
    by_name = {row["metric"]: row for row in rows}
    want = rankwise.api.result_from_ranks(rk).metrics["map"]
    have = rankwise.api.result_from_ranks(plain).metrics["map"]
    assert by_name["map"]["diff"] == pytest.approx(want - have, abs=1e-9)
    assert by_name["map"]["b"] == pytest.approx(want, abs=1e-9)
    cis = stats.metric_cis(rk.arrays(), rk.attrs, metrics="map", resamples=200)
    assert cis["map"][0] <= want <= cis["map"][1]
    # query expansion too: "+AQE" against plain, "+RK+AQE" (junk dropped) against "+RK"
    for a, options in ((plain, {}), (rk, {"rerank": "20,6,0.3", "drop_junk": True})):
        b = rankwise.rank(q, g, qe, ge, protocol="reid", distance="euclidean", aqe="5,3", **options)
        row = stats.compare_ranks(a.arrays(), a.attrs, b.arrays(), b.attrs, metrics="map")[0]
        diff = result(b)["map"] - result(a)["map"]
        assert diff != 0 and row["diff"] == pytest.approx(diff, abs=1e-9)
    other = rankwise.rank(
        q, g, qe, ge, protocol="reid", distance="euclidean", junk_labels=(), rerank="20,6,0.3"
    )
    with pytest.raises(RankwiseError, match="differs"):
        stats.compare_ranks(plain.arrays(), plain.attrs, other.arrays(), other.attrs, resamples=10)


# ------------------------------------------------------------------ fast-reid's variant

FASTREID_SETTINGS = [(20, 6, 0.3), (5, 3, 0.5), (7, 1, 0.1), (4, 4, 0.0), (12, 2, 1.0), (1, 1, 0.3)]


@pytest.mark.parametrize("setting", FASTREID_SETTINGS, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fastreid_variant_equals_the_port_of_its_evaluator(seed, distance, setting):
    """``variant: fastreid`` against tests/reference.py's float64 port of fast-reid's
    ``compute_jaccard_distance`` mixed as its ``ReidEvaluator`` does; it is not
    torchreid's re_ranking."""
    from reference import fastreid_jaccard_reranking

    q, g, qe, ge = market_like(seed, distance)
    k1, k2, lam = setting
    rerank = {"k1": k1, "k2": k2, "lambda": lam, "variant": "fastreid"}
    got = rankwise.rank(q, g, qe, ge, protocol="reid", distance=distance, rerank=rerank)
    final = fastreid_jaccard_reranking(qe, ge, distance, k1, k2, lam)
    ref = evaluate_reference(q, g, qe, ge, protocol="reid", distance=distance, dist=final)
    _check(rankwise.api.result_from_ranks(got), ref)
    for mine, theirs in zip(np.split(got.ranks, got.offsets[1:-1]), ref.ranks, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert got.attrs["protocol_options"]["rerank"] == rerank
    if lam < 1 and k1 > 1:  # else both rank by the plain distance (k1 = 1: J is 1)
        torchreid = rankwise.rank(
            q,
            g,
            qe,
            ge,
            protocol="reid",
            distance=distance,
            rerank={**rerank, "variant": "torchreid"},
        )
        assert not np.array_equal(torchreid.ranks, got.ranks)


def test_cli_takes_the_variant_as_a_fourth_value(tmp_path, cli):
    q, g, qe, ge = market_like(2)
    inputs = write_inputs(tmp_path, q, g, qe, ge)
    out = tmp_path / "r.json"
    proc = cli(
        "evaluate", "--protocol", "reid", "--rerank", "8,3,0.3,fastreid", "--output", out,
        *inputs,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = pd.read_json(out, typ="series")
    want = rankwise.evaluate(q, g, qe, ge, protocol="reid", rerank="8,3,0.3,fastreid")
    assert report["metrics"] == pytest.approx(want.metrics, abs=1e-12)
    other = rankwise.evaluate(q, g, qe, ge, protocol="reid", rerank="8,3,0.3")
    assert report["metrics"] != pytest.approx(other.metrics, abs=1e-9)


def test_fastreid_variant_with_aqe_and_without_junk_as_its_evaluator_on_market():
    """fast-reid's evaluator on Market-1501: junk dropped at load, AQE, then its
    re-ranking; tiles and workers change nothing."""
    from reference import average_query_expansion, fastreid_jaccard_reranking

    q, g, qe, ge = market_like(3, "cosine")
    options = dict(protocol="reid", distance="cosine", aqe="3,3", rerank="10,4,0.3,fastreid")
    got = rankwise.rank(q, g, qe, ge, drop_junk=True, **options)
    keep = (g["label"] != "-1").to_numpy()
    eq, eg = average_query_expansion(qe, ge[keep], 3, 3.0)
    final = fastreid_jaccard_reranking(eq, eg, "cosine", 10, 4, 0.3)
    g2 = g[keep].reset_index(drop=True)
    ref = evaluate_reference(q, g2, eq, eg, protocol="reid", distance="cosine", dist=final)
    for mine, theirs in zip(np.split(got.ranks, got.offsets[1:-1]), ref.ranks, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    tiled = rankwise.rank(
        q, g, qe, ge, drop_junk=True, query_block=4, gallery_chunk=9, workers=2, **options
    )
    np.testing.assert_array_equal(tiled.ranks, got.ranks)
    np.testing.assert_array_equal(tiled.extra["top_items"], got.extra["top_items"])


def test_float32_reference_differs_from_float64_only_by_rounding():
    """The original's float32 arithmetic: final distances within ~1e-7 of float64's; ranks
    can only change between gallery items whose float64 distances are that close."""
    q, g, qe, ge = market_like(0)
    inputs = rerank_input_distances(qe, ge, "euclidean")
    f64 = re_ranking(*inputs, k1=20, k2=6, lambda_value=0.3)
    f32 = re_ranking(
        *(x.astype(np.float32) for x in inputs), k1=20, k2=6, lambda_value=0.3, dtype=np.float32
    )
    assert f32.dtype == np.float32
    gap = np.abs(f32.astype(np.float64) - f64)
    assert 0 < gap.max() < 1e-6


@pytest.mark.parametrize(
    "flag,value",
    [(None, None), ("--rerank", "8,3,0.3"), ("--rerank", "20,6,0.3"), ("--aqe", "3,3")],
)
def test_worst_queries_show_the_ranked_distances_top_items(tmp_path, cli, flag, value):
    """The report's top items are the nearest valid items by the distance that ranked:
    the plain one, the re-ranked one or the query-expanded one (the last two stored by
    the rank stage), in the float64 reference's order (ties: non-relevant first)."""
    from reference import average_query_expansion, distance_matrix, protocol_masks

    from rankwise.report.worst import worst_queries_of
    from rankwise.store import read_ranks

    q, g, qe, ge = market_like(0)
    q.to_csv(tmp_path / "q.csv", index=False)
    g.to_csv(tmp_path / "g.csv", index=False)
    np.save(tmp_path / "q.npy", qe)
    np.save(tmp_path / "g.npy", ge)
    out = tmp_path / "ranks.zarr"
    extra = [flag, value] if flag else []
    proc = cli(
        "rank", "--query", tmp_path / "q.csv", "--gallery", tmp_path / "g.csv",
        "--query-embeddings", tmp_path / "q.npy", "--gallery-embeddings", tmp_path / "g.npy",
        "--protocol", "reid", "--distance", "euclidean", *extra, "--out", out,
        "--query-block", "3", "--gallery-chunk", "7",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    worst = worst_queries_of(*read_ranks(out), n=5, top_k=4)
    tops = [entry["top"] for entry in worst["queries"]]
    assert all(len(t) == 4 for t in tops)
    assert "top_kept" not in worst
    if flag is None:
        return
    # more items than the store keeps: the documents' caption says how many it kept
    from rankwise.report.view import worst_caption
    from rankwise.rerank import TOP_STORED

    many = worst_queries_of(*read_ranks(out), n=1, top_k=TOP_STORED + 1)
    assert many["top_kept"] == TOP_STORED and len(many["queries"][0]["top"]) <= TOP_STORED
    assert worst_caption({"worst_queries": many, "encoder": "e"}).endswith(
        f"of e (its ranks store keeps only the {TOP_STORED} nearest items of a query)"
    )
    if flag == "--aqe":
        k, alpha = (float(x) for x in value.split(","))
        final = distance_matrix(*average_query_expansion(qe, ge, int(k), alpha), "euclidean")
    else:
        k1, k2, lam = (float(x) for x in value.split(","))
        final = re_ranking(
            *rerank_input_distances(qe, ge, "euclidean"), k1=int(k1), k2=int(k2), lambda_value=lam
        )
    valid, relevant = protocol_masks("reid", q, g)
    for entry in worst["queries"]:
        row = entry["query_index"]
        cols = np.flatnonzero(valid[row])
        want = cols[np.lexsort((cols, relevant[row, cols], final[row, cols]))][:4]
        assert [t["gallery_index"] for t in entry["top"]] == want.tolist()
        assert [t["relevant"] for t in entry["top"]] == relevant[row, want].tolist()


@pytest.mark.parametrize("squared", [True, False])
@pytest.mark.parametrize("kind", ["int", "float", "parallel"])
@pytest.mark.parametrize("cosine", [True, False])
@pytest.mark.parametrize("block,chunk,k", [(1, 1, 5), (4, 5, 21), (64, 1000, 9)])
def test_screened_neighbour_pass_equals_sorting_every_canonical_distance(
    kind, cosine, block, chunk, k, squared
):
    """The BLAS-screened pass keeps exactly the k smallest canonical (d^2, index) of each
    row (re-ranking; (d, index) for query expansion) and its max d^2, ties included
    (integer data: many exact ties; positive multiples of a few vectors: canonical d at
    rounding level, of both signs, where d and d^2 orders differ)."""
    from rankwise.kernels import prepare_rows
    from rankwise.ranking import EngineOptions, _Runner
    from rankwise.rerank import distance_tile, neighbours

    if kind == "parallel":
        rng = np.random.default_rng(3)
        base = rng.normal(size=(4, 6))[rng.integers(0, 4, 90)]
        emb = (rng.uniform(0.5, 3.0, size=90)[:, None] * base).astype(np.float32)
    else:
        case = reid_case(distance="euclidean", kind=kind, seed=1)
        emb = np.concatenate([case.query_emb, case.gallery_emb])
    rows, sq, bad, _ = prepare_rows(emb, cosine)
    assert bad < 0
    full = distance_tile(rows, rows, cosine)
    if kind == "parallel" and cosine:
        assert (full < 0).sum() > 100  # the case this data is for
    want = np.argsort(full**2 if squared else full, axis=1, kind="stable")[:, :k]
    runner = _Runner(EngineOptions(workers=2))
    nn, row_max = neighbours(rows, sq, k, block, chunk, cosine, runner, squared=squared)
    np.testing.assert_array_equal(nn, want)
    np.testing.assert_array_equal(row_max, (full**2).max(axis=1))


@pytest.mark.parametrize("setting", [(20, 6, 0.3), (10, 3, 0.3), (6, 1, 0.5)])
def test_neighbours_order_by_squared_distance_like_the_reference(setting):
    """Rows that are positive multiples of one vector have cosine d = 1 - cos at rounding
    level, of both signs; the reference sorts its neighbours by o = d^2 / M, where d and
    d^2 disagree (ordering by d gave rank1 25.0 against its 0.0).  Fed the same
    canonical d, the port and rankwise agree."""
    from rankwise.kernels import prepare_rows
    from rankwise.rerank import distance_tile

    rng = np.random.default_rng(0)
    dim = 6
    cluster = (rng.uniform(0.5, 3.0, size=40)[:, None] * rng.normal(size=dim)).astype(np.float32)
    ge = np.concatenate([cluster[:34], rng.normal(size=(60, dim)).astype(np.float32)])
    qe = np.concatenate([cluster[34:], rng.normal(size=(6, dim)).astype(np.float32)])
    gl = np.r_[rng.integers(1, 4, 34), rng.integers(1, 8, 60)].astype(str)
    ql = np.r_[rng.integers(1, 4, 6), rng.integers(1, 8, 6)].astype(str)
    # ids in row order: the port below takes the items in row order, rankwise by id
    q = pd.DataFrame({"id": [f"q{i:02d}" for i in range(12)], "label": ql, "camera": "a"})
    g = pd.DataFrame({"id": [f"g{i:02d}" for i in range(94)], "label": gl, "camera": "b"})
    rows, _, bad, _ = prepare_rows(np.concatenate([qe, ge]), True)
    assert bad < 0
    d = distance_tile(rows, rows, True)  # rankwise's canonical input distance
    assert (d[:40, :40] < 0).sum() > 50  # the case: many negative d
    n = len(qe)
    k1, k2, lam = setting
    final = re_ranking(d[:n, n:], d[:n, :n], d[n:, n:], k1=k1, k2=k2, lambda_value=lam)
    ref = evaluate_reference(q, g, qe, ge, protocol="reid", distance="cosine", dist=final)
    rerank = ",".join(map(str, setting))
    got = rankwise.evaluate(q, g, qe, ge, protocol="reid", distance="cosine", rerank=rerank)
    _check(got, ref)
