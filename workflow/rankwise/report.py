"""The comparison report: every dataset x encoder, with intervals and tests, as HTML,
Markdown and JSON.

Inputs are the JSON files written by ``rankwise metrics`` (one per dataset x encoder).
Each holds the numbers and a ``provenance`` dict (the ranks store's attributes, with
the embedding stores' attributes under ``query_embeddings`` / ``gallery_embeddings``
and the ranks store's path under ``ranks``).  Names come from the pipeline layout
``.../metrics/<dataset>/<encoder>.json``: the folder is the dataset, the file stem
the encoder.  Datasets and encoders keep the order in which they are given (the
pipeline gives them in config order, so a series of checkpoints reads as epochs).

Everything else is read from the ranks store (and, for the worst queries, the
manifests and embedding stores) that the provenance names; paths are relative to
the folder the pipeline runs in.  Per dataset x encoder the report holds:

- the metrics and, for each, its 95% interval ``ci95`` (percentile bootstrap of the
  per-query values, :func:`rankwise.stats.metric_cis`; ``resamples`` resamples of
  queries or of identities (``by``), seeded by ``seed``);
- the CMC curve (percentage of queries whose first relevant item is at rank <= k,
  k = 1..``cmc_max_rank``; for ``progressive`` over each sketch's complete rendering,
  the curve of ``acc@K``);
- for ``progressive``, the target's mean reciprocal rank against sketch completion
  (step t of T, as t / T in percent) with its interval;
- the worst queries (lowest AP; lowest m@B per sketch for ``progressive``) of the
  best encoder of each dataset (or of every encoder) with their top-k valid gallery
  items (:func:`rankwise.neighbours.top_items`).

And across encoders: paired comparisons (:func:`rankwise.stats.compare_ranks`) on
every metric, of every pair of encoders of a dataset when it has at most
``ALL_PAIRS_MAX`` of them, else of each encoder against the dataset's first one;
p-values from the paired sign-flip test, adjusted by Holm across every comparison in
the report; ``significant`` means ``p_holm < ALPHA``.  The tests (and the intervals
of the differences) use :func:`flip_resamples` resamples: at least ``resamples``, and
enough that the smallest Monte Carlo p-value can survive Holm's correction.

Outputs, all rendered from one document (:func:`build_report`):

- JSON: the document (every metric, ``ci95``, CMC, curves, worst queries, provenance,
  and the top-level ``comparisons`` list).
- Markdown: per dataset the metrics with intervals, the differences, CMC, worst
  queries (ids) and provenance.
- HTML: one self-contained file (inline CSS, plots and thumbnails as base64 PNG, no
  external link); long sections are collapsed (``<details>``).

Nothing in the output depends on the time or the machine: the same inputs and
options give the same bytes.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from . import __version__
from .errors import RankwiseError
from .registry import REGISTRY, get_protocol
from .stats import DEFAULT_RESAMPLES

#: The metric shown in the overview table (and that picks the "best" encoder), per protocol.
HEADLINE = {name: spec.headline[0] for name, spec in REGISTRY.items()}
#: Ranks listed in the Markdown CMC table.
CMC_TABLE_RANKS = (1, 5, 10, 20, 50)
#: A comparison is marked significant when its Holm-adjusted p-value is below this.
ALPHA = 0.05
#: Up to this many encoders in a dataset, every pair is compared; beyond, each to the first.
ALL_PAIRS_MAX = 4
#: Whose worst queries are listed: the best encoder of each dataset, or every encoder.
WORST_ENCODERS = ("best", "all")
#: Confidence of every interval in the report (the JSON key is ``ci95``).
CONFIDENCE = 0.95
#: The per-unit metric that ranks the worst queries, and its name in the document.
_WORST_METRIC = {"query": "map", "sketch": "m@B"}
_WORST_SCORE = {"query": "ap", "sketch": "m@B"}
#: Thumbnails fit in a square of this many pixels.
THUMBNAIL_PX = 64


# ---------------------------------------------------------------- options

def _check_options(*, cmc_max_rank: int, resamples: int, seed: int, by: str,
                   worst_queries: int, worst_encoders: str, top_k: int) -> None:
    from .stats import BY

    def integer_at_least(value, minimum):
        return not isinstance(value, bool) and isinstance(value, (int, np.integer)) \
            and value >= minimum

    checks = [(cmc_max_rank, 1, "--cmc-max-rank", "at least 1"),
              (resamples, 0, "--resamples", "a non-negative integer (0: no intervals or "
                                                "tests)"),
              (seed, 0, "--seed", "a non-negative integer"),
              (worst_queries, 0, "--worst-queries", "a non-negative integer (0: none)"),
              (top_k, 1, "--top-k", "at least 1")]
    for value, minimum, name, what in checks:
        if not integer_at_least(value, minimum):
            raise RankwiseError(f"{name} must be {what}, got {value!r}")
    if by not in BY:
        raise RankwiseError(f"--by must be one of {', '.join(BY)}, got {by!r}")
    if worst_encoders not in WORST_ENCODERS:
        raise RankwiseError(f"--worst-encoders must be one of {', '.join(WORST_ENCODERS)}, "
                            f"got {worst_encoders!r}")


# ---------------------------------------------------------------- reading

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
    from .metrics import cmc
    from .store import read_ranks

    arrays, attrs = read_ranks(ranks_store)
    return cmc(arrays, attrs, max_rank)


def _short(digest: Any, n: int = 12) -> str:
    return str(digest)[:n] if digest else "-"


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
        "ks": raw.get("ks"),
        "ap": raw.get("ap"),
        "files": {"ranks": raw.get("ranks"), "query_embeddings": qe.get("path"),
                  "gallery_embeddings": ge.get("path"),
                  "query_manifest": raw.get("query_manifest"),
                  "gallery_manifest": raw.get("gallery_manifest")},
        "raw": raw,
    }


def _load(metrics_path: str | os.PathLike, cmc_max_rank: int):
    """``(entry, store)``: the report entry of a metrics JSON and its ranks store
    ``(arrays, attrs)`` (``None`` when the store it names is not there)."""
    from .metrics import cmc
    from .store import read_ranks

    path = Path(metrics_path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RankwiseError(f"{path}: cannot read the metrics file ({exc.strerror}); run "
                            "`rankwise metrics` first") from None
    except ValueError:
        raise RankwiseError(f"{path}: not a JSON file; pass the --output of "
                            "`rankwise metrics`") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise RankwiseError(f"{path}: no 'metrics' object; pass the --output of "
                            "`rankwise metrics`")
    raw = data.get("provenance") or {}
    ranks = raw.get("ranks")
    store = read_ranks(ranks) if ranks and Path(ranks).is_dir() else None
    entry = {
        "dataset": path.parent.name,
        "encoder": path.stem,
        **{key: data.get(key) for key in ("protocol", "distance", "num_queries", "num_skipped",
                                          "num_gallery", "embedding_dim")},
        "metrics": {k: float(v) for k, v in data["metrics"].items()},
        "ci95": None,
        "cmc": cmc(*store, cmc_max_rank) if store else None,
        "progressive": None,
        "worst_queries": None,
        "provenance": _provenance(path.stem, raw),
        "source": str(path),
    }
    return entry, store


# ---------------------------------------------------------------- statistics

def comparison_pairs(encoders: list[str]) -> list[tuple[str, str]]:
    """The ``(a, b)`` pairs compared on one dataset, ``b`` tested against ``a``.

    Every pair (in the given order) for at most :data:`ALL_PAIRS_MAX` encoders, else
    each encoder against the first one.
    """
    if len(encoders) <= ALL_PAIRS_MAX:
        return [(a, b) for i, a in enumerate(encoders) for b in encoders[i + 1:]]
    return [(encoders[0], b) for b in encoders[1:]]


def _ap_variant(entry: dict[str, Any]) -> str:
    return entry["provenance"]["ap"] or "standard"


def flip_resamples(resamples: int, num_tests: int) -> int:
    """Resamples (sign flips) of the paired tests: at least ``resamples``, and enough that
    the smallest Monte Carlo p-value, ``1 / (n + 1)``, survives Holm's correction over
    ``num_tests`` tests ten times over: ``n >= 10 num_tests / ALPHA`` (rounded up to
    a multiple of 1000)."""
    needed = -(-int(np.ceil(10 * num_tests / ALPHA)) // 1000) * 1000
    return max(int(resamples), needed)


def _comparisons(groups, stores, *, resamples: int, seed: int, by: str
                 ) -> tuple[list[dict], int]:
    """Every paired comparison, Holm-adjusted together (see the module docstring), and
    the resamples they used (:func:`flip_resamples`)."""
    from .stats import compare_ranks, with_holm

    plan = []
    for dataset, entries in groups:
        by_name = {e["encoder"]: e for e in entries
                   if stores[dataset, e["encoder"]] is not None}
        for a, b in comparison_pairs(list(by_name)):
            if _ap_variant(by_name[a]) != _ap_variant(by_name[b]):
                raise RankwiseError(f"{by_name[b]['source']}: AP variant "
                                    f"{_ap_variant(by_name[b])!r} differs from {a}'s "
                                    f"{_ap_variant(by_name[a])!r} on dataset {dataset!r}; "
                                    "score both with the same --ap")
            names = [n for n in by_name[a]["metrics"] if n in by_name[b]["metrics"]]
            plan.append((dataset, a, b, names, _ap_variant(by_name[a])))
    n_resamples = flip_resamples(resamples, sum(len(p[3]) for p in plan))
    rows = []
    for dataset, a, b, names, ap in plan:
        rows += compare_ranks(*stores[dataset, a], *stores[dataset, b], metrics=names, ap=ap,
                              resamples=n_resamples, seed=seed, by=by, confidence=CONFIDENCE,
                              dataset=dataset, names=(a, b))
    return [{"dataset": row["dataset"], "metric": row["metric"],
             "a": row["encoder_a"], "b": row["encoder_b"],
             "value_a": row["a"], "value_b": row["b"], "diff": row["diff"],
             "ci95": row["ci95"], "p_value": row["p_value"], "p_holm": row["p_holm"],
             "significant": bool(row["p_holm"] < ALPHA), "test": row["test"], "by": row["by"],
             "num_units": row["num_units"], "num_clusters": row["num_clusters"]}
            for row in with_holm(rows)], n_resamples


def progressive_curve(arrays: dict[str, np.ndarray], attrs: dict, *,
                      resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> dict[str, list]:
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
    from .metrics import completion_curve, completion_levels
    from .stats import bootstrap_ci

    out = completion_curve(arrays)
    out["ci95"] = [[100.0 * x for x in bootstrap_ci(
        1.0 / r, clusters=sketch, resamples=resamples, seed=seed, confidence=CONFIDENCE)]
        if resamples else None for _, r, sketch in completion_levels(arrays)]
    return out


def _manifest_or_none(path, protocol: str, role: str):
    from .manifest import read_manifest

    if not path or not Path(path).is_file():
        return None
    return read_manifest(path, protocol=protocol, role=role)


def _item(table, row: int, folder: Path | None) -> dict[str, Any]:
    """id, label and image path of one manifest row (``row`` alone without a manifest)."""
    if table is None:
        return {"id": f"row {row}", "label": None, "image": None}
    record = table.iloc[row]
    image = record.get("path") if "path" in table.columns else None
    return {"id": str(record["id"]), "label": str(record["label"]),
            "image": str(folder / image) if image else None}


def worst_queries_of(arrays: dict[str, np.ndarray], attrs: dict, *, n: int = 5, top_k: int = 10,
                  ap: str = "standard") -> dict[str, Any]:
    """The ``n`` evaluated queries with the lowest score, and their top-``top_k`` items.

    The score is AP (``ap`` variant) per query; for ``progressive``, m@B per sketch, the
    sketch being shown by its complete rendering.  Ties go to the lower manifest row.
    The top items need the manifests and embedding stores the ranks store names
    (``query_manifest``..., ``query_embeddings.path``...); without them ``top`` is
    ``None`` and ids are manifest rows.

    Returns
    -------
    ``{"score": "ap" | "m@B", "queries": [...]}``, each query: ``query_index`` (manifest
    row), ``id``, ``label``, ``image`` (its path or ``None``), ``score`` (percent),
    ``rank`` (first relevant rank; the target's rank at the complete rendering for
    ``progressive``), ``num_relevant``, ``sketch`` (progressive), ``top`` (list of
    ``{"rank", "gallery_index", "id", "label", "image", "relevant"}``).
    """
    from .metrics import per_unit
    from .neighbours import top_items

    protocol = attrs["protocol"]
    table = per_unit(arrays, attrs, [_WORST_METRIC[get_protocol(protocol).unit]], ap=ap)
    name = _WORST_SCORE[table.unit]
    rows, score, rank = table.last_rows, table.values[:, 0], table.rank
    relevant = table.num_relevant
    pick = np.lexsort((rows, score))[:n]
    q_path, g_path = attrs.get("query_manifest"), attrs.get("gallery_manifest")
    q_table = _manifest_or_none(q_path, protocol, "query")
    g_table = _manifest_or_none(g_path, protocol, "gallery")
    embeddings = [(attrs.get(f"{side}_embeddings") or {}).get("path")
                  for side in ("query", "gallery")]
    tops = None
    if q_table is not None and g_table is not None and all(
            p and Path(p).exists() for p in embeddings):
        options = attrs.get("protocol_options") or {}
        tops = top_items(q_path, g_path, *embeddings, rows[pick], protocol=protocol,
                         distance=attrs.get("distance", "cosine"), k=top_k,
                         gap_frames=int(options.get("gap_frames", 1)),
                         junk_labels=tuple(options.get("junk_labels", ("-1",))))
    q_folder = Path(q_path).parent if q_table is not None else None
    g_folder = Path(g_path).parent if g_table is not None else None
    queries = []
    for n_, i in enumerate(pick):
        row = int(rows[i])
        entry = {"query_index": row, **_item(q_table, row, q_folder),
                 "score": 100.0 * float(score[i]), "rank": int(rank[i]),
                 "num_relevant": int(relevant[i])}
        if table.unit == "sketch" and q_table is not None:
            entry["sketch"] = str(q_table.iloc[row]["sketch"])
        entry["top"] = None if tops is None else [
            {"rank": j + 1, "gallery_index": int(g), **_item(g_table, int(g), g_folder),
             "relevant": bool(rel)}
            for j, (g, rel) in enumerate(zip(tops[n_]["gallery_index"], tops[n_]["relevant"]))]
        queries.append(entry)
    return {"score": name, "queries": queries}


def _headline_name(entries: list[dict[str, Any]]) -> str:
    name = HEADLINE.get(entries[0]["protocol"])
    return name if name in entries[0]["metrics"] else next(iter(entries[0]["metrics"]), "")


def _best_encoder(entries: list[dict[str, Any]]) -> str:
    """The encoder with the highest headline metric (the first one on ties)."""
    name = _headline_name(entries)
    values = [e["metrics"].get(name, -np.inf) for e in entries]
    return entries[int(np.argmax(values))]["encoder"]


# ---------------------------------------------------------------- document

def build_report(metrics_paths: Iterable[str | os.PathLike], *, title: str = "rankwise report",
                 cmc_max_rank: int = 50, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                 by: str = "query", worst_queries: int = 5, worst_encoders: str = "best",
                 top_k: int = 10) -> dict[str, Any]:
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

    Datasets and encoders keep the order in which they first appear.
    """
    from .stats import metric_cis

    _check_options(cmc_max_rank=cmc_max_rank, resamples=resamples, seed=seed, by=by,
                   worst_queries=worst_queries, worst_encoders=worst_encoders, top_k=top_k)
    loaded = [_load(p, cmc_max_rank) for p in metrics_paths]
    if not loaded:
        raise RankwiseError("no metrics files given; pass the JSON files written by "
                            "`rankwise metrics` (e.g. results/metrics/*/*.json)")
    results = [entry for entry, _ in loaded]
    stores: dict[tuple[str, str], Any] = {}
    seen: dict[tuple[str, str], str] = {}
    for entry, store in loaded:
        key = (entry["dataset"], entry["encoder"])
        if key in seen:
            raise RankwiseError(f"{entry['source']}: dataset {key[0]!r} x encoder {key[1]!r} "
                                f"is also given by {seen[key]}; pass each pair once")
        seen[key], stores[key] = entry["source"], store
    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    encoders = list(dict.fromkeys(r["encoder"] for r in results))
    groups = [(d, [r for r in results if r["dataset"] == d]) for d in datasets]
    for entry in results:
        store = stores[entry["dataset"], entry["encoder"]]
        if store is None:
            continue
        if resamples:
            entry["ci95"] = metric_cis(*store, metrics=list(entry["metrics"]),
                                       ap=_ap_variant(entry), resamples=resamples, seed=seed,
                                       by=by, confidence=CONFIDENCE)
        if get_protocol(entry["protocol"]).unit == "sketch":
            entry["progressive"] = progressive_curve(*store, resamples=resamples, seed=seed)
    if worst_queries:
        for _, entries in groups:
            shown = [e for e in entries if stores[e["dataset"], e["encoder"]] is not None]
            if shown and worst_encoders == "best":
                shown = [e for e in shown if e["encoder"] == _best_encoder(shown)]
            for entry in shown:
                entry["worst_queries"] = worst_queries_of(
                    *stores[entry["dataset"], entry["encoder"]], n=worst_queries, top_k=top_k,
                    ap=_ap_variant(entry))
    comparisons, n_test = _comparisons(groups, stores, resamples=resamples, seed=seed,
                                       by=by) if resamples else ([], 0)
    statistics = {"resamples": resamples, "seed": seed, "by": by, "confidence": CONFIDENCE,
                  "interval": "percentile bootstrap", "test": "paired sign-flip",
                  "flip_resamples": n_test,
                  "correction": "holm", "alpha": ALPHA, "num_tests": len(comparisons),
                  "pairs": f"all pairs up to {ALL_PAIRS_MAX} encoders per dataset, "
                           "else each against the first"}
    return {"title": title, "rankwise_version": __version__, "cmc_max_rank": cmc_max_rank,
            "statistics": statistics, "datasets": datasets, "encoders": encoders,
            "results": results, "comparisons": comparisons}


