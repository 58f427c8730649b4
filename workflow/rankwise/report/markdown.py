"""The Markdown rendering of the report document (cells and words from :mod:`.view`)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from . import view
from .figures import figure_links


def _table(header: list[str], rows: list[list[str]], align: str = "r") -> str:
    rule = ["---"] + [("---:" if align == "r" else "---")] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


#: Characters that Markdown would read as markup in a name: a table cell's end, an
#: HTML tag or entity (``<z>`` vanished in renderers), emphasis (``__init__`` was bold),
#: code, links, strike-through, a heading, math (``$x$`` on GitHub).  CommonMark takes
#: a backslash before any ASCII punctuation as that character, so escaping one that
#: needs none is harmless.
_MARKUP = str.maketrans({"\n": " ", "\r": " ", **{c: "\\" + c for c in "\\|<>*_`[]~#&$"}})


def _escape(text: Any) -> str:
    """``text`` as literal Markdown text, on one line."""
    return str(text).translate(_MARKUP)


def _code(text: Any, *, table: bool = False) -> str:
    """``text`` as a code span: fenced by more backticks than it holds in a row, padded
    when it starts or ends with one; in a ``table`` cell ``|`` escaped (GFM ends the
    cell there even inside code)."""
    text = " ".join(str(text).splitlines())
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    if table:
        text = text.replace("|", "\\|")
    return f"{fence}{pad}{text}{pad}{fence}"


def _value(cell: view.ValueCell) -> str:
    """``**best**`` in bold, then ``[low, high]``."""
    text = f"**{cell.text}**" if cell.best else cell.text
    return f"{text} {view.fmt_ci(cell.ci)}" if cell.ci else text


def _rows(rows: list[view.Row]) -> list[list[str]]:
    return [[_escape(name)] + [_value(c) for c in cells] for name, cells in rows]


def _figures(doc: dict[str, Any], dataset: str, links_from) -> list[str]:
    """The dataset's paper figures, when written: the SVG shown, the PDF linked."""
    out = []
    for entry in doc.get("figures", []):
        if entry["dataset"] == dataset:
            files = figure_links(doc, dataset, entry["kind"], links_from)
            if "svg" in files:  # shown, with a link to the PDF
                pdf = f" ([PDF]({files['pdf']}))" if "pdf" in files else ""
                out += [f"![{_escape(entry['caption'])}]({files['svg']}){pdf}", ""]
            else:
                out += [f"[{_escape(entry['caption'])} (PDF)]({files['pdf']})", ""]
    return out


