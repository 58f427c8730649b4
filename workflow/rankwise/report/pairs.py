"""Paired tests of two evaluations, cached per pair and keyed by both inputs' content.

A paired comparison (:func:`rankwise.stats.compare_ranks`) is a function of the two
evaluations' per-unit values and clusters (their :class:`~rankwise.summary.Summary`
``key``), the metrics compared and the statistics settings. Its result is kept in
``<cache>/<sha256>.json``, that sha256 being of all of these: a report with one new
evaluation recomputes only the pairs that involve it.

The number of random sign flips grows with the number of tests in the report
(:func:`rankwise.report.comparisons.flip_resamples`). The flips are one seeded stream
(:func:`rankwise.stats.flip_hits`), so a cached test is *extended*: the hits of flips
``n .. n'`` are added to those of ``0 .. n`` — the same p-value as from scratch, for
O(n' - n) work. Fewer flips than cached recompute from the start.

The same folder keeps the worst queries of an evaluation (:meth:`PairCache.remember`),
keyed by its ranks store's attributes (which name the embeddings' checkpoint hash,
encoder options and manifest hashes), per-unit values and the stamps (paths, sizes,
mtimes) of the manifests and embedding stores it reads, and
the font subsets of the PDF figures (:func:`rankwise.report.figures._kept_font_subsets`).

Every file is written atomically and holds its own key and its body's sha256: a file
that is not a cache entry (not JSON, another format, another key, as a file copied or
renamed over another has, a body edited since it was written; keys that do not match
:data:`PAIR_ENTRY` and the test's table, or the caller's check of a remembered value)
is ignored and rewritten. The folder may be deleted at any time (the next report
recomputes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..schema import KINDS, Field, problem
from ..stats import (
    exact_pvalues,
    flip_hits_many,
    monte_carlo_pvalues,
    paired_estimates,
    paired_sums,
)
from ..summary import Summary

_FORMAT = 3  # 3: intervals of non-constant differences resampled uncentred (2026-12-02)

#: A paired test's entry (``metrics``: the metrics compared, added when it is read).
PAIR_ENTRY: dict[str, Field] = {
    "test": Field("string", required=True, choices=("exact", "sign-flip")),
    "estimates": Field("object", required=True),
    "estimates.a": Field("numbers", required=True, length=("metrics", 0)),
    "estimates.b": Field("numbers", required=True, length=("metrics", 0)),
    "estimates.ci": Field("list", required=True),
    "estimates.num_units": Field("count", required=True),
    "estimates.num_clusters": Field("count", required=True),
}
#: What each test keeps beside the estimates.
TEST_ENTRY: dict[str, dict[str, Field]] = {
    "exact": {"pvalues": Field("numbers", required=True, length=("metrics", 0))},
    "sign-flip": {
        "flips": Field("count", required=True),
        "hits": Field("numbers", required=True, length=("metrics", 0)),
    },
}


#: The keys of a cache file that frame its entry.
_FRAME = ("format", "key", "sha256")


def _checksum(body: dict[str, Any]) -> str:
    """sha256 of an entry's body as JSON (keys sorted): what its file holds, read back,
    gives the same text (floats round-trip through JSON exactly)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _usable(entry: dict[str, Any], metrics: list[str]) -> bool:
    """Whether ``entry`` holds a paired test of ``metrics`` (else it is recomputed)."""
    entry = {**entry, "metrics": metrics}
    if problem(entry, PAIR_ENTRY) or problem(entry, TEST_ENTRY[entry["test"]]):
        return False
    numbers = KINDS["numbers"][1]
    ci = entry["estimates"]["ci"]  # (2, m): low and high bounds
    return len(ci) == 2 and all(numbers(row) and len(row) == len(metrics) for row in ci)


def _columns(summary: Summary, metrics: list[str]) -> np.ndarray:
    names = list(summary.settings["metrics"])
    return summary.values[:, [names.index(m) for m in metrics]]


