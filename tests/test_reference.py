"""rankwise against brute-force references (tests/reference.py), API and CLI.

The first half checks the references themselves (two independent routes to the
ranks, the formulas of DESIGN.md, the seed's recall@K code on tie-free data, and
that the generated data really contain the cases they are meant to exercise).
The second half checks rankwise against them to 1e-6 percentage points.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_json
from reference import (
    distance_matrix,
    evaluate_reference,
    market1501_query,
    matlab_trapezoid_ap,
    protocol_masks,
    ranks_by_counting,
    relevant_ranks,
    slfir_weights,
    sorted_matches,
)

TOL = 1e-6  # percentage points
JSON_KEYS = {
    "protocol",
    "distance",
    "num_queries",
    "num_skipped",
    "num_gallery",
    "embedding_dim",
    "metrics",
}

# (protocol, distance, kind, seed, extra options)
CASES = [
    ("recall", "cosine", "sign", 0, {}),
    ("recall", "euclidean", "int", 1, {}),
    ("recall", "cosine", "float", 2, {}),
    ("reid", "euclidean", "int", 0, {}),
    ("reid", "cosine", "sign", 1, {}),
    ("reid", "cosine", "float", 0, {}),
    ("reid", "euclidean", "float", 2, {}),
    ("reassociation", "euclidean", "int", 0, {"gap_frames": 1}),
    ("reassociation", "cosine", "sign", 1, {"gap_frames": 2}),
    ("progressive", "euclidean", "int", 0, {}),
    ("progressive", "cosine", "sign", 1, {}),
]
IDS = [f"{p}-{d}-{k}-{s}" + "".join(f"-{a}{b}" for a, b in o.items()) for p, d, k, s, o in CASES]


def _case(make_case, protocol, distance, kind, seed, opts):
    return make_case(protocol, distance, kind, seed, **opts)


# ---------------------------------------------------------------------------
# the references themselves
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol,distance,kind,seed,opts", CASES, ids=IDS)
def test_reference_sort_agrees_with_rank_formula(make_case, protocol, distance, kind, seed, opts):
    """lexsort route (torchreid style) == DESIGN.md's counting formula, per query."""
    case = _case(make_case, protocol, distance, kind, seed, opts)
    d = distance_matrix(case.query_emb, case.gallery_emb, distance)
    valid, rel = protocol_masks(
        protocol, case.query, case.gallery, gap_frames=opts.get("gap_frames", 1)
    )
    n_checked = 0
    for i in range(len(case.query)):
        a = relevant_ranks(sorted_matches(d[i], valid[i], rel[i]))
        b = ranks_by_counting(d[i], valid[i], rel[i])
        np.testing.assert_array_equal(a, b)
        n_checked += len(a)
    assert n_checked > 0


@pytest.mark.parametrize("protocol,distance,kind,seed,opts", CASES[:7], ids=IDS[:7])
def test_reference_metrics_match_design_formulas(make_case, protocol, distance, kind, seed, opts):
    """AP, INP, trapezoid AP from the loops == DESIGN.md's closed forms in the ranks."""
    case = _case(make_case, protocol, distance, kind, seed, opts)
    d = distance_matrix(case.query_emb, case.gallery_emb, distance)
    valid, rel = protocol_masks(protocol, case.query, case.gallery)
    for i in range(len(case.query)):
        raw = sorted_matches(d[i], valid[i], rel[i])
        res = market1501_query(raw, 10)
        if res is None:
            continue
        r = relevant_ranks(raw).astype(float)
        i_ = np.arange(1, len(r) + 1)
        _, ap, inp = res
        assert ap == pytest.approx(np.mean(i_ / r), abs=1e-12)
        assert inp == pytest.approx(len(r) / r[-1], abs=1e-12)
        prev = np.where(r == 1, 1.0, (i_ - 1) / np.maximum(r - 1, 1))
        trap = np.sum(prev + i_ / r) / (2 * len(r))
        assert matlab_trapezoid_ap(raw) == pytest.approx(trap, abs=1e-12)


