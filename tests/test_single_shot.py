"""CUHK03 single-gallery-shot (reid ``single_gallery_shot``), against brute force.

The reference re-implements torchreid's / fast-reid's ``eval_cuhk03`` on the dense
distance matrix: sort each query's gallery (DESIGN.md's tie rule instead of
``np.argsort``), drop the invalid items (reid rule), and for each repeat keep one item
per gallery identity (``g_pids_dict``), then cumulate the matches of the kept items.
Its draws are derived here from the documented definition (rankwise.single_shot):
``default_rng([seed, sha256(query id)[:8] little-endian])``, identities by label,
items by id, ``rng.integers(0, sizes, size=(repeats, n_identities))``.
``shot_repeats="exact"`` is checked against the mean over ALL draws, enumerated.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr
from helpers import run_rankwise, write_inputs
from reference import distance_matrix, protocol_masks

import rankwise
from rankwise.errors import RankwiseError
from rankwise.options import schema_differences

KS = (1, 2, 3, 5)
ROOT = Path(__file__).resolve().parents[1]


def cuhk_case(seed: int, kind: str, *, persons: int = 8, max_images: int = 5):
    """Persons with 1..``max_images`` gallery images under cameras 1..2, one or two
    queries each (camera 1 or 2), distractors "0", junk "-1" (copies of queries),
    duplicates across persons; a person seen only under its query's camera is skipped."""
    rng = np.random.default_rng(seed)
    dim = 5
    centre = {str(p): rng.integers(-2, 3, dim).astype(np.float32) for p in range(1, persons + 1)}

    def noisy(c):
        if kind == "int":
            return np.clip(c + rng.integers(-1, 2, dim), -3, 3).astype(np.float32)
        return (c + 0.8 * rng.normal(size=dim)).astype(np.float32)

    q, qe, g, ge = [], [], [], []
    for p in range(1, persons + 1):
        lab = str(p)
        for _ in range(rng.integers(1, max_images + 1)):
            g.append({"id": f"g{len(g):03d}", "label": lab, "camera": int(rng.integers(1, 3))})
            ge.append(noisy(centre[lab]))
        for _ in range(rng.integers(1, 3)):
            q.append({"id": f"q{len(q):03d}", "label": lab, "camera": int(rng.integers(1, 3))})
            qe.append(noisy(centre[lab]))
    for _ in range(3):
        g.append({"id": f"g{len(g):03d}", "label": "0", "camera": int(rng.integers(1, 3))})
        ge.append(noisy(centre[str(rng.integers(1, persons + 1))]))
    for i in rng.choice(len(q), 3, replace=False):
        g.append({"id": f"g{len(g):03d}", "label": "-1", "camera": q[i]["camera"]})
        ge.append(qe[i].copy())
    if kind == "int":
        for i in rng.choice(len(g) - 6, 2, replace=False):
            g.append(
                {
                    "id": f"g{len(g):03d}",
                    "label": str(int(g[i]["label"]) % persons + 1),
                    "camera": 1,
                }
            )
            ge.append(ge[i].copy())
    return pd.DataFrame(q), pd.DataFrame(g), np.stack(qe), np.stack(ge)


def draws(seed, query_id, sizes, repeats):
    """The documented draws of one query: ``(repeats, n_identities)`` item positions."""
    digest = hashlib.sha256(query_id.encode("utf-8")).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    return rng.integers(0, sizes, size=(repeats, len(sizes)))


def eval_cuhk03_reference(query, gallery, qe, ge, *, distance, repeats, seed, all_draws=False):
    """Per query ``(P(r <= k) for k in KS, E[1/r], AP)`` and the skipped count."""
    valid, relevant = protocol_masks("reid", query, gallery)
    dist = distance_matrix(qe, ge, distance)
    glab = gallery["label"].astype(str).to_numpy()
    gid = gallery["id"].astype(str).to_numpy()
    out, skipped = [], 0
    for i in range(len(query)):
        order = np.lexsort((np.arange(len(gallery)), relevant[i].astype(np.int8), dist[i]))
        order = order[valid[i][order]]  # torchreid: `keep = np.invert(remove)`
        raw_cmc = relevant[i][order].astype(np.int64)
        if not raw_cmc.any():
            skipped += 1
            continue
        # g_pids_dict: identity -> positions in the ranked list, identities by label and
        # items by id (the documented order of the draws)
        by_pid = defaultdict(list)
        for pos in sorted(range(len(order)), key=lambda j: gid[order[j]]):
            by_pid[glab[order[pos]]].append(pos)
        pids = sorted(by_pid)
        sizes = np.array([len(by_pid[p]) for p in pids])
        if all_draws:
            picks = np.array(list(itertools.product(*[range(n) for n in sizes])))
        else:
            picks = draws(seed, str(query["id"][i]), sizes, repeats)
        hits, rrs = np.zeros(len(KS)), 0.0
        for pick in picks:
            mask = np.zeros(len(raw_cmc), bool)
            for p, k in zip(pids, pick, strict=True):
                mask[by_pid[p][k]] = True
            masked = raw_cmc[mask]
            first = int(np.flatnonzero(masked)[0]) + 1
            hits += [first <= k for k in KS]
            rrs += 1.0 / first
        tmp = raw_cmc.cumsum() / np.arange(1, len(raw_cmc) + 1) * raw_cmc
        out.append((i, hits / len(picks), rrs / len(picks), tmp.sum() / raw_cmc.sum()))
    return out, skipped


