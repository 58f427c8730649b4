"""The statistics summary of one evaluation: what its metrics job caches for the report.

``rankwise metrics --stats-output S`` writes, next to the metrics JSON, for the report's
statistics settings (``resamples``, ``seed``, ``by``, ``confidence``, ``cmc_max_rank``)
and the metrics of that JSON:

- ``ci95``: the bootstrap interval of every metric (:func:`rankwise.stats.metric_cis`),
- ``cmc``: the CMC curve, ranks 1..``cmc_max_rank`` (:func:`rankwise.metrics.cmc`),
- ``progressive``: the sketch completion curve with its intervals (resampled by ``by``;
  ``progressive`` only),
- the per-unit values ``(n_units, m)`` in unit-key order
  (:meth:`rankwise.metrics.UnitTable.in_key_order`; a store written before unit keys:
  store order, ``keyed`` false),
  the units' query manifest rows ``(n_units,)`` and their cluster numbers ``(n_units,)``
  (for ``by``), from which the report's paired tests are computed without reading the
  ranks store again,
- ``key``: sha256 of the per-unit values, rows, clusters and metric names, the cache key
  of every paired test that involves this evaluation (:mod:`rankwise.report.pairs`).

So the report job only assembles: an evaluation's statistics are computed once, in its
own metrics job, in parallel with the others. The report uses a summary only when its
settings equal the report's; otherwise it computes the same functions from the ranks
store (the same numbers). File format: a NumPy ``.npz`` (arrays ``values``, ``rows``,
``cluster``; ``meta``, the rest as a JSON string), written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import RankwiseError
from .options import DEFAULT_RESAMPLES
from .registry import get_protocol

#: The settings a summary is computed for; the report uses it only when all are equal.
SETTINGS = ("metrics", "ap", "resamples", "seed", "by", "confidence", "cmc_max_rank")
_FORMAT = 2  # 2: intervals of non-constant columns resampled uncentred (2026-12-02)


class OldSummary(RankwiseError):
    """A summary written by an earlier version of :func:`write_summary` (its numbers may
    differ in the last bits): the report computes the statistics again instead."""


@dataclass(frozen=True)
class Summary:
    """One evaluation's statistics (see the module docstring)."""

    settings: dict[str, Any]
    ci95: dict[str, list[float]] | None
    cmc: list[float]
    progressive: dict[str, list] | None
    values: np.ndarray  # (n_units, m) float64, columns = settings["metrics"]
    rows: np.ndarray  # (n_units,) int64, query manifest row of each unit
    cluster: np.ndarray  # (n_units,) int64, resampled cluster of each unit
    #: units in unit-key order (False: a store written before unit keys, in store order)
    keyed: bool = True

    @property
    def key(self) -> str:
        """sha256 of what a paired test reads of this evaluation."""
        digest = hashlib.sha256()
        digest.update(json.dumps(list(self.settings["metrics"])).encode())
        for array in (self.values, self.rows, self.cluster):
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    def aligned(self, rows: np.ndarray) -> Summary | None:
        """This summary with its units in the order of ``rows`` (the same units listed in
        another order: :func:`rankwise.stats.align_units`), or ``None`` when they differ."""
        from .stats import align_units

        perm = align_units(self.rows, rows)
        if perm is None:
            return None
        return replace(
            self, values=self.values[perm], rows=self.rows[perm], cluster=self.cluster[perm]
        )

    def matches(self, settings: dict[str, Any]) -> bool:
        """Whether it was computed for these settings (``SETTINGS`` keys given)."""
        return all(
            _canonical(self.settings.get(k)) == _canonical(settings[k])
            for k in SETTINGS
            if k in settings
        )


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def summarise(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    metrics: list[str],
    ap: str = "standard",
    resamples: int,
    seed: int = 0,
    by: str = "query",
    confidence: float = 0.95,
    cmc_max_rank: int = 50,
    labels=None,
) -> Summary:
    """The summary of a ranks store ``(arrays, attrs)`` for these settings.

    ``resamples = 0`` leaves out the intervals (``ci95`` and the completion curve's are
    ``None``), as the report does; the per-unit values are kept.
    """
    from . import stats
    from .metrics import cmc, per_unit

    # without resampling there is nothing to refuse: a store with no evaluated query
    # gives an empty table (the intervals need one, and say so)
    table = (
        stats.unit_table(arrays, attrs, metrics, ap)
        if resamples
        else per_unit(arrays, attrs, metrics, ap=ap).in_key_order(arrays)
    )
    cluster = stats.clusters_of(table.rows, attrs, by=by, labels=labels)
    ci95 = (
        stats.unit_cis(table, cluster, resamples=resamples, seed=seed, confidence=confidence)
        if resamples
        else None
    )
    progressive = (
        progressive_curve(
            arrays,
            attrs,
            resamples=resamples,
            seed=seed,
            confidence=confidence,
            by=by,
            labels=labels,
        )
        if get_protocol(attrs["protocol"]).unit == "sketch"
        else None
    )
    settings = {
        "metrics": list(metrics),
        "ap": ap,
        "resamples": int(resamples),
        "seed": int(seed),
        "by": by,
        "confidence": float(confidence),
        "cmc_max_rank": int(cmc_max_rank),
    }
    return Summary(
        settings=settings,
        ci95=ci95,
        cmc=cmc(arrays, attrs, cmc_max_rank),
        progressive=progressive,
        values=np.ascontiguousarray(table.values, np.float64),
        rows=np.asarray(table.rows, np.int64),
        cluster=np.asarray(cluster, np.int64),
        keyed="unit_key" in arrays,
    )


