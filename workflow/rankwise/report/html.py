"""The self-contained HTML rendering of the report document: inline CSS (the package's
``report.css``), plots and thumbnails as base64 PNG, no external link but to the paper
figures' files when they were written; long sections collapsed (``<details>``).  Cells
and words come from :mod:`.view`."""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Any

from . import view
from .figures import figure_links
from .plots import SCREEN, dataset_plots, png
from .thumbnails import Thumbnails


def _css() -> str:
    return resources.files(__package__).joinpath("report.css").read_text(encoding="utf-8")


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(text: str, best: bool = False, cls: str = "", title: str = "") -> str:
    classes = " ".join(c for c in ("best" if best else "", cls) if c)
    attrs = (f' class="{classes}"' if classes else "") + (
        f' title="{_esc(title)}"' if title else ""
    )
    return f"<td{attrs}>{text}</td>"


def _value_cell(cell: view.ValueCell) -> str:
    text = cell.text + (
        f'<span class="ci">{cell.ci[0]:.1f}&ndash;{cell.ci[1]:.1f}</span>' if cell.ci else ""
    )
    return _td(text, cell.best)


def _value_rows(rows: list[view.Row]) -> list[list[str]]:
    return [[_td(_esc(name))] + [_value_cell(c) for c in cells] for name, cells in rows]


def _figure_html(png: str, alt: str, caption: str) -> str:
    return (
        f'<figure><img alt="{_esc(alt)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _comparisons_html(
    doc: dict[str, Any], comparisons: list[dict[str, Any]], names: list[str]
) -> list[str]:
    """The differences table (pairs x metrics, significant ones coloured) and, collapsed,
    every comparison with its interval and p-values."""
    conf = view.confidence_label(doc)
    body = []
    for a, b, cells in view.differences(comparisons, names):
        row = [_td(f"{_esc(b)} &minus; {_esc(a)}")]
        for cell in cells:
            if cell is None:
                row.append(_td("-"))
                continue
            title = (
                f"{conf} CI {view.fmt_ci2(cell.comparison['ci95'])}; "
                f"p = {cell.p_value}, Holm p = {cell.p_holm}"
            )
            row.append(_td(_esc(cell.text), cls=cell.direction, title=title))
        body.append(row)
    full = [
        [
            _td(f"{_esc(c['b'])} &minus; {_esc(c['a'])}"),
            _td(_esc(c["metric"])),
            _td(view.fmt(c["value_a"])),
            _td(view.fmt(c["value_b"])),
            _td(_esc(view.fmt_diff(c["diff"]))),
            _td(view.fmt_ci2(c["ci95"])),
            _td(cell.p_value),
            _td(cell.p_holm),
            _td("yes" if cell.significant else ""),
        ]
        for c in comparisons
        for cell in [view.DiffCell(c)]
    ]
    return [
        f'<p class="note">Differences b &minus; a in percentage points; '
        f"<b>{view.SIGNIFICANT_MARK}</b> coloured: significant "
        f"({_esc(view.significance_rule(doc))}). Hover a cell for its "
        "interval and p-values.</p>",
        _html_table(["b &minus; a"] + [_esc(n) for n in names], body, "diff"),
        f"<details><summary>All {len(comparisons)} comparisons: {conf} intervals of the "
        "differences and p-values</summary>"
        + _html_table(
            [
                "b &minus; a",
                "metric",
                "a",
                "b",
                "diff",
                f"{conf} CI",
                "p",
                "p (Holm)",
                "significant",
            ],
            full,
            "small",
        )
        + "</details>",
    ]


def _item_html(item: dict[str, Any], cls: str, thumbs: Thumbnails, caption: str) -> str:
    title = f"{item['id']} (label {item['label']})"
    thumbnail = thumbs(item.get("image"))
    if thumbnail:
        png, width, height = thumbnail
        body = (
            f'<img alt="{_esc(item["id"])}" width="{width}" height="{height}" '
            f'src="data:image/png;base64,{png}">'
        )
    else:
        body = f'<span class="idbox">{_esc(item["id"])}</span>'
    return f'<span class="item {cls}" title="{_esc(title)}">{body}<span>{caption}</span></span>'


def _worst_html(entry: dict[str, Any], thumbs: Thumbnails) -> str:
    worst = entry["worst_queries"]
    rows = []
    for q in worst["queries"]:
        name = f"sketch {_esc(q['sketch'])}<br>" if q.get("sketch") else ""
        query = _item_html(q, "query", thumbs, "query") if thumbs(q["image"]) else ""
        cell = (
            f'<div class="strip">{query}<span><code>{_esc(q["id"])}</code><br>{name}'
            f"label {_esc(q['label'])}<br>{view.SCORE_NAMES[worst['score']]} "
            f"{view.fmt(q['score'])}"
            f"<br>{_esc(view.RANK_NAMES[worst['score']].format(q['rank']))}</span></div>"
        )
        if q["top"] is None:
            top = '<span class="note">(no embeddings or manifests to list them)</span>'
        else:
            top = (
                '<div class="strip">'
                + "".join(
                    _item_html(
                        t,
                        "rel" if t["relevant"] else "non",
                        thumbs,
                        f"{t['rank']}. {_esc(t['label'])}",
                    )
                    for t in q["top"]
                )
                + "</div>"
            )
        rows.append([f"<td>{cell}</td>", f"<td>{top}</td>"])
    return (
        f'<details class="worst"><summary>{_esc(view.worst_caption(entry))}, with their '
        "nearest gallery items (border green: relevant, red: not; caption: rank. label)"
        "</summary>"
        + _html_table(["query", "nearest valid gallery items"], rows, "worst")
        + "</details>"
    )


