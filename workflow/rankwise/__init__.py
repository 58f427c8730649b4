"""rankwise: reproducible, out-of-core retrieval and re-identification evaluation."""

from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("rankwise")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

from .errors import RankwiseError  # noqa: E402
from .api import EvaluationResult, evaluate, rank, recall_at_k  # noqa: E402

__all__ = ["EvaluationResult", "RankwiseError", "evaluate", "rank", "recall_at_k", "__version__"]