def write_summary(path: str | os.PathLike, summary: Summary) -> None:
    """Write ``summary`` to ``path`` (``.npz``) atomically: a reader sees the old file or
    the whole new one."""
    path = Path(path)
    meta = {
        "format": _FORMAT,
        "settings": summary.settings,
        "ci95": summary.ci95,
        "cmc": summary.cmc,
        "progressive": summary.progressive,
        "keyed": summary.keyed,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.npz")
    np.savez(
        tmp,
        values=summary.values,
        rows=summary.rows,
        cluster=summary.cluster,
        meta=np.array(json.dumps(meta)),
    )
    os.replace(tmp, path)


def read_summary(path: str | os.PathLike) -> Summary:
    """The summary written by :func:`write_summary`; a file that is not one raises, one of
    an earlier format raises :class:`OldSummary`."""
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if not isinstance(meta.get("format"), int):
                raise ValueError("format")
            if meta["format"] != _FORMAT:
                raise OldSummary(f"{path}: statistics summary of format {meta['format']}")
            return Summary(
                settings=meta["settings"],
                ci95=meta["ci95"],
                cmc=[float(x) for x in meta["cmc"]],
                progressive=meta["progressive"],
                values=np.asarray(data["values"], np.float64),
                rows=np.asarray(data["rows"], np.int64),
                cluster=np.asarray(data["cluster"], np.int64),
                keyed=bool(meta.get("keyed", True)),
            )
    except OSError as exc:
        raise RankwiseError(
            f"{path}: cannot read the statistics summary ({exc.strerror or exc}); "
            "run `rankwise metrics --stats-output` again"
        ) from None
    except OldSummary:
        raise
    except (ValueError, KeyError, TypeError):
        raise RankwiseError(
            f"{path}: not a statistics summary written by this rankwise; "
            "run `rankwise metrics --stats-output` again"
        ) from None


def progressive_curve(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
    by: str = "query",
    labels=None,
) -> dict[str, list]:
    """The target's rank against sketch completion, for a ``progressive`` ranks store.

    A sketch's renderings are ordered by step; rendering t of T is ``100 t / T`` percent
    complete (grouped into tenths when there are more than 20 distinct levels).

    Returns
    -------
    dict of lists, one item per completion level (ascending): ``completion`` (percent),
    ``num_renderings``, ``mean_reciprocal_rank`` (mean ``1 / r_t`` in percent; m@B is
    its average over steps), ``median_rank``, ``ci95`` (bootstrap interval of the
    mean reciprocal rank, sketches resampled, or with ``by="identity"`` targets with all
    their sketches, labels as :func:`rankwise.stats.query_labels` reads them; ``None``
    when ``resamples`` is 0).
    """
    from .metrics import completion_curve, completion_levels, unit_keys
    from .stats import bootstrap_ci, query_labels

    out = completion_curve(arrays)
    levels = completion_levels(arrays)
    if by == "identity" and resamples:
        # each sketch (its completion_levels number) to its target, the label of its
        # renderings (one per sketch)
        group = np.asarray(arrays["group"], np.int64)
        keys = unit_keys(arrays)
        number = group if keys is None else keys[group]
        label = query_labels(attrs, labels)[np.asarray(arrays["query_index"], np.int64)]
        target = dict(zip(number.tolist(), label.tolist(), strict=True))
        levels = [(c, r, np.array([target[s] for s in sketch.tolist()])) for c, r, sketch in levels]
    out["ci95"] = [
        [
            100.0 * x
            for x in bootstrap_ci(
                1.0 / r, clusters=sketch, resamples=resamples, seed=seed, confidence=confidence
            )
        ]
        if resamples
        else None
        for _, r, sketch in levels
    ]
    return out
