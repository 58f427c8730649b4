"""Uncertainty of the metrics: bootstrap intervals, paired tests, Holm.

Every metric (README: "What the numbers mean") is a mean of per-*unit* values, a
unit being an evaluated query (a sketch for ``progressive``), read from
:func:`rankwise.metrics.per_unit`:

=============================  =================================================
``recall@K`` / ``rankK``       ``hit@K = [r_1 <= K]``
``map`` / ``minp`` / ``mrr``   AP, ``INP = G / r_G``, ``RR = 1 / r_1``
``m@A`` ... ``wm@B``           the sketch's m@A ... wm@B
``acc@K``                      ``[r_T <= K]`` of the sketch's complete rendering
``precision@K``                ``#{i : r_i <= K} / K``
``r_precision`` / ``map@r``    ``#{i : r_i <= G} / G``, ``(1/G) sum_{r_i <= G} i / r_i``
=============================  =================================================

so its uncertainty comes from resampling units; this module only resamples
``(n_units, n_metrics)`` matrices of those values.  Units are grouped into *clusters*
that are resampled (or sign-flipped) as wholes: with ``by="query"`` every unit is
its own cluster; with ``by="identity"`` a cluster is all the units of one label
(one person in ``reid``: its queries are not independent; one track, i.e. sequence
and label, in ``reassociation``; a sketch's target in ``progressive``).  Clusters
are numbered in sorted label order; units are taken in the order of their query ids
(:meth:`rankwise.metrics.UnitTable.in_key_order`; a store written before unit keys: in
store order), so the same rows in another manifest order give the same numbers at the
same seed.  With cluster sums ``S_c`` and sizes ``n_c``:

- **Bootstrap** (Efron & Tibshirani, 1993): draw ``C`` clusters with replacement,
  ``B`` times; the resampled metric is ``sum S_c / sum n_c`` over the drawn
  clusters (the plain mean when clusters are single units; the ratio estimator of
  the cluster bootstrap otherwise).  The interval is the percentile interval
  (default 95%: the 2.5th and 97.5th percentiles, numpy's linear interpolation).
- **Paired randomisation test** of two encoders on the same units: per-unit
  differences ``d = b - a`` and their cluster sums ``D_c``.  Under H0 (the two
  encoders are exchangeable on each cluster) every sign flip of the ``D_c`` is as
  likely; the statistic is ``|sum_c s_c D_c|``.  Monte Carlo:
  ``p = (k + 1) / (B + 1)``, ``k`` the number of ``B`` random flips whose statistic
  is ``>=`` the observed one (Phipson & Smyth, 2010).  With ``C <= exact_max``
  clusters all ``2^C`` flips are enumerated and ``p`` is the fraction of them
  (identity included) at or above the observed statistic.
- **Holm** (1979) step-down adjustment across every test shown together.

Reproducibility: the randomness is a numpy ``Generator`` (PCG64) seeded from
``SeedSequence(seed).spawn(2)``: child 0 draws the bootstrap resamples
(``rng.integers(0, C, size=C)`` per resample, drawn in blocks of consecutive
resamples, which gives the same numbers), child 1 the sign flips
(``rng.random(C) < 0.5`` per resample: flipped).  The bootstrap's sums are numpy
reductions on one thread, never BLAS: the same seed gives the same intervals on every
machine, thread count and block size.  The flipped sums are one BLAS product per block
of flips, whose rounding lies far inside the tests' tie tolerance (1e-9 of the sums,
:func:`_count_at_or_above`): the p-values are as reproducible but for a flipped sum
within ~1e-16 of that tolerance's edge.  The resampled clusters depend only on the
seed and ``C``, so for one seed every metric and both encoders of a comparison see
the same resamples (the paired bootstrap).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .errors import RankwiseError
from .metrics import (
    UnitTable,
    canonical_metric,
    mean,
    metric_names,
    parse_ks,
    per_unit,
)
from .options import AP, KS, spelled
from .registry import get_protocol

BY = ("query", "identity")
#: Bootstrap resamples (and random sign flips) of every function, command and report
#: unless told otherwise (papers use 10,000; one default, so one store gives one interval).
from .options import DEFAULT_RESAMPLES, MAX_RESAMPLES  # noqa: E402  (declared with the specs)

#: Up to this many clusters the sign-flip test enumerates all 2^C flips (exact p-value).
EXACT_MAX = 16
#: A difference is significant when its Holm-adjusted p-value is below this (the report).
ALPHA = 0.05
#: Elements per block of resamples (block rows x clusters); bounds memory only.
_BLOCK_ELEMENTS = 1 << 20
#: Statistics within this fraction of sum |D_c| of the observed one count as ties.
_REL_TOL = 1e-9


# ---------------------------------------------------------------- validation


def _check_options(resamples: int, seed: int, confidence: float, by: str) -> None:
    """The option specs' checks; messages name the parameter (the CLI names the flag)."""
    from . import options

    options.RESAMPLES.check(resamples)
    options.SEED.check(seed)
    options.CONFIDENCE.check(confidence)
    options.BY.check(by)


def ci_key(confidence: float = 0.95) -> str:
    """JSON key of an interval: ``"ci95"`` for 0.95, ``"ci99"``, ``"ci99.9"``..."""
    return f"ci{100 * confidence:.10g}"


