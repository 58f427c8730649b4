"""Zarr stores: embeddings ``(N, D)`` and ranks (CSR), written atomically.

Every store is written under ``<path>.tmp`` and renamed to ``<path>`` only once
complete, so a store that exists under its final name is complete.  A leftover
``<path>.tmp`` from a killed job is removed when the next write starts.

Embedding store (a Zarr group)::

    embeddings   float32 (N, D), chunked along N
    manifest_row int64 (N,)           only when rows were dropped (id-keyed features)
    attrs        {"kind": "embeddings", "encoder": ..., "checkpoint_hash": ...,
                  "manifest_hash": ..., "rankwise_version": ..., "complete": true}

Ranks store (a Zarr group), one entry per *evaluated* query::

    offsets      int64 (n_eval + 1)   CSR row pointers into ``ranks``
    ranks        int64 (nnz,)         sorted 1-based ranks of each query's relevant items
    query_index  int64 (n_eval,)      row of the query in its manifest
    group        int64 (n_eval,)      progressive: sketch number (0..n_sketches-1), else -1
    step         int64 (n_eval,)      progressive: the rendering's step, else 0
    attrs        protocol, distance, num_queries, num_skipped, num_gallery, ...

Optional arrays (protocol variants; :data:`OPTIONAL_ARRAYS`), written when present::

    members_offsets  int64 (n_eval + 1)  multi-query: CSR pointers into ``members``
    members          int64 (n_members,)  multi-query: the pooled query's member rows
                                         (query manifest rows, by ascending id)
    shot_offsets     int64 (n_eval + 1)  single-gallery-shot: CSR pointers into ``shot_pmf``
    shot_pmf         float64 (nnz,)      P(single-shot rank = k), k = 1.. per query
    top_items        int64 (n_eval, 20)  re-ranked or query-expanded: each query's nearest
                                         valid gallery rows by the distance that ranked,
                                         -1-padded (the report's worst queries show them)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RankwiseError

if TYPE_CHECKING:
    import zarr


def _json_safe(value: Any) -> Any:
    """Cast numpy scalars/arrays to plain Python so zarr attributes accept them."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty folder ``<path>.tmp`` to fill; it replaces ``path`` on success.

    A leftover ``<path>.tmp`` from a killed run is removed first; on any exception the
    temporary folder is removed and ``path`` is left as it was.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        # An old result under the final name (a user rerunning by hand) is replaced whole.
        shutil.rmtree(final)
    os.rename(tmp, final)


@contextmanager
def atomic_store(path: str | os.PathLike) -> Iterator[zarr.Group]:
    """Yield a fresh Zarr group at ``<path>.tmp``; rename it to ``path`` on success.

    The group is marked ``complete`` just before the rename (see :func:`atomic_directory`).
    """
    import zarr  # imported lazily: a CLI run on .npy inputs never needs it

    with atomic_directory(path) as tmp:
        group = zarr.open_group(str(tmp), mode="w")
        yield group
        group.attrs["complete"] = True


def open_complete_group(path: str | os.PathLike, kind: str) -> zarr.Group:
    """Open a rankwise store for reading, refusing missing or incomplete ones."""
    import zarr

    p = Path(path)
    if not p.exists():
        tmp = p.with_name(p.name + ".tmp")
        hint = (
            (f" (found an incomplete '{tmp.name}' from an interrupted run: run the command again)")
            if tmp.exists()
            else ""
        )
        raise RankwiseError(f"{p}: store not found{hint}")
    try:
        group = zarr.open_group(str(p), mode="r")
    except Exception as exc:  # zarr raises several types for a corrupt store
        raise RankwiseError(
            f"{p}: not a readable Zarr store ({type(exc).__name__}); "
            f"expected a {kind} store, the Zarr folder written by `rankwise "
            f"{dict(ranks='rank', embeddings='encode').get(kind, kind)}`: "
            "check the path"
        ) from None
    attrs = dict(group.attrs)
    if not attrs.get("complete"):
        raise RankwiseError(
            f"{p}: incomplete store (no 'complete' mark); delete it and "
            "run the command that writes it again"
        )
    if attrs.get("kind") != kind:
        raise RankwiseError(
            f"{p}: expected a rankwise {kind} store, found kind={attrs.get('kind')!r}"
        )
    return group


