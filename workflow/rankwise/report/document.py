"""The report document: plain data (what ``report.json`` holds), built once.

Per dataset x encoder, from the ``rankwise metrics`` JSON and the ranks store its
provenance names: the metrics, their intervals (``ci95``), the CMC curve, the sketch
completion curve, the worst queries and the provenance; across encoders, the paired
comparisons (:mod:`.comparisons`); and the statistics settings.  The renderers
(:mod:`.markdown`, :mod:`.html`) only read it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..api import REPORT_KEYS
from ..errors import RankwiseError
from ..metrics import canonical_metric
from ..options import AP, DISTANCE
from ..registry import PROTOCOLS, get_protocol
from ..schema import Field, check, optional
from ..stats import DEFAULT_RESAMPLES
from ..store import RANKS_ATTRS, named_inputs
from .comparisons import ap_variant, compare_encoders
from .constants import ALL_PAIRS_MAX, ALPHA, CONFIDENCE
from .pairs import PairCache
from .worst import is_worst_queries, worst_queries_of


def _check_options(
    *,
    cmc_max_rank: int,
    resamples: int,
    seed: int,
    by: str,
    worst_queries: int,
    worst_encoders: str,
    top_k: int,
) -> None:
    from .. import options

    options.CMC_MAX_RANK.check(cmc_max_rank)
    options.REPORT_RESAMPLES.check(resamples)
    options.SEED.check(seed)
    options.WORST_QUERIES.check(worst_queries)
    options.TOP_K.check(top_k)
    options.BY.check(by)
    options.WORST_ENCODERS.check(worst_encoders)


def _provenance(encoder_name: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The provenance summary of one result, from the metrics JSON's ``provenance``."""
    qe = raw.get("query_embeddings") or {}
    ge = raw.get("gallery_embeddings") or {}
    encoder = qe.get("encoder") if isinstance(qe.get("encoder"), dict) else {}
    return {
        "encoder": encoder_name,
        "encoder_kind": encoder.get("kind"),
        "encoder_options": encoder.get("options"),
        "checkpoint": qe.get("checkpoint"),
        "checkpoint_hash": qe.get("checkpoint_hash"),
        "manifest_hash": {"query": qe.get("manifest_hash"), "gallery": ge.get("manifest_hash")},
        "rankwise_version": qe.get("rankwise_version") or raw.get("rankwise_version"),
        "protocol": raw.get("protocol"),
        "distance": raw.get("distance"),
        "protocol_options": raw.get("protocol_options"),
        # id-keyed precomputed features: rows kept / dropped per split (on_missing)
        "id_alignment": {"query": qe.get("id_alignment"), "gallery": ge.get("id_alignment")},
        "ks": raw.get("ks"),
        "ap": raw.get("ap"),
        "files": {
            "ranks": raw.get("ranks"),
            "query_embeddings": qe.get("path"),
            "gallery_embeddings": ge.get("path"),
            "query_manifest": raw.get("query_manifest"),
            "gallery_manifest": raw.get("gallery_manifest"),
        },
        "raw": raw,
        # torch kinds record the preprocessing they applied (size, interpolation, mean/std,
        # channel order, flip, device); other kinds have none
        **({"preprocessing": qe["preprocessing"]} if qe.get("preprocessing") else {}),
    }