def render_markdown(doc: dict[str, Any], *, links_from: str | os.PathLike = ".") -> str:
    """The Markdown report: an overview, then per dataset metrics with intervals,
    differences, CMC, the progressive curve, the paper figures (``doc["figures"]``,
    linked relative to ``links_from``, the file's folder), worst queries and
    provenance."""
    intervals = (
        f", [low, high] its {view.confidence_label(doc)} interval"
        if view.has_intervals(doc["results"])
        else ""
    )
    out = [
        f"# {_escape(doc['title'])}",
        "",
        f"{len(doc['datasets'])} dataset(s) x {len(doc['encoders'])} encoder(s); "
        f"rankwise {doc['rankwise_version']}. All numbers are percentages; best per "
        f"column in bold{intervals}. {view.stats_sentence(doc)}",
        "",
    ]
    header, body = view.overview(doc)
    out += [
        "## Overview",
        "",
        _table(["encoder"] + [_escape(f"{d} ({h})") for d, h in header], _rows(body)),
        "",
        "Best checkpoint per dataset: "
        + "; ".join(
            f"{_escape(d)}: **{_escape(e)}** ({_escape(what)})"
            for d, e, what in view.best_checkpoints(doc)
        )
        + ".",
        "",
    ]
    for dataset, rows in view.by_dataset(doc):
        first = rows[0]
        names, table = view.metrics_table(rows)
        out += [
            f"## {_escape(dataset)}",
            "",
            f"protocol {_code(first['protocol'])}, distance {_code(view.distance(rows))}, "
            f"{_escape(view.counts(rows))}.",
            "",
        ]
        dropped = view.dropped_rows_note(rows)
        if dropped:
            out += [_escape(dropped), ""]
        for note in (
            view.missing_metrics_note(rows),
            view.no_statistics_note(doc, dataset),
            view.not_compared_note(doc, dataset),
            view.unattainable_note(doc, dataset),
        ):
            if note:
                out += [_escape(note), ""]
        out += [_table(["encoder"] + [_escape(n) for n in names], _rows(table)), ""]
        comparisons = view.dataset_comparisons(doc, dataset)
        if comparisons:
            out += [
                f"Differences b - a (percentage points; {view.SIGNIFICANT_MARK} significant):",
                "",
                _table(
                    ["b - a"] + [_escape(n) for n in names],
                    [
                        [_escape(f"{b} - {a}")] + [c.text if c else "-" for c in cells]
                        for a, b, cells in view.differences(comparisons, names)
                    ],
                ),
                "",
            ]
        if view.verification_rows(rows):
            levels, table = view.verification_table(rows)
            out += [
                _escape(view.verification_caption(rows)),
                "",
                _table(["encoder"] + [_escape(x) for x in levels], _rows(table)),
                "",
            ]
        cmc_rows = [r for r in rows if r["cmc"]]
        if cmc_rows:
            ks = view.cmc_table_ranks(doc["cmc_max_rank"])
            out += [
                f"CMC (% of {view.cmc_units(first['protocol'])} with the first match "
                "at rank <= k):",
                "",
                _table(
                    ["encoder"] + [f"k={k}" for k in ks],
                    [
                        [_escape(r["encoder"])] + [view.fmt(r["cmc"][k - 1]) for k in ks]
                        for r in cmc_rows
                    ],
                ),
                "",
            ]
        curve_rows = [r for r in rows if r.get("progressive")]
        if curve_rows:
            levels = curve_rows[0]["progressive"]["completion"]
            out += [
                "Target's mean reciprocal rank (%) by sketch completion:",
                "",
                _table(
                    ["encoder"] + [f"{c:g}%" for c in levels],
                    [
                        [_escape(r["encoder"])]
                        + [view.fmt(v) for v in r["progressive"]["mean_reciprocal_rank"]]
                        for r in curve_rows
                    ],
                ),
                "",
            ]
        out += _figures(doc, dataset, links_from)
        for r in rows:
            if not r.get("worst_queries"):
                continue
            worst = r["worst_queries"]
            out += [_escape(view.worst_caption(r)) + " (top items: + relevant, - not):", ""]
            for i, q in enumerate(worst["queries"], 1):
                line = (
                    f"{i}. {_code(q['id'])} (label {_escape(q['label'])}): "
                    f"{view.SCORE_NAMES[worst['score']]} {view.fmt(q['score'])}, "
                    + view.RANK_NAMES[worst["score"]].format(q["rank"])
                )
                if q["top"] is not None:
                    line += "; top: " + " ".join(
                        f"{'+' if t['relevant'] else '-'}{_code(t['id'])}" for t in q["top"]
                    )
                out.append(line)
            out.append("")
        out += [
            "Provenance:",
            "",
            _table(
                view.PROVENANCE_HEADER,
                [
                    [
                        _escape(p["encoder"]),
                        _escape(p["kind"]),
                        _code(p["checkpoint"], table=True),
                        _code(p["query_manifest"], table=True),
                        _code(p["gallery_manifest"], table=True),
                        _escape(p["dim"]),
                        _escape(p["rankwise"]),
                    ]
                    for p in view.provenance_rows(rows)
                ],
                align="l",
            ),
            "",
        ]
        options = first["provenance"].get("protocol_options")
        if options:
            out += [f"Protocol options: {_code(json.dumps(options, sort_keys=True))}", ""]
    return "\n".join(out)