def _by_dataset(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(d, [r for r in doc["results"] if r["dataset"] == d]) for d in doc["datasets"]]


def _metric_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(name for r in rows for name in r["metrics"]))


def _best(rows: list[dict[str, Any]], name: str) -> float | None:
    values = [r["metrics"][name] for r in rows if name in r["metrics"]]
    return max(values) if len(values) > 1 else None


def _ci(entry: dict[str, Any], name: str) -> list[float] | None:
    return (entry.get("ci95") or {}).get(name)


def _dataset_comparisons(doc: dict[str, Any], dataset: str) -> list[dict[str, Any]]:
    return [c for c in doc["comparisons"] if c["dataset"] == dataset]


def _pairs(comparisons: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((c["a"], c["b"]) for c in comparisons))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt_ci(ci: list[float] | None) -> str:
    return "" if ci is None else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def _fmt_diff(value: float) -> str:
    return f"{value:+.2f}".replace("-", "\u2212")


def _stats_sentence(doc: dict[str, Any]) -> str:
    s = doc["statistics"]
    if not s["resamples"]:
        return "No intervals or tests (resamples = 0)."
    unit, units = ("identity", "identities") if s["by"] == "identity" else ("query", "queries")
    return (f"Intervals: 95% percentile bootstrap, {s['resamples']} resamples by {unit}, "
            f"seed {s['seed']}. Differences: paired sign-flip test ({s['flip_resamples']} "
            f"random sign flips; every flip with at most 16 {units}), Holm-adjusted over all "
            f"{s['num_tests']} tests in this report; significant when p(Holm) < {s['alpha']:g}.")


