"""Zarr stores: embeddings ``(N, D)`` and ranks (CSR), written atomically.

Every store is written under ``<path>.tmp`` and renamed to ``<path>`` only once
complete, so a store that exists under its final name is complete.  The writer holds a
lock on ``<path>.lock`` all the while (:func:`atomic_directory`): a second writer of the
same path stops at once, and a leftover ``<path>.tmp`` (its writer gone) is removed
when the next write starts.

Embedding store (a Zarr group)::

    embeddings   float32 (N, D), chunked along N
    manifest_row int64 (N,)           only when rows were dropped (id-keyed features)
    attrs        {"kind": "embeddings", "encoder": ..., "checkpoint_hash": ...,
                  "manifest_hash": ..., "rankwise_version": ..., "rankwise_format": 1,
                  "complete": true}

Ranks store (a Zarr group), one entry per *evaluated* query::

    offsets      int64 (n_eval + 1)   CSR row pointers into ``ranks``
    ranks        int64 (nnz,)         sorted 1-based ranks of each query's relevant items
    query_index  int64 (n_eval,)      row of the query in its manifest
    group        int64 (n_eval,)      progressive: sketch number (0..n_sketches-1), else -1
    step         int64 (n_eval,)      progressive: the rendering's step, else 0
    attrs        protocol, distance, num_queries, num_skipped, num_gallery, ...
                 (:data:`RANKS_ATTRS`, checked when read), kind, rankwise_format, complete

``rankwise_format`` (:data:`rankwise.schema.STORE_FORMAT`) is the layout's number: a
reader refuses a store of a newer layout than its own instead of misreading it.

Optional arrays (protocol variants; :data:`OPTIONAL_ARRAYS`), written when present::

    members_offsets  int64 (n_eval + 1)  multi-query: CSR pointers into ``members``
    members          int64 (n_members,)  multi-query: the pooled query's member rows
                                         (query manifest rows, by ascending id)
    shot_offsets     int64 (n_eval + 1)  single-gallery-shot: CSR pointers into ``shot_pmf``
    shot_pmf         float64 (nnz,)      P(single-shot rank = k), k = 1.. per query
    top_items        int64 (n_eval, 20)  re-ranked or query-expanded: each query's nearest
                                         valid gallery rows by the distance that ranked,
                                         -1-padded (the report's worst queries show them)
    unit_key         int64 (n_eval,)     the query's place in the string order of the
                                         query manifest's ids: the order in which the
                                         statistics number units (rankwise.metrics.
                                         unit_keys); older stores have none (store order)
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .embeddings import EMBEDDING_ATTRS
from .errors import RankwiseError
from .options import DISTANCE
from .registry import PROTOCOLS
from .schema import STORE_FORMAT, Field, check, check_store_format, optional

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


def store_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The attributes of the Zarr group at ``path`` (v3 ``zarr.json`` or v2 ``.zattrs``),
    ``{}`` when there are none: read from its metadata file alone, without importing
    zarr (0.4-0.6 s) or opening anything else."""
    import json

    for meta, key in (("zarr.json", "attributes"), (".zattrs", None)):
        try:
            data = json.loads((Path(path) / meta).read_text())
        except (OSError, ValueError):
            continue
        attrs = data.get(key, {}) if key and isinstance(data, dict) else data
        return attrs if isinstance(attrs, dict) else {}
    return {}


def store_kind(path: str | os.PathLike) -> str | None:
    """The ``kind`` attribute of the rankwise store at ``path`` (complete or not), else
    ``None`` (:func:`store_attrs`)."""
    kind = store_attrs(path).get("kind")
    return kind if isinstance(kind, str) else None


def enclosing_store(path: str | os.PathLike) -> tuple[Path, str] | None:
    """``(folder, kind)`` of the rankwise store that ``path`` lies inside (a folder above
    it whose Zarr metadata carries a rankwise ``kind``), or ``None``: an output written
    there (``r.zarr/zarr.json``) would damage the store, an input or not."""
    for folder in Path(os.path.realpath(path)).parents:
        if (folder / "zarr.json").is_file() or (folder / ".zattrs").is_file():
            kind = store_kind(folder)
            if kind is not None:
                return folder, kind
    return None


