"""The protocol options ``exclude_same_camera`` (reid) and ``query_stride`` (reassociation).

Each is checked against a brute-force reference written here: a dense loop over all
(query, gallery) pairs applying DESIGN.md's rule plus the option, scored with the
per-query pieces of tests/reference.py.  ``query_stride`` is also checked against a
re-implementation of the ``reid`` package's candidate rule (reid/data/reassociation.py)
and, when the package is installed, against the package itself.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import zarr
from conftest import reassociation_case, reid_case
from helpers import run_rankwise
from reference import (
    distance_matrix,
    first_match_rank,
    market1501_query,
    relevant_ranks,
    sorted_matches,
)

import rankwise
from rankwise.errors import RankwiseError
from rankwise.inputs import open_inputs
from rankwise.registry import get_protocol

# ---------------------------------------------------------------------------
# brute-force references
# ---------------------------------------------------------------------------


def brute_masks(protocol, query, gallery, *, exclude_same_camera=True, gap_frames=1, stride=1):
    """``(valid, relevant, is_query)`` by a loop over every pair, the rule in words:

    reid: valid = not junk (-1), not the query's id, and -- when excluding -- not
    (same label and same camera).  reassociation: valid = same sequence, frame exactly
    ``gap_frames`` later, not the query's id; a row is a query only when its frame is
    divisible by ``stride``.  relevant = valid and same label.
    """
    nq, ng = len(query), len(gallery)
    valid = np.zeros((nq, ng), bool)
    relevant = np.zeros((nq, ng), bool)
    is_query = np.ones(nq, bool)
    for i in range(nq):
        q = query.iloc[i]
        if protocol == "reassociation" and int(q["frame"]) % stride != 0:
            is_query[i] = False
            continue
        for j in range(ng):
            g = gallery.iloc[j]
            same_label = str(g["label"]) == str(q["label"])
            if str(g["id"]) == str(q["id"]):
                continue
            if protocol == "reid":
                if str(g["label"]) == "-1":
                    continue
                if exclude_same_camera and same_label and int(g["camera"]) == int(q["camera"]):
                    continue
            else:
                if str(g["sequence"]) != str(q["sequence"]):
                    continue
                if int(g["frame"]) != int(q["frame"]) + gap_frames:
                    continue
            valid[i, j] = True
            relevant[i, j] = same_label
    return valid, relevant, is_query


def brute_evaluate(case, *, ks, **rule):
    """Queries, skips, per-query first ranks and metrics (percent) of the brute masks."""
    valid, relevant, is_query = brute_masks(case.protocol, case.query, case.gallery, **rule)
    dist = distance_matrix(case.query_emb, case.gallery_emb, case.distance)
    evaluated, firsts, cmcs, aps, inps, rrs, ranks = [], [], [], [], [], [], []
    skipped = 0
    for i in range(len(case.query)):
        if not is_query[i]:
            continue  # not a query at all: neither evaluated nor skipped
        if case.protocol == "reassociation" and valid[i].sum() < 2:
            skipped += 1
            continue
        raw = sorted_matches(dist[i], valid[i], relevant[i])
        res = market1501_query(raw, max(ks))
        if res is None:
            skipped += 1
            continue
        cmc, ap, inp = res
        evaluated.append(i)
        firsts.append(first_match_rank(raw))
        cmcs.append(cmc)
        aps.append(ap)
        inps.append(inp)
        rrs.append(1.0 / firsts[-1])
        ranks.append(relevant_ranks(raw))
    cmc = np.mean(cmcs, axis=0)
    metrics = {f"rank{k}": 100.0 * float(cmc[k - 1]) for k in ks}
    if case.protocol == "reid":
        metrics["map"] = 100.0 * float(np.mean(aps))
        metrics["minp"] = 100.0 * float(np.mean(inps))
    metrics["mrr"] = 100.0 * float(np.mean(rrs))
    return {
        "num_queries": len(evaluated),
        "num_skipped": skipped,
        "query_index": np.asarray(evaluated, np.int64),
        "first_rank": np.asarray(firsts, np.int64),
        "ranks": ranks,
        "metrics": metrics,
        "valid": valid,
    }


def assert_matches(result, ref):
    assert result.num_queries == ref["num_queries"]
    assert result.num_skipped == ref["num_skipped"]
    np.testing.assert_array_equal(result.per_query["query_index"], ref["query_index"])
    np.testing.assert_array_equal(result.per_query["first_rank"], ref["first_rank"])
    assert set(result.metrics) >= set(ref["metrics"])
    for name, value in ref["metrics"].items():
        assert result.metrics[name] == pytest.approx(value, abs=1e-9), name


def api_kwargs(case, ks, **options):
    return {"protocol": case.protocol, "distance": case.distance, "ks": ks, **options}


# ---------------------------------------------------------------------------
# exclude_same_camera
# ---------------------------------------------------------------------------

REID_KS = (1, 3, 5, 10)


@pytest.mark.parametrize("exclude", [True, False])
@pytest.mark.parametrize(
    ("distance", "kind", "seed"), [("euclidean", "int", 0), ("cosine", "sign", 1)]
)
def test_exclude_same_camera_matches_brute_force(exclude, distance, kind, seed):
    case = reid_case(distance, kind, seed)
    ref = brute_evaluate(case, ks=REID_KS, exclude_same_camera=exclude)
    res = rankwise.evaluate(*case.args(), **api_kwargs(case, REID_KS, exclude_same_camera=exclude))
    assert_matches(res, ref)
    # ranks of every relevant item, not only the first
    ranks = rankwise.rank(
        *case.args(), protocol="reid", distance=distance, exclude_same_camera=exclude
    )
    for n, want in enumerate(ref["ranks"]):
        got = ranks.ranks[ranks.offsets[n] : ranks.offsets[n + 1]]
        np.testing.assert_array_equal(np.sort(got), want)
    assert ranks.attrs["protocol_options"] == {
        "junk_labels": ["-1"],
        "exclude_same_camera": exclude,
    }


def test_keep_same_camera_changes_what_counts():
    """The toggle matters on this case: person 13 (seen and queried only by camera 1)
    is skipped when excluding and evaluated when keeping."""
    case = reid_case()
    row13 = int(np.flatnonzero(case.query["label"].astype(str) == "13")[0])
    kept = rankwise.evaluate(*case.args(), protocol="reid", exclude_same_camera=False)
    excluded = rankwise.evaluate(*case.args(), protocol="reid")
    assert row13 in kept.per_query["query_index"]
    assert row13 not in excluded.per_query["query_index"]
    assert kept.num_skipped < excluded.num_skipped
    assert kept.num_queries + kept.num_skipped == excluded.num_queries + excluded.num_skipped


def test_keep_same_camera_toy_by_hand():
    """Hand-computed: query q (label 1, camera 1) against

    ======  =====  ======  =========  ===================================
    id      label  camera  distance   exclude / keep
    ======  =====  ======  =========  ===================================
    q       1      1       0          never ranked (the query's own id)
    same    1      1       1          not ranked / relevant
    other   2      2       2          non-relevant either way
    far     1      2       3          relevant either way
    ======  =====  ======  =========  ===================================

    exclude: ranks [2] (other ahead of far), AP = 1/2.  keep: ranks [1, 3],
    AP = (1/1 + 2/3) / 2 = 5/6.
    """
    query = pd.DataFrame({"id": ["q"], "label": ["1"], "camera": [1]})
    gallery = pd.DataFrame(
        {"id": ["q", "same", "other", "far"], "label": ["1", "1", "2", "1"], "camera": [1, 1, 2, 2]}
    )
    qe = np.zeros((1, 2), np.float32)
    ge = np.array([[0, 0], [1, 0], [2, 0], [3, 0]], np.float32)
    common = {"protocol": "reid", "distance": "euclidean", "ks": (1,)}
    excluded = rankwise.evaluate(query, gallery, qe, ge, **common)
    kept = rankwise.evaluate(query, gallery, qe, ge, exclude_same_camera=False, **common)
    assert excluded.metrics["rank1"] == 0.0 and excluded.metrics["map"] == pytest.approx(50.0)
    assert kept.metrics["rank1"] == 100.0
    assert kept.metrics["map"] == pytest.approx(100.0 * 5 / 6, abs=1e-12)
    problem = open_inputs(query, gallery, qe, ge, protocol="reid").problem(
        exclude_same_camera=False
    )
    valid, relevant = problem.valid_relevant(0, 0, 4)
    np.testing.assert_array_equal(valid, [False, True, True, True])
    np.testing.assert_array_equal(relevant, [False, True, False, True])
    assert problem.qcam is None  # no camera rule at all: count_tile and dense_masks agree


@pytest.mark.parametrize("exclude", [True, False])
def test_exclude_same_camera_gallery_order_invariant(exclude):
    case = reid_case("cosine", "float", 2)
    base = rankwise.evaluate(*case.args(), **api_kwargs(case, REID_KS, exclude_same_camera=exclude))
    for seed in (0, 1):
        shuffled, _, _ = case.permuted(seed, queries=False)
        res = rankwise.evaluate(
            *shuffled.args(), **api_kwargs(shuffled, REID_KS, exclude_same_camera=exclude)
        )
        assert (res.num_queries, res.num_skipped) == (base.num_queries, base.num_skipped)
        np.testing.assert_array_equal(res.per_query["first_rank"], base.per_query["first_rank"])
        for name, value in base.metrics.items():
            assert res.metrics[name] == pytest.approx(value, abs=1e-9), name


def test_exclude_same_camera_must_be_boolean():
    case = reid_case()
    with pytest.raises(
        RankwiseError, match=r"^exclude_same_camera must be true or false, got 'no'"
    ):
        rankwise.evaluate(*case.args(), protocol="reid", exclude_same_camera="no")


@pytest.mark.parametrize(
    "options",
    [
        {"exclude_same_camera": np.False_},
        {"exclude_same_camera": np.True_},
        {"single_gallery_shot": np.True_},
        {"drop_junk": np.True_, "rerank": "3,2,0.3"},
    ],
)
def test_numpy_booleans_are_the_booleans(options):
    # "must be true or false, got np.False_": numpy's integers were taken, its booleans
    # (a comparison's, a pandas cell's) were not
    case = reid_case()
    plain = {k: bool(v) if isinstance(v, np.bool_) else v for k, v in options.items()}
    expected = rankwise.rank(*case.args(), protocol="reid", **plain).attrs["protocol_options"]
    got = rankwise.rank(*case.args(), protocol="reid", **options).attrs["protocol_options"]
    assert got == expected
    # recorded as Python's bool: the stores' JSON attributes are as with True / False
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert all(type(v) is bool for v in got.values() if isinstance(v, (bool, np.bool_)))
    result = rankwise.evaluate(*case.args(), protocol="reid", **options)
    assert result.to_json() == rankwise.evaluate(*case.args(), protocol="reid", **plain).to_json()


def test_numpy_true_single_gallery_shot_is_refused_with_rerank():
    case = reid_case()
    with pytest.raises(RankwiseError, match=r"^rerank cannot be combined with single_gallery_shot"):
        rankwise.rank(*case.args(), protocol="reid", rerank="3,2,0.3", single_gallery_shot=np.True_)


@pytest.mark.parametrize("value", [np.True_, np.False_])
def test_every_boolean_option_takes_numpy_booleans(value):
    # one place (Option.check) for every boolean: evaluation, encoder and loader options
    from rankwise import options as spec
    from rankwise.datasets import LOADERS
    from rankwise.encoders import OPTIONS as ENCODERS

    sets = [*ENCODERS.values(), *(loader.options for loader in LOADERS.values())]
    flat = [o for o in vars(spec).values() if isinstance(o, spec.Option)]
    flat += [o for option_set in sets for o in option_set.options]
    booleans = [o for o in flat if o.kind == "boolean"]
    assert {"exclude_same_camera", "single_gallery_shot", "drop_junk", "flip", "half"} <= {
        o.name for o in booleans
    }
    for option in booleans:
        checked = option.check(value)
        assert type(checked) is bool and checked == bool(value), option.name
    for option_set in sets:  # an option set records the checked value, not numpy's
        names = [o.name for o in option_set.options if o.kind == "boolean"]
        if names and not option_set.required:
            recorded = option_set.check(dict.fromkeys(names, value))
            assert all(type(recorded[n]) is bool for n in names), option_set.owner


# ---------------------------------------------------------------------------
# query_stride
# ---------------------------------------------------------------------------

RE_KS = (1, 2, 3)


@pytest.mark.parametrize(("stride", "gap"), [(1, 1), (2, 1), (3, 2), (4, 1)])
@pytest.mark.parametrize(
    ("distance", "kind", "seed"), [("euclidean", "int", 0), ("cosine", "sign", 1)]
)
def test_query_stride_matches_brute_force(stride, gap, distance, kind, seed):
    case = reassociation_case(distance, kind, seed, gap_frames=gap)
    ref = brute_evaluate(case, ks=RE_KS, gap_frames=gap, stride=stride)
    res = rankwise.evaluate(
        *case.args(), **api_kwargs(case, RE_KS, gap_frames=gap, query_stride=stride)
    )
    assert_matches(res, ref)
    frames = case.query["frame"].to_numpy()
    # rows off the stride are neither evaluated nor skipped
    assert res.num_queries + res.num_skipped == int((frames % stride == 0).sum())
    ranks = rankwise.rank(
        *case.args(), protocol="reassociation", gap_frames=gap, query_stride=stride
    )
    assert ranks.attrs["protocol_options"] == {"gap_frames": gap, "query_stride": stride}


def test_query_stride_gallery_order_invariant():
    case = reassociation_case("cosine", "float", 3, gap_frames=1)
    opts = api_kwargs(case, RE_KS, gap_frames=1, query_stride=2)
    base = rankwise.evaluate(*case.args(), **opts)
    shuffled, _, _ = case.permuted(5, queries=False)
    res = rankwise.evaluate(*shuffled.args(), **opts)
    assert (res.num_queries, res.num_skipped) == (base.num_queries, base.num_skipped)
    np.testing.assert_array_equal(res.per_query["first_rank"], base.per_query["first_rank"])
    for name, value in base.metrics.items():
        assert res.metrics[name] == pytest.approx(value, abs=1e-9), name


def mot_like(seed, n_seq=3, n_frames=25, n_tracks=6, dim=8):
    """MOT-like crops: (sequence, frame, track) rows, each frame a random subset of the
    tracks (some frames empty, some with one track), continuous embeddings (no ties)."""
    rng = np.random.default_rng(seed)
    rows, emb = [], []
    for s in range(n_seq):
        seq = f"MOT17-0{s + 2}"
        centres = rng.normal(size=(n_tracks + 1, dim))
        for frame in range(1, n_frames + 1):
            n = int(rng.choice([0, 1, 2, 3, 4], p=[0.1, 0.15, 0.25, 0.25, 0.25]))
            for track in sorted(rng.choice(np.arange(1, n_tracks + 1), n, replace=False)):
                rows.append(
                    {
                        "id": f"{seq}_{track}_{frame}",
                        "label": str(track),
                        "sequence": seq,
                        "frame": frame,
                    }
                )
                emb.append(centres[track] + 0.8 * rng.normal(size=dim))
    df = pd.DataFrame(rows)
    return df, np.asarray(emb, np.float32)


def reid_package_candidates(crops: pd.DataFrame, *, gap_frames, query_stride):
    """reid/data/reassociation.py's ``_build_reassociation_candidates``, re-implemented:
    queries at frames divisible by ``query_stride``; candidates = every crop of the same
    sequence at frame + gap_frames; skipped when there is no such frame, fewer than 2
    candidates, or the query's identity is not among them.  Returns
    ``({query row: sorted candidate rows}, skipped count)``."""
    frames = defaultdict(lambda: defaultdict(dict))
    for row, r in enumerate(crops.itertuples()):
        frames[r.sequence][int(r.frame)][r.label] = row
    records, skipped = {}, 0
    for seq, seq_frames in sorted(frames.items()):
        for frame, found in sorted(seq_frames.items()):
            if frame % query_stride:
                continue
            future = seq_frames.get(frame + gap_frames)
            for label, row in sorted(found.items()):
                if future is None or len(future) < 2 or label not in future:
                    skipped += 1
                else:
                    records[row] = sorted(future.values())
    return records, skipped


@pytest.mark.parametrize(("stride", "gap"), [(1, 1), (3, 1), (5, 2), (6, 3)])
@pytest.mark.parametrize("seed", [0, 1])
def test_query_stride_matches_reid_package_rule(stride, gap, seed):
    crops, emb = mot_like(seed)
    records, skipped = reid_package_candidates(crops, gap_frames=gap, query_stride=stride)
    problem = open_inputs(crops, crops, emb, emb, protocol="reassociation").problem(
        gap_frames=gap, query_stride=stride
    )
    evaluated = np.flatnonzero(~problem.skip)
    assert sorted(records) == evaluated.tolist()
    assert problem.num_units_skipped == skipped
    assert problem.num_units - problem.num_units_skipped == len(records)
    for q, cands in records.items():
        np.testing.assert_array_equal(np.sort(problem.pair_g[problem.pair_q == q]), cands)
    # numbers: the positive's rank among the candidates by distance (no ties here)
    dist = distance_matrix(emb, emb, "cosine")
    firsts = []
    for q, cands in sorted(records.items()):
        pos = next(c for c in cands if crops.loc[c, "label"] == crops.loc[q, "label"])
        firsts.append(1 + sum(dist[q, c] < dist[q, pos] for c in cands))
    firsts = np.asarray(firsts)
    res = rankwise.evaluate(
        crops,
        crops,
        emb,
        emb,
        protocol="reassociation",
        ks=(1, 5),
        gap_frames=gap,
        query_stride=stride,
    )
    np.testing.assert_array_equal(res.per_query["first_rank"], firsts)
    assert res.metrics["rank1"] == pytest.approx(100.0 * np.mean(firsts == 1), abs=1e-9)
    assert res.metrics["rank5"] == pytest.approx(100.0 * np.mean(firsts <= 5), abs=1e-9)
    assert res.metrics["mrr"] == pytest.approx(100.0 * np.mean(1.0 / firsts), abs=1e-9)


@pytest.mark.parametrize(("stride", "gap"), [(3, 1), (5, 2)])
def test_query_stride_matches_installed_reid_package(stride, gap):
    """The same counts from the ``reid`` package itself, when it is installed."""
    pytest.importorskip("reid")
    from reid.data.reassociation import _build_reassociation_candidates
    from reid.data.splits import ReIDSplit

    crops, emb = mot_like(0)
    paths = [
        str(Path("crops") / f"{r.sequence}_{r.label}" / f"{r.sequence}_{int(r.frame):06d}.jpg")
        for r in crops.itertuples()
    ]
    split = ReIDSplit(
        image_paths=paths,
        pids=np.zeros(len(paths), np.int32),
        camids=np.zeros(len(paths), np.int32),
    )
    query, _, mask, meta = _build_reassociation_candidates(
        split, gap_frames=gap, query_stride=stride
    )
    problem = open_inputs(crops, crops, emb, emb, protocol="reassociation").problem(
        gap_frames=gap, query_stride=stride
    )
    theirs_skipped = (
        meta["skipped_missing_future"]
        + meta["skipped_absent_positive"]
        + meta["skipped_insufficient_candidates"]
    )
    assert problem.num_units_skipped == theirs_skipped
    assert problem.num_units - problem.num_units_skipped == len(query.image_paths)
    row_of = {p: i for i, p in enumerate(paths)}
    ours = sorted(int(q) for q in np.flatnonzero(~problem.skip))
    assert sorted(row_of[p] for p in query.image_paths) == ours
    counts = np.bincount(problem.pair_q, minlength=len(crops))[ours]
    assert sorted(counts.tolist()) == sorted(mask.sum(axis=1).tolist())


def test_query_stride_without_stride_frames_is_an_error():
    case = reassociation_case()
    with pytest.raises(
        RankwiseError, match=r"no query row has a frame divisible by query_stride=9"
    ):
        rankwise.evaluate(*case.args(), protocol="reassociation", query_stride=9)


@pytest.mark.parametrize("name", ["query_stride", "gap_frames"])
@pytest.mark.parametrize("value", [0, -2, 2**31, 2**63])
def test_library_refuses_out_of_range(name, value):
    """Positive, and within the frames' range (frame + gap_frames never wraps around)."""
    case = reassociation_case()
    message = rf"^{name} must be an integer in 1\.\.2147483647, got {value}$"
    with pytest.raises(RankwiseError, match=message):
        rankwise.evaluate(*case.args(), protocol="reassociation", **{name: value})


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------


def _inputs(case, folder):
    return [str(x) for kv in case.write(folder).items() for x in kv]


@pytest.mark.parametrize("flag", ["--query-stride", "--gap-frames"])
@pytest.mark.parametrize("value", ["0", "-1", "2147483648"])
def test_cli_refuses_out_of_range(tmp_path, flag, value):
    case = reassociation_case()
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank",
        *_inputs(case, tmp_path),
        "--protocol",
        "reassociation",
        flag,
        value,
        "--out",
        out,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and flag in lines[0], proc.stderr
    assert "an integer in 1..2147483647" in lines[0]
    assert not out.exists()


def test_cli_options_reach_the_ranks_store(tmp_path):
    """--keep-same-camera and --query-stride give the library's numbers and are recorded."""
    reid = reid_case()
    out = tmp_path / "reid.zarr"
    proc = run_rankwise(
        "rank",
        *_inputs(reid, tmp_path / "reid"),
        "--protocol",
        "reid",
        "--keep-same-camera",
        "--distance",
        "euclidean",
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    attrs = dict(zarr.open_group(str(out), mode="r").attrs)
    assert attrs["protocol_options"] == {"junk_labels": ["-1"], "exclude_same_camera": False}
    lib = rankwise.rank(
        *reid.args(), protocol="reid", distance="euclidean", exclude_same_camera=False
    )
    assert attrs["num_skipped"] == lib.attrs["num_skipped"]

    re = reassociation_case()
    out = tmp_path / "re.zarr"
    proc = run_rankwise(
        "evaluate",
        *_inputs(re, tmp_path / "re"),
        "--protocol",
        "reassociation",
        "--query-stride",
        "2",
        "--distance",
        "euclidean",
        "--ks",
        "1,2,3",
    )
    assert proc.returncode == 0, proc.stderr
    ref = brute_evaluate(re, ks=RE_KS, stride=2)
    assert f"num queries: {ref['num_queries']}" in proc.stdout
    assert f"num skipped: {ref['num_skipped']}" in proc.stdout


@pytest.mark.parametrize(
    "protocol, option, message",
    [
        (None, ["--junk-labels", "0"], "--junk-labels applies to protocol reid only, and "
         "without --protocol, recall runs: it would be ignored; pass --protocol reid"),
        ("recall", ["--keep-same-camera"], "--keep-same-camera applies to protocol reid only, "
         "not 'recall'"),
        ("recall", ["--gap-frames", "7"], "--gap-frames applies to protocol reassociation only"),
        ("reid", ["--query-stride", "3"], "--query-stride applies to protocol reassociation "
         "only, not 'reid'"),
        ("reid", ["--shot-repeats", "3"], "--shot-repeats applies with --single-gallery-shot "
         "only"),
        ("reid", ["--shot-seed", "5"], "--shot-seed applies with --single-gallery-shot only"),
    ],
)  # fmt: skip
def test_an_option_the_protocol_ignores_is_refused(tmp_path, protocol, option, message):
    """`--junk-labels 0` under recall kept label 0 without a word; now one line. The
    defaults given explicitly (as the pipeline gives every dataset's options) run."""
    reid = reid_case()
    args = [*_inputs(reid, tmp_path), *(["--protocol", protocol] if protocol else [])]
    proc = run_rankwise("evaluate", *args, *option)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), proc.stderr
    defaults = ["--junk-labels=-1", "--exclude-same-camera", "--gap-frames", "1"]
    defaults += ["--query-stride", "1", "--shot-seed", "0"]
    plain = run_rankwise("evaluate", *args)
    given = run_rankwise("evaluate", *args, *defaults)
    assert given.returncode == 0 and given.stdout == plain.stdout, given.stderr


# ---------------------------------------------------------------------------
# reports name the options that differ from the protocol's defaults
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["recall", "reid", "reassociation", "progressive"])
def test_default_options_are_what_a_default_run_records(protocol, make_case):
    """``options.default_options`` is written separately from ``build_problem``: a
    default run of every protocol must record exactly it (else every default report
    would carry a ``protocol_options`` key, or a changed one would not)."""
    from rankwise.manifest import read_manifest
    from rankwise.options import default_options
    from rankwise.protocols import build_problem

    case = make_case(protocol)
    problem = build_problem(
        read_manifest(case.query, protocol=protocol, role="query"),
        read_manifest(case.gallery, protocol=protocol, role="gallery"),
        protocol,
    )
    assert problem.options == default_options(protocol)


