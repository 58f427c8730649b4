"""Multi-query (reid): one pooled query per (label, camera), checked against brute force.

The reference here pools with numpy in plain Python (``math.fsum`` of the members'
float32 rows / n, cast to float32; or the element-wise max), builds the dense distance
matrix and the reid masks of tests/reference.py (plus: no gallery item with a member's
id), and scores each pooled query as torchreid's ``eval_market1501`` does.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr
from helpers import run_rankwise, write_inputs
from reference import distance_matrix, market1501_query, protocol_masks, sorted_matches

import rankwise
from rankwise.errors import RankwiseError
from rankwise.options import schema_differences

KS = (1, 2, 3, 5, 10)
ROOT = Path(__file__).resolve().parents[1]


def multi_case(seed: int, kind: str, *, twins: bool = False):
    """Persons "1".."9" under cameras 1..3 with 1-4 query images per (person, camera),
    gallery images of their own, distractors "0", junk "-1" (copies of query rows),
    exact duplicates across persons; person "9" is only in the gallery under its query
    camera (skipped).  ``twins``: some gallery rows share an id (and label, camera) with
    a non-representative query member."""
    rng = np.random.default_rng(seed)
    dim = 6
    centre = {str(p): rng.integers(-2, 3, dim).astype(np.float32) for p in range(1, 10)}
    if kind == "normal":
        centre = {p: rng.normal(size=dim).astype(np.float32) for p in centre}

    def noisy(c):
        if kind == "int":
            return np.clip(c + rng.integers(-1, 2, dim), -3, 3).astype(np.float32)
        return (c + 0.7 * rng.normal(size=dim)).astype(np.float32)

    q, qe, g, ge = [], [], [], []
    for p in range(1, 9):
        lab = str(p)
        for cam in rng.choice([1, 2, 3], size=rng.integers(1, 3), replace=False):
            for _ in range(rng.integers(1, 5)):
                q.append({"id": f"q{rng.integers(10**6):06d}", "label": lab, "camera": int(cam)})
                qe.append(noisy(centre[lab]))
        for _ in range(rng.integers(1, 6)):
            g.append({"id": f"g{len(g)}", "label": lab, "camera": int(rng.integers(1, 4))})
            ge.append(noisy(centre[lab]))
    q.append({"id": "q9a", "label": "9", "camera": 2})
    qe.append(noisy(centre["9"]))
    q.append({"id": "q9b", "label": "9", "camera": 2})
    qe.append(noisy(centre["9"]))
    g.append({"id": "gp9", "label": "9", "camera": 2})
    ge.append(noisy(centre["9"]))
    for _ in range(8):
        g.append({"id": f"g{len(g)}", "label": "0", "camera": int(rng.integers(1, 4))})
        ge.append(noisy(centre[str(rng.integers(1, 9))]))
    for i in rng.choice(len(q), 5, replace=False):
        g.append({"id": f"g{len(g)}", "label": "-1", "camera": q[i]["camera"]})
        ge.append(qe[i].copy())
    for i in rng.choice(len(g) - 13, 4, replace=False):  # duplicates across persons
        g.append({"id": f"g{len(g)}", "label": str(int(g[i]["label"]) % 8 + 1), "camera": 1})
        ge.append(ge[i].copy())
    if twins:
        table = pd.DataFrame(q)
        for _, rows in table.groupby(["label", "camera"]):
            if len(rows) > 1:
                member = rows.sort_values("id").iloc[-1]  # not the representative
                g.append(dict(member))
                ge.append(qe[int(member.name)].copy())
    return pd.DataFrame(q), pd.DataFrame(g), np.stack(qe), np.stack(ge)


def pool_reference(query, emb, pooling):
    """``{(label, camera): (representative row, member ids, pooled float32 row)}``."""
    out = {}
    for (lab, cam), rows in query.groupby([query["label"].astype(str), query["camera"]]):
        rows = rows.sort_values("id", key=lambda s: s.astype(str))
        x = emb[rows.index.to_numpy()]
        if pooling == "mean":
            pooled = [math.fsum(float(v) for v in x[:, k]) / len(x) for k in range(x.shape[1])]
            vec = np.asarray(pooled, np.float64).astype(np.float32)
        else:
            vec = x.max(axis=0)
        out[(lab, str(cam))] = (int(rows.index[0]), set(rows["id"].astype(str)), vec)
    return out


def brute_multi_query(query, gallery, qe, ge, *, pooling, distance, exclude=True):
    groups = pool_reference(query, qe, pooling)
    reps = sorted(v[0] for v in groups.values())
    by_rep = {v[0]: v for v in groups.values()}
    table = query.iloc[reps].reset_index(drop=True)
    pooled = np.stack([by_rep[r][2] for r in reps])
    valid, relevant = protocol_masks("reid", table, gallery)
    if not exclude:  # same label and camera kept, junk and self still out
        valid, relevant = protocol_masks("recall", table, gallery)
        junk = gallery["label"].astype(str).to_numpy() == "-1"
        valid &= ~junk[None, :]
        relevant &= valid
    gid = gallery["id"].astype(str).to_numpy()
    for i, r in enumerate(reps):
        twin = np.isin(gid, list(by_rep[r][1]))  # any member's id: the same item
        valid[i] &= ~twin
        relevant[i] &= ~twin
    dist = distance_matrix(pooled, ge, distance)
    rows, cmcs, aps, inps, rrs, skipped = [], [], [], [], [], 0
    for i in range(len(reps)):
        raw = sorted_matches(dist[i], valid[i], relevant[i])
        res = market1501_query(raw, max(KS))
        if res is None:
            skipped += 1
            continue
        rows.append(reps[i])
        cmcs.append(res[0])
        aps.append(res[1])
        inps.append(res[2])
        rrs.append(1.0 / (np.flatnonzero(raw)[0] + 1))
    cmc = np.mean(cmcs, axis=0)
    metrics = {f"rank{k}": 100 * cmc[k - 1] for k in KS}
    metrics |= {"map": 100 * np.mean(aps), "minp": 100 * np.mean(inps), "mrr": 100 * np.mean(rrs)}
    return {"rows": np.asarray(rows), "skipped": skipped, "metrics": metrics, "groups": groups}


def check(result, ref):
    assert result.num_queries == len(ref["rows"])
    assert result.num_skipped == ref["skipped"]
    np.testing.assert_array_equal(result.per_query["query_index"], ref["rows"])
    for name, value in ref["metrics"].items():
        assert result.metrics[name] == pytest.approx(value, abs=1e-9), name


@pytest.mark.parametrize("pooling", ["mean", "max"])
@pytest.mark.parametrize(("distance", "kind"), [("euclidean", "int"), ("cosine", "normal")])
@pytest.mark.parametrize("seed", [0, 1])
def test_multi_query_matches_brute_force(pooling, distance, kind, seed):
    query, gallery, qe, ge = multi_case(seed, kind)
    ref = brute_multi_query(query, gallery, qe, ge, pooling=pooling, distance=distance)
    assert len(ref["groups"]) < len(query)  # several images per (label, camera)
    assert ref["skipped"] >= 1  # person 9
    result = rankwise.evaluate(
        query, gallery, qe, ge, protocol="reid", distance=distance, ks=KS, multi_query=pooling
    )
    check(result, ref)
    # tiles never change a number
    tiled = rankwise.evaluate(
        query,
        gallery,
        qe,
        ge,
        protocol="reid",
        distance=distance,
        ks=KS,
        multi_query=pooling,
        query_block=2,
        gallery_chunk=5,
    )
    assert tiled.metrics == result.metrics


@pytest.mark.parametrize("exclude", [True, False])
def test_members_ids_are_never_ranked(exclude):
    """A gallery item with any member's id is the same item: never its own match."""
    query, gallery, qe, ge = multi_case(3, "int", twins=True)
    ref = brute_multi_query(
        query, gallery, qe, ge, pooling="mean", distance="euclidean", exclude=exclude
    )
    result = rankwise.evaluate(
        query,
        gallery,
        qe,
        ge,
        protocol="reid",
        distance="euclidean",
        ks=KS,
        multi_query="mean",
        exclude_same_camera=exclude,
    )
    check(result, ref)