def check_replaceable(path: str | os.PathLike, kind: str | None) -> None:
    """Refuse, before any work, to replace what is at ``path`` unless it is an empty
    folder or a rankwise ``kind`` store (an old result rerun by hand): a user's folder, an
    input store or a store of another kind given as the output is never deleted.  A file
    there is left to the caller (it fails to become a folder, in one line)."""
    final = Path(path)
    if kind is None or not final.is_dir() or not any(final.iterdir()):
        return
    found = store_kind(final)
    if found != kind:
        what = f"a rankwise {found} store" if found else "a folder that is not a rankwise store"
        raise RankwiseError(
            f"{final} is {what}; the {kind} store written here would replace it: choose "
            "another output path"
        )


#: Write errors that name no file (raised on a write or a close): a full disk, a quota,
#: a file-size limit (``ulimit -f``).  Inside a store's write they are the store's.
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


#: ``flock`` errors of a file system without locks (some NFS mounts): the write goes on
#: unlocked, as before locks existed, rather than failing.
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _lock_owner(fd: int) -> str:
    """`` (pid N)`` (`` (pid N on HOST)`` from another machine) as the lock's holder
    wrote it in the lock file, ``""`` when unknown (not written yet, unreadable)."""
    try:
        pid, _, host = os.pread(fd, 300, 0).decode("utf-8", "replace").strip().partition(" ")
    except OSError:
        return ""
    if not pid.isdigit():
        return ""
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return f" (pid {pid}{where})"


