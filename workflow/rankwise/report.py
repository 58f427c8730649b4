"""The comparison report: every dataset x encoder, as HTML, Markdown and JSON.

Inputs are the JSON files written by ``rankwise metrics`` (one per dataset x encoder).
Each holds the numbers and a ``provenance`` dict (the ranks store's attributes, with
the embedding stores' attributes under ``query_embeddings`` / ``gallery_embeddings``
and the ranks store's path under ``ranks``).  Names come from the pipeline layout
``.../metrics/<dataset>/<encoder>.json``: the folder is the dataset, the file stem
the encoder.

Outputs, all rendered from one document (:func:`build_report`):

- JSON: every metric of every dataset x encoder, the CMC curve, and provenance
  (encoder, checkpoint hash, manifest hashes, package version, protocol options).
- Markdown: one table of metrics and one of provenance per dataset.
- HTML: one self-contained file (inline CSS, plots as base64 PNG, no external link):
  per dataset a table, a bar chart of the metrics per encoder and the CMC curves.

The CMC curve (percentage of queries whose first relevant item is at rank <= k, for
k = 1..``cmc_max_rank``) is computed from the ranks store; for ``progressive`` it is
taken over each sketch's complete rendering (the curve of ``acc@K``).  Nothing in the
output depends on the time or the machine: the same inputs give the same bytes.
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

#: The metric shown in the overview table, per protocol.
HEADLINE = {"recall": "recall@1", "reid": "rank1", "reassociation": "rank1",
            "progressive": "m@A"}
#: Ranks listed in the Markdown CMC table.
CMC_TABLE_RANKS = (1, 5, 10, 20, 50)


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
    from .metrics import per_query
    from .store import read_ranks

    arrays, attrs = read_ranks(ranks_store)
    pq = per_query(arrays, attrs)
    first = pq["sketches"]["last_rank"] if attrs["protocol"] == "progressive" \
        else pq["first_rank"]
    if len(first) == 0:
        return [0.0] * max_rank
    counts = np.bincount(np.minimum(first, max_rank + 1), minlength=max_rank + 2)
    return [float(x) for x in 100.0 * np.cumsum(counts)[1:max_rank + 1] / len(first)]


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


def load_result(metrics_path: str | os.PathLike, *, cmc_max_rank: int = 50) -> dict[str, Any]:
    """One dataset x encoder entry of the report, from a ``rankwise metrics`` JSON."""
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
    cmc = None
    if ranks and Path(ranks).is_dir():
        cmc = cmc_curve(ranks, cmc_max_rank)
    return {
        "dataset": path.parent.name,
        "encoder": path.stem,
        **{key: data.get(key) for key in ("protocol", "distance", "num_queries", "num_skipped",
                                          "num_gallery", "embedding_dim")},
        "metrics": {k: float(v) for k, v in data["metrics"].items()},
        "cmc": cmc,
        "provenance": _provenance(path.stem, raw),
        "source": str(path),
    }


def build_report(metrics_paths: Iterable[str | os.PathLike], *, title: str = "rankwise report",
                 cmc_max_rank: int = 50) -> dict[str, Any]:
    """The report document (what ``report.json`` holds) for the given metrics files.

    Datasets and encoders keep the order in which they first appear.
    """
    if cmc_max_rank < 1:
        raise RankwiseError(f"--cmc-max-rank must be at least 1, got {cmc_max_rank}")
    results = [load_result(p, cmc_max_rank=cmc_max_rank) for p in metrics_paths]
    if not results:
        raise RankwiseError("no metrics files given; pass the JSON files written by "
                            "`rankwise metrics` (e.g. results/metrics/*/*.json)")
    seen: dict[tuple[str, str], str] = {}
    for r in results:
        key = (r["dataset"], r["encoder"])
        if key in seen:
            raise RankwiseError(f"{r['source']}: dataset {key[0]!r} x encoder {key[1]!r} is "
                                f"also given by {seen[key]}; pass each pair once")
        seen[key] = r["source"]
    datasets = list(dict.fromkeys(r["dataset"] for r in results))
    encoders = list(dict.fromkeys(r["encoder"] for r in results))
    return {"title": title, "rankwise_version": __version__, "cmc_max_rank": cmc_max_rank,
            "datasets": datasets, "encoders": encoders, "results": results}


def _by_dataset(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(d, [r for r in doc["results"] if r["dataset"] == d]) for d in doc["datasets"]]


def _metric_names(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(name for r in rows for name in r["metrics"]))


def _best(rows: list[dict[str, Any]], name: str) -> float | None:
    values = [r["metrics"][name] for r in rows if name in r["metrics"]]
    return max(values) if len(values) > 1 else None


# ---------------------------------------------------------------- markdown

def _md_table(header: list[str], rows: list[list[str]], align: str = "r") -> str:
    rule = ["---"] + [("---:" if align == "r" else "---")] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|")


def render_markdown(doc: dict[str, Any]) -> str:
    """The Markdown report: an overview, then per dataset metrics, CMC and provenance."""
    out = [f"# {doc['title']}", "",
           f"{len(doc['datasets'])} dataset(s) x {len(doc['encoders'])} encoder(s); "
           f"rankwise {doc['rankwise_version']}. All numbers are percentages.", ""]
    out += ["## Overview", "", _md_table(
        ["encoder"] + [f"{d} ({HEADLINE.get(rows[0]['protocol'], '')})"
                       for d, rows in _by_dataset(doc)],
        [[_md_escape(e)] + [_fmt(next((r["metrics"].get(HEADLINE.get(r["protocol"]))
                                       for r in rows if r["encoder"] == e), None))
                            for _, rows in _by_dataset(doc)]
         for e in doc["encoders"]]), ""]
    for dataset, rows in _by_dataset(doc):
        first = rows[0]
        names = _metric_names(rows)
        out += [f"## {dataset}", "",
                f"protocol `{first['protocol']}`, distance `{first['distance']}`, "
                f"{first['num_queries']} queries ({first['num_skipped']} skipped), "
                f"{first['num_gallery']} gallery items.", ""]
        body = []
        for r in rows:
            cells = []
            for n in names:
                v = r["metrics"].get(n)
                cell = _fmt(v)
                cells.append(f"**{cell}**" if v is not None and v == _best(rows, n) else cell)
            body.append([_md_escape(r["encoder"])] + cells)
        out += [_md_table(["encoder"] + names, body), ""]
        cmc_rows = [r for r in rows if r["cmc"]]
        if cmc_rows:
            ks = [k for k in CMC_TABLE_RANKS if k <= doc["cmc_max_rank"]]
            out += ["CMC (% of queries with the first match at rank <= k):", "",
                    _md_table(["encoder"] + [f"k={k}" for k in ks],
                              [[_md_escape(r["encoder"])] + [_fmt(r["cmc"][k - 1]) for k in ks]
                               for r in cmc_rows]), ""]
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


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# ---------------------------------------------------------------- plots

def _png(fig) -> str:
    """A matplotlib figure as a base64 PNG (no timestamp or version in the file)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 7.0, height: float = 3.2):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _colors(encoders: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(encoders) <= 10 else "tab20"]
    return {e: cmap(i % cmap.N) for i, e in enumerate(encoders)}


