"""The top-k valid gallery items of a few queries, for reports and inspection.

A chunked scan of the gallery per call (canonical keys, the engine's tie rule:
at equal distance a non-relevant item comes first), never the ``Q x G`` matrix.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from . import kernels
from .embeddings import open_embeddings
from .manifest import read_manifest
from .protocols import build_problem
from .ranking import check_distance


def top_items(query, gallery, query_embeddings, gallery_embeddings, query_rows: Iterable[int],
              *, protocol: str, distance: str = "cosine", k: int = 10, gap_frames: int = 1,
              junk_labels=("-1",), chunk: int = 8192) -> list[dict]:
    """For each query row, its ``k`` nearest valid gallery items.

    Returns
    -------
    list of ``{"query_index": int, "gallery_index": (k,) int64, "distance_key": (k,)
    float64, "relevant": (k,) bool}``; ``distance_key`` is ``-cos`` (cosine) or the
    squared L2 distance.
    """
    check_distance(distance)
    cosine = distance == "cosine"
    q_table = read_manifest(query, protocol=protocol, role="query")
    g_table = read_manifest(gallery, protocol=protocol, role="gallery")
    problem = build_problem(q_table, g_table, protocol, gap_frames=gap_frames,
                            junk_labels=tuple(junk_labels))
    q_src = open_embeddings(query_embeddings, name="query embeddings", n_rows=len(q_table))
    g_src = open_embeddings(gallery_embeddings, name="gallery embeddings", n_rows=len(g_table))
    rows = [int(r) for r in query_rows]
    qrows = np.stack([kernels.prepare_rows(q_src.read(r, r + 1), cosine)[0][0] for r in rows]) \
        if rows else np.zeros((0, q_src.shape[1]), np.float32)
    best: list[list[tuple]] = [[] for _ in rows]
    for start in range(0, g_src.shape[0], chunk):
        stop = min(start + chunk, g_src.shape[0])
        grows = kernels.prepare_rows(g_src.read(start, stop), cosine)[0]
        for n, r in enumerate(rows):
            valid, relevant = problem.valid_relevant(r, start, stop)
            idx = np.flatnonzero(valid)
            keys = kernels.pair_keys(qrows, grows, np.full(len(idx), n, np.int64),
                                     idx.astype(np.int64), cosine)
            best[n] += zip(keys, relevant[idx], idx + start)
            best[n] = sorted(best[n])[:k]  # (key, non-relevant first, row order)
    return [{"query_index": r,
             "gallery_index": np.array([b[2] for b in items], np.int64),
             "distance_key": np.array([b[0] for b in items], np.float64),
             "relevant": np.array([b[1] for b in items], bool)}
            for r, items in zip(rows, best)]
