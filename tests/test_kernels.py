"""The tile kernels on hand-built tiles, and count_tile's validity rule against dense_masks.

Hand-computed cases use small integer embeddings, whose squared L2 distances and dot
products are exact in float32, so every expected count below is worked out by hand.
"""

from types import SimpleNamespace

import numpy as np
import pytest
from helpers import c_kernels

from rankwise import kernels
from rankwise.protocols import dense_masks
from rankwise.ranking import _sum_counts


@pytest.fixture(params=["numba", "native"])
def both_kernel_sets(request, monkeypatch):
    """Run the test on numba's kernels and again on their C counterparts
    (rankwise.native), swapped into this module's ``kernels``: same expected numbers."""
    if request.param == "native":
        built = c_kernels()
        for name in ("prepare_rows", "pair_keys", "count_tile", "ranks_from_hist"):
            monkeypatch.setattr(kernels, name, getattr(built, name))
    return request.param


# ---------------------------------------------------------------- a hand-built tile
#
# Two queries, seven gallery items, D = 2, euclidean (key = squared L2 distance).
#
#   gallery   row     label  id    junk | key for q0=(0,0) A  | key for q1=(1,1) B
#   g0        (1,0)   A      g0         | 1  relevant         | 1  non-relevant
#   g1        (1,1)   B      g1         | 2  non-relevant     | 0  relevant
#   g2        (0,1)   B      g2         | 1  non-relevant     | 1  relevant
#   g3        (2,0)   A      g3         | 4  relevant         | 2  non-relevant
#   g4        (0,3)   B      g4    yes  | 9  (junk)           | 5  (junk)
#   g5        (3,0)   B      g5         | 9  non-relevant     | 5  relevant
#   g6        (0,0)   B      q0         | 0  (q0 itself)      | 2  relevant
#
# q0: thresholds [1, 4].  Non-relevant valid items: g2 (1) in (-inf, 1]; g1 (2) in
#     (1, 4]; g5 (9) behind every threshold.  hist = [1, 1]; ranks 1+1+0 = 2, 1+2+1 = 4.
#     Without self-exclusion g6 (key 0) counts too: hist = [2, 1].
# q1: thresholds [0, 1, 2, 5].  Non-relevant valid: g0 (1) in (0, 1]; g3 (2) in (1, 2].
#     hist = [0, 1, 1, 0]; ranks 1, 1+1+1 = 3, 1+2+2 = 5, 1+2+3 = 6.

QROWS = np.array([[0, 0], [1, 1]], np.float32)
GROWS = np.array([[1, 0], [1, 1], [0, 1], [2, 0], [0, 3], [3, 0], [0, 0]], np.float32)
QLAB, GLAB = np.array([0, 1]), np.array([0, 1, 1, 0, 1, 1, 1])
QID, GID = np.array([0, 1]), np.array([2, 3, 4, 5, 6, 7, 0])
GJUNK = np.array([False, False, False, False, True, False, False])
THR = np.array([1.0, 4.0, 0.0, 1.0, 2.0, 5.0])
TOFF = np.array([0, 2, 6])


def _count(qrows, grows, qlab, qid, glab, gid, gjunk, thr, toff, exclude_self, cosine):
    qrows, qsq, _, _ = kernels.prepare_rows(qrows, cosine)
    grows, gsq, _, _ = kernels.prepare_rows(grows, cosine)
    sim = qrows @ grows.T
    return kernels.count_tile(
        sim,
        qrows,
        qsq,
        qlab.astype(np.int64),
        qid.astype(np.int64),
        grows,
        gsq,
        glab.astype(np.int64),
        gid.astype(np.int64),
        gjunk,
        thr,
        toff.astype(np.int64),
        exclude_self,
        cosine,
        kernels.error_bound_factor(qrows.shape[1]),
    )


@pytest.mark.usefixtures("both_kernel_sets")
def test_count_tile_hand_computed():
    hist = _count(QROWS, GROWS, QLAB, QID, GLAB, GID, GJUNK, THR, TOFF, True, False)
    np.testing.assert_array_equal(hist, [1, 1, 0, 1, 1, 0])


@pytest.mark.usefixtures("both_kernel_sets")
def test_count_tile_without_self_exclusion_counts_the_query_item():
    hist = _count(QROWS, GROWS, QLAB, QID, GLAB, GID, GJUNK, THR, TOFF, False, False)
    np.testing.assert_array_equal(hist, [2, 1, 0, 1, 1, 0])


