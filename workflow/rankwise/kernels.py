"""Compiled per-row and per-tile kernels (numba); plain numpy in, numpy out.

The engine's steps, in order: per chunk :func:`prepare_rows` and :func:`pair_keys`
(pass 1); per tile :func:`count_tile`, combine :func:`sum_counts`, finish
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
farther than that bound from the threshold; otherwise the canonical key is
computed for that pair.  So every number is independent of tile sizes, worker
counts and the BLAS, and exact ties (duplicate rows) stay exact ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit as _numba_njit

#: Unit roundoff of float32.
_U32 = 2.0**-24


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


def error_bound_factor(dim: int) -> float:
    """Safety-doubled ``gamma_D`` bound on the float32 dot-product error, relative."""
    return 2.0 * (dim + 2) * _U32


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
        s = 0.0
        for k in range(d):
            v = np.float64(x[i, k])
            s += v * v
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


@njit(cache=True, nogil=True)
def _canonical_keys(q, grows, js, n, cosine, out):
    """``out[t] = _canonical_key(q, grows[js[t]], cosine)`` for ``t < n``, bit for bit.

    Four pairs at a time, each with its own accumulator: every key is still the same
    sequential sum (same terms, same order, no contraction), but the four independent
    chains share the loads of ``q`` and fill the vector lanes (~1.8x faster per key than
    one pair at a time on AVX2).
    """
    d = q.shape[0]
    t = 0
    while t + 4 <= n:
        g0 = grows[js[t]]
        g1 = grows[js[t + 1]]
        g2 = grows[js[t + 2]]
        g3 = grows[js[t + 3]]
        s0 = 0.0
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        if cosine:
            for k in range(d):
                qk = np.float64(q[k])
                s0 += qk * np.float64(g0[k])
                s1 += qk * np.float64(g1[k])
                s2 += qk * np.float64(g2[k])
                s3 += qk * np.float64(g3[k])
            out[t] = -s0
            out[t + 1] = -s1
            out[t + 2] = -s2
            out[t + 3] = -s3
        else:
            for k in range(d):
                qk = np.float64(q[k])
                d0 = qk - np.float64(g0[k])
                d1 = qk - np.float64(g1[k])
                d2 = qk - np.float64(g2[k])
                d3 = qk - np.float64(g3[k])
                s0 += d0 * d0
                s1 += d1 * d1
                s2 += d2 * d2
                s3 += d3 * d3
            out[t] = s0
            out[t + 1] = s1
            out[t + 2] = s2
            out[t + 3] = s3
        t += 4
    while t < n:
        out[t] = _canonical_key(q, grows[js[t]], cosine)
        t += 1


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
    """
    b, c = sim.shape
    hist = np.zeros(thr.shape[0], dtype=np.int64)
    gn = np.sqrt(gsq)
    gmax = gn.max() if c > 0 else 0.0
    half_gsq = (gsq / 2.0).astype(np.float32)
    hmax = np.float64(half_gsq.max()) if c > 0 else 0.0
    near = np.empty(c, dtype=np.uint8)
    # the row's items too close to a threshold to call from float32: their canonical
    # keys are computed together after the row's scan (_canonical_keys)
    amb = np.empty(c, dtype=np.int64)
    amb_keys = np.empty(c, dtype=np.float64)
    for i in range(b):
        lo = toff[i]
        hi = toff[i + 1]
        if lo == hi:
            continue
        qn = np.sqrt(qsq[i])
        # Skip test with the chunk's largest error bound: key - eps_max > t_max means
        # certainly behind every relevant item, the common case.  A branch-free float32
        # pass (it vectorises) marks the items that may pass it.
        if cosine:
            cut = -(thr[hi - 1] + bound * qn * gmax)  # skip when s < cut
            # The largest float32 <= cut keeps every s >= cut.
            cut32 = np.float32(cut)
            if np.float64(cut32) > cut:
                cut32 = np.nextafter(cut32, np.float32(-np.inf))
            for j in range(c):
                near[j] = sim[i, j] >= cut32
        else:
            r = qn + gmax
            cut = thr[hi - 1] - qsq[i] + bound * r * r  # skip when gsq - 2 s > cut
            # gsq/2 - s in float32, widened by its own rounding error (float32
            # roundings of values up to hmax + qn gmax) so it never drops an item the
            # float64 test keeps.
            slack = 4.0 * _U32 * (hmax + qn * gmax + abs(cut) / 2.0)
            cut32 = np.float32(cut / 2.0 + slack)
            if np.float64(cut32) < cut / 2.0 + slack:
                cut32 = np.nextafter(cut32, np.float32(np.inf))
            for j in range(c):
                near[j] = half_gsq[j] - sim[i, j] <= cut32
        n_amb = 0
        for j in range(c):
            if near[j] == 0:
                continue
            s = np.float64(sim[i, j])
            if cosine:
                if s < cut:
                    continue
            elif gsq[j] - 2.0 * s > cut:
                continue
            if glab[j] == qlab[i] or gjunk[j]:
                continue  # relevant (or same-camera junk), or a junk label
            if exclude_self and gid[j] == qid[i]:
                continue
            if cosine:
                key = -s
                eps = bound * qn * gn[j]
            else:
                key = qsq[i] + gsq[j] - 2.0 * s
                r = qn + gn[j]
                eps = bound * r * r
            # Thresholds below key - eps are certainly ahead of g; g is certainly ahead
            # of those at or above key + eps; one in between is too close to call from
            # float32, so the canonical key decides.
            p = _count_less(thr, lo, hi, key - eps)
            if lo + p < hi and thr[lo + p] < key + eps:
                amb[n_amb] = j
                n_amb += 1
                continue
            if p < hi - lo:
                hist[lo + p] += 1
        if n_amb:
            _canonical_keys(qrows[i], grows, amb, n_amb, cosine, amb_keys)
            for t in range(n_amb):
                p = _count_less(thr, lo, hi, amb_keys[t])
                if p < hi - lo:
                    hist[lo + p] += 1
    return hist


def sum_counts(parts):
    """Combine: add the per-chunk ``count_tile`` histograms of one query block.

    ``parts`` is a non-empty list of equal-shape int64 arrays; none is modified.
    """
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


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