def test_evaluate_names_non_default_options(tmp_path, make_case):
    """A re-ranked, junk-dropping, trapezoid-AP run says so in its JSON and text
    report; a default run keeps exactly DESIGN.md's keys."""
    import json

    from helpers import write_inputs

    case = make_case("reid")
    args = write_inputs(tmp_path, case.query, case.gallery, case.query_emb, case.gallery_emb)
    base = ["evaluate", *args, "--protocol", "reid", "--distance", "euclidean"]
    plain = run_rankwise(*base, "--output", str(tmp_path / "plain.json"))
    assert plain.returncode == 0, plain.stderr
    keys = list(json.loads((tmp_path / "plain.json").read_text()))
    assert keys == [
        "protocol", "distance", "num_queries", "num_skipped", "num_gallery",
        "embedding_dim", "metrics",
    ]  # fmt: skip
    assert "protocol options" not in plain.stdout and "\nap: " not in plain.stdout

    out = tmp_path / "rr.json"
    rr = run_rankwise(
        *base, "--rerank", "6,3,0.3", "--drop-junk", "--keep-same-camera",
        "--ap", "trapezoid", "--output", str(out),
    )  # fmt: skip
    assert rr.returncode == 0, rr.stderr
    report = json.loads(out.read_text())
    assert report["ap"] == "trapezoid"
    assert report["protocol_options"] == {
        "junk_labels": ["-1"],
        "exclude_same_camera": False,
        "rerank": {"k1": 6, "k2": 3, "lambda": 0.3},
        "drop_junk": True,
    }
    assert "\nap: trapezoid\n" in rr.stdout
    assert '"rerank": {"k1": 6, "k2": 3, "lambda": 0.3}' in rr.stdout
    # the Python API's JSON report is the same (it had neither key: read alone, a
    # re-ranked trapezoid-AP result looked like a default run's)
    api = rankwise.evaluate(
        *args[1::2], protocol="reid", distance="euclidean", rerank="6,3,0.3", drop_junk=True,
        exclude_same_camera=False, ap="trapezoid",
    ).to_json()  # fmt: skip
    assert json.loads(json.dumps(api)) == report

    # `rankwise metrics` of the same ranks says the same
    store = tmp_path / "rr.zarr"
    ranked = run_rankwise(
        "rank", *args, "--protocol", "reid", "--distance", "euclidean", "--rerank",
        "6,3,0.3", "--drop-junk", "--keep-same-camera", "--out", str(store),
    )  # fmt: skip
    assert ranked.returncode == 0, ranked.stderr
    scored = run_rankwise("metrics", str(store), "--output", str(tmp_path / "m.json"))
    assert scored.returncode == 0, scored.stderr
    again = json.loads((tmp_path / "m.json").read_text())
    assert again["protocol_options"] == report["protocol_options"]
    assert "ap" not in again
    assert again["metrics"] != report["metrics"]  # trapezoid AP vs standard


