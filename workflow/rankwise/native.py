"""The rank path's kernels compiled ahead of time: C, built once per machine, via ctypes.

:func:`engine_kernels` returns the kernel set the engine calls (``prepare_rows``,
``pair_keys``, ``count_tile``, ``ranks_from_hist``, same arguments and results as
:mod:`rankwise.kernels`; on an AVX-512 or AVX2 + FMA CPU the C kernels also have ``count_fused``,
``count_tile``'s histogram with the tile's float32 products computed in the same pass
over packed rows, so the tile never leaves the core's cache):

- ``native`` — ``_native_kernels.c``: the numba kernels' steps in C (with AVX-512 /
  AVX2 paths where the CPU has them), compiled by the system C compiler (``$CC``, else
  ``cc``, ``gcc`` or ``clang``) with ``-O3 -march=native -ffp-contract=off`` the first
  time a process needs it, then loaded from the cache in ~1 ms.  A ranking process then
  never imports numba (~0.15 s) nor sets up its compiler (~0.08 s), and ctypes releases
  the GIL during each call, so the workers' tiles still run in parallel.
- ``numba`` — :mod:`rankwise.kernels`, where no C compiler is found or the build fails.

Both give identical numbers: every count is the same rigorous decision, and the
canonical key the same sequential float64 sum (no fused multiply-add, no reordering),
tested equal in ``tests/test_native.py``.  A freshly built library must also reproduce
known answers computed in plain Python (:func:`self_test`) before it is cached: an
optimiser that drops a rounding would otherwise change ranks silently.
``RANKWISE_KERNELS=auto`` (default), ``native`` (an error when the C kernels cannot be
built) or ``numba`` chooses.

The library is cached like numba's code: in ``__pycache__`` beside this file, or in
``~/.cache/rankwise`` when the install is read-only (``RANKWISE_CACHE_DIR`` names the one
folder to use instead), named by a hash of the source, the compiler, its flags and the
CPU's feature flags (``-march=native`` code must never run on another CPU of a shared
home).  A build writes a temporary file and renames it, so concurrent first runs never
load a half-written library.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RankwiseError
from .rounding import error_bound_factor

SOURCE = Path(__file__).with_name("_native_kernels.c")
FLAGS = (
    "-O3",
    "-march=native",
    "-std=c11",
    "-ffp-contract=off",  # a*b + c stays two roundings: the canonical key is bit-exact
    "-fno-math-errno",  # sqrt inline (still correctly rounded)
    "-fPIC",
    "-shared",
)
MODES = ("auto", "native", "numba")

_LOCK = threading.Lock()
_CHOSEN: Any = None
_WHY_NOT: str = ""

_P = ctypes.c_void_p
_I = ctypes.c_int64
_B = ctypes.c_int
_D = ctypes.c_double
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rw_prepare_rows_f32": (ctypes.c_int64, [_P, _I, _I, _B, _P, _P, _P]),
    "rw_prepare_rows_f64": (ctypes.c_int64, [_P, _I, _I, _B, _P, _P, _P]),
    "rw_row_norms_f32": (ctypes.c_int64, [_P, _I, _I, _P, _P]),
    "rw_pair_keys": (None, [_P, _P, _P, _P, _I, _I, _B, _P]),
    "rw_fast_keys": (None, [_P, _P, _P, _P, _I, _I, _B, _P]),
    "rw_count_tile": (
        ctypes.c_int,
        [_P, _I, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _B, _B, _D, _P],
    ),
    "rw_ranks_from_hist": (None, [_P, _P, _I, _P]),
}
#: The fused tile kernel's functions: built only where the CPU has AVX-512 or AVX2 + FMA.
_FUSED_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rw_panel_widths": (None, [_P]),
    "rw_pack_rows": (None, [_P, _I, _I, _I, _P]),
    "rw_fused_roundings": (ctypes.c_int64, [_I]),
    "rw_fused_products": (None, [_P, _P, _I, _I, _I, _P]),
    "rw_count_fused": (
        ctypes.c_int,
        [_P, _P, _I, _I, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _I, _B, _B, _D, _P],
    ),
}


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _c(a, dtype) -> np.ndarray:
    """``a`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=dtype)


class NativeKernels:
    """The C kernels behind :mod:`rankwise.kernels`' signatures."""

    name = "native"

    def __init__(self, lib: ctypes.CDLL, path: Path):
        self.path = path
        self._f: dict[str, Any] = {}
        for fname, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, fname)
            fn.restype = restype
            fn.argtypes = argtypes
            self._f[fname] = fn
        #: whether :meth:`count_fused` exists (an AVX-512 or AVX2 + FMA build), and its panel
        #: widths (12 x 32, or 6 x 16)
        self.fused = hasattr(lib, "rw_count_fused")
        self.panels = (0, 0)
        if self.fused:
            for fname, (restype, argtypes) in _FUSED_SIGNATURES.items():
                fn = getattr(lib, fname)
                fn.restype = restype
                fn.argtypes = argtypes
                self._f[fname] = fn
            widths = np.zeros(2, dtype=np.int64)
            self._f["rw_panel_widths"](_ptr(widths))
            self.panels = (int(widths[0]), int(widths[1]))

    def prepare_rows(self, x, cosine):
        """:func:`rankwise.kernels.prepare_rows`: ``(rows, sq, bad, why)``."""
        x = np.asarray(x)
        if x.dtype == np.float32:
            fn = self._f["rw_prepare_rows_f32"]
        else:  # float64, and every other dtype through float64 (exact, as numba's)
            x = x.astype(np.float64, copy=False)
            fn = self._f["rw_prepare_rows_f64"]
        x = np.ascontiguousarray(x)
        n, d = x.shape
        rows = np.empty((n, d), dtype=np.float32)
        sq = np.empty(n, dtype=np.float64)
        why = np.zeros(1, dtype=np.int64)
        bad = fn(_ptr(x), n, d, bool(cosine), _ptr(rows), _ptr(sq), _ptr(why))
        return rows, sq, int(bad), int(why[0])

    def row_norms(self, x):
        """:func:`rankwise.kernels.row_norms`: ``(sq, bad, why)`` of float32 rows."""
        x = _c(x, np.float32)
        n, d = x.shape
        sq = np.empty(n, dtype=np.float64)
        why = np.zeros(1, dtype=np.int64)
        bad = self._f["rw_row_norms_f32"](_ptr(x), n, d, _ptr(sq), _ptr(why))
        return sq, int(bad), int(why[0])

    def pair_keys(self, qrows, grows, pq, pg, cosine, *, fast=False):
        """:func:`rankwise.kernels.pair_keys`: float64 canonical keys of the pairs
        (``fast``: count_tile's any-order keys instead, for the tests)."""
        qrows, grows = _c(qrows, np.float32), _c(grows, np.float32)
        pq, pg = _c(pq, np.int64), _c(pg, np.int64)
        out = np.empty(pq.shape[0], dtype=np.float64)
        self._f["rw_fast_keys" if fast else "rw_pair_keys"](
            _ptr(qrows), _ptr(grows), _ptr(pq), _ptr(pg), pq.shape[0], qrows.shape[1],
            bool(cosine), _ptr(out),
        )  # fmt: skip
        return out

    def count_tile(self, sim, qrows, *args):
        """:func:`rankwise.kernels.count_tile`: the int64 histogram like ``thr``
        (``args``: ``qsq, qlab, qid, grows, gsq, glab, gid, gjunk, thr, toff,
        exclude_self, cosine, bound``)."""
        if sim.dtype != np.float32 or sim.strides[1] != 4 or sim.strides[0] % 4:
            sim = _c(sim, np.float32)
        b, c = sim.shape
        ld = sim.strides[0] // 4 if b > 1 else c
        return self._count("rw_count_tile", (_ptr(sim), b, c, ld), qrows, *args)

    def _count(self, fname, head, qrows, qsq, qlab, qid, grows, gsq, glab, gid, gjunk, thr,
               toff, exclude_self, cosine, bound):  # fmt: skip
        """Call ``fname`` (``rw_count_tile`` or ``rw_count_fused``): ``head`` its leading
        arguments (the tile or the packed rows, and the shape), then the arguments both
        take, converted here; the histogram."""
        qrows, grows = _c(qrows, np.float32), _c(grows, np.float32)
        qsq, gsq, thr = _c(qsq, np.float64), _c(gsq, np.float64), _c(thr, np.float64)
        qlab, qid = _c(qlab, np.int64), _c(qid, np.int64)
        glab, gid, toff = _c(glab, np.int64), _c(gid, np.int64), _c(toff, np.int64)
        gjunk = _c(gjunk, np.bool_).view(np.uint8)
        hist = np.zeros(thr.shape[0], dtype=np.int64)
        status = self._f[fname](
            *head, _ptr(qrows), _ptr(qsq), _ptr(qlab), _ptr(qid), _ptr(grows), _ptr(gsq),
            _ptr(glab), _ptr(gid), _ptr(gjunk), _ptr(thr), _ptr(toff), qrows.shape[1],
            bool(exclude_self), bool(cosine), float(bound), _ptr(hist),
        )  # fmt: skip
        if status != 0:
            raise MemoryError(f"{fname[3:]}: out of memory for a tile's scratch arrays")
        return hist

    def pack_queries(self, rows):
        """A query block's prepared rows ``(b, D)`` packed for :meth:`count_fused`."""
        return self._pack(rows, self.panels[0])

    def pack_gallery(self, rows):
        """A gallery chunk's prepared rows ``(c, D)`` packed for :meth:`count_fused`."""
        return self._pack(rows, self.panels[1])

    def _pack(self, rows, width: int) -> np.ndarray:
        """Panels of ``width`` rows, each stored k-major (zero rows pad the last), in a
        64-byte aligned float32 array (each panel's loads then stay within cache lines)."""
        rows = _c(rows, np.float32)
        n, d = rows.shape
        size = -(-n // width) * width * d
        raw = np.empty(size + 16, dtype=np.float32)
        start = (-raw.ctypes.data % 64) // 4
        out = raw[start : start + size]
        self._f["rw_pack_rows"](_ptr(rows), n, d, width, _ptr(out))
        return out

    def count_fused(self, qpack, gpack, qrows, qsq, qlab, qid, grows, *args):
        """:meth:`count_tile`'s histogram, the tile's products computed in the same pass
        (``qpack``, ``gpack``: :meth:`pack_queries` / :meth:`pack_gallery` of ``qrows`` /
        ``grows``); the same integers, whatever the products' rounding.

        The products are four partial sums in order, so a term goes through at most
        :meth:`fused_roundings` ``(D)`` roundings (~D/4) instead of BLAS's D: the bound
        ``args[-1]`` (``error_bound_factor(D)``) is lowered to that, and fewer items are too
        close to call from the tile."""
        (b, d), c = np.shape(qrows), np.shape(grows)[0]
        qpack, gpack = self._packed(qpack, gpack, b, c, d, "count_fused")
        args = (*args[:-1], min(float(args[-1]), error_bound_factor(self.fused_roundings(d))))
        head = (_ptr(qpack), _ptr(gpack), b, c)
        return self._count("rw_count_fused", head, qrows, qsq, qlab, qid, grows, *args)

    def fused_products(self, qpack, gpack, n_query: int, n_gallery: int, dim: int):
        """The float32 products ``(n_query, n_gallery)`` :meth:`count_fused` computes from
        the packed rows (for the tests: their rounding is its own)."""
        qpack, gpack = self._packed(qpack, gpack, n_query, n_gallery, dim, "fused_products")
        out = np.empty((n_query, n_gallery), dtype=np.float32)
        self._f["rw_fused_products"](_ptr(qpack), _ptr(gpack), n_query, n_gallery, dim, _ptr(out))
        return out

    def _packed(self, qpack, gpack, b: int, c: int, d: int, what: str):
        """``qpack``, ``gpack`` as C float32 arrays, checked to be ``b`` query and ``c``
        gallery rows of ``d`` dims packed (the kernels read exactly that much)."""
        qpack, gpack = _c(qpack, np.float32), _c(gpack, np.float32)
        if qpack.size != -(-b // self.panels[0]) * self.panels[0] * d or (
            gpack.size != -(-c // self.panels[1]) * self.panels[1] * d
        ):
            raise ValueError(f"{what}: packed rows of another shape")
        return qpack, gpack

    def fused_roundings(self, dim: int) -> int:
        """The most roundings a term of :meth:`count_fused`'s ``D``-term products goes
        through: ``kc + parts - 1`` for ``parts`` partial sums of ``kc = ceil(D / 4)``."""
        return int(self._f["rw_fused_roundings"](int(dim)))

    def ranks_from_hist(self, hist, toff):
        """:func:`rankwise.kernels.ranks_from_hist`: sorted 1-based ranks per query."""
        hist, toff = _c(hist, np.int64), _c(toff, np.int64)
        ranks = np.empty(hist.shape[0], dtype=np.int64)
        self._f["rw_ranks_from_hist"](_ptr(hist), _ptr(toff), toff.shape[0] - 1, _ptr(ranks))
        return ranks


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else its description: part of the cache key."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def _cache_dirs() -> list[Path]:
    """Where the library may be: ``$RANKWISE_CACHE_DIR`` alone when set, else beside
    the package, then the user's cache."""
    from .cache_dir import user_cache_dir

    chosen = os.environ.get("RANKWISE_CACHE_DIR")
    if chosen:
        return [Path(chosen)]
    user = user_cache_dir()
    return [SOURCE.parent / "__pycache__", *([user] if user is not None else [])]


def library_name(cc: str, flags: tuple[str, ...] = FLAGS) -> str:
    """``_native_kernels-<key>.so``: the key hashes all that makes the binary."""
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), cc.encode(), " ".join(flags).encode(),
                 _cpu_flags().encode(), sys.platform.encode()):  # fmt: skip
        h.update(part)
        h.update(b"\0")
    return f"_native_kernels-{h.hexdigest()[:16]}.so"


def _build(flags: tuple[str, ...] = FLAGS) -> NativeKernels:
    """Load the cached library, building it first when no cache has it; raises
    OSError / RuntimeError saying why not.  (``flags``: the tests also build the
    kernels' AVX2-only and plain-C paths.)"""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install cc/gcc/clang)")
    name = library_name(cc, flags)
    for folder in _cache_dirs():
        path = folder / name
        if path.is_file():
            try:
                return NativeKernels(ctypes.CDLL(str(path)), path)
            except OSError:  # not a loadable library (a damaged file): built again below
                pass
    errors = []
    for folder in _cache_dirs():
        path = folder / name
        tmp = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp.touch()  # an unwritable folder: OSError here, and the next folder is tried
            done = subprocess.run(
                [cc, *flags, "-o", str(tmp), str(SOURCE), "-lm"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{Path(cc).name} failed: {done.stderr.strip()[:300]}")
            built = NativeKernels(ctypes.CDLL(str(tmp)), path)
            self_test(built)  # a miscompiled library never reaches the cache
            os.replace(tmp, path)
            return built
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"{folder}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    raise RuntimeError("; ".join(errors))


def _sequential(terms) -> float:
    """A float64 sum in order (Python floats are IEEE doubles): the canonical sum."""
    total = 0.0
    for t in terms:
        total += t
    return total


def _reference_key(q, g, cosine: bool) -> float:
    q, g = [float(v) for v in q], [float(v) for v in g]
    if cosine:
        return -_sequential(a * b for a, b in zip(q, g, strict=True))
    return _sequential((a - b) * (a - b) for a, b in zip(q, g, strict=True))


def self_test(k: NativeKernels) -> None:
    """Known answers, computed here in plain Python float arithmetic, that a freshly
    built library must reproduce bit for bit before it is cached: a compiler that
    reorders, fuses or drops a rounding (GCC 12's SLP vectoriser, for one, dropped the
    float32 rounding of interleaved normalised rows) would silently change ranks.
    Raises RuntimeError naming the first kernel that differs."""
    rng = np.random.default_rng(20261203)
    # entries over eight orders of magnitude: every sum here depends on its order
    x = rng.standard_normal((11, 37)) * 10.0 ** rng.integers(-4, 5, (11, 37))
    for dtype in (np.float32, np.float64):
        for cosine in (False, True):
            xs = x.astype(dtype)
            rows, sq, bad, _ = k.prepare_rows(xs, cosine)
            for i in range(xs.shape[0]):
                s = _sequential(float(v) * float(v) for v in xs[i])
                if cosine:
                    inv = 1.0 / math.sqrt(s)
                    want = np.array([float(v) * inv for v in xs[i]], dtype=np.float32)
                    s = _sequential(float(r) * float(r) for r in want)
                else:
                    want = xs[i].astype(np.float32)
                if bad != -1 or not np.array_equal(rows[i], want) or sq[i] != s:
                    raise RuntimeError(
                        f"prepare_rows ({np.dtype(dtype).name}) failed its self-test"
                    )
    x32 = x.astype(np.float32)
    sq, bad, _ = k.row_norms(x32)
    if bad != -1 or sq.tolist() != [_sequential(float(v) * float(v) for v in r) for r in x32]:
        raise RuntimeError("row_norms failed its self-test")
    for cosine in (False, True):
        rows, sq, _, _ = k.prepare_rows(x.astype(np.float32), cosine)
        pq, pg = rng.integers(0, 11, 23), rng.integers(0, 11, 23)
        keys = k.pair_keys(rows, rows, pq, pg, cosine)
        expected = [_reference_key(rows[a], rows[b], cosine) for a, b in zip(pq, pg, strict=True)]
        if keys.tolist() != expected:
            raise RuntimeError("pair_keys failed its self-test")
        _self_test_count_tile(k, rng, cosine)


def _self_test_count_tile(k: NativeKernels, rng, cosine: bool) -> None:
    """count_tile against brute-force counts on the canonical keys: clustered rows, exact
    duplicates under other labels, junk, own ids, 150 items (whole and partial groups)."""
    from .rounding import error_bound_factor

    n_q, n_g, d = 5, 150, 19
    centres = rng.standard_normal((3, d))
    qlab, glab = rng.integers(0, 3, n_q), rng.integers(0, 3, n_g)
    q = (centres[qlab] + 0.5 * rng.standard_normal((n_q, d))).astype(np.float32)
    g = (centres[glab] + 0.5 * rng.standard_normal((n_g, d))).astype(np.float32)
    g[:20] = g[20]  # exact ties
    glab[:10] = (glab[20] + 1) % 3
    qrows, qsq, _, _ = k.prepare_rows(q, cosine)
    grows, gsq, _, _ = k.prepare_rows(g, cosine)
    qid, gid = np.arange(n_q), rng.integers(0, 3 * n_q, n_g)
    junk = rng.random(n_g) < 0.1
    key = [[_reference_key(a, b, cosine) for b in grows] for a in qrows]
    thr, hist_want = [], []
    for i in range(n_q):
        rel = sorted(key[i][j] for j in range(n_g) if glab[j] == qlab[i] and not junk[j])
        other = [
            key[i][j] for j in range(n_g) if glab[j] != qlab[i] and not junk[j] and gid[j] != qid[i]
        ]
        ahead = [sum(v <= t for v in other) for t in rel]
        hist_want += [a - b for a, b in zip(ahead, [0, *ahead[:-1]], strict=True)]
        thr.append(rel)
    toff = np.cumsum([0] + [len(t) for t in thr])
    hist = k.count_tile(
        qrows @ grows.T, qrows, qsq, qlab, qid, grows, gsq, glab, gid, junk,
        np.array([v for t in thr for v in t]), toff, True, cosine, error_bound_factor(d),
    )  # fmt: skip
    if hist.tolist() != hist_want:
        raise RuntimeError("count_tile failed its self-test")
    if k.fused:
        flat = np.array([v for t in thr for v in t])
        fused = k.count_fused(
            k.pack_queries(qrows), k.pack_gallery(grows), qrows, qsq, qlab, qid, grows, gsq,
            glab, gid, junk, flat, toff, True, cosine, error_bound_factor(d),
        )  # fmt: skip
        if fused.tolist() != hist_want:
            raise RuntimeError("count_fused failed its self-test")


def mode() -> str:
    """``RANKWISE_KERNELS``: auto (default), native or numba; anything else is an error."""
    value = os.environ.get("RANKWISE_KERNELS", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise RankwiseError(
            f"environment variable RANKWISE_KERNELS={value!r} is not one of "
            f"{', '.join(MODES)}; unset it or pick one"
        )
    return value


def engine_kernels() -> Any:
    """The kernel set of this process: the C kernels when they build and load (unless
    ``RANKWISE_KERNELS=numba``), else :mod:`rankwise.kernels`.  Chosen once per process."""
    global _CHOSEN, _WHY_NOT
    if _CHOSEN is not None:
        return _CHOSEN
    with _LOCK:
        if _CHOSEN is None:
            wanted = mode()
            chosen: Any = None
            if wanted != "numba":
                try:
                    chosen = _build()
                except (OSError, RuntimeError) as exc:
                    _WHY_NOT = str(exc)
                    if wanted == "native":
                        raise RankwiseError(
                            f"RANKWISE_KERNELS=native: the C kernels cannot be built: "
                            f"{_WHY_NOT}; install a C compiler or unset RANKWISE_KERNELS"
                        ) from None
            if chosen is None:
                from . import kernels

                chosen = kernels
            _CHOSEN = chosen
    return _CHOSEN


def why_not_native() -> str:
    """Why this process fell back to numba ('' when it did not, or has not chosen)."""
    return _WHY_NOT
