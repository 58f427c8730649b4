"""Verification metrics over all query-gallery pairs: TPR at fixed FPR, the ROC curve
and the distance histograms, exact, in bounded memory.

Every valid (query, gallery) pair of the protocol (``dense_masks``: the validity rule
of ranking) is a *positive* (same label) or a *negative* pair.  A threshold t accepts
the pairs with distance ``d <= t``; ``FPR(t)`` and ``TPR(t)`` are the accepted
fractions of negatives and positives.  With N negatives sorted ``n_1 <= ... <= n_N``
and ``m = floor(x N)`` (< N for x < 1):

    TPR@FPR=x = max { TPR(t) : FPR(t) <= x } = #{positives with d < n_(m+1)} / P

: the largest threshold keeps at most m negatives, and a negative tied with a positive
at the threshold rejects both (ties count against the encoder, as in ranking).  This is
the ROC curve's exact upper-left envelope at x, not fast-reid's nearest ROC point
(``argmin |fpr - x|``), which can sit above x.  ``threshold@fpr`` is ``n_(m+1)``: a
deployment accepting ``d < threshold`` runs at FPR <= x with that TPR.  The ROC curve
is this envelope at :data:`ROC_FPRS` (1e-6 .. 0.56, four points per decade) and at the
requested levels.

Distances are those of ranking (:mod:`rankwise.kernels`' canonical float64 keys):
cosine ``d = 1 - cos``, euclidean ``d = ||q - g||`` (compared as squared keys).

Out of core, without the pair list (two passes over float32 BLAS tiles):

1. per (query block x gallery chunk) tile, the float32 tile keys ``k~`` of the
   negatives, whose error ``|k~ - k| <= eps`` is bounded as in ranking, go into a
   fine histogram (:data:`FINE_BINS` bins over the keys' a-priori range); the
   positives (few) get their canonical keys pair by pair.  For a level's rank
   ``r = m + 1`` the bin B holding the r-th approximate key brackets the exact one:
   ``n_(r)`` lies in ``[edge_B - eps, edge_(B+1) + eps]``;
2. the same tiles again: negatives certainly below a bracket are counted, those that
   may fall in it get their canonical key and are kept (a bracket is one fine bin
   wide plus 2 eps: a tiny share of N), so ``n_(r)`` is picked exactly; the display
   histograms (:data:`HIST_BINS` bins over the pairs' range) are filled on the way, a
   pair within eps of a bin edge placed by its canonical key.

Memory: the fine histogram, the positives' keys and the bracketed keys -- never ``Q x G``.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import RankwiseError
from .kernels import _canonical_key, njit
from .options import (
    JUNK_LABELS,
    VERIFICATION_BINS,
    VERIFICATION_FPRS,
    check_all_pairs,
    check_junk_labels,
)

#: The FPR levels fast-reid reports (the ``verification`` option's default).
FPRS = VERIFICATION_FPRS.default
#: The ROC curve's FPR grid: 1e-6 .. 10^-0.25, four points per decade.
ROC_FPRS = tuple(10.0 ** (k / 4) for k in range(-24, 0))
#: Bins of pass 1's fine histogram of negative keys (the brackets' width).
FINE_BINS = 1 << 14
#: Bins of the positive/negative distance histograms in the result.
HIST_BINS = VERIFICATION_BINS.default


def check_fprs(fprs: Iterable[float] | str, label: str = "fprs") -> tuple[float, ...]:
    """FPR levels (``"1e-4,1e-3"`` or numbers), sorted; ``label`` names the option."""
    bad = RankwiseError(
        f"{label} must be numbers between 0 and 1 (exclusive), e.g. 1e-4,1e-3,1e-2; got {fprs!r}"
    )
    try:
        items = fprs.split(",") if isinstance(fprs, str) else list(fprs)
        out = tuple(float(x) for x in items)
    except (TypeError, ValueError):
        raise bad from None
    if not out or any(not (0.0 < x < 1.0) for x in out):
        raise bad
    levels = tuple(sorted(set(out)))
    for a, b in itertools.pairwise(levels):
        key = f"{b:g}"  # the reports' key
        if f"{a:g}" == key:  # one would silently replace the other in the JSON
            raise RankwiseError(
                f"{label}: {a!r} and {b!r} are both reported as {key!r} (6 significant "
                "digits); give levels that differ there"
            )
    return levels


def tpr_at_fpr(
    query,
    gallery,
    query_embeddings,
    gallery_embeddings,
    *,
    protocol: str = "reid",
    distance: str = "cosine",
    fprs: Iterable[float] = FPRS,
    junk_labels: Iterable[str] = JUNK_LABELS.default,
    exclude_same_camera: bool = True,
    bins: int = HIST_BINS,
    query_block: int = 256,
    gallery_chunk: int = 8192,
    workers: int | None = None,
) -> dict[str, Any]:
    """TPR at each FPR in ``fprs`` over all valid query-gallery pairs, the ROC curve and
    the distance histograms (module docstring).

    Parameters
    ----------
    query, gallery, query_embeddings, gallery_embeddings, protocol, distance,
    junk_labels, exclude_same_camera : as :func:`rankwise.evaluate` (``recall`` or
        ``reid``: protocols that pair every query with the whole gallery).
    fprs : FPR levels, each in (0, 1).
    bins : bins of the distance histograms.
    query_block, gallery_chunk : tile shape; never changes a number.
    workers : threads of the second pass's kernel (default: all cores); never changes
        a number.

    Returns
    -------
    ``{"tpr@fpr": {"0.0001": percent, ...}, "threshold@fpr": {"0.0001": d, ...},
    "roc": {"fpr": [...], "tpr": [...]}`` (percent; FPR the level x),
    ``"histogram": {"edges": [bins + 1], "positive": [bins], "negative": [bins]}``
    (distances d; bin b is ``[edges[b], edges[b+1])``, the last one closed),
    ``"distance"``, ``"num_positive_pairs": P, "num_negative_pairs": N}``.
    """
    from .inputs import open_inputs
    from .options import GALLERY_CHUNK, QUERY_BLOCK, WORKERS
    from .ranking import check_distance

    fprs = check_fprs(fprs)
    bins = VERIFICATION_BINS.check(bins)
    check_distance(distance)
    check_all_pairs(protocol, "tpr_at_fpr")
    QUERY_BLOCK.check(query_block)
    GALLERY_CHUNK.check(gallery_chunk)
    workers = WORKERS.check(workers) or os.cpu_count() or 1
    inputs = open_inputs(query, gallery, query_embeddings, gallery_embeddings, protocol=protocol)
    problem = inputs.problem(
        junk_labels=check_junk_labels(junk_labels),  # as rankwise.rank reads them
        exclude_same_camera=exclude_same_camera,
    )
    pairs = _Pairs(inputs, problem, distance == "cosine", query_block, gallery_chunk)
    fine, n_neg, positives = pairs.first_pass()
    where = ", ".join(inputs.names)
    if n_neg == 0:
        raise RankwiseError(
            f"{where}: no negative pair (every valid pair has the query's label), so no "
            "false positive rate; the gallery needs items of other labels"
        )
    if len(positives) == 0:
        raise RankwiseError(
            f"{where}: no positive pair (no valid gallery item shares a query's label); "
            "check the labels and the junk_labels / same-camera settings"
        )
    levels = tuple(sorted(set(fprs) | set(ROC_FPRS)))
    # r = m + 1 <= N, m = floor(x N) of the level as written (0.29, not the float
    # 0.28999...: x * N in floats can fall just below an integer, one negative short)
    ranks = [math.floor(Fraction(repr(x)) * n_neg) + 1 for x in levels]
    brackets = [pairs.bracket(fine, r) for r in ranks]
    edges = pairs.display_edges(fine, positives, bins)
    below, kept, neg_hist = pairs.second_pass(brackets, edges, workers)
    pos_hist = _histogram(positives, edges)
    positives = np.sort(positives)
    tpr, threshold = {}, {}
    for x, r, (lo, hi), n_below in zip(levels, ranks, brackets, below, strict=True):
        inside = np.sort(kept[(kept >= lo) & (kept <= hi)])
        k = r - 1 - n_below
        if not 0 <= k < len(inside):  # the bracket proof failed: never expected
            raise AssertionError(f"verification bracket of FPR {x:g} misses n_({r})")
        n_r = inside[k]
        tpr[x] = 100.0 * int(np.searchsorted(positives, n_r, side="left")) / len(positives)
        threshold[x] = pairs.to_distance(n_r)
    return {
        "distance": distance,
        "tpr@fpr": {f"{x:g}": tpr[x] for x in fprs},
        "threshold@fpr": {f"{x:g}": float(threshold[x]) for x in fprs},
        # levels below 1/N (m = 0) all mean "no negative accepted": the curve starts at 1/N
        "roc": {
            "fpr": [x for x, r in zip(levels, ranks, strict=True) if r >= 2],
            "tpr": [tpr[x] for x, r in zip(levels, ranks, strict=True) if r >= 2],
        },
        "histogram": {
            "edges": [float(e) for e in pairs.to_distance(edges)],
            "positive": [int(c) for c in pos_hist],
            "negative": [int(c) for c in neg_hist],
        },
        "num_positive_pairs": int(len(positives)),
        "num_negative_pairs": int(n_neg),
    }


def _float_order(x: float) -> int:
    """An integer of each float64 in the floats' order (-0.0 and 0.0 both 0)."""
    i = int(np.array([x], dtype=np.float64).view(np.int64)[0])
    return i if i >= 0 else -(i & 0x7FFF_FFFF_FFFF_FFFF)