def _read_output(path: Path, command: str, key: str, table: dict[str, Field]) -> dict[str, Any]:
    """The JSON a ``rankwise <command> --output`` wrote, with its ``key`` object and the
    keys of ``table`` (:func:`rankwise.schema.check`); one line naming the file (and the
    key) and the command otherwise."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RankwiseError(
            f"{path}: cannot read the {command} file ({exc.strerror}); "
            f"run `rankwise {command}` first"
        ) from None
    except ValueError:
        raise RankwiseError(
            f"{path}: not a JSON file; pass the --output of `rankwise {command}`"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get(key), dict):
        raise RankwiseError(f"{path}: no '{key}' object; pass the --output of `rankwise {command}`")
    check(data, table, where=str(path), fix=f"pass the --output of `rankwise {command}`")
    return data


def _names(path: Path) -> tuple[str, str]:
    """``(dataset, encoder)`` of ``<dataset>/<encoder>.json``; the folder from the
    absolute path, so ``a.json`` given in its folder (or ``../x/a.json``) has one."""
    return Path(os.path.abspath(path)).parent.name, path.stem


#: A ``rankwise metrics`` JSON as the report reads it.  Only ``protocol`` and ``metrics``
#: are required (a file typed by hand, say a paper's numbers, is reported without
#: statistics); ``provenance`` holds the ranks store's attributes and the files read.
METRICS_JSON: dict[str, Field] = {
    "protocol": Field("string", required=True, choices=PROTOCOLS),
    "metrics": Field("object", required=True, each="number"),
    "distance": Field("string", nullable=True),
    "num_queries": Field("count", nullable=True),
    "num_skipped": Field("count", nullable=True),
    "num_gallery": Field("count", nullable=True),
    "embedding_dim": Field("count", nullable=True),
    "ap": Field("string", choices=AP.choices),
    "protocol_options": Field("object"),
    "provenance": Field("object", nullable=True),
    **optional(RANKS_ATTRS, "provenance.", nullable=True),
    "provenance.ks": Field("numbers", nullable=True),
    "provenance.ap": Field("string", nullable=True, choices=AP.choices),
    "provenance.ranks": Field("path", nullable=True),
    "provenance.stats": Field("path", nullable=True),
    "provenance.stats_key": Field("string", nullable=True),
}

#: A ``rankwise verify`` JSON as the report reads it.
VERIFICATION_JSON: dict[str, Field] = {
    "distance": Field("string", required=True, choices=DISTANCE.choices),
    "tpr@fpr": Field("object", required=True, each="number"),
    "threshold@fpr": Field("object", each="number"),
    "roc": Field("object", required=True),
    "roc.fpr": Field("numbers", required=True),
    "roc.tpr": Field("numbers", required=True, length=("roc.fpr", 0)),
    "histogram": Field("object", required=True),
    "histogram.edges": Field("numbers", required=True),
    "histogram.positive": Field("numbers", required=True, length=("histogram.edges", -1)),
    "histogram.negative": Field("numbers", required=True, length=("histogram.edges", -1)),
    "num_positive_pairs": Field("count", required=True),
    "num_negative_pairs": Field("count", required=True),
    "inputs": Field("object"),
    **{
        f"inputs.{side}_{what}": Field("path")
        for side in ("query", "gallery")
        for what in ("manifest", "embeddings")
    },
    "inputs.protocol": Field("string"),
    "inputs.junk_labels": Field("list"),
    "inputs.exclude_same_camera": Field("boolean"),
}


def _load(metrics_path: str | os.PathLike) -> dict[str, Any]:
    """The report entry of a metrics JSON (its statistics are filled in later)."""
    path = Path(metrics_path)
    data = _read_output(path, "metrics", "metrics", METRICS_JSON)
    raw = data.get("provenance") or {}
    dataset, encoder = _names(path)
    return {
        "dataset": dataset,
        "encoder": encoder,
        **{key: data.get(key) for key in REPORT_KEYS if key != "metrics"},
        "metrics": _metrics(path, data),
        "ci95": None,
        "cmc": None,
        "progressive": None,
        "worst_queries": None,
        "verification": None,
        "provenance": _provenance(encoder, raw),
        "source": str(path),
    }


def _metrics(path: Path, data: dict[str, Any]) -> dict[str, float]:
    """The ``metrics`` object of a metrics file under their canonical names (a file typed
    by hand may spell ``recall@01``: one column with ``recall@1``, not two); an unknown
    name, one metric given twice, a value that is no percentage (NaN, infinite, outside
    0..100), or none at all is one line naming the file."""
    metrics: dict[str, float] = {}
    given: dict[str, str] = {}
    for key, value in data["metrics"].items():
        try:
            name = canonical_metric(key, data["protocol"])
        except RankwiseError as exc:
            raise RankwiseError(f"{path}: metrics: {exc}") from None
        if name in metrics:
            raise RankwiseError(
                f"{path}: metrics {given[name]!r} and {key!r} are one metric ({name}); keep one"
            )
        number = float(value)
        if not 0.0 <= number <= 100.0:  # NaN too: it would be the best of every comparison
            raise RankwiseError(
                f"{path}: metrics: {key!r} is {number:g}; every metric is a percentage, "
                "a number from 0 to 100"
            )
        metrics[name], given[name] = number, key
    if not metrics:
        raise RankwiseError(
            f"{path}: the metrics object is empty; give at least one metric (e.g. "
            f"{get_protocol(data['protocol']).headline[0]}) or pass the --output of "
            "`rankwise metrics`"
        )
    return metrics


def _attach_verification(results: list[dict[str, Any]], paths) -> None:
    """Each ``rankwise verify`` JSON (``<dataset>/<encoder>.json``) joins the result of
    the same dataset and encoder, when it was computed from that result's embeddings."""
    by_key = {(r["dataset"], r["encoder"]): r for r in results}
    for item in paths:
        path = Path(item)
        data = _read_output(path, "verify", "tpr@fpr", VERIFICATION_JSON)
        key = _names(path)
        entry = by_key.get(key)
        if entry is None:
            raise RankwiseError(
                f"{path}: no metrics file of dataset {key[0]!r} x encoder {key[1]!r} is "
                "given; name it <dataset>/<encoder>.json like the metrics file it belongs to"
            )
        files = entry["provenance"]["files"]
        for split in ("query_embeddings", "gallery_embeddings"):
            mine, theirs = (data.get("inputs") or {}).get(split), files.get(split)
            if mine and theirs and os.path.abspath(mine) != os.path.abspath(theirs):
                raise RankwiseError(
                    f"{path}: computed from {split} {mine}, but {entry['source']} from "
                    f"{theirs}; run `rankwise verify` on the same embeddings"
                )
        if data.get("distance") not in (None, entry["distance"]):
            raise RankwiseError(
                f"{path}: distance {data.get('distance')!r}, but {entry['source']} ranks by "
                f"{entry['distance']!r}; run `rankwise verify --distance {entry['distance']}`"
            )
        entry["verification"] = data


