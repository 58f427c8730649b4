"""The C kernels (rankwise.native) against the numba kernels they replace, and how a
process picks, builds and caches them.

The numba kernels are the reference: every count, rank, prepared row and canonical key
of the C kernels must be identical (the hand-computed and brute-force tests of
tests/test_kernels.py run on both kernel sets too).  Skips only where no C compiler is
found; .ci/run installs one.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import c_kernels

import rankwise
from rankwise import kernels, native
from rankwise.errors import RankwiseError


def _cpu_has(flag: str) -> bool:
    """Whether the CPU's feature flags (the line rankwise.native keys its builds by) list
    ``flag``."""
    return f" {flag}" in native._cpu_flags()


# The kernels as built (-march=native), and their other code paths built on purpose:
# without AVX-512 (AVX2 masks, the AVX2 fused kernel) and without either (plain C, no
# fused kernel), where this CPU has them.
PATHS = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "plain": ("-mno-avx512f", "-mno-avx2"),
}


@pytest.fixture(scope="module")
def built():
    """The kernels as a ranking process builds them (skips without a C compiler)."""
    return c_kernels()


@pytest.fixture(scope="module", params=list(PATHS))
def nk(request):
    extra = PATHS[request.param]
    if extra and not _cpu_has("avx2"):
        pytest.skip("this CPU has no AVX2: -march=native already builds the plain path")
    return c_kernels(extra)


def _problem(rng, cosine, n_q, n_g, dim, n_lab, noise, dup=40):
    """Clustered rows (noise sets how deep relevant items lie: a weak model's rows put
    many non-relevant items ahead of the deepest relevant one), exact duplicates of
    query rows under other labels (exact ties), junk, ids shared with queries."""
    centres = 2.0 * rng.standard_normal((n_lab, dim))
    qlab, glab = rng.integers(0, n_lab, n_q), rng.integers(0, n_lab, n_g)
    glab[:90] = qlab[0]  # > 64 relevant items for some queries: binary searches
    q = (centres[qlab] + noise * rng.standard_normal((n_q, dim))).astype(np.float32)
    g = (centres[glab] + noise * rng.standard_normal((n_g, dim))).astype(np.float32)
    g[100 : 100 + dup] = q[rng.integers(0, n_q, dup)]
    qrows, qsq, _, _ = kernels.prepare_rows(q, cosine)
    grows, gsq, _, _ = kernels.prepare_rows(g, cosine)
    qid = np.arange(n_q, dtype=np.int64)
    gid = rng.integers(0, 3 * n_q, n_g).astype(np.int64)
    junk = rng.random(n_g) < 0.05
    thr = []
    for i in range(n_q):
        rel = np.flatnonzero((glab == qlab[i]) & ~junk)
        thr.append(np.sort(kernels.pair_keys(qrows, grows, np.full(rel.size, i), rel, cosine)))
    toff = np.concatenate([[0], np.cumsum([t.size for t in thr])]).astype(np.int64)
    return dict(
        q=q, g=g, qrows=qrows, qsq=qsq, grows=grows, gsq=gsq, qlab=qlab.astype(np.int64),
        glab=glab.astype(np.int64), qid=qid, gid=gid, junk=junk, thr=np.concatenate(thr),
        toff=toff,
    )  # fmt: skip


def _tile_args(p, sim, exclude_self, cosine):
    return (
        sim, p["qrows"], p["qsq"], p["qlab"], p["qid"], p["grows"], p["gsq"], p["glab"],
        p["gid"], p["junk"], p["thr"], p["toff"], exclude_self, cosine,
        kernels.error_bound_factor(p["qrows"].shape[1]),
    )  # fmt: skip


@pytest.mark.parametrize("cosine", [False, True])
@pytest.mark.parametrize("exclude_self", [True, False])
@pytest.mark.parametrize("noise", [0.6, 1.6, 3.0])
@pytest.mark.parametrize("n_g", [700, 1031])
def test_count_tile_equals_numba(nk, cosine, exclude_self, noise, n_g):
    """Identical histograms (and ranks) on easy to very hard rows, both distances, a
    gallery that fills its last 64-item word and one that does not; and on a tile that is
    a strided view of a wider buffer (the C kernel reads it with its row stride)."""
    rng = np.random.default_rng(int(noise * 10) + n_g + 2 * cosine + exclude_self)
    p = _problem(rng, cosine, n_q=45, n_g=n_g, dim=70, n_lab=12, noise=noise)
    sim = p["qrows"] @ p["grows"].T
    want = kernels.count_tile(*_tile_args(p, sim, exclude_self, cosine))
    assert want.sum() > 0
    np.testing.assert_array_equal(nk.count_tile(*_tile_args(p, sim, exclude_self, cosine)), want)
    wide = np.zeros((sim.shape[0], sim.shape[1] + 13), np.float32)
    wide[:, 5 : 5 + sim.shape[1]] = sim
    view = wide[:, 5 : 5 + sim.shape[1]]
    np.testing.assert_array_equal(nk.count_tile(*_tile_args(p, view, exclude_self, cosine)), want)
    np.testing.assert_array_equal(
        nk.ranks_from_hist(want, p["toff"]), kernels.ranks_from_hist(want, p["toff"])
    )


def test_count_tile_on_an_empty_gallery_chunk_and_rows_without_thresholds(nk):
    rng = np.random.default_rng(3)
    p = _problem(rng, False, n_q=6, n_g=200, dim=8, n_lab=3, noise=1.0)
    args = list(_tile_args(p, p["qrows"] @ p["grows"].T, True, False))
    # queries without relevant items: no thresholds
    args[10], args[11] = np.zeros(0), np.zeros(7, np.int64)
    assert nk.count_tile(*args).shape == (0,)
    empty = _tile_args(p, np.zeros((6, 0), np.float32), True, False)
    empty = (empty[0], *empty[1:5], p["grows"][:0], p["gsq"][:0], p["glab"][:0],
             p["gid"][:0], p["junk"][:0], *empty[10:])  # fmt: skip
    np.testing.assert_array_equal(nk.count_tile(*empty), np.zeros(p["thr"].size, np.int64))


@pytest.fixture(scope="module")
def fused(built):
    """The C kernels' fused tile kernel (AVX-512 or AVX2 + FMA builds; skips on other
    CPUs, and fails where the CPU has them but the build has no fused kernel)."""
    has = _cpu_has("avx512f") or (_cpu_has("avx2") and _cpu_has("fma"))
    if not built.fused:
        assert not has, "this CPU has AVX-512 or AVX2 + FMA, yet no fused tile kernel was built"
        pytest.skip("neither AVX-512 nor AVX2 + FMA here: no fused tile kernel")
    return built


@pytest.mark.parametrize("cosine", [False, True])
@pytest.mark.parametrize("exclude_self", [True, False])
@pytest.mark.parametrize("noise", [0.6, 1.6, 3.0])
@pytest.mark.parametrize(("n_q", "n_g", "dim"), [(45, 1031, 70), (12, 256, 32), (1, 300, 3)])
def test_count_fused_equals_count_tile(fused, cosine, exclude_self, noise, n_q, n_g, dim):
    """The fused kernel computes the products itself (float32 multiply-adds in its own
    order, 256 gallery items at a time) and must give count_tile's histogram exactly: on
    easy to very hard rows, with exact ties, junk and own ids, query blocks that fill
    their 12-row panels or not (one row), gallery chunks of whole and partial 32-item
    panels and 256-item blocks, and dimensions from 3 up."""
    rng = np.random.default_rng(int(noise * 10) + n_g + 2 * cosine + exclude_self + n_q)
    p = _problem(rng, cosine, n_q=n_q, n_g=n_g, dim=dim, n_lab=12, noise=noise, dup=min(40, n_q))
    args = _tile_args(p, p["qrows"] @ p["grows"].T, exclude_self, cosine)
    want = kernels.count_tile(*args)
    assert want.sum() > 0 or noise < 1  # (one easy row may have nothing ahead)
    packed = (fused.pack_queries(p["qrows"]), fused.pack_gallery(p["grows"]))
    np.testing.assert_array_equal(fused.count_fused(*packed, *args[1:]), want)
    # packed rows that travelled to a cluster's worker (unpickled): maybe not aligned
    moved = [np.frombuffer(b"\0\0\0\0" + x.tobytes(), np.float32, offset=4) for x in packed]
    assert all(x.ctypes.data % 64 for x in moved)
    np.testing.assert_array_equal(fused.count_fused(*moved, *args[1:]), want)


def test_the_fused_kernel_refuses_packed_rows_of_another_shape(fused):
    rng = np.random.default_rng(4)
    p = _problem(rng, False, n_q=13, n_g=200, dim=8, n_lab=3, noise=1.0)
    args = _tile_args(p, p["qrows"] @ p["grows"].T, True, False)[1:]
    qpack, gpack = fused.pack_queries(p["qrows"]), fused.pack_gallery(p["grows"])
    mr, nr = fused.panels  # whole panels: 12 rows, 32 items (AVX-512); 6, 16 (AVX2)
    assert qpack.size == -(-13 // mr) * mr * 8 and gpack.size == -(-200 // nr) * nr * 8
    for bad in (
        (qpack[:-8], gpack),
        (qpack, gpack[:-8]),
        (qpack, fused.pack_gallery(p["grows"][:160])),
    ):
        with pytest.raises(ValueError, match="another shape"):
            fused.count_fused(*bad, *args)


DEPTHS = [1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100]


def _problem_with_depths(rng, cosine, noise, dim=40, n_other=600):
    """One query per entry of DEPTHS with exactly that many relevant items (so that many
    thresholds): every way count_tile places items among a row's thresholds (below 64 in
    registers: AVX-512 by a binary search, AVX2 by one below 32 and by a scan of the
    bounds from 32 to 64; in memory beyond), on clustered rows."""
    n_q = len(DEPTHS)
    centres = 2.0 * rng.standard_normal((n_q + 20, dim))
    qlab = np.arange(n_q)
    glab = np.concatenate([np.repeat(qlab, DEPTHS), rng.integers(n_q, n_q + 20, n_other)])
    glab = rng.permutation(glab)
    q = (centres[qlab] + noise * rng.standard_normal((n_q, dim))).astype(np.float32)
    g = (centres[glab] + noise * rng.standard_normal((glab.size, dim))).astype(np.float32)
    qrows, qsq, _, _ = kernels.prepare_rows(q, cosine)
    grows, gsq, _, _ = kernels.prepare_rows(g, cosine)
    thr = [
        np.sort(kernels.pair_keys(qrows, grows, np.full(d, i), np.flatnonzero(glab == i), cosine))
        for i, d in enumerate(DEPTHS)
    ]
    return dict(
        qrows=qrows, qsq=qsq, grows=grows, gsq=gsq, qlab=qlab.astype(np.int64),
        glab=glab.astype(np.int64), qid=np.arange(n_q, dtype=np.int64),
        gid=np.arange(n_q, n_q + glab.size, dtype=np.int64), junk=rng.random(glab.size) < 0.03,
        thr=np.concatenate(thr), toff=np.concatenate([[0], np.cumsum(DEPTHS)]).astype(np.int64),
    )  # fmt: skip


@pytest.mark.parametrize("cosine", [False, True])
@pytest.mark.parametrize("noise", [2.0, 3.0, 6.0])
def test_every_number_of_thresholds_counts_like_numba(nk, cosine, noise):
    """Rows with 1 to 100 thresholds (the AVX-512 kernels place an item among up to 63
    of them by a binary search in registers, beyond that in memory; the AVX2 ones among
    up to 31 by a binary search in registers, up to 64 by a scan of the bounds held
    against the items in registers, beyond that in memory; the plain C ones always in
    memory): count_tile's and count_fused's histograms are numba's."""
    rng = np.random.default_rng(int(10 * noise) + cosine)
    p = _problem_with_depths(rng, cosine, noise)
    args = _tile_args(p, p["qrows"] @ p["grows"].T, False, cosine)
    want = kernels.count_tile(*args)
    ahead = np.add.reduceat(want, p["toff"][:-1])
    assert (ahead > 0).sum() >= len(DEPTHS) - 2  # items ahead of nearly every query
    np.testing.assert_array_equal(nk.count_tile(*args), want)
    if nk.fused:  # each build's: AVX-512's 12 x 32 panels, or AVX2's 6 x 16
        packed = (nk.pack_queries(p["qrows"]), nk.pack_gallery(p["grows"]))
        np.testing.assert_array_equal(nk.count_fused(*packed, *args[1:]), want)