_SCORE_NAMES = {"ap": "AP", "m@B": "m@B"}
_RANK_NAMES = {"ap": "first match at rank {}", "m@B": "complete sketch: target at rank {}"}


def _worst_caption(entry: dict[str, Any]) -> str:
    worst = entry["worst_queries"]
    what = "sketches (lowest m@B)" if worst["score"] == "m@B" else "queries (lowest AP)"
    return f"Worst {len(worst['queries'])} {what} of {entry['encoder']}"


# ---------------------------------------------------------------- markdown

def _md_table(header: list[str], rows: list[list[str]], align: str = "r") -> str:
    rule = ["---"] + [("---:" if align == "r" else "---")] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|")


def _md_value(entry: dict[str, Any] | None, name: str, best: float | None) -> str:
    value = entry["metrics"].get(name) if entry else None
    cell = _fmt(value)
    if value is not None and value == best:
        cell = f"**{cell}**"
    ci = _ci(entry, name) if entry else None
    return f"{cell} {_fmt_ci(ci)}" if ci else cell


def render_markdown(doc: dict[str, Any]) -> str:
    """The Markdown report: an overview, then per dataset metrics with intervals,
    differences, CMC, the progressive curve, worst queries and provenance."""
    out = [f"# {doc['title']}", "",
           f"{len(doc['datasets'])} dataset(s) x {len(doc['encoders'])} encoder(s); "
           f"rankwise {doc['rankwise_version']}. All numbers are percentages; best per "
           f"column in bold, [low, high] its 95% interval. {_stats_sentence(doc)}", ""]
    groups = _by_dataset(doc)
    out += ["## Overview", "", _md_table(
        ["encoder"] + [f"{d} ({_headline_name(rows)})" for d, rows in groups],
        [[_md_escape(e)] + [_md_value(next((r for r in rows if r["encoder"] == e), None),
                                      _headline_name(rows), None)
                            for _, rows in groups]
         for e in doc["encoders"]]), ""]
    for dataset, rows in groups:
        first = rows[0]
        names = _metric_names(rows)
        out += [f"## {dataset}", "",
                f"protocol `{first['protocol']}`, distance `{first['distance']}`, "
                f"{first['num_queries']} queries ({first['num_skipped']} skipped), "
                f"{first['num_gallery']} gallery items.", ""]
        out += [_md_table(["encoder"] + names,
                          [[_md_escape(r["encoder"])] + [_md_value(r, n, _best(rows, n))
                                                         for n in names] for r in rows]), ""]
        comparisons = _dataset_comparisons(doc, dataset)
        if comparisons:
            cells = {(c["a"], c["b"], c["metric"]): c for c in comparisons}
            out += ["Differences b - a (percentage points; * significant):", "", _md_table(
                ["b - a"] + names,
                [[_md_escape(f"{b} - {a}")]
                 + [(_fmt_diff(c["diff"]) + ("*" if c["significant"] else ""))
                    if (c := cells.get((a, b, n))) else "-" for n in names]
                 for a, b in _pairs(comparisons)]), ""]
        cmc_rows = [r for r in rows if r["cmc"]]
        if cmc_rows:
            ks = [k for k in CMC_TABLE_RANKS if k <= doc["cmc_max_rank"]]
            out += ["CMC (% of queries with the first match at rank <= k):", "",
                    _md_table(["encoder"] + [f"k={k}" for k in ks],
                              [[_md_escape(r["encoder"])] + [_fmt(r["cmc"][k - 1]) for k in ks]
                               for r in cmc_rows]), ""]
        curve_rows = [r for r in rows if r.get("progressive")]
        if curve_rows:
            levels = curve_rows[0]["progressive"]["completion"]
            out += ["Target's mean reciprocal rank (%) by sketch completion:", "",
                    _md_table(["encoder"] + [f"{c:g}%" for c in levels],
                              [[_md_escape(r["encoder"])]
                               + [_fmt(v) for v in r["progressive"]["mean_reciprocal_rank"]]
                               for r in curve_rows]), ""]
        for r in rows:
            if not r.get("worst_queries"):
                continue
            worst = r["worst_queries"]
            out += [_worst_caption(r) + " (top items: + relevant, - not):", ""]
            for i, q in enumerate(worst["queries"], 1):
                line = (f"{i}. `{q['id']}` (label {q['label']}): "
                        f"{_SCORE_NAMES[worst['score']]} {_fmt(q['score'])}, "
                        + _RANK_NAMES[worst["score"]].format(q["rank"]))
                if q["top"] is not None:
                    line += "; top: " + " ".join(
                        f"{'+' if t['relevant'] else '-'}`{t['id']}`" for t in q["top"])
                out.append(line)
            out.append("")
        out += ["Provenance:", "", _md_table(
            ["encoder", "kind", "checkpoint sha256", "query manifest", "gallery manifest",
             "dim", "rankwise"],
            [[_md_escape(r["encoder"]), _md_escape(r["provenance"]["encoder_kind"] or "-"),
              f"`{_short(r['provenance']['checkpoint_hash'])}`",
              f"`{_short(r['provenance']['manifest_hash']['query'])}`",
              f"`{_short(r['provenance']['manifest_hash']['gallery'])}`",
              str(r["embedding_dim"]), str(r["provenance"]["rankwise_version"] or "-")]
             for r in rows], align="l"), ""]
        options = first["provenance"].get("protocol_options")
        if options:
            out += [f"Protocol options: `{json.dumps(options, sort_keys=True)}`", ""]
    return "\n".join(out)


