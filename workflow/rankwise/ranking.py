"""The out-of-core rank engine: embeddings + protocol -> sorted ranks per query.

Two passes over the gallery, each a Dask graph of (query block x gallery chunk)
tasks; no task holds more than one ``query_block x gallery_chunk`` tile and no
process holds the ``Q x G`` matrix.

1. *Thresholds* (per chunk): canonical keys ``t`` of each query's valid relevant
   items (or, for reassociation, of all its candidates), and a validity check of
   every gallery row (finite, non-zero under cosine).
2. *Counts* (per tile): for every threshold, the valid non-relevant items at or
   ahead of it (:func:`rankwise.kernels.count_tile`, in C or numba: :mod:`rankwise.native`),
   summed over chunks.

With ``t_1 <= ... <= t_G`` a query's sorted thresholds and
``N(t) = #{valid non-relevant g : key(g) <= t}``, its ranks are
``r_p = 1 + N(t_p) + (p - 1)``: the README's pessimistic tie rule (non-relevant
before relevant at equal distance), and the sorted rank list does not depend on
the row order among tied relevant items.  The two passes run as separate
``compute`` calls, one graph each; a gallery chunk is read only once the tasks of the
chunk ``workers + 1`` places before it are done, which keeps memory flat.  The last
``workers + 1`` chunks of pass 1, still in memory when it ends, are carried over: pass 2
counts them first, without reading and preparing them again.

The tile similarities of pass 2 run on numpy's BLAS, in the C kernels' fused tile
kernel (an AVX-512 or AVX2 + FMA CPU: products and counts in one pass, no tile written
out) or, with ``EngineOptions.device``, with torch on a GPU (:mod:`rankwise.devices`);
everything else runs on the host, and the numbers are the same on every device.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .embeddings import EmbeddingSource, check_same_dim
from .errors import RankwiseError, first_line
from .options import (
    DEVICE,
    DISTANCE,
    GALLERY_CHUNK,
    MEMORY_LIMIT,
    QUERY_BLOCK,
    SCHEDULER,
    WORKERS,
    recorded_rerank,
)
from .protocols import Problem
from .rounding import error_bound_factor

if TYPE_CHECKING:
    from .devices import Tiles

DISTANCES = DISTANCE.choices


def check_distance(distance: str) -> str:
    """Return ``distance`` or raise listing the valid ones."""
    return DISTANCE.check(distance)


@dataclass
class RankResult:
    """Sorted ranks of the relevant items of every evaluated query (CSR).

    ``ranks[offsets[i]:offsets[i+1]]`` belong to query row ``query_index[i]``.
    ``extra``: the optional arrays of protocol variants (:data:`rankwise.store.OPTIONAL_ARRAYS`).
    With id-keyed query features that left manifest rows out, ``query_index`` counts
    the rows kept; ``query_rows`` maps them to the manifest's.
    """

    offsets: np.ndarray
    ranks: np.ndarray
    query_index: np.ndarray
    group: np.ndarray
    step: np.ndarray
    attrs: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    #: the query manifest's row of each row ``query_index`` counts, when the query
    #: features left rows out (id-keyed, ``on_missing: drop``); None: the same rows.
    #: Not stored: a ranks store counts the rows its query store kept.
    query_rows: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "offsets": self.offsets,
            "ranks": self.ranks,
            "query_index": self.query_index,
            "group": self.group,
            "step": self.step,
            **self.extra,
        }


@dataclass
class EngineOptions:
    """How the work is cut and run; never changes a number."""

    query_block: int = QUERY_BLOCK.default
    gallery_chunk: int = GALLERY_CHUNK.default
    workers: int | None = None
    scheduler: Any = None  # None: threads; else a dask.distributed Client or address
    progress: bool = False
    memory_limit_mb: float | None = None  # refuse to start when the estimate exceeds it
    device: str = DEVICE.default  # where tile similarities run (rankwise.devices)

    def __post_init__(self) -> None:
        # messages name the parameter; the CLI checks the same specs, naming the flag
        QUERY_BLOCK.check(self.query_block)
        GALLERY_CHUNK.check(self.gallery_chunk)
        WORKERS.check(self.workers)
        MEMORY_LIMIT.check(self.memory_limit_mb, "memory_limit_mb")
        DEVICE.check(self.device)


#: Resident size of the interpreter with numpy, numba, dask and zarr loaded.
_BASE_MB = 250.0
#: The same with the C kernels' library in place of numba (a plain ranking process never
#: imports numba; measured ~80 MB on a tiny run, with room to spare).
_BASE_NATIVE_MB = 130.0
#: What importing torch adds to it (its CPU and CUDA libraries; measured 470-510 MB of
#: resident size before any CUDA context, which adds more host memory on a GPU machine;
#: with 500 a torch-cpu run peaked 30-50 MB above the estimate, hence the margin).
_TORCH_MB = 650.0
#: Gallery items per block of the fused tile kernel (RW_NB in _native_kernels.c).
_FUSED_BLOCK = 256


def estimate_memory_mb(
    n_query: int,
    n_gallery: int,
    dim: int,
    n_pairs: int,
    options: EngineOptions,
    workers: int,
    *,
    native: bool = False,
    fused: bool = False,
) -> float:
    """Peak resident memory (MB) of one rank run, from its shapes alone.

    Held throughout: the prepared queries ``(Q, D)`` twice (raw + prepared; three times
    when ``fused``: packed), the pair lists and keys (~48 bytes a pair), the gallery codes
    (~25 bytes a row).  Per worker at a time: a raw and a prepared gallery chunk
    ``(c, D)`` and either the float32 tile ``(b, c)`` or, ``fused``, the chunk's packed
    copy and the fused kernel's ``(b, 256)`` block, plus the interpreter's own size
    (``native``: with the C kernels, no numba; torch's on a torch device).
    """
    b = min(options.query_block, max(n_query, 1))
    c = min(options.gallery_chunk, max(n_gallery, 1))
    torch = options.device in ("cuda", "torch-cpu")
    held = (12.0 if fused else 8.0) * n_query * dim + 48.0 * n_pairs + 25.0 * n_gallery
    tile = 4.0 * c * dim + 4.0 * (b + 12) * _FUSED_BLOCK if fused else 4.0 * b * c
    per_worker = 8.0 * c * dim + tile + 16.0 * c
    base = (_BASE_NATIVE_MB if native else _BASE_MB) + (_TORCH_MB if torch else 0.0)
    # Per worker a chunk being read (raw + prepared) and room for two more prepared
    # ones (and packed, fused): at most workers + 1 are alive at once (_prep_tasks).
    more = (12.0 if fused else 8.0) * c * dim
    return base + (held + workers * (per_worker + more)) / 2**20


# ----------------------------------------------------------------- task functions


# Squared norms a non-zero row may have under euclidean.  The float32 error bound
# (kernels.error_bound_factor, 2 gamma_D relative to |q||g|) assumes no underflow and no
# overflow.  With every norm in [2^-50, 2^60], |q||g| lies in [2^-100, 2^120]: the D
# products' underflow errors (< 2^-126 each, even when flushed to zero) add at most
# D 2^-126 <= 2^-26 D |q||g| <= gamma_D |q||g| / 4, inside the bound's doubling (inputs
# flushed to zero: < 2^-126 sqrt(D) |g|, smaller still), and no partial sum, squared
# norm or key comes near float32's 2^128.  Cosine rows are normalised; a zero row
# multiplies exactly.  Outside the range the tiles would rank silently wrong.
EUCLIDEAN_MIN_SQ = 2.0**-100
EUCLIDEAN_MAX_SQ = 2.0**120


def zero_row_fix() -> str:
    """The advice for a zero row under cosine (query expansion, cosine whatever the
    distance, gives its own)."""
    return f"fix that item or use {DISTANCE.spelled} euclidean"


def prepare_chunk(
    source: EmbeddingSource,
    start: int,
    stop: int,
    cosine: bool,
    *,
    check_range: bool = True,
    zero_fix: str | None = None,
):
    """Per chunk: read rows ``[start, stop)``, normalise (cosine), check every row.

    Returns ``(rows, sq)`` of :func:`rankwise.kernels.prepare_rows` (under euclidean a
    read-only view of the rows read, which it would copy unchanged); a NaN/inf row, a
    zero row under cosine, or under euclidean a non-zero row whose squared norm lies
    outside ``[EUCLIDEAN_MIN_SQ, EUCLIDEAN_MAX_SQ]`` (where float32 tiles can no longer
    be bounded: ranks would silently be wrong) is an error naming the source and the
    row.  ``check_range=False``: rows read to be pooled, checked when ranked.
    ``zero_fix``: the advice for a zero row under cosine.
    """
    x, kernels = source.read(start, stop), _kernels()
    if cosine or x.dtype != np.float32:
        rows, sq, bad, why = kernels.prepare_rows(x, cosine)
    else:  # euclidean rows are the float32 rows read: their norms alone, no 16 MB copy
        # per chunk (each copy's fresh pages cost the kernel's zeroing and a fault)
        sq, bad, why = kernels.row_norms(x)
        rows = x.view()
        rows.flags.writeable = False  # a caller's own array may be under it
    if bad >= 0:
        raise RankwiseError(_bad_row_message(source, start + bad, why, zero_fix=zero_fix))
    if not cosine and check_range:
        row = first_out_of_range(sq)
        if row >= 0:
            raise RankwiseError(_bad_row_message(source, start + row, 3, float(sq[row])))
    return rows, sq


def first_out_of_range(sq: np.ndarray) -> int:
    """The first non-zero row whose squared norm lies outside ``[EUCLIDEAN_MIN_SQ,
    EUCLIDEAN_MAX_SQ]`` (euclidean ranks of float32 tiles are bounded only inside), or -1."""
    out = (sq != 0.0) & ((sq < EUCLIDEAN_MIN_SQ) | (sq > EUCLIDEAN_MAX_SQ))
    return int(np.argmax(out)) if out.any() else -1


def norm_range_problem(sq: float) -> str:
    """What is wrong with a row :func:`first_out_of_range` found, and the fix."""
    return (
        f"has norm {np.sqrt(sq):.3g}, outside "
        "[2^-50, 2^60] (8.9e-16 to 1.2e18), where float32 tiles cannot rank euclidean "
        "distances exactly; multiply all embeddings by one constant (euclidean ranks do "
        f"not change) or use {DISTANCE.spelled} cosine"
    )


def row_location(source: EmbeddingSource, row: int) -> str:
    """``<file>: <name> row <n> (0-based)``, the row counted in the file, with the
    manifest row and id it was encoded from where that is known
    (:meth:`~rankwise.embeddings.EmbeddingSource.manifest_item`), and the file a
    precomputed store came from (:attr:`~rankwise.embeddings.EmbeddingSource.origin`)."""
    item = source.manifest_item(row)
    return (
        f"{source.path or source.name}: {source.name} row {source.row_number(row)} "
        f"(0-based{'; ' + item if item else ''}){source.origin}"
    )


def _bad_row_message(
    source: EmbeddingSource,
    row: int,
    why: int,
    sq: float = 0.0,
    zero_fix: str | None = None,
) -> str:
    where = row_location(source, row)
    if why == 1:
        return f"{where} contains NaN or inf; fix or drop that item"
    if why == 3:
        return f"{where} {norm_range_problem(sq)}"
    return f"{where} is a zero vector, which has no cosine distance; {zero_fix or zero_row_fix()}"


def _kernels():
    """The process's kernel set: the C kernels, or numba's (:mod:`rankwise.native`)."""
    from .native import engine_kernels

    return engine_kernels()


def _block_task(block: dict, pack: bool) -> dict:
    """Per query block: its thresholds, by query, each query's keys ascending
    (:func:`_thresholds_by_query`), and with ``pack`` (tiles on the host) its rows packed
    for the fused tile kernel where the kernels running this task have one (else None:
    a tile whose kernels fuse packs them itself)."""
    out = {k: v for k, v in block.items() if k not in ("keys", "pair_q")}
    out["thr"] = _thresholds_by_query(block["keys"], block["pair_q"])
    kernels = _kernels()
    fuses = getattr(kernels, "fused", False)
    out["pack"] = kernels.pack_queries(block["rows"]) if pack and fuses else None
    return out


def _sum_counts(parts):
    """Combine: add the per-chunk ``count_tile`` histograms of one query block
    (a non-empty list of equal-shape int64 arrays; none is modified)."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _pair_keys_task(prep, qrows, pair_q, pair_g_local, cosine):
    """Per chunk: canonical keys of the pairs whose gallery item is in this chunk."""
    _limit_blas()
    return _kernels().pair_keys(qrows, prep[0], pair_q, pair_g_local, cosine)


def _upload_task(prep, tiles: Tiles):
    """Per chunk: the prepared gallery rows on the tiles' device, shared by the chunk's
    tiles (a tensor on the GPU stays there across the query blocks)."""
    return tiles.upload(prep[0])


def _prepare_packed_chunk(source: EmbeddingSource, start: int, stop: int, cosine: bool):
    """Pass 2's gallery chunk: :func:`prepare_chunk`'s ``(rows, sq)`` and the rows packed
    for the fused tile kernel when this process's kernels have one, else None."""
    return _packed_chunk(*prepare_chunk(source, start, stop, cosine))


def _packed_chunk(rows, sq):
    """``(rows, sq, packed rows or None)`` of a prepared chunk."""
    kernels = _kernels()
    return rows, sq, kernels.pack_gallery(rows) if getattr(kernels, "fused", False) else None


class _Carried:
    """Pass 1's last prepared chunks ``{c: (rows, sq)}``, handed to pass 2's tasks: each
    is taken out once (:func:`_carried_chunk`), so the chunk is freed with its tiles, as
    a chunk read in pass 2 is (a graph's literal arguments live as long as the graph)."""

    def __init__(self, chunks: dict):
        self.chunks = chunks

    def take(self, c: int):
        return self.chunks.pop(c)


def _carried_chunk(carried: _Carried, c: int, pack: bool):
    """Pass 2's chunk ``c`` from pass 1 (packed like :func:`_prepare_packed_chunk`'s
    when ``pack``: tiles on the host)."""
    rows, sq = carried.take(c)
    return _packed_chunk(rows, sq) if pack else (rows, sq)


def _count_task(prep, gdev, block, gmeta, cosine, bound, tiles: Tiles):
    """Per tile: float32 similarities (BLAS, or torch on a device: ``tiles``), then
    masks + counting in one compiled pass on the host; or, where the chunk was packed
    (:func:`_prepare_packed_chunk`), both in the C kernels' fused tile kernel.

    ``gdev`` / ``block["dev"]``: the rows already on the device, or None to copy them
    here (a dask.distributed run, where device tensors must not travel between workers).
    """
    _limit_blas()
    grows, gsq = prep[0], prep[1]
    kernels = _kernels()
    # count_tile's arguments after the tile (count_fused's after the packed rows)
    args = (
        block["rows"],
        block["sq"],
        block["lab"],
        block["id"],
        grows,
        gsq,
        gmeta["lab"],
        gmeta["id"],
        gmeta["junk"],
        block["thr"],
        block["toff"],
        block["exclude_self"],
        cosine,
        bound,
    )
    if len(prep) > 2 and prep[2] is not None and getattr(kernels, "fused", False):
        # (a cluster's worker may differ from the caller, which packed the block or not)
        qpack = block["pack"] if block["pack"] is not None else kernels.pack_queries(block["rows"])
        return kernels.count_fused(qpack, prep[2], *args)
    qdev = block["dev"] if block["dev"] is not None else tiles.upload(block["rows"])
    sim = tiles.similarities(qdev, gdev if gdev is not None else tiles.upload(grows))
    try:
        return kernels.count_tile(sim, *args)
    finally:
        tiles.release(sim)


_IN_DISTRIBUTED_WORKER = False


def _limit_blas() -> None:
    """In a distributed worker process, pin BLAS to one thread (threads: set by caller)."""
    global _IN_DISTRIBUTED_WORKER
    if _IN_DISTRIBUTED_WORKER or "distributed" not in sys.modules:
        return  # a worker process has imported distributed; a threaded run need not
    try:
        from distributed import get_worker

        get_worker()
    except ValueError:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    _IN_DISTRIBUTED_WORKER = True


# ----------------------------------------------------------------- scheduling


class _Runner:
    """Runs raw Dask graphs on threads or on a dask.distributed cluster."""

    def __init__(self, options: EngineOptions):
        import os

        self.workers = options.workers or os.cpu_count() or 1
        self.client = None
        self.owned = False  # a client connected here, closed by :meth:`close`
        if options.scheduler is not None:
            try:
                from distributed import Client
            except ImportError:
                raise RankwiseError(
                    f"{SCHEDULER.spelled} needs the 'distributed' package: "
                    "pip install 'rankwise[distributed]'"
                ) from None
            if isinstance(options.scheduler, Client):
                self.client = options.scheduler
                # without workers its first graph failed after 30 s ("No valid workers")
                _wait_for_workers(self.client, str(self.client.scheduler.address))
            else:
                self.client = _connect(Client, str(options.scheduler))
                self.owned = True
            self.workers = max(1, sum(self.client.nthreads().values()))

    def close(self) -> None:
        """Close the client connected for an address (a caller's Client stays open)."""
        if self.owned:
            self.client.close()

    @property
    def lookahead(self) -> int:
        """Gallery chunks read ahead (see :func:`_prep_tasks`): one per worker, and one
        more so that no worker waits for a chunk's last tile before reading the next."""
        return max(1, self.workers) + 1

    def put(self, data):
        """Data used by every graph of a stage: sent to the cluster once, not per graph
        (one graph's data is a key of that graph: computed again if a worker dies)."""
        if self.client is None:
            return data
        # A list, because a scattered dict would become one future per key.
        return self.client.scatter([data], broadcast=True, hash=False)[0]

    def get(self, graph: dict, keys: list, ticks: list = (), tick=None):
        """The results of ``keys``; ``tick()`` is called here, in this thread, once for
        each key of ``ticks`` as it completes (a progress bar)."""
        if self.client is not None:
            from distributed import KilledWorker, as_completed

            try:
                if tick is None or not ticks:
                    return self.client.get(graph, keys)
                futures = self.client.get(graph, [*keys, *ticks], sync=False)
                # this client's loop: a client rankwise connected is not the default one
                for _ in as_completed(futures[len(keys) :], loop=self.client.loop):
                    tick()
                return self.client.gather(futures[: len(keys)])
            except KilledWorker as exc:
                raise _killed_worker(exc) from None
        import dask.threaded

        if tick is None or not ticks:
            return dask.threaded.get(graph, keys, num_workers=self.workers)
        from dask.callbacks import Callback

        wanted = set(ticks)
        # registered beside a caller's own (dask.diagnostics.ProgressBar); dask.local
        # calls posttask in its scheduling thread, this one
        with Callback(posttask=lambda key, *_: key in wanted and tick()):
            return dask.threaded.get(graph, keys, num_workers=self.workers)


#: Task names whose work can exhaust a worker (the rest hold data or add counts).
# (A chunk's upload, 'gdev', is not among them: a no-op on the CPU and a copy on a GPU,
# whose failure raises; it is only ever blamed for being queued behind the task that died.)
_COMPUTE_TASKS = ("prep", "keys", "tile")


def _killed_worker(exc) -> RankwiseError:
    """One line for distributed's ``KilledWorker``: the worker process running a task
    ended (most often killed for memory) as many times as the scheduler allows."""
    task = exc.task[0] if isinstance(exc.task, tuple) else exc.task
    name = str(task).rsplit("-", 1)[0]  # "tile-<graph token>" -> "tile"
    # The scheduler blames every task it had queued on that worker, data keys included
    # (a chunk's labels): only a computing task's name says what was running.
    what = f"rankwise's {name!r} task" if name in _COMPUTE_TASKS else "rankwise's tasks"
    return RankwiseError(
        f"a worker of the Dask cluster died while running {what} "
        f"({exc.allowed_failures + 1} attempt(s); the last on {exc.last_worker.address}): "
        "its process ended, most often killed for using too much memory; see that "
        f"worker's log, and give the workers more memory or lower {QUERY_BLOCK.spelled} and "
        f"{GALLERY_CHUNK.spelled} (each worker thread holds one tile of that many queries x "
        "gallery rows)"
    )


#: Seconds to wait for a scheduler's answer, and then for its first worker.
_CONNECT_S = 30.0
_WORKERS_S = 15.0


def _connect(client_class, address: str):
    """A dask.distributed client of the scheduler at ``address`` with at least one
    worker, or one line saying what is wrong: an unreachable or malformed address, a
    port where something other than a Dask scheduler answers (the client would wait
    forever: it connects in a thread given :data:`_CONNECT_S`), no workers (the first
    task would fail after Dask's timeout with "No valid workers found")."""
    import threading

    where = f"the Dask scheduler at {address!r} ({SCHEDULER.spelled})"
    _check_address(address, where)
    result: dict = {}

    def connect() -> None:
        try:
            # not the process's default scheduler: the caller's own dask work stays local
            result["client"] = client_class(address, timeout=10, set_as_default=False)
        except BaseException as exc:  # handed to the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=connect, name="rankwise-connect", daemon=True)
    thread.start()
    thread.join(_CONNECT_S)
    if thread.is_alive():
        raise RankwiseError(
            f"{where} did not answer within {_CONNECT_S:g} s: something other than a Dask "
            "scheduler listens there; give the address the scheduler prints (tcp://host:8786)"
        )
    error = result.get("error")
    if isinstance(error, OSError):
        raise RankwiseError(f"cannot reach {where} ({error}); start it or fix the address")
    if isinstance(error, TypeError):  # before any byte is sent: e.g. tls:// without a
        # TLS configuration ("TLS expects a `ssl_context` argument"), wherever it points
        raise _unusable_address(where, error)
    if error is not None:  # the address parsed (_check_address): the peer is the problem
        # e.g. an SSH server's banner read as a Dask frame length: "MemoryError: Unable to
        # allocate 2.82 EiB"
        detail = "" if isinstance(error, MemoryError) else f" ({first_line(error)[:120]})"
        raise RankwiseError(
            f"{where} answered, but not as a Dask scheduler does{detail}: something else "
            "listens there; give the address the scheduler prints (tcp://host:8786)"
        )
    client = result["client"]
    try:
        _wait_for_workers(client, address)
    except RankwiseError:
        client.close()
        raise
    return client


def _wait_for_workers(client, address: str) -> None:
    """Wait up to :data:`_WORKERS_S` for the client's scheduler to have a worker, or
    say that it has none."""
    try:
        client.wait_for_workers(1, timeout=_WORKERS_S)
    except Exception:  # distributed's TimeoutError
        raise RankwiseError(
            f"the Dask scheduler at {address!r} ({SCHEDULER.spelled}) has no workers (none "
            f"joined within {_WORKERS_S:g} s); start some (dask worker {address}) or run "
            f"without {SCHEDULER.spelled}"
        ) from None


def _check_address(address: str, where: str) -> None:
    """A malformed address (no port, an unknown scheme) as one line, decided here without
    an event loop: inside the client's start-up the same mistake could surface as another
    error, depending on the state of distributed's shared loop (an AssertionError, seen
    under load)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        scheme, location = parse_address(address)
        get_backend(scheme)
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(location)
    except ValueError as error:
        raise _unusable_address(where, error) from None


def _unusable_address(where: str, error: BaseException) -> RankwiseError:
    """The one line for an address distributed cannot use, naming its complaint."""
    return RankwiseError(
        f"{where}: not a usable scheduler address ({type(error).__name__}: "
        f"{first_line(error)}); give the address the scheduler prints (tcp://host:8786)"
    )


def _prep_tasks(graph, key, tasks: list, runner, done) -> None:
    """Add each gallery chunk's task (read and prepare it, or take it from pass 1) to
    ``graph`` as ``key("prep", c)``; ``tasks``: ``(c, task)`` in the order the chunks are
    to be used.

    A pass is one graph, so no worker waits at a barrier between groups of chunks; to
    keep memory flat, the chunk ``i``-th in that order is read only after the tasks that
    use the ``(i - lookahead)``-th are done (``done(c)``: a key whose completion means that),
    so at most ``lookahead`` (workers + 1) prepared chunks are alive at once.
    """
    ahead = runner.lookahead
    for i, (c, task) in enumerate(tasks):
        graph[key("prep", c)] = task if i < ahead else (_after, done(tasks[i - ahead][0]), *task)


def _read_task(bounds, c: int, gallery: EmbeddingSource, cosine: bool, prepare=None) -> tuple:
    """The task reading and preparing gallery chunk ``c`` (with ``prepare``:
    :func:`prepare_chunk` by default)."""
    return (prepare or prepare_chunk, gallery, int(bounds[c]), int(bounds[c + 1]), cosine)


def _after(_done, func, *args):
    """``func(*args)``, run once the task whose result is ``_done`` has finished."""
    return func(*args)


def _first_bad_chunk(bounds, gallery: EmbeddingSource, cosine: bool) -> None:
    """Raise the error of the gallery's first bad row, if any: the chunks of a pass run
    in any order and the first error to arrive stops it, but the message should name the
    same row on every run."""
    for c in range(len(bounds) - 1):
        prepare_chunk(gallery, int(bounds[c]), int(bounds[c + 1]), cosine)


def _all_done(_results) -> None:
    """A chunk's tiles are all counted (the ``done`` key of :func:`_prep_tasks`)."""


def _key_maker():
    """Task keys unique to one graph: a cluster may still hold results of an earlier
    graph under the same names, and must not hand those back."""
    token = uuid.uuid4().hex[:12]
    return lambda name, *index: (f"{name}-{token}", *index)


def _chunk_bounds(n_rows: int, source: EmbeddingSource, chunk: int) -> np.ndarray:
    if source.chunk_rows:  # whole storage chunks per task: no read-modify of neighbours
        chunk = max(source.chunk_rows, chunk // source.chunk_rows * source.chunk_rows)
    return np.append(np.arange(0, n_rows, chunk), n_rows).astype(np.int64)


def compute_ranks(
    problem: Problem,
    query: EmbeddingSource,
    gallery: EmbeddingSource,
    *,
    distance: str,
    options: EngineOptions | None = None,
    rerank: dict[str, Any] | None = None,
    aqe: dict[str, Any] | None = None,
    drop_junk: bool = False,
) -> RankResult:
    """Ranks of every evaluated query's relevant items (see module docstring).

    Parameters
    ----------
    problem : from :func:`rankwise.protocols.build_problem`.
    query, gallery : embedding sources, ``(Q, D)`` and ``(G, D)``.
    distance : ``"cosine"`` or ``"euclidean"``.
    rerank : ``{"k1", "k2", "lambda", "variant"}`` (:func:`rankwise.options.check_rerank`): rank on
        the k-reciprocal re-ranked distance instead (:mod:`rankwise.rerank`), recorded
        in ``protocol_options``.
    aqe : ``{"k", "alpha"}`` (:data:`rankwise.options.AQE`): rank the average-query-
        expanded embeddings (:mod:`rankwise.query_expansion`; before any re-ranking, as
        fast-reid does), recorded in ``protocol_options``.
    drop_junk : with ``rerank`` or ``aqe``, leave the gallery's junk rows out of the
        neighbour sets too (torchreid's and fast-reid's loaders never read them; they are
        never ranked either way), recorded in ``protocol_options``.
    """
    options = options or EngineOptions()
    check_distance(distance)
    from .devices import tiles_for

    tiles = tiles_for(options.device)  # a missing GPU is an error before any work
    cosine = distance == "cosine"
    check_same_dim(query, gallery)
    dim = int(query.shape[1])
    runner = _Runner(options)
    try:  # a client rankwise opened is closed, whatever happens
        if runner.client is not None:  # the tiles are computed on the workers
            from .devices import check_workers

            tiles = check_workers(tiles, options.device, runner.client)
        kept = None  # the gallery rows left, when junk rows are dropped
        if drop_junk and (rerank is not None or aqe is not None) and problem.gjunk.any():
            kept = np.flatnonzero(~problem.gjunk)
        if options.memory_limit_mb is not None:
            # with a scheduler the tiles are on its workers: this process holds none
            workers = 0 if runner.client is not None else runner.workers
            _check_memory(problem, query, gallery, options, tiles.name, workers, rerank, aqe, kept)
        if kept is not None:
            problem, gallery = problem.gallery_subset(kept), gallery.subset(kept)
        if aqe is not None:
            from .query_expansion import expand
            from .rerank import item_order

            query, gallery = expand(query, gallery, aqe, options, runner, item_order(problem))
        qrows, qsq = prepare_chunk(query, 0, query.shape[0], cosine)
        bounds = _chunk_bounds(gallery.shape[0], gallery, options.gallery_chunk)
        evaluated = np.flatnonzero(~problem.skip)
        extra_arrays: dict[str, np.ndarray] = {}
        if rerank is not None:
            from .rerank import rerank_ranks

            offsets, ranks, top = rerank_ranks(
                problem,
                qrows,
                qsq,
                gallery,
                cosine=cosine,
                rerank=rerank,
                options=options,
                runner=runner,
            )
            extra_arrays = {"top_items": top}
        else:
            with tiles.exact_float32():
                ranked = False
                try:
                    offsets, ranks = _plain_ranks(
                        problem, qrows, qsq, gallery, bounds, cosine, dim, runner, options, tiles
                    )
                    ranked = True
                finally:
                    tiles.clear()  # the tile buffers are not kept between runs
                    if runner.client is not None:  # nor by a cluster's worker processes,
                        try:  # after a failed run too
                            runner.client.run(tiles.clear)
                        except Exception:
                            if ranked:  # else the run's own error is the one to show
                                raise
            if aqe is not None:
                # the report cannot rebuild the expanded rows' neighbours: keep them here
                from .neighbours import tiled_top_items
                from .rerank import TOP_STORED

                extra_arrays["top_items"] = tiled_top_items(
                    problem, evaluated.astype(np.int64), qrows, qsq, gallery, cosine=cosine,
                    k=TOP_STORED, block=options.query_block, chunk=options.gallery_chunk,
                )  # fmt: skip
    finally:
        runner.close()
    if kept is not None and "top_items" in extra_arrays:  # rows of the whole gallery
        top = extra_arrays["top_items"]
        extra_arrays["top_items"] = np.where(top >= 0, kept[np.maximum(top, 0)], -1)
    if problem.qkey is not None:  # the statistics' unit order (rankwise.metrics.unit_keys)
        extra_arrays["unit_key"] = problem.qkey[evaluated]
    attrs = {
        "protocol": problem.protocol,
        "distance": distance,
        "num_queries": problem.num_units - problem.num_units_skipped,
        "num_skipped": problem.num_units_skipped,
        "num_gallery": problem.num_gallery,
        "embedding_dim": dim,
        "protocol_options": dict(
            problem.options,
            **({"aqe": dict(aqe)} if aqe else {}),
            **({"rerank": recorded_rerank(rerank)} if rerank else {}),
            **({"drop_junk": True} if drop_junk else {}),
        ),
    }
    return RankResult(
        offsets=np.asarray(offsets, np.int64),
        ranks=np.asarray(ranks, np.int64),
        query_index=evaluated.astype(np.int64),
        group=problem.group[evaluated],
        step=problem.step[evaluated],
        attrs=attrs,
        extra=extra_arrays,
    )


def _check_memory(
    problem, query, gallery, options, device, workers, rerank, aqe, kept=None
) -> None:
    """Refuse, before any work, a run whose estimated peak exceeds the memory limit:
    the plain engine's estimate, or re-ranking's when larger (its stages replace the
    plain tiles); with query expansion, the larger of its own peak and the ranking's
    plus the expanded rows it leaves; plus the ``kept`` gallery rows read into memory when
    junk rows are dropped.  ``workers``: the threads whose tiles this process holds (0 with
    a scheduler, whose workers hold them)."""
    n_query, n_gallery, dim = query.shape[0], gallery.shape[0], int(query.shape[1])
    chunk = int(np.diff(_chunk_bounds(n_gallery, gallery, options.gallery_chunk)).max())
    kernels = _kernels()
    # re-ranking and query expansion import numba's kernels whatever ranks the tiles
    native = getattr(kernels, "name", "") == "native" and rerank is None and aqe is None
    fused = device == "cpu" and getattr(kernels, "fused", False)

    def estimate(block: int, chunk: int, workers: int) -> float:
        need = estimate_memory_mb(
            n_query, n_gallery, dim, len(problem.pair_q),
            EngineOptions(block, chunk, device=device), workers, native=native, fused=fused,
        )  # fmt: skip
        if rerank is not None:
            from . import rerank as rerank_module

            need = max(
                need,
                rerank_module.estimate_memory_mb(
                    n_query, n_gallery, dim, rerank, workers, block, chunk
                ),
            )
        if aqe is not None:
            from . import query_expansion

            during, after = query_expansion.estimate_memory_mb(
                n_query, n_gallery, dim, aqe, workers, block, chunk
            )
            need = max(_BASE_MB + during, need + after)  # expansion, then ranking
        if kept is not None:
            need += 4.0 * dim * len(kept) / 2**20
        return need

    need = estimate(options.query_block, chunk, workers)
    if need > options.memory_limit_mb:
        extra = "".join(
            label
            for label, used in ((", re-ranking", rerank), (", query expansion", aqe))
            if used is not None
        )
        # tiles take whole storage chunks of a Zarr gallery (_chunk_bounds): the least
        # chunk is the store's, whatever --gallery-chunk says
        least_chunk = int(np.diff(_chunk_bounds(n_gallery, gallery, 1)).max())
        stored = (
            f" (tiles take whole storage chunks of the gallery store: {least_chunk} rows)"
            if least_chunk > 1
            else ""
        )
        least = estimate(1, least_chunk, min(workers, 1))
        fix = (
            f"lower {QUERY_BLOCK.spelled}, {GALLERY_CHUNK.spelled}"
            f"{f' or {WORKERS.spelled}' if workers else ''}, or raise the limit{stored}"
            if least <= options.memory_limit_mb
            else f"even one-row tiles{' on one worker' if workers else ''} need about "
            f"{least:.0f} MB{stored}: raise the limit"
            + (", or write the store with smaller chunks" if stored else "")
        )
        where = f"{workers} workers" if workers else "on the scheduler's workers"
        raise RankwiseError(
            f"memory limit {options.memory_limit_mb:g} MB cannot be met: this run needs "
            f"about {need:.0f} MB ({n_query} queries x {n_gallery} gallery x {dim} dims, "
            f"tiles {min(options.query_block, max(n_query, 1))} x {chunk}, {where}{extra}); {fix}"
        )


_BLAS_LOCK = threading.Lock()
_BLAS_USERS = 0
_BLAS_LIMITS: Any = None


@contextlib.contextmanager
def one_blas_thread():
    """BLAS pinned to one thread while any ranking of this process runs (the tiles are
    the parallel work), restored when the last one ends.  BLAS limits are process-wide:
    a plain ``threadpool_limits(1)`` per call, in calls overlapping from a thread pool,
    restored one call's "1" after another's end and left every later BLAS call of the
    process (the user's numpy, torch) on one thread."""
    global _BLAS_USERS, _BLAS_LIMITS
    from threadpoolctl import threadpool_limits

    with _BLAS_LOCK:
        if _BLAS_USERS == 0:
            _BLAS_LIMITS = threadpool_limits(1)
        _BLAS_USERS += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_USERS -= 1
            if _BLAS_USERS == 0:
                _BLAS_LIMITS.restore_original_limits()
                _BLAS_LIMITS = None


def _plain_ranks(
    problem: Problem, qrows, qsq, gallery, bounds, cosine, dim, runner, options, tiles: Tiles
):
    """The two passes of the module docstring: ``(offsets, ranks)``."""
    with one_blas_thread():
        keys, carried = _pass_thresholds(problem, qrows, gallery, bounds, cosine, runner)
        evaluated = np.flatnonzero(~problem.skip)
        pair_q = problem.pair_q
        counts = np.bincount(pair_q, minlength=len(problem.skip))[evaluated]
        if problem.dense:
            toff = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            hist = _pass_counts(
                problem,
                qrows,
                qsq,
                keys,
                toff,
                evaluated,
                gallery,
                bounds,
                cosine,
                error_bound_factor(dim),
                runner,
                options,
                tiles,
                carried,
            )
            ranks = _kernels().ranks_from_hist(hist, toff)
            offsets = toff
        else:
            cand_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            from .kernels import rank_candidates  # reassociation: numba's

            offsets, ranks = rank_candidates(cand_off, keys, problem.pair_rel)
    return offsets, ranks


def _thresholds_by_query(keys: np.ndarray, pair_q: np.ndarray) -> np.ndarray:
    """The pairs' keys ``(P,)`` float64 ordered by query (``pair_q``), each query's keys
    ascending; only the values matter (tied keys may come in any order).

    One sort of the keys, then one of ``pair_q * P + rank`` (int64: the query, then the
    key's place among all keys): both numpy's vectorised sorts, ~8 ms for 300,000 pairs
    where a stable sort by query of the sorted keys (timsort on int64) took ~30 ms.
    """
    n = len(keys)
    order = np.argsort(keys)
    by_key = keys[order]
    if n == 0 or int(pair_q.max()) >= np.iinfo(np.int64).max // n:  # pragma: no cover
        return by_key[np.argsort(pair_q[order], kind="stable")]  # beyond int64's range
    composite = pair_q[order] * np.int64(n) + np.arange(n, dtype=np.int64)
    composite.sort()
    return by_key[composite % n]


def _pass_thresholds(problem: Problem, qrows, gallery, bounds, cosine, runner):
    """Pass 1: canonical keys of all pairs (relevant or candidate), by gallery chunk;
    ``(keys (P,), carried)``: :class:`_Carried` holding the last ``lookahead`` prepared
    chunks (in memory at the pass's end anyway), or None with a cluster (whose workers
    would have to send them back)."""
    pair_q, pair_g = problem.pair_q, problem.pair_g
    n_chunks = len(bounds) - 1
    # the pairs by gallery chunk, in pair order within one: a radix sort of the chunk
    # numbers (~3 ms for 300,000 pairs, where a stable sort by gallery row took ~20 ms)
    chunk_of = np.searchsorted(bounds, pair_g, side="right") - 1
    by_g = np.argsort(chunk_of.astype(np.uint16 if n_chunks < 2**16 else np.int64), kind="stable")
    cuts = np.concatenate([[0], np.cumsum(np.bincount(chunk_of, minlength=n_chunks))])
    keys = np.empty(len(pair_q), dtype=np.float64)
    key = _key_maker()
    graph: dict = {key("qrows"): qrows}  # one key: sent to a cluster once
    tasks = [(c, _read_task(bounds, c, gallery, cosine)) for c in range(n_chunks)]
    _prep_tasks(graph, key, tasks, runner, lambda c: key("keys", c))
    for c in range(n_chunks):
        sel = by_g[cuts[c] : cuts[c + 1]]
        # Every chunk is read and checked, even one holding no relevant item.
        graph[key("keys", c)] = (
            _pair_keys_task,
            key("prep", c),
            key("qrows"),
            pair_q[sel],
            pair_g[sel] - bounds[c],
            cosine,
        )
    # the last chunks read: holding them to the pass's end adds no memory (each was read
    # once the one `lookahead` places before it was used up)
    carry = [] if runner.client is not None else list(range(n_chunks))[-runner.lookahead :]
    try:
        results = runner.get(
            graph, [key("keys", c) for c in range(n_chunks)] + [key("prep", c) for c in carry]
        )
    except RankwiseError:
        _first_bad_chunk(bounds, gallery, cosine)
        raise
    for c, values in enumerate(results[:n_chunks]):
        keys[by_g[cuts[c] : cuts[c + 1]]] = values
    carried = dict(zip(carry, results[n_chunks:], strict=True))
    return keys, (_Carried(carried) if carried else None)


def _even_cuts(n: int, most: int, multiple: int = 1) -> np.ndarray:
    """Bounds ``(k + 1,)`` of the fewest blocks of at most ``most`` rows covering ``n``,
    of equal size (a multiple of ``multiple`` where that stays within ``most``) but the
    last: ``n = 3,368``, ``most = 1,024`` gives 852, 852, 852, 812 rather than 1,024 x 3
    and 296, so the two workers' last tiles end together."""
    if n <= 0:
        return np.zeros(1, dtype=np.int64)
    k = -(-n // most)
    size = -(-n // k)
    if -(-size // multiple) * multiple <= most:
        size = -(-size // multiple) * multiple
    return np.append(np.arange(0, n, size), n).astype(np.int64)


def _pass_counts(
    problem: Problem,
    qrows,
    qsq,
    keys,
    toff,
    evaluated,
    gallery,
    bounds,
    cosine,
    bound,
    runner,
    options: EngineOptions,
    tiles: Tiles,
    carried: _Carried | None = None,
) -> np.ndarray:
    """Pass 2: per tile counts of valid non-relevant items ahead of each threshold
    (``keys``: the pairs' keys, ``toff``: the evaluated queries' offsets into them); the
    chunks ``carried`` over from pass 1 are used first.

    Each query block's thresholds are sorted (and its rows packed for the fused kernel)
    by a task of the graph, so the workers do it while the first chunks are prepared.
    On a device (``tiles.resident``, threads) each query block is copied there once for
    the pass and each gallery chunk once for its tiles.  Returns the histogram ``(P,)``
    in threshold order (by query, each query's keys ascending).
    """
    resident = tiles.resident and runner.client is None
    kernels = _kernels()
    fused = tiles.host and getattr(kernels, "fused", False)
    pair_q = problem.pair_q
    if len(pair_q) > 1 and (pair_q[1:] < pair_q[:-1]).any():
        # grouped by query (build_problem's pairs are) so that a block's pairs are the
        # span toff gives it (skipped queries have none)
        order = np.argsort(pair_q, kind="stable")
        keys, pair_q = keys[order], pair_q[order]
    blocks = []
    cuts = _even_cuts(len(evaluated), options.query_block, kernels.panels[0] if fused else 1)
    for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        rows = evaluated[lo:hi]
        if rows[-1] - rows[0] == hi - lo - 1:  # consecutive rows: a view, not a copy
            block_rows = qrows[rows[0] : rows[-1] + 1]
        else:
            block_rows = np.ascontiguousarray(qrows[rows])
        span = int(toff[lo]), int(toff[hi])
        blocks.append(
            {
                "rows": block_rows,
                "dev": tiles.upload(block_rows) if resident else None,
                "sq": qsq[rows],
                "lab": problem.qlab[rows],
                "id": problem.qid[rows],
                "toff": toff[lo : hi + 1] - toff[lo],
                "exclude_self": problem.exclude_self,
                "span": span,
                # _block_task adds "thr" (sorted from these) and "pack"
                "keys": keys[span[0] : span[1]],
                "pair_q": pair_q[span[0] : span[1]],
            }
        )
    key = _key_maker()
    graph: dict = {
        key("block", b): (_block_task, block, tiles.host) for b, block in enumerate(blocks)
    }
    n_chunks = len(bounds) - 1
    # host tiles: each worker packs its chunks when its kernels fuse (a cluster's may not)
    prepare = _prepare_packed_chunk if tiles.host else None
    first = sorted(carried.chunks) if carried is not None else []
    order = first + [c for c in range(n_chunks) if c not in first]
    tasks = [
        (c, (_carried_chunk, carried, c, tiles.host))
        if c in first
        else (c, _read_task(bounds, c, gallery, cosine, prepare))
        for c in order
    ]
    _prep_tasks(graph, key, tasks, runner, lambda c: key("done", c))
    for i, c in enumerate(order):
        start, stop = int(bounds[c]), int(bounds[c + 1])
        graph[key("gdev", c)] = (_upload_task, key("prep", c), tiles) if resident else None
        graph[key("gmeta", c)] = {
            "lab": problem.glab[start:stop],
            "id": problem.gid[start:stop],
            "junk": problem.gjunk[start:stop],
        }
        for b in range(len(blocks)):
            graph[key("tile", b, c)] = (
                _count_task,
                key("prep", c),
                key("gdev", c),
                key("block", b),
                key("gmeta", c),
                cosine,
                bound,
                tiles,
            )
            # a block's counts summed chunk after chunk (in `order`): each tile's result
            # is freed as soon as it is added
            parts = [key("sum", b, i - 1), key("tile", b, c)] if i else [key("tile", b, c)]
            graph[key("sum", b, i)] = (_sum_counts, parts)
        # done once the chunk's counts are summed, not only counted: the next chunk is
        # read after it (_prep_tasks), so tile results cannot pile up behind sums the
        # scheduler runs later (at 64-row chunks, ~1 GB of them for a 50,000-row gallery)
        graph[key("done", c)] = (_all_done, [key("sum", b, i) for b in range(len(blocks))])
    bar = None
    if options.progress and sys.stderr.isatty():  # a log file would keep a stale 0% bar
        from tqdm import tqdm

        bar = tqdm(desc="rank", unit="chunk", leave=False, total=n_chunks)
    try:
        parts = runner.get(
            graph,
            [key("sum", b, n_chunks - 1) for b in range(len(blocks))],
            ticks=[key("done", c) for c in range(n_chunks)],
            tick=None if bar is None else bar.update,
        )
    finally:
        if bar is not None:
            bar.close()
    hist = np.zeros(len(keys), dtype=np.int64)
    for block, part in zip(blocks, parts, strict=True):
        lo, hi = block["span"]
        hist[lo:hi] = part
    return hist