def check(result, ref, skipped):
    assert result.num_skipped == skipped
    assert result.num_queries == len(ref)
    np.testing.assert_array_equal(result.per_query["query_index"], [r[0] for r in ref])
    for j, k in enumerate(KS):
        want = 100 * np.mean([r[1][j] for r in ref])
        assert result.metrics[f"rank{k}"] == pytest.approx(want, abs=1e-9), k
    assert result.metrics["mrr"] == pytest.approx(100 * np.mean([r[2] for r in ref]), abs=1e-9)
    assert result.metrics["map"] == pytest.approx(100 * np.mean([r[3] for r in ref]), abs=1e-9)


def evaluate(case, distance, **options):
    return rankwise.evaluate(
        *case, protocol="reid", distance=distance, ks=KS, single_gallery_shot=True, **options
    )


@pytest.mark.parametrize(("distance", "kind"), [("euclidean", "int"), ("cosine", "normal")])
@pytest.mark.parametrize(("seed", "repeats", "draw_seed"), [(0, 10, 0), (1, 7, 3), (2, 1, 5)])
def test_sampled_draws_match_eval_cuhk03(distance, kind, seed, repeats, draw_seed):
    case = cuhk_case(seed, kind)
    ref, skipped = eval_cuhk03_reference(*case, distance=distance, repeats=repeats, seed=draw_seed)
    result = evaluate(case, distance, shot_repeats=repeats, shot_seed=draw_seed)
    check(result, ref, skipped)
    # map and minp are the full list's: the same as without single_gallery_shot
    full = rankwise.evaluate(*case, protocol="reid", distance=distance, ks=KS)
    assert result.metrics["map"] == full.metrics["map"]
    assert result.metrics["minp"] == full.metrics["minp"]


@pytest.mark.parametrize(("distance", "kind"), [("euclidean", "int"), ("cosine", "normal")])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_equals_the_mean_over_all_draws(distance, kind, seed):
    """Tiny gallery: every combination of one item per identity is enumerated."""
    case = cuhk_case(seed, kind, persons=4, max_images=3)
    ref, skipped = eval_cuhk03_reference(
        *case, distance=distance, repeats=None, seed=None, all_draws=True
    )
    check(evaluate(case, distance, shot_repeats="exact"), ref, skipped)


def test_toy_exact_by_hand():
    """Query a@(0): a's items at 1 and 3; b's at 2 (one item); c's at 0.5 and 4.

    t = 1 (prob 1/2): b behind, c ahead with p = 1/2 -> r = 1 or 2, each 1/2.
    t = 3 (prob 1/2): b ahead, c ahead with p = 1/2 -> r = 2 or 3, each 1/2.
    P(r=1) = 1/4, P(r=2) = 1/2, P(r=3) = 1/4; E[1/r] = 1/4 + 1/4 + 1/12 = 7/12.
    """
    query = pd.DataFrame({"id": ["q"], "label": ["a"], "camera": [1]})
    gallery = pd.DataFrame(
        {"id": ["g1", "g2", "g3", "g4", "g5"], "label": list("aabcc"), "camera": [2] * 5}
    )
    qe = np.zeros((1, 1), np.float32)
    ge = np.array([[1.0], [3.0], [2.0], [0.5], [4.0]], np.float32)
    result = rankwise.evaluate(
        query,
        gallery,
        qe,
        ge,
        protocol="reid",
        distance="euclidean",
        ks=(1, 2, 3),
        single_gallery_shot=True,
        shot_repeats="exact",
    )
    assert result.metrics["rank1"] == pytest.approx(25.0, abs=1e-12)
    assert result.metrics["rank2"] == pytest.approx(75.0, abs=1e-12)
    assert result.metrics["rank3"] == pytest.approx(100.0, abs=1e-12)
    assert result.metrics["mrr"] == pytest.approx(100 * 7 / 12, abs=1e-12)


