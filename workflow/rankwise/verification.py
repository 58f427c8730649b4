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

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import RankwiseError
from .options import JUNK_LABELS, rerank_applies

#: The FPR levels fast-reid reports.
FPRS = (1e-4, 1e-3, 1e-2)
#: The ROC curve's FPR grid: 1e-6 .. 10^-0.25, four points per decade.
ROC_FPRS = tuple(10.0 ** (k / 4) for k in range(-24, 0))
#: Bins of pass 1's fine histogram of negative keys (the brackets' width).
FINE_BINS = 1 << 14
#: Bins of the positive/negative distance histograms in the result.
HIST_BINS = 60


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
    return tuple(sorted(set(out)))


def check_bins(bins: int, label: str = "bins") -> int:
    """Histogram bins: an integer >= 1."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise RankwiseError(f"{label} must be an integer >= 1 (e.g. 60); got {bins!r}")
    return int(bins)


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

    Returns
    -------
    ``{"tpr@fpr": {"0.0001": percent, ...}, "threshold@fpr": {"0.0001": d, ...},
    "roc": {"fpr": [...], "tpr": [...]}`` (percent; FPR the level x),
    ``"histogram": {"edges": [bins + 1], "positive": [bins], "negative": [bins]}``
    (distances d; bin b is ``[edges[b], edges[b+1])``, the last one closed),
    ``"distance"``, ``"num_positive_pairs": P, "num_negative_pairs": N}``.
    """
    from .inputs import open_inputs
    from .options import GALLERY_CHUNK, QUERY_BLOCK
    from .ranking import check_distance

    fprs = check_fprs(fprs)
    bins = check_bins(bins)
    check_distance(distance)
    if not rerank_applies(protocol):  # the same protocols as re-ranking
        raise RankwiseError(
            f"tpr_at_fpr does not apply to protocol {protocol!r}: it needs every query "
            "paired with the whole gallery (protocols recall, reid)"
        )
    QUERY_BLOCK.check(query_block)
    GALLERY_CHUNK.check(gallery_chunk)
    inputs = open_inputs(query, gallery, query_embeddings, gallery_embeddings, protocol=protocol)
    problem = inputs.problem(
        junk_labels=tuple(junk_labels), exclude_same_camera=exclude_same_camera
    )
    pairs = _Pairs(inputs, problem, distance == "cosine", query_block, gallery_chunk)
    fine, n_neg, positives = pairs.first_pass()
    if n_neg == 0:
        raise RankwiseError(
            "tpr_at_fpr: no negative pair (every valid pair has the query's label); "
            "the gallery needs items of other labels"
        )
    if len(positives) == 0:
        raise RankwiseError(
            "tpr_at_fpr: no positive pair (no valid gallery item shares a query's label); "
            "check the labels and the junk_labels / same-camera settings"
        )
    levels = tuple(sorted(set(fprs) | set(ROC_FPRS)))
    ranks = [math.floor(x * n_neg) + 1 for x in levels]  # r = m + 1 <= N
    brackets = [pairs.bracket(fine, r) for r in ranks]
    edges = pairs.display_edges(fine, positives, bins)
    below, kept, neg_hist = pairs.second_pass(brackets, edges)
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
        # levels below 1/N all mean "no negative accepted": the curve starts at 1/N
        "roc": {
            "fpr": [x for x in levels if x * n_neg >= 1],
            "tpr": [tpr[x] for x in levels if x * n_neg >= 1],
        },
        "histogram": {
            "edges": [float(e) for e in pairs.to_distance(edges)],
            "positive": [int(c) for c in pos_hist],
            "negative": [int(c) for c in neg_hist],
        },
        "num_positive_pairs": int(len(positives)),
        "num_negative_pairs": int(n_neg),
    }


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
            self.lo, self.hi = 0.0, (qmax + gmax) ** 2 + self.eps
        self.width = (self.hi - self.lo) / FINE_BINS

    def _chunk(self, c0: int):
        from .ranking import prepare_chunk

        return prepare_chunk(
            self.inputs.gallery_embeddings, c0, min(c0 + self.chunk, self.n_g), self.cosine
        )

    def tiles(self):
        """Per tile: its gallery rows, query rows ``i`` and gallery columns ``j``
        (tile-local) of the valid negatives, their tile keys ``k~``, and the chunk's
        positives' canonical keys."""
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
                i, j = np.nonzero(valid & ~relevant)
                s = sim[i, j].astype(np.float64)
                approx = -s if self.cosine else self.qsq[r0 + i] + gsq[j] - 2.0 * s
                yield grows, r0, i, j, approx, positives
                positives = positives[:0]  # once per chunk

    def exact(self, grows, r0, i, j) -> np.ndarray:
        """Canonical keys of the tile's pairs ``(r0 + i, j)``."""
        from . import kernels

        return kernels.pair_keys(self.qrows, grows, r0 + i, j, self.cosine)

    def first_pass(self):
        """``(fine histogram of the negatives' k~, N, positives' canonical keys)``."""
        fine = np.zeros(FINE_BINS, dtype=np.int64)
        n_neg, positives = 0, []
        for _, _, _, _, approx, pos in self.tiles():
            n_neg += len(approx)
            positives.append(pos)
            b = np.clip(((approx - self.lo) / self.width).astype(np.int64), 0, FINE_BINS - 1)
            fine += np.bincount(b, minlength=FINE_BINS)
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
        return keys

    def to_distance(self, key):
        """Distance d of canonical key(s): cosine ``1 + key``, euclidean ``sqrt(key)``."""
        key = np.asarray(key, dtype=np.float64)
        return 1.0 + key if self.cosine else np.sqrt(np.maximum(key, 0.0))

    def second_pass(self, brackets, edges):
        """Per bracket the negatives certainly below it, the canonical keys of those
        that may lie in one, and the negatives' display histogram."""
        lows = np.array([lo for lo, _ in brackets])
        order = np.argsort(lows, kind="stable")
        cut = lows[order] - self.eps  # k~ < lo - eps: certainly below lo
        spans = _merge(brackets, self.eps)
        below = np.zeros(len(brackets), dtype=np.int64)
        hist = np.zeros(len(edges) - 1, dtype=np.int64)
        kept = []
        for grows, r0, i, j, approx, _ in self.tiles():
            # certainly below the p-th lowest bracket: the k~ with fewer than p + 1
            # cuts at or below them (searchsorted <= p)
            counts = np.bincount(np.searchsorted(cut, approx, side="right"), minlength=len(cut) + 1)
            below[order] += np.cumsum(counts)[:-1]
            # may lie in a bracket (k~ within eps of it), or near a display edge
            s = np.searchsorted(spans[:, 0], approx, side="right") - 1
            maybe = (s >= 0) & (approx <= spans[np.maximum(s, 0), 1])
            e = np.clip(np.searchsorted(edges, approx), 1, len(edges) - 1)
            near = (approx - edges[e - 1] <= self.eps) | (edges[e] - approx <= self.eps)
            need = maybe | near
            keys = approx.copy()
            keys[need] = self.exact(grows, r0, i[need], j[need])
            hist += _histogram(keys, edges)
            exact = keys[maybe]
            # below a bracket's lo although k~ was not certainly below: count it now
            for t, (lo, _) in enumerate(brackets):
                if lo > -math.inf:
                    below[t] += np.count_nonzero((exact < lo) & (approx[maybe] >= lo - self.eps))
            kept.append(exact)
        return below, np.concatenate(kept) if kept else np.zeros(0), hist


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