def bar_chart(rows: list[dict[str, Any]], colors: dict[str, Any]) -> str:
    """Grouped bars: each metric (x) for each encoder (colour); base64 PNG."""
    names = _metric_names(rows)
    fig, ax = _figure(min(6.4, max(4.2, 1.0 + 0.75 * len(names))), 3.0)
    width = 0.8 / len(rows)
    x = np.arange(len(names))
    for i, r in enumerate(rows):
        values = [r["metrics"].get(n, np.nan) for n in names]
        ax.bar(x + (i - (len(rows) - 1) / 2) * width, values, width, label=r["encoder"],
               color=colors[r["encoder"]])
    ax.set_xticks(x, names)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize="small", ncols=min(len(rows), 4), loc="upper left",
              bbox_to_anchor=(0, -0.12), frameon=False)
    return _png(fig)


def cmc_chart(rows: list[dict[str, Any]], colors: dict[str, Any]) -> str | None:
    """CMC curves, one per encoder; base64 PNG (None without curves)."""
    rows = [r for r in rows if r["cmc"]]
    if not rows:
        return None
    fig, ax = _figure(4.4, 3.0)
    for r in rows:
        ks = np.arange(1, len(r["cmc"]) + 1)
        ax.plot(ks, r["cmc"], label=r["encoder"], color=colors[r["encoder"]], lw=1.8)
    # Stop where every curve has reached 100% (at least rank 10): the rest is flat.
    full = [int(np.argmax(np.asarray(r["cmc"]) >= 100.0)) + 1 if r["cmc"][-1] >= 100.0
            else len(r["cmc"]) for r in rows]
    ax.set_xlim(1, max(2, min(len(rows[0]["cmc"]), max(10, *full))))
    ax.set_ylim(0, 101)
    ax.set_xlabel("rank k")
    ax.set_ylabel("% queries matched at rank <= k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return _png(fig)


# ---------------------------------------------------------------- html

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1f2328; max-width: 1120px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.6em; margin-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
.meta { color: #59636e; margin-top: 0; }
table { border-collapse: collapse; margin: .6em 0 1em; font-variant-numeric: tabular-nums; }
th, td { padding: .3em .7em; border-bottom: 1px solid #e5e8eb; text-align: right; }
th { background: #f6f8fa; font-weight: 600; }
th:first-child, td:first-child { text-align: left; }
td.best { font-weight: 700; }
table.prov td, table.prov th { text-align: left; font-size: 12.5px; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; background: #f6f8fa;
       padding: .05em .3em; border-radius: 3px; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.plots figure { margin: 0; }
.plots figcaption { color: #59636e; font-size: 12.5px; }
.plots img { max-width: 100%; height: auto; }
footer { margin-top: 3em; color: #59636e; font-size: 12.5px; }
"""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _html_table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(text: str, best: bool = False) -> str:
    return f'<td class="best">{text}</td>' if best else f"<td>{text}</td>"


def render_html(doc: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS, base64 PNG plots, no external link)."""
    colors = _colors(doc["encoders"])
    groups = _by_dataset(doc)
    parts = [f"<h1>{_esc(doc['title'])}</h1>",
             f'<p class="meta">{len(doc["datasets"])} dataset(s) &times; '
             f'{len(doc["encoders"])} encoder(s) &middot; rankwise '
             f'{_esc(doc["rankwise_version"])} &middot; all numbers are percentages, '
             "best per column in bold</p>"]
    header = ["encoder"] + [f"{_esc(d)}<br><small>{_esc(HEADLINE.get(rows[0]['protocol'], ''))}"
                            "</small>" for d, rows in groups]
    body = []
    for e in doc["encoders"]:
        cells = [_td(_esc(e))]
        for _, rows in groups:
            r = next((r for r in rows if r["encoder"] == e), None)
            name = HEADLINE.get(rows[0]["protocol"])
            v = r["metrics"].get(name) if r else None
            cells.append(_td(_fmt(v), v is not None and v == _best(rows, name)))
        body.append(cells)
    parts += ["<h2>Overview</h2>", _html_table(header, body)]
    for dataset, rows in groups:
        first = rows[0]
        names = _metric_names(rows)
        parts += [f'<h2 id="{_esc(dataset)}">{_esc(dataset)}</h2>',
                  f'<p class="meta">protocol <code>{_esc(first["protocol"])}</code>, distance '
                  f'<code>{_esc(first["distance"])}</code>, {_esc(first["num_queries"])} '
                  f'queries ({_esc(first["num_skipped"])} skipped), '
                  f'{_esc(first["num_gallery"])} gallery items</p>']
        table = [[_td(_esc(r["encoder"]))]
                 + [_td(_fmt(r["metrics"].get(n)),
                        r["metrics"].get(n) is not None and r["metrics"].get(n) == _best(rows, n))
                    for n in names] for r in rows]
        parts.append(_html_table(["encoder"] + [_esc(n) for n in names], table))
        figures = [f'<figure><img alt="metrics per encoder on {_esc(dataset)}" '
                   f'src="data:image/png;base64,{bar_chart(rows, colors)}">'
                   "<figcaption>Metrics per encoder</figcaption></figure>"]
        cmc = cmc_chart(rows, colors)
        if cmc:
            what = "complete sketches" if first["protocol"] == "progressive" else "queries"
            figures.append(f'<figure><img alt="CMC curves on {_esc(dataset)}" '
                           f'src="data:image/png;base64,{cmc}"><figcaption>CMC: % of {what} '
                           "with the first match at rank &le; k</figcaption></figure>")
        parts.append('<div class="plots">' + "".join(figures) + "</div>")
        prov = [[_td(_esc(r["encoder"])),
                 _td(_esc(r["provenance"]["encoder_kind"] or "-")),
                 _td(f'<code title="{_esc(r["provenance"]["checkpoint_hash"] or "")}">'
                     f'{_esc(_short(r["provenance"]["checkpoint_hash"]))}</code>'),
                 _td(f'<code>{_esc(_short(r["provenance"]["manifest_hash"]["query"]))}</code>'),
                 _td(f'<code>{_esc(_short(r["provenance"]["manifest_hash"]["gallery"]))}'
                     "</code>"),
                 _td(_esc(r["embedding_dim"])),
                 _td(_esc(r["provenance"]["rankwise_version"] or "-"))] for r in rows]
        parts.append(_html_table(["encoder", "kind", "checkpoint sha256", "query manifest",
                                  "gallery manifest", "dim", "rankwise"], prov, "prov"))
        options = first["provenance"].get("protocol_options")
        if options:
            parts.append(f'<p class="meta">protocol options: '
                         f"<code>{_esc(json.dumps(options, sort_keys=True))}</code></p>")
    parts.append("<footer>Hashes are SHA-256 prefixes; the full values, every metric and "
                 "the CMC curves are in report.json.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_esc(doc['title'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            + "\n".join(parts) + "\n</body>\n</html>\n")


# ---------------------------------------------------------------- entry point

def write_report(metrics_paths: Iterable[str | os.PathLike], *, html_path=None, md_path=None,
                 json_path=None, title: str = "rankwise report",
                 cmc_max_rank: int = 50) -> dict[str, Any]:
    """Build the report and write the requested files (each atomically); return it."""
    from .store import write_text_atomic

    doc = build_report(metrics_paths, title=title, cmc_max_rank=cmc_max_rank)
    if json_path:
        write_text_atomic(json_path, json.dumps(doc, indent=2) + "\n")
    if md_path:
        write_text_atomic(md_path, render_markdown(doc))
    if html_path:
        write_text_atomic(html_path, render_html(doc))
    return doc