@pytest.mark.parametrize("repeats", ["exact", 10])
def test_single_gallery_shot_never_draws_a_member(repeats):
    """Single-gallery-shot with multi-query: a gallery item with a member's id is the
    member itself, never drawn as the pooled query's match (by hand: only gA may be
    drawn; it ties gC at cosine distance 1, and the tie counts against the query)."""
    query = pd.DataFrame({"id": ["qa0", "qa1", "qa2"], "label": ["A"] * 3, "camera": ["c1"] * 3})
    qe = np.array([[1, 0, 0, 0], [1, 0.1, 0, 0], [1, -0.1, 0, 0]], np.float32)
    gallery = pd.DataFrame(
        {
            "id": ["qa1", "qa2", "gA", "gB", "gC"],
            "label": ["A", "A", "A", "B", "C"],
            "camera": ["c1", "c1", "c2", "c2", "c2"],
        }
    )
    ge = np.array(
        [[1, 0.1, 0, 0], [1, -0.1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0, 0], [0, 1, 0, 0]],
        np.float32,
    )
    options = dict(protocol="reid", distance="cosine", multi_query="mean", ks=(1,))
    for exclude in (False, True):
        shot = rankwise.evaluate(
            query,
            gallery,
            qe,
            ge,
            single_gallery_shot=True,
            shot_repeats=repeats,
            exclude_same_camera=exclude,
            **options,
        )
        assert shot.metrics["rank1"] == 0.0
        assert math.isclose(shot.metrics["mrr"], 100 / 3, rel_tol=1e-12)
        # and exactly as if the members were not in the gallery at all
        alone = rankwise.evaluate(
            query,
            gallery.iloc[2:],
            qe,
            ge[2:],
            single_gallery_shot=True,
            shot_repeats=repeats,
            exclude_same_camera=exclude,
            **options,
        )
        assert shot.metrics == alone.metrics


