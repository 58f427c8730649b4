"""Paired comparisons of the encoders of each dataset, Holm-adjusted over the report."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ..errors import RankwiseError
from .constants import ALL_PAIRS_MAX, ALPHA, CONFIDENCE


def comparison_pairs(encoders: list[str], best: str | None = None) -> list[tuple[str, str]]:
    """The ``(a, b)`` pairs compared on one dataset, ``b`` tested against ``a``.

    Every pair (in the given order) for at most :data:`ALL_PAIRS_MAX` encoders. Beyond,
    ``2N`` tests at most instead of ``N^2 / 2``: each encoder against the previous one
    in config order (epoch to epoch), and the ``best`` one (by the first headline metric)
    against every encoder not already paired with it.
    """
    if len(encoders) <= ALL_PAIRS_MAX:
        return [(a, b) for i, a in enumerate(encoders) for b in encoders[i + 1 :]]
    pairs = list(itertools.pairwise(encoders))
    if best is not None:
        paired = {a for a, b in pairs if b == best} | {b for a, b in pairs if a == best}
        pairs += [(e, best) for e in encoders if e != best and e not in paired]
    return pairs


def ap_variant(entry: dict[str, Any]) -> str:
    return entry["provenance"]["ap"] or "standard"


def flip_resamples(resamples: int, num_tests: int) -> int:
    """Resamples (sign flips) of the paired tests: at least ``resamples``, and enough that
    the smallest Monte Carlo p-value, ``1 / (n + 1)``, survives Holm's correction over
    ``num_tests`` tests ten times over: ``n >= 10 num_tests / ALPHA`` (rounded up to
    a multiple of 1000)."""
    needed = -(-int(np.ceil(10 * num_tests / ALPHA)) // 1000) * 1000
    return max(int(resamples), needed)


def compare_encoders(
    groups, stores, *, resamples: int, seed: int, by: str, best: dict[str, str] | None = None
) -> tuple[list[dict], int]:
    """Every paired comparison, Holm-adjusted together (see the module docstring), and
    the resamples they used (:func:`flip_resamples`)."""
    from ..stats import compare_ranks, with_holm

    plan = []
    for dataset, entries in groups:
        by_name = {e["encoder"]: e for e in entries if stores[dataset, e["encoder"]] is not None}
        for a, b in comparison_pairs(list(by_name), (best or {}).get(dataset)):
            if ap_variant(by_name[a]) != ap_variant(by_name[b]):
                raise RankwiseError(
                    f"{by_name[b]['source']}: AP variant "
                    f"{ap_variant(by_name[b])!r} differs from {a}'s "
                    f"{ap_variant(by_name[a])!r} on dataset {dataset!r}; "
                    "score both with the same --ap"
                )
            names = [n for n in by_name[a]["metrics"] if n in by_name[b]["metrics"]]
            plan.append((dataset, a, b, names, ap_variant(by_name[a])))
    n_resamples = flip_resamples(resamples, sum(len(p[3]) for p in plan))
    rows = []
    for dataset, a, b, names, ap in plan:
        rows += compare_ranks(
            *stores[dataset, a],
            *stores[dataset, b],
            metrics=names,
            ap=ap,
            resamples=n_resamples,
            seed=seed,
            by=by,
            confidence=CONFIDENCE,
            dataset=dataset,
            names=(a, b),
        )
    return [
        {
            "dataset": row["dataset"],
            "metric": row["metric"],
            "a": row["encoder_a"],
            "b": row["encoder_b"],
            "value_a": row["a"],
            "value_b": row["b"],
            "diff": row["diff"],
            "ci95": row["ci95"],
            "p_value": row["p_value"],
            "p_holm": row["p_holm"],
            "significant": bool(row["p_holm"] < ALPHA),
            "test": row["test"],
            "by": row["by"],
            "num_units": row["num_units"],
            "num_clusters": row["num_clusters"],
        }
        for row in with_holm(rows)
    ], n_resamples