#: The keys `rankwise metrics` adds to a ranks store's attributes in its JSON's provenance.
_METRICS_KEYS = ("ks", "ap", "ranks", "stats", "stats_key")


def _candidates(raw: dict[str, Any], path: str | None, near: str | None = None) -> list[str]:
    """Where a relative path a metrics file names (its ranks store, its statistics
    summary) may be: from the current folder (as written: a copy of the results read
    there, a broken file there refused), then from the folder of ``near`` (the metrics
    file) and each folder above it (a report run from another folder, also on a moved
    project's metrics files), then from the folder its evaluation ran in (the ranks
    store's ``working_directory``, which the metrics file records: metrics files copied
    away from their project); :func:`rankwise.store.named_paths`."""
    if not path:
        return []
    from ..store import named_paths

    return named_paths(raw, path, first="", near=near)


class _Stores:
    """The ranks stores the entries' provenance names, read on first use (most reports
    read none: the statistics come from the metrics jobs' summaries).  A relative path is
    looked for where :func:`_candidates` looks (here, the metrics file's folder and those
    above it, the folder the evaluation ran in: a report run from another folder finds
    the pipeline's stores).  A store whose attributes differ from the provenance the
    metrics JSON recorded (another folder's store of the same name, or a store ranked
    again since) is not the entry's: it is never read for it."""

    def __init__(self) -> None:
        self._read: dict[str, Any] = {}
        self._differs: dict[tuple[str, str], str | None] = {}
        # entry's source -> (the folder it was found from, ``""`` here; :meth:`path`)
        self._found: dict[str, tuple[str | None, str | None]] = {}

    def _differs_at(self, path: str, entry: dict[str, Any]) -> str | None:
        """The first attribute in which the store at ``path`` disagrees with the entry's
        metrics JSON (``None``: it agrees, or it cannot be read, which reading it
        reports)."""
        import zarr

        key = (str(path), str(entry.get("source")))
        if key not in self._differs:
            raw = entry["provenance"]["raw"]
            try:
                attrs = dict(zarr.open_group(str(path), mode="r").attrs)
            except Exception:  # not a readable store: read_ranks says so in one line
                attrs = {}
            # the store's format is read_ranks' to check (a bad one: refused in one line)
            skip = {*_METRICS_KEYS, "complete", "kind", "rankwise_format"}
            shared = sorted(set(raw) & set(attrs) - skip)
            self._differs[key] = next((k for k in shared if raw[k] != attrs[k]), None)
        return self._differs[key]

    def _find(self, entry: dict[str, Any]) -> tuple[str | None, str | None]:
        """``(folder, path)`` of the entry's ranks store: the first candidate that is a
        store agreeing with its provenance, else the first that is a folder (its reader
        or :meth:`differs` says what is wrong), and the folder it was found from; else
        ``(None, the path as written)``, as for an absolute path.  Once per entry."""
        source = str(entry.get("source"))
        if source not in self._found:
            from ..store import search_folders

            given = entry["provenance"]["files"]["ranks"]
            raw = entry["provenance"]["raw"]
            if not given or os.path.isabs(given):
                found = [(None, given)] if given and Path(given).is_dir() else []
            else:  # where _candidates(raw, given, source) looks, with each folder
                folders = search_folders(raw, "", entry.get("source"))
                found = [(f, c) for f in folders if Path(c := os.path.join(f, given)).is_dir()]
            agreeing = [fc for fc in found if self._differs_at(fc[1], entry) is None]
            self._found[source] = (agreeing or found or [(None, given)])[0]
        return self._found[source]

    def path(self, entry: dict[str, Any]) -> str | None:
        """The entry's ranks store (:meth:`_find`)."""
        return self._find(entry)[1]

    def folder(self, entry: dict[str, Any]) -> str | None:
        """The folder (``""``: here) from which :meth:`path` found the entry's ranks
        store; None when it is not found or its path is absolute."""
        return self._find(entry)[0]

    def differs(self, entry: dict[str, Any]) -> str | None:
        """:meth:`_differs_at` of the store :meth:`path` found (``None`` also when there
        is none)."""
        path = self.path(entry)
        return self._differs_at(path, entry) if path and Path(path).is_dir() else None

    def exists(self, entry: dict[str, Any]) -> bool:
        path = self.path(entry)
        return bool(path) and Path(path).is_dir() and self.differs(entry) is None

    def get(self, entry: dict[str, Any]):
        """``(arrays, attrs)`` of the entry's ranks store, or ``None`` when it is not there."""
        from ..store import read_ranks

        if not self.exists(entry):
            return None
        path = self.path(entry)
        if path not in self._read:
            self._read[path] = read_ranks(path)
        return self._read[path]


