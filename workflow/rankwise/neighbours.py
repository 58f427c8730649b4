"""The top-k valid gallery items of a few queries, for reports and inspection.

A chunked scan of the gallery per call (canonical keys, the engine's tie rule:
at equal distance a non-relevant item comes first), never the ``Q x G`` matrix.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from . import kernels
from .errors import RankwiseError
from .inputs import Inputs, open_inputs
from .options import GALLERY_CHUNK
from .ranking import check_distance, prepare_chunk


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
    for start in range(0, g_src.shape[0], chunk):
        stop = min(start + chunk, g_src.shape[0])
        grows = prepare_chunk(g_src, start, stop, cosine)[0]
        for n, r in enumerate(at):
            valid, relevant = problem.valid_relevant(r, start, stop)
            idx = np.flatnonzero(valid)
            keys = kernels.pair_keys(
                qrows, grows, np.full(len(idx), n, np.int64), idx.astype(np.int64), cosine
            )
            best[n] += zip(keys, relevant[idx], idx + start, strict=True)
            best[n] = sorted(best[n])[:k]  # (key, non-relevant first, row order)
    return [
        {
            "query_index": r,
            "gallery_index": np.array([b[2] for b in items], np.int64),
            "distance_key": np.array([b[0] for b in items], np.float64),
            "relevant": np.array([b[1] for b in items], bool),
        }
        for r, items in zip(rows, best, strict=True)
    ]
