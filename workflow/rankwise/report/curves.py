"""The report's curves: the CMC of a ranks store, and the sketch completion curve with
its bootstrap intervals (the curves themselves are :mod:`rankwise.metrics`'s)."""

from __future__ import annotations

import os

import numpy as np

from ..metrics import cmc, completion_curve, completion_levels
from ..stats import DEFAULT_RESAMPLES, bootstrap_ci
from .constants import CONFIDENCE


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


def progressive_curve(
    arrays: dict[str, np.ndarray], attrs: dict, *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, list]:
    """The target's rank against sketch completion, for a ``progressive`` ranks store.

    A sketch's renderings are ordered by step; rendering t of T is ``100 t / T`` percent
    complete (grouped into tenths when there are more than 20 distinct levels).

    Returns
    -------
    dict of lists, one item per completion level (ascending): ``completion`` (percent),
    ``num_renderings``, ``mean_reciprocal_rank`` (mean ``1 / r_t`` in percent; m@B is
    its average over steps), ``median_rank``, ``ci95`` (bootstrap interval of the mean
    reciprocal rank, sketches resampled; ``None`` when ``resamples`` is 0).
    """
    out = completion_curve(arrays)
    out["ci95"] = [
        [
            100.0 * x
            for x in bootstrap_ci(
                1.0 / r, clusters=sketch, resamples=resamples, seed=seed, confidence=CONFIDENCE
            )
        ]
        if resamples
        else None
        for _, r, sketch in completion_levels(arrays)
    ]
    return out