def coarse_interval(resamples: int, confidence: float) -> str | None:
    """Why ``resamples`` resamples give no ``confidence`` percentile interval, or None.

    Each tail holds ``resamples * (1 - confidence) / 2`` resamples; below one, both
    ends are interpolated between the two most extreme resamples (numpy's linear
    quantile): an interval that only looks narrow.  Needs ``resamples >= 2 / (1 -
    confidence)`` (40 at 95 %)."""
    tail = resamples * (1.0 - confidence) / 2.0
    if tail >= 1.0 - 1e-9:  # 20 * (1 - 0.9) / 2 is 0.9999999999999998
        return None
    need = int(np.ceil(2.0 / (1.0 - confidence) - 1e-9))
    fix = (
        f"use at least {need:,} (the default is {DEFAULT_RESAMPLES:,})"
        if need <= MAX_RESAMPLES
        else f"no allowed number is enough (at most {MAX_RESAMPLES:,}): lower the confidence"
    )
    noun = "resample is" if resamples == 1 else "resamples are"
    return (
        f"{resamples:,} {noun} too few for {100 * confidence:.10g}% intervals (each "
        f"{100 * (1 - confidence) / 2:.3g}% tail holds {tail:.4g} of a resample): their ends "
        f"are the most extreme resamples; {fix}"
    )


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    """(bootstrap generator, sign-flip generator) of ``seed``."""
    boot, flip = np.random.SeedSequence(int(seed)).spawn(2)
    return np.random.default_rng(boot), np.random.default_rng(flip)


# ---------------------------------------------------------------- per-unit values


def unit_table(
    arrays: dict[str, np.ndarray], attrs: dict, metrics: Sequence[str], ap: str
) -> UnitTable:
    """:func:`rankwise.metrics.per_unit`, refusing a store with nothing to resample."""
    AP.check(ap)
    if len(arrays["query_index"]) == 0:
        raise RankwiseError(
            "the ranks store has no evaluated query; there is nothing to "
            "resample (check the manifests and the protocol)"
        )
    return per_unit(arrays, attrs, metrics, ap=ap).in_key_order(arrays)


def align_units(rows_b: np.ndarray, rows_a: np.ndarray) -> np.ndarray | None:
    """The permutation ``p`` with ``rows_b[p] == rows_a`` (B's units in A's order: the
    same units, by query manifest row, listed in another order -- a store written before
    unit keys lists them in store order), or ``None`` when the units differ."""
    rows_a, rows_b = np.asarray(rows_a), np.asarray(rows_b)
    if rows_a.shape != rows_b.shape:
        return None
    if np.array_equal(rows_a, rows_b):
        return np.arange(len(rows_a))
    order_a, order_b = np.argsort(rows_a, kind="stable"), np.argsort(rows_b, kind="stable")
    if not np.array_equal(rows_a[order_a], rows_b[order_b]):
        return None
    perm = np.empty(len(rows_a), np.int64)
    perm[order_a] = order_b
    return perm


def resolve_metrics(
    protocol: str, metrics: str | Iterable[str] | None, ks: Iterable[int] | str = KS.default
) -> list[str]:
    """The metric names to compare: ``metrics`` (``"map,rank1"`` or a list), else all
    the protocol's metrics for ``ks``; unknown names raise, listing the valid ones."""
    if metrics is None:
        return metric_names(protocol, parse_ks(ks))
    names = metrics.split(",") if isinstance(metrics, str) else list(metrics)
    names = [str(n).strip() for n in names if str(n).strip()]
    if not names:
        raise RankwiseError(
            f"{spelled('metrics')} is empty; give names such as "
            f"{','.join(metric_names(protocol, (1,)))}"
        )
    # recall@01 is recall@1: listed (and counted in Holm's family) once
    return list(dict.fromkeys(canonical_metric(name, protocol) for name in names))


# ---------------------------------------------------------------- labels and clusters


