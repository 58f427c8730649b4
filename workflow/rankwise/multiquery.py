"""Multi-query (Market-1501's multi-query setting): one pooled query per (label, camera).

With ``multi_query="mean"`` (or ``"max"``) the query manifest's rows are grouped by
(``label``, ``camera``) -- compared as strings, like every label -- and each group is
evaluated as ONE query whose embedding pools the group's stored rows:

- members are ordered by ``id`` (string order), so the pooled vector is a function of
  the manifest's content, never of its row order;
- ``mean``: the float32 rows are summed in float64 in that order, divided by the
  number of members, and cast to float32; ``max``: the element-wise maximum (exact);
- the stored rows are pooled *as they are* (not L2-normalised first), as Market-1501's
  multi-query code averages the features as extracted; under ``cosine`` the pooled
  vector is then L2-normalised by the engine like any query row, and a pooled vector
  that is zero is an error naming the group.  Store normalised embeddings to pool
  normalised rows;
- the pooled query's manifest row is its *representative*: the member with the
  smallest id.  Its ``id`` is that member's; the ranks store's ``query_index`` is the
  representative's row of the original manifest and ``members_offsets`` /
  ``members`` list every member's row (CSR, one entry per evaluated query);
- a gallery item with ANY member's id is never ranked (``exclude_self`` for a group:
  :attr:`rankwise.protocols.Problem.twins`, applied by ``dense_masks``); the
  same-camera rule uses the group's camera, which every member shares.

Only the ``reid`` protocol takes ``multi_query`` (the spec's ``options``), and the
query manifest must have a ``camera`` column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .embeddings import EmbeddingSource
from .errors import RankwiseError
from .manifest import row_line
from .ranking import prepare_chunk
from .table import Table


@dataclass(frozen=True)
class Pooled:
    """Query groups of a multi-query evaluation.

    Attributes
    ----------
    pooling : ``"mean"`` or ``"max"``.
    table : ``(P rows)`` the representatives' rows of the query manifest, in row order.
    rows : ``(P,)`` int64, each representative's row of the original query manifest.
    offsets, members : CSR, ``members[offsets[p]:offsets[p + 1]]`` are group p's rows of
        the original query manifest, by ascending id.
    member_ids : ``(n_rows,)`` str, ``member_ids[offsets[p]:offsets[p + 1]]`` their ids.
    embeddings : ``(P, D)`` float32, the pooled rows.
    """

    pooling: str
    table: Table
    rows: np.ndarray
    offsets: np.ndarray
    members: np.ndarray
    member_ids: np.ndarray
    embeddings: np.ndarray


def pool_queries(
    table: Table, source: EmbeddingSource, pooling: str, *, cosine: bool, name: str
) -> Pooled:
    """Group ``table`` by (label, camera) and pool each group's rows (module docstring).

    Parameters
    ----------
    table : the validated query manifest ``(Q rows)`` with ``id``, ``label``, ``camera``.
    source : its embeddings ``(Q, D)``.
    pooling : ``"mean"`` or ``"max"``.
    cosine : a zero pooled vector is an error (it has no cosine distance).
    name : the manifest's name, for messages.
    """
    ids, label, camera = table["id"], table["label"], table["camera"]
    # Sorted by (label, camera, id): a group is contiguous, its first member the smallest id.
    by_id = np.lexsort((ids, camera, label))
    lab, cam = label[by_id], camera[by_id]
    starts = np.flatnonzero(np.r_[True, (lab[1:] != lab[:-1]) | (cam[1:] != cam[:-1])])
    sizes = np.diff(np.r_[starts, len(by_id)])
    reps = by_id[starts]
    order = np.argsort(reps, kind="stable")  # pooled queries in representative row order
    starts, sizes, reps = starts[order], sizes[order], reps[order]
    members = np.concatenate([by_id[s : s + n] for s, n in zip(starts, sizes, strict=True)])
    offsets = np.r_[0, np.cumsum(sizes)].astype(np.int64)
    # Read as stored (not normalised); a NaN/inf row is an error naming the member's row
    # (the norm range is checked below, on the pooled rows).
    rows, _ = prepare_chunk(source, 0, source.shape[0], False, check_range=False)

    def group_of(p: int) -> str:
        """Pooled query p as its rows' manifest lines (rows left out by id-keyed features,
        ``on_missing: drop``, are not counted in ``table``'s positions)."""
        lines = ", ".join(
            str(row_line(int(r), table)) for r in members[offsets[p] : offsets[p + 1]]
        )
        return (
            f"{name}: the {pooling} of the query rows of label {label[reps[p]]!r} camera "
            f"{camera[reps[p]]!r} (lines {lines})"
        )

    pooled = np.empty((len(reps), rows.shape[1]), np.float32)
    for p in range(len(reps)):
        group = rows[members[offsets[p] : offsets[p + 1]]]
        if pooling == "mean":
            total = np.zeros(rows.shape[1], np.float64)
            for row in group:  # a fixed order: the sum is a function of the content
                total += row.astype(np.float64)
            pooled[p] = (total / len(group)).astype(np.float32)
        else:
            pooled[p] = group.max(axis=0)
        if cosine and not np.any(pooled[p]):
            # A lone member's row is zero itself: no pooling helps; otherwise the other one may.
            other = "mean" if pooling == "max" else "max"
            fix = (
                "fix that row or use distance 'euclidean'"
                if offsets[p + 1] - offsets[p] == 1
                else f"use multi_query '{other}' or distance 'euclidean'"
            )
            raise RankwiseError(
                f"{group_of(p)} is a zero vector, which has no cosine distance; {fix}"
            )
    if not cosine:  # the ranking's norm range, named by the group's lines (not "row p")
        from .ranking import _kernels, first_out_of_range, norm_range_problem

        sq, _, _ = _kernels().row_norms(pooled)
        p = first_out_of_range(sq)
        if p >= 0:
            raise RankwiseError(f"{group_of(p)} {norm_range_problem(float(sq[p]))}")
    return Pooled(
        pooling=pooling,
        table=table.take(reps),
        rows=reps.astype(np.int64),
        offsets=offsets,
        members=members.astype(np.int64),
        member_ids=ids[members],
        embeddings=pooled,
    )