def _summary(entry: dict[str, Any], settings: dict[str, Any], stores: _Stores):
    """The entry's statistics: the summary its metrics job wrote, when it was computed
    for these settings and is still the one the metrics JSON names (its ``stats_key``:
    a later run may have written another evaluation's summary to the same path), else
    computed from its ranks store (``None`` without one)."""
    from ..summary import OldSummary, read_summary, summarise

    wanted = {**settings, "metrics": list(entry["metrics"]), "ap": ap_variant(entry)}
    raw = entry["provenance"]["raw"]
    key = raw.get("stats_key")
    for path in _candidates(raw, raw.get("stats"), entry.get("source")) if key else []:
        if not Path(path).is_file():
            continue
        try:
            summary = read_summary(path)
        except OldSummary:
            continue
        if summary.matches(wanted) and summary.key == key:
            return summary
    store = stores.get(entry)
    if store is None:
        return None
    labels = None
    if wanted.get("by") == "identity":  # the query manifest, found as the worst queries' are
        from ..store import ranked_manifest

        near = entry.get("source")
        labels = ranked_manifest(store[1], "query", stores.folder(entry), near)
    return summarise(*store, **wanted, labels=labels)


def _why_no_statistics(entry: dict[str, Any], stores: _Stores) -> str:
    """Why :func:`_summary` found no statistics for ``entry`` (the paths as its metrics
    JSON names them)."""
    ranks = entry["provenance"]["files"]["ranks"]
    where = f"ranks store {ranks} not found" if ranks else "its provenance names no ranks store"
    found = stores.path(entry)
    if found and Path(found).is_dir() and stores.differs(entry) is not None:
        where = (
            f"ranks store {ranks} (from {os.path.abspath(found)}) is not the one it was "
            f"computed from (its {stores.differs(entry)!r} differs): run the report from "
            "the folder `rankwise metrics` ran in, or `rankwise metrics` on that store again"
        )
    raw = entry["provenance"]["raw"]
    stats = raw.get("stats")
    if any(Path(path).is_file() for path in _candidates(raw, stats, entry.get("source"))):
        return f"statistics summary {stats} computed for other settings or by another run, {where}"
    return where


