"""Average query expansion (AQE) out of core: embeddings -> expanded embeddings.

fast-reid's ``aqe`` (``fastreid/evaluation/query_expansion.py``, one expansion round,
after Chum et al., ICCV 2007), over the N = Q + G items (the queries, then the gallery
items, each in the string order of their ids: :func:`rankwise.rerank.item_order`) with
raw rows ``x`` and cosine similarities ``s`` of the L2-normalised rows:

    N(i)   = the k items most similar to i (i itself first; ties in that item order)
    x'(i)  = (1/k) sum_{j in N(i)} s(i, j)^alpha x(j)

Queries and gallery are both expanded; ranking then uses ``x'`` under the dataset's
distance, like any embeddings (rows stored as float32, as fast-reid's features are).
``s`` is the canonical float64 dot product of :mod:`rankwise.kernels`; fast-reid takes
it from a float32 matrix product and its ``np.argpartition`` orders exactly tied
neighbours arbitrarily.  The neighbour lists come from the tiled pass of
:mod:`rankwise.rerank` (never the N x N matrix); memory is ``x`` and ``x'`` (N x D).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .embeddings import EmbeddingSource, open_embeddings
from .errors import RankwiseError
from .kernels import pair_keys
from .options import AQE


def _self_first(nn: np.ndarray) -> np.ndarray:
    """Each row's neighbour list ``(N, k)`` with the item itself first, the others in
    their order.  A row parallel to one of lower index ties with the item exactly (or
    beats it by a rounding) and would come first, or push the item out of a short list:
    ``--aqe 1,1`` replaced such a row by the other one."""
    n, k = nn.shape
    items = np.arange(n, dtype=nn.dtype)
    others = np.where(nn == items[:, None], -1, nn)
    order = np.argsort(others == -1, axis=1, kind="stable")  # the item's slot last
    others = np.take_along_axis(others, order, axis=1)[:, : k - 1]
    return np.concatenate([items[:, None], others], axis=1)


def estimate_memory_mb(
    n_query: int,
    n_gallery: int,
    dim: int,
    aqe: dict[str, Any],
    workers: int,
    block: int = 1024,
    chunk: int = 8192,
) -> tuple[float, float]:
    """Memory (MB) of query expansion, N = Q + G: ``(during, after)``.

    During :func:`expand`: the raw and the prepared rows (float32), the weighted sum
    (float64) and a float64 term of it, the result (float32) -- 28 bytes an ``N x D``
    value -- the neighbour lists (``N k`` distances and indices) and the neighbour
    pass's tiles (per worker).  After it, while ranking: the expanded rows (float32),
    and the top items' tile (:func:`rankwise.neighbours.tiled_top_items`: ~48 bytes a
    pair of at most ``TOP_TILE_VALUES``).
    """
    from .neighbours import TOP_TILE_VALUES
    from .rerank import neighbour_pass_mb

    n_all = n_query + n_gallery
    during = (28.0 * dim * n_all + 32.0 * n_all * int(aqe["k"])) / 2**20
    # the top items' tile, as tiled_top_items shapes it (never more pairs than Q x G)
    c = max(1, min(chunk, n_gallery))
    top_pairs = max(1, min(block, n_query, TOP_TILE_VALUES // c)) * c
    after = (4.0 * dim * n_all + 48.0 * top_pairs) / 2**20
    return during + neighbour_pass_mb(n_all, block, chunk, workers), after


def expand(
    query: EmbeddingSource,
    gallery: EmbeddingSource,
    aqe: dict[str, Any],
    options,
    runner,
    order: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[EmbeddingSource, EmbeddingSource]:
    """The expanded query and gallery embeddings (module docstring) as in-memory sources.

    Parameters
    ----------
    query, gallery : sources ``(Q, D)`` / ``(G, D)``.
    aqe : ``{"k", "alpha"}`` (:data:`rankwise.options.AQE`).
    options, runner : :class:`rankwise.ranking.EngineOptions` and its runner.
    order : ``(qorder, gorder)``, the item order (:func:`rankwise.rerank.item_order`);
        ``None``: row order.  The results are in row order either way.
    """
    from .ranking import prepare_chunk, row_location
    from .rerank import neighbours

    n_query, n_gallery = query.shape[0], gallery.shape[0]
    # (copy=False: the concatenation is already a new float32 array; a second copy of all
    # N x D rows was the peak's largest transient)
    raw = np.concatenate([query.read(0, n_query), gallery.read(0, n_gallery)]).astype(
        np.float32, copy=False
    )
    # whatever the ranking distance: the expansion weighs neighbours by cosine similarity
    fix = (
        f"fix that item or drop query expansion ({AQE.spelled}), which weighs rows by their cosine"
    )
    (qu, qsq), (gu, gsq) = (
        prepare_chunk(query, 0, n_query, True, zero_fix=fix),
        prepare_chunk(gallery, 0, n_gallery, True, zero_fix=fix),
    )
    unit, sq = np.concatenate([qu, gu]), np.concatenate([qsq, gsq])
    del qu, gu  # held to the end, they were a second copy of the unit rows
    n_all = len(raw)
    # item position -> row of [query; gallery] (exactly tied neighbours at the k cut and
    # the order of the sums follow the ids, not the manifests' row order)
    perm = (
        np.arange(n_all, dtype=np.int64)
        if order is None
        else np.concatenate([order[0], n_query + np.asarray(order[1])]).astype(np.int64)
    )
    raw, unit, sq = raw[perm], unit[perm], sq[perm]
    k = min(int(aqe["k"]), n_all)
    # most similar first: by d = 1 - cos itself (fast-reid's order), not by its square
    nn, _ = neighbours(
        unit, sq, k, options.query_block, options.gallery_chunk, True, runner, squared=False
    )
    nn = _self_first(nn)
    rows = np.repeat(np.arange(n_all, dtype=np.int64), k)
    sim = -pair_keys(unit, unit, rows, nn.ravel(), True)  # canonical cos(i, j)
    alpha = float(aqe["alpha"])
    negative = np.flatnonzero(sim < 0)
    if len(negative) and not alpha.is_integer():
        # cos^alpha of a negative cosine has no real value (fast-reid's aqe gives NaN)
        t = int(negative[0])
        item, other = int(perm[rows[t]]), int(perm[nn.ravel()[t]])

        def where(i: int) -> str:
            return row_location(query, i) if i < n_query else row_location(gallery, i - n_query)

        raise RankwiseError(
            f"{where(item)} has a neighbour with a negative cosine similarity ({sim[t]:.4g}; "
            f"{where(other)}), and aqe alpha {alpha:g} is not an integer: cos^{alpha:g} is "
            "undefined there; use an integer alpha (e.g. 3) or a smaller k "
            f"({AQE.spelled} k,alpha)"
        )
    weights = np.power(sim, alpha).reshape(n_all, k)
    expanded = np.zeros(raw.shape, dtype=np.float64)
    for t in range(k):  # sum over the k neighbours in their order, then the mean
        # float64(raw) x weight, as float64(raw) * weights would, without a float64 copy
        expanded += np.multiply(raw[nn[:, t]], weights[:, t : t + 1], dtype=np.float64)
    expanded /= k
    by_row = np.empty(raw.shape, dtype=np.float32)
    by_row[perm] = expanded  # item positions -> rows, rounded to float32 as astype would
    out = (
        open_embeddings(by_row[:n_query], name=f"{query.name} (expanded)"),
        open_embeddings(by_row[n_query:], name=f"{gallery.name} (expanded)"),
    )
    for new, old in zip(out, (query, gallery), strict=True):
        new.source_rows = old.source_rows  # messages keep naming the file's rows
    return out
