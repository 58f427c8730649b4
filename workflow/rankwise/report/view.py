"""The view-model shared by every renderer: what a cell shows, and the report's words.

A renderer (Markdown, HTML, ...) reads the document only through this module: the
tables as rows of cells (:class:`ValueCell`: value, best flag, interval;
:class:`DiffCell`: difference, significance mark, interval, p-values), number formats,
and the sentences whose numbers come from the document's ``statistics`` (confidence,
alpha) or the statistics' constants (:data:`rankwise.stats.EXACT_MAX`).  A renderer only
decides the markup.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from ..registry import get_protocol
from ..stats import EXACT_MAX, coarse_interval, format_p, never_significant, smallest_p
from .constants import CMC_TABLE_RANKS
from .document import best_index as best_row
from .document import headline_names

#: The mark of a significant difference.
SIGNIFICANT_MARK = "*"
#: How the worst queries' score and rank are named, per ``worst_queries["score"]``.
SCORE_NAMES = {"ap": "AP", "m@B": "m@B"}
RANK_NAMES = {"ap": "first match at rank {}", "m@B": "complete sketch: target at rank {}"}
#: Provenance table columns (both renderers).
PROVENANCE_HEADER = [
    "encoder",
    "kind",
    "checkpoint sha256",
    "query manifest",
    "gallery manifest",
    "dim",
    "rankwise",
]


# ---------------------------------------------------------------- formats


def fmt(value: float | None) -> str:
    """A percentage: two decimals; ``-`` when missing."""
    return "-" if value is None else f"{value:.2f}"


def fmt_ci(ci: list[float] | None) -> str:
    """An interval as ``[low, high]`` (one decimal); empty when missing."""
    return "" if ci is None else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def fmt_ci2(ci: list[float]) -> str:
    """An interval of a difference, ``[low, high]`` with two decimals."""
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def fmt_diff(value: float) -> str:
    """A signed difference in percentage points, with a true minus sign."""
    return f"{value:+.2f}".replace("-", "\u2212")


def short(digest: Any, n: int = 12) -> str:
    """A hash prefix (``-`` when missing)."""
    return str(digest)[:n] if digest else "-"


# ---------------------------------------------------------------- words


def confidence_label(doc: dict[str, Any]) -> str:
    """``"95%"``: the coverage of every interval in the report."""
    return f"{100 * doc['statistics']['confidence']:g}%"


def significance_rule(doc: dict[str, Any]) -> str:
    """``"p(Holm) < 0.05"``: when a difference is marked significant."""
    return f"p(Holm) < {doc['statistics']['alpha']:g}"


def has_intervals(rows: list[dict[str, Any]]) -> bool:
    """Whether any of ``rows`` (results) has intervals: a caption claims them only then."""
    return any(r.get("ci95") for r in rows)


def stats_sentence(doc: dict[str, Any], rows: list[dict[str, Any]] | None = None) -> str:
    """How the intervals and tests of ``rows`` (default: every result) were made (one
    sentence per renderer)."""
    s = doc["statistics"]
    if not s["resamples"]:
        return "No intervals or tests (resamples = 0)."
    rows = doc["results"] if rows is None else rows
    if not has_intervals(rows):
        return "No intervals or tests: no statistics were found (see the note)."
    if s["by"] == "identity":
        unit, units = "identity", "identities"
    else:  # the protocols' units: a progressive dataset resamples sketches
        specs = [get_protocol(p) for p in dict.fromkeys(r["protocol"] for r in rows)]
        unit = " or ".join(dict.fromkeys(spec.unit for spec in specs))
        units = " or ".join(dict.fromkeys(spec.units for spec in specs))
    intervals = (
        f"Intervals: {confidence_label(doc)} percentile bootstrap, {s['resamples']} "
        f"resamples by {unit}, seed {s['seed']}."
    )
    coarse = coarse_interval(s["resamples"], s["confidence"])
    if coarse:  # the ends are the extreme resamples: a document must not hide it
        intervals += f" Note: {coarse}."
    if not s["num_tests"]:
        return f"{intervals} No paired tests in this report."
    exact = {c["test"] == "exact" for c in doc["comparisons"]}
    flips = (
        f"every sign flip enumerated: at most {EXACT_MAX} {units} each"
        if exact == {True}
        else f"{s['flip_resamples']} random sign flips"
        if exact == {False}
        else f"{s['flip_resamples']} random sign flips; every flip with at most {EXACT_MAX} {units}"
    )
    return (
        f"{intervals} Differences: paired sign-flip test ({flips}), Holm-adjusted over all "
        f"{s['num_tests']} tests in this report; significant when {significance_rule(doc)}"
        # a difference's interval can exclude 0 where its adjusted test is not marked
        " (the intervals of the differences are not adjusted for the number of tests)."
    )


def units_name(protocol: str) -> str:
    """What a dataset's ``num_queries`` counts: ``queries`` or ``sketches``."""
    return get_protocol(protocol).units