def _provenance_html(rows: list[dict[str, Any]]) -> str:
    prov = [
        [
            _td(_esc(p["encoder"])),
            _td(_esc(p["kind"])),
            _td(f'<code title="{_esc(p["checkpoint_full"])}">{_esc(p["checkpoint"])}</code>'),
            _td(f"<code>{_esc(p['query_manifest'])}</code>"),
            _td(f"<code>{_esc(p['gallery_manifest'])}</code>"),
            _td(_esc(p["dim"])),
            _td(_esc(p["rankwise"])),
        ]
        for p in view.provenance_rows(rows)
    ]
    options = rows[0]["provenance"].get("protocol_options")
    return (
        "<details><summary>Provenance</summary>"
        + _html_table(view.PROVENANCE_HEADER, prov, "prov")
        + (
            f'<p class="meta">protocol options: '
            f"<code>{_esc(json.dumps(options, sort_keys=True))}</code></p>"
            if options
            else ""
        )
        + "</details>"
    )


def _figure_links(doc: dict[str, Any], dataset: str, kind: str, links_from) -> str:
    """The links to a chart's paper files, `` (SVG, PDF)``; "" when none were written."""
    files = figure_links(doc, dataset, kind, links_from)
    if not files:
        return ""
    links = ", ".join(f'<a href="{_esc(path)}">{fmt.upper()}</a>' for fmt, path in files.items())
    return f" ({links})"


def render_html(doc: dict[str, Any], *, links_from: str | os.PathLike = ".") -> str:
    """One HTML page (inline CSS, base64 PNG plots); its only links are to the paper
    figures (``doc["figures"]``), relative to ``links_from``, the page's folder."""
    thumbs = Thumbnails()
    intervals = (
        f", {view.confidence_label(doc)} interval below each value"
        if view.has_intervals(doc["results"])
        else ""
    )
    parts = [
        f"<h1>{_esc(doc['title'])}</h1>",
        f'<p class="meta">{len(doc["datasets"])} dataset(s) &times; '
        f"{len(doc['encoders'])} encoder(s) &middot; rankwise "
        f"{_esc(doc['rankwise_version'])} &middot; all numbers are percentages, "
        f"best per column in bold{intervals}</p>",
        f'<p class="note">{_esc(view.stats_sentence(doc))}</p>',
    ]
    header, body = view.overview(doc)
    parts += [
        "<h2>Overview</h2>",
        _html_table(
            ["encoder"] + [f"{_esc(d)}<br><small>{_esc(h)}</small>" for d, h in header],
            _value_rows(body),
        ),
        '<p class="meta">Best checkpoint per dataset: '
        + "; ".join(
            f"{_esc(d)}: <b>{_esc(e)}</b> ({_esc(what)})"
            for d, e, what in view.best_checkpoints(doc)
        )
        + ".</p>",
    ]
    for dataset, rows in view.by_dataset(doc):
        first = rows[0]
        names, table = view.metrics_table(rows)
        parts += [
            f'<h2 id="{_esc(dataset)}">{_esc(dataset)}</h2>',
            f'<p class="meta">protocol <code>{_esc(first["protocol"])}</code>, distance '
            f"<code>{_esc(view.distance(rows))}</code>, {_esc(view.counts(rows))}</p>",
        ]
        dropped = view.dropped_rows_note(rows)
        if dropped:
            parts.append(f'<p class="meta">{_esc(dropped)}</p>')
        for note in (
            view.missing_metrics_note(rows),
            view.no_statistics_note(doc, dataset),
            view.not_compared_note(doc, dataset),
            view.unattainable_note(doc, dataset),
        ):
            if note:
                parts.append(f'<p class="meta">{_esc(note)}</p>')
        parts.append(_html_table(["encoder"] + [_esc(n) for n in names], _value_rows(table)))
        comparisons = view.dataset_comparisons(doc, dataset)
        if comparisons:
            parts += _comparisons_html(doc, comparisons, names)
        if view.verification_rows(rows):
            levels, table = view.verification_table(rows)
            parts += [
                f'<p class="meta">{_esc(view.verification_caption(rows))}</p>',
                _html_table(["encoder"] + [_esc(x) for x in levels], _value_rows(table)),
            ]
        figures = [
            _figure_html(
                png(plot.draw(SCREEN)),
                plot.alt,
                _esc(plot.caption) + _figure_links(doc, dataset, plot.kind, links_from),
            )
            for plot in dataset_plots(doc, rows)
        ]
        parts.append('<div class="plots">' + "".join(figures) + "</div>")
        parts += [_worst_html(r, thumbs) for r in rows if r.get("worst_queries")]
        parts.append(_provenance_html(rows))
    parts.append(
        "<footer>Hashes are SHA-256 prefixes; the full values, every metric with "
        "its interval, every comparison, the CMC curves and the worst queries are in "
        "report.json.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_esc(doc['title'])}</title>\n<style>\n{_css()}</style>\n</head>\n"
        "<body>\n" + "\n".join(parts) + "\n</body>\n</html>\n"
    )