# ---------------------------------------------------------------- plots

def _png(fig) -> str:
    """A matplotlib figure as a base64 PNG: 256 colours (a third of the bytes), no
    timestamp or version in the file."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    buffer.seek(0)
    with Image.open(buffer) as image:
        small = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                              dither=Image.Dither.NONE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _figure(width: float = 7.0, height: float = 3.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.tick_params(labelsize=8)
    return fig, ax


def _colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {e: cmap(i % cmap.N) for i, e in enumerate(names)}


def bar_chart(rows: list[dict[str, Any]], colors: dict[str, Any]) -> str:
    """Grouped bars: each metric (x) for each encoder (colour), with 95% error bars."""
    names = _metric_names(rows)
    fig, ax = _figure(min(4.6, max(3.2, 0.9 + 0.5 * len(names))), 2.8)
    width = 0.8 / len(rows)
    x = np.arange(len(names))
    for i, r in enumerate(rows):
        values = np.array([r["metrics"].get(n, np.nan) for n in names])
        cis = [_ci(r, n) for n in names]
        err = np.array([[v - c[0], c[1] - v] if c else [0.0, 0.0]
                        for v, c in zip(values, cis)]).T
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, values, width, label=r["encoder"],
               color=colors[r["encoder"]], yerr=np.clip(err, 0, None), capsize=2,
               error_kw={"lw": 0.8})
    ax.set_xticks(x, names)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize="x-small", loc="upper right", frameon=False)
    return _png(fig)


def trend_chart(rows: list[dict[str, Any]]) -> str:
    """Every metric (colour) across the encoders in order (x: checkpoints, e.g. epochs),
    shaded by its 95% interval; base64 PNG."""
    names = _metric_names(rows)
    colors = _colors(names)
    fig, ax = _figure(3.8, 2.8)
    x = np.arange(len(rows))
    low, high = 100.0, 0.0
    for n in names:
        values = np.array([r["metrics"].get(n, np.nan) for r in rows])
        ax.plot(x, values, color=colors[n], lw=1.6, marker="o", ms=3, label=n)
        cis = [_ci(r, n) for r in rows]
        if all(cis):
            lo, hi = np.array(cis).T
            ax.fill_between(x, lo, hi, color=colors[n], alpha=0.15, lw=0)
            low, high = min(low, lo.min()), max(high, hi.max())
        low, high = min(low, np.nanmin(values)), max(high, np.nanmax(values))
    pad = max(2.0, 0.06 * (high - low))
    ax.set_ylim(max(0.0, low - pad), min(100.0, high + pad) + 0.5)
    labels = [r["encoder"] for r in rows]
    long = sum(len(e) for e in labels) > 36
    ax.set_xticks(x, labels, rotation=25 if long else 0, ha="right" if long else "center")
    ax.set_xlim(-0.25, len(rows) - 0.75)
    ax.set_ylabel("%", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5),
              frameon=False, handlelength=1.2)
    return _png(fig)


def _percent_axes(ax, xlabel: str, ylabel: str, legend_loc: str) -> None:
    """The common frame of the curve plots: a 0-100 % y axis, labels, grid, legend."""
    ax.set_ylim(0, 101)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc=legend_loc)


def cmc_chart(rows: list[dict[str, Any]], colors: dict[str, Any]) -> str | None:
    """CMC curves, one per encoder; base64 PNG (None without curves)."""
    rows = [r for r in rows if r["cmc"]]
    if not rows:
        return None
    fig, ax = _figure(3.2, 2.8)
    for r in rows:
        ks = np.arange(1, len(r["cmc"]) + 1)
        ax.plot(ks, r["cmc"], label=r["encoder"], color=colors[r["encoder"]], lw=1.6)
    # Stop where every curve has reached 100% (at least rank 10): the rest is flat.
    full = [int(np.argmax(np.asarray(r["cmc"]) >= 100.0)) + 1 if r["cmc"][-1] >= 100.0
            else len(r["cmc"]) for r in rows]
    ax.set_xlim(1, max(2, min(len(rows[0]["cmc"]), max(10, *full))))
    _percent_axes(ax, "rank k", "% matched at rank <= k", "lower right")
    return _png(fig)


def progressive_chart(rows: list[dict[str, Any]], colors: dict[str, Any]) -> str | None:
    """Mean reciprocal rank of the target (%) against sketch completion, per encoder,
    shaded by its 95% interval; base64 PNG (None without a progressive curve)."""
    rows = [r for r in rows if r.get("progressive")]
    if not rows:
        return None
    fig, ax = _figure(3.2, 2.8)
    for r in rows:
        curve = r["progressive"]
        x = np.array(curve["completion"])
        ax.plot(x, curve["mean_reciprocal_rank"], label=r["encoder"],
                color=colors[r["encoder"]], lw=1.6, marker="o", ms=3)
        if all(curve["ci95"]):
            lo, hi = np.array(curve["ci95"]).T
            ax.fill_between(x, lo, hi, color=colors[r["encoder"]], alpha=0.15, lw=0)
    ax.set_xlim(0, 102)
    _percent_axes(ax, "sketch completion (%)", "mean 1 / rank of target (%)", "upper left")
    return _png(fig)


# ---------------------------------------------------------------- thumbnails

class _Thumbnails:
    """``(base64 PNG, width, height)`` thumbnails of image files, fitting in a square of
    ``size`` pixels (cached per path; ``None`` if there is no readable image)."""

    def __init__(self, size: int = THUMBNAIL_PX):
        self.size = size
        self.cache: dict[str, tuple[str, int, int] | None] = {}

    def __call__(self, path: str | None) -> tuple[str, int, int] | None:
        if not path:
            return None
        if path not in self.cache:
            self.cache[path] = self._make(path)
        return self.cache[path]

    def _make(self, path: str) -> tuple[str, int, int] | None:
        from PIL import Image

        try:
            with Image.open(path) as image:
                image = image.convert("RGB")
        except (OSError, ValueError):
            return None
        w, h = image.size
        scale = self.size / max(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = image.resize(size, Image.Resampling.NEAREST if scale >= 1
                             else Image.Resampling.LANCZOS)
        # 64 colours: half the bytes, and plenty to tell items apart
        image = image.quantize(64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
        return base64.b64encode(buffer.getvalue()).decode("ascii"), size[0], size[1]


# ---------------------------------------------------------------- html

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1f2328; max-width: 1180px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
.meta { color: #59636e; margin: .3em 0; }
.note { color: #59636e; font-size: 12.5px; margin: .2em 0 .4em; }
table { border-collapse: collapse; margin: .6em 0 1em; font-variant-numeric: tabular-nums; }
th, td { padding: .3em .7em; border-bottom: 1px solid #e5e8eb; text-align: right;
         vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: 700; }
td .ci { display: block; color: #59636e; font-size: 11px; font-weight: 400; }
table.diff td { color: #8c959f; }
table.diff td:first-child { color: #1f2328; }
table.diff td.up { background: #dafbe1; color: #116329; font-weight: 600; }
table.diff td.down { background: #ffebe9; color: #a40e26; font-weight: 600; }
table.small td, table.small th { font-size: 12.5px; padding: .2em .6em; }
table.prov td, table.prov th { text-align: left; font-size: 12.5px; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa;
       padding: .05em .3em; border-radius: 3px; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.plots figure { margin: 0; display: table; }
.plots figcaption { display: table-caption; caption-side: bottom; color: #59636e;
                    font-size: 12.5px; }
.plots img { max-width: 100%; height: auto; }
details { margin: .5em 0; }
summary { cursor: pointer; color: #0969da; }
table.worst td, table.worst th { text-align: left; font-size: 12px; }
.strip { display: flex; flex-wrap: wrap; gap: 4px; }
.item { display: inline-flex; flex-direction: column; align-items: center; font-size: 10.5px;
        color: #59636e; max-width: 70px; overflow: hidden; }
.item img { border: 3px solid #8c959f; image-rendering: pixelated; }
.item.rel img { border-color: #1a7f37; }
.item.non img { border-color: #cf222e; }
.item.query img { border-color: #0969da; }
.idbox { border: 3px solid #8c959f; padding: 2px 4px; font: 11px ui-monospace, monospace;
         color: #1f2328; white-space: nowrap; }
.item.rel .idbox { border-color: #1a7f37; }
.item.non .idbox { border-color: #cf222e; }
footer { margin-top: 3em; color: #59636e; font-size: 12.5px; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(text: str, best: bool = False, cls: str = "", title: str = "") -> str:
    classes = " ".join(c for c in ("best" if best else "", cls) if c)
    attrs = (f' class="{classes}"' if classes else "") + (f' title="{_esc(title)}"'
                                                          if title else "")
    return f"<td{attrs}>{text}</td>"


def _value_cell(entry: dict[str, Any] | None, name: str, best: float | None) -> str:
    value = entry["metrics"].get(name) if entry else None
    ci = _ci(entry, name) if entry else None
    text = _fmt(value) + (f'<span class="ci">{ci[0]:.1f}&ndash;{ci[1]:.1f}</span>'
                          if ci else "")
    return _td(text, value is not None and value == best)


def _figure_html(png: str, alt: str, caption: str) -> str:
    return (f'<figure><img alt="{_esc(alt)}" src="data:image/png;base64,{png}">'
            f"<figcaption>{caption}</figcaption></figure>")


def _comparisons_html(comparisons: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The differences table (pairs x metrics, significant ones coloured) and, collapsed,
    every comparison with its interval and p-values."""
    cells = {(c["a"], c["b"], c["metric"]): c for c in comparisons}
    body = []
    for a, b in _pairs(comparisons):
        row = [_td(f"{_esc(b)} &minus; {_esc(a)}")]
        for n in names:
            c = cells.get((a, b, n))
            if c is None:
                row.append(_td("-"))
                continue
            cls = ("up" if c["diff"] > 0 else "down") if c["significant"] else ""
            title = (f"95% CI [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]; "
                     f"p = {_format_p(c['p_value'])}, Holm p = {_format_p(c['p_holm'])}")
            row.append(_td(_esc(_fmt_diff(c["diff"])) + ("*" if c["significant"] else ""),
                           cls=cls, title=title))
        body.append(row)
    full = [[_td(f"{_esc(c['b'])} &minus; {_esc(c['a'])}"), _td(_esc(c["metric"])),
             _td(_fmt(c["value_a"])), _td(_fmt(c["value_b"])),
             _td(_esc(_fmt_diff(c["diff"]))),
             _td(f"[{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"),
             _td(_format_p(c["p_value"])), _td(_format_p(c["p_holm"])),
             _td("yes" if c["significant"] else "")] for c in comparisons]
    return ['<p class="note">Differences b &minus; a in percentage points; '
            "<b>*</b> coloured: significant (p(Holm) &lt; 0.05). Hover a cell for its "
            "interval and p-values.</p>",
            _html_table(["b &minus; a"] + [_esc(n) for n in names], body, "diff"),
            f"<details><summary>All {len(comparisons)} comparisons: 95% intervals of the "
            "differences and p-values</summary>"
            + _html_table(["b &minus; a", "metric", "a", "b", "diff", "95% CI", "p",
                           "p (Holm)", "significant"], full, "small") + "</details>"]


