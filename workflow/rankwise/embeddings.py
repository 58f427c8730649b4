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
        """Rows ``[start, stop)`` as a float32 array.

        A file that cannot be read (a corrupt Zarr chunk, a chunk file missing from the
        store, a .npy truncated after it was opened) raises a :class:`RankwiseError`
        naming the file and the rows, never a library traceback.
        """
        if self.kind == "array":
            return np.ascontiguousarray(self.array[start:stop], dtype=np.float32)
        try:
            if self.kind == "npy":
                data = np.load(self.path, mmap_mode="r")[start:stop]
            else:
                import zarr
                array = zarr.open_array(self.path, path=self.array_path, mode="r")
                _check_chunks_present(array, start, stop, self)
                data = array[start:stop]
            return np.ascontiguousarray(data, dtype=np.float32)
        except RankwiseError:
            raise
        except Exception as exc:  # zarr/numcodecs/numpy raise many types for bad bytes
            start, stop = self._narrow(start, stop)
            raise RankwiseError(
                f"{self.path}: cannot read rows {start}-{stop - 1} (0-based) of the {self.name} "
                f"({type(exc).__name__}: {_first_line(exc)}); the file is corrupt or was "
                "changed during the run: write it again") from None

    def _narrow(self, start: int, stop: int) -> tuple[int, int]:
        """The first storage chunk of ``[start, stop)`` that fails to read (for messages)."""
        step = self.chunk_rows or (stop - start)
        for lo in range(start - start % step if self.chunk_rows else start, stop, step):
            lo, hi = max(lo, start), min(lo + step, stop)
            try:
                if self.kind == "npy":
                    np.asarray(np.load(self.path, mmap_mode="r")[lo:hi])
                else:
                    import zarr
                    zarr.open_array(self.path, path=self.array_path, mode="r")[lo:hi]
            except Exception:
                return lo, hi
        return start, stop


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _check_chunks_present(array, start: int, stop: int, source: "EmbeddingSource") -> None:
    """Refuse rows whose storage chunk (or shard) file is absent.

    Zarr silently returns the fill value (zeros) for a chunk that was never written, so
    a store left incomplete by a crash or a partial copy would otherwise be read as
    zero vectors (an error under cosine, silently wrong numbers under euclidean).
    """
    try:
        from zarr.core.sync import sync

        grid = array.shards or array.chunks
        rows, cols = int(grid[0]), int(grid[1])
        n_col_chunks = -(-int(array.shape[1]) // cols)
        for i in range(start // rows, -(-stop // rows)):
            for j in range(n_col_chunks):
                key = array.metadata.encode_chunk_key((i, j))
                if not sync((array.store_path / key).exists()):
                    lo, hi = i * rows, min((i + 1) * rows, int(array.shape[0])) - 1
                    raise RankwiseError(
                        f"{source.path}: rows {lo}-{hi} (0-based) of the {source.name} are "
                        f"missing from the Zarr store (no chunk file {key!r}); the store is "
                        "incomplete (interrupted write or partial copy): write it again")
    except RankwiseError:
        raise
    except Exception:  # an unusual store layout: skip the check rather than fail
        return


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
            tmp = path.with_name(path.name + ".tmp")
            if tmp.exists():
                raise RankwiseError(f"{path}: {name} not found, only an incomplete "
                                    f"'{tmp.name}' left by an interrupted run; run the command "
                                    "that writes it (e.g. `rankwise encode`) again")
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
        raise RankwiseError(f"{label}: {name} have dimension 0; embeddings need at least one "
                            "column")
    if n_rows is not None and shape[0] != n_rows:
        where = f" but {manifest or 'the manifest'} has {n_rows} rows"
        raise RankwiseError(f"{label}: {name} have {shape[0]} rows{where}; "
                            "rows must align one-to-one with the manifest")
    return src


def _check_dtype(dtype, name: str, label: str) -> None:
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
        raise RankwiseError(f"{label}: {name} have dtype {dtype}; expected numbers (float32)")


def _open_npy(path: Path, name: str) -> EmbeddingSource:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        first = _first_line(exc)
        if "pickle" in first or "allow_pickle" in first:
            first = "no .npy header, or pickled object data"
        raise RankwiseError(f"{path}: not a readable .npy file ({first}); the file is "
                            "truncated or corrupt: write it again with numpy.save") from None
    if not isinstance(array, np.ndarray):
        kind = "an .npz archive" if isinstance(array, np.lib.npyio.NpzFile) else \
            type(array).__name__
        if hasattr(array, "close"):
            array.close()
        raise RankwiseError(f"{path}: expected a single .npy array (numpy.save), found "
                            f"{kind}; save the (N, D) embeddings with numpy.save")
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