def test_member_twin_with_another_label_is_an_error():
    """The same id is the same item: a gallery twin of a member must carry its label."""
    query, gallery, qe, ge = multi_case(3, "int", twins=True)
    twin = int(np.flatnonzero(gallery["id"].isin(query["id"]))[0])
    gallery.loc[twin, "label"] = "999999"
    message = rf"row {twin} \(0-based\): id .* differs from the query"
    with pytest.raises(RankwiseError, match=message):
        rankwise.evaluate(query, gallery, qe, ge, protocol="reid", multi_query="mean")


def test_multi_query_is_a_function_of_the_content():
    """Permuting query rows (and gallery rows) changes no number; the stored
    representatives are the same items."""
    query, gallery, qe, ge = multi_case(4, "normal")
    base = rankwise.evaluate(
        query, gallery, qe, ge, protocol="reid", distance="cosine", ks=KS, multi_query="mean"
    )
    rng = np.random.default_rng(5)
    for _ in range(3):
        qp, gp = rng.permutation(len(query)), rng.permutation(len(gallery))
        out = rankwise.evaluate(
            query.iloc[qp].reset_index(drop=True),
            gallery.iloc[gp].reset_index(drop=True),
            qe[qp],
            ge[gp],
            protocol="reid",
            distance="cosine",
            ks=KS,
            multi_query="mean",
        )
        assert out.metrics == base.metrics  # the same bits (fsum means)
        reps = set(query["id"].to_numpy()[base.per_query["query_index"]])
        assert set(query["id"].to_numpy()[qp][out.per_query["query_index"]]) == reps


def test_single_member_groups_equal_single_query():
    """When every (label, camera) has one query image, multi-query is single-query."""
    query, gallery, qe, ge = multi_case(6, "int")
    one = query.drop_duplicates(["label", "camera"])
    rows = one.index.to_numpy()
    args = (one.reset_index(drop=True), gallery, qe[rows], ge)
    single = rankwise.evaluate(*args, protocol="reid", distance="euclidean", ks=KS)
    for pooling in ("mean", "max"):
        pooled = rankwise.evaluate(
            *args, protocol="reid", distance="euclidean", ks=KS, multi_query=pooling
        )
        assert pooled.metrics == single.metrics