def _order_float(i: int) -> np.float64:
    """The float64 of :func:`_float_order`'s integer ``i``."""
    bits = i if i >= 0 else (-i) - (1 << 63)  # sign bit set: magnitude - 2^63 as int64
    return np.array([bits], dtype=np.int64).view(np.float64)[0]


def _histogram(keys: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Counts of ``keys`` in ``[edges[b], edges[b+1])`` (the last bin closed)."""
    b = np.searchsorted(edges, keys, side="right") - 1
    b[keys == edges[-1]] = len(edges) - 2
    if len(b) and (b.min() < 0 or b.max() > len(edges) - 2):  # the range proof failed
        raise AssertionError("a verification distance falls outside the histogram range")
    return np.bincount(b, minlength=len(edges) - 1)


class _Pairs:
    """The valid pairs' keys, tile by tile (module docstring): canonical keys
    ``k`` (cosine ``-cos``, euclidean squared distance) and float32 tile keys ``k~``
    with ``|k~ - k| <= eps`` for every pair."""

    def __init__(self, inputs, problem, cosine: bool, query_block: int, gallery_chunk: int):
        from . import kernels
        from .ranking import prepare_chunk

        self.inputs, self.problem, self.cosine = inputs, problem, cosine
        self.block, self.chunk = query_block, gallery_chunk
        q = inputs.query_embeddings
        self.qrows, self.qsq = prepare_chunk(q, 0, q.shape[0], cosine)
        self.n_g = inputs.gallery_embeddings.shape[0]
        # The a-priori key range and one error bound for every pair, from the norms
        # (a read of the gallery that also checks its rows before any tile).
        gmax = max(
            (float(np.sqrt(self._chunk(c0)[1].max())) for c0 in range(0, self.n_g, gallery_chunk)),
            default=0.0,
        )
        qmax = float(np.sqrt(self.qsq.max()))
        factor = kernels.error_bound_factor(q.shape[1])
        if cosine:
            self.eps = factor * qmax * gmax
            self.lo, self.hi = -1.0 - self.eps, 1.0 + self.eps
        else:
            self.eps = factor * (qmax + gmax) ** 2
            # every row zero: every key is exactly 0 (a range of 1 keeps the bins apart)
            self.lo, self.hi = 0.0, ((qmax + gmax) ** 2 + self.eps) or 1.0
        self.width = (self.hi - self.lo) / FINE_BINS

    def _chunk(self, c0: int):
        from .ranking import prepare_chunk

        return prepare_chunk(
            self.inputs.gallery_embeddings, c0, min(c0 + self.chunk, self.n_g), self.cosine
        )

    def tiles(self):
        """Per tile: its gallery rows and squared norms, first query row ``r0``, the
        float32 similarities, the valid-negative mask (:func:`dense_masks`, the one
        statement of the rule) and the chunk's positives' canonical keys."""
        from . import kernels
        from .protocols import dense_masks

        problem = self.problem
        n_q = len(self.qrows)
        for c0 in range(0, self.n_g, self.chunk):
            grows, gsq = self._chunk(c0)
            c1 = c0 + len(grows)
            mine = (problem.pair_g >= c0) & (problem.pair_g < c1)
            positives = kernels.pair_keys(
                self.qrows, grows, problem.pair_q[mine], problem.pair_g[mine] - c0, self.cosine
            )
            cols = np.arange(c0, c1, dtype=np.int64)[None, :]
            for r0 in range(0, n_q, self.block):
                r1 = min(r0 + self.block, n_q)
                sim = self.qrows[r0:r1] @ grows.T
                valid, relevant = dense_masks(
                    problem, np.arange(r0, r1, dtype=np.int64)[:, None], cols
                )
                yield grows, gsq, r0, sim, valid & ~relevant, positives
                positives = positives[:0]  # once per chunk

    def first_pass(self):
        """``(fine histogram of the negatives' k~, N, positives' canonical keys)``."""
        fine = np.zeros(FINE_BINS, dtype=np.int64)
        n_neg, positives = 0, []
        for _, gsq, r0, sim, neg, pos in self.tiles():
            qsq = self.qsq[r0 : r0 + len(sim)]
            n_neg += _fine_tile(sim, neg, qsq, gsq, self.cosine, self.lo, self.width, fine)
            positives.append(pos)
        return fine, n_neg, np.concatenate(positives)

    def bracket(self, fine: np.ndarray, r: int) -> tuple[float, float]:
        """Keys ``[lo, hi]`` certain to hold the r-th smallest negative key: the fine
        bin B of the r-th k~, widened by eps (open-ended at the clipped end bins)."""
        b = int(np.searchsorted(np.cumsum(fine), r, side="left"))
        lo = -math.inf if b == 0 else self.lo + b * self.width - self.eps
        hi = math.inf if b == FINE_BINS - 1 else self.lo + (b + 1) * self.width + self.eps
        return lo, hi

    def display_edges(self, fine: np.ndarray, positives: np.ndarray, bins: int) -> np.ndarray:
        """Keys of ``bins + 1`` edges, uniform in distance, over every pair's key
        (the negatives' occupied fine bins widened by eps, and the positives)."""
        occupied = np.flatnonzero(fine)
        lo = min(self.lo + occupied[0] * self.width - self.eps, positives.min(initial=np.inf))
        hi = max(
            self.lo + (occupied[-1] + 1) * self.width + self.eps, positives.max(initial=-np.inf)
        )
        lo, hi = max(lo, self.lo), min(hi, self.hi)
        d = np.linspace(self.to_distance(lo), self.to_distance(hi), bins + 1)
        keys = d - 1.0 if self.cosine else d * d
        keys[0], keys[-1] = lo, hi  # exactly the range, whatever the round trip
        for b in range(1, bins):
            keys[b] = self._least_key(keys[b], lo)
        return keys

    def _least_key(self, key: float, floor: float) -> float:
        """The smallest key (above ``floor``) whose distance is that of ``key``: the key
        of a distance edge, so that a pair's key lies at or above it exactly when its
        distance lies at or above the edge the report prints (``d * d`` can round above
        the key of a pair at distance d: a pair on an edge fell into the bin below).
        Bisection on the floats' order; the distance is monotone in the key."""
        target = float(self.to_distance(key))
        lo, hi = _float_order(floor), _float_order(key)
        if float(self.to_distance(_order_float(lo))) >= target:
            return float(_order_float(lo))
        while hi - lo > 1:  # distance(lo) < target <= distance(hi)
            mid = (lo + hi) // 2
            if float(self.to_distance(_order_float(mid))) >= target:
                hi = mid
            else:
                lo = mid
        return float(_order_float(hi))

    def to_distance(self, key):
        """Distance d of canonical key(s): cosine ``1 + key``, euclidean ``sqrt(key)``."""
        key = np.asarray(key, dtype=np.float64)
        return 1.0 + key if self.cosine else np.sqrt(np.maximum(key, 0.0))

    def second_pass(self, brackets, edges, workers: int = 1):
        """Per bracket the negatives certainly below it, the canonical keys of those
        that may lie in one, and the negatives' display histogram.  ``workers`` threads
        run the per-tile kernel (it releases the GIL) while the next tile's BLAS runs;
        integer counts and a set of kept keys: the same result for any ``workers``."""
        from concurrent.futures import ThreadPoolExecutor

        lows = np.array([lo for lo, _ in brackets])
        order = np.argsort(lows, kind="stable")
        cut = lows[order] - self.eps  # k~ < lo - eps: certainly below lo
        spans = _merge(brackets, self.eps)
        d0, d1 = self.to_distance(edges[[0, -1]])
        dw = max((d1 - d0) / (len(edges) - 1), np.finfo(float).tiny)

        def run(tile):
            grows, gsq, r0, sim, neg, _ = tile
            n = len(sim)
            counts = np.zeros(len(cut) + 1, dtype=np.int64)
            fix = np.zeros(len(brackets), dtype=np.int64)
            hist = np.zeros(len(edges) - 1, dtype=np.int64)
            out = np.empty(sim.size, dtype=np.float64)
            k = _bracket_tile(
                sim, neg, self.qrows[r0 : r0 + n], grows, self.qsq[r0 : r0 + n], gsq,
                self.cosine, self.eps, cut, spans, lows, edges, d0, dw, counts, fix, hist, out,
            )  # fmt: skip
            return counts, fix, hist, out[:k].copy()

        counts = np.zeros(len(cut) + 1, dtype=np.int64)
        fix = np.zeros(len(brackets), dtype=np.int64)
        hist = np.zeros(len(edges) - 1, dtype=np.int64)
        kept = []

        def fold(part) -> None:
            counts[:] += part[0]
            fix[:] += part[1]
            hist[:] += part[2]
            kept.append(part[3])

        with ThreadPoolExecutor(max_workers=workers) as pool:
            pending: list = []
            for tile in self.tiles():
                pending.append(pool.submit(run, tile))
                while len(pending) > workers:  # at most workers + 1 tiles alive
                    fold(pending.pop(0).result())
            for future in pending:
                fold(future.result())
        # certainly below the p-th lowest bracket: the k~ with at most p cuts at or
        # below them; plus those whose canonical key turned out below
        below = np.zeros(len(brackets), dtype=np.int64)
        below[order] = np.cumsum(counts)[:-1]
        return below + fix, np.concatenate(kept), hist


@njit(cache=True, nogil=True, inline="always")
def _tile_key(sim, i, j, qsq, gsq, cosine):
    """The float32 tile key ``k~`` of pair (i, j): within eps of the canonical key."""
    s = np.float64(sim[i, j])
    return -s if cosine else qsq[i] + gsq[j] - 2.0 * s


@njit(cache=True, nogil=True)
def _fine_tile(sim, neg, qsq, gsq, cosine, lo, width, fine):
    """Pass 1, per tile: each valid negative's k~ into ``fine`` (end bins clipped);
    returns the number of negatives."""
    n = 0
    last = fine.shape[0] - 1
    for i in range(sim.shape[0]):
        for j in range(sim.shape[1]):
            if neg[i, j]:
                b = int((_tile_key(sim, i, j, qsq, gsq, cosine) - lo) / width)
                fine[min(max(b, 0), last)] += 1
                n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def _upper(values, x):
    """Number of ``values`` (sorted, short) at or below ``x``."""
    a, b = 0, values.shape[0]
    while a < b:
        m = (a + b) >> 1
        if values[m] <= x:
            a = m + 1
        else:
            b = m
    return a


@njit(cache=True, nogil=True, inline="always")
def _edge_bin(edges, x, guess):
    """The bin b of ``x`` with ``edges[b] <= x < edges[b+1]``, clipped to the bins,
    walking from ``guess`` (the arithmetic bin: right but for rounding)."""
    last = edges.shape[0] - 2
    b = min(max(guess, 0), last)
    while b > 0 and x < edges[b]:
        b -= 1
    while b < last and x >= edges[b + 1]:
        b += 1
    return b


@njit(cache=True, nogil=True)
def _bracket_tile(
    sim, neg, qrows, grows, qsq, gsq, cosine, eps, cut, spans, lows, edges, d0, dw, counts,
    fix, hist, out,
):  # fmt: skip
    """Pass 2, per tile (module docstring): ``counts[s]`` += negatives with s cuts at
    or below their k~; a negative whose k~ lies in a span (a bracket widened by eps) or
    within eps of a display edge gets its canonical key; those in a span go to ``out``
    (returns how many) and add to ``fix[t]`` when below bracket t's ``lows[t]`` although
    k~ was not below ``lows[t] - eps``; every negative adds to ``hist`` (edges uniform
    in distance from ``d0`` by ``dw``)."""
    n = 0
    last = edges.shape[0] - 2
    starts = spans[:, 0].copy()
    for i in range(sim.shape[0]):
        for j in range(sim.shape[1]):
            if not neg[i, j]:
                continue
            a = _tile_key(sim, i, j, qsq, gsq, cosine)
            counts[_upper(cut, a)] += 1
            p = _upper(starts, a) - 1
            maybe = p >= 0 and a <= spans[p, 1]
            d = 1.0 + a if cosine else np.sqrt(max(a, 0.0))
            e = _edge_bin(edges, a, int((d - d0) / dw))
            key = a
            if maybe or a - edges[e] <= eps or edges[e + 1] - a <= eps:
                key = _canonical_key(qrows[i], grows[j], cosine)
                e = _edge_bin(edges, key, e)
                if key < edges[0] or key > edges[last + 1]:
                    raise AssertionError("a verification distance is outside the histogram")
            hist[e] += 1
            if maybe:
                out[n] = key
                n += 1
                for t in range(lows.shape[0]):
                    if key < lows[t] and a >= lows[t] - eps:
                        fix[t] += 1
    return n


def _merge(brackets, eps: float) -> np.ndarray:
    """The union of the brackets widened by eps (k~ that may hold a key inside),
    as sorted disjoint ``[lo, hi]`` rows."""
    spans = sorted((lo - eps, hi + eps) for lo, hi in brackets)
    out = [list(spans[0])]
    for lo, hi in spans[1:]:
        if lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return np.array(out, dtype=np.float64)