@pytest.mark.parametrize("cosine", [False, True])
def test_every_share_of_items_ahead_counts_like_numba(nk, cosine):
    """Rows with none, one, a few and up to every item of the chunk ahead of their
    deepest threshold (thresholds at quantiles of the row's own keys): the AVX2 kernels
    pack the items ahead item by item below one in eight of a row's (or a fused block's)
    items and 8 at a time from there, so both ways, and the switch between them, are
    crossed; count_tile's and count_fused's histograms are numba's."""
    rng = np.random.default_rng(11 + cosine)
    p = _problem(rng, cosine, n_q=60, n_g=1100, dim=32, n_lab=40, noise=1.5)
    sim = p["qrows"] @ p["grows"].T
    q, g = p["qrows"].astype(np.float64), p["grows"].astype(np.float64)
    keys = -(q @ g.T) if cosine else p["qsq"][:, None] + p["gsq"][None, :] - 2.0 * (q @ g.T)
    shares = np.concatenate([[0.0, 0.0005, 0.003], np.linspace(0.01, 0.3, 40), [0.6, 0.9, 1.0]])
    thr, toff = [], [0]
    for i, share in enumerate(shares[: len(q)]):
        deepest = np.quantile(keys[i], share) * (1 + 1e-6) if share else keys[i].min() - 1.0
        t = np.sort(np.concatenate([[deepest], np.quantile(keys[i], share * rng.random(i % 5))]))
        thr.append(t)
        toff.append(toff[-1] + t.size)
    p.update(thr=np.concatenate(thr), toff=np.asarray(toff[: len(thr) + 1], np.int64))
    p.update({k: p[k][: len(thr)] for k in ("qrows", "qsq", "qlab", "qid")})
    args = _tile_args(p, sim[: len(thr)], True, cosine)
    want = kernels.count_tile(*args)
    ahead = np.add.reduceat(want, p["toff"][:-1]) / keys.shape[1]
    assert ahead[0] == 0 and ahead.max() > 0.5  # no item ahead to nearly all
    assert ((ahead > 0) & (ahead < 1 / 8)).sum() >= 10 and (ahead >= 1 / 8).sum() >= 10
    np.testing.assert_array_equal(nk.count_tile(*args), want)
    if nk.fused:
        packed = (nk.pack_queries(p["qrows"]), nk.pack_gallery(p["grows"]))
        np.testing.assert_array_equal(nk.count_fused(*packed, *args[1:]), want)