@contextmanager
def _write_lock(final: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<final>.lock`` for the block, or stop at once.

    A second writer of ``final`` raises :class:`RankwiseError` naming the first one's pid.
    The lock is the open file's, so the kernel drops it when its holder dies, however it
    dies: a lock file a killed writer left is simply locked again by the next one.

    The holder deletes the lock file before it lets go, so none is left beside the
    result.  That is the classic unlink-while-locked race: a writer that opened the
    file before it was deleted gets the lock once it is released, on a file no longer
    at the path, while a third one creates and locks a new file: two "holders".  So a
    writer that got the lock checks that the path still names the file it locked
    (same device and inode) and otherwise starts over on the new file; only a lock
    holder ever deletes the file, so the check cannot be outdated by the time it
    passes.  Where ``flock`` is not supported (:data:`_NO_LOCKS`) the block runs
    unlocked.
    """
    lock = final.with_name(final.name + ".lock")
    while True:
        created = writable = True
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:  # a writer's, live or dead: the lock tells
            created = False
            try:
                try:
                    fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
                except PermissionError:  # another user's: flock needs no write access
                    fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
                    writable = False
            except FileNotFoundError:  # deleted by its holder meanwhile
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _lock_owner(fd)
            os.close(fd)
            raise RankwiseError(
                f"{final} is being written by another process{owner}; wait for it to "
                "finish or stop it, then run again"
            ) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKS:
                raise
            try:
                yield
            finally:
                if created:
                    with suppress(OSError):
                        lock.unlink()
            return
        try:
            here = os.stat(lock)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            if writable:
                break
            # another user's killed writer left it, its pid in it: this writer holds it
            # now, so may delete it, and starts over with a file of its own
            try:
                lock.unlink()
            except OSError:
                break  # a read-only folder: the write fails soon anyway
        os.close(fd)  # deleted (and maybe made again) by the holder we waited on: again
    try:
        with suppress(OSError):  # only for the message of a writer refused meanwhile
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        with suppress(OSError):
            lock.unlink()  # while still held: see above
        os.close(fd)


@contextmanager
def atomic_directory(path: str | os.PathLike, kind: str | None = None) -> Iterator[Path]:
    """Yield an empty folder ``<path>.tmp`` to fill; it replaces ``path`` on success.

    ``kind``: what ``path`` may hold to be replaced (:func:`check_replaceable`, checked
    first); ``None``: anything (a folder rankwise generates inside its own output).

    The whole write, from the clean-up to the rename, holds an exclusive lock on
    ``<path>.lock`` (:func:`_write_lock`; the file is deleted at the end, so no lock
    file is left beside the result, and none is ever inside the store).  A second
    writer of ``path`` (a job of a killed Snakemake run still running, a second
    pipeline on the same results) raises :class:`RankwiseError` at once instead of
    writing into the first one's ``<path>.tmp`` and renaming it over the result.  So
    the temporary folder keeps its fixed name: whoever holds the lock owns it, and a
    ``<path>.tmp`` found then is a leftover of a dead writer, removed first (readers
    name it as an interrupted run's).  On any exception the temporary folder is
    removed and ``path`` is left as it was.
    """
    final = Path(path)
    if final.is_symlink():  # written through, as write_bytes_atomic writes a link's target
        # (a link renamed over, or rmtree'd, failed after all the work)
        final = Path(os.path.realpath(final))
    check_replaceable(final, kind)
    final.parent.mkdir(parents=True, exist_ok=True)
    with _write_lock(final):
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        old = final.with_name(final.name + ".old")
        if old.exists():  # a replaced result a killed run left behind
            shutil.rmtree(old)
        try:
            yield tmp
            if final.is_dir():
                # An old result under the final name (a user rerunning by hand) is replaced
                # whole: moved aside, the new one renamed in, then deleted, so a kill at any
                # point leaves the old result or the new one, never a half-deleted store.
                try:
                    os.rename(final, old)
                    os.rename(tmp, final)
                except BaseException:
                    # an interrupt (Ctrl-C) between the two renames: put the old result
                    # back before the new one is discarded, rather than leave neither
                    if old.is_dir() and not final.exists():
                        os.rename(old, final)
                    raise
                shutil.rmtree(old)
                return
            if final.exists():
                shutil.rmtree(final)  # a file there raises; the temporary folder goes with it
            os.rename(tmp, final)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and exc.filename is None and exc.errno in _FULL:
                # a full disk or a file-size limit met inside zarr's writes: the error
                # names no file; name the store (one line naming the path, not only
                # "No space left on device")
                raise OSError(exc.errno, exc.strerror or str(exc), str(final)) from None
            raise


@contextmanager
def atomic_store(path: str | os.PathLike, kind: str | None = None) -> Iterator[zarr.Group]:
    """Yield a fresh Zarr group at ``<path>.tmp``; rename it to ``path`` on success.

    The group is marked ``complete`` just before the rename (see :func:`atomic_directory`;
    ``kind``: the only store kind it may replace).  It carries its ``kind`` from the
    start, so that ``<path>.tmp`` given as an input (a crash left it) is an incomplete
    rankwise store, never a foreign Zarr store read as it stands (rows not yet written
    reading as zeros).
    """
    import zarr  # imported lazily: a CLI run on .npy inputs never needs it

    with atomic_directory(path, kind) as tmp:
        group = zarr.open_group(str(tmp), mode="w")
        if kind is not None:
            group.attrs.update(kind=kind, rankwise_format=STORE_FORMAT)
        yield group
        group.attrs["complete"] = True


def open_complete_group(path: str | os.PathLike, kind: str) -> zarr.Group:
    """Open a rankwise store for reading, refusing missing or incomplete ones."""
    import zarr

    p = Path(path)
    writer = dict(ranks="rank", embeddings="encode").get(kind, kind)  # the command
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
            f"expected a {kind} store, the Zarr folder written by `rankwise {writer}`: "
            "check the path"
        ) from None
    attrs = dict(group.attrs)
    found = attrs.get("kind")
    if found != kind and isinstance(found, str):  # another rankwise store: not "incomplete"
        raise RankwiseError(
            f"{p}: a rankwise {found} store, not a {kind} store; give the {kind} store "
            f"written by `rankwise {writer}`"
        )
    if attrs.get("complete") is not True:  # true itself: a string "false" is no mark
        raise RankwiseError(
            f"{p}: incomplete store (no 'complete' mark); run the command that writes it "
            "again (it replaces the store)"
        )
    if attrs.get("kind") != kind:
        raise RankwiseError(
            f"{p}: expected a rankwise {kind} store, found kind={attrs.get('kind')!r}"
        )
    check_store_format(attrs, str(p), f"run `rankwise {writer}` again (it replaces the store)")
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
    1-D int64 arrays of ``n_rows`` values stored beside it (``manifest_row``).  The
    attribute ``embeddings_sha256`` digests the shape, the rows' bytes and ``arrays``
    (the same numbers give the same digest, whatever the batches): a ranks store keeps
    a copy, so whoever reads the embeddings it names knows whether they are the ones
    ranked (images rewritten and encoded again keep every other attribute).
    """
    import hashlib

    digest = hashlib.sha256()
    with atomic_store(path, "embeddings") as group:
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
                    # every chunk a file, zeros too: an absent file then means a partial
                    # copy (embeddings._check_chunks_present), never "all zeros"
                    config={"write_empty_chunks": True},
                )
            if row + len(batch) > n_rows:
                raise RankwiseError(
                    f"{path}: encoder produced more rows than the manifest's {n_rows}"
                )
            arr[row : row + len(batch)] = batch
            if row == 0:
                digest.update(f"float32 {n_rows} x {batch.shape[1]}\n".encode())
            digest.update(np.ascontiguousarray(batch).data)
            row += len(batch)
        if arr is None or row != n_rows:
            raise RankwiseError(f"{path}: encoder produced {row} rows for a manifest of {n_rows}")
        for name, values in sorted((arrays or {}).items()):
            values = np.ascontiguousarray(values, dtype=np.int64)
            group.create_array(name, data=values, chunks=(max(1, min(len(values), 1 << 20)),))
            digest.update(f"\n{name} int64 {len(values)}\n".encode())
            digest.update(values.data)
        content = {"embeddings_sha256": digest.hexdigest()}
        group.attrs.update(_json_safe({"kind": "embeddings", **attrs, **content}))


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
    "unit_key": np.int64,
}
#: The shape of each array: ``(ndim, rows)``, rows ``n`` (one per evaluated query),
#: ``n+1`` (CSR pointers) or ``None`` (any: the values the pointers index).
_ARRAY_SHAPES: dict[str, tuple[int, str | None]] = {
    "offsets": (1, "n+1"),
    "ranks": (1, None),
    "query_index": (1, "n"),
    "group": (1, "n"),
    "step": (1, "n"),
    "members_offsets": (1, "n+1"),
    "members": (1, None),
    "shot_offsets": (1, "n+1"),
    "shot_pmf": (1, None),
    "top_items": (2, "n"),
    "unit_key": (1, "n"),
}
#: CSR pointers -> the array they index: a store holds both or neither.
_POINTERS = {"offsets": "ranks", "members_offsets": "members", "shot_offsets": "shot_pmf"}


