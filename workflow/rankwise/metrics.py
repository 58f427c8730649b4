"""Ranks -> numbers.  Every metric is a function of the ranks store alone.

Notation (DESIGN.md): for one evaluated query, ``r_1 < r_2 < ... < r_G`` are the
ranks of its G valid relevant gallery items.  All metrics are percentages.

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
=============  ===============================================================

(m@A / m@B: Bhunia et al., "Sketch Less for More", CVPR 2020.)  Per-query values
come from the private ``_per_query_*`` functions; the public ones average them.
"""

from __future__ import annotations

import re
from typing import Iterable

import numpy as np

from .errors import RankwiseError
from .registry import REGISTRY

_AT_K = {"recall@": "recall", "rank": "rank", "acc@": "acc"}
_PLAIN = ("map", "minp", "mrr", "m@A", "m@B", "wm@A", "wm@B")
AP_VARIANTS = ("standard", "trapezoid")


def parse_ks(text: str | Iterable[int]) -> tuple[int, ...]:
    """``"1,5,10"`` or an iterable -> sorted unique positive ints, else a clear error."""
    items = text.split(",") if isinstance(text, str) else list(text)
    ks = []
    for item in items:
        token = str(item).strip()
        if not re.fullmatch(r"\+?\d+", token) or int(token) < 1:
            raise RankwiseError(f"--ks must be positive integers separated by commas "
                                f"(e.g. 1,5,10); got {token!r} in {text!r}")
        ks.append(int(token))
    if not ks:
        raise RankwiseError("--ks is empty; give at least one cutoff, e.g. 1,5,10")
    return tuple(sorted(set(ks)))


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
        if name.startswith(prefix) and name[len(prefix):].isdigit() and int(name[len(prefix):]) > 0:
            if f"{prefix}K" in families:
                return family, int(name[len(prefix):])
    if name in _PLAIN and name in families:
        return name, None
    raise RankwiseError(f"unknown metric {name!r} for protocol {protocol!r}; valid metrics: "
                        f"{valid} (K a positive integer)")


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
        raise RankwiseError(f"unknown AP variant {ap!r}; valid: {', '.join(AP_VARIANTS)}")
    return np.add.reduceat(terms, offsets[:-1]) / np.diff(offsets)


def _per_query_inp(offsets, ranks) -> np.ndarray:
    """INP = G / r_G per query."""
    return np.diff(offsets) / ranks[offsets[1:] - 1]


def _per_query_first(offsets, ranks) -> np.ndarray:
    """r_1 per query."""
    return ranks[offsets[:-1]]


def _per_sketch(first, group, step, num_gallery: int) -> dict[str, np.ndarray]:
    """Progressive: per sketch m@A, m@B, wm@A, wm@B (fractions) and the last rank r_T.

    Rows of one sketch are ordered by step; t = 1..T is the position in that order.
    """
    order = np.lexsort((step, group))
    g, r = group[order], first[order].astype(np.float64)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, len(g)])
    T = np.repeat(sizes, sizes).astype(np.float64)
    t = np.arange(len(g)) - np.repeat(starts, sizes) + 1.0
    n = float(num_gallery)
    pct = (n - r) / (n - 1) if n > 1 else np.ones_like(r)
    w = np.exp(1.0 - t / T) / np.e
    mean = lambda x: np.add.reduceat(x, starts) / sizes  # noqa: E731
    return {"sketch": g[starts], "m@A": mean(pct), "m@B": mean(1.0 / r),
            "wm@A": mean(w * pct), "wm@B": mean(w / r),
            "last_rank": r[starts + sizes - 1].astype(np.int64)}


def per_query(arrays: dict[str, np.ndarray], attrs: dict, *, ap: str = "standard"
              ) -> dict[str, np.ndarray]:
    """Per-query (per-sketch for progressive) values from a ranks store's arrays."""
    offsets, ranks = arrays["offsets"], arrays["ranks"]
    first = _per_query_first(offsets, ranks)
    out = {"query_index": arrays["query_index"], "first_rank": first,
           "num_relevant": np.diff(offsets), "rr": 1.0 / first,
           "ap": _per_query_ap(offsets, ranks, ap=ap), "inp": _per_query_inp(offsets, ranks)}
    if attrs["protocol"] == "progressive":
        out["sketches"] = _per_sketch(first, arrays["group"], arrays["step"],
                                      attrs["num_gallery"])
    return out


def compute_metrics(arrays: dict[str, np.ndarray], attrs: dict, *, ks: Iterable[int] = (1, 5, 10),
                    ap: str = "standard") -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """All metrics of the protocol in ``attrs`` as percentages, and the per-query values."""
    protocol = attrs["protocol"]
    ks = parse_ks(ks) if not isinstance(ks, tuple) else ks
    pq = per_query(arrays, attrs, ap=ap)
    metrics: dict[str, float] = {}
    for name in metric_names(protocol, ks):
        family, k = parse_metric(name, protocol)
        metrics[name] = 100.0 * float(_average(pq, family, k))
    return metrics, pq


def _average(pq: dict, family: str, k: int | None) -> float:
    if family in ("recall", "rank"):
        return np.mean(pq["first_rank"] <= k)
    if family == "map":
        return np.mean(pq["ap"])
    if family == "minp":
        return np.mean(pq["inp"])
    if family == "mrr":
        return np.mean(pq["rr"])
    sk = pq["sketches"]
    if family == "acc":
        return np.mean(sk["last_rank"] <= k)
    return np.mean(sk[family])