def _stamp(path) -> list | None:
    """``[path, real path, size, mtime_ns]`` of a file or folder (``None`` when there is
    none): the path as given decides the image paths a report shows, the real one which
    file it is from wherever the report runs."""
    if not path:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [str(path), os.path.realpath(path), stat.st_size, stat.st_mtime_ns]


def _worst(entry, summary, stores: _Stores, cache: PairCache | None, *, n: int, top_k: int):
    """The entry's worst queries (:func:`.worst.worst_queries_of`), kept in ``cache``
    under its ranks store's attributes (which name the embeddings' checkpoint hash,
    encoder options and manifests' hashes), its per-unit values, and the paths (as read
    and real), sizes and modification times of the manifests and embedding stores it
    reads."""

    # the folder the ranks store agreeing with the entry was found from: its manifests
    # and embeddings too, not the folder it was ranked in, nor another project's folder
    # holding a store of the same name (a copied project's report showed the images of
    # the project it was run from)
    raw = entry["provenance"]["raw"]
    near = entry.get("source")  # the metrics file: a moved project's, from a third folder
    first = stores.folder(entry)

    def compute():
        store = stores.get(entry)
        assert store is not None
        return worst_queries_of(
            *store, n=n, top_k=top_k, ap=ap_variant(entry), first=first, near=near
        )

    if cache is None or summary is None:
        return compute()
    # the files the computation reads, where it finds them (store.named_inputs)
    stamps = [_stamp(path) if path else None for path in named_inputs(raw, first, near)]
    key = {
        "attrs": raw,
        # the ids, labels and nearest items come from the manifests and embedding stores:
        # one written again (even one whose ranks came out the same), edited, moved or
        # gone is a new key (the manifests' were missing: an edited one kept old ids,
        # where a cold run refused the stores encoded from the old one)
        "stores": stamps[2:],
        "manifests": stamps[:2],
        "units": summary.key,
        "n": n,
        "top_k": top_k,
        "ap": ap_variant(entry),
    }
    return cache.remember("worst_queries", key, compute, usable=is_worst_queries)