#: The attributes of a ranks store (``rankwise rank``; the metrics JSON's provenance
#: holds them too), checked by :func:`read_ranks`.
RANKS_ATTRS: dict[str, Field] = {
    "protocol": Field("string", required=True, choices=PROTOCOLS),
    "distance": Field("string", required=True, choices=DISTANCE.choices),
    "num_queries": Field("count", required=True),
    "num_skipped": Field("count", required=True),
    "num_gallery": Field("count", required=True),
    "embedding_dim": Field("count", required=True),
    # the recorded protocol options that readers use (the report's worst queries)
    "protocol_options": Field("object"),
    "protocol_options.gap_frames": Field("integer"),
    "protocol_options.query_stride": Field("integer"),
    "protocol_options.junk_labels": Field("list"),
    "protocol_options.exclude_same_camera": Field("boolean"),
    "protocol_options.multi_query": Field("string"),
    "num_query_rows": Field("count"),
    # the folder `rankwise rank` ran in: what the relative paths below start from
    "working_directory": Field("path"),
    **{
        key: field
        for side in ("query", "gallery")
        for key, field in {
            f"{side}_manifest": Field("path"),
            f"{side}_manifest_sha256": Field("string"),
            f"{side}_embeddings": Field("object"),
            f"{side}_embeddings.path": Field("path"),
            # `rankwise rank` copies the attributes of any Zarr group it ranks: checked only
            # in a rankwise store's copy (another tool may keep 'num_rows' as text)
            **optional(
                EMBEDDING_ATTRS,
                f"{side}_embeddings.",
                when=(f"{side}_embeddings.kind", "embeddings"),
            ),
        }.items()
    },
}