def test_reference_seed_worked_example():
    """Seed 002: matches at ranks 1-6 and 72 -> AP 87.1 %, INP 9.7 %."""
    raw = np.zeros(80, bool)
    raw[[0, 1, 2, 3, 4, 5, 71]] = True
    cmc, ap, inp = market1501_query(raw, 10)
    assert round(100 * ap, 1) == 87.1
    assert round(100 * inp, 1) == 9.7
    assert cmc[0] == 1
    assert matlab_trapezoid_ap(raw) == pytest.approx((12 + 6 / 71 + 7 / 72) / 14)


def test_reference_tie_rule_is_pessimistic():
    d = np.array([0.5, 0.5, 0.2, 0.5])
    valid = np.array([True, True, True, True])
    rel = np.array([True, False, False, True])
    # relevant 0 and 3 tie with non-relevant 1: both come after it
    np.testing.assert_array_equal(relevant_ranks(sorted_matches(d, valid, rel)), [3, 4])
    np.testing.assert_array_equal(ranks_by_counting(d, valid, rel), [3, 4])
    # an invalid tied item does not count
    valid[1] = False
    np.testing.assert_array_equal(relevant_ranks(sorted_matches(d, valid, rel)), [2, 3])


def test_reference_slfir_weights():
    w = slfir_weights(4)
    np.testing.assert_allclose(w, np.exp(-np.arange(1, 5) / 4), rtol=1e-15)
    assert w[-1] == pytest.approx(1 / np.e)


def _seed_recall_at_k(query_emb, gallery_emb, q_labels, g_labels, ks, query_ids, gallery_ids):
    """The seed 000 template (argpartition + argsort on cosine similarity), as fractions."""
    g_label_set = set(g_labels.tolist())
    keep = np.array([lbl in g_label_set for lbl in q_labels])
    q_lab_f, q_id_f = q_labels[keep], query_ids[keep]
    q = query_emb[keep] / np.linalg.norm(query_emb[keep], axis=1, keepdims=True)
    g = gallery_emb / np.linalg.norm(gallery_emb, axis=1, keepdims=True)
    sims = q @ g.T
    sims = np.where(q_id_f[:, None] == gallery_ids[None, :], -np.inf, sims)
    top_k_max = min(max(ks), g.shape[0])
    top = np.argpartition(-sims, top_k_max - 1, axis=1)[:, :top_k_max]
    sorted_top = np.take_along_axis(
        top, np.argsort(-sims[np.arange(len(q))[:, None], top], axis=1), axis=1
    )
    return {
        f"recall@{k}": float(np.any(g_labels[sorted_top[:, :k]] == q_lab_f[:, None], axis=1).mean())
        for k in ks
    }


def test_reference_equals_seed_recall_code_without_ties(make_case):
    """On tie-free data, the pessimistic rule changes nothing: the seed's code agrees."""
    case = make_case("recall", "cosine", "float", 2)
    # the seed counts a query whose only same-label item is itself as a miss
    # (DESIGN.md skips it), and ties differ: drop those rows
    qk = ~case.query["id"].isin(["self11", "qdup"]).to_numpy()
    gk = ~case.gallery["id"].str.startswith("dup").to_numpy()
    q, g = case.query[qk].reset_index(drop=True), case.gallery[gk].reset_index(drop=True)
    qe, ge = case.query_emb[qk].astype(np.float64), case.gallery_emb[gk].astype(np.float64)
    ks = (1, 2, 5, 10)
    ref = evaluate_reference(q, g, qe, ge, protocol="recall", distance="cosine", ks=ks)
    seed = _seed_recall_at_k(
        qe,
        ge,
        q["label"].to_numpy(),
        g["label"].to_numpy(),
        ks,
        q["id"].to_numpy(),
        g["id"].to_numpy(),
    )
    for k in ks:
        assert ref.metrics[f"recall@{k}"] == pytest.approx(100 * seed[f"recall@{k}"], abs=1e-9)
    assert ref.num_skipped == 1  # the absent label