@pytest.mark.parametrize("cosine", [False, True])
def test_thousands_of_exact_ties_in_one_tile_count_like_numba(nk, cosine):
    """Every gallery row twice, under two labels: each relevant item has an exact tie
    under another identity, which no float32 bound can settle.  Over 4,096 such items in
    one tile: the C kernels queue them and decide them in batches (several batches
    here), with the same histogram as numba's."""
    rng = np.random.default_rng(7 + cosine)
    p = _problem(rng, cosine, n_q=60, n_g=1200, dim=24, n_lab=12, noise=1.0, dup=0)
    grows, gsq = np.concatenate([p["grows"]] * 2), np.concatenate([p["gsq"]] * 2)
    p.update(
        grows=grows, gsq=gsq, glab=np.concatenate([p["glab"], p["glab"] + 100]),
        gid=np.concatenate([p["gid"]] * 2), junk=np.concatenate([p["junk"]] * 2),
    )  # fmt: skip
    args = _tile_args(p, p["qrows"] @ p["grows"].T, True, cosine)
    want = kernels.count_tile(*args)
    # nearly every relevant item's twin is counted at its tied threshold
    assert p["thr"].size > 4096 and want.sum() > 4096
    np.testing.assert_array_equal(nk.count_tile(*args), want)
    if nk.fused:  # each build's: AVX-512's 12 x 32 panels, or AVX2's 6 x 16
        packed = (nk.pack_queries(p["qrows"]), nk.pack_gallery(p["grows"]))
        np.testing.assert_array_equal(nk.count_fused(*packed, *args[1:]), want)