def query_labels(attrs: dict, labels=None) -> np.ndarray:
    """Identity of every query manifest row, as strings.

    ``labels``: ``None`` (read the query manifest named in ``attrs["query_manifest"]``,
    as written by ``rankwise rank``), a manifest path, DataFrame or Table, or a sequence with
    one label per query manifest row.  A manifest is read as it was evaluated
    (:func:`rankwise.inputs.read_evaluated_manifest`: without the rows an id-keyed
    store dropped).  When the protocol's queries have a ``sequence``
    column (``reassociation``), a manifest gives ``sequence/label`` (a track): labels
    are reused across sequences.
    """
    from .inputs import read_evaluated_manifest
    from .store import named_path, ranked_embeddings, ranked_manifest
    from .table import Table, is_dataframe

    protocol = attrs.get("protocol", "recall")
    if labels is None:
        path = attrs.get("query_manifest")
        if path:
            # the ranked one where it is found (a project moved: from here), else the
            # first file there, which the checks below refuse
            path = ranked_manifest(attrs, "query") or named_path(attrs, path)
        if not path:
            raise RankwiseError(
                "by='identity' needs the query labels: this ranks store does "
                "not name its query manifest; pass labels= (on the command line: "
                "--labels QUERY.csv)"
            )
        if not os.path.isfile(path):
            raise RankwiseError(
                f"{path}: query manifest named by the ranks store not found "
                "(paths are relative to where `rankwise rank` ran); pass "
                "--labels QUERY.csv"
            )
        labels = path
    # where the embeddings ranked are found (from another folder too), else as named
    store = ranked_embeddings(attrs, "query") or (attrs.get("query_embeddings") or {}).get("path")
    aligned = (attrs.get("query_embeddings") or {}).get("id_alignment") or {}
    if isinstance(labels, (str, os.PathLike, Table)) or is_dataframe(labels):
        if aligned.get("dropped_rows") and not (store and os.path.isdir(store)):
            raise RankwiseError(
                f"{store}: query embeddings not found; their manifest rows were dropped "
                "(on_missing: drop) and only the store says which, so the manifest's labels "
                "cannot be matched to the ranks: restore the store"
            )
        expected = attrs.get("query_manifest_sha256")
        if isinstance(labels, (str, os.PathLike)) and expected and os.path.isfile(labels):
            from .hashing import file_sha256

            # rows are matched by position: a re-sorted or edited manifest of as many rows
            # would cluster the queries by other labels, silently
            found = file_sha256(labels)
            if found != expected:
                raise RankwiseError(
                    f"{labels}: not the query manifest the ranks were computed from (its "
                    f"sha256 {found[:12]} differs from the ranks store's "
                    f"{str(expected)[:12]}: edited, re-sorted or another file); pass that "
                    "manifest (--labels QUERY.csv) or rank again"
                )
        table = read_evaluated_manifest(labels, store, protocol=protocol, role="query")
        out = table["label"]
        if "sequence" in get_protocol(protocol).required_columns("query"):
            # "/" and "\\" escaped in each part: sequence "a/b" label "c" is not sequence
            # "a" label "b/c" (names without them read as before: the same clusters)
            def escaped(value: str) -> str:
                return value.replace("\\", "\\\\").replace("/", "\\/")

            out = np.array(
                [
                    escaped(s) + "/" + escaped(lab)
                    for s, lab in zip(table["sequence"], table["label"], strict=True)
                ],
                dtype=object,
            )
        _check_label_count(out, attrs, f"{labels if isinstance(labels, str) else 'labels'}")
        return out
    out = np.asarray(labels)
    if out.ndim != 1:
        raise RankwiseError(
            f"labels must be one label per query manifest row, got an array of shape {out.shape}"
        )
    if aligned.get("dropped_rows") and len(out) != aligned.get("kept_rows"):
        raise RankwiseError(
            f"labels: {len(out)} labels, but the query embeddings hold {aligned.get('kept_rows')} "
            f"of the manifest's {aligned.get('manifest_rows')} rows (on_missing: drop); give "
            "one label per evaluated row, or pass the query manifest (--labels QUERY.csv)"
        )
    _check_label_count(out, attrs, "labels")
    return out.astype(str)


def _check_label_count(labels: np.ndarray, attrs: dict, name: str) -> None:
    """One label per query row that was ranked (the query embeddings' rows, as the ranks
    store records them): another manifest (the gallery's, another split) is refused
    rather than clustering the queries by the wrong labels."""
    expected = attrs.get("num_query_rows", (attrs.get("query_embeddings") or {}).get("num_rows"))
    if expected is not None and len(labels) != int(expected):
        raise RankwiseError(
            f"{name}: {len(labels)} rows, but the ranks store's queries came from "
            f"{int(expected)} query rows; give the query manifest the ranks were computed "
            "from (--labels QUERY.csv)"
        )


