"""rankwise: reproducible, out-of-core retrieval and re-identification evaluation.

``rankwise.evaluate``, ``rank``, ``recall_at_k`` and ``EvaluationResult`` are loaded on
first use (module ``__getattr__``): importing the package, and so ``rankwise --help``,
does not import numpy, pandas, numba, dask or zarr.  ``__version__`` too: reading the
installed package's metadata costs ~40 ms, paid by every pipeline job that never asks.
"""

from .errors import ProtocolHint, RankwiseError

#: public name -> the module that defines it, imported on first access
_LAZY = {"EvaluationResult": "api", "evaluate": "api", "rank": "api", "recall_at_k": "api"}

__all__ = [
    "EvaluationResult",
    "ProtocolHint",
    "RankwiseError",
    "__version__",
    "evaluate",
    "rank",
    "recall_at_k",
]


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rankwise")
    except PackageNotFoundError:  # running from a source tree without installation
        return "0.0.0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        globals()[name] = value = _package_version()
        return value
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"__version__"})
