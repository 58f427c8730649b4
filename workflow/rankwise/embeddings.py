"""Embedding sources: ``.npy`` files, Zarr stores/arrays or in-memory arrays.

An :class:`EmbeddingSource` is a small picklable handle that reads row ranges, so
Dask tasks (threads or distributed workers) read the gallery chunk by chunk and
no process holds more than a chunk of it.

:func:`open_embeddings` is the one reader of embeddings, used by ranking, the
neighbours, and ``rankwise encode --kind precomputed``.  Opening checks the file
(readable ``.npy``; a Zarr store that is complete and holds ``embeddings``), the
dtype (numbers, or booleans: binary codes, read as 0 / 1), the shape (2-D, dimension
> 0), the rows against the manifest's, and the manifest itself (below); reading
checks every chunk (a chunk file missing from a Zarr store, or one that does not
decode, is an error, never zeros).

The manifest check: a rankwise embedding store records ``manifest_csv_sha256``,
the sha256 of the bytes of the manifest CSV it was encoded from (and ``manifest``,
its path).  Opened with a manifest file whose bytes differ (re-sorted, rows added
or removed, ids edited: anything could have moved a row), it is an error naming
both files; the store records no ids, so rows are never realigned.  Stores without
the attribute (written by other tools or older versions) and manifests given as
tables (no file) are not checked.

A store encoded from id-keyed features with ``on_missing: drop``
(:mod:`rankwise.feature_ids`) may hold fewer rows than its manifest: it then has an
int64 array ``manifest_row`` ``(N,)``, the manifest row of each embedding row
(ascending), and the attribute ``id_alignment`` (counts of kept and dropped rows).
It opens against the whole manifest (same sha256, ``M`` rows), and
:func:`rankwise.inputs.open_inputs` keeps only those manifest rows.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import RankwiseError, first_line
from .schema import Field, check, check_store_format

#: Store attribute: sha256 of the bytes of the manifest CSV the store was encoded from.
MANIFEST_SHA256 = "manifest_csv_sha256"
#: Store array (only when rows were dropped): the manifest row of each embedding row.
MANIFEST_ROW = "manifest_row"
#: Store attribute: how id-keyed features were aligned (rankwise.feature_ids.Alignment.record).
ID_ALIGNMENT = "id_alignment"
#: The attributes of a rankwise embedding store that readers use (all optional: older
#: stores lack some), checked when one is opened; a ranks store keeps a copy of them.
EMBEDDING_ATTRS: dict[str, Field] = {
    "checkpoint": Field("path", nullable=True),
    "checkpoint_hash": Field("string", nullable=True),
    "manifest": Field("path", nullable=True),
    "manifest_hash": Field("string", nullable=True),
    MANIFEST_SHA256: Field("string", nullable=True),
    "num_rows": Field("count"),
    # the rows' digest (store.write_embeddings): which encode a ranks store ranked
    "embeddings_sha256": Field("string"),
    "rankwise_version": Field("string"),
    "preprocessing": Field("object", nullable=True),
    ID_ALIGNMENT: Field("object"),
    f"{ID_ALIGNMENT}.manifest_rows": Field("count", required=True),
    f"{ID_ALIGNMENT}.kept_rows": Field("count"),
    f"{ID_ALIGNMENT}.dropped_rows": Field("count"),
    f"{ID_ALIGNMENT}.kept_rows_sha256": Field("string"),
}


#: :func:`_identity`: ``(inodes, size and modification times, host)``
Identity = tuple[tuple[int, ...], tuple[int, ...], str]


@dataclass
class EmbeddingSource:
    """Rows ``(N, D)`` of embeddings, read lazily.

    ``kind`` is ``"npy"`` (``path``), ``"zarr"`` (``path`` and ``array_path`` inside
    the store) or ``"array"`` (``array``, in memory).  Messages name ``path`` as given;
    ``file``, the same path made absolute when opened, is what is read (a
    dask.distributed worker in another working directory reads the file that was checked).
    """

    kind: str
    shape: tuple[int, int]
    name: str
    path: str | None = None
    array_path: str | None = None
    array: np.ndarray | None = None
    chunk_rows: int | None = None
    attrs: dict | None = None  # a rankwise store's attributes (None for other sources)
    manifest_rows: np.ndarray | None = None  # (N,) when the store holds a subset of rows
    ids_array: str | None = None  # "ids": a Zarr group (not a rankwise store) keyed by ids
    source_rows: np.ndarray | None = None  # (N,) rows taken from ``path``: :meth:`subset`
    file: str | None = None  # ``path`` made absolute when opened: what is read
    identity: Identity | None = None  # the file as opened (:func:`_identity`)

    @property
    def readable(self) -> str | None:
        """What is read: ``file`` (absolute) when opened from a path, else ``path``."""
        return self.file or self.path

    @property
    def origin(self) -> str:
        """`` (encoded from <file>)`` for a rankwise store made by the precomputed
        encoder from a file (the pipeline's stores: the user's file is what to fix),
        else empty."""
        attrs = self.attrs or {}
        encoder = attrs.get("encoder")
        if not isinstance(encoder, dict) or encoder.get("kind") != "precomputed":
            return ""
        file = attrs.get("checkpoint")
        return f" (encoded from {file})" if isinstance(file, str) and file else ""

    def row_number(self, row: int) -> int:
        """The row of the file that row ``row`` of this source is (messages name it)."""
        return int(self.source_rows[row]) if self.source_rows is not None else int(row)

    def manifest_item(self, row: int) -> str | None:
        """``<manifest>: row <n> (id '<id>')``, the manifest row that row ``row`` was
        encoded from, for messages (a zero or NaN row of ``results/embeddings/...`` named
        only by its store row told nobody which image to look at); None where this is
        not a rankwise store whose manifest file is still there with the bytes encoded."""
        attrs = self.attrs or {}
        manifest, recorded = attrs.get("manifest"), attrs.get(MANIFEST_SHA256)
        if attrs.get("kind") != "embeddings" or not manifest or not isinstance(recorded, str):
            return None
        stored = self.row_number(row)
        target = int(self.manifest_rows[stored]) if self.manifest_rows is not None else stored
        import csv

        from .hashing import file_sha256

        try:
            if file_sha256(Path(manifest)) != recorded:  # not the rows that were encoded
                return None
            with open(manifest, newline="", encoding="utf-8-sig") as handle:
                reader = csv.reader(handle)
                column = [c.strip() for c in next(reader)].index("id")
                for i, fields in enumerate(reader):
                    if i == target:  # one line a row, as rankwise writes manifests
                        return f"{manifest}: row {target + 2} (id {fields[column].strip()!r})"
        except (OSError, ValueError, StopIteration, IndexError, csv.Error, UnicodeError):
            return None
        return None

    def subset(self, rows: np.ndarray) -> EmbeddingSource:
        """Rows ``rows`` (ascending) read into memory, as a source whose messages name
        their rows in this one."""
        rows = np.asarray(rows, dtype=np.int64)
        return EmbeddingSource(
            kind="array",
            shape=(len(rows), self.shape[1]),
            name=self.name,
            path=self.path,
            array=self.take(rows),
            source_rows=rows if self.source_rows is None else self.source_rows[rows],
        )

    @property
    def num_manifest_rows(self) -> int:
        """Rows of the manifest these embeddings were encoded from (``N`` unless a subset)."""
        if self.manifest_rows is None:
            return self.shape[0]
        return int((self.attrs or {})[ID_ALIGNMENT]["manifest_rows"])

    def take(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, no repeats) as float32 ``(len(rows), D)``.

        Read in ascending order (a Zarr storage chunk is decoded once per call), then put
        back in the order asked; unreadable data raises like :meth:`read`.
        """
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        ascending = rows[order]
        out = np.empty((len(rows), self.shape[1]), dtype=np.float32)
        if not len(rows):
            return out
        if self.kind == "array":
            out[order] = self._float32(self.array[ascending], ascending)
            return out
        lo, hi = int(ascending[0]), int(ascending[-1]) + 1
        try:
            if self.kind == "npy":
                data = np.load(self.readable, mmap_mode="r")[ascending]
            else:
                import zarr

                array = zarr.open_array(self.readable, path=self.array_path, mode="r")
                _check_chunks_present(array, lo, hi, self)
                data = array.oindex[ascending, :]
            self._check_shape(data, len(rows))
            out[order] = self._float32(data, ascending)
            self._check_unchanged()
            return out
        except RankwiseError:
            raise
        except Exception:  # zarr/numcodecs/numpy raise many types for bad bytes
            return self.read(lo, hi)[ascending - lo][np.argsort(order)]  # read() names the rows

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a float32 array.

        A file that cannot be read (a corrupt Zarr chunk, a chunk file missing from the
        store, a .npy truncated after it was opened) raises a :class:`RankwiseError`
        naming the file and the rows, never a library traceback.
        """
        if self.kind == "array":
            return self._float32(self.array[start:stop], np.arange(start, stop))
        try:
            if self.kind == "npy":
                data = np.load(self.readable, mmap_mode="r")[start:stop]
            else:
                import zarr

                array = zarr.open_array(self.readable, path=self.array_path, mode="r")
                _check_chunks_present(array, start, stop, self)
                data = array[start:stop]
            self._check_shape(data, stop - start)
            out = self._float32(data, np.arange(start, stop))
            self._check_unchanged()
            return out
        except RankwiseError:
            raise
        except Exception as exc:  # zarr/numcodecs/numpy raise many types for bad bytes
            self._check_unchanged(gone_ok=True)  # a store replaced meanwhile: not "corrupt"
            start, stop = self._narrow(start, stop)
            raise RankwiseError(
                f"{self.path}: cannot read rows {start}-{stop - 1} (0-based) of the {self.name} "
                f"({type(exc).__name__}: {first_line(exc)}); {_why_unreadable(exc)}"
            ) from None

    def _check_unchanged(self, gone_ok: bool = False) -> None:
        """Refuse a file replaced or rewritten since it was opened: the rows read before
        and after would belong to two versions (another process's encode renaming its
        new store over this one, a ``mv`` over the .npy), and the ranks of neither.
        Called after each read: a change before or during it is seen then.  ``gone_ok``:
        a file no longer there is left to the caller's message (a failed read: moved,
        or not visible on a Dask worker's machine)."""
        if self.identity is None or self.readable is None:
            return
        now = _identity(self.readable, self.kind, self.array_path)
        if now is None and gone_ok:
            return
        if not _same_file(self.identity, now):
            raise RankwiseError(
                f"{self.path}: the {self.name} changed during the run (replaced, rewritten "
                "or removed by another process); wait until nothing writes it, then run again"
            )

    def _check_shape(self, data: np.ndarray, n_rows: int) -> None:
        """Refuse rows read in another shape than the one the source was opened with (the
        file or store rewritten since: the engine would rank memory it never filled)."""
        if data.shape != (n_rows, self.shape[1]):
            self._check_unchanged()  # the usual cause, said as for any other change
            raise RankwiseError(
                f"{self.path}: {n_rows} rows of the {self.name} (opened as shape "
                f"{tuple(self.shape)}) read as shape {tuple(data.shape)}: the file was "
                "rewritten after it was opened; run again once it is written"
            )

    def _float32(self, data: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``data`` (rows ``rows`` of the source) as contiguous float32; a finite value
        beyond float32's range (float64 sources) is an error naming its row, not an inf
        that a later check would blame on the encoder."""
        if data.dtype.kind != "f" or data.dtype.itemsize <= 4:
            return np.ascontiguousarray(data, dtype=np.float32)
        with np.errstate(over="ignore"):
            out = np.ascontiguousarray(data, dtype=np.float32)
        over = np.isinf(out) & np.isfinite(data)
        if over.any():
            i, j = (int(k[0]) for k in np.nonzero(over))
            raise RankwiseError(
                f"{self.path or self.name}: row {int(rows[i])} (0-based) of the {self.name} "
                f"holds {float(data[i, j]):.4g}, beyond float32's range (3.4e38): rankwise "
                "ranks float32 embeddings; scale them down (every row by one factor)"
            )
        return out

    def _narrow(self, start: int, stop: int) -> tuple[int, int]:
        """The first storage chunk of ``[start, stop)`` that fails to read (for messages)."""
        step = self.chunk_rows or (stop - start)
        for lo in range(start - start % step if self.chunk_rows else start, stop, step):
            lo, hi = max(lo, start), min(lo + step, stop)
            try:
                if self.kind == "npy":
                    np.asarray(np.load(self.readable, mmap_mode="r")[lo:hi])
                else:
                    import zarr

                    zarr.open_array(self.readable, path=self.array_path, mode="r")[lo:hi]
            except Exception:
                return lo, hi
        return start, stop


def _identity(path: str, kind: str, array_path: str | None = None) -> Identity | None:
    """What says a file is still the one opened: ``(inodes, stamps, host)``.  A .npy
    file: its inode, and its size and modification time; a Zarr store: its folder's
    inode and its array metadata file's, and that file's size and modification time (a
    store renamed over it, or its array written again).  None when it cannot be read.
    Inodes count only on the machine that opened it (``host``): a Dask worker elsewhere
    may see the same file under another number (FUSE mounts), and never under another
    size or time."""
    import socket

    try:
        if kind == "npy":
            st = os.stat(path)
            return (st.st_ino,), (st.st_size, st.st_mtime_ns), socket.gethostname()
        root = os.stat(path)
        folder = os.path.join(path, array_path) if array_path else path
        for meta in ("zarr.json", ".zarray"):
            try:
                st = os.stat(os.path.join(folder, meta))
            except FileNotFoundError:
                continue
            return (root.st_ino, st.st_ino), (st.st_size, st.st_mtime_ns), socket.gethostname()
        return (root.st_ino,), (root.st_mtime_ns,), socket.gethostname()
    except OSError:
        return None


def _same_file(opened: Identity, now: Identity | None) -> bool:
    if now is None:
        return False
    same_host = opened[2] == now[2]
    return opened[1] == now[1] and (opened[0] == now[0] or not same_host)


def _why_unreadable(exc: BaseException) -> str:
    """The likely cause and fix of a read that failed after the source was opened (and
    checked) by the caller: a Dask worker may run as another user, or on a machine that
    does not see the path, and a file may change during the run."""
    if isinstance(exc, PermissionError):
        return (
            "this process may not read it (a Dask worker running as another user?): make "
            "it readable by every process of the run"
        )
    if isinstance(exc, FileNotFoundError):
        return (
            "it is no longer there (moved or deleted during the run, or not visible on a "
            "Dask worker's machine): put it back, or use a path every worker sees"
        )
    return "the file is corrupt or was changed during the run: write it again"


def _check_chunks_present(array, start: int, stop: int, source: EmbeddingSource) -> None:
    """Refuse rows whose storage chunk (or shard) file is absent, in a rankwise store.

    Zarr silently returns the fill value (zeros) for a chunk that was never written, so
    a store left incomplete by a crash or a partial copy would otherwise be read as
    zero vectors (an error under cosine, silently wrong numbers under euclidean).  Only
    rankwise's own stores are checked: they write every chunk, zeros included; other
    Zarr stores leave out chunks of zeros by design (zarr's ``write_empty_chunks``), so an
    absent file there is read as zeros, as zarr reads it.
    """
    if source.attrs is None:
        return
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
                        "incomplete (interrupted write or partial copy): write it again"
                    )
    except RankwiseError:
        raise
    except Exception:  # an unusual store layout: skip the check rather than fail
        return


def open_embeddings(
    source, *, name: str, n_rows: int | None = None, manifest: str | os.PathLike | None = None
) -> EmbeddingSource:
    """Open and check an embedding source (module docstring: what is checked).

    Parameters
    ----------
    source : path to ``.npy``, a Zarr store (group with array ``embeddings``) or Zarr
        array, or an array-like ``(N, D)``.
    name : what to call it in messages (e.g. "gallery embeddings").
    n_rows : rows the manifest has; a different N is an error naming both.
    manifest : the manifest's path (named in messages); when it is a file and the
        store records the manifest it was encoded from, their contents must agree.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            if tmp.exists():
                raise RankwiseError(
                    f"{path}: {name} not found, only an incomplete "
                    f"'{tmp.name}' left by an interrupted run; run the command "
                    "that writes it (e.g. `rankwise encode`) again"
                )
            raise RankwiseError(f"{path}: {name} not found; pass a .npy file or a Zarr store")
        if path.is_dir():
            src = _open_zarr(path, name)
        else:
            src = _open_npy(path, name)
    else:
        if type(source).__module__.startswith("zarr") and not hasattr(source, "dtype"):
            raise RankwiseError(  # a Group: np.asarray made a 0-d array of its repr
                f"the {name}: a Zarr group, not an array; pass its array (group"
                "['embeddings']) or the store's path"
            )
        try:
            array = np.asarray(source)
        except (TypeError, ValueError, RuntimeError) as exc:  # torch: grad, bfloat16, GPU
            raise RankwiseError(
                f"the {name} cannot be read as a numpy array ({type(exc).__name__}: "
                f"{first_line(exc)}); pass a float32 array (a torch tensor: "
                "tensor.detach().float().cpu().numpy())"
            ) from None
        src = EmbeddingSource("array", tuple(array.shape), name, array=array)
        _check_dtype(array.dtype, name, "the array")
    shape = src.shape
    label = src.path or name
    if len(shape) != 2:
        raise RankwiseError(f"{label}: {name} must be 2-D (rows, dim), found shape {shape}")
    if shape[1] == 0:
        raise RankwiseError(
            f"{label}: {name} have dimension 0; embeddings need at least one column"
        )
    check_manifest(src, manifest)
    if n_rows is not None:
        check_rows(src, n_rows, manifest)
    return src


def check_rows(src: EmbeddingSource, n_rows: int, manifest=None) -> None:
    """Refuse embeddings whose row count is not the manifest's ``n_rows``.

    A store holding a subset of its manifest's rows (``manifest_row``) must be opened
    with a manifest of the row count it was encoded from.
    """
    if src.manifest_rows is not None:
        if src.num_manifest_rows != n_rows:
            raise RankwiseError(
                f"{src.path}: {src.name} hold {src.shape[0]} of the "
                f"{src.num_manifest_rows} rows of the manifest they were encoded from, but "
                f"{manifest or 'the manifest'} has {n_rows} rows; pass that manifest, or "
                "encode this one"
            )
        return
    if src.shape[0] != n_rows:
        where = f" but {manifest or 'the manifest'} has {n_rows} rows"
        raise RankwiseError(
            f"{src.path or src.name}: {src.name} have {src.shape[0]} "
            f"rows{where}; rows must align one-to-one with the manifest"
        )


def check_manifest(src: EmbeddingSource, manifest) -> None:
    """Refuse a store opened with a manifest file other than the one it was encoded from.

    Compares the store's ``manifest_csv_sha256`` with the sha256 of ``manifest``'s
    bytes; nothing to compare (no attribute, no manifest file) passes.
    """
    recorded = (src.attrs or {}).get(MANIFEST_SHA256)
    if not recorded or manifest is None or not Path(manifest).is_file():
        return
    from .hashing import file_sha256

    actual = file_sha256(Path(manifest))
    if actual == recorded:
        return
    origin = src.attrs.get("manifest")
    if origin and Path(origin).resolve() == Path(manifest).resolve():
        raise RankwiseError(
            f"{src.path}: {src.name} were encoded from {manifest} (sha256 {recorded[:12]}), "
            f"which has changed since (sha256 {actual[:12]}), so rows would not align: "
            f"restore it, or encode {manifest} again"
        )
    raise RankwiseError(
        f"{src.path}: {src.name} were encoded from {origin or 'another manifest'} (sha256 "
        f"{recorded[:12]}), but {manifest} has other content (sha256 {actual[:12]}), so "
        f"rows would not align: pass the manifest the store was encoded from, or encode "
        f"{manifest} again"
    )


def check_same_dim(query: EmbeddingSource, gallery: EmbeddingSource) -> None:
    """Refuse query and gallery embeddings of different dimensions."""
    if query.shape[1] != gallery.shape[1]:
        raise RankwiseError(
            f"{query.path or query.name}{query.origin} has dimension {query.shape[1]} but "
            f"{gallery.path or gallery.name}{gallery.origin} has {gallery.shape[1]} (query vs "
            "gallery embeddings); encode both with the same model"
        )


def check_same_checkpoint(query: EmbeddingSource, gallery: EmbeddingSource) -> None:
    """Refuse query and gallery stores of one encoder (same kind and options, the same
    checkpoint file) encoded from different bytes of that file: it was rewritten
    between the two encode runs (a training run saving over it), and ranking one
    checkpoint's queries against another's gallery would give numbers of neither."""
    q, g = query.attrs or {}, gallery.attrs or {}
    same_file = q.get("checkpoint") is not None and q.get("checkpoint") == g.get("checkpoint")
    if not same_file or q.get("encoder") != g.get("encoder"):
        return
    q_hash, g_hash = q.get("checkpoint_hash"), g.get("checkpoint_hash")
    if q_hash and g_hash and q_hash != g_hash:
        raise RankwiseError(
            f"{query.path} and {gallery.path}: encoded from different contents of "
            f"{q['checkpoint']} (sha256 {q_hash[:12]} vs {g_hash[:12]}): the file changed "
            "between the two encode runs; encode both splits again (the pipeline does on "
            "its next run)"
        )


def _check_dtype(dtype, name: str, label: str) -> None:
    """Numbers, or booleans (binary codes, read as 0 / 1, as an encoder's output is:
    :func:`rankwise.encoders._as_matrix`)."""
    if not (
        np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == np.bool_
    ):
        raise RankwiseError(f"{label}: {name} have dtype {dtype}; expected numbers (float32)")


def _open_npy(path: Path, name: str) -> EmbeddingSource:
    if not path.is_file():  # a pipe (`<(...)`, a FIFO) or a device: every read reopens it
        raise RankwiseError(
            f"{path}: the {name} are in a pipe or device, not a file; save them to a .npy "
            "file first"
        )
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        first = first_line(exc)
        try:
            with open(path, "rb") as handle:
                magic = handle.read(6)
        except OSError:
            magic = b""
        if magic != b"\x93NUMPY":  # another kind of file (a CSV, a pickle) named .npy
            raise RankwiseError(
                f"{path}: not a .npy file (no NumPy header); give an array written by "
                "numpy.save, or a Zarr store"
            ) from None
        if "pickle" in first or "allow_pickle" in first or "Python objects" in first:
            raise RankwiseError(
                f"{path}: an array of Python objects (pickled), not numbers; save the "
                "embeddings as numbers: numpy.save(path, numpy.asarray(x, dtype=numpy.float32))"
            ) from None
        raise RankwiseError(
            f"{path}: not a readable .npy file ({first}); the file is "
            "truncated or corrupt: write it again with numpy.save"
        ) from None
    if not isinstance(array, np.ndarray):
        kind = (
            "an .npz archive" if isinstance(array, np.lib.npyio.NpzFile) else type(array).__name__
        )
        if hasattr(array, "close"):
            array.close()
        raise RankwiseError(
            f"{path}: expected a single .npy array (numpy.save), found "
            f"{kind}; save the (N, D) embeddings with numpy.save"
        )
    _check_dtype(array.dtype, name, str(path))
    file = str(path.absolute())
    return EmbeddingSource(
        "npy", tuple(array.shape), name, path=str(path), file=file, identity=_identity(file, "npy")
    )


def _open_zarr(path: Path, name: str) -> EmbeddingSource:
    import zarr

    tmp = path.with_name(path.name + ".tmp")
    try:
        # the arrays' own metadata, as read() and take() read them: a group's consolidated
        # metadata goes stale when an array is rewritten (zarr does not update it), and a
        # shape or dtype checked there would not be the one read
        node = zarr.open(str(path), mode="r", use_consolidated=False)
    except Exception as exc:  # zarr raises several types for a bad store
        raise RankwiseError(
            f"{path}: not a readable Zarr store ({type(exc).__name__}); write it again"
        ) from None
    array_path = None
    attrs = None
    manifest_rows = None
    ids_array = None
    if isinstance(node, zarr.Group):
        attrs = dict(node.attrs)
        if attrs.get("kind") == "embeddings":
            if attrs.get("complete") is not True:  # true itself: a string "false" is no mark
                raise RankwiseError(
                    f"{path}: incomplete embedding store (an interrupted encode); encode "
                    "again (it replaces the store)"
                )
            fix = "encode again with `rankwise encode` (it replaces the store)"
            check_store_format(attrs, str(path), fix)
            check(
                attrs,
                EMBEDDING_ATTRS,
                where=str(path),
                fix=fix,
                noun="embedding store attribute ",
            )
        reading = "embeddings"
        try:
            found = "embeddings" in node
            if found:
                reading = MANIFEST_ROW
                manifest_rows = _manifest_rows(node, attrs, path)
                reading = "ids"
                if attrs.get("kind") != "embeddings" and "ids" in node:
                    ids_array = "ids"  # features exported elsewhere, keyed by id
                reading = "embeddings"
                node = node["embeddings"]
        except RankwiseError:
            raise
        except Exception as exc:  # an array's metadata that does not parse
            raise RankwiseError(
                f"{path}: array {reading!r} of the Zarr store cannot be read "
                f"({type(exc).__name__}: {first_line(exc)}); write the store again"
            ) from None
        if not found:
            hint = " (an interrupted run left it)" if tmp.exists() else ""
            raise RankwiseError(
                f"{path}: Zarr group has no array 'embeddings'{hint}; "
                "pass a rankwise embedding store or a Zarr array"
            )
        if not isinstance(node, zarr.Array):
            raise RankwiseError(
                f"{path}/embeddings is a Zarr group, not an array; store the (N, D) "
                "embeddings as the array 'embeddings' of the group (or pass the array itself)"
            )
        array_path = "embeddings"
        if manifest_rows is not None and len(manifest_rows) != node.shape[0]:
            raise RankwiseError(
                f"{path}: {len(manifest_rows)} manifest rows recorded for {node.shape[0]} "
                "embedding rows; the store is corrupt: encode again"
            )
    _check_dtype(node.dtype, name, str(path))
    file = str(path.absolute())
    return EmbeddingSource(
        "zarr",
        tuple(node.shape),
        name,
        path=str(path),
        file=file,
        identity=_identity(file, "zarr", array_path),
        array_path=array_path,
        chunk_rows=int(node.chunks[0]),
        attrs=attrs if (attrs or {}).get("kind") == "embeddings" else None,
        manifest_rows=manifest_rows,
        ids_array=ids_array,
    )


def _manifest_rows(group, attrs: dict, path: Path) -> np.ndarray | None:
    """A rankwise store's ``manifest_row`` array (rows kept from its manifest), or None.

    Another store with such an array is refused: its rows would be read in storage
    order, silently misaligned with the manifest if they are not in its order."""
    if MANIFEST_ROW not in group:
        return None
    if attrs.get("kind") != "embeddings":
        raise RankwiseError(
            f"{path}: has a '{MANIFEST_ROW}' array but is not an embeddings store written by "
            "rankwise, whose rows are read in the manifest's order; store the rows in "
            "manifest order without it, or give an 'ids' array to align them by id"
        )
    rows = np.asarray(group[MANIFEST_ROW][...])
    total = (attrs.get(ID_ALIGNMENT) or {}).get("manifest_rows")
    if (
        not isinstance(total, int)
        or rows.dtype.kind not in "iu"
        or rows.ndim != 1
        or (len(rows) and (rows[0] < 0 or rows[-1] >= total or (np.diff(rows) <= 0).any()))
    ):
        raise RankwiseError(
            f"{path}: its '{MANIFEST_ROW}' array does not match its '{ID_ALIGNMENT}' "
            "attribute; the store is corrupt: encode again"
        )
    return rows.astype(np.int64)