def test_toy_pooling_by_hand():
    """Two query images of person a under camera 1 pool to their mean (0, 1) / max (1, 2)."""
    query = pd.DataFrame({"id": ["q1", "q0"], "label": ["a", "a"], "camera": [1, 1]})
    qe = np.array([[1.0, 0.0], [-1.0, 2.0]], np.float32)
    gallery = pd.DataFrame({"id": ["g0", "g1", "g2"], "label": ["a", "b", "b"], "camera": [2] * 3})
    ge = np.array([[0.0, 3.0], [0.0, 1.0], [1.0, 2.0]], np.float32)
    mean = rankwise.evaluate(
        query, gallery, qe, ge, protocol="reid", distance="euclidean", multi_query="mean"
    )
    # mean (0, 1): b@(0,1) at 0, b@(1,2) at sqrt 2, a@(0,3) at 2 -> rank 3
    assert mean.num_queries == 1 and mean.per_query["first_rank"].tolist() == [3]
    assert mean.per_query["query_index"].tolist() == [1]  # q0: the smallest id
    mx = rankwise.evaluate(
        query, gallery, qe, ge, protocol="reid", distance="euclidean", multi_query="max"
    )
    # max (1, 2): b@(1,2) at 0, a@(0,3) and b@(0,1) both at sqrt 2 -> tie counts against: 3
    assert mx.per_query["first_rank"].tolist() == [3]


def test_library_errors():
    query, gallery, qe, ge = multi_case(0, "int")
    with pytest.raises(RankwiseError, match=r"^multi_query 'mean' applies to protocol 'reid'"):
        rankwise.evaluate(query, gallery, qe, ge, protocol="recall", multi_query="mean")
    with pytest.raises(RankwiseError, match=r"^multi_query must be one of none, mean, max"):
        rankwise.evaluate(query, gallery, qe, ge, protocol="reid", multi_query="median")
    zero = qe.copy()
    group = (query["label"] == query["label"][0]) & (query["camera"] == query["camera"][0])
    zero[group.to_numpy()] = 0.0
    with pytest.raises(RankwiseError, match=r"is a zero vector, which has no cosine distance"):
        rankwise.evaluate(query, gallery, zero, ge, protocol="reid", multi_query="mean")


def test_zero_pool_advice_names_a_pooling_that_can_help():
    # max of (-1, 0) and (0, -1) is zero, their mean is not: the advice must not be 'max'
    query = pd.DataFrame({"id": ["q0", "q1", "q2"], "label": [1, 1, 2], "camera": [1, 1, 1]})
    gallery = pd.DataFrame({"id": ["g0", "g1"], "label": [1, 2], "camera": [2, 2]})
    qe = np.array([[-1, 0], [0, -1], [0, 1]], np.float32)
    ge = np.array([[1, 0], [0, 1]], np.float32)
    with pytest.raises(RankwiseError, match=r"zero vector.*; use multi_query 'mean' or distance"):
        rankwise.evaluate(query, gallery, qe, ge, protocol="reid", multi_query="max")
    # a one-member group whose row is zero: neither pooling helps
    qe[2] = 0.0
    query.loc[1, "label"] = 3
    with pytest.raises(
        RankwiseError, match=r"\(lines 2 \(0-based\)\) is a zero vector.*; fix that row or"
    ):
        rankwise.evaluate(query, gallery, qe, ge, protocol="reid", multi_query="mean")