def counts(rows: list[dict[str, Any]]) -> str:
    """A dataset's evaluated units and gallery, ``8 queries (0 skipped), 32 gallery
    items``; each encoder's (``a: ...; b: ...``) when they differ (id-keyed features
    with dropped rows)."""
    spec = get_protocol(rows[0]["protocol"])
    one, units = spec.unit, spec.units

    def text(r: dict[str, Any]) -> str:
        if r.get("num_queries") is None:  # a hand-written metrics file (a paper's numbers)
            return "counts not given"
        n, g = r["num_queries"], r["num_gallery"]
        skipped = "" if r.get("num_skipped") is None else f" ({r['num_skipped']} skipped)"
        gallery = "" if g is None else f", {g} gallery {'item' if g == 1 else 'items'}"
        return f"{n} {one if n == 1 else units}{skipped}{gallery}"

    texts = [text(r) for r in rows]
    if len(set(texts)) == 1:
        return texts[0]
    return "; ".join(f"{r['encoder']}: {t}" for r, t in zip(rows, texts, strict=True))


def distance(rows: list[dict[str, Any]]) -> str:
    """A dataset's distance, ``cosine``; each encoder's (``cosine (a, b), euclidean
    (c)``) when they differ (metrics files of other runs given to `rankwise report`)."""
    by: dict[str, list[str]] = {}
    for r in rows:
        by.setdefault(str(r["distance"] or "not given"), []).append(r["encoder"])
    if len(by) == 1:
        return next(iter(by))
    return ", ".join(f"{d} ({', '.join(names)})" for d, names in by.items())


def cmc_units(protocol: str) -> str:
    """What the CMC counts: the queries, or the complete renderings of the sketches."""
    spec = get_protocol(protocol)
    return f"complete {spec.units}" if spec.unit == "sketch" else spec.units


def cmc_table_ranks(max_rank: int) -> list[int]:
    """The k of the CMC table: :data:`CMC_TABLE_RANKS` up to ``max_rank``, and
    ``max_rank`` itself where it falls short of the last (3: k = 1 and 3, not k = 1
    alone)."""
    ks = [k for k in CMC_TABLE_RANKS if k <= max_rank]
    return ks + [max_rank] if max_rank < CMC_TABLE_RANKS[-1] and max_rank not in ks else ks


def worst_caption(entry: dict[str, Any]) -> str:
    worst = entry["worst_queries"]
    what = "sketches (lowest m@B)" if worst["score"] == "m@B" else "queries (lowest AP)"
    kept = worst.get("top_kept")
    # a re-ranked or expanded (AQE) store keeps only its nearest items; more were asked
    kept = f" (its ranks store keeps only the {kept} nearest items of a query)" if kept else ""
    return f"Worst {len(worst['queries'])} {what} of {entry['encoder']}{kept}"


# ---------------------------------------------------------------- document access


def by_dataset(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(d, [r for r in doc["results"] if r["dataset"] == d]) for d in doc["datasets"]]


def sweep_positions(rows: list[dict[str, Any]]) -> list[int] | None:
    """The x positions of a checkpoint sweep: when every encoder of the dataset is
    ``<entry>@<name>`` of one entry and each name holds a number, the last number of each
    name (``r50@epoch_60`` -> 60), increasing; else ``None`` (encoders without an order).
    """
    entries, numbers = set(), []
    for row in rows:
        entry, at, name = str(row["encoder"]).partition("@")
        found = re.findall(r"\d+", name)
        if not at or not found:
            return None
        entries.add(entry)
        numbers.append(int(found[-1]))
    ordered = all(a < b for a, b in itertools.pairwise(numbers))
    return numbers if len(entries) == 1 and ordered else None


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(name for r in rows for name in r["metrics"]))


