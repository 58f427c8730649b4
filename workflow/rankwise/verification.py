"""Verification metrics over all query-gallery pairs: TPR at fixed FPR, exact.

Every valid (query, gallery) pair of the protocol (``dense_masks``: the validity rule
of ranking) is a *positive* (same label) or a *negative* pair.  A threshold t accepts
the pairs with distance ``d <= t``; ``FPR(t)`` and ``TPR(t)`` are the accepted
fractions of negatives and positives.  With N negatives sorted ``n_1 <= ... <= n_N``
and ``m = floor(x N)`` (< N for x < 1):

    TPR@FPR=x = max { TPR(t) : FPR(t) <= x } = #{positives with d < n_(m+1)} / P

: the largest threshold keeps at most m negatives, and
a negative tied with a positive at the threshold rejects both (ties count against the
encoder, as in ranking).  This is the ROC curve's exact upper-left envelope at x, not
fast-reid's nearest ROC point (``argmin |fpr - x|``), which can sit above x.

Out of core: per (query block x gallery chunk) tile the canonical distances of
:mod:`rankwise.kernels` (float64), the number of negatives, and the tile's smallest
``m + 1`` negatives merged into one buffer of at most ``2 (m + 1)`` values -- so the
memory is ``~16 x N`` bytes at the largest FPR (1e-2: 1 % of the negatives), never
the pair list; the positives (few) are computed pair by pair.
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


def _smallest(values: np.ndarray, keep: int) -> np.ndarray:
    """The ``keep`` smallest of ``values`` (all of them when fewer), unsorted."""
    if len(values) <= keep:
        return values
    return np.partition(values, keep - 1)[:keep]


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
    query_block: int = 256,
    gallery_chunk: int = 8192,
) -> dict[str, Any]:
    """TPR at each FPR in ``fprs`` over all valid query-gallery pairs (module docstring).

    Parameters
    ----------
    query, gallery, query_embeddings, gallery_embeddings, protocol, distance,
    junk_labels, exclude_same_camera : as :func:`rankwise.evaluate` (``recall`` or
        ``reid``: protocols that pair every query with the whole gallery).
    fprs : FPR levels, each in (0, 1).
    query_block, gallery_chunk : tile shape; never changes a number.

    Returns
    -------
    ``{"tpr@fpr": {"0.0001": percent, ...}, "num_positive_pairs": P,
    "num_negative_pairs": N}``.
    """
    from .inputs import open_inputs
    from .options import GALLERY_CHUNK, QUERY_BLOCK
    from .protocols import dense_masks
    from .ranking import check_distance, prepare_chunk
    from .rerank import distance_tile, pair_distances

    fprs = check_fprs(fprs)
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
    cosine = distance == "cosine"
    q = prepare_chunk(inputs.query_embeddings, 0, inputs.query_embeddings.shape[0], cosine)[0]
    g_src = inputs.gallery_embeddings
    n_q, n_g = len(q), g_src.shape[0]

    # An upper bound on N (every pair) sizes the buffer; the exact m follows from N.
    keep = max(1, math.floor(max(fprs) * n_q * n_g) + 1)
    buffer = np.zeros(0)
    n_neg = 0
    for c0 in range(0, n_g, gallery_chunk):
        c1 = min(c0 + gallery_chunk, n_g)
        g = prepare_chunk(g_src, c0, c1, cosine)[0]
        cols = np.arange(c0, c1, dtype=np.int64)[None, :]
        for r0 in range(0, n_q, query_block):
            rows = np.arange(r0, min(r0 + query_block, n_q), dtype=np.int64)
            d = distance_tile(q[rows], g, cosine)
            valid, relevant = dense_masks(problem, rows[:, None], cols)
            negatives = d[valid & ~relevant]
            n_neg += len(negatives)
            buffer = _smallest(np.concatenate([buffer, _smallest(negatives, keep)]), keep)
    if n_neg == 0:
        raise RankwiseError(
            "tpr_at_fpr: no negative pair (every valid pair has the query's label); "
            "the gallery needs items of other labels"
        )
    buffer = np.sort(buffer)
    # The positives: every valid same-label pair (those of skipped queries too: none).
    rows = np.concatenate([q, prepare_chunk(g_src, 0, n_g, cosine)[0]])
    positives = pair_distances(rows, problem.pair_q, problem.pair_g + n_q, cosine)
    out = {}
    for x in fprs:
        m = math.floor(x * n_neg)  # < n_neg: x < 1
        accepted = int(np.count_nonzero(positives < buffer[m]))
        out[f"{x:g}"] = 100.0 * accepted / len(positives)
    return {
        "tpr@fpr": out,
        "num_positive_pairs": int(len(positives)),
        "num_negative_pairs": int(n_neg),
    }
