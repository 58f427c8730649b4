"""Embedding sources: ``.npy`` files, Zarr stores/arrays or in-memory arrays.

An :class:`EmbeddingSource` is a small picklable handle that reads row ranges, so
Dask tasks (threads or distributed workers) read the gallery chunk by chunk and
no process holds more than a chunk of it.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import RankwiseError


@dataclass
class EmbeddingSource:
    """Rows ``(N, D)`` of embeddings, read lazily.

    ``kind`` is ``"npy"`` (``path``), ``"zarr"`` (``path`` and ``array_path`` inside
    the store) or ``"array"`` (``array``, in memory).
    """

    kind: str
    shape: tuple[int, int]
    name: str
    path: str | None = None
    array_path: str | None = None
    array: np.ndarray | None = None
    chunk_rows: int | None = None

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a float32 array."""
        if self.kind == "array":
            data = self.array[start:stop]
        elif self.kind == "npy":
            data = np.load(self.path, mmap_mode="r")[start:stop]
        else:
            import zarr
            data = zarr.open_array(self.path, path=self.array_path, mode="r")[start:stop]
        return np.ascontiguousarray(data, dtype=np.float32)


def open_embeddings(source, *, name: str, n_rows: int | None = None,
                    manifest: str | None = None) -> EmbeddingSource:
    """Open and check an embedding source.

    Parameters
    ----------
    source : path to ``.npy``, a Zarr store (group with array ``embeddings``) or Zarr
        array, or an array-like ``(N, D)``.
    name : what to call it in messages (e.g. "gallery embeddings").
    n_rows : rows the manifest has; a different N is an error naming both.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise RankwiseError(f"{path}: {name} not found; pass a .npy file or a Zarr store")
        if path.is_dir():
            src = _open_zarr(path, name)
        else:
            src = _open_npy(path, name)
    else:
        array = np.asarray(source)
        src = EmbeddingSource("array", tuple(array.shape), name, array=array)
        _check_dtype(array.dtype, name, "the array")
    shape = src.shape
    label = src.path or name
    if len(shape) != 2:
        raise RankwiseError(f"{label}: {name} must be 2-D (rows, dim), found shape {shape}")
    if shape[1] == 0:
        raise RankwiseError(f"{label}: {name} have dimension 0; embeddings need at least one column")
    if n_rows is not None and shape[0] != n_rows:
        where = f" but {manifest} has {n_rows} rows" if manifest else f" but the manifest has {n_rows} rows"
        raise RankwiseError(f"{label}: {name} have {shape[0]} rows{where}; "
                            "rows must align one-to-one with the manifest")
    return src


def _check_dtype(dtype, name: str, label: str) -> None:
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
        raise RankwiseError(f"{label}: {name} have dtype {dtype}; expected numbers (float32)")


def _open_npy(path: Path, name: str) -> EmbeddingSource:
    try:
        array = np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RankwiseError(f"{path}: not a readable .npy file ({first}); the file is "
                            "truncated or corrupt: write it again with numpy.save") from None
    if not isinstance(array, np.ndarray):
        raise RankwiseError(f"{path}: expected a single .npy array, found {type(array).__name__}")
    _check_dtype(array.dtype, name, str(path))
    return EmbeddingSource("npy", tuple(array.shape), name, path=str(path))


def _open_zarr(path: Path, name: str) -> EmbeddingSource:
    import zarr

    tmp = path.with_name(path.name + ".tmp")
    try:
        node = zarr.open(str(path), mode="r")
    except Exception as exc:  # zarr raises several types for a bad store
        raise RankwiseError(f"{path}: not a readable Zarr store ({type(exc).__name__}); "
                            "write it again") from None
    array_path = None
    if isinstance(node, zarr.Group):
        attrs = dict(node.attrs)
        if attrs.get("kind") == "embeddings" and not attrs.get("complete"):
            raise RankwiseError(f"{path}: incomplete embedding store; delete it and encode again")
        if "embeddings" not in node:
            hint = " (an interrupted run left it)" if tmp.exists() else ""
            raise RankwiseError(f"{path}: Zarr group has no array 'embeddings'{hint}; "
                                "pass a rankwise embedding store or a Zarr array")
        node = node["embeddings"]
        array_path = "embeddings"
    _check_dtype(node.dtype, name, str(path))
    return EmbeddingSource("zarr", tuple(node.shape), name, path=str(path),
                           array_path=array_path, chunk_rows=int(node.chunks[0]))