def _format_p(p: float) -> str:
    from .stats import format_p

    return format_p(p)


def _item_html(item: dict[str, Any], cls: str, thumbs: _Thumbnails, caption: str) -> str:
    title = f"{item['id']} (label {item['label']})"
    thumbnail = thumbs(item.get("image"))
    if thumbnail:
        png, width, height = thumbnail
        body = (f'<img alt="{_esc(item["id"])}" width="{width}" height="{height}" '
                f'src="data:image/png;base64,{png}">')
    else:
        body = f'<span class="idbox">{_esc(item["id"])}</span>'
    return (f'<span class="item {cls}" title="{_esc(title)}">{body}'
            f"<span>{caption}</span></span>")


def _worst_html(entry: dict[str, Any], thumbs: _Thumbnails) -> str:
    worst = entry["worst_queries"]
    rows = []
    for q in worst["queries"]:
        name = f"sketch {_esc(q['sketch'])}<br>" if q.get("sketch") else ""
        query = _item_html(q, "query", thumbs, "query") if thumbs(q["image"]) else ""
        cell = (f'<div class="strip">{query}<span><code>{_esc(q["id"])}</code><br>{name}'
                f"label {_esc(q['label'])}<br>{_SCORE_NAMES[worst['score']]} {_fmt(q['score'])}"
                f"<br>{_esc(_RANK_NAMES[worst['score']].format(q['rank']))}</span></div>")
        if q["top"] is None:
            top = '<span class="note">(no embeddings or manifests to list them)</span>'
        else:
            top = '<div class="strip">' + "".join(
                _item_html(t, "rel" if t["relevant"] else "non", thumbs,
                           f"{t['rank']}. {_esc(t['label'])}") for t in q["top"]) + "</div>"
        rows.append([f"<td>{cell}</td>", f"<td>{top}</td>"])
    return (f'<details class="worst"><summary>{_esc(_worst_caption(entry))}, with their '
            "nearest gallery items (border green: relevant, red: not; caption: rank. label)"
            "</summary>" + _html_table(["query", "nearest valid gallery items"], rows, "worst")
            + "</details>")


