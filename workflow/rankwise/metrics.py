"""Ranks -> numbers.  Every metric is a function of the ranks store alone.

Notation (README, "What the numbers mean"): for one evaluated query,
``r_1 < r_2 < ... < r_G`` are the ranks of its G valid relevant gallery items.  All
metrics are percentages.

=============  ===============================================================
``recall@K``   protocol ``recall``: fraction of queries with ``r_1 <= K``
``rankK``      other protocols: the same (CMC at K)
``map``        mean AP, ``AP = (1/G) sum_i i / r_i``; ``ap="trapezoid"``: the
               official Market-1501 AP ``sum_i ((i-1)/(r_i-1) + i/r_i) / (2G)``
               with ``(i-1)/(r_i-1) := 1`` when ``r_i = 1``
``minp``       mean INP, ``INP = G / r_G`` (Ye et al., TPAMI 2021)
``mrr``        mean ``1 / r_1``
``m@A``        progressive, per sketch ``mean_t (N - r_t) / (N - 1)``
``m@B``        progressive, per sketch ``mean_t 1 / r_t``
``wm@A/wm@B``  the same weighted by ``w_t = exp(1 - t/T) / e``
``acc@K``      progressive, fraction of sketches with ``r_T <= K``
``precision@K`` protocol ``recall``: mean ``#{i : r_i <= K} / K``
``r_precision`` protocol ``recall``: mean ``#{i : r_i <= G} / G``
``map@r``      protocol ``recall``: mean ``(1/G) sum_{i : r_i <= G} i / r_i`` (MAP@R)
=============  ===============================================================

(m@A / m@B: Bhunia et al., "Sketch Less for More", CVPR 2020.  precision@K,
R-precision and MAP@R: Musgrave et al., "A Metric Learning Reality Check", ECCV 2020,
as pytorch-metric-learning's ``AccuracyCalculator`` computes them with its defaults
``avg_of_avgs=False`` and ``k=None`` (R = G, every relevant item counted): queries
without a relevant item are left out (PML's "lone" queries, our skipped ones), and
the mean is over queries, not over classes.  PML breaks distance ties by whatever its
k-NN search returns; here ties count against the query, as for every metric.)  Under
reid's ``single_gallery_shot`` (a store with ``shot_pmf``, :mod:`rankwise.single_shot`)
``rankK`` and ``mrr`` read the single-shot rank r instead of ``r_1``: per query
``P(r <= K)`` and ``E[1 / r]`` over its draws; ``map`` and ``minp`` read the full list.
Every metric is the
mean of a per-*unit* value (a unit is an evaluated query, or a sketch: the protocol
spec's ``unit``).  :func:`per_unit` is the one place that turns ranks into those
values (the private ``_per_query_*`` / ``_per_sketch`` functions compute them);
:func:`compute_metrics` averages them, :mod:`rankwise.stats` resamples them, and the
report and ``rankwise scores`` read them.  The CMC (:func:`cmc`) and the sketch
completion curve (:func:`completion_curve`) live here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import RankwiseError
from .options import AP, KS
from .registry import REGISTRY, get_protocol

_AT_K = {"recall@": "recall", "rank": "rank", "acc@": "acc", "precision@": "precision"}
_PLAIN = ("map", "minp", "mrr", "m@A", "m@B", "wm@A", "wm@B", "r_precision", "map@r")
AP_VARIANTS = AP.choices


def parse_ks(text: str | Iterable[int]) -> tuple[int, ...]:
    """``"1,5,10"`` or an iterable -> sorted unique positive ints, else a clear error
    naming ``ks`` (the option spec's parser; the CLI's message names ``--ks``)."""
    from .options import parse_cutoffs

    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        text = [int(text)]  # ks=5, as --ks 5
    if not isinstance(text, (str, Iterable)):  # None, 5.0, True: parse_cutoffs names them
        return parse_cutoffs(text, "ks")
    return parse_cutoffs(text if isinstance(text, str) else list(text), "ks")


def _families(protocol: str, *, strict: bool = True) -> tuple[str, ...]:
    """The protocol's metric families (registry order); ``()`` if unknown and not strict."""
    spec = REGISTRY.get(protocol)
    if spec is None and strict:
        raise KeyError(protocol)
    return spec.metric_families if spec is not None else ()