@pytest.mark.parametrize("repeats", [10, "exact"])
def test_gallery_row_order_and_tiles_change_nothing(repeats):
    case = cuhk_case(3, "int")
    base = evaluate(case, "euclidean", shot_repeats=repeats)
    q, g, qe, ge = case
    rng = np.random.default_rng(0)
    for _ in range(2):
        gp = rng.permutation(len(g))
        out = evaluate(
            (q, g.iloc[gp].reset_index(drop=True), qe, ge[gp]),
            "euclidean",
            shot_repeats=repeats,
            query_block=3,
            gallery_chunk=7,
        )
        for name, value in base.metrics.items():
            assert out.metrics[name] == pytest.approx(value, abs=1e-12), name


def test_seed_changes_the_draws_not_the_exact_value():
    case = cuhk_case(4, "normal")
    a = evaluate(case, "cosine", shot_repeats=3, shot_seed=0).metrics
    b = evaluate(case, "cosine", shot_repeats=3, shot_seed=1).metrics
    assert a != b
    x = evaluate(case, "cosine", shot_repeats="exact", shot_seed=0).metrics
    y = evaluate(case, "cosine", shot_repeats="exact", shot_seed=9).metrics
    assert x == y


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shot_repeats": 0}, r"^shot_repeats must be an integer from 1 to 10000, or 'exact' "),
        ({"shot_repeats": "all"}, r"^shot_repeats must be an integer from 1 to 10000, or 'exact'"),
        # each query's draws are held whole: 10^11 of them was a numpy MemoryError traceback
        ({"shot_repeats": 10**11}, r"^shot_repeats must be an integer from 1 to 10000, or 'e"),
        ({"shot_seed": -1}, r"^shot_seed must be a non-negative integer, got -1$"),
        ({"single_gallery_shot": "yes"}, r"^single_gallery_shot must be true or false"),
    ],
)
def test_library_errors(options, message):
    case = cuhk_case(0, "int")
    options = {"single_gallery_shot": True, **options}
    with pytest.raises(RankwiseError, match=message):
        rankwise.evaluate(*case, protocol="reid", **options)


def test_other_protocols_refuse_it():
    q, g, qe, ge = cuhk_case(0, "int")
    with pytest.raises(RankwiseError, match=r"^single_gallery_shot applies to protocol 'reid'"):
        rankwise.evaluate(q, g, qe, ge, protocol="recall", single_gallery_shot=True)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--protocol", "reid", "--single-gallery-shot", "--shot-repeats", "0"], "--shot-repeats"),
        (["--protocol", "reid", "--single-gallery-shot", "--shot-repeats", "x"], "--shot-repeats"),
        (["--protocol", "reid", "--single-gallery-shot", "--shot-repeats", "10001"], "to 10000"),
        (["--protocol", "reid", "--single-gallery-shot", "--shot-seed", "-1"], "--shot-seed"),
        (["--protocol", "recall", "--single-gallery-shot"], "applies to protocol 'reid'"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, needle):
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank", *write_inputs(tmp_path, *cuhk_case(0, "int")), *args, "--out", str(out)
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("repeats", ["4", "exact"])
def test_cli_records_single_shot(tmp_path, repeats):
    """The flags reach the ranks store and the metrics JSON; numbers equal the library's."""
    case = cuhk_case(5, "int")
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank",
        *write_inputs(tmp_path, *case),
        "--protocol",
        "reid",
        "--distance",
        "euclidean",
        "--single-gallery-shot",
        "--shot-repeats",
        repeats,
        "--shot-seed",
        "2",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    want = int(repeats) if repeats.isdigit() else repeats
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["protocol_options"] == {
        "junk_labels": ["-1"],
        "exclude_same_camera": True,
        "single_gallery_shot": True,
        "shot_repeats": want,
        "shot_seed": 2,
    }
    report = tmp_path / "m.json"
    proc = run_rankwise("metrics", str(out), "--ks", "1,2,3,5", "--output", str(report))
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(report.read_text())
    assert doc["provenance"]["protocol_options"]["shot_repeats"] == want
    lib = evaluate(case, "euclidean", shot_repeats=want, shot_seed=2)
    for name, value in lib.metrics.items():
        assert doc["metrics"][name] == pytest.approx(value, abs=1e-9), name