def test_generated_reid_data_exercise_every_rule(make_case):
    """The reid case really contains junk, distractors, skips and ties that matter."""
    case = make_case("reid", "euclidean", "int", 0)
    base = evaluate_reference(*case.args(), **case.kwargs())
    # junk removed (would change the numbers if kept) and excluded from num_gallery
    no_junk_rule = evaluate_reference(*case.args(), **case.kwargs(junk_labels=()))
    assert no_junk_rule.metrics["map"] != base.metrics["map"]
    n_junk = int((case.gallery["label"] == "-1").sum())
    assert n_junk > 0 and base.num_gallery == len(case.gallery) - n_junk
    # distractors count as non-matches (dropping them would change the numbers)
    as_junk = evaluate_reference(*case.args(), **case.kwargs(junk_labels=("-1", "0")))
    assert as_junk.metrics["map"] > base.metrics["map"]
    # both kinds of skipped queries
    skipped = set(case.query["label"]) - set(case.query["label"].iloc[base.query_index])
    assert {"13", "14"} <= skipped and base.num_skipped == 2
    # ties between a relevant and a valid non-relevant item exist
    d = distance_matrix(case.query_emb, case.gallery_emb, "euclidean")
    valid, rel = protocol_masks("reid", case.query, case.gallery)
    n_ties = sum(np.isin(d[i][rel[i]], d[i][valid[i] & ~rel[i]]).sum() for i in range(len(d)))
    assert n_ties > 0


def test_generated_recall_data_exercise_every_rule(make_case):
    case = make_case("recall", "cosine", "sign", 0)
    ref = evaluate_reference(*case.args(), **case.kwargs())
    evaluated = set(case.query["id"].iloc[ref.query_index])
    assert "self11" not in evaluated and "absent12" not in evaluated
    assert ref.num_skipped == 2
    assert case.query["id"].isin(case.gallery["id"]).sum() >= 6  # shared items
    # the labels are not grouped: rows are shuffled
    assert not case.query["label"].is_monotonic_increasing


def test_generated_reassociation_data_skip_small_frames(make_case):
    case = make_case("reassociation", "euclidean", "int", 0, gap_frames=1)
    valid, rel = protocol_masks("reassociation", case.query, case.gallery, gap_frames=1)
    one_candidate_with_match = (valid.sum(1) == 1) & (rel.sum(1) == 1)
    assert one_candidate_with_match.any()  # skipped only because of the "< 2" rule
    ref = evaluate_reference(*case.args(), **case.kwargs())
    assert ref.num_skipped == len(case.query) - ref.num_queries
    assert ref.num_queries == int(((valid.sum(1) >= 2) & rel.any(1)).sum())


# ---------------------------------------------------------------------------
# rankwise against the references
# ---------------------------------------------------------------------------


def _assert_matches_reference(got: dict, ref: dict):
    """``got``'s report keys equal the reference's; the keys naming a non-default run
    (api.variant_keys: the callers check them) aside."""
    assert set(got) - JSON_KEYS <= {"protocol_options", "ap"}
    got = {key: value for key, value in got.items() if key in JSON_KEYS}
    assert set(got) == JSON_KEYS
    for key in JSON_KEYS - {"metrics"}:
        assert got[key] == ref[key], key
    assert set(got["metrics"]) == set(ref["metrics"])
    for name, value in ref["metrics"].items():
        assert got["metrics"][name] == pytest.approx(value, abs=TOL), name


@pytest.mark.parametrize("protocol,distance,kind,seed,opts", CASES, ids=IDS)
def test_api_matches_reference(make_case, protocol, distance, kind, seed, opts):
    import rankwise

    case = _case(make_case, protocol, distance, kind, seed, opts)
    ref = evaluate_reference(*case.args(), **case.kwargs())
    res = rankwise.evaluate(*case.args(), **case.kwargs())
    _assert_matches_reference(res.to_json(), ref.to_json())
    assert res.num_queries == ref.num_queries and res.num_skipped == ref.num_skipped
    if protocol != "progressive":
        np.testing.assert_array_equal(np.asarray(res.per_query["query_index"]), ref.query_index)
        np.testing.assert_array_equal(np.asarray(res.per_query["first_rank"]), ref.first_rank)


