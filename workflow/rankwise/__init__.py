"""rankwise: reproducible, out-of-core retrieval and re-identification evaluation.

``rankwise.evaluate``, ``rank``, ``recall_at_k`` and ``EvaluationResult`` are loaded on
first use (module ``__getattr__``): importing the package, and so ``rankwise --help``,
does not import numpy, pandas, numba, dask or zarr.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from .errors import RankwiseError

try:
    __version__ = _version("rankwise")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

#: public name -> the module that defines it, imported on first access
_LAZY = {"EvaluationResult": "api", "evaluate": "api", "rank": "api", "recall_at_k": "api"}

__all__ = ["EvaluationResult", "RankwiseError", "__version__", "evaluate", "rank", "recall_at_k"]


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