@pytest.mark.usefixtures("both_kernel_sets")
def test_count_tile_split_gallery_sums_to_the_whole():
    """Counting per gallery chunk and combining with ranking._sum_counts gives the whole tile's
    counts (the engine's per tile + combine steps)."""
    parts = [
        _count(
            QROWS, GROWS[a:b], QLAB, QID, GLAB[a:b], GID[a:b], GJUNK[a:b], THR, TOFF, True, False
        )
        for a, b in ((0, 3), (3, 4), (4, 7))
    ]
    before = [p.copy() for p in parts]
    np.testing.assert_array_equal(_sum_counts(parts), [1, 1, 0, 1, 1, 0])
    for part, copy in zip(parts, before, strict=True):  # inputs are not modified
        np.testing.assert_array_equal(part, copy)


@pytest.mark.usefixtures("both_kernel_sets")
def test_count_tile_cosine_hand_computed():
    """Cosine, key = -cos.  Query (1, 0) label A; gallery at angles 0, 45, 90, 180 deg.

    g0 (2,0) A relevant, key -1.  g1 (1,1) B key -0.707; g2 (0,5) B key 0;
    g3 (-1,0) B key 1; g4 (3,0) B key -1 (ties with g0: counted ahead of it).
    Threshold [-1]: hist = [1] (g4); rank 2.  With threshold list [-1, 0] (g2 made
    relevant by its label): g1 is in (-1, 0] -> hist [1, 1]."""
    q = np.array([[1, 0]], np.float32)
    g = np.array([[2, 0], [1, 1], [0, 5], [-1, 0], [3, 0]], np.float32)
    ids, junk = np.arange(1, 6), np.zeros(5, bool)
    hist = _count(
        q,
        g,
        np.array([0]),
        np.array([0]),
        np.array([0, 1, 1, 1, 1]),
        ids,
        junk,
        np.array([-1.0]),
        np.array([0, 1]),
        True,
        True,
    )
    np.testing.assert_array_equal(hist, [1])
    hist = _count(
        q,
        g,
        np.array([0]),
        np.array([0]),
        np.array([0, 1, 0, 1, 1]),
        ids,
        junk,
        np.array([-1.0, 0.0]),
        np.array([0, 2]),
        True,
        True,
    )
    np.testing.assert_array_equal(hist, [1, 1])
    assert kernels.ranks_from_hist(hist, np.array([0, 2])).tolist() == [2, 4]


@pytest.mark.usefixtures("both_kernel_sets")
def test_ranks_from_hist_hand_computed():
    hist = np.array([1, 1, 0, 1, 1, 0])
    np.testing.assert_array_equal(kernels.ranks_from_hist(hist, TOFF), [2, 4, 1, 3, 5, 6])
    # a query with no threshold contributes nothing; zeros give 1, 2, 3
    np.testing.assert_array_equal(
        kernels.ranks_from_hist(np.array([0, 0, 0, 4]), np.array([0, 0, 3, 3, 4])), [1, 2, 3, 5]
    )


def test_rank_candidates_hand_computed():
    """query 0: relevant 0.5; non-relevant 0.2, 0.5 at or ahead -> rank 3.
    query 1: relevant 1.0; non-relevant 1.0 (a tie counts against) -> rank 2.
    query 2: relevant 0.1, 0.3; non-relevant 0.3 -> ranks 1, 1+1+1 = 3.
    query 3: no relevant candidate -> no rank."""
    offsets = np.array([0, 3, 5, 8, 10])
    keys = np.array([0.5, 0.2, 0.5, 1.0, 1.0, 0.3, 0.1, 0.3, 0.0, 0.4])
    relevant = np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0], bool)
    rank_off, ranks = kernels.rank_candidates(offsets, keys, relevant)
    np.testing.assert_array_equal(rank_off, [0, 1, 2, 4, 4])
    np.testing.assert_array_equal(ranks, [3, 2, 1, 3])


# ---------------------------------------------------------------- the validity rule


