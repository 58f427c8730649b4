"""Optional dependencies: which ``pip install 'rankwise[extra]'`` provides which module.

The base package evaluates (numpy, dask, zarr, pandas, numba, click, pillow, tqdm,
threadpoolctl); the pipeline, the report's charts, the demos, ONNX models and
dask.distributed each come with an extra. :func:`require` imports an optional module or
stops with one line naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import RankwiseError

#: top-level module -> (distribution, extra)
EXTRAS: dict[str, tuple[str, str]] = {
    "snakemake": ("snakemake", "pipeline"),
    "yaml": ("pyyaml", "pipeline"),
    "jsonschema": ("jsonschema", "pipeline"),
    "matplotlib": ("matplotlib", "report"),
    "sklearn": ("scikit-learn", "demo"),
    "onnxruntime": ("onnxruntime", "onnx"),
    "distributed": ("distributed", "distributed"),
}


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module``; if its package is missing, a RankwiseError naming the extra.

    ``purpose`` completes "<purpose> needs ...": ``require("matplotlib.figure",
    "rankwise report")`` -> ``rankwise report needs the matplotlib package; install it
    with: pip install 'rankwise[report]'``.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != top:  # the package is there but something it imports is not
            raise
        package, extra = EXTRAS[top]
        raise RankwiseError(
            f"{purpose} needs the {package} package; install it with: "
            f"pip install 'rankwise[{extra}]'"
        ) from None