def test_the_fused_products_are_four_partial_sums(fused):
    """A term of the fused products goes through kc + parts - 1 roundings (parts partial
    sums of kc = ceil(D / 4) terms): never more than D, and kc >= D / 4, which the
    bound's doubling needs to cover the D + 3 operations' underflow errors."""
    for d in range(1, 4097):
        kc = -(-d // 4)
        m = fused.fused_roundings(d)
        assert m == kc + -(-d // kc) - 1 <= d
        assert (d + 3) / 4 <= m + 4


def _gamma(m: int) -> float:
    u = 2.0**-24
    return m * u / (1 - m * u)


@pytest.mark.parametrize("dim", [3, 70, 512, 2048])
def test_the_fused_products_lie_within_their_tighter_bound(fused, dim):
    """count_fused decides with gamma_m |q||g|, m = fused_roundings(D) ~ D / 4, not BLAS's
    gamma_D: every product lies within gamma_m sum_k |q_k g_k| of the exact dot product
    (float64 products summed exactly by math.fsum) — on random rows with cancellation,
    and on rows whose every addition rounds the same way, where a sequential float32 sum
    (one order BLAS may use) is off by more than that bound."""
    import math

    rng = np.random.default_rng(dim)
    q = rng.standard_normal((14, dim)).astype(np.float32)
    g = rng.standard_normal((40, dim)).astype(np.float32)
    g[:14] = q + 1e-3 * rng.standard_normal(q.shape).astype(np.float32)  # no cancellation
    q[13], g[39] = 1.0, 0.6 * 2.0**-24  # 1 + (D - 1) terms each lost in the rounding
    g[39, 0] = 1.0
    got = fused.fused_products(fused.pack_queries(q), fused.pack_gallery(g), 14, 40, dim)
    m = fused.fused_roundings(dim)
    q64, g64 = q.astype(np.float64), g.astype(np.float64)
    for i in range(14):
        for j in range(40):
            terms = q64[i] * g64[j]  # exact: float32 x float32 fits float64
            exact = math.fsum(terms)
            assert abs(float(got[i, j]) - exact) <= _gamma(m) * np.abs(terms).sum(), (i, j)
    if dim >= 70:  # the bound is tight enough to matter: the usual order breaks it
        seq = np.float32(0.0)
        for t in (q[13] * g[39]).astype(np.float32):
            seq = np.float32(seq + t)
        worst = abs(float(seq) - math.fsum(q64[13] * g64[39]))
        assert worst > _gamma(m) * np.abs(q64[13] * g64[39]).sum()
        assert worst < _gamma(dim) * np.abs(q64[13] * g64[39]).sum()


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add, a * b + c rounded once (to nearest, ties to even):
    a * b is exact in float64, TwoSum gives the exact sum hi + lo, and float32(hi) is
    the correctly rounded result unless hi lies exactly halfway between two float32
    numbers, where lo's sign decides."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    hi = p + c64
    t = hi - p
    lo = (p - (hi - t)) + (c64 - t)
    r = hi.astype(np.float32)
    r64 = r.astype(np.float64)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    down = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    r = np.where((hi == (r64 + up) / 2) & (lo > 0), up.astype(np.float32), r)
    return np.where((hi == (r64 + down) / 2) & (lo < 0), down.astype(np.float32), r)


def test_the_fused_products_are_the_documented_sums_bit_for_bit(fused):
    """Every product is parts partial sums of kc = ceil(D / 4) terms, each a chain of
    float32 fused multiply-adds in k order from 0, added in order (micro_kernel):
    emulated exactly here, so the AVX-512 (12 x 32) and AVX2 (6 x 16) kernels, which
    both must equal it, give the same bits, and the same counts, on either CPU."""
    rng = np.random.default_rng(5)
    for dim in (1, 3, 17, 64, 130):
        q = rng.standard_normal((13, dim)).astype(np.float32)
        g = rng.standard_normal((37, dim)).astype(np.float32)
        got = fused.fused_products(fused.pack_queries(q), fused.pack_gallery(g), 13, 37, dim)
        kc = -(-dim // 4)
        want = None
        for k0 in range(0, dim, kc):
            part = np.zeros((13, 37), dtype=np.float32)
            for k in range(k0, min(k0 + kc, dim)):
                part = _fma32(q[:, k, None], g[None, :, k], part)
            want = part if want is None else (want + part).astype(np.float32)
        np.testing.assert_array_equal(got, want)
        # not BLAS's: a sequential float32 sum without fused multiply-adds differs
        if dim >= 64:
            plain = np.zeros((13, 37), dtype=np.float32)
            for k in range(dim):
                plain = (plain + q[:, k, None] * g[None, :, k]).astype(np.float32)
            assert (plain != want).any()


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_the_engine_gives_the_same_ranks_with_and_without_the_fused_kernel(
    tmp_path, fused, monkeypatch, distance
):
    """Ranked through the fused kernel (products and counts in one pass) and through
    numpy's BLAS + count_tile: the same ranks, whatever the tiling."""
    files = _files(tmp_path, seed=2)
    calls = []
    count_fused = fused.count_fused

    def counted(*args):
        calls.append(1)
        return count_fused(*args)

    monkeypatch.setattr(native, "_CHOSEN", fused)
    monkeypatch.setattr(fused, "count_fused", counted)
    for block, chunk in ((32, 200), (1, 900), (90, 257), (7, 1)):
        kwargs = dict(protocol="reid", distance=distance, query_block=block, gallery_chunk=chunk)
        with_fused = rankwise.rank(*files, workers=2, **kwargs)
        assert calls, "the fused kernel was not used"
        calls.clear()
        monkeypatch.setattr(fused, "fused", False)
        with_blas = rankwise.rank(*files, workers=2, **kwargs)
        assert not calls
        monkeypatch.setattr(fused, "fused", True)
        np.testing.assert_array_equal(with_fused.offsets, with_blas.offsets)
        np.testing.assert_array_equal(with_fused.ranks, with_blas.ranks)
        assert with_fused.ranks.size > 500


@pytest.mark.parametrize("cosine", [False, True])
def test_prepared_rows_and_keys_are_bit_identical(nk, cosine):
    """prepare_rows for float32, float64, Fortran-ordered and strided input,
    and pair_keys: the same bits (the canonical key is the definition of the distance)."""
    rng = np.random.default_rng(5 + cosine)
    base = rng.standard_normal((50, 33)) * 10.0 ** rng.integers(-3, 4, (50, 33))
    for x in (
        base.astype(np.float32),
        base,
        np.asfortranarray(base.astype(np.float32)),
        base.astype(np.float32)[:, ::2],
    ):
        got, want = nk.prepare_rows(x, cosine), kernels.prepare_rows(x, cosine)
        assert got[2:] == want[2:] == (-1, 0)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    rows = kernels.prepare_rows(base.astype(np.float32), cosine)[0]
    pq, pg = rng.integers(0, 50, 500), rng.integers(0, 50, 500)
    np.testing.assert_array_equal(
        nk.pair_keys(rows, rows, pq, pg, cosine), kernels.pair_keys(rows, rows, pq, pg, cosine)
    )


@pytest.mark.parametrize("cosine", [False, True])
def test_the_fast_key_lies_within_its_bound_of_the_canonical_key(nk, cosine):
    """count_tile's any-order float64 key (vectorised, fused multiply-adds) against the
    canonical key, on rows whose sums depend on their order (entries over 12 orders of
    magnitude) and on Gaussian rows, dimensions around its 32- and 8-wide steps."""
    rng = np.random.default_rng(9 + cosine)
    differ = 0
    for d in (5, 37, 64, 515):
        for spread in (True, False):
            x = rng.standard_normal((40, d))
            if spread:
                x *= 10.0 ** rng.integers(-6, 6, (40, d))
            rows, sq, _, _ = kernels.prepare_rows(x.astype(np.float32), cosine)
            pq, pg = np.repeat(np.arange(40), 40), np.tile(np.arange(40), 40)
            canonical = kernels.pair_keys(rows, rows, pq, pg, cosine)
            fast = nk.pair_keys(rows, rows, pq, pg, cosine, fast=True)
            norms = np.sqrt(sq)
            if cosine:
                eps = 4.0 * (d + 2) * 2.0**-53 * norms[pq] * norms[pg]
            else:
                eps = 4.0 * (d + 2) * 2.0**-53 * np.abs(fast)
            assert (np.abs(fast - canonical) <= eps / 2.0).all()
            differ += (fast != canonical).sum()
    assert differ > 0  # really two different sums


def test_prepare_rows_names_the_same_bad_row(nk):
    x = np.ones((9, 4), np.float32)
    x[6, 1] = np.nan
    x[4] = 0.0
    assert nk.prepare_rows(x, True)[2:] == kernels.prepare_rows(x, True)[2:] == (4, 2)
    assert nk.prepare_rows(x, False)[2:] == kernels.prepare_rows(x, False)[2:] == (6, 1)
    big = np.ones((3, 2))
    big[2, 0] = 1e200  # its square overflows float64
    assert nk.prepare_rows(big, False)[2:] == kernels.prepare_rows(big, False)[2:] == (2, 1)


def _cli_args(files):
    flags = ("--query", "--gallery", "--query-embeddings", "--gallery-embeddings")
    return [x for flag, f in zip(flags, files, strict=True) for x in (flag, str(f))]


def _files(tmp_path, seed=1, n_q=90, n_g=900, dim=24):
    rng = np.random.default_rng(seed)
    glab, qlab = rng.integers(-1, 30, n_g), rng.integers(0, 33, n_q)
    for name, lab, n in (("g", glab, n_g), ("q", qlab, n_q)):
        rows = ["id,label,camera"] + [
            f"{name}{i},{lab[i]},{c}" for i, c in enumerate(rng.integers(0, 4, n))
        ]
        (tmp_path / f"{name}.csv").write_text("\n".join(rows) + "\n")
    centres = rng.standard_normal((40, dim))
    ge = (centres[glab + 1] + 1.2 * rng.standard_normal((n_g, dim))).astype(np.float32)
    ge[10:30] = ge[0]  # exact ties across chunks
    np.save(tmp_path / "g.npy", ge)
    np.save(tmp_path / "q.npy", (centres[qlab + 1] + rng.standard_normal((n_q, dim))).astype("f4"))
    return [tmp_path / n for n in ("q.csv", "g.csv", "q.npy", "g.npy")]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_the_engine_gives_the_same_ranks_on_both_kernel_sets(tmp_path, nk, monkeypatch, distance):
    files = _files(tmp_path)
    kwargs = dict(protocol="reid", distance=distance, query_block=32, gallery_chunk=200)
    monkeypatch.setattr(native, "_CHOSEN", kernels)
    on_numba = rankwise.rank(*files, workers=2, **kwargs)
    monkeypatch.setattr(native, "_CHOSEN", nk)
    on_c = rankwise.rank(*files, workers=2, **kwargs)
    np.testing.assert_array_equal(on_c.offsets, on_numba.offsets)
    np.testing.assert_array_equal(on_c.ranks, on_numba.ranks)
    assert on_c.ranks.size > 500


def test_a_ranking_process_never_imports_numba(tmp_path, built):
    """`rankwise evaluate` with the C kernels: numba (and its LLVM) stay out of the
    process, which is where the start-up time goes (benchmarks/bench_startup.py)."""
    files = _files(tmp_path)
    script = (
        "import sys\n"
        "from rankwise.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print('numba' in sys.modules, 'llvmlite' in sys.modules)\n"
    )
    out = str(tmp_path / "r.json")
    args = ["evaluate", *_cli_args(files), "--protocol", "reid", "--output", out]
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RANKWISE_KERNELS"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["False", "False"], done.stdout
    assert (tmp_path / "r.json").is_file()


def test_the_library_is_built_once_then_loaded(tmp_path, built, monkeypatch):
    """A first process compiles into the first writable cache folder (an unwritable one
    is skipped); later ones load that file without calling the compiler."""
    locked = tmp_path / "locked"
    locked.write_text("a file where a folder should be")
    monkeypatch.setattr(native, "_cache_dirs", lambda: [locked, tmp_path / "cache"])
    built = native._build()
    assert built.path.parent == tmp_path / "cache" and built.path.is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [built.path.name]  # no temp file

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(native.subprocess, "run", no_compiler)
    assert native._build().path == built.path


def test_processes_that_build_at_once_all_get_the_library(tmp_path, built):
    """A pipeline's first run starts several ranking jobs together on an empty cache:
    each compiles to a temporary file of its own and renames it into place, so every
    one of them loads a whole library, and no temporary file is left behind."""
    code = "from rankwise import native; print(native.engine_kernels().path.name)"
    env = {k: v for k, v in os.environ.items() if k != "RANKWISE_KERNELS"}
    env.update(RANKWISE_CACHE_DIR=str(tmp_path / "cache"), RANKWISE_KERNELS="native")
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    names = {p.communicate(timeout=300)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(names) == 1 and names.pop().startswith("_native_kernels-")
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_a_damaged_cached_library_is_built_again(tmp_path, built, monkeypatch):
    monkeypatch.setattr(native, "_cache_dirs", lambda: [tmp_path])
    (tmp_path / built.path.name).write_bytes(b"not a shared library")
    again = native._build()
    assert again.path == tmp_path / built.path.name
    assert again.path.read_bytes()[:4] == b"\x7fELF" or sys.platform != "linux"
    assert again.ranks_from_hist(np.array([0, 2]), np.array([0, 2])).tolist() == [1, 4]


def test_a_library_that_fails_its_self_test_is_never_cached(tmp_path, built, monkeypatch):
    """The miscompilation GCC 12's SLP vectoriser made of an interleaved prepare_rows
    (the float32 rounding of normalised rows dropped from their squared norm), written
    into the source: the build is refused, nothing is cached, numba's kernels run."""
    source = native.SOURCE.read_text()
    rounded = "                t += (double)r * (double)r;"
    assert source.count(rounded) == 1
    bad = tmp_path / "_native_kernels.c"
    bad.write_text(
        source.replace(
            rounded, "                t += ((double)xi[k] * inv) * ((double)xi[k] * inv);"
        )
    )
    monkeypatch.setattr(native, "SOURCE", bad)
    monkeypatch.setattr(native, "_cache_dirs", lambda: [tmp_path / "cache"])
    with pytest.raises(RuntimeError, match=r"prepare_rows \(float32\) failed its self-test"):
        native._build()
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.setattr(native, "_CHOSEN", None)
    monkeypatch.delenv("RANKWISE_KERNELS", raising=False)
    assert native.engine_kernels() is kernels
    assert "failed its self-test" in native.why_not_native()


def test_without_a_compiler_numba_takes_over_unless_native_is_required(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(native, "_cache_dirs", lambda: [tmp_path / "cache"])
    monkeypatch.setattr(native, "_CHOSEN", None)
    assert native.engine_kernels() is kernels
    assert "no-such-cc" in native.why_not_native()
    monkeypatch.setattr(native, "_CHOSEN", None)
    monkeypatch.setenv("RANKWISE_KERNELS", "native")
    with pytest.raises(RankwiseError, match="RANKWISE_KERNELS=native: the C kernels cannot be"):
        native.engine_kernels()
    monkeypatch.setenv("RANKWISE_KERNELS", "fortran")
    with pytest.raises(RankwiseError, match="'fortran' is not one of auto, native, numba"):
        native.engine_kernels()
    monkeypatch.setenv("RANKWISE_KERNELS", "numba")
    monkeypatch.delenv("CC")
    assert native.engine_kernels() is kernels


def test_a_bad_kernels_setting_is_one_line_from_the_cli(tmp_path):
    files = _files(tmp_path, n_q=5, n_g=20)
    done = subprocess.run(
        ["rankwise", "evaluate", *_cli_args(files), "--protocol", "reid"],
        capture_output=True,
        text=True,
        env=dict(os.environ, RANKWISE_KERNELS="fast"),
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: environment variable RANKWISE_KERNELS='fast' is not one of auto, native, "
        "numba; unset it or pick one"
    ]


def test_row_norms_are_prepare_rows_squared_norms(nk):
    """Under euclidean the engine ranks float32 rows as read and takes their norms from
    row_norms (AVX-512: eight rows a gather, one per lane): the same float64 sequential
    sums as prepare_rows, bit for bit, on every row count around the eight-row step
    and dimensions from 1, on rows whose sums depend on their order; and the same first
    bad row, in a gathered group and in the remainder."""
    rng = np.random.default_rng(12)
    for n in (1, 7, 8, 9, 16, 23):
        for d in (1, 3, 16, 33, 512):
            x = rng.standard_normal((n, d)) * 10.0 ** rng.integers(-6, 6, (n, d))
            x = x.astype(np.float32)
            sq, bad, why = nk.row_norms(x)
            assert (bad, why) == (-1, 0) == kernels.row_norms(x)[1:]
            np.testing.assert_array_equal(sq, nk.prepare_rows(x, False)[1])
            np.testing.assert_array_equal(sq, kernels.row_norms(x)[0])
    for row in (2, 12, 17):  # in the first gathered group, the second, the remainder
        x = np.ones((18, 5), np.float32)
        x[row, 3] = np.inf
        x[row + 1 :, 0] = np.nan
        assert nk.row_norms(x)[1:] == kernels.row_norms(x)[1:] == (row, 1)
        assert nk.prepare_rows(x, False)[2:] == (row, 1)
    huge = np.full((9, 2), 3e38, np.float32)  # finite float32, finite float64 squares
    assert nk.row_norms(huge)[1:] == (-1, 0)


def test_euclidean_chunks_are_the_rows_read_not_a_copy(tmp_path):
    """prepare_chunk under euclidean returns a read-only view of the float32 rows it read
    (a memory map of a .npy file, or a caller's own array), with prepare_rows' norms:
    no chunk is copied, and nothing can write through it into the caller's data."""
    from rankwise.embeddings import open_embeddings
    from rankwise.ranking import prepare_chunk

    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 24)).astype(np.float32)
    np.save(tmp_path / "g.npy", x)
    for source in (x, tmp_path / "g.npy"):
        src = open_embeddings(source, name="gallery embeddings")
        rows, sq = prepare_chunk(src, 5, 30, False)
        want_rows, want_sq, _, _ = kernels.prepare_rows(x[5:30], False)
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(sq, want_sq)
        assert not rows.flags.writeable
        if isinstance(source, np.ndarray):
            assert np.shares_memory(rows, x) and x.flags.writeable  # the caller's stays so
        else:  # the file's pages, mapped: somewhere down the chain of bases
            import mmap

            base = rows
            while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
                base = getattr(base, "base", None)
            assert base is not None
        cos_rows, _ = prepare_chunk(src, 5, 30, True)  # cosine: normalised, a new array
        assert not np.shares_memory(cos_rows, x) and cos_rows.flags.writeable