@pytest.mark.usefixtures("both_kernel_sets")
@pytest.mark.parametrize("cosine", [False, True])
@pytest.mark.parametrize("exclude_self, cameras", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("n_g", [60, 64, 129])
def test_count_tile_applies_dense_masks(cosine, exclude_self, cameras, n_g):
    """count_tile's counts equal a brute-force count whose "valid, non-relevant" and
    thresholds come from protocols.dense_masks: the kernel's inline rule and the
    one stated rule agree (random codes with many collisions, integer rows with ties).
    Gallery sizes around count_tile's 64-item mask words: part of one, exactly one, two
    and one item."""
    rng = np.random.default_rng(11 + cosine + 2 * exclude_self + 4 * cameras + 8 * n_g)
    n_q, dim = 9, 3
    codes = SimpleNamespace(
        qlab=rng.integers(0, 4, n_q),
        glab=rng.integers(0, 4, n_g),
        qid=rng.integers(0, 20, n_q),
        gid=rng.permutation(n_g + 20)[:n_g],
        gjunk=rng.random(n_g) < 0.15,
        exclude_self=exclude_self,
        qcam=rng.integers(0, 2, n_q) if cameras else None,
        gcam=rng.integers(0, 2, n_g) if cameras else None,
    )
    qe = rng.integers(-2, 3, (n_q, dim)).astype(np.float32)
    ge = rng.integers(-2, 3, (n_g, dim)).astype(np.float32)
    qe[~qe.any(1)] = 1  # no zero rows: they have no cosine distance
    ge[~ge.any(1)] = 1
    qp, _, _, _ = kernels.prepare_rows(qe, cosine)
    gp, _, _, _ = kernels.prepare_rows(ge, cosine)
    key = np.array(
        [
            [kernels.pair_keys(qp, gp, np.array([i]), np.array([j]), cosine)[0] for j in range(n_g)]
            for i in range(n_q)
        ]
    )
    valid, relevant = dense_masks(codes, np.arange(n_q)[:, None], np.arange(n_g)[None, :])
    thr = [np.sort(key[i, relevant[i]]) for i in range(n_q)]
    toff = np.concatenate([[0], np.cumsum([len(t) for t in thr])])
    flat = np.concatenate(thr)
    hist = _count(
        qe,
        ge,
        codes.qlab,
        codes.qid,
        codes.glab,
        codes.gid,
        codes.gjunk,
        flat,
        toff,
        exclude_self,
        cosine,
    )
    other = valid & ~relevant
    for i in range(n_q):
        ahead = np.array([(key[i, other[i]] <= t).sum() for t in thr[i]], np.int64)
        np.testing.assert_array_equal(np.cumsum(hist[toff[i] : toff[i + 1]]), ahead)


@pytest.mark.usefixtures("both_kernel_sets")
@pytest.mark.parametrize("cosine", [False, True])
@pytest.mark.parametrize("exclude_self", [True, False])
def test_count_tile_equals_brute_force_on_every_path(cosine, exclude_self):
    """count_tile against canonical keys and dense_masks, on data that sends items down
    each of its paths: clustered float rows (items settled from float32, items between
    the float32 bounds, items too close to call with their own bound), gallery rows
    duplicating relevant rows under another label (exact ties: the canonical key decides;
    more of them than gallery items, so the tile's list of open pairs grows), a label with
    more than 64 relevant items (binary search over the thresholds), rows where most
    items are ahead of the deepest relevant one and rows where few are, junk items, and
    the query's own id in the gallery."""
    rng = np.random.default_rng(5 + cosine + 2 * exclude_self)
    n_q, n_g, dim, n_lab = 24, 400, 16, 6
    centres = 3.0 * rng.standard_normal((n_lab, dim))
    glab = rng.integers(0, n_lab, n_g)
    glab[:90] = 0  # label 0: > 64 relevant items for its queries
    qlab = rng.integers(0, n_lab, n_q)
    qlab[:4] = 0
    qlab[4:12] = 1
    spread = np.where(np.arange(n_q) % 2 == 0, 0.3, 3.0)[:, None]  # easy and hard rows
    qe = (centres[qlab] + spread * rng.standard_normal((n_q, dim))).astype(np.float32)
    ge = (centres[glab] + 0.8 * rng.standard_normal((n_g, dim))).astype(np.float32)
    # 100 gallery rows copy relevant rows of label 1 under label 2: exact ties with
    # thresholds of every label-1 query
    src_rows = np.flatnonzero(glab == 1)[:4]
    ge[300:400] = ge[np.resize(src_rows, 100)]
    glab[300:400] = 2
    qid = rng.integers(0, 10_000, n_q)
    gid = rng.permutation(10_000)[:n_g] + 10_000
    gid[:n_q:2] = qid[::2]  # some queries' own items are in the gallery
    codes = SimpleNamespace(
        qlab=qlab,
        glab=glab,
        qid=qid,
        gid=gid,
        gjunk=rng.random(n_g) < 0.05,
        exclude_self=exclude_self,
        qcam=None,
        gcam=None,
    )
    qp, _, _, _ = kernels.prepare_rows(qe, cosine)
    gp, _, _, _ = kernels.prepare_rows(ge, cosine)
    pq, pg = np.repeat(np.arange(n_q), n_g), np.tile(np.arange(n_g), n_q)
    key = kernels.pair_keys(qp, gp, pq, pg, cosine).reshape(n_q, n_g)
    valid, relevant = dense_masks(codes, np.arange(n_q)[:, None], np.arange(n_g)[None, :])
    thr = [np.sort(key[i, relevant[i]]) for i in range(n_q)]
    assert max(len(t) for t in thr) > 64
    toff = np.concatenate([[0], np.cumsum([len(t) for t in thr])])
    other = valid & ~relevant
    ties = sum(np.isin(key[i, other[i]], thr[i]).sum() for i in range(n_q))
    assert ties > n_g  # more exact ties than gallery items
    hist = _count(
        qe, ge, qlab, qid, glab, gid, codes.gjunk, np.concatenate(thr), toff, exclude_self, cosine
    )
    for i in range(n_q):
        ahead = np.array([(key[i, other[i]] <= t).sum() for t in thr[i]], np.int64)
        np.testing.assert_array_equal(np.cumsum(hist[toff[i] : toff[i + 1]]), ahead)
    # rows with few and rows with most items ahead of their deepest threshold
    deepest = [(key[i, other[i]] <= thr[i][-1]).mean() if len(thr[i]) else 0 for i in range(n_q)]
    assert min(deepest) < 1 / 8 < max(deepest)


@pytest.mark.usefixtures("both_kernel_sets")
@pytest.mark.parametrize("cosine", [False, True])
def test_count_tile_decides_near_ties_by_the_canonical_key(cosine):
    """Non-relevant rows that permute a relevant row's coordinates, for queries of equal
    coordinates: every term of the key is the same, only the order of the sequential sum
    differs, so their canonical keys equal the threshold or miss it by an ulp either way
    (entries spread over 12 orders of magnitude).  Neither float32 nor a float64 sum in
    another order can tell them apart: only the canonical key gives the brute force's
    counts.  Four queries x 300 such pairs also outgrow the tile's first list of open
    pairs (one entry per gallery item)."""
    rng = np.random.default_rng(17)
    dim, n_perm, n_q = 37, 300, 4
    rel = (rng.standard_normal(dim) * 10.0 ** rng.integers(-6, 6, dim)).astype(np.float32)
    ge = np.vstack([rel] + [rng.permutation(rel) for _ in range(n_perm)]).astype(np.float32)
    qe = np.ones((n_q, dim), np.float32)
    glab = np.array([0] + [1] * n_perm)
    qp, _, _, _ = kernels.prepare_rows(qe, cosine)
    gp, _, _, _ = kernels.prepare_rows(ge, cosine)
    n_g = len(ge)
    key = kernels.pair_keys(
        qp, gp, np.zeros(n_g, np.int64), np.arange(n_g), cosine
    )  # the same for every query
    t = key[0]
    assert (key[1:] < t).any() and (key[1:] > t).any() and (key[1:] == t).any()
    hist = _count(
        qe,
        ge,
        np.zeros(n_q, np.int64),
        np.arange(n_q),
        glab,
        np.arange(n_g) + n_q,
        np.zeros(n_g, bool),
        np.full(n_q, t),
        np.arange(n_q + 1),
        True,
        cosine,
    )
    np.testing.assert_array_equal(hist, np.full(n_q, (key[1:] <= t).sum()))


@pytest.mark.parametrize("protocol", ["recall", "reid", "progressive"])
def test_problem_masks_follow_design_table(protocol):
    """build_problem's relevant pairs and Problem.valid_relevant, both from dense_masks,
    against DESIGN.md's table written out pair by pair in plain Python."""
    import pandas as pd

    from rankwise.protocols import build_problem

    rng = np.random.default_rng(3)
    n_q, n_g = 8, 30
    query = pd.DataFrame(
        {
            "id": [f"i{k}" for k in rng.permutation(40)[:n_q]],
            "label": rng.choice(["1", "2", "-1", "0"], n_q),
            "camera": rng.choice(["a", "b"], n_q),
            "sketch": [f"s{k}" for k in range(n_q)],
            "step": [1] * n_q,
        }
    )
    gallery = pd.DataFrame(
        {
            "id": [f"i{k}" for k in rng.permutation(40)[:n_g]],
            "label": rng.choice(["1", "2", "-1", "0"], n_g),
            "camera": rng.choice(["a", "b"], n_g),
        }
    )
    # an id in both is one item (its own match never): one label, as build_problem demands
    shared = gallery["id"].isin(query["id"])
    gallery.loc[shared, "label"] = gallery.loc[shared, "id"].map(
        dict(zip(query["id"], query["label"], strict=True))
    )
    assert shared.sum() >= 3  # self-exclusion is exercised
    problem = build_problem(query, gallery, protocol, junk_labels=("-1",))

    def valid(q, g):
        if protocol == "progressive":
            return True
        if gallery.id[g] == query.id[q]:
            return False
        if protocol == "reid":
            return not (
                gallery.label[g] == "-1"
                or (gallery.label[g] == query.label[q] and gallery.camera[g] == query.camera[q])
            )
        return True

    pairs = set(zip(problem.pair_q.tolist(), problem.pair_g.tolist(), strict=True))
    for q in range(n_q):
        v, r = problem.valid_relevant(q, 0, n_g)
        expected_v = [valid(q, g) for g in range(n_g)]
        expected_r = [expected_v[g] and gallery.label[g] == query.label[q] for g in range(n_g)]
        assert v.tolist() == expected_v and r.tolist() == expected_r
        if not problem.skip[q]:
            assert {g for (i, g) in pairs if i == q} == set(np.flatnonzero(expected_r).tolist())
        # any window of rows gives the same masks
        v2, r2 = problem.valid_relevant(q, 7, 19)
        assert v2.tolist() == expected_v[7:19] and r2.tolist() == expected_r[7:19]


def test_kernels_load_without_a_writable_numba_cache():
    """A read-only install and home: numba finds no cache directory (forced here with
    NUMBA_CACHE_LOCATOR_CLASSES) and would refuse at import; the kernels compile per
    process instead and give the same numbers (every module with compiled kernels
    imports)."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from rankwise import kernels, rerank, single_shot, verification\n"
        "rows, sq, bad, why = kernels.prepare_rows(np.array([[3, 4], [0, 1]], np.float32), False)\n"
        "print(sq.tolist(), bad, why, kernels.prepare_rows._cache.__class__.__name__)\n"
    )
    env = dict(os.environ, NUMBA_CACHE_LOCATOR_CLASSES="ZipCacheLocator")  # never applies
    env.pop("NUMBA_CACHE_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[25.0,", "1.0]", "-1", "0", "NullCache"]


def test_the_first_kernel_call_leaves_scipy_linalg_out_and_numba_dot_works():
    """numba's first compiled call imports numba.np.arraymath, which probes scipy.linalg
    (0.1-0.25 s of start-up); kernels.py loads it with scipy.linalg kept out.  In a fresh
    process: a kernel runs, scipy.linalg is not imported, and a user's own numba
    function with np.dot still compiles afterwards (numba's dot probes again)."""
    import importlib.util
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import numpy as np\n"
        "from rankwise import kernels\n"
        "rows, sq, bad, why = kernels.prepare_rows(np.ones((2, 3), np.float32), False)\n"
        "print(sq.tolist(), 'scipy.linalg' in sys.modules)\n"
        "import numba\n"
        "try:\n"
        "    dot = numba.njit(lambda a, b: np.dot(a, b))\n"
        "    print(dot(np.ones(3), np.arange(3.0)))\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "[3.0, 3.0] False"
    # numba's dot needs scipy's BLAS; where scipy is installed (CI: with the test extras)
    # it must still work, where it is not numba says so as it always did
    has_scipy = importlib.util.find_spec("scipy") is not None
    assert lines[1] == ("3.0" if has_scipy else "TypingError"), proc.stdout


@pytest.mark.parametrize("cosine", [False, True])
def test_fast_key_lies_within_its_bound_of_the_canonical_key(cosine):
    """count_tile decides its too-close-to-call pairs with a float64 key summed in any
    order: it must lie within _fast_bound of the canonical (sequential) key, on rows
    whose sums depend on their order (entries spread over 12 orders of magnitude, where
    the two sums differ) and on plain Gaussian rows."""
    rng = np.random.default_rng(7)
    d = 37
    spread = (rng.standard_normal((60, d)) * 10.0 ** rng.integers(-6, 6, (60, d))).astype(
        np.float32
    )
    plain = rng.standard_normal((60, 512)).astype(np.float32)
    differ = 0
    for rows in (spread, plain):
        rows, sq, _, _ = kernels.prepare_rows(rows, cosine)
        n = rows.shape[0]
        pq, pg = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)
        canonical = kernels.pair_keys(rows, rows, pq, pg, cosine)
        for t in range(pq.size):
            q, g = rows[pq[t]], rows[pg[t]]
            fast = kernels._fast_key(q, g, cosine)
            eps = kernels._fast_bound(
                fast, np.sqrt(sq[pq[t]]), np.sqrt(sq[pg[t]]), rows.shape[1], cosine
            )
            assert abs(fast - canonical[t]) <= eps / 2.0
            differ += fast != canonical[t]
    assert differ > 0  # the two sums really are different computations