@pytest.mark.parametrize("protocol", ["reassociation", "progressive"])
def test_trapezoid_ap_is_refused_where_there_is_no_ap(tmp_path, make_case, cli, protocol):
    """`--ap trapezoid` on a protocol that reports no AP changed no number, yet was
    printed and recorded (and in the pipeline reran metrics and report): refused in
    one line by the library, every command that takes --ap, and the config check."""
    from rankwise import pipeline_config as pc

    case = make_case(protocol)
    with pytest.raises(
        RankwiseError, match=f"ap trapezoid does not apply to protocol '{protocol}'"
    ):
        rankwise.evaluate(*case.args(), ap="trapezoid", **case.kwargs())
    inputs = case.write(tmp_path)
    store = tmp_path / "r.zarr"
    ranked = cli("rank", "--protocol", protocol, "--out", store, options=inputs)
    assert ranked.returncode == 0, ranked.stderr
    commands = [
        ("evaluate", "--protocol", protocol, *[x for item in inputs.items() for x in item]),
        ("metrics", store),
        ("ci", store, "--resamples", "10"),
        ("compare", store, store, "--resamples", "10"),
    ]
    for command in commands:
        proc = cli(*command, "--ap", "trapezoid", "--output", tmp_path / "out.json")
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.strip() == (
            f"error: --ap trapezoid does not apply to protocol '{protocol}': it reports no AP "
            f"({', '.join(get_protocol(protocol).metric_families)}); drop --ap"
        ), command
        assert not (tmp_path / "out.json").exists()
    dataset = {"protocol": protocol, "ap": "trapezoid", "encoders": None}
    with pytest.raises(RankwiseError, match=r"^datasets\.d\.ap: ap trapezoid does not apply"):
        pc.check_reranking({"d": dataset})
    pc.check_reranking({"d": {**dataset, "ap": "standard"}})