def metric_names(protocol: str, ks: Iterable[int]) -> list[str]:
    """The metrics reported for ``protocol``, in report order."""
    names: list[str] = []
    for family in _families(protocol):
        if family.endswith("K"):
            names += [f"{family[:-1]}{k}" for k in ks]
        else:
            names.append(family)
    return names


def parse_metric(name: str, protocol: str) -> tuple[str, int | None]:
    """``"recall@5"`` -> ``("recall", 5)``, ``"map"`` -> ``("map", None)``.

    Raises a :class:`RankwiseError` listing the valid names for ``protocol``.
    """
    families = _families(protocol, strict=False)
    valid = ", ".join(families)
    for prefix, family in _AT_K.items():
        k = name[len(prefix) :]
        # isascii: '²' is a digit to str.isdigit, not to int()
        if (
            name.startswith(prefix)
            and k.isascii()
            and k.isdigit()
            and int(k) > 0
            and f"{prefix}K" in families
        ):
            return family, int(k)
    if name in _PLAIN and name in families:
        return name, None
    raise RankwiseError(
        f"unknown metric {name!r} for protocol {protocol!r}; valid metrics: "
        f"{valid} (K a positive integer)"
    )


def canonical_metric(name: str, protocol: str) -> str:
    """The name :func:`metric_names` gives the metric ``name`` spells (``"recall@05"`` ->
    ``"recall@5"``), so that one metric is never listed, or tested, twice."""
    family, k = parse_metric(name, protocol)
    if k is None:
        return family
    prefix = next(p for p, f in _AT_K.items() if f == family)
    return f"{prefix}{k}"


# ----------------------------------------------------------------- per query


def _positions(offsets: np.ndarray) -> np.ndarray:
    """1-based position i of every rank inside its query's list."""
    counts = np.diff(offsets)
    return np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts) + 1


def _per_query_ap(offsets, ranks, *, ap: str = "standard") -> np.ndarray:
    """AP per query (fraction)."""
    i = _positions(offsets).astype(np.float64)
    r = ranks.astype(np.float64)
    if ap == "standard":
        terms = i / r
    elif ap == "trapezoid":
        with np.errstate(divide="ignore", invalid="ignore"):
            before = np.where(r == 1, 1.0, (i - 1) / (r - 1))
        terms = (before + i / r) / 2
    else:
        AP.check(ap)  # raises: not a variant
    return np.add.reduceat(terms, offsets[:-1]) / np.diff(offsets)


def _per_query_inp(offsets, ranks) -> np.ndarray:
    """INP = G / r_G per query."""
    return np.diff(offsets) / ranks[offsets[1:] - 1]


def _per_query_hits(offsets, ranks, cutoff: np.ndarray | int) -> np.ndarray:
    """``#{i : r_i <= cutoff}`` per query (``cutoff`` a scalar or ``(n_queries,)``)."""
    cut = np.repeat(np.broadcast_to(cutoff, (len(offsets) - 1,)), np.diff(offsets))
    return np.add.reduceat((ranks <= cut).astype(np.int64), offsets[:-1])


def _per_query_precision_at(offsets, ranks, k: int) -> np.ndarray:
    """precision@K = ``#{i : r_i <= K} / K`` per query (PML ``precision_at_k``)."""
    return _per_query_hits(offsets, ranks, k) / float(k)


def _per_query_r_precision(offsets, ranks) -> np.ndarray:
    """R-precision = ``#{i : r_i <= G} / G`` per query (R = G, the query's relevant items)."""
    g = np.diff(offsets)
    return _per_query_hits(offsets, ranks, g) / g