def headline_names(entries: list[dict[str, Any]]) -> list[str]:
    """The overview metrics of a dataset's entries: its protocol's ``headline`` metrics
    that every entry computed (else the first metric they all have); the first one picks
    the best encoder.  Only metrics every entry has: one entry without ``recall@1`` (other
    ``--ks``) would otherwise rank last by it, and the best would depend on the order
    the files were given."""
    first = entries[0]["metrics"]
    common = [n for n in first if all(n in e["metrics"] for e in entries[1:])]
    names = [n for n in get_protocol(entries[0]["protocol"]).headline if n in common]
    return names or common[:1] or list(first)[:1]


def best_index(entries: list[dict[str, Any]]) -> int:
    """Index of the best entry: the highest first headline metric, ties broken by the next
    headline metrics (re-ID: rank1, then mAP), the first given only when all are equal --
    a tie on rank-1 (common: 100 on easy data) no longer follows the order of the files."""
    names = headline_names(entries)

    def key(i: int) -> tuple:
        return (*(entries[i]["metrics"].get(n, -np.inf) for n in names), -i)

    return max(range(len(entries)), key=key)


def best_encoder(entries: list[dict[str, Any]]) -> str:
    """The encoder of :func:`best_index`."""
    return entries[best_index(entries)]["encoder"]


