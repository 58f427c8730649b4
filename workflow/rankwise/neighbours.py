"""The top-k valid gallery items of queries, for reports and inspection.

:func:`top_items` / :func:`nearest_items`: a chunked scan of the gallery for a few
queries (canonical keys, the engine's tie rule: at equal distance a non-relevant item
comes first, then the smaller gallery id), never the ``Q x G`` matrix.
:func:`tiled_top_items`: the same list for every evaluated query, from float32 BLAS
tiles with canonical keys only where the error bound leaves the order open (the rank
stage stores it for query-expanded embeddings, which the report could not reproduce
from the stored ones).

Canonical keys come from the process's kernel set (:func:`rankwise.native.engine_kernels`:
the C kernels, or numba's where none build; the same bits either way): a report that
lists worst queries does not import numba (~0.45 s with loading its compiled kernels).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .errors import RankwiseError
from .inputs import Inputs, open_inputs
from .native import engine_kernels
from .options import GALLERY_CHUNK
from .ranking import check_distance, prepare_chunk
from .rounding import error_bound_factor


def top_items(
    query,
    gallery,
    query_embeddings,
    gallery_embeddings,
    query_rows: Iterable[int],
    *,
    protocol: str,
    distance: str = "cosine",
    k: int = 10,
    gap_frames: int = 1,
    query_stride: int = 1,
    junk_labels=("-1",),
    exclude_same_camera: bool = True,
    multi_query: str = "none",
    chunk: int = GALLERY_CHUNK.default,
) -> list[dict]:
    """For each query row, its ``k`` nearest valid gallery items.

    Opens the four inputs with :func:`rankwise.inputs.open_inputs` (every check of
    ranking), then :func:`nearest_items`.

    Returns
    -------
    list of ``{"query_index": int, "gallery_index": (k,) int64, "distance_key": (k,)
    float64, "relevant": (k,) bool}``; ``distance_key`` is ``-cos`` (cosine) or the
    squared L2 distance.
    """
    inputs = open_inputs(query, gallery, query_embeddings, gallery_embeddings, protocol=protocol)
    return nearest_items(
        inputs,
        query_rows,
        distance=distance,
        k=k,
        gap_frames=gap_frames,
        query_stride=query_stride,
        junk_labels=junk_labels,
        exclude_same_camera=exclude_same_camera,
        multi_query=multi_query,
        chunk=chunk,
    )


def nearest_items(
    inputs: Inputs,
    query_rows: Iterable[int],
    *,
    distance: str = "cosine",
    k: int = 10,
    gap_frames: int = 1,
    query_stride: int = 1,
    junk_labels=("-1",),
    exclude_same_camera: bool = True,
    multi_query: str = "none",
    chunk: int = GALLERY_CHUNK.default,
) -> list[dict]:
    """:func:`top_items` of inputs already opened by :func:`rankwise.inputs.open_inputs`.

    With ``multi_query`` (reid), ``query_rows`` are pooled queries' representative rows
    (a ranks store's ``query_index``) and the pooled embedding is what is compared.
    Every row read is checked as the engine checks it: a NaN/inf row, or a zero row
    under cosine, is an error naming the file and the row.
    """
    check_distance(distance)
    cosine = distance == "cosine"
    manifest_rows = len(inputs.query)
    inputs = inputs.pool(multi_query, distance=distance)
    problem = inputs.problem(
        gap_frames=gap_frames,
        query_stride=query_stride,
        junk_labels=tuple(junk_labels),
        exclude_same_camera=exclude_same_camera,
    )
    q_src, g_src = inputs.query_embeddings, inputs.gallery_embeddings
    rows = [int(r) for r in query_rows]
    outside = [r for r in rows if not 0 <= r < manifest_rows]
    if outside:
        raise RankwiseError(
            f"query_rows: row {outside[0]} is not a row of {inputs.names[0]} "
            f"(0..{manifest_rows - 1}); pass 0-based manifest rows"
        )
    at = rows  # the rows of the (pooled) query source and problem
    if inputs.pooled is not None:
        reps = inputs.pooled.rows
        at = [int(i) for i in np.searchsorted(reps, rows)]
        other = [r for r, i in zip(rows, at, strict=True) if i >= len(reps) or reps[i] != r]
        if other:
            raise RankwiseError(
                f"query_rows: row {other[0]} of {inputs.names[0]} is not the representative "
                "(smallest id) of its multi-query group; pass a ranks store's query_index"
            )
    qrows = (
        np.concatenate([prepare_chunk(q_src, r, r + 1, cosine)[0] for r in at])
        if rows
        else np.zeros((0, q_src.shape[1]), np.float32)
    )
    best: list[list[tuple]] = [[] for _ in rows]
    # exact ties (identical vectors) go to the smaller gallery id, not the earlier row:
    # the list does not depend on the manifest's row order
    gallery_ids = inputs.gallery["id"]
    for start in range(0, g_src.shape[0], chunk):
        stop = min(start + chunk, g_src.shape[0])
        grows = prepare_chunk(g_src, start, stop, cosine)[0]
        for n, r in enumerate(at):
            valid, relevant = problem.valid_relevant(r, start, stop)
            idx = np.flatnonzero(valid)
            keys = engine_kernels().pair_keys(
                qrows, grows, np.full(len(idx), n, np.int64), idx.astype(np.int64), cosine
            )
            best[n] += zip(keys, relevant[idx], gallery_ids[idx + start], idx + start, strict=True)
            best[n] = sorted(best[n])[:k]  # (key, non-relevant first, id)
    return [
        {
            "query_index": r,
            "gallery_index": np.array([b[3] for b in items], np.int64),
            "distance_key": np.array([b[0] for b in items], np.float64),
            "relevant": np.array([b[1] for b in items], bool),
        }
        for r, items in zip(rows, best, strict=True)
    ]


#: Largest (query block x gallery chunk) tile of :func:`tiled_top_items`, in pairs.
TOP_TILE_VALUES = 1 << 21


def tiled_top_items(
    problem, rows: np.ndarray, qrows: np.ndarray, qsq: np.ndarray, gallery, *, cosine: bool,
    k: int, block: int, chunk: int,
) -> np.ndarray:  # fmt: skip
    """The ``k`` nearest valid gallery items of each query row in ``rows`` by (canonical
    key, relevant after non-relevant, id: ``problem.gkey``, else index), ``(len(rows),
    k)`` int64, ``-1``-padded.

    Pass 1 keeps per row the k smallest upper bounds ``k~ + eps`` over its valid items
    (the k-th of them is at or above the k-th canonical key); pass 2 computes the
    canonical key of every valid item whose lower bound ``k~ - eps`` reaches it -- the
    only ones that can be among the k -- and sorts those.  Exact, for any tiling.

    ``qrows``/``qsq``: the prepared query rows of the problem (all of them);
    ``gallery``: the source the rows of ``problem``'s gallery come from.
    """
    from .protocols import dense_masks

    n, n_g = len(rows), gallery.shape[0]
    # at most TOP_TILE_VALUES pairs a tile: its float64 keys, bounds and masks stay ~80 MB
    block = max(1, min(block, TOP_TILE_VALUES // max(min(chunk, n_g), 1)))
    bound = error_bound_factor(qrows.shape[1])
    out = np.full((n, k), -1, dtype=np.int64)
    if n == 0 or n_g == 0:
        return out

    def tiles():
        for c0 in range(0, n_g, chunk):
            grows, gsq = prepare_chunk(gallery, c0, min(c0 + chunk, n_g), cosine)
            cols = np.arange(c0, c0 + len(grows), dtype=np.int64)
            for b0 in range(0, n, block):
                r = rows[b0 : b0 + block]
                s = (qrows[r] @ grows.T).astype(np.float64)
                qn, gn = np.sqrt(qsq[r])[:, None], np.sqrt(gsq)[None, :]
                if cosine:
                    approx, eps = -s, bound * qn * gn
                else:
                    approx = qsq[r][:, None] + gsq[None, :] - 2.0 * s
                    eps = bound * (qn + gn) ** 2
                valid, relevant = dense_masks(problem, r[:, None], cols[None, :])
                yield b0, r, grows, cols, approx, eps, valid, relevant

    upper = np.full((n, k), np.inf)
    for b0, r, _, _, approx, eps, valid, _ in tiles():
        merged = np.concatenate([upper[b0 : b0 + len(r)], np.where(valid, approx + eps, np.inf)], 1)
        upper[b0 : b0 + len(r)] = np.partition(merged, k - 1, axis=1)[:, :k]
    reach = upper.max(axis=1)  # the k-th smallest upper bound (inf: fewer than k valid)
    found: list[list[np.ndarray]] = [[] for _ in range(n)]
    for b0, r, grows, cols, approx, eps, valid, relevant in tiles():
        i, j = np.nonzero(valid & (approx - eps <= reach[b0 : b0 + len(r)][:, None]))
        keys = engine_kernels().pair_keys(qrows, grows, r[i], j, cosine)
        for t in np.unique(i):
            at = i == t
            found[b0 + t].append(np.stack([keys[at], relevant[t, j[at]], cols[j[at]]]))
    for t, parts in enumerate(found):
        if parts:
            key, rel, col = np.concatenate(parts, axis=1)
            col = col.astype(np.int64)
            tie = col if problem.gkey is None else problem.gkey[col]
            order = np.lexsort((tie, rel, key))[:k]
            out[t, : len(order)] = col[order].astype(np.int64)
    return out