def best(rows: list[dict[str, Any]], name: str) -> float | None:
    """The highest value of metric ``name`` (``None`` with fewer than two values)."""
    values = [r["metrics"][name] for r in rows if name in r["metrics"]]
    return max(values) if len(values) > 1 else None


def ci(entry: dict[str, Any], name: str) -> list[float] | None:
    return (entry.get("ci95") or {}).get(name)


def dataset_comparisons(doc: dict[str, Any], dataset: str) -> list[dict[str, Any]]:
    return [c for c in doc["comparisons"] if c["dataset"] == dataset]


def pairs(comparisons: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return list(dict.fromkeys((c["a"], c["b"]) for c in comparisons))


# ---------------------------------------------------------------- cells


@dataclass(frozen=True)
class ValueCell:
    """A metric value: ``text``, whether it is the best of its column, its interval."""

    value: float | None
    best: bool = False
    ci: list[float] | None = None

    @property
    def text(self) -> str:
        return fmt(self.value)


def value_cell(entry: dict[str, Any] | None, name: str, best_value: float | None) -> ValueCell:
    value = entry["metrics"].get(name) if entry else None
    return ValueCell(
        value, value is not None and value == best_value, ci(entry, name) if entry else None
    )


@dataclass(frozen=True)
class DiffCell:
    """One comparison b - a: the difference, its significance, interval and p-values."""

    comparison: dict[str, Any]

    @property
    def significant(self) -> bool:
        return bool(self.comparison["significant"])

    @property
    def text(self) -> str:
        """The difference, marked when significant."""
        return fmt_diff(self.comparison["diff"]) + (SIGNIFICANT_MARK if self.significant else "")

    @property
    def direction(self) -> str:
        """``up`` / ``down`` for a significant gain / loss, else empty."""
        if not self.significant:
            return ""
        return "up" if self.comparison["diff"] > 0 else "down"

    @property
    def p_value(self) -> str:
        return format_p(self.comparison["p_value"])

    @property
    def p_holm(self) -> str:
        return format_p(self.comparison["p_holm"])


Row = tuple[str, list[ValueCell]]


def overview(doc: dict[str, Any]) -> tuple[list[tuple[str, str]], list[Row]]:
    """The overview: ``[(dataset, headline metric)]`` (each dataset's headline metrics,
    :func:`.document.headline_names`) and one row per encoder with those values (best
    of each column flagged)."""
    columns = [(d, name, rows) for d, rows in by_dataset(doc) for name in headline_names(rows)]
    body = [
        (
            e,
            [
                value_cell(
                    next((r for r in rows if r["encoder"] == e), None), name, best(rows, name)
                )
                for _, name, rows in columns
            ],
        )
        for e in doc["encoders"]
    ]
    return [(d, name) for d, name, _ in columns], body


def best_checkpoints(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(dataset, encoder, "metric value")`` of each dataset's best checkpoint."""
    return [
        (b["dataset"], b["encoder"], f"{b['metric']} {fmt(b['value'])}")
        for b in doc.get("best", [])
    ]


def metrics_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[Row]]:
    """A dataset's metrics: the names, and one row of cells per encoder."""
    names = metric_names(rows)
    return names, [(r["encoder"], [value_cell(r, n, best(rows, n)) for n in names]) for r in rows]


def differences(
    comparisons: list[dict[str, Any]], names: list[str]
) -> list[tuple[str, str, list[DiffCell | None]]]:
    """Pairs x metrics: ``(a, b, cells)``, ``None`` where a metric was not compared."""
    cells = {(c["a"], c["b"], c["metric"]): c for c in comparisons}
    return [
        (a, b, [DiffCell(cells[a, b, n]) if (a, b, n) in cells else None for n in names])
        for a, b in pairs(comparisons)
    ]


def dropped_rows_note(rows: list[dict[str, Any]]) -> str | None:
    """Per encoder whose id-keyed features lacked some manifest rows (``on_missing: drop``),
    how many query / gallery rows its evaluation left out; ``None`` when none did."""
    parts = []
    for r in rows:
        aligned = r["provenance"].get("id_alignment") or {}
        counts = {side: aligned.get(side) or {} for side in ("query", "gallery")}
        if any(c.get("dropped_rows") for c in counts.values()):
            parts.append(
                f"{r['encoder']}: "
                + " and ".join(
                    f"{c.get('dropped_rows', 0)} of {c.get('manifest_rows', '?')} {side}"
                    for side, c in counts.items()
                    if c
                )
                + " rows"
            )
    if not parts:
        return None
    return "Manifest rows without features left out (on_missing: drop): " + "; ".join(parts) + "."


def missing_metrics(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(encoder, names)`` of each row whose metrics file lacks some of the metrics
    another computed row of the dataset has (an older rankwise's file beside a newer one,
    or other ``--ks``): a "-" in the tables, no paired test with that row, no overview
    column."""
    # only computed files (a ranks store in their provenance): a paper's hand-written
    # numbers have what they have, and no store to compute the rest from; nor do its
    # names count (a K only the paper gives is missing from no computed file)
    computed = [r for r in rows if ((r.get("provenance") or {}).get("files") or {}).get("ranks")]
    names = metric_names([r for r in rows if r.get("num_queries") is not None])
    lacking = [(r["encoder"], [n for n in names if n not in r["metrics"]]) for r in computed]
    return [(encoder, missing) for encoder, missing in lacking if missing]


def missing_metrics_note(rows: list[dict[str, Any]]) -> str | None:
    """:func:`missing_metrics` as a sentence; ``None`` when every row has every metric."""
    lacking = missing_metrics(rows)
    if not lacking:
        return None
    return (
        'Not in every metrics file ("-": no paired test or overview column with them): '
        + "; ".join(f"{encoder}: {', '.join(names)}" for encoder, names in lacking)
        + ". Their files come from an older rankwise or other --ks: `rankwise metrics` on "
        "the ranks store again computes them."
    )


def missing_metrics_line(doc: dict[str, Any]) -> str | None:
    """One line for the terminal: every evaluation whose metrics file lacks metrics that
    another of its dataset has; ``None`` when none does."""
    parts = [
        f"{dataset}/{encoder} ({', '.join(names)})"
        for dataset, rows in by_dataset(doc)
        for encoder, names in missing_metrics(rows)
    ]
    if not parts:
        return None
    return (
        "metrics missing from some metrics files (shown as -, no paired test or overview "
        "column with them): " + "; ".join(parts) + "; `rankwise metrics` on their ranks "
        "stores again computes them"
    )


def not_compared_note(doc: dict[str, Any], dataset: str) -> str | None:
    """The encoder pairs of ``dataset`` the report did not test, and why; ``None``: none."""
    skipped = [s for s in doc["statistics"].get("not_compared", []) if s["dataset"] == dataset]
    if not skipped:
        return None
    return (
        "Not compared: " + "; ".join(f"{s['a']} and {s['b']}: {s['reason']}" for s in skipped) + "."
    )


#: What an evaluation without statistics lacks.
_NO_STATISTICS = "no intervals, CMC, paired tests or worst queries"


def no_statistics_note(doc: dict[str, Any], dataset: str) -> str | None:
    """The encoders of ``dataset`` without statistics, and why; ``None``: none."""
    missing = [
        m for m in doc["statistics"].get("without_statistics", []) if m["dataset"] == dataset
    ]
    if not missing:
        return None
    return (
        f"Without statistics ({_NO_STATISTICS}): "
        + "; ".join(f"{m['encoder']}: {m['reason']}" for m in missing)
        + "."
    )


def no_statistics_line(doc: dict[str, Any]) -> str | None:
    """One line for the terminal: every evaluation without statistics, and why."""
    missing = doc["statistics"].get("without_statistics", [])
    if not missing:
        return None
    return f"{_NO_STATISTICS} for " + "; ".join(
        f"{m['dataset']}/{m['encoder']} ({m['reason']})" for m in missing
    )


def unattainable_note(doc: dict[str, Any], dataset: str) -> str | None:
    """Why no difference on ``dataset`` can be marked significant whatever the data (few
    clusters: :func:`rankwise.stats.never_significant`, Holm over every test of the
    report); ``None`` otherwise."""
    s = doc["statistics"]
    rows = dataset_comparisons(doc, dataset)
    if not rows:
        return None

    def least(c: dict[str, Any]) -> float:
        return smallest_p(c["test"], c["num_clusters"], s["flip_resamples"])

    row = min(rows, key=least)  # one comparison's queries: the rows share C and test
    protocol = next(r["protocol"] for r in doc["results"] if r["dataset"] == dataset)
    floor = least(row)
    why = never_significant(
        row["test"],
        row["num_clusters"],
        s["flip_resamples"],
        s["num_tests"],
        by=s["by"],
        units=units_name(protocol),
        alpha=s["alpha"],
        smallest_in_all=min(least(c) for c in doc["comparisons"]),
        # the tests of other datasets (more clusters) that can come before it in Holm's order
        lower_tests=sum(least(c) < floor for c in doc["comparisons"]),
    )
    return None if why is None else f"No difference on {dataset} can be significant: {why}."


def provenance_rows(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Per encoder, the provenance columns (:data:`PROVENANCE_HEADER`) as text."""
    out = []
    for r in rows:
        p = r["provenance"]
        out.append(
            {
                "encoder": r["encoder"],
                "kind": p["encoder_kind"] or "-",
                "checkpoint": short(p["checkpoint_hash"]),
                "checkpoint_full": p["checkpoint_hash"] or "",
                "query_manifest": short(p["manifest_hash"]["query"]),
                "gallery_manifest": short(p["manifest_hash"]["gallery"]),
                "dim": "-" if r["embedding_dim"] is None else str(r["embedding_dim"]),
                "rankwise": str(p["rankwise_version"] or "-"),
            }
        )
    return out


# ---------------------------------------------------------------- verification

#: Encoders whose distance histograms are drawn at most (then: the best one only).
HISTOGRAM_ENCODERS_MAX = 3


def verification_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dataset's results that carry verification metrics."""
    return [r for r in rows if r.get("verification")]


def verification_levels(rows: list[dict[str, Any]]) -> list[str]:
    """The FPR levels of the rows' TPR@FPR, ascending (as written: ``"0.001"``)."""
    levels = {x for r in verification_rows(rows) for x in r["verification"]["tpr@fpr"]}
    return sorted(levels, key=float)


def verification_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[Row]]:
    """TPR@FPR per encoder, best per column marked: header (after ``encoder``) and rows."""
    shown = verification_rows(rows)
    levels = verification_levels(rows)
    body: list[Row] = []
    for r in shown:
        cells = []
        for x in levels:
            present = [t for s in shown if (t := s["verification"]["tpr@fpr"].get(x)) is not None]
            top = max(present) if len(present) > 1 else None
            value = r["verification"]["tpr@fpr"].get(x)
            cells.append(ValueCell(value, value is not None and value == top))
        body.append((r["encoder"], cells))
    return [f"TPR@FPR={x}" for x in levels], body


def verification_caption(rows: list[dict[str, Any]]) -> str:
    """What the verification table counts, in one sentence with the pair counts."""
    shown = verification_rows(rows)
    counts = {
        (r["verification"]["num_positive_pairs"], r["verification"]["num_negative_pairs"])
        for r in shown
    }
    first = shown[0]["verification"]
    pairs = (
        f"{first['num_positive_pairs']:,} positive and "
        f"{first['num_negative_pairs']:,} negative pairs"
        if len(counts) == 1
        else "; ".join(
            f"{r['encoder']}: {r['verification']['num_positive_pairs']:,} positive, "
            f"{r['verification']['num_negative_pairs']:,} negative pairs"
            for r in shown
        )
    )
    return (
        f"Verification over every valid query-gallery pair ({pairs}; the encoder's "
        f"{first.get('distance', '')} distances, before query expansion or re-ranking): "
        "TPR (%) at the largest distance threshold whose FPR is at most the level; a "
        "negative tied with a positive at the threshold rejects both."
    )


def histogram_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results whose distance histograms are drawn: all, up to
    :data:`HISTOGRAM_ENCODERS_MAX`, else the best one (by the first headline metric)."""
    shown = verification_rows(rows)
    if len(shown) <= HISTOGRAM_ENCODERS_MAX:
        return shown
    return [shown[best_row(shown)]]
