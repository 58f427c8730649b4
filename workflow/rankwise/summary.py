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
import io
import json
import os
import zipfile
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import RankwiseError
from .options import DEFAULT_RESAMPLES
from .registry import get_protocol
from .schema import KINDS, Field, problem

#: The settings a summary is computed for; the report uses it only when all are equal.
SETTINGS = ("metrics", "ap", "resamples", "seed", "by", "confidence", "cmc_max_rank")
_FORMAT = 2  # 2: intervals of non-constant columns resampled uncentred (2026-12-02)

#: The ``meta`` of a summary (:func:`write_summary`), checked by :func:`read_summary`.
SUMMARY_META: dict[str, Field] = {
    "settings": Field("object", required=True),
    "settings.metrics": Field("strings", required=True),
    "settings.ap": Field("string", required=True),
    "settings.resamples": Field("count", required=True),
    "settings.seed": Field("count", required=True),
    "settings.by": Field("string", required=True),
    "settings.confidence": Field("number", required=True),
    "settings.cmc_max_rank": Field("count", required=True),
    "ci95": Field("object", required=True, nullable=True, each="interval"),
    "cmc": Field("numbers", required=True, length=("settings.cmc_max_rank", 0)),
    "progressive": Field("object", required=True, nullable=True),
    "progressive.completion": Field("numbers", required=True),
    **{
        f"progressive.{name}": Field(kind, required=True, length=("progressive.completion", 0))
        for name, kind in (
            ("num_renderings", "numbers"),
            ("mean_reciprocal_rank", "numbers"),
            ("median_rank", "numbers"),
            ("ci95", "list"),
        )
    },
    "keyed": Field("boolean"),
}
#: Its arrays: name -> (dtype kinds, number of dimensions).
_SUMMARY_ARRAYS = {"values": ("f", 2), "rows": ("iu", 1), "cluster": ("iu", 1)}


class OldSummary(RankwiseError):
    """A summary of another format, written by an earlier version of :func:`write_summary`
    (its numbers may differ in the last bits) or a later one: the report computes the
    statistics again instead."""


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


def write_summary(path: str | os.PathLike, summary: Summary, files=None) -> None:
    """Write ``summary`` to ``path`` (``.npz``) atomically: a reader sees the old file or
    the whole new one.  ``files``: a :class:`rankwise.store.StagedFiles` to stage it in
    (written by its ``commit()``, with the command's other outputs)."""
    from .store import StagedFiles

    meta = {
        "format": _FORMAT,
        "settings": summary.settings,
        "ci95": summary.ci95,
        "cmc": summary.cmc,
        "progressive": summary.progressive,
        "keyed": summary.keyed,
    }
    buffer = io.BytesIO()
    np.savez(
        buffer,
        values=summary.values,
        rows=summary.rows,
        cluster=summary.cluster,
        meta=np.array(json.dumps(meta)),
    )
    staged = files if files is not None else StagedFiles()
    staged.write(path, buffer.getvalue())  # a link written through, a FIFO streamed
    if files is None:
        staged.commit()


def read_summary(path: str | os.PathLike) -> Summary:
    """The summary written by :func:`write_summary`; a file that is not one (its meta
    checked against :data:`SUMMARY_META`, its arrays against each other) raises, one of
    another format (earlier, or a later rankwise's) raises :class:`OldSummary`."""
    again = "run `rankwise metrics --stats-output` again"
    try:
        with np.load(path, allow_pickle=False) as data:
            names = set(data.files)
            meta = json.loads(str(data["meta"])) if "meta" in names else None
            arrays = {k: np.asarray(data[k]) for k in _SUMMARY_ARRAYS if k in names}
    except OSError as exc:
        raise RankwiseError(
            f"{path}: cannot read the statistics summary ({exc.strerror or exc}); {again}"
        ) from None
    except (ValueError, KeyError, TypeError, AttributeError, EOFError, zipfile.BadZipFile):
        # not an .npz (a text file, one cut short, empty: EOFError), or meta not JSON
        raise RankwiseError(
            f"{path}: not a statistics summary written by this rankwise; {again}"
        ) from None
    version = meta.get("format") if isinstance(meta, dict) else None
    if KINDS["integer"][1](version) and version != _FORMAT:
        raise OldSummary(f"{path}: statistics summary of format {version}")
    found = _summary_problem(meta, arrays)
    if found:
        raise RankwiseError(f"{path}: statistics summary {found}; {again}")
    return Summary(
        settings=meta["settings"],
        ci95=meta["ci95"],
        cmc=[float(x) for x in meta["cmc"]],
        progressive=meta["progressive"],
        values=np.asarray(arrays["values"], np.float64),
        rows=np.asarray(arrays["rows"], np.int64),
        cluster=np.asarray(arrays["cluster"], np.int64),
        keyed=bool(meta.get("keyed", True)),
    )


def _summary_problem(meta: Any, arrays: dict[str, np.ndarray]) -> str | None:
    """What is wrong with a summary (of this format) in words, else ``None``."""
    if meta is None:
        return "array 'meta' is missing"
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        return "'meta' has no integer 'format'"
    found = problem(meta, SUMMARY_META, noun="'meta' key ")
    if found:
        return found
    metrics = meta["settings"]["metrics"]
    if meta["ci95"] is not None and sorted(meta["ci95"]) != sorted(metrics):
        return f"'meta' key 'ci95' names {sorted(meta['ci95'])}, not the metrics {sorted(metrics)}"
    for name, (kinds, ndim) in _SUMMARY_ARRAYS.items():
        if name not in arrays:
            return f"array {name!r} is missing"
        if arrays[name].dtype.kind not in kinds or arrays[name].ndim != ndim:
            return f"array {name!r} holds {arrays[name].dtype} {arrays[name].shape}"
    units = len(arrays["values"])
    if arrays["values"].shape[1] != len(metrics):
        return (
            f"array 'values' has {arrays['values'].shape[1]} columns for the "
            f"{len(metrics)} metrics of 'settings.metrics'"
        )
    for name in ("rows", "cluster"):
        if len(arrays[name]) != units:
            return f"array {name!r} has {len(arrays[name])} rows for the {units} of 'values'"
    return None


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
