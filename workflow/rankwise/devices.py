"""Where the rank engine's tile similarities run: numpy BLAS, or torch on a device.

The engine's count pass (:mod:`rankwise.ranking`) needs, per tile, the float32
similarities ``S = Q G^T`` of a query block ``(b, D)`` and a gallery chunk ``(c, D)``;
everything else (pass 1's canonical keys, the prefilter, the exact float64 fallback,
the counting) stays in the host kernels (C or numba: :mod:`rankwise.native`).  Runs
without that pass ignore the device: reassociation (candidate lists ranked on exact
keys), re-ranking (:mod:`rankwise.rerank`), and the CPU-side steps of query expansion
and single-gallery-shot draws.  A :class:`Tiles` backend says how ``S`` is computed:

``cpu``        numpy's float32 BLAS (the default; torch is never imported); with the C
               kernels on an AVX-512 or AVX2 + FMA CPU, their fused tile kernel, which
               computes each tile's products itself and counts them while they are in
               the core's cache (``count_fused`` in :mod:`rankwise.native`).
``cuda``       ``torch.matmul`` in float32 on the current CUDA device (choose one with
               ``CUDA_VISIBLE_DEVICES``); each gallery chunk and query block is copied to
               the device once, ``S`` is copied back per tile.
``auto``       ``cuda`` when torch is installed and sees a CUDA device, else ``cpu``
               (without importing torch, ~2 s, where no NVIDIA device node exists); with
               a dask.distributed scheduler, on every worker (:func:`check_workers`).
``torch-cpu``  the ``cuda`` code path on torch's CPU device: what the tests run where
               there is no GPU; also a way to compare the two paths on one machine.

Why the numbers cannot change
-----------------------------
:func:`rankwise.kernels.error_bound_factor` bounds the error of a float32 dot product
of length ``D`` by ``2 (D + 2) u |q| |g|`` (``u = 2^-24``).  That is twice the classical
``gamma_D`` bound (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
§3.1), which holds for *any* order of the ``D - 1`` additions (blocked, split-K, tree
reductions across GPU threads) and with or without fused multiply-adds (an FMA rounds
once where a multiply and an add round twice).  It does need every product and sum
rounded to float32 (no TF32, whose 10-bit mantissa inputs break it): the torch path
computes in IEEE float32 while it ranks (:func:`ieee_float32`: cuBLAS, cuDNN and oneDNN,
through torch's per-backend ``fp32_precision`` where it has them, else the legacy
``allow_tf32`` flags and ``set_float32_matmul_precision("highest")``).  Checked on an
NVIDIA H200 (torch 2.11, 2026-12-04): every test of tests/test_device.py on ``cuda``, and
bench.py's reports at Market and MSMT17 scale on three distributions, identical.  Items
within the bound of a threshold get the exact float64 key, as on the numpy path, so the
counts are identical.  Like the numpy path,
the bound ignores float32 underflow (products below ~1e-38, flushed to zero on some
GPUs): irrelevant for L2-normalised rows, reachable only for euclidean embeddings with
norms below ~1e-15.

The prefilter stays on the host, in ``count_tile`` (:mod:`rankwise.native`): it is a
vectorised float32 pass (billions of items a second per core) beside the counting it
feeds; moving it to the GPU would save the copy back of ``S`` (4 bytes a pair) at the
price of a second, sparse counting kernel repeating the exactness logic.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import RankwiseError
from .options import DEVICE

#: tile buffers of :meth:`NumpyTiles.similarities` not in use (one per busy worker at most)
_SCRATCH: list[np.ndarray] = []
_SCRATCH_LOCK = threading.Lock()


class NumpyTiles:
    """``device=cpu``: numpy float32 BLAS; "uploading" returns the array itself."""

    name = "cpu"
    #: whether uploaded rows are worth sharing between the tiles of a graph
    resident = False
    #: whether the host computes the products (kernels with a fused tile kernel may)
    host = True

    def upload(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def similarities(self, q: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Per tile: ``q @ g.T``, ``(b, c)`` float32, in a scratch buffer: hand it back
        with :meth:`release` once used (the next tile reuses it).

        Why a buffer: a fresh 32 MB tile is a fresh ``mmap`` (glibc maps requests of
        32 MiB and more directly), so every tile paid ~8,000 page faults and the kernel's
        zeroing before the BLAS wrote a byte (~1.5-3 ms of a ~60 ms msmt tile, measured).
        The same sgemm call writes the same values into either.
        """
        size = q.shape[0] * g.shape[0]
        with _SCRATCH_LOCK:
            # the smallest that fits: a last, narrower chunk leaves the full-size buffers
            # to the full-size tiles (first fit could hand it one and make the next tile
            # allocate another)
            fits = [i for i, buffer in enumerate(_SCRATCH) if buffer.size >= size]
            best = min(fits, key=lambda i: _SCRATCH[i].size, default=None)
            buffer = _SCRATCH.pop(best) if best is not None else np.empty(size, np.float32)
        return np.matmul(q, g.T, out=buffer[:size].reshape(q.shape[0], g.shape[0]))

    def release(self, sim: np.ndarray) -> None:
        """A tile of :meth:`similarities` no longer used: its buffer serves the next."""
        buffer = sim.base
        if isinstance(buffer, np.ndarray) and buffer.ndim == 1:  # one of ours
            with _SCRATCH_LOCK:
                _SCRATCH.append(buffer)

    @staticmethod
    def clear() -> None:
        """Free the scratch buffers (at the end of a pass: none is held between runs)."""
        with _SCRATCH_LOCK:
            _SCRATCH.clear()

    def exact_float32(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class TorchTiles:
    """``device=cuda`` / ``torch-cpu``: ``torch.matmul`` in IEEE float32 on ``device``.

    Only the device's name is held, so the backend pickles to dask.distributed workers
    (each imports torch itself).
    """

    resident = True
    host = False

    def __init__(self, device: str):
        self.device = device  # "cuda" or "cpu"
        self.name = "cuda" if device == "cuda" else "torch-cpu"

    def upload(self, rows: np.ndarray) -> Any:
        """Rows ``(n, D)`` float32 as a tensor on the device (on torch's CPU device: a
        view of the same memory)."""
        import torch

        if not rows.flags.writeable:  # torch warns on read-only arrays (from a cluster)
            rows = rows.copy()
        return torch.from_numpy(rows).to(self.device)

    def similarities(self, q: Any, g: Any) -> np.ndarray:
        """Per tile: ``q @ g.T`` on the device, copied back: ``(b, c)`` float32 numpy."""
        import torch

        force_ieee_float32(torch)  # a worker process of a cluster: not set by exact_float32
        if self.device == "cuda":
            _quiet_cublas_context_warning()
        return torch.matmul(q, g.T).cpu().numpy()

    def release(self, sim: np.ndarray) -> None:
        """Nothing to hand back: each tile is its own array."""

    @staticmethod
    def clear() -> None:
        """Nothing held."""

    def exact_float32(self) -> contextlib.AbstractContextManager[None]:
        """Within: TF32 off (the error bound needs IEEE float32 products); the
        previous process-wide settings are restored on exit."""
        import torch

        return ieee_float32(torch)


#: torch's warning when cuBLAS first runs in a thread without a current CUDA context
#: (each of the engine's worker threads: the rows were uploaded from the main thread)
CUBLAS_CONTEXT_WARNING = r"Attempting to run cuBLAS, but there was no current CUDA context"
_CUBLAS_WARNING_QUIET = False


def _quiet_cublas_context_warning() -> None:
    """Hide :data:`CUBLAS_CONTEXT_WARNING` (process-wide, that message only): torch then
    makes the device's primary context current itself, which is what the tile needs,
    but its two-line UserWarning would reach the terminal once per ``--device cuda``
    run (raised in the test run on an H200)."""
    global _CUBLAS_WARNING_QUIET
    if not _CUBLAS_WARNING_QUIET:
        warnings.filterwarnings("ignore", message=CUBLAS_CONTEXT_WARNING, category=UserWarning)
        _CUBLAS_WARNING_QUIET = True


def _precision_knobs(torch: Any) -> list[tuple[Any, str, Any]]:
    """``(object, attribute, IEEE value)`` of each setting that lets torch compute float32
    products in a reduced precision: cuBLAS matmuls and cuDNN convolutions and RNNs on
    CUDA, oneDNN matmuls, convolutions and RNNs on the CPU.

    torch >= 2.9 has per-backend ``fp32_precision`` strings, and its legacy getters
    (``allow_tf32``, ``get_float32_matmul_precision()``) raise once a process has used
    both APIs ("mix of the legacy and new APIs"): a training script's
    ``allow_tf32 = True`` then made our own read fail (seen on torch 2.11, H200).  The new
    attributes are read and written alone where they exist, the legacy flags elsewhere.
    """
    backends = torch.backends
    if isinstance(getattr(backends.cuda.matmul, "fp32_precision", None), str):
        knobs = [(backends.cuda.matmul, "fp32_precision", "ieee")]
        for parent in (backends.cudnn, backends.mkldnn):
            for op in ("conv", "matmul", "rnn"):  # rnn: a torchscript encoder's LSTM
                child = getattr(parent, op, None)
                if isinstance(getattr(child, "fp32_precision", None), str):
                    knobs.append((child, "fp32_precision", "ieee"))
        return knobs
    # the precision first, so put back last: cuBLAS's allow_tf32 is only
    # ``precision != "highest"`` there, and restoring it after would write "high" over a
    # caller's "medium"
    return [
        (_LegacyMatmulPrecision(torch), "value", "highest"),
        (backends.cuda.matmul, "allow_tf32", False),
        (backends.cudnn, "allow_tf32", False),
    ]


class _LegacyMatmulPrecision:
    """``torch.get/set_float32_matmul_precision`` as an attribute (torch < 2.9)."""

    def __init__(self, torch: Any):
        self._torch = torch

    @property
    def value(self) -> str:
        return str(self._torch.get_float32_matmul_precision())

    @value.setter
    def value(self, precision: str) -> None:
        self._torch.set_float32_matmul_precision(precision)


def force_ieee_float32(torch: Any) -> list[tuple[Any, str, Any]]:
    """Switch every reduced-precision float32 setting of :func:`_precision_knobs` to IEEE
    float32; returns ``(object, attribute, previous value)`` of those it changed (none when
    all were IEEE already: a call per tile costs a few attribute reads)."""
    changed = []
    for owner, attribute, ieee in _precision_knobs(torch):
        previous = getattr(owner, attribute)
        if previous != ieee:
            setattr(owner, attribute, ieee)
            changed.append((owner, attribute, previous))
    return changed


@contextlib.contextmanager
def ieee_float32(torch: Any) -> Iterator[None]:
    """Within: float32 matrix products and convolutions in IEEE float32 (TF32 off, on
    CUDA and in oneDNN); the settings it changed are put back on exit, so a library
    caller's own choice stands (and no API of torch's is mixed in that it did not use).

    Enter it from one thread: a second thread's context could put TF32 back while the
    first computes (the engine enters it once around a whole run)."""
    changed = force_ieee_float32(torch)
    try:
        yield
    finally:
        for owner, attribute, previous in reversed(changed):
            setattr(owner, attribute, previous)


Tiles = NumpyTiles | TorchTiles


def _gpu_may_be_visible() -> bool:
    """False when no CUDA device can be visible, known without importing torch (which
    takes ~2 s, the whole start-up budget of a small run): ``CUDA_VISIBLE_DEVICES``
    empty or -1, macOS, or a Linux without NVIDIA device nodes (``/dev/nvidia0``...;
    WSL2 exposes ``/dev/dxg``).  True means "ask torch"."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    if sys.platform == "darwin":
        return False
    if sys.platform.startswith("linux"):
        return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"))
    return True


def _torch(label: str, device: str) -> Any:
    try:
        import torch
    except ImportError:
        raise RankwiseError(
            f"{label} {device} needs torch (pip install 'rankwise[torch]'); use {label} cpu"
        ) from None
    return torch


def cuda_visible() -> bool:
    """Whether torch is installed here and sees a CUDA device (what ``auto`` asks; run on
    each worker of a cluster, whose tiles it is)."""
    if importlib.util.find_spec("torch") is None or not _gpu_may_be_visible():
        return False
    import torch

    return bool(torch.cuda.is_available())


def check_workers(tiles: Tiles, device: str, client: Any, label: str = "device") -> Tiles:
    """``tiles`` (chosen where rankwise started) for a dask.distributed cluster's
    workers, which compute the tiles: a CUDA backend needs a CUDA device on every
    worker.  ``auto`` then falls back to ``cpu``; ``cuda`` is an error naming the
    workers without one (their tasks would each fail in torch, with a traceback)."""
    if tiles.name != "cuda":
        return tiles
    seen = client.run(cuda_visible)  # worker address -> bool
    missing = sorted(address for address, ok in seen.items() if not ok)
    if not missing:
        return tiles
    if device == "auto":
        return NumpyTiles()
    named = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
    raise RankwiseError(
        f"{label} cuda: {len(missing)} of the scheduler's {len(seen)} workers see no CUDA "
        f"device (or have no torch): {named}; "
        f"start the workers where a GPU is visible, or use {label} cpu or auto"
    )


def tiles_for(device: str, label: str = "device") -> Tiles:
    """The backend of ``device`` (:data:`rankwise.options.DEVICE`); ``label`` names the
    option in messages (the parameter, or the CLI's ``--device``).

    ``cuda`` without a usable CUDA device is an error; ``auto`` then falls back to
    ``cpu``.  torch is imported only for ``cuda``, ``torch-cpu`` and (when installed)
    ``auto``.
    """
    device = DEVICE.check(device, label)
    if device == "cpu":
        return NumpyTiles()
    if device == "torch-cpu":
        _torch(label, device)
        return TorchTiles("cpu")
    if device == "auto":
        return TorchTiles("cuda") if cuda_visible() else NumpyTiles()
    torch = _torch(label, device)
    if not torch.cuda.is_available():
        why = (
            "is a CPU-only build"
            if torch.version.cuda is None
            else f"(CUDA {torch.version.cuda}) sees no CUDA device"
        )
        raise RankwiseError(
            f"{label} cuda: torch {torch.__version__} {why}; use {label} cpu or auto, "
            "or run where a GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)"
        )
    return TorchTiles("cuda")