@pytest.mark.parametrize(
    "protocol,distance,kind,seed",
    [
        ("reid", "euclidean", "int", 0),
        ("reid", "cosine", "float", 0),
        ("recall", "cosine", "sign", 0),
    ],
)
def test_api_trapezoid_ap_matches_matlab(make_case, protocol, distance, kind, seed):
    import rankwise

    case = make_case(protocol, distance, kind, seed)
    ref = evaluate_reference(*case.args(), **case.kwargs(ap="trapezoid"))
    std = evaluate_reference(*case.args(), **case.kwargs())
    assert ref.metrics["map"] != pytest.approx(std.metrics["map"], abs=1e-3)
    res = rankwise.evaluate(*case.args(), **case.kwargs(ap="trapezoid"))
    _assert_matches_reference(res.to_json(), ref.to_json())
    assert res.to_json()["ap"] == "trapezoid"


def test_api_custom_junk_labels(make_case):
    """junk_labels=("-1", "0"): distractors become junk, num_gallery shrinks."""
    import rankwise

    case = make_case("reid", "euclidean", "int", 1)
    ref = evaluate_reference(*case.args(), **case.kwargs(junk_labels=("-1", "0")))
    res = rankwise.evaluate(*case.args(), **case.kwargs(junk_labels=("-1", "0")))
    _assert_matches_reference(res.to_json(), ref.to_json())
    assert res.to_json()["protocol_options"]["junk_labels"] == ["-1", "0"]
    assert ref.num_gallery < evaluate_reference(*case.args(), **case.kwargs()).num_gallery


def test_recall_at_k_function_matches_reference(make_case):
    import rankwise

    case = make_case("recall", "euclidean", "int", 1)
    ks = (1, 2, 5, 10)
    ref = evaluate_reference(*case.args(), protocol="recall", distance="euclidean", ks=ks)
    got = rankwise.recall_at_k(
        case.query_emb,
        case.gallery_emb,
        case.query["label"].to_numpy(),
        case.gallery["label"].to_numpy(),
        ks=ks,
        query_ids=case.query["id"].to_numpy(),
        gallery_ids=case.gallery["id"].to_numpy(),
        distance="euclidean",
    )
    assert set(got) == {f"recall@{k}" for k in ks}
    for k in ks:
        assert got[f"recall@{k}"] == pytest.approx(ref.metrics[f"recall@{k}"], abs=TOL)


CLI_CASES = [
    ("recall", "cosine", "sign", 0, {}, "standard"),
    ("reid", "cosine", "float", 0, {}, "trapezoid"),
    ("reassociation", "euclidean", "int", 1, {"gap_frames": 2}, "standard"),
    ("progressive", "cosine", "sign", 0, {}, "standard"),
]


@pytest.mark.parametrize(
    "protocol,distance,kind,seed,opts,ap",
    CLI_CASES,
    ids=[f"{c[0]}-{c[1]}-{c[5]}" for c in CLI_CASES],
)
def test_cli_evaluate_matches_reference(
    make_case, cli, tmp_path, protocol, distance, kind, seed, opts, ap
):
    case = make_case(protocol, distance, kind, seed, **opts)
    options = case.write(tmp_path)
    ks = case.options["ks"]
    options.update(
        {
            "--protocol": protocol,
            "--distance": distance,
            "--ks": ",".join(map(str, ks)),
            "--output": tmp_path / "r.json",
        }
    )
    if "gap_frames" in opts:
        options["--gap-frames"] = opts["gap_frames"]
    if protocol in ("recall", "reid"):
        options["--ap"] = ap
    proc = cli("evaluate", options=options)
    assert proc.returncode == 0, proc.stderr
    ref = evaluate_reference(*case.args(), **case.kwargs(ap=ap))
    got = read_json(tmp_path / "r.json")
    # options other than the defaults are named (api.variant_keys), the defaults not
    assert got.pop("ap", "standard") == ap
    options = got.pop("protocol_options", None)
    if "gap_frames" in opts and opts["gap_frames"] != 1:
        assert options == {"gap_frames": opts["gap_frames"], "query_stride": 1}
    else:
        assert options is None
    _assert_matches_reference(got, ref.to_json())
    assert "[evaluation]" in proc.stdout and "[metrics]" in proc.stdout
    assert proc.stdout.index("[evaluation]") < proc.stdout.index("[metrics]")
