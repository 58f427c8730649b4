"""Compiled per-row and per-tile kernels (numba); plain numpy in, numpy out.

The engine's steps, in order: per chunk :func:`prepare_rows` and :func:`pair_keys`
(pass 1); per tile :func:`count_tile` (summed per query block by the engine), finish
:func:`ranks_from_hist` (pass 2); reassociation's candidate lists:
:func:`rank_candidates`.  Which gallery items count is decided by
:func:`rankwise.protocols.dense_masks`; ``count_tile`` applies the same rule inline
(tested equal in tests/test_kernels.py).

Exactness
---------
Ranks follow one *canonical* distance per (query, gallery) pair, computed the same
way wherever it is needed: a sequential float64 sum over the float32 rows,

    cosine:     key = -sum_k q_k g_k          (rows L2-normalised once, in float32)
    euclidean:  key =  sum_k (q_k - g_k)^2

(``-cos`` ranks exactly like ``1 - cos``; squared L2 like L2; both avoid the
rounding that could merge two distinct distances into a false tie).  The bulk
of the work uses the float32 BLAS tile ``S = Q G^T`` instead, whose error is
bounded by ``gamma_D * |q| |g|`` with ``gamma_D ~ D * 2^-24`` whatever the BLAS,
tile shape or thread count.  A tile value decides a comparison only when it is
farther than that bound from the threshold; otherwise a float64 sum of the same terms
in any (vectorised) order decides it when it is farther than its own bound, ``~D * 2^-53``
relative, from the threshold, and the canonical key is computed only when even that is
too close.  So every number is independent of tile sizes, worker counts and the BLAS,
and exact ties (duplicate rows) stay exact ties.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numba import njit as _numba_njit
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import overload

from .rounding import U32, U64, error_bound_factor  # noqa: F401  (callers use kernels.error_bound_factor)


def _load_numba_arraymath_without_scipy_linalg() -> None:
    """Import ``numba.np.arraymath`` with ``scipy.linalg`` kept out, unless already loaded.

    numba imports that module at the first compiled call of every process, and it
    probes for a BLAS once by importing ``scipy.linalg.cython_blas``: with scipy
    installed that import costs 0.1-0.25 s of the engine's start-up (scipy.linalg and
    its array-API layer), for a flag that only picks how numba compiles
    ``np.correlate``/``np.convolve`` — which no kernel here uses (``np.dot`` and
    ``np.linalg`` probe again when they are compiled, and then find scipy).
    """
    name = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    sys.modules[name] = None  # type: ignore[assignment]  # "import name" fails at once
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(name, 0) is None:
            del sys.modules[name]


_load_numba_arraymath_without_scipy_linalg()

_U32 = U32
_U64 = U64


def lowest_bit(m):
    """Index of the lowest set bit of ``m > 0``: LLVM's ``cttz`` in compiled code; this
    body only without the compiler (``NUMBA_DISABLE_JIT=1``)."""
    m = int(m)
    return (m & -m).bit_length() - 1


@overload(lowest_bit)
def _lowest_bit_compiled(m):
    return lambda m: trailing_zeros(m)  # type: ignore[call-arg]  # numba supplies `context`


def njit(**options: Any):
    """numba's ``njit``.  Its ``cache=True`` keeps the compiled code beside this file, or
    in the user's cache (``~/.cache/numba``, or ``NUMBA_CACHE_DIR``) when the install is
    read-only; when neither is writable numba refuses at import, so compile per process."""

    def decorate(func):
        try:
            return _numba_njit(**options)(func)
        except RuntimeError as exc:
            if not options.get("cache") or "no locator available" not in str(exc):
                raise
            return _numba_njit(**dict(options, cache=False))(func)

    return decorate


@njit(cache=True, nogil=True, inline="always")
def _sum_sq(x, i):
    """Row ``i``'s squared norm: the float64 sum of its squares in order (the sum
    :func:`prepare_rows` and :func:`row_norms` both define ``sq`` by)."""
    s = 0.0
    for k in range(x.shape[1]):
        v = np.float64(x[i, k])
        s += v * v
    return s


@njit(cache=True, nogil=True)
def prepare_rows(x, cosine):
    """Per chunk: rows ready for ranking and their float64 norms.

    Parameters
    ----------
    x : (n, D) float array.
    cosine : bool, L2-normalise each row (float64 arithmetic, stored as float32).

    Returns
    -------
    rows : (n, D) float32, normalised when ``cosine``.
    sq : (n,) float64, squared norm of the returned rows.
    bad : int, first row index that is not finite (or is zero under cosine), else -1.
    why : int, 0 = ok, 1 = NaN/inf, 2 = zero vector.
    """
    n, d = x.shape
    rows = np.empty((n, d), dtype=np.float32)
    sq = np.empty(n, dtype=np.float64)
    for i in range(n):
        s = _sum_sq(x, i)
        if not np.isfinite(s):
            return rows, sq, i, 1
        if cosine:
            if s == 0.0:
                return rows, sq, i, 2
            inv = 1.0 / np.sqrt(s)
            t = 0.0
            for k in range(d):
                r = np.float32(np.float64(x[i, k]) * inv)
                rows[i, k] = r
                t += np.float64(r) * np.float64(r)
            sq[i] = t
        else:
            for k in range(d):
                rows[i, k] = np.float32(x[i, k])
            sq[i] = s
    return rows, sq, -1, 0


@njit(cache=True, nogil=True)
def row_norms(x):
    """:func:`prepare_rows`' euclidean ``(sq, bad, why)`` of float32 rows ``x (n, D)``,
    which it would copy unchanged: the caller ranks ``x`` itself (no chunk copied)."""
    n = x.shape[0]
    sq = np.empty(n, dtype=np.float64)
    for i in range(n):
        s = _sum_sq(x, i)
        if not np.isfinite(s):
            return sq, i, 1
        sq[i] = s
    return sq, -1, 0


@njit(cache=True, nogil=True, inline="always")
def _canonical_key(q, g, cosine):
    s = 0.0
    if cosine:
        for k in range(q.shape[0]):
            s += np.float64(q[k]) * np.float64(g[k])
        return -s
    for k in range(q.shape[0]):
        t = np.float64(q[k]) - np.float64(g[k])
        s += t * t
    return s


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _fast_key(q, g, cosine):
    """The canonical key's sum in any order (vectorised): within :func:`_fast_bound` of it.

    Exactly the same terms as :func:`_canonical_key` (float32 products and differences
    are formed in float64), summed in whatever order and with whatever fused operations
    the compiler picks.  Both sums are within ``gamma_{D+1}`` of the exact sum of the
    terms, so they differ by at most twice that; the caller treats the key as unknown
    within that distance and asks for the canonical sum only then.  (The body repeats
    _canonical_key's on purpose: numba caches compiled code per function, not per
    fastmath setting, so one function compiled both ways could load the wrong one.)
    """
    s = 0.0
    if cosine:
        for k in range(q.shape[0]):
            s += np.float64(q[k]) * np.float64(g[k])
        return -s
    for k in range(q.shape[0]):
        t = np.float64(q[k]) - np.float64(g[k])
        s += t * t
    return s


@njit(cache=True, nogil=True, inline="always")
def _fast_bound(key, qn, gn, dim, cosine):
    """``|_fast_key - _canonical_key|`` bound, doubled for safety:
    ``4 (D + 2) u64`` times ``|q| |g|`` (cosine, >= sum |q_k g_k|) or the key itself
    (euclidean: a sum of non-negative terms)."""
    if cosine:
        return 4.0 * (dim + 2) * _U64 * qn * gn
    return 4.0 * (dim + 2) * _U64 * abs(key)


@njit(cache=True, nogil=True)
def pair_keys(qrows, grows, pq, pg, cosine):
    """Per chunk: canonical keys of the pairs ``(qrows[pq[i]], grows[pg[i]])``."""
    out = np.empty(pq.shape[0], dtype=np.float64)
    for i in range(pq.shape[0]):
        out[i] = _canonical_key(qrows[pq[i]], grows[pg[i]], cosine)
    return out


@njit(cache=True, nogil=True)
def tile_keys(qrows, grows, cosine):
    """Per tile: canonical keys of every pair, ``(len(qrows), len(grows))`` float64
    (single-gallery-shot draws need every valid item's key)."""
    out = np.empty((qrows.shape[0], grows.shape[0]), dtype=np.float64)
    for i in range(qrows.shape[0]):
        for j in range(grows.shape[0]):
            out[i, j] = _canonical_key(qrows[i], grows[j], cosine)
    return out


@njit(cache=True, nogil=True, inline="always")
def _count_less(thr, lo, hi, x):
    """Number of ``thr[lo:hi]`` (sorted ascending) strictly below ``x``.

    A query has few relevant items: counting them all is one pass with no
    data-dependent branch; long lists use a binary search.
    """
    if hi - lo <= 64:
        n = 0
        for k in range(lo, hi):
            n += thr[k] < x
        return n
    a = lo
    b = hi
    while a < b:
        m = (a + b) >> 1
        if thr[m] < x:
            a = m + 1
        else:
            b = m
    return a - lo


@njit(cache=True, nogil=True, inline="always")
def _key_bound(qn, gn, bound, cosine):
    """Bound on ``|key from the float32 BLAS value - canonical key|`` for rows of norms
    ``qn``, ``gn``; ``bound = error_bound_factor(D)`` is twice ``gamma_D``.

    The BLAS dot product is within ``gamma_D sum |q_k g_k| <= gamma_D qn gn`` of the exact
    one.  cosine: the key is ``-s``, so ``bound qn gn`` (twice the error).  euclidean:
    the key ``qsq + gsq - 2 s`` carries twice the dot product's error, so twice that is
    ``2 bound qn gn``; the float64 roundings of the norms, of the key and of the canonical
    sum itself are ``~(2D + 3) 2^-53 (qn + gn)^2``, covered a thousand times over by
    ``2 bound 2^-20 (qn + gn)^2``.
    """
    if cosine:
        return bound * qn * gn
    e = qn + gn
    return 2.0 * bound * (qn * gn + 2.0**-20 * e * e)


@njit(cache=True, nogil=True)
def _float32_bounds(thr, lo, hi, h0, scale, margin, aup, bdn):
    """A row's thresholds on the float32 proxy's scale, widened by ``margin``.

    With ``h_p = (t_p - h0) * scale`` and ``m_p = margin + 4 u32 |h_p|``:
    ``aup[p]`` is the smallest float32 >= ``h_p + m_p`` (a proxy above it is certainly
    behind threshold p) and ``bdn[p]`` the largest float32 <= ``h_p - m_p`` (a proxy at
    or below it is certainly at or ahead of it).  Running max / min keep both sorted
    (only ever moving them outwards, so both tests stay certain) and ``bdn[R] = +inf``.
    """
    r = hi - lo
    for p in range(r):
        h = (thr[lo + p] - h0) * scale
        m = margin + 4.0 * _U32 * abs(h)
        a = np.float32(h + m)
        if np.float64(a) < h + m:
            a = np.nextafter(a, np.float32(np.inf))
        b = np.float32(h - m)
        if np.float64(b) > h - m:
            b = np.nextafter(b, np.float32(-np.inf))
        aup[p] = a
        bdn[p] = b
    for p in range(1, r):
        if aup[p] < aup[p - 1]:
            aup[p] = aup[p - 1]
    for p in range(r - 2, -1, -1):
        if bdn[p] > bdn[p + 1]:
            bdn[p] = bdn[p + 1]
    bdn[r] = np.float32(np.inf)


@njit(cache=True, nogil=True, inline="always")
def _clear_bits(masks, values_sorted, order, value):
    """Clear the mask bits of the items whose code is ``value`` (``values_sorted`` =
    the codes sorted, ``order`` their item indices): the query's own label or id."""
    k = np.searchsorted(values_sorted, value)
    while k < values_sorted.shape[0] and values_sorted[k] == value:
        j = order[k]
        masks[j >> 6] &= ~(np.uint64(1) << np.uint64(j & 63))
        k += 1


@njit(cache=True, nogil=True)
def count_tile(
    sim, qrows, qsq, qlab, qid, grows, gsq, glab, gid, gjunk, thr, toff, exclude_self, cosine, bound
):
    """Per tile: valid non-relevant gallery items at or ahead of each threshold.

    Parameters
    ----------
    sim : (b, c) float32, ``qrows @ grows.T`` from BLAS.
    qsq, gsq : squared row norms (float64) of the prepared rows.
    qlab, qid / glab, gid : integer label and id codes; ``gjunk`` (c,) bool.
    thr : float64, per query the sorted canonical keys of its relevant items,
        query i's at ``thr[toff[i]:toff[i+1]]``.
    bound : ``error_bound_factor(D)``.

    Returns
    -------
    hist : int64 like ``thr``.  For threshold position p of query i, ``hist[toff[i]+p]``
        counts valid non-relevant items whose key lies in ``(t_{p-1}, t_p]``; its
        cumulative sum over p is ``#{valid non-relevant g : key(g) <= t_p}``.

    How (per query row, all steps exact decisions):

    1. A float32 proxy per item, ``v = -s`` (cosine: the key is ``-s``) or
       ``v = gsq/2 - s`` (euclidean: the key is ``qsq + 2 (gsq/2 - s)``), one
       vectorised pass; junk items get NaN, the query's own label (relevant items and
       same-camera junk) and, with ``exclude_self``, its own id are dropped after it:
       none of them ever counts.
    2. The row's thresholds mapped to that scale and widened by the largest BLAS bound
       of the chunk and the proxy's own roundings (:func:`_float32_bounds`).  Items
       at or ahead of the deepest threshold (a bit mask from the pass of step 1) are
       compacted; each one's position
       ``p = #{aup < v}`` is a count over the thresholds (vectorised across items).
       ``v <= bdn[p]`` settles it: hist[p] += 1.
    3. The few items left between the bounds get the float64 test with their own BLAS
       bound; those still too close to call are collected over the whole tile and
       decided query by query by a fast float64 key
       (:func:`_fast_key`, within :func:`_fast_bound` of the canonical key), and the
       canonical key itself when a threshold lies within that bound.
    """
    b, c = sim.shape
    dim = qrows.shape[1]
    hist = np.zeros(thr.shape[0], dtype=np.int64)
    if c == 0:
        return hist
    nan32 = np.float32(np.nan)
    gn = np.sqrt(gsq)
    gmax = gn.max()
    half_gsq = (gsq / 2.0).astype(np.float32)
    hmax = np.float64(half_gsq.max())
    off = np.empty(c, dtype=np.float32)  # v = off - s
    for j in range(c):
        off[j] = nan32 if gjunk[j] else (np.float32(0.0) if cosine else half_gsq[j])
    # the chunk's items by label and by id, to blank a query's own label / id
    lorder = np.argsort(glab, kind="mergesort")
    lsorted = glab[lorder]
    iorder = np.argsort(gid, kind="mergesort") if exclude_self else np.zeros(0, np.int64)
    isorted = gid[iorder]
    rmax = 0
    for i in range(b):
        rmax = max(rmax, toff[i + 1] - toff[i])
    aup = np.empty(rmax, dtype=np.float32)
    bdn = np.empty(rmax + 1, dtype=np.float32)
    row_hist = np.empty(rmax + 1, dtype=np.int64)
    nw = (c + 63) >> 6
    masks = np.empty(nw, dtype=np.uint64)
    vv = np.empty(c, dtype=np.float32)
    jj = np.empty(c, dtype=np.int32)
    pos = np.empty(c, dtype=np.int32)
    # pairs too close to call from float32 with their own bound, over the whole tile
    cap = c
    amb_i = np.empty(cap, dtype=np.int32)
    amb_j = np.empty(cap, dtype=np.int32)
    n_amb = 0
    for i in range(b):
        lo = toff[i]
        hi = toff[i + 1]
        r = hi - lo
        if r == 0:
            continue
        qn = np.sqrt(qsq[i])
        # |key - map(v)| <= BLAS bound + the roundings of v (gsq/2 and the difference)
        if cosine:
            _float32_bounds(thr, lo, hi, 0.0, 1.0, _key_bound(qn, gmax, bound, True), aup, bdn)
        else:
            margin = _key_bound(qn, gmax, bound, False) / 2.0 + 4.0 * _U32 * (hmax + qn * gmax)
            _float32_bounds(thr, lo, hi, qsq[i], 0.5, margin, aup, bdn)
        cut = aup[r - 1]
        # one bit per item at or ahead of the deepest threshold, 64 items a word (a
        # fixed-length inner loop: vectorised), then the set bits' items compacted: a
        # branch per item mispredicts, branch-free stores serialise on the count
        dense = np.uint64(0)
        for w in range(nw):
            base = w << 6
            m = np.uint64(0)
            if base + 64 <= c:
                for k in range(64):
                    m |= np.uint64(off[base + k] - sim[i, base + k] <= cut) << np.uint64(k)
            else:
                for k in range(c - base):
                    m |= np.uint64(off[base + k] - sim[i, base + k] <= cut) << np.uint64(k)
            masks[w] = m
            dense |= m
        if dense == 0:
            continue
        _clear_bits(masks, lsorted, lorder, qlab[i])
        if exclude_self:
            _clear_bits(masks, isorted, iorder, qid[i])
        n = 0
        for w in range(nw):
            m = masks[w]
            while m != 0:
                j = (w << 6) + lowest_bit(m)
                vv[n] = off[j] - sim[i, j]
                jj[n] = j
                n += 1
                m &= m - np.uint64(1)
        if r <= 64:
            for t in range(n):
                pos[t] = 0
            for p in range(r):
                a = aup[p]
                for t in range(n):
                    pos[t] += vv[t] > a
        else:
            for t in range(n):
                pos[t] = _count_less(aup, 0, r, vv[t])
        # settled items into row_hist (position r = behind every threshold: dropped);
        # the unsettled ones' indices reuse pos
        for p in range(r + 1):
            row_hist[p] = 0
        n_open = 0
        for t in range(n):
            p = pos[t]
            settled = vv[t] <= bdn[p]
            row_hist[p] += settled
            pos[n_open] = t
            n_open += not settled
        for p in range(r):
            hist[lo + p] += row_hist[p]
        for u in range(n_open):
            j = jj[pos[u]]
            s = np.float64(sim[i, j])
            key = -s if cosine else qsq[i] + gsq[j] - 2.0 * s
            eps = _key_bound(qn, gn[j], bound, cosine)
            # thresholds below key - eps are certainly ahead of g; g is certainly ahead
            # of those at or above key + eps; one in between: too close to call
            p = _count_less(thr, lo, hi, key - eps)
            if lo + p < hi and thr[lo + p] < key + eps:
                if n_amb == cap:
                    cap *= 2
                    grown_i = np.empty(cap, dtype=np.int32)
                    grown_j = np.empty(cap, dtype=np.int32)
                    grown_i[:n_amb] = amb_i[:n_amb]
                    grown_j[:n_amb] = amb_j[:n_amb]
                    amb_i = grown_i
                    amb_j = grown_j
                amb_i[n_amb] = i
                amb_j[n_amb] = j
                n_amb += 1
            elif p < r:
                hist[lo + p] += 1
    if n_amb == 0:
        return hist
    # in query order: a query row stays in cache for its pairs (sorting by gallery row
    # was slower: a chunk's row has ~2 open pairs, a block's query row ~20)
    for u in range(n_amb):
        i = amb_i[u]
        j = amb_j[u]
        lo = toff[i]
        hi = toff[i + 1]
        key = _fast_key(qrows[i], grows[j], cosine)
        eps = _fast_bound(key, np.sqrt(qsq[i]), gn[j], dim, cosine)
        p = _count_less(thr, lo, hi, key - eps)
        if lo + p < hi and thr[lo + p] < key + eps:
            p = _count_less(thr, lo, hi, _canonical_key(qrows[i], grows[j], cosine))
        if lo + p < hi:
            hist[lo + p] += 1
    return hist


@njit(cache=True, nogil=True)
def ranks_from_hist(hist, toff):
    """Finish: sorted 1-based ranks ``r_p = 1 + cumsum(hist)_p + p`` per query."""
    ranks = np.empty(hist.shape[0], dtype=np.int64)
    for i in range(toff.shape[0] - 1):
        ahead = 0
        for p in range(toff[i], toff[i + 1]):
            ahead += hist[p]
            ranks[p] = 1 + ahead + (p - toff[i])
    return ranks


@njit(cache=True, nogil=True)
def rank_candidates(offsets, keys, relevant):
    """Ranks of relevant items among explicit candidate lists (reassociation).

    ``keys[offsets[i]:offsets[i+1]]`` are query i's candidates' canonical keys and
    ``relevant`` flags the relevant ones.  Returns ``(rank_offsets, ranks)`` with the
    sorted pessimistic ranks, ties counting against the query.
    """
    n = offsets.shape[0] - 1
    counts = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        for p in range(offsets[i], offsets[i + 1]):
            if relevant[p]:
                counts[i + 1] += 1
    rank_off = np.cumsum(counts)
    ranks = np.empty(rank_off[n], dtype=np.int64)
    for i in range(n):
        lo = offsets[i]
        hi = offsets[i + 1]
        rel = np.sort(keys[lo:hi][relevant[lo:hi]])
        for m in range(rel.shape[0]):
            ahead = 0
            for p in range(lo, hi):
                if not relevant[p] and keys[p] <= rel[m]:
                    ahead += 1
            ranks[rank_off[i] + m] = 1 + ahead + m
    return rank_off, ranks