def test_cmc_curve_and_scores_read_the_draws():
    """The CMC curve and `rankwise scores`' hit@K average P(r <= k) like rankK."""
    from rankwise.metrics import cmc, unit_scores

    case = cuhk_case(6, "int")
    result = rankwise.rank(*case, protocol="reid", distance="euclidean", single_gallery_shot=True)
    arrays, attrs = result.arrays(), result.attrs
    metrics = rankwise.api.result_from_ranks(result, ks=(1, 2, 3)).metrics
    curve = cmc(arrays, attrs, max_rank=3)
    scores = unit_scores(arrays, attrs, ks=(1, 2, 3))
    for k in (1, 2, 3):
        assert curve[k - 1] == pytest.approx(metrics[f"rank{k}"], abs=1e-9)
        assert 100 * scores[f"hit@{k}"].mean() == pytest.approx(metrics[f"rank{k}"], abs=1e-9)


def test_schema_fragments():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    assert schema_differences(schema) == []
    props = schema["$defs"]["dataset"]["properties"]
    assert props["single_gallery_shot"]["default"] is False
    assert props["shot_repeats"]["default"] == 10 and props["shot_seed"]["default"] == 0


def test_cli_scores_keep_the_probabilities(tmp_path):
    """`rankwise scores`: hit@K is P(r <= K) (a fraction), whose mean is rankK."""
    case = cuhk_case(7, "int")
    out = tmp_path / "ranks.zarr"
    args = ["--protocol", "reid", "--distance", "euclidean", "--single-gallery-shot"]
    proc = run_rankwise("rank", *write_inputs(tmp_path, *case), *args, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    csv = tmp_path / "scores.csv"
    proc = run_rankwise("scores", str(out), "--ks", "1,2", "--output", str(csv))
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(csv)
    lib = evaluate(case, "euclidean")
    assert ((table["hit@1"] > 0) & (table["hit@1"] < 1)).any()
    assert 100 * table["hit@1"].mean() == pytest.approx(lib.metrics["rank1"], abs=1e-6)
    assert 100 * table["rr"].mean() == pytest.approx(lib.metrics["mrr"], abs=1e-6)


@pytest.mark.parametrize("repeats", [5, 1])
def test_with_multi_query(repeats):
    """Pooled queries (tests/test_multi_query.py's reference pooling) drawn like any
    query, keyed by the representative's id."""
    from test_multi_query import multi_case, pool_reference

    query, gallery, qe, ge = multi_case(0, "int")
    groups = pool_reference(query, qe, "mean")
    reps = sorted(v[0] for v in groups.values())
    vec = {v[0]: v[2] for v in groups.values()}
    pooled = query.iloc[reps].reset_index(drop=True)
    ref, skipped = eval_cuhk03_reference(
        pooled,
        gallery,
        np.stack([vec[r] for r in reps]),
        ge,
        distance="euclidean",
        repeats=repeats,
        seed=1,
    )
    ref = [(reps[i], *rest) for i, *rest in ref]  # pooled position -> representative row
    result = rankwise.evaluate(
        query,
        gallery,
        qe,
        ge,
        protocol="reid",
        distance="euclidean",
        ks=KS,
        multi_query="mean",
        single_gallery_shot=True,
        shot_repeats=repeats,
        shot_seed=1,
    )
    check(result, ref, skipped)


def test_hit_probability_is_one_exactly_once_k_covers_every_draw():
    # ten draws with r = 2, 2, 4, 6, 6, 8, 8, 8, 8, 10: the stored c / 10 add up to
    # 1.0000000000000002 in floats, which made rank10 (and rank50) 100.00000000000003 %
    from rankwise.metrics import shot_hits

    counts = np.array([0, 2, 0, 1, 0, 2, 0, 4, 0, 1])
    pmf = np.r_[counts / 10, [0.5, 0.5]]  # and a second query, r = 1 or 2
    offsets = np.array([0, 10, 12])
    assert np.add.reduceat(pmf, offsets[:-1])[0] != 1.0  # the rounding this guards against
    assert shot_hits(offsets, pmf, 10).tolist() == [1.0, 1.0]
    assert shot_hits(offsets, pmf, 50).tolist() == [1.0, 1.0]
    assert shot_hits(offsets, pmf, 1).tolist() == [0.0, 0.5]
    assert shot_hits(offsets, pmf, 9).tolist()[0] == pytest.approx(0.9)