def _best(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The best checkpoint of one dataset (:func:`best_index`), by its first headline metric."""
    name = best_encoder(entries)
    entry = next(e for e in entries if e["encoder"] == name)
    metric = (headline_names(entries) or [""])[0]
    return {
        "dataset": entry["dataset"],
        "encoder": name,
        "checkpoint": entry["provenance"]["checkpoint"],
        "metric": metric,
        "value": entry["metrics"].get(metric),
    }


def build_report(
    metrics_paths: Iterable[str | os.PathLike],
    *,
    title: str = "rankwise report",
    cmc_max_rank: int = 50,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    by: str = "query",
    worst_queries: int = 5,
    worst_encoders: str = "best",
    top_k: int = 10,
    cache: PairCache | None = None,
    verification: Iterable[str | os.PathLike] = (),
    on_statistics: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The report document (what ``report.json`` holds) for the given metrics files.

    Parameters
    ----------
    metrics_paths : ``rankwise metrics`` JSON files, ``<dataset>/<encoder>.json``.
    title : the heading.
    cmc_max_rank : CMC curves cover ranks 1..cmc_max_rank.
    resamples, seed, by : the bootstrap and sign-flip tests (:mod:`rankwise.stats`);
        ``resamples=0`` leaves out every interval and comparison.
    worst_queries : how many worst queries to list per dataset x shown encoder (0: none).
    worst_encoders : ``"best"`` (the best encoder of each dataset) or ``"all"``.
    top_k : gallery items shown per worst query.
    cache : keeps each paired test (:class:`.pairs.PairCache`, e.g. on a folder), so a
        report with one new encoder recomputes only the pairs that involve it; it
        counts what it computed, extended and reused.
    verification : ``rankwise verify`` JSON files, ``<dataset>/<encoder>.json``: each
        joins the result of that dataset and encoder (``entry["verification"]``).
    on_statistics : called with the document so far once every result has its metrics,
        intervals and curves, before the worst queries and the paired tests are added
        (the slow part): all a chart reads (:func:`.plots.dataset_plots`), the
        document's ``statistics`` as far as the settings (``confidence``). The document
        returned is that object, completed. :func:`.write_report` starts drawing the
        paper figures there.

    Datasets and encoders keep the order in which they first appear.
    """
    _check_options(
        cmc_max_rank=cmc_max_rank,
        resamples=resamples,
        seed=seed,
        by=by,
        worst_queries=worst_queries,
        worst_encoders=worst_encoders,
        top_k=top_k,
    )
    results = [_load(p) for p in metrics_paths]
    if not results:
        raise RankwiseError(
            "no metrics files given; pass the JSON files written by "
            "`rankwise metrics` (e.g. results/metrics/*/*.json)"
        )
    seen: dict[tuple[str, str], str] = {}
    for entry in results:
        key = (entry["dataset"], entry["encoder"])
        if key in seen:
            raise RankwiseError(
                f"{entry['source']}: dataset {key[0]!r} x encoder {key[1]!r} "
                f"is also given by {seen[key]}; pass each pair once"
            )
        seen[key] = entry["source"]
    _attach_verification(results, verification)
    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    encoders = list(dict.fromkeys(r["encoder"] for r in results))
    groups = [(d, [r for r in results if r["dataset"] == d]) for d in datasets]
    settings = {
        "resamples": resamples,
        "seed": seed,
        "by": by,
        "confidence": CONFIDENCE,
        "cmc_max_rank": cmc_max_rank,
    }
    stores = _Stores()
    summaries = {}
    for entry in results:
        summary = _summary(entry, settings, stores)
        summaries[entry["dataset"], entry["encoder"]] = summary
        if summary is None:
            continue
        entry["cmc"] = summary.cmc
        entry["ci95"] = summary.ci95
        if get_protocol(entry["protocol"]).unit == "sketch":
            entry["progressive"] = summary.progressive
    doc: dict[str, Any] = {
        "title": title,
        "rankwise_version": __version__,
        "cmc_max_rank": cmc_max_rank,
        "statistics": {k: settings[k] for k in ("resamples", "seed", "by", "confidence")},
        "datasets": datasets,
        "encoders": encoders,
        "results": results,
    }
    if on_statistics is not None:
        on_statistics(doc)
    if worst_queries:
        for _, entries in groups:
            shown = [e for e in entries if stores.exists(e)]
            if shown and worst_encoders == "best":
                shown = [e for e in shown if e["encoder"] == best_encoder(shown)]
            for entry in shown:
                entry["worst_queries"] = _worst(
                    entry,
                    summaries[entry["dataset"], entry["encoder"]],
                    stores,
                    cache,
                    n=worst_queries,
                    top_k=top_k,
                )
    # tested against the others beyond ALL_PAIRS_MAX encoders: the best of the evaluations
    # that have statistics (a best without them, e.g. a hand-written metrics file, can be
    # in no test, and the next best stands in for it)
    tested_best = {
        dataset: best_encoder(tested)
        for dataset, entries in groups
        if (tested := [e for e in entries if summaries[dataset, e["encoder"]] is not None])
    }
    comparisons, n_test, not_compared = (
        compare_encoders(
            groups,
            summaries,
            resamples=resamples,
            seed=seed,
            by=by,
            best=tested_best,
            cache=cache,
        )
        if resamples
        else ([], 0, [])
    )
    statistics = {
        "resamples": resamples,
        "seed": seed,
        "by": by,
        "confidence": CONFIDENCE,
        "interval": "percentile bootstrap",
        "test": "paired sign-flip",
        "flip_resamples": n_test,
        "correction": "holm",
        "alpha": ALPHA,
        "num_tests": len(comparisons),
        # pairs of one dataset left untested: their evaluated queries differ
        "not_compared": not_compared,
        # evaluations with no summary or ranks store to read: no intervals, CMC, tests
        # or worst queries (the renderers say so, and claim no intervals for them)
        "without_statistics": [
            {
                "dataset": e["dataset"],
                "encoder": e["encoder"],
                "reason": _why_no_statistics(e, stores),
            }
            for e in results
            if summaries[e["dataset"], e["encoder"]] is None
        ],
        "pairs": f"all pairs up to {ALL_PAIRS_MAX} encoders per dataset, "
        "else each against the previous one and the best (of those with statistics) "
        "against the others",
    }
    doc["statistics"] = statistics  # in its place: report.json keeps its key order
    doc["comparisons"] = comparisons
    doc["best"] = [_best(entries) for _, entries in groups]
    return doc