# ---------------------------------------------------------------- embeddings


def write_embeddings(
    path: str | os.PathLike,
    batches: Iterator[np.ndarray],
    n_rows: int,
    *,
    attrs: dict[str, Any],
    chunk_rows: int = 16384,
    arrays: dict[str, np.ndarray] | None = None,
) -> None:
    """Write ``(n_rows, D)`` float32 embeddings batch by batch, atomically.

    ``batches`` yields consecutive ``(B, D)`` arrays whose B add up to ``n_rows``.
    The array is preallocated once D is known (first batch).  ``arrays``: further
    1-D int64 arrays of ``n_rows`` values stored beside it (``manifest_row``).
    """
    with atomic_store(path) as group:
        arr = None
        row = 0
        for batch in batches:
            batch = np.asarray(batch, dtype=np.float32)
            if batch.ndim != 2:
                raise RankwiseError(
                    f"{path}: encoder returned shape {batch.shape}; expected (batch, dim)"
                )
            if arr is None:
                arr = group.create_array(
                    "embeddings",
                    shape=(n_rows, batch.shape[1]),
                    dtype="float32",
                    chunks=(min(chunk_rows, max(n_rows, 1)), batch.shape[1]),
                )
            if row + len(batch) > n_rows:
                raise RankwiseError(
                    f"{path}: encoder produced more rows than the manifest's {n_rows}"
                )
            arr[row : row + len(batch)] = batch
            row += len(batch)
        if arr is None or row != n_rows:
            raise RankwiseError(f"{path}: encoder produced {row} rows for a manifest of {n_rows}")
        for name, values in (arrays or {}).items():
            values = np.ascontiguousarray(values, dtype=np.int64)
            group.create_array(name, data=values, chunks=(max(1, min(len(values), 1 << 20)),))
        group.attrs.update(_json_safe({"kind": "embeddings", **attrs}))


def embeddings_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The attributes of a complete embedding store."""
    return dict(open_complete_group(path, "embeddings").attrs)


# ---------------------------------------------------------------- ranks

RANK_ARRAYS = ("offsets", "ranks", "query_index", "group", "step")
#: Arrays a ranks store holds only for some protocol variants: name -> dtype.
OPTIONAL_ARRAYS = {
    "members_offsets": np.int64,
    "members": np.int64,
    "shot_offsets": np.int64,
    "shot_pmf": np.float64,
    "top_items": np.int64,
}


def write_ranks(
    path: str | os.PathLike, arrays: dict[str, np.ndarray], attrs: dict[str, Any]
) -> None:
    """Write a ranks store (see module docstring) atomically."""
    with atomic_store(path) as group:
        dtypes = {name: np.int64 for name in RANK_ARRAYS}
        dtypes.update({k: v for k, v in OPTIONAL_ARRAYS.items() if k in arrays})
        for name, dtype in dtypes.items():
            data = np.ascontiguousarray(arrays[name], dtype=dtype)
            per_row = int(np.prod(data.shape[1:]))  # 1 for a vector
            rows = max(1, min(len(data), (1 << 20) // max(per_row, 1)))
            group.create_array(name, data=data, chunks=(rows, *data.shape[1:]))
        group.attrs.update(_json_safe({"kind": "ranks", **attrs}))


def read_ranks(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a complete ranks store: ``(arrays, attrs)``."""
    group = open_complete_group(path, "ranks")
    try:
        arrays = {name: np.asarray(group[name][...]) for name in RANK_ARRAYS}
        # one lookup per optional name, not a listing of the group (which would also meet
        # Snakemake's `.snakemake_timestamp` file, and zarr would warn about it)
        arrays.update({n: np.asarray(group[n][...]) for n in OPTIONAL_ARRAYS if n in group})
    except KeyError as exc:
        raise RankwiseError(
            f"{path}: ranks store lacks array {exc}; delete it and run `rankwise rank` again"
        ) from None
    return arrays, dict(group.attrs)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a text file via ``<path>.tmp`` + rename: never a half-written file."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, final)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a binary file via ``<path>.tmp`` + rename: never a half-written file."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, final)