@pytest.mark.parametrize(
    ("args", "camera", "needle"),
    [
        (["--protocol", "recall", "--multi-query", "mean"], True, "applies to protocol 'reid'"),
        (["--protocol", "reid", "--multi-query", "median"], True, "--multi-query must be one of"),
        (["--protocol", "reid", "--multi-query", "max"], False, "camera"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, camera, needle):
    inputs = write_inputs(tmp_path, *multi_case(0, "int"), camera=camera)
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise("rank", *inputs, *args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not out.exists()


def test_cli_records_multi_query(tmp_path):
    """--multi-query reaches the ranks store (option, members) and the metrics JSON."""
    query, gallery, qe, ge = multi_case(2, "int")
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank",
        *write_inputs(tmp_path, query, gallery, qe, ge),
        "--protocol",
        "reid",
        "--distance",
        "euclidean",
        "--multi-query",
        "max",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    group = zarr.open_group(str(out), mode="r")
    assert group.attrs["protocol_options"]["multi_query"] == "max"
    ref = brute_multi_query(query, gallery, qe, ge, pooling="max", distance="euclidean")
    rows = np.asarray(group["query_index"][...])
    np.testing.assert_array_equal(rows, ref["rows"])
    offsets, members = np.asarray(group["members_offsets"][...]), np.asarray(group["members"][...])
    by_rep = {v[0]: v[1] for v in ref["groups"].values()}
    for i, r in enumerate(rows):
        ids = query["id"].to_numpy()[members[offsets[i] : offsets[i + 1]]]
        assert list(ids) == sorted(by_rep[int(r)])
    report = tmp_path / "m.json"
    proc = run_rankwise("metrics", str(out), "--ks", "1,2,3,5,10", "--output", str(report))
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(report.read_text())
    assert doc["provenance"]["protocol_options"]["multi_query"] == "max"
    for name, value in ref["metrics"].items():
        assert doc["metrics"][name] == pytest.approx(value, abs=1e-9), name


def test_schema_fragment():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    assert schema_differences(schema) == []
    node = schema["$defs"]["dataset"]["properties"]["multi_query"]
    assert node["enum"] == ["none", "mean", "max"] and node["default"] == "none"


@pytest.mark.parametrize("twins", [False, True])
def test_neighbours_compare_the_pooled_query(tmp_path, twins):
    """The report's top items of a pooled query (rankwise.neighbours) use the pooled
    vector: its first relevant item sits at the stored first rank (members' gallery
    twins are not listed)."""
    from rankwise.neighbours import top_items

    query, gallery, qe, ge = multi_case(1, "int", twins=twins)
    write_inputs(tmp_path, query, gallery, qe, ge)
    files = [str(tmp_path / f) for f in ("q.csv", "g.csv", "q.npy", "g.npy")]
    # twins share their member's camera: only without the camera rule can they show up
    options = dict(protocol="reid", distance="euclidean", multi_query="mean")
    options["exclude_same_camera"] = not twins
    result = rankwise.evaluate(*files, ks=KS, **options)
    rows = result.per_query["query_index"]
    tops = top_items(*files, rows, k=60, **options)
    for top, first in zip(tops, result.per_query["first_rank"], strict=True):
        assert int(np.flatnonzero(top["relevant"])[0]) + 1 == first
    smallest = query.groupby(["label", "camera"])["id"].transform("min")
    member = int(np.flatnonzero(query["id"] != smallest)[0])  # not a representative
    with pytest.raises(RankwiseError, match="not the representative"):
        top_items(*files, [member], protocol="reid", distance="euclidean", multi_query="mean")


def test_market1501_gt_bbox_is_the_multi_query_set(tmp_path):
    """Market's multi-query setting = the market1501 loader with ``query_folder: gt_bbox``
    + ``multi_query``: one pooled query per (person, camera) of gt_bbox.  A generated tree
    in the real naming: query/ holds one image per test (person, camera), gt_bbox/ holds
    those and more boxes of the same (person, camera), plus a training person."""
    from PIL import Image

    from rankwise.datasets import prepare_dataset

    root = tmp_path / "Market-1501-v15.09.15"

    def image(folder, name):
        (root / folder).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((8, 4, 3), np.uint8)).save(root / folder / name)

    queries = ["0002_c1s1_000451_00.jpg", "0002_c3s1_000800_00.jpg", "0007_c2s2_012345_00.jpg"]
    for name in queries:
        image("query", name)
        image("gt_bbox", name)
    for name in ["0002_c1s1_000460_00.jpg", "0002_c1s1_000470_00.jpg", "0007_c2s2_012350_00.jpg"]:
        image("gt_bbox", name)
    image("gt_bbox", "0001_c1s1_000001_00.jpg")  # a training person: no gallery match
    gallery = [
        "0002_c2s1_000500_01.jpg",
        "0002_c1s1_000465_02.jpg",
        "0007_c6s4_002201_01.jpg",
        "0007_c2s2_012340_01.jpg",
        "0000_c2s1_000100_01.jpg",
        "-1_c1s1_000200_03.jpg",
    ]
    for name in gallery:
        image("bounding_box_test", name)
    out = tmp_path / "manifests"
    prepare_dataset("market1501", {"root": str(root), "query_folder": "gt_bbox"}, out)
    query = pd.read_csv(out / "query.csv", dtype={"label": str, "id": str})
    gal = pd.read_csv(out / "gallery.csv", dtype={"label": str, "id": str})
    assert len(query) == 7
    rng = np.random.default_rng(0)
    qe = rng.integers(-2, 3, (len(query), 4)).astype(np.float32)
    ge = rng.integers(-2, 3, (len(gal), 4)).astype(np.float32)
    result = rankwise.evaluate(
        query, gal, qe, ge, protocol="reid", distance="euclidean", ks=KS, multi_query="mean"
    )
    # groups: 2@c1 (3 boxes), 2@c3, 7@c2 (2 boxes) = the three query/ images; 1@c1 skipped
    assert result.num_queries == len(queries) and result.num_skipped == 1
    reps = query["id"].to_numpy()[result.per_query["query_index"]]
    assert sorted(reps) == sorted(Path(n).stem for n in queries)
    ref = brute_multi_query(query, gal, qe, ge, pooling="mean", distance="euclidean")
    check(result, ref)


def test_zero_mean_names_the_manifest_lines_after_dropped_rows(tmp_path: Path):
    """With id-keyed query features that left a row out (on_missing: drop), the zero-mean
    message names the group's lines in the manifest, not positions among the kept rows."""
    (tmp_path / "q.csv").write_text("id,label,camera\nq0,1,1\nq1,6,1\nq2,6,1\nq3,2,1\n")
    (tmp_path / "g.csv").write_text("id,label,camera\ng0,1,2\ng1,6,2\ng2,2,2\n")
    np.save(tmp_path / "qf.npy", np.array([[1, 2, 3], [-1, -2, -3], [0, 1, 0]], np.float32))
    (tmp_path / "qids.txt").write_text("q1\nq2\nq3\n")
    np.save(tmp_path / "g.npy", np.eye(3, dtype=np.float32))
    options = {"path": str(tmp_path / "qf.npy"), "ids": str(tmp_path / "qids.txt"),
               "on_missing": "drop"}  # fmt: skip
    import json

    proc = run_rankwise(
        "encode", "--kind", "precomputed", "--options", json.dumps(options),
        "--manifest", str(tmp_path / "q.csv"), "--out", str(tmp_path / "q.zarr"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(RankwiseError, match=r"\(lines 3, 4\) is a zero vector"):
        rankwise.evaluate(tmp_path / "q.csv", tmp_path / "g.csv", tmp_path / "q.zarr",
                          tmp_path / "g.npy", protocol="reid", multi_query="mean")  # fmt: skip


def test_pooled_norm_out_of_range_names_the_group(tmp_path: Path):
    """Under euclidean, a pooled row beyond the norm range (max pooling of rows along
    different axes: sqrt(2) x 2^60) names the manifest and the group's lines, not a
    position among the pooled rows."""
    (tmp_path / "q.csv").write_text("id,label,camera\nq0,5,1\nq1,0,1\nq2,0,1\n")
    (tmp_path / "g.csv").write_text("id,label,camera\ng0,0,2\ng1,5,2\n")
    s = 2.0**60
    np.save(tmp_path / "q.npy", np.array([[1, 1, 0], [s, 0, 0], [0, s, 0]], np.float32))
    np.save(tmp_path / "g.npy", np.array([[1, 0, 0], [0, 1, 0]], np.float32))
    inputs = [str(tmp_path / n) for n in ("q.csv", "g.csv", "q.npy", "g.npy")]
    with pytest.raises(
        RankwiseError, match=r"q\.csv: the max .* \(lines 3, 4\) has norm 1\.63e\+18"
    ):
        rankwise.evaluate(*inputs, protocol="reid", distance="euclidean", multi_query="max")
    # the mean of the same rows lies inside the range: ranked as before
    rankwise.evaluate(*inputs, protocol="reid", distance="euclidean", multi_query="mean")