class PairCache:
    """Paired tests of summaries, remembered in ``folder`` (``None``: nothing kept).

    ``computed`` / ``reused`` / ``extended`` count what :meth:`compare` did (the report
    prints them; the benchmarks read them)."""

    def __init__(self, folder: str | os.PathLike | None):
        self.folder = Path(folder) if folder else None
        self.computed = self.reused = self.extended = 0

    def _key(self, a: Summary, b: Summary, metrics: list[str], settings: dict) -> str:
        text = json.dumps(
            {"a": a.key, "b": b.key, "metrics": metrics, **settings, "format": _FORMAT},
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def _read(self, key: str) -> dict[str, Any] | None:
        if self.folder is None:
            return None
        try:
            entry = json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        # the key inside: two entries swapped (copied, renamed) gave each other's p-values
        usable = isinstance(entry, dict) and entry.get("format") == _FORMAT
        if not (usable and entry.get("key") == key):
            return None
        # and its body's checksum: a number edited by hand (or a flipped bit) under the
        # right key is computed again, not reported
        body = {k: v for k, v in entry.items() if k not in _FRAME}
        return entry if entry.get("sha256") == _checksum(body) else None

    def _write(self, key: str, entry: dict[str, Any]) -> None:
        if self.folder is None:
            return
        path = self.folder / f"{key}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            body = {k: v for k, v in entry.items() if k not in _FRAME}  # one read back
            frame = {"format": _FORMAT, "key": key, "sha256": _checksum(body)}
            tmp.write_text(json.dumps({**body, **frame}))
            os.replace(tmp, path)
        except OSError:  # a full disk, a read-only cache: the cache is advisory
            with contextlib.suppress(OSError):
                tmp.unlink()

    def remember(
        self,
        what: str,
        key: Any,
        compute: Callable[[], Any],
        usable: Callable[[Any], bool] = lambda value: True,
    ) -> Any:
        """``compute()``, or its result kept under ``what`` and ``key`` (JSON; other
        values as their ``str``) when ``usable(result)`` (else computed again)."""
        text = json.dumps(
            {"what": what, "key": key, "format": _FORMAT}, sort_keys=True, default=str
        )
        digest = hashlib.sha256(text.encode()).hexdigest()
        entry = self._read(digest)
        if entry is not None and "value" in entry and usable(entry["value"]):
            return entry["value"]
        value = compute()
        self._write(digest, {"value": value})
        return value

    def compare(
        self,
        a: Summary,
        b: Summary,
        metrics: list[str],
        *,
        resamples: int,
        flips: int,
        seed: int,
        confidence: float,
        exact_max: int,
    ) -> tuple[dict[str, Any], np.ndarray, str]:
        """``(estimates, p-values, test)`` of B against A on ``metrics`` (see
        :func:`rankwise.stats.paired_estimates`; test ``"exact"`` or ``"sign-flip"``)."""
        return self.compare_all(
            [(a, b, metrics)],
            resamples=resamples,
            flips=flips,
            seed=seed,
            confidence=confidence,
            exact_max=exact_max,
        )[0]

    def compare_all(
        self,
        pairs: list[tuple[Summary, Summary, list[str]]],
        *,
        resamples: int,
        flips: int,
        seed: int,
        confidence: float,
        exact_max: int,
    ) -> list[tuple[dict[str, Any], np.ndarray, str]]:
        """:meth:`compare` of every ``(a, b, metrics)`` of ``pairs``, in order. The
        tests that need the same sign flips (as many clusters, from the same flip on:
        the pairs of one dataset) draw them once (:func:`rankwise.stats.flip_hits_many`):
        the same hits as one pair at a time, for a fraction of the work."""
        settings = {
            "resamples": resamples,
            "seed": seed,
            "confidence": confidence,
            "exact_max": exact_max,
        }
        tests: dict[str, _Test] = {}  # by cache key: a pair given twice is read once
        order = []
        for a, b, metrics in pairs:
            key = self._key(a, b, metrics, settings)
            order.append(key)
            if key in tests:
                self.reused += 1
                continue
            tests[key] = test = _Test(a, b, metrics, self._read(key))
            if test.entry is not None and not _usable(test.entry, metrics):
                test.entry = None  # hand-edited or cut short: computed again, and rewritten
            if test.entry is None:
                test.compute(resamples=resamples, seed=seed, confidence=confidence)
                test.entry = test.fresh(exact_max)
                self.computed += 1
                if test.entry["test"] == "exact":
                    self._write(key, test.entry)
            else:
                self.reused += 1
        # the sign-flip tests short of ``flips``, by the flips they need
        extend: dict[tuple[int, int], list[tuple[str, _Test]]] = {}
        for key, test in tests.items():
            entry = test.entry
            if entry["test"] == "exact" or int(entry["flips"]) == flips:
                continue
            if test.sums is None:
                test.sums = paired_sums(
                    _columns(test.a, test.metrics), _columns(test.b, test.metrics), test.a.cluster
                )
                self.reused -= 1
                self.extended += 1
            done = int(entry["flips"])
            start = done if done < flips else 0
            extend.setdefault((len(test.sums), start), []).append((key, test))
        for (_, start), group in extend.items():
            added = flip_hits_many([test.sums for _, test in group], seed, start, flips)
            for (key, test), hits in zip(group, added, strict=True):
                entry = test.entry
                before = np.asarray(entry["hits"], np.int64) if start else 0
                entry["hits"] = (before + hits).tolist()
                entry["flips"] = flips
                self._write(key, entry)
        return [tests[key].result(flips) for key in order]


class _Test:
    """One pair's test while :meth:`PairCache.compare_all` works on it: the cached entry
    (``None``: none usable) and, once computed, the cluster sums of the differences."""

    def __init__(self, a: Summary, b: Summary, metrics: list[str], entry):
        self.a, self.b, self.metrics = a, b, metrics
        self.entry: dict[str, Any] | None = entry
        self.sums: np.ndarray | None = None
        self.estimates: dict[str, Any] | None = None

    def compute(self, *, resamples: int, seed: int, confidence: float) -> None:
        va, vb = _columns(self.a, self.metrics), _columns(self.b, self.metrics)
        self.estimates = paired_estimates(
            va, vb, self.a.cluster, resamples=resamples, seed=seed, confidence=confidence
        )
        self.sums = paired_sums(va, vb, self.a.cluster)

    def fresh(self, exact_max: int) -> dict[str, Any]:
        """The new entry of a computed test: exact p-values, or no sign flips yet."""
        assert self.sums is not None
        if len(self.sums) <= exact_max:
            pvalues = exact_pvalues(self.sums).tolist()
            return {"estimates": self.estimates, "test": "exact", "pvalues": pvalues}
        return {
            "estimates": self.estimates,
            "test": "sign-flip",
            "flips": 0,
            "hits": [0] * len(self.metrics),
        }

    def result(self, flips: int) -> tuple[dict[str, Any], np.ndarray, str]:
        entry = self.entry
        assert entry is not None
        if entry["test"] == "exact":
            return entry["estimates"], np.asarray(entry["pvalues"]), "exact"
        return (
            entry["estimates"],
            monte_carlo_pvalues(np.asarray(entry["hits"]), flips),
            "sign-flip",
        )