def write_ranks(
    path: str | os.PathLike, arrays: dict[str, np.ndarray], attrs: dict[str, Any]
) -> None:
    """Write a ranks store (see module docstring) atomically."""
    with atomic_store(path, "ranks") as group:
        dtypes: dict[str, Any] = {name: np.int64 for name in RANK_ARRAYS}
        dtypes.update({k: v for k, v in OPTIONAL_ARRAYS.items() if k in arrays})
        for name, dtype in dtypes.items():
            data = np.ascontiguousarray(arrays[name], dtype=dtype)
            per_row = int(np.prod(data.shape[1:]))  # 1 for a vector
            rows = max(1, min(len(data), (1 << 20) // max(per_row, 1)))
            group.create_array(name, data=data, chunks=(rows, *data.shape[1:]))
        group.attrs.update(_json_safe({"kind": "ranks", **attrs}))


def read_ranks(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read a complete ranks store: ``(arrays, attrs)``, its attributes checked against
    :data:`RANKS_ATTRS` and its arrays against each other."""
    group = open_complete_group(path, "ranks")
    again = "run `rankwise rank` again with this --out (it replaces the store)"
    attrs = dict(group.attrs)
    check(attrs, RANKS_ATTRS, where=str(path), fix=again, noun="ranks store attribute ")
    if attrs["num_queries"] == 0:  # `rankwise rank` never writes one: every mean is NaN
        raise RankwiseError(
            f"{path}: the ranks store has no evaluated query ({attrs['num_skipped']} "
            "skipped): no metric is defined on it; check the labels and protocol it was "
            "ranked with"
        )
    # one lookup per optional name, not a listing of the group (which would also meet
    # Snakemake's `.snakemake_timestamp` file, and zarr would warn about it)
    arrays = {}
    for name in (*RANK_ARRAYS, *OPTIONAL_ARRAYS):
        try:
            if name in OPTIONAL_ARRAYS and name not in group:
                continue
            node: Any = group[name]
            arrays[name] = np.asarray(node[...])
        except KeyError:
            raise RankwiseError(f"{path}: ranks store lacks array {name!r}; {again}") from None
        except Exception as exc:  # corrupt metadata or chunk bytes: zarr/numcodecs types
            raise RankwiseError(
                f"{path}: array {name!r} of the ranks store cannot be read "
                f"({type(exc).__name__}); the store is corrupt: {again}"
            ) from None
    problem = _malformed(arrays)
    if problem:  # another tool's store, or a hand-edited one
        raise RankwiseError(f"{path}: ranks store array {problem}; {again}")
    problem = _inconsistent(arrays, attrs)
    if problem:
        # zarr reads an absent chunk file as zeros (and legitimately leaves out chunks of
        # zeros), so a partial copy shows here rather than as a missing file
        raise RankwiseError(
            f"{path}: the ranks store is inconsistent ({problem}): an interrupted write or "
            f"a partial copy; {again}"
        )
    return arrays, attrs


def _malformed(arrays: dict[str, np.ndarray]) -> str | None:
    """Which array has another dtype (kind), number of dimensions or length than
    :func:`write_ranks` writes, else ``None``."""
    n = len(arrays["query_index"]) if arrays["query_index"].ndim == 1 else None
    for name, data in arrays.items():
        want = np.dtype(OPTIONAL_ARRAYS.get(name, np.int64))
        ndim, rows = _ARRAY_SHAPES[name]
        if data.dtype.kind not in ("iu" if want.kind == "i" else want.kind):
            return f"{name!r} holds {data.dtype}, not {want}"
        if data.ndim != ndim:
            return f"{name!r} has shape {data.shape}, not {ndim}-D"
        expected = None if rows is None or n is None else n + (rows == "n+1")
        if expected is not None and len(data) != expected:
            return (
                f"{name!r} has {len(data)} rows, not {expected} "
                f"({'one more than ' if rows == 'n+1' else ''}the {n} of 'query_index')"
            )
    for pointers, values in _POINTERS.items():
        if (pointers in arrays) != (values in arrays):
            there, absent = (pointers, values) if pointers in arrays else (values, pointers)
            return f"{there!r} is there without {absent!r}"
    return None


def _inconsistent(arrays: dict[str, np.ndarray], attrs: dict[str, Any]) -> str | None:
    """What is wrong with a ranks store's arrays, else ``None``: every evaluated query has
    at least one rank (offsets from 0, increasing, ending at the number of ranks), ranks
    are >= 1, each query's manifest row (and unit key) appears once, and is a row of the
    query manifest; the variants' pointers run from 0 to their values' length."""
    offsets, ranks, rows = arrays["offsets"], arrays["ranks"], arrays["query_index"]
    if len(offsets) != len(rows) + 1 or (len(offsets) and offsets[0] != 0):
        return "offsets do not start at 0 with one entry per query"
    if np.any(np.diff(offsets) < 1) or (len(offsets) and offsets[-1] != len(ranks)):
        return "offsets are not increasing up to the number of ranks"
    if len(ranks) and ranks.min() < 1:
        return "a rank below 1"
    if len(np.unique(rows)) != len(rows):
        return "a query row listed twice"
    # each query's place among the manifest's ids: a lost chunk reads as zeros
    if "unit_key" in arrays and len(np.unique(arrays["unit_key"])) != len(arrays["unit_key"]):
        return "a unit key listed twice"
    if len(rows) and rows.min() < 0:
        return "a negative query row"
    n_rows = attrs.get("num_query_rows")
    if len(rows) and n_rows is not None and rows.max() >= n_rows:
        return f"query row {int(rows.max())} of a query manifest of {n_rows} rows"
    for pointers, values in _POINTERS.items():
        if pointers == "offsets" or pointers not in arrays:
            continue
        p = arrays[pointers]
        if p[0] != 0 or np.any(np.diff(p) < 0) or p[-1] != len(arrays[values]):
            return f"{pointers} do not run from 0 up to the length of {values}"
    return None


def search_folders(
    attrs: dict[str, Any], first: str | None = None, near: str | None = None
) -> list[str]:
    """The folders a relative path a ranks store's ``attrs`` name (a manifest, an
    embedding file) is looked for from, in order, each once (``""``: here):

    - ``first``, when given: where the ranks store itself was found (``""``: from here;
      a copied project's report reads its own files, not the original's);
    - ``near`` (a file of the same project: the metrics file a report reads): its folder
      and each folder above it (a moved project's files given from a third folder:
      ``moved/results/metrics/d/e.json`` finds ``moved/results/...``, not the files of
      whatever now lies at the folder it was ranked in);
    - its recorded ``working_directory``, where the command that wrote it meant it; then
      here (a project moved or copied here: its stores still name the old folder, which
      may be gone or hold other files); here alone when the two are one folder, or for a
      store written before rankwise recorded its folder.
    """
    folder = attrs.get("working_directory")
    try:
        here: str | None = os.path.realpath(os.curdir)
    except FileNotFoundError:  # the current folder deleted under the process
        here = None
    folders = [] if first is None else [first]
    folders += _folders_above(near) if near else []
    if isinstance(folder, str) and folder and os.path.realpath(folder) != here:
        folders.append(folder)
    folders.append("")
    unique: dict[str, str] = {}
    for f in folders:
        key = f if os.path.isabs(f) else os.path.join(here or "", f)
        unique.setdefault(os.path.normpath(key) if key else "", f)
    return list(unique.values())


def named_paths(
    attrs: dict[str, Any], path: str, first: str | None = None, near: str | None = None
) -> list[str]:
    """Where a path a ranks store's ``attrs`` name may be: ``path`` itself when it is
    absolute, else from each of :func:`search_folders` (the relative path as it is, from
    here).  Whoever reads one checks it is the file the ranks were computed from
    (:func:`named_inputs`)."""
    if os.path.isabs(path):
        return [path]
    return [os.path.join(folder, path) for folder in search_folders(attrs, first, near)]


def _folders_above(path: str) -> list[str]:
    """The folder of ``path`` and each folder above it, up to the root (absolute)."""
    try:
        folder = os.path.dirname(os.path.abspath(path))
    except FileNotFoundError:  # a relative path, the current folder deleted
        return []
    folders: list[str] = []
    while folder not in folders:
        folders.append(folder)
        folder = os.path.dirname(folder)
    return folders


def named_path(attrs: dict[str, Any], path: str) -> str:
    """The first of :func:`named_paths`: where the command that wrote the store meant."""
    return named_paths(attrs, path)[0]


def ranked_manifest(
    attrs: dict[str, Any], role: str, first: str | None = None, near: str | None = None
) -> str | None:
    """Where the ``role`` manifest the ranks store ``attrs`` were computed from is: the
    first of the places it names (:func:`named_paths`) holding a file of the sha256 it
    recorded (any file, in a store that recorded none); else the first file there (not
    the one ranked: the reader refuses it), else None."""
    from .hashing import file_sha256

    path, expected = attrs.get(f"{role}_manifest"), attrs.get(f"{role}_manifest_sha256")
    if not isinstance(path, str) or not path:
        return None
    found = [c for c in named_paths(attrs, path, first, near) if os.path.isfile(c)]
    ranked = (c for c in found if not expected or file_sha256(c) == expected)
    return next(ranked, None) or next(iter(found), None)


def embeddings_difference(attrs: dict[str, Any], role: str, path: str) -> str | None:
    """The first attribute in which the embedding store at ``path`` differs from the
    ranks store ``attrs``' record of its ``role`` embeddings (the rows' digest, the
    checkpoint's hash, the encoder's options, the manifest's hash, the rows kept); None
    when it has them all, or nothing was recorded but the path (an ``.npy``, another
    tool's array)."""
    provenance = attrs.get(f"{role}_embeddings")
    if not isinstance(provenance, dict):
        return None
    recorded = {k: v for k, v in provenance.items() if k not in ("path", "complete")}
    if not recorded:
        return None
    found = {k: v for k, v in store_attrs(path).items() if k not in ("path", "complete")}
    return next(
        (k for k in sorted(recorded.keys() | found.keys()) if recorded.get(k) != found.get(k)), None
    )


def ranked_embeddings(
    attrs: dict[str, Any], role: str, first: str | None = None, near: str | None = None
) -> str | None:
    """Where the ``role`` embeddings the ranks store ``attrs`` were computed from are:
    the first of the places they name with the attributes it recorded
    (:func:`embeddings_difference`); else the first that exists (not the ones ranked:
    the reader refuses them), else None."""
    provenance = attrs.get(f"{role}_embeddings") or {}
    path = provenance.get("path") if isinstance(provenance, dict) else None
    if not isinstance(path, str) or not path:
        return None
    found = [c for c in named_paths(attrs, path, first, near) if os.path.exists(c)]
    ranked = (c for c in found if embeddings_difference(attrs, role, c) is None)
    return next(ranked, None) or next(iter(found), None)


def named_inputs(
    attrs: dict[str, Any], first: str | None = None, near: str | None = None
) -> tuple[str | None, str | None, str | None, str | None]:
    """``(query manifest, gallery manifest, query embeddings, gallery embeddings)``:
    where the files the ranks store ``attrs`` were computed from are found from here
    (:func:`ranked_manifest`, :func:`ranked_embeddings`; None: no file there)."""
    roles = ("query", "gallery")
    manifests = [ranked_manifest(attrs, role, first, near) for role in roles]
    embeddings = [ranked_embeddings(attrs, role, first, near) for role in roles]
    return manifests[0], manifests[1], embeddings[0], embeddings[1]


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write a UTF-8 text file via a temporary file + rename: never a half-written file
    (see :func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write a binary file via a temporary file beside it + rename: never a half-written
    file.  The temporary name is this write's own (``.<name>.<pid>.<random>.tmp``), so
    writers of one path at once never mix their bytes: the last rename wins, whole.

    A symbolic link is written through: its target is replaced, the link stays (a
    ``latest.json`` link keeps pointing at fresh content).  A path that is not a
    regular file (``/dev/null``, ``/dev/stdout``, a FIFO) is written as a stream, as a
    shell redirection would: renaming over it would replace the device node or pipe
    with a file.  An error names ``path``, not the temporary file."""
    files = StagedFiles()
    files.write(path, data)
    files.commit()


#: Age after which a dead writer's temporary file beside an output is removed (seconds).
STALE_TEMPORARY_S = 600


def _remove_stale_temporaries(final: Path, own: str) -> None:
    """Remove the ``.<name>.<pid>.<random>.tmp`` files beside ``final`` that a killed
    writer left (SIGKILL, or a SIGTERM that stopped a report while its forked figure child
    wrote): another writer's, whose process is gone here, at least
    :data:`STALE_TEMPORARY_S` old.  The age keeps a live writer on another host of a
    shared file system safe, whose pid means nothing here."""
    prefix = f".{final.name}."
    try:
        entries = os.scandir(final.parent)
    except OSError:
        return
    with entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                continue
            token = entry.name[len(prefix) : -len(".tmp")]
            pid, _, random_part = token.partition(".")
            if token == own or not pid.isdigit() or len(random_part) != 8:
                continue
            try:
                age = time.time() - entry.stat(follow_symlinks=False).st_mtime
                if age >= STALE_TEMPORARY_S and not _alive(int(pid)):
                    os.unlink(entry.path)
            except OSError:  # gone already, or not ours to remove
                continue


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists here (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextmanager
def _signals_held() -> Iterator[None]:
    """Within: SIGINT and SIGTERM wait, and are delivered on exit (to the handlers in
    place before), so that a few renames are all done or none: a Ctrl-C between two of
    them left ``m.json`` new beside ``m.txt`` old.  Handlers can be set from the main
    thread only: elsewhere nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    saved = {}
    for number in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(number)
        if handler is None:  # installed outside Python: left alone
            continue
        saved[number] = handler
        signal.signal(number, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)
        if caught:
            signal.raise_signal(caught[0])


def _write_stream(given: Path, data: bytes, path: str | os.PathLike) -> None:
    try:
        with open(given, "wb") as stream:
            stream.write(data)
    except OSError as exc:  # /dev/full: name the path
        if exc.filename is not None or exc.errno not in _FULL:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


class StagedFiles:
    """Files written under temporary names beside them, renamed into place together by
    :meth:`commit`: a failure before it (a full disk at the third document) leaves
    every path as it was, never some files new and some old.  :meth:`discard` removes
    the temporary files.  The names (``.<name>.<pid>.<random>.tmp``) are this object's
    own, also in a forked child that writes with it (:meth:`expect` then lists those
    files in the parent).  Paths as :func:`write_bytes_atomic` treats them: links are
    written through; a path that is not a regular file is written as a stream, at
    :meth:`commit`."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}.{secrets.token_hex(4)}"
        self.finals: list[Path] = []
        self.streams: list[tuple[Path, bytes, str | os.PathLike]] = []

    @staticmethod
    def _final(path: str | os.PathLike) -> Path:
        given = Path(path)
        return Path(os.path.realpath(given)) if given.is_symlink() else given

    def _tmp(self, final: Path) -> Path:
        return final.with_name(f".{final.name}.{self.token}.tmp")

    def expect(self, path: str | os.PathLike) -> None:
        """``path`` was written with this object in a forked child: commit it too."""
        self.finals.append(self._final(path))

    def write(self, path: str | os.PathLike, data: bytes) -> None:
        given = Path(path)
        try:
            mode = given.stat().st_mode  # follows links; /dev/stdout -> the terminal or pipe
        except FileNotFoundError:  # not there, or a link to nothing: its target is created
            mode = None
        if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            self.streams.append((given, data, path))
            return
        final = self._final(given)
        if final in self.finals:  # e.g. --json naming one of the figures
            raise RankwiseError(
                f"{path}: two outputs of this command name this file; give each its own path"
            )
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp(final)
        created = False
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            created = True
            with open(fd, "wb") as stream:
                stream.write(data)
        except BaseException as exc:
            if created:
                with suppress(OSError):
                    tmp.unlink()
            if isinstance(exc, OSError):  # e.g. /proc/version: no file beside; a full disk
                reason = f"cannot write a temporary file beside it ({exc.strerror})"
                raise OSError(exc.errno, reason, str(path)) from None
            raise
        self.finals.append(final)
        _remove_stale_temporaries(final, self.token)

    def commit(self) -> None:
        """Rename every staged file into place, then write the streams.  A Ctrl-C (or
        SIGTERM) during the renames waits until they are all done: a document set is
        all new or all old (:func:`_signals_held`)."""
        try:
            with _signals_held():
                for final in self.finals:
                    os.replace(self._tmp(final), final)
        except BaseException:
            self.discard()
            raise
        for given, data, path in self.streams:
            _write_stream(given, data, path)

    def discard(self) -> None:
        for final in self.finals:
            with suppress(OSError):
                self._tmp(final).unlink()