def _per_query_ap_at_r(offsets, ranks) -> np.ndarray:
    """MAP@R's per-query value ``(1/G) sum_{i : r_i <= G} i / r_i``: precision@r_i
    (= i / r_i, ranks sorted) at each relevant item within the top R = G."""
    g = np.diff(offsets)
    i = _positions(offsets).astype(np.float64)
    r = ranks.astype(np.float64)
    terms = np.where(ranks <= np.repeat(g, g), i / r, 0.0)
    return np.add.reduceat(terms, offsets[:-1]) / g


def _per_query_first(offsets, ranks) -> np.ndarray:
    """r_1 per query."""
    return ranks[offsets[:-1]]


def sketch_groups(group: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The renderings of each sketch, in step order: the one place they are grouped.

    Parameters
    ----------
    group, step : ``(n_queries,)`` sketch number and step of every evaluated query.

    Returns
    -------
    order : ``(n_queries,)`` evaluated queries sorted by (sketch, step).
    starts : ``(n_sketches,)`` where each sketch begins in ``order`` (sketches ascending).
    sizes : ``(n_sketches,)`` its number of renderings T; rendering t = 1..T is
        ``order[starts + t - 1]``.
    """
    order = np.lexsort((step, group))
    g = group[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(g)])
    return order, starts, sizes


def _per_sketch(first, group, step, query_index, num_gallery: int) -> dict[str, np.ndarray]:
    """Progressive: per sketch m@A, m@B, wm@A, wm@B (fractions), the last rank r_T and
    the query manifest rows of its first and complete renderings.

    Rows of one sketch are ordered by step; t = 1..T is the position in that order.
    """
    order, starts, sizes = sketch_groups(group, step)
    g, r = group[order], first[order].astype(np.float64)
    T = np.repeat(sizes, sizes).astype(np.float64)
    t = np.arange(len(g)) - np.repeat(starts, sizes) + 1.0
    n = float(num_gallery)
    pct = (n - r) / (n - 1) if n > 1 else np.ones_like(r)
    w = np.exp(1.0 - t / T) / np.e
    mean = lambda x: np.add.reduceat(x, starts) / sizes
    last = starts + sizes - 1
    return {
        "sketch": g[starts],
        "m@A": mean(pct),
        "m@B": mean(1.0 / r),
        "wm@A": mean(w * pct),
        "wm@B": mean(w / r),
        "last_rank": r[last].astype(np.int64),
        "query_index": query_index[order[starts]],
        "last_query_index": query_index[order[last]],
    }


def _sketch_units(protocol: str) -> bool:
    """Whether the protocol's unit is a sketch (a group of step renderings)."""
    return get_protocol(protocol).unit == "sketch"


def per_query(
    arrays: dict[str, np.ndarray], attrs: dict, *, ap: str = "standard"
) -> dict[str, np.ndarray]:
    """Per evaluated query values from a ranks store's arrays (the record kept in
    :attr:`rankwise.api.EvaluationResult.per_query`).

    Returns ``query_index``, ``first_rank`` (r_1), ``num_relevant`` (G), ``rr``, ``ap``,
    ``inp``, ``r_precision``, ``ap_at_r`` (fractions), each ``(n_queries,)``; with sketch
    units also ``sketches``:
    per sketch ``sketch``, ``m@A``, ``m@B``, ``wm@A``, ``wm@B``, ``last_rank`` (r_T),
    ``query_index`` / ``last_query_index`` (rows of its first / complete rendering).
    """
    offsets, ranks = arrays["offsets"], arrays["ranks"]
    first = _per_query_first(offsets, ranks)
    out: dict[str, Any] = {
        "query_index": arrays["query_index"],
        "first_rank": first,
        "num_relevant": np.diff(offsets),
        "rr": 1.0 / first,
        "ap": _per_query_ap(offsets, ranks, ap=ap),
        "inp": _per_query_inp(offsets, ranks),
        "r_precision": _per_query_r_precision(offsets, ranks),
        "ap_at_r": _per_query_ap_at_r(offsets, ranks),
    }
    if "shot_pmf" in arrays:  # single-gallery-shot: r_1 -> the single-shot rank r
        shot = (np.asarray(arrays["shot_offsets"]), np.asarray(arrays["shot_pmf"]))
        out["shot"] = shot
        out["rr"] = shot_expectation(shot[0], shot[1], lambda r: 1.0 / r)
    if _sketch_units(attrs["protocol"]):
        out["sketches"] = _per_sketch(
            first,
            arrays["group"],
            arrays["step"],
            np.asarray(arrays["query_index"]),
            attrs["num_gallery"],
        )
    return out


def shot_expectation(offsets: np.ndarray, pmf: np.ndarray, f) -> np.ndarray:
    """Per query ``E[f(r)] = sum_k P(r = k) f(k)`` of the single-shot rank's distribution
    (CSR ``pmf[offsets[i] + k - 1] = P(r = k)``): ``(n_queries,)`` float64."""
    if len(offsets) < 2:
        return np.zeros(0)
    k = _positions(offsets).astype(np.float64)
    return np.add.reduceat(pmf * f(k), offsets[:-1])


def shot_hits(offsets: np.ndarray, pmf: np.ndarray, k: int) -> np.ndarray:
    """Per query ``P(r <= k)`` of the single-shot rank (the CMC at k).

    Once k reaches a query's largest possible r (its stored support) the probability is
    1 exactly: a sum of the rounded ``c / repeats`` can land on 1 +- 2^-52, which made a
    ``rankK`` of 100.00000000000003 %.  Below it, never above 1 (exact draws' rounding).
    """
    hits = shot_expectation(offsets, pmf, lambda r: (r <= k).astype(np.float64))
    return np.where(np.diff(offsets) <= k, 1.0, np.minimum(hits, 1.0))


# ----------------------------------------------------------------- per unit

#: Per-query column of each query-unit family (hit families read ``rank <= K``;
#: ``precision@K`` reads the ranks).  :func:`unit_scores` lists these columns.
_QUERY_COLUMNS = {"map": "ap", "minp": "inp", "mrr": "rr"}
#: Per-query columns of the metric-learning families (protocol ``recall``).
_RECALL_COLUMNS = {"r_precision": "r_precision", "map@r": "ap_at_r"}


def _unit_families(unit: str) -> tuple[str, ...]:
    """Every metric family defined on ``unit`` (the registry's protocols with that unit):
    e.g. AP is a per-query value of a ``reassociation`` query too (worst queries)."""
    return tuple(
        dict.fromkeys(
            f for spec in REGISTRY.values() if spec.unit == unit for f in spec.metric_families
        )
    )


def _parse_unit_metric(name: str, unit: str) -> tuple[str, int | None]:
    """``parse_metric`` against every family defined on ``unit``."""
    families = _unit_families(unit)
    for prefix, family in _AT_K.items():
        k = name[len(prefix) :]
        # isascii: '²' is a digit to str.isdigit, not to int() (as parse_metric)
        if (
            name.startswith(prefix)
            and k.isascii()
            and k.isdigit()
            and int(k) > 0
            and f"{prefix}K" in families
        ):
            return family, int(k)
    if name in _PLAIN and name in families:
        return name, None
    raise RankwiseError(
        f"metrics: unknown metric {name!r} for {unit} units; valid metrics: "
        f"{', '.join(families)} (K a positive integer)"
    )


@dataclass(frozen=True)
class UnitTable:
    """Per-unit values of metrics; a unit is the protocol's ``unit`` (query or sketch).

    Attributes
    ----------
    unit : ``"query"`` or ``"sketch"`` (:attr:`rankwise.registry.ProtocolSpec.unit`).
    index : ``(n_units,)`` int64, the unit: its ``query_index`` (query manifest row), or
        its sketch number.
    rows : ``(n_units,)`` int64, the unit's query manifest row (a sketch's first,
        least complete rendering): what ``--by identity`` reads labels of.
    last_rows : ``(n_units,)`` int64, a sketch's complete rendering (``rows`` for queries).
    rank : ``(n_units,)`` int64, the rank that ``hit@K`` and the CMC read: ``r_1``, or
        the target's ``r_T`` at the complete rendering (single-gallery-shot: ``r_1`` of
        the full list; ``hit@K`` and the CMC read the single-shot rank's distribution).
    num_relevant : ``(n_units,)`` int64, G (1 for a sketch).
    names : the metric names, one per column of ``values``.
    values : ``(n_units, len(names))`` float64, fractions:
        ``100 * values[:, j].mean()`` is metric ``names[j]``.
    """

    unit: str
    index: np.ndarray
    rows: np.ndarray
    last_rows: np.ndarray
    rank: np.ndarray
    num_relevant: np.ndarray
    names: tuple[str, ...]
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def column(self, name: str) -> np.ndarray:
        """``(n_units,)`` values of metric ``name``."""
        return self.values[:, self.names.index(name)]

    def means(self) -> dict[str, float]:
        """``{name: 100 * mean}``: the metrics, in percent (:func:`mean`)."""
        return {name: 100.0 * mean(self.values[:, j]) for j, name in enumerate(self.names)}

    def in_key_order(self, arrays: dict[str, np.ndarray]) -> UnitTable:
        """The units sorted by :func:`unit_keys` (the table itself for a store without
        them): what the statistics resample, so that a query manifest with the same rows
        in another order gives the same intervals and tests at the same seed."""
        keys = unit_keys(arrays, self)
        if keys is None:
            return self
        order = np.argsort(keys, kind="stable")
        return replace(
            self,
            index=self.index[order],
            rows=self.rows[order],
            last_rows=self.last_rows[order],
            rank=self.rank[order],
            num_relevant=self.num_relevant[order],
            values=self.values[order],
        )


def unit_keys(arrays: dict[str, np.ndarray], table: UnitTable | None = None) -> np.ndarray | None:
    """A key per unit that does not depend on the query manifest's row order, from the
    store's ``unit_key`` (each evaluated query's place in the string order of the query
    ids): a query's own key, a sketch's the smallest key of its renderings.  ``table``
    given: the keys of its units; else one per sketch number (sketch protocols) or per
    evaluated query in store order.  ``None`` for a store without ``unit_key``."""
    if "unit_key" not in arrays:
        return None
    key = np.asarray(arrays["unit_key"], np.int64)
    group = np.asarray(arrays["group"], np.int64)
    if len(group) and group.min() >= 0:  # sketches
        per_sketch = np.full(int(group.max()) + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(per_sketch, group, key)
        return per_sketch if table is None else per_sketch[table.index]
    if table is None:
        return key
    by_row = np.empty(int(np.max(arrays["query_index"], initial=-1)) + 1, np.int64)
    by_row[np.asarray(arrays["query_index"], np.int64)] = key
    return by_row[table.rows]


def mean(values) -> float:
    """The mean of ``values`` (1-D), the same bits in any order of them (a permuted query
    manifest, pooled queries in another order): ``s = fsum(x) / n`` refined once,
    ``s + fsum(x - s) / n`` (``math.fsum`` is correctly rounded, so order-free).  Within
    an ulp of the exact mean, and exactly ``v`` when every value is ``v`` (``fsum / n``
    alone can miss it by an ulp: 3 x 0.1 / 3).  ``nan`` when empty."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) == 0:
        return float("nan")
    s = math.fsum(x) / len(x)
    return s + math.fsum(x - s) / len(x)


def per_unit(
    arrays: dict[str, np.ndarray], attrs: dict, metrics: Iterable[str] = (), *, ap: str = "standard"
) -> UnitTable:
    """The per-unit table of ``metrics`` for a ranks store: every "ranks -> per-unit value".

    ========================  ==================================================
    ``recall@K`` / ``rankK``  ``hit@K = [r_1 <= K]`` (single-shot: ``P(r <= K)``)
    ``map`` / ``minp``        AP, ``INP = G / r_G``
    ``mrr``                   ``RR = 1 / r_1``
    ``m@A`` ... ``wm@B``      the sketch's m@A ... wm@B
    ``acc@K``                 ``[r_T <= K]``, r_T the complete rendering's rank
    ``precision@K``           ``#{i : r_i <= K} / K``
    ``r_precision``           ``#{i : r_i <= G} / G``
    ``map@r``                 ``(1/G) sum_{i : r_i <= G} i / r_i``
    ========================  ==================================================

    Parameters
    ----------
    arrays, attrs : a ranks store (:func:`rankwise.store.read_ranks`).
    metrics : metric names defined on the protocol's unit (see :func:`metric_names`).
    ap : ``"standard"`` or ``"trapezoid"``.

    Returns
    -------
    :class:`UnitTable`, units in store order (sketches: ascending sketch number).
    """
    return _unit_table(per_query(arrays, attrs, ap=ap), attrs, metrics, arrays)


def _unit_table(
    pq: dict[str, np.ndarray], attrs: dict, metrics: Iterable[str], arrays: dict[str, np.ndarray]
) -> UnitTable:
    """:func:`per_unit` from the per-query record ``pq`` of :func:`per_query` (and the
    store's ``arrays`` for ``precision@K``)."""
    unit = get_protocol(attrs["protocol"]).unit
    parsed = [(name, *_parse_unit_metric(name, unit)) for name in metrics]
    if unit == "sketch":
        record = pq["sketches"]
        index = np.asarray(record["sketch"], np.int64)
        rows = np.asarray(record["query_index"], np.int64)
        last_rows = np.asarray(record["last_query_index"], np.int64)
        rank = np.asarray(record["last_rank"], np.int64)
        num_relevant = np.ones(len(index), np.int64)
    else:
        named = {**_QUERY_COLUMNS, **_RECALL_COLUMNS}
        record = {key: pq[col] for key, col in named.items()}  # type: ignore[assignment]
        index = rows = last_rows = np.asarray(pq["query_index"], np.int64)
        rank = np.asarray(pq["first_rank"], np.int64)
        num_relevant = np.asarray(pq["num_relevant"], np.int64)
    shot = pq.get("shot")

    def column(family: str, k: int | None) -> np.ndarray:
        if family == "precision":
            return _per_query_precision_at(arrays["offsets"], arrays["ranks"], int(k or 0))
        if k is None:
            return record[family]
        return rank <= k if shot is None else shot_hits(shot[0], shot[1], k)

    columns = [column(family, k) for _, family, k in parsed]
    values = (
        np.stack([np.asarray(c, np.float64) for c in columns], axis=1)
        if columns
        else np.zeros((len(index), 0))
    )
    return UnitTable(
        unit=unit,
        index=index,
        rows=rows,
        last_rows=last_rows,
        rank=rank,
        num_relevant=num_relevant,
        names=tuple(name for name, _, _ in parsed),
        values=values,
    )


def compute_metrics(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    ks: Iterable[int] = KS.default,
    ap: str = "standard",
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """All metrics of the protocol in ``attrs`` as percentages (the means of
    :func:`per_unit`), and the per-query record (:func:`per_query`)."""
    ks = parse_ks(ks) if not isinstance(ks, tuple) else ks
    pq = per_query(arrays, attrs, ap=ap)
    return _unit_table(pq, attrs, metric_names(attrs["protocol"], ks), arrays).means(), pq


def unit_scores(
    arrays: dict[str, np.ndarray],
    attrs: dict,
    *,
    ks: Iterable[int] = KS.default,
    ap: str = "standard",
) -> dict[str, np.ndarray]:
    """The per-unit table as named columns (``rankwise scores``), as fractions.

    Queries: ``query_index``, ``num_relevant``, ``first_rank``, ``ap``, ``inp``, ``rr``,
    ``hit@K`` (bool; single-gallery-shot: ``P(r <= K)``).  Sketches: ``sketch`` (the
    store's sketch number, in order of first appearance in the query manifest, not the
    manifest's ``sketch`` value), ``query_index`` (row of its first rendering), ``m@A``,
    ``m@B``, ``wm@A``, ``wm@B``, ``last_rank``, ``hit@K`` (``last_rank <= K``).  Each
    ``(n_units,)``; a column's mean x 100 is its metric.
    """
    ks = parse_ks(ks)
    if _sketch_units(attrs["protocol"]):
        names = ["m@A", "m@B", "wm@A", "wm@B"]
        table = per_unit(arrays, attrs, names, ap=ap)
        out = {
            "sketch": table.index,
            "query_index": table.rows,
            **{n: table.column(n) for n in names},
            "last_rank": table.rank,
        }
    else:
        table = per_unit(arrays, attrs, list(_QUERY_COLUMNS), ap=ap)
        out = {
            "query_index": table.index,
            "num_relevant": table.num_relevant,
            "first_rank": table.rank,
            **{col: table.column(name) for name, col in _QUERY_COLUMNS.items()},
        }
    if "shot_pmf" in arrays:  # the probability of a hit over the draws
        shot = (np.asarray(arrays["shot_offsets"]), np.asarray(arrays["shot_pmf"]))
        out.update({f"hit@{k}": shot_hits(*shot, k) for k in ks})
    else:
        out.update({f"hit@{k}": table.rank <= k for k in ks})
    return out


# ----------------------------------------------------------------- curves


def cmc(arrays: dict[str, np.ndarray], attrs: dict, max_rank: int = 50) -> list[float]:
    """CMC: ``curve[k - 1]`` = % of units whose ``rank`` (:class:`UnitTable`) is <= k,
    k = 1..``max_rank`` (for sketches: the complete rendering, the curve of ``acc@K``).

    Each point is ``100 * mean(hit@k)`` with :func:`mean`, as the metrics compute
    ``recall@k`` / ``rank-k``: the same bits (``100 * count / n`` rounds once where they
    round twice, and differed by an ulp)."""
    first = per_unit(arrays, attrs).rank
    if len(first) == 0:
        return [0.0] * max_rank
    if "shot_pmf" in arrays:  # single-gallery-shot: the mean of P(r <= k)
        shot = (np.asarray(arrays["shot_offsets"]), np.asarray(arrays["shot_pmf"]))
        return [100.0 * mean(shot_hits(*shot, k)) for k in range(1, max_rank + 1)]
    return [100.0 * mean(first <= k) for k in range(1, max_rank + 1)]


def completion_levels(arrays: dict[str, np.ndarray]) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Sketch completion levels: rendering t of T is ``100 t / T`` percent complete
    (grouped into tenths when there are more than 20 distinct levels).

    Returns
    -------
    ``[(completion, ranks, sketch), ...]`` by ascending completion: the target's rank
    ``r_t`` (float64) of every rendering at that level and its sketch: the sketch's
    :func:`unit_keys` key when the store has them (the same for any row order of the
    query manifest), else its sketch number.
    """
    offsets, ranks = arrays["offsets"], arrays["ranks"]
    first = ranks[offsets[:-1]].astype(np.float64)
    order, starts, sizes = sketch_groups(arrays["group"], arrays["step"])
    group, r = arrays["group"][order], first[order]
    t = np.arange(len(group)) - np.repeat(starts, sizes) + 1.0
    completion = np.round(100.0 * t / np.repeat(sizes, sizes), 6)
    if len(np.unique(completion)) > 20:
        completion = 10.0 * np.ceil(completion / 10.0 - 1e-9)
    keys = unit_keys(arrays)
    sketch = group if keys is None else keys[group]
    return [
        (float(level), r[completion == level], sketch[completion == level])
        for level in np.unique(completion)
    ]


def completion_curve(arrays: dict[str, np.ndarray]) -> dict[str, list]:
    """The target's rank against sketch completion (:func:`completion_levels`).

    Returns
    -------
    dict of lists, one item per level: ``completion`` (percent), ``num_renderings``,
    ``mean_reciprocal_rank`` (mean ``1 / r_t`` in percent; m@B is its average over
    steps), ``median_rank``.
    """
    out: dict[str, list] = {
        "completion": [],
        "num_renderings": [],
        "mean_reciprocal_rank": [],
        "median_rank": [],
    }
    for level, r, _ in completion_levels(arrays):
        out["completion"].append(level)
        out["num_renderings"].append(int(len(r)))
        out["mean_reciprocal_rank"].append(100.0 * mean(1.0 / r))  # order-free (fsum)
        out["median_rank"].append(float(np.median(r)))
    return out
