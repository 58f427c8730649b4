"""The report's curves: the CMC of a ranks store, and the sketch completion curve with
its bootstrap intervals (the curves themselves are :mod:`rankwise.metrics`'s)."""

from __future__ import annotations

import os

from ..metrics import cmc
from ..summary import progressive_curve

__all__ = ["cmc_curve", "progressive_curve"]


def cmc_curve(ranks_store: str | os.PathLike, max_rank: int = 50) -> list[float]:
    """CMC of a ranks store: ``curve[k - 1]`` = % of queries with first rank <= k.

    Queries are the evaluated queries (the complete renderings for ``progressive``).

    Parameters
    ----------
    ranks_store : a store written by ``rankwise rank``.
    max_rank : length of the curve.

    Returns
    -------
    list of ``max_rank`` floats (percentages), non-decreasing.
    """
    from ..store import read_ranks

    arrays, attrs = read_ranks(ranks_store)
    return cmc(arrays, attrs, max_rank)