def _clusters(rows: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
    """Cluster number ``(n_units,)`` of every unit: its own (labels None) or its label's."""
    if labels is None:
        return np.arange(len(rows), dtype=np.int64)
    if len(rows) and rows.max() >= len(labels):
        raise RankwiseError(
            f"labels: {len(labels)} labels, but the ranks store has query "
            f"manifest row {int(rows.max())}; give one label per query "
            "manifest row (the manifest given to `rankwise rank`)"
        )
    _, cluster = np.unique(labels[rows], return_inverse=True)
    return cluster.astype(np.int64)


def _cluster_sums(values: np.ndarray, cluster: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums ``(C, m)`` and sizes ``(C,)`` (sequential, deterministic sums)."""
    order = np.argsort(cluster, kind="stable")
    sorted_c = cluster[order]
    starts = np.flatnonzero(np.r_[True, sorted_c[1:] != sorted_c[:-1]])
    sums = np.add.reduceat(values[order], starts, axis=0) if len(order) else values[:0]
    sizes = np.diff(np.r_[starts, len(order)]).astype(np.float64)
    return sums, sizes


# ---------------------------------------------------------------- bootstrap


def _blocks(resamples: int, n_clusters: int) -> Iterable[int]:
    """Rows (resamples) per block: a function of the sizes only."""
    rows = max(1, _BLOCK_ELEMENTS // max(n_clusters, 1))
    for start in range(0, resamples, rows):
        yield min(rows, resamples - start)


def _bootstrap_means(
    sums: np.ndarray, sizes: np.ndarray, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Resampled means ``(resamples, m)`` of the cluster bootstrap (see module doc)."""
    n_clusters = len(sizes)
    columns = np.ascontiguousarray(sums.T)
    unit = bool(np.all(sizes == 1))
    out = np.empty((resamples, sums.shape[1]))
    done = 0
    for rows in _blocks(resamples, n_clusters):
        idx = rng.integers(0, n_clusters, size=(rows, n_clusters))
        total = float(n_clusters) if unit else sizes[idx].sum(axis=1)
        for j, column in enumerate(columns):
            out[done : done + rows, j] = column[idx].sum(axis=1) / total
        done += rows
    return out


def _resampled_means(
    values: np.ndarray, cluster: np.ndarray, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """:func:`_bootstrap_means` of per-unit ``values`` ``(n_units, m)``.  A constant
    column is centred on its value (:func:`rankwise.metrics.mean`; the resamples of the
    deviations, all 0, are added to it), so it resamples to exactly that value and its
    interval holds the point (uncentred, the sums' rounding put a constant metric's
    interval an ulp below it).  Any other column is resampled as it is: a resample of
    zeros (queries a paired difference leaves unchanged) is exactly 0 and sums of 0/1
    hits are exact (centred, they came out as +-1e-17: an interval "[-0.30, -0.00]")."""
    constant = (values == values[:1]).all(axis=0)
    centre = np.array(
        [mean(column) if same else 0.0 for column, same in zip(values.T, constant, strict=True)]
    )
    sums, sizes = _cluster_sums(values - centre, cluster)
    return centre + _bootstrap_means(sums, sizes, resamples, rng)


def _units(values, clusters, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``values`` as a finite non-empty 1-D float64 array and the cluster index of each
    (0..C-1; every unit its own cluster when ``clusters`` is None).  A NaN would make
    every comparison false (a sign-flip p of 0), labels of another length would pair
    the wrong units: both are refused."""
    values = np.asarray(values, np.float64)
    if values.ndim != 1 or len(values) == 0:
        raise RankwiseError(f"{name} must be a non-empty 1-D array, got shape {values.shape}")
    if not np.isfinite(values).all():
        i = int(np.flatnonzero(~np.isfinite(values))[0])
        raise RankwiseError(f"{name}[{i}] is {values[i]}; every value must be a finite number")
    if clusters is None:
        return values, np.arange(len(values))
    clusters = np.asarray(clusters)
    if clusters.shape != values.shape:
        raise RankwiseError(
            f"clusters must have one entry per value: shape {clusters.shape} vs {values.shape}"
        )
    return values, np.unique(clusters, return_inverse=True)[1]


def _percentile_interval(boot: np.ndarray, confidence: float) -> np.ndarray:
    """``(2, m)``: the ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles."""
    alpha = 1.0 - confidence
    return np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=0)


def bootstrap_ci(
    values,
    *,
    clusters=None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[float]:
    """Percentile bootstrap interval of the mean of per-unit ``values``.

    Parameters
    ----------
    values : array ``(n_units,)``, e.g. a column of :func:`rankwise.metrics.per_unit` (the
        interval is in the same units: multiply fractions by 100 for percentages).
    clusters : optional array ``(n_units,)`` of cluster labels (e.g. person ids):
        resample whole clusters (cluster bootstrap).  Default: every unit alone.
    resamples, seed : number of bootstrap resamples, seed of the generator.
    confidence : coverage of the interval (0.95: 2.5th-97.5th percentiles).

    Returns
    -------
    ``[low, high]``
    """
    _check_options(resamples, seed, confidence, "query")
    values, cluster = _units(values, clusters, "values")
    boot = _resampled_means(values[:, None], cluster, resamples, _streams(seed)[0])
    low, high = _percentile_interval(boot, confidence)[:, 0]
    return [float(low), float(high)]


def metric_cis(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    ks: Iterable[int] | str = KS.default,
    metrics=None,
    ap: str = "standard",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    by: str = "query",
    labels=None,
    confidence: float = 0.95,
) -> dict[str, list[float]]:
    """Bootstrap interval of every metric of a ranks store, in percent.

    Parameters
    ----------
    arrays, attrs : a ranks store (:func:`rankwise.store.read_ranks`).
    ks, metrics : the metrics (default: all of the protocol's for ``ks``).
    ap : AP variant.
    resamples, seed, confidence : see :func:`bootstrap_ci`.
    by : ``"query"`` (resample queries; sketches for progressive) or ``"identity"``
        (resample labels with all their queries).
    labels : for ``by="identity"``: see :func:`query_labels`.

    Returns
    -------
    ``{metric: [low, high]}`` (percentages), in metric order.
    """
    _check_options(resamples, seed, confidence, by)
    names = resolve_metrics(attrs["protocol"], metrics, ks)
    table = unit_table(arrays, attrs, names, ap)
    cluster = clusters_of(table.rows, attrs, by=by, labels=labels)
    return unit_cis(table, cluster, resamples=resamples, seed=seed, confidence=confidence)


def clusters_of(rows: np.ndarray, attrs: dict, *, by: str = "query", labels=None) -> np.ndarray:
    """Cluster number of every unit (query manifest rows ``rows``) for ``by``."""
    if labels is not None and by != "identity":
        # silently resampling by query would look like the identity-level answer
        raise RankwiseError(
            "labels (--labels) cluster the queries only with by='identity' (--by identity); "
            "add it, or leave the labels out"
        )
    return _clusters(rows, query_labels(attrs, labels) if by == "identity" else None)


def unit_cis(
    table: UnitTable,
    cluster: np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, list[float]]:
    """``{metric: [low, high]}`` (percent): the cluster bootstrap interval of every
    column of a per-unit table (:func:`metric_cis` from the table itself)."""
    boot = _resampled_means(table.values, cluster, resamples, _streams(seed)[0])
    bounds = 100.0 * _percentile_interval(boot, confidence)
    return {name: [float(bounds[0, j]), float(bounds[1, j])] for j, name in enumerate(table.names)}


# ---------------------------------------------------------------- paired test


def _observed(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Observed statistic ``|sum_c D_c|`` per column and the tie tolerance."""
    return np.abs(sums.sum(axis=0)), _REL_TOL * np.abs(sums).sum(axis=0)


def _count_at_or_above(flip: np.ndarray, columns: np.ndarray, observed, tol) -> np.ndarray:
    """Per column: how many rows of sign flips ``flip`` (bool, ``True``: flipped) reach
    the observed statistic (:func:`_signs_at_or_above` of their signs)."""
    return _signs_at_or_above(np.where(flip, -1.0, 1.0), columns, observed, tol)


def _signs_at_or_above(signs: np.ndarray, columns: np.ndarray, observed, tol) -> np.ndarray:
    """Per column: how many rows of signs ``(rows, C)`` (``-1.0``: flipped, ``1.0``)
    reach the observed statistic.

    Every flipped sum at once, ``signs @ sums`` (one BLAS product; the columns are the
    cluster sums ``(m, C)``).  Its rounding differs from a sequential sum by far less
    than the tie tolerance ``tol`` (1e-9 of the absolute sums), so a count changes only
    for a statistic within ~1e-16 relative of ``observed - tol``.
    """
    flipped = signs @ columns.T  # (rows, m)
    return np.count_nonzero(np.abs(flipped) >= observed - tol, axis=0).astype(np.int64)


def _flip_signs(rng: np.random.Generator, rows: int, n_clusters: int) -> np.ndarray:
    """The next ``rows`` flips of the stream as signs ``(rows, C)``: ``-1.0`` where
    ``rng.random() < 0.5``, else ``1.0``; the array ``np.where(rng.random((rows, C)) <
    0.5, -1.0, 1.0)``, made in place in an eighth of the time: ``u - 0.5`` is exact in
    sign, negative exactly when ``u < 0.5``, and ``+0.0`` (never ``-0.0``) at ``0.5``."""
    u = rng.random((rows, n_clusters))
    np.subtract(u, 0.5, out=u)
    return np.copysign(1.0, u, out=u)


def flip_hits(sums: np.ndarray, seed: int, start: int, stop: int) -> np.ndarray:
    """Random sign flips number ``start .. stop - 1`` of ``seed``'s flip stream that
    reach the observed statistic, per column of the cluster sums ``(C, m)``.

    The flip stream is one PCG64 sequence (``rng.random(C) < 0.5`` per flip), so the
    hits of ``0 .. n'`` are the hits of ``0 .. n`` plus those of ``n .. n'``: a cached
    test is extended to more flips without redoing the first ``n`` (the generator is
    advanced past them), and the p-value equals the one computed from scratch.
    """
    return flip_hits_many([sums], seed, start, stop)[0]


def flip_hits_many(
    tables: Sequence[np.ndarray], seed: int, start: int, stop: int
) -> list[np.ndarray]:
    """:func:`flip_hits` of several tables of cluster sums ``(C, m_i)`` with the same
    number of clusters ``C`` (the paired tests of one dataset), the flips drawn once
    for all of them: each table's hits are those :func:`flip_hits` gives it alone, bit
    for bit (each block of flips is multiplied by each table as it would be alone)."""
    if not tables:
        return []
    n_clusters = tables[0].shape[0]
    if any(t.shape[0] != n_clusters for t in tables):
        raise RankwiseError(
            f"tables must have the same number of clusters (rows), got "
            f"{sorted({t.shape[0] for t in tables})}"
        )
    tests = [(np.ascontiguousarray(t.T), *_observed(t)) for t in tables]
    rng = _streams(seed)[1]
    bits: Any = rng.bit_generator  # PCG64 (_streams): it has advance()
    bits.advance(int(start) * n_clusters)  # one 64-bit draw per double
    hits = [np.zeros(t.shape[1], np.int64) for t in tables]
    for rows in _blocks(max(0, int(stop) - int(start)), n_clusters):
        signs = _flip_signs(rng, rows, n_clusters)
        for total, (columns, observed, tol) in zip(hits, tests, strict=True):
            total += _signs_at_or_above(signs, columns, observed, tol)
    return hits


def exact_pvalues(sums: np.ndarray) -> np.ndarray:
    """Exact two-sided sign-flip p-values: all ``2^C`` flips enumerated (identity included)."""
    n_clusters, m = sums.shape
    observed, tol = _observed(sums)
    columns = np.ascontiguousarray(sums.T)
    hits = np.zeros(m, np.int64)
    total = 1 << n_clusters
    for start in range(0, total, 1 << 16):
        codes = np.arange(start, min(total, start + (1 << 16)))
        flip = ((codes[:, None] >> np.arange(n_clusters)) & 1).astype(bool)
        hits += _count_at_or_above(flip, columns, observed, tol)
    return hits / float(total)


def monte_carlo_pvalues(hits: np.ndarray, flips: int) -> np.ndarray:
    """``p = (k + 1) / (B + 1)`` (Phipson & Smyth, 2010)."""
    return (np.asarray(hits) + 1.0) / (flips + 1.0)


def _flip_pvalues(
    sums: np.ndarray, resamples: int, seed: int, exact_max: int
) -> tuple[np.ndarray, str]:
    """Two-sided sign-flip p-value of every column of cluster sums ``(C, m)``."""
    if sums.shape[0] <= exact_max:
        return exact_pvalues(sums), "exact"
    return monte_carlo_pvalues(flip_hits(sums, seed, 0, resamples), resamples), "sign-flip"


def sign_flip_test(
    differences,
    *,
    clusters=None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    exact_max: int = EXACT_MAX,
) -> float:
    """Two-sided paired randomisation test of ``mean(differences) = 0``.

    Parameters
    ----------
    differences : array ``(n_units,)`` of per-unit differences ``b - a``.
    clusters : optional ``(n_units,)`` cluster labels: flip whole clusters.
    resamples, seed : Monte Carlo sign flips; ``p = (k + 1) / (resamples + 1)``.
    exact_max : with at most this many clusters, enumerate all ``2^C`` flips (exact p).

    Returns
    -------
    the p-value (float in (0, 1]).
    """
    _check_options(resamples, seed, 0.95, "query")
    d, cluster = _units(differences, clusters, "differences")
    sums, _ = _cluster_sums(d[:, None], cluster)
    p, _ = _flip_pvalues(sums, resamples, seed, _check_exact(exact_max))
    return float(p[0])


def _check_exact(exact_max: int) -> int:
    from . import options

    return int(options.EXACT_MAX.check(exact_max))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the input order.

    With ``p_(1) <= ... <= p_(m)``: ``p_holm_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
    """
    p = np.asarray(list(pvalues), np.float64)
    if p.size == 0:
        return []
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise RankwiseError(f"p-values must be numbers in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    m = len(p)
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in adjusted]


def with_holm(rows: Sequence[dict]) -> list[dict]:
    """Copies of comparison rows with ``p_holm`` recomputed across all of them."""
    adjusted = holm([row["p_value"] for row in rows])
    return [{**row, "p_holm": q} for row, q in zip(rows, adjusted, strict=True)]


def _check_pair(arrays_a, attrs_a, arrays_b, attrs_b, names) -> None:
    def side(arrays, attrs) -> dict[str, Any]:
        units = [arrays["query_index"]]
        if get_protocol(attrs["protocol"]).unit == "sketch":
            units += [arrays["group"], arrays["step"]]
        keys: tuple[str, ...] = ("protocol", "num_gallery", "protocol_options")
        keys += ("query_manifest_sha256", "gallery_manifest_sha256")  # `rankwise rank`'s
        # query_index counts the rows an id-keyed store kept: equal indices of two stores
        # that kept different rows are other queries
        rows = {
            f"{role}_rows": kept_rows((attrs.get(f"{role}_embeddings") or {}).get("id_alignment"))
            for role in ("query", "gallery")
        }
        return {**{k: attrs[k] for k in keys if k in attrs}, **rows, "units": units}

    check_pairable(side(arrays_a, attrs_a), side(arrays_b, attrs_b), names)


def kept_rows(record: dict | None) -> str | None:
    """Which manifest rows an embedding store holds, from its ``id_alignment`` record
    (:meth:`rankwise.feature_ids.Alignment.record`): ``None`` for all of them, else the
    sha256 of the kept rows (``"unknown"`` for a store written before rankwise recorded
    it).  Two stores rank the same items only when these are equal and not ``"unknown"``."""
    if not record or not record.get("dropped_rows"):
        return None
    return record.get("kept_rows_sha256") or "unknown"


def same_rows(rows_a: str | None, rows_b: str | None) -> bool:
    """Whether two :func:`kept_rows` values name the same manifest rows (not when either
    store does not record which rows it kept)."""
    return rows_a == rows_b and rows_a != "unknown"


def _rows_differ(role: str, rows_a: str | None, rows_b: str | None, names: tuple[str, str]) -> str:
    """Why two evaluations' ``role`` (query or gallery) items differ (:func:`kept_rows`)."""
    if "unknown" in (rows_a, rows_b):
        old = names[0] if rows_a == "unknown" else names[1]
        return (
            f"which {role} rows {old}'s id-keyed features lacked (on_missing: drop) is not "
            "recorded (a store encoded before rankwise recorded it): encode it again"
        )
    if rows_a is None:  # A kept every row
        return f"its id-keyed features lack {role} rows that {names[0]} has (on_missing: drop)"
    if rows_b is None:
        return f"it has {role} rows that {names[0]}'s id-keyed features lack (on_missing: drop)"
    return (
        "its id-keyed features and those of "
        f"{names[0]} lack different {role} rows (on_missing: drop)"
    )


def check_pairable(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> None:
    """Whether two evaluations can be compared pair by pair, else one line naming B.

    ``a``, ``b``: ``protocol``; optionally ``num_gallery`` and ``protocol_options``
    (compared when both have them; re-ranking aside, :func:`ranked_set`);
    ``query_rows`` and ``gallery_rows``, which rows an id-keyed store kept
    (:func:`kept_rows`; missing: all); ``units``, arrays that must be equal (the evaluated
    queries' manifest rows first)."""
    name_a, name_b = names
    if a["protocol"] != b["protocol"]:
        raise RankwiseError(
            f"{name_b}: protocol {b['protocol']!r} differs from {name_a}'s "
            f"{a['protocol']!r}; compare stores of the same protocol"
        )
    for key in ("num_gallery", "protocol_options"):
        if (
            key in a
            and key in b
            and _canonical(ranked_set(key, a[key])) != _canonical(ranked_set(key, b[key]))
        ):
            raise RankwiseError(
                f"{name_b}: {key} {b[key]!r} differs from {name_a}'s "
                f"{a[key]!r}; compare encoders on the same dataset "
                "and protocol options"
            )
    for role in ("gallery", "query"):
        rows_a, rows_b = a.get(f"{role}_rows"), b.get(f"{role}_rows")
        if not same_rows(rows_a, rows_b):  # None and None when neither dropped any
            raise RankwiseError(
                f"{name_b}: {_rows_differ(role, rows_a, rows_b, names)}; a paired "
                f"comparison needs both ranked on the same {role} items"
            )
    for side in ("query", "gallery"):
        key = f"{side}_manifest_sha256"
        if key in a and key in b and a[key] != b[key]:
            raise RankwiseError(
                f"{name_b}: ranked on another {side} manifest than {name_a} (sha256 "
                f"{b[key][:12]} vs {a[key][:12]}); a paired comparison needs both ranked on "
                "the same query and gallery manifests"
            )
    ua, ub = a["units"], b["units"]
    same = len(ua) == len(ub) and all(
        np.asarray(x).shape == np.asarray(y).shape and np.array_equal(x, y)
        for x, y in zip(ua, ub, strict=True)
    )
    if not same:
        raise RankwiseError(
            f"{name_b}: its evaluated queries (query_index, {len(ub[0])} queries) "
            f"differ from {name_a}'s ({len(ua[0])}); a paired comparison needs "
            "both ranked on the same query and gallery manifests"
        )


#: Protocol options that change the distance, not who is ranked against whom.
DISTANCE_ONLY_OPTIONS = ("rerank", "aqe", "drop_junk")


def ranked_set(key: str, value):
    """What must agree between two paired stores: re-ranking and query expansion change
    the distance, not who is ranked, so their stores pair with a plain one ("+RK", "+AQE",
    "+RK+AQE" against the same encoder); so does ``drop_junk`` (junk rows are never
    ranked)."""
    if key == "protocol_options" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in DISTANCE_ONLY_OPTIONS}
    return value


def _canonical(value) -> str:
    """Attribute as stored (tuples and lists, numpy and Python numbers compare equal)."""
    return json.dumps(value, sort_keys=True, default=lambda v: getattr(v, "tolist", str)(v))


def compare_ranks(
    arrays_a: dict[str, np.ndarray],
    attrs_a: dict,
    arrays_b: dict[str, np.ndarray],
    attrs_b: dict,
    *,
    ks: Iterable[int] | str = KS.default,
    metrics=None,
    ap: str = "standard",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    by: str = "query",
    labels=None,
    confidence: float = 0.95,
    exact_max: int = EXACT_MAX,
    dataset: str | None = None,
    names: tuple[str, str] = ("A", "B"),
    flips: int | None = None,
) -> list[dict[str, Any]]:
    """Paired comparison of encoder B against encoder A on the same queries.

    Parameters
    ----------
    arrays_a, attrs_a, arrays_b, attrs_b : two ranks stores of the same protocol,
        query and gallery manifests (checked: the evaluated ``query_index`` must be
        equal; otherwise a :class:`RankwiseError`).
    ks, metrics, ap, resamples, seed, by, labels, confidence : see :func:`metric_cis`
        (labels default to A's query manifest).
    exact_max : enumerate all sign flips when there are at most this many clusters.
    dataset, names : copied into the rows (``dataset``, ``encoder_a``, ``encoder_b``).
    flips : random sign flips of the test (default: ``resamples``); the bootstrap
        interval of the difference always uses ``resamples``.

    Returns
    -------
    one dict per metric: ``dataset``, ``encoder_a``, ``encoder_b``, ``metric``, ``a``,
    ``b`` (percentages), ``diff`` (``b - a``, percentage points), ``ci95`` (paired
    bootstrap interval of ``diff``; key :func:`ci_key` of ``confidence``),
    ``p_value`` (sign-flip test), ``p_holm`` (Holm across these rows; use
    :func:`with_holm` to adjust across several comparisons), ``test`` (``"exact"`` or
    ``"sign-flip"``), ``by``, ``num_units``, ``num_clusters``.
    """
    _check_options(resamples, seed, confidence, by)
    exact_max = _check_exact(exact_max)
    flips = resamples if flips is None else _check_flips(flips)
    _check_pair(arrays_a, attrs_a, arrays_b, attrs_b, names)
    stores: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = (
        (arrays_a, attrs_a),
        (arrays_b, attrs_b),
    )
    if any("unit_key" not in arrays for arrays, _ in stores):
        # a store written before unit keys numbers its units in store order: the pair
        # takes that order whichever side it is on (the numbers of two such stores)
        stores = tuple(
            ({k: v for k, v in arrays.items() if k != "unit_key"}, attrs)
            for arrays, attrs in stores
        )
    metric_list = resolve_metrics(attrs_a["protocol"], metrics, ks)
    table_a, table_b = (unit_table(*store, metric_list, ap) for store in stores)
    # the same units (checked above), in the same order (both by unit key, or both in
    # store order)
    perm = align_units(table_b.rows, table_a.rows)
    assert perm is not None
    va, vb = table_a.values, table_b.values[perm]
    rows = table_a.rows
    cluster = clusters_of(rows, attrs_a, by=by, labels=labels)
    estimates = paired_estimates(
        va, vb, cluster, resamples=resamples, seed=seed, confidence=confidence
    )
    sums = paired_sums(va, vb, cluster)
    if len(sums) <= exact_max:
        pvalues, test = exact_pvalues(sums), "exact"
    else:
        pvalues, test = monte_carlo_pvalues(flip_hits(sums, seed, 0, flips), flips), "sign-flip"
    return comparison_rows(
        estimates,
        metric_list,
        pvalues,
        test,
        by=by,
        confidence=confidence,
        dataset=dataset,
        names=names,
    )


def smallest_p(test: str, num_clusters: int, flips: int) -> float:
    """The smallest p-value a sign-flip test can give: ``2^(1 - C)`` when all ``2^C``
    flips of its C clusters are enumerated (``test == "exact"``: the observed signs and
    their mirror image always count), ``1 / (flips + 1)`` with random flips."""
    if test == "exact":
        return 2.0 ** (1 - num_clusters)
    return 1.0 / (flips + 1)


def never_significant(
    test: str,
    num_clusters: int,
    flips: int,
    num_tests: int,
    *,
    by: str,
    units: str,
    alpha: float = ALPHA,
    smallest_in_all: float | None = None,
    lower_tests: int = 0,
) -> str | None:
    """Why no Holm-adjusted p-value of these tests can fall below ``alpha`` whatever the
    data, or None: every p is at least :func:`smallest_p`, and Holm's first step
    multiplies the smallest p of all ``num_tests`` tests (``smallest_in_all``; default
    this test's) by ``num_tests``; and with only ``lower_tests`` of the others able to
    have a smaller p than this test's floor, its own step multiplies it by at least
    ``num_tests - lower_tests``.  ``units``: what a cluster is when ``by="query"``.
    Random flips are held only to their own floor: they fall below the exact test's by
    chance (5 clusters: 2^-4 = 0.0625 exact, p < 0.05 in some seeds), except with one
    cluster, whose every flip is its observed sum or its mirror (p = 1)."""

    def why_not(floor: float, smallest: float | None) -> str | None:
        if floor >= alpha:
            return f"significance needs p < {alpha:g}"
        if (floor if smallest is None else smallest) * num_tests >= alpha:
            return f"Holm over {num_tests} tests needs p < {alpha / num_tests:.2g}"
        step = num_tests - lower_tests  # the least Holm multiplies this test's p by
        if lower_tests and floor * step >= alpha:
            return (
                f"Holm over {num_tests} tests, {lower_tests} of which can have a smaller p, "
                f"needs p < {alpha / step:.2g}"
            )
        return None

    data_floor = smallest_p("exact", num_clusters, flips)  # all 2^C flips
    monte_carlo = test != "exact" and num_clusters > 1
    floor = smallest_p(test, num_clusters, flips) if monte_carlo else data_floor
    why = why_not(floor, smallest_in_all)
    if why is None:
        return None
    units = "identities" if by == "identity" else units
    if monte_carlo:  # more flips lower this floor; the exact one may need more clusters too
        more = "" if why_not(data_floor, None) is None else f" and more {units}"
        return (
            f"with {flips} random sign flips the paired test gives p >= {floor:.3g}, and "
            f"{why}; use more resamples{more}"
        )
    advice = "compare by query or on more identities" if by == "identity" else f"use more {units}"
    if num_clusters == 1:  # "with 1 queries"
        units = {"queries": "query", "identities": "identity", "sketches": "sketch"}.get(
            units, units
        )
    return (
        f"with {num_clusters} {units} the paired sign-flip test gives p >= {floor:.3g}, and "
        f"{why}; {advice}"
    )


def paired_sums(va: np.ndarray, vb: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    """Cluster sums ``(C, m)`` of the per-unit differences ``vb - va``."""
    return _cluster_sums(vb - va, cluster)[0]


def paired_estimates(
    va: np.ndarray,
    vb: np.ndarray,
    cluster: np.ndarray,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The estimates of a paired comparison of per-unit values ``(n_units, m)``:
    ``a``, ``b`` (means, percent), the paired bootstrap interval ``ci`` ``(2, m)`` of
    ``b - a`` (percentage points; ``resamples`` resamples of the clusters), and the
    number of units and clusters. Everything but the test, which
    :func:`exact_pvalues` or :func:`flip_hits` gives."""
    bounds = 100.0 * _percentile_interval(
        _resampled_means(vb - va, cluster, resamples, _streams(seed)[0]), confidence
    )
    return {
        # the metrics' own means (UnitTable.means: the same bits in any unit order)
        "a": [100.0 * mean(va[:, j]) for j in range(va.shape[1])],
        "b": [100.0 * mean(vb[:, j]) for j in range(vb.shape[1])],
        "ci": bounds.tolist(),
        "num_units": int(len(va)),
        "num_clusters": int(len(np.unique(cluster))),
    }


def comparison_rows(
    estimates: dict[str, Any],
    metrics: Sequence[str],
    pvalues,
    test: str,
    *,
    by: str,
    confidence: float = 0.95,
    dataset: str | None = None,
    names: tuple[str, str] = ("A", "B"),
) -> list[dict[str, Any]]:
    """One row per metric (see :func:`compare_ranks`), Holm-adjusted across them."""
    adjusted = holm(pvalues)
    key = ci_key(confidence)
    out = []
    for j, name in enumerate(metrics):
        a, b = estimates["a"][j], estimates["b"][j]
        out.append(
            {
                "dataset": dataset,
                "encoder_a": names[0],
                "encoder_b": names[1],
                "metric": name,
                "a": a,
                "b": b,
                "diff": b - a,
                key: [float(estimates["ci"][0][j]), float(estimates["ci"][1][j])],
                "p_value": float(pvalues[j]),
                "p_holm": adjusted[j],
                "test": test,
                "by": by,
                "num_units": estimates["num_units"],
                "num_clusters": estimates["num_clusters"],
            }
        )
    return out


def _check_flips(flips: int) -> int:
    from . import options

    return int(options.FLIPS.check(flips))


def format_p(p: float) -> str:
    """p-value for tables: 4 decimals, scientific notation below 1e-4."""
    if p < 1e-4:
        return f"{p:.1e}"
    return f"{p:.4f}"