def render_html(doc: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS, base64 PNG plots, no external link)."""
    colors = _colors(doc["encoders"])
    thumbs = _Thumbnails()
    groups = _by_dataset(doc)
    parts = [f"<h1>{_esc(doc['title'])}</h1>",
             f'<p class="meta">{len(doc["datasets"])} dataset(s) &times; '
             f'{len(doc["encoders"])} encoder(s) &middot; rankwise '
             f'{_esc(doc["rankwise_version"])} &middot; all numbers are percentages, '
             "best per column in bold, 95% interval below each value</p>",
             f'<p class="note">{_esc(_stats_sentence(doc))}</p>']
    header = ["encoder"] + [f"{_esc(d)}<br><small>{_esc(_headline_name(rows))}</small>"
                            for d, rows in groups]
    body = [[_td(_esc(e))] + [_value_cell(next((r for r in rows if r["encoder"] == e), None),
                                          _headline_name(rows), _best(rows,
                                                                      _headline_name(rows)))
                              for _, rows in groups]
            for e in doc["encoders"]]
    parts += ["<h2>Overview</h2>", _html_table(header, body)]
    for dataset, rows in groups:
        first = rows[0]
        names = _metric_names(rows)
        parts += [f'<h2 id="{_esc(dataset)}">{_esc(dataset)}</h2>',
                  f'<p class="meta">protocol <code>{_esc(first["protocol"])}</code>, distance '
                  f'<code>{_esc(first["distance"])}</code>, {_esc(first["num_queries"])} '
                  f'{"sketches" if first["protocol"] == "progressive" else "queries"} '
                  f'({_esc(first["num_skipped"])} skipped), '
                  f'{_esc(first["num_gallery"])} gallery items</p>']
        parts.append(_html_table(["encoder"] + [_esc(n) for n in names],
                                 [[_td(_esc(r["encoder"]))]
                                  + [_value_cell(r, n, _best(rows, n)) for n in names]
                                  for r in rows]))
        comparisons = _dataset_comparisons(doc, dataset)
        if comparisons:
            parts += _comparisons_html(comparisons, names)
        if len(rows) >= 2:
            figures = [_figure_html(trend_chart(rows), f"metrics across encoders on {dataset}",
                                    "Each metric across the encoders in config order "
                                    "(e.g. epochs); band: 95% interval")]
        else:
            figures = [_figure_html(bar_chart(rows, colors), f"metrics on {dataset}",
                                    "Metrics, with 95% intervals")]
        cmc = cmc_chart(rows, colors)
        if cmc:
            what = "complete sketches" if first["protocol"] == "progressive" else "queries"
            figures.append(_figure_html(cmc, f"CMC curves on {dataset}",
                                        f"CMC: % of {what} with the first match at rank "
                                        "&le; k"))
        curve = progressive_chart(rows, colors)
        if curve:
            figures.append(_figure_html(curve, f"rank against completion on {dataset}",
                                        "Target's mean 1/rank against sketch completion "
                                        "(m@B averages it over steps); band: 95% interval"))
        parts.append('<div class="plots">' + "".join(figures) + "</div>")
        parts += [_worst_html(r, thumbs) for r in rows if r.get("worst_queries")]
        prov = [[_td(_esc(r["encoder"])),
                 _td(_esc(r["provenance"]["encoder_kind"] or "-")),
                 _td(f'<code title="{_esc(r["provenance"]["checkpoint_hash"] or "")}">'
                     f'{_esc(_short(r["provenance"]["checkpoint_hash"]))}</code>'),
                 _td(f'<code>{_esc(_short(r["provenance"]["manifest_hash"]["query"]))}</code>'),
                 _td(f'<code>{_esc(_short(r["provenance"]["manifest_hash"]["gallery"]))}'
                     "</code>"),
                 _td(_esc(r["embedding_dim"])),
                 _td(_esc(r["provenance"]["rankwise_version"] or "-"))] for r in rows]
        options = first["provenance"].get("protocol_options")
        parts.append("<details><summary>Provenance</summary>"
                     + _html_table(["encoder", "kind", "checkpoint sha256", "query manifest",
                                    "gallery manifest", "dim", "rankwise"], prov, "prov")
                     + (f'<p class="meta">protocol options: '
                        f"<code>{_esc(json.dumps(options, sort_keys=True))}</code></p>"
                        if options else "") + "</details>")
    parts.append("<footer>Hashes are SHA-256 prefixes; the full values, every metric with "
                 "its interval, every comparison, the CMC curves and the worst queries are in "
                 "report.json.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(doc['title'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


# ---------------------------------------------------------------- entry point

def write_report(metrics_paths: Iterable[str | os.PathLike], *, html_path=None, md_path=None,
                 json_path=None, **options) -> dict[str, Any]:
    """Build the report (``options``: those of :func:`build_report`) and write the
    requested files (each atomically); return the document."""
    from .store import write_text_atomic

    doc = build_report(metrics_paths, **options)
    if json_path:
        write_text_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    if md_path:
        write_text_atomic(md_path, render_markdown(doc))
    if html_path:
        write_text_atomic(html_path, render_html(doc))
    return doc
