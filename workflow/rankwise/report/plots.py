"""The report's charts (matplotlib, imported when drawn).

Each chart function draws a matplotlib ``Figure`` in a :class:`Style`: ``SCREEN`` for the
HTML page (embedded as base64 PNG, :func:`png`), ``PAPER`` for a one-column paper figure
(written as SVG and PDF by :mod:`.figures`).  :func:`dataset_plots` is the one list of
which charts a dataset gets, with their captions, for both.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import view
from .document import headline_names
from .view import best_row, ci, metric_names, sweep_positions


@dataclass(frozen=True)
class Style:
    """Size (inches) and font sizes (points) of a chart.

    ``width``/``height`` ``None``: each chart's own size (the HTML page's charts differ
    in width); a number: every chart that size.
    """

    width: float | None
    height: float | None
    font: float  # axis labels
    tick: float  # tick labels
    legend: float | str  # legend entries (points, or a size relative to the default 10)


SCREEN = Style(width=None, height=None, font=8, tick=8, legend="x-small")
# A one-column figure of a two-column paper (CVPR, IEEE: 3.3-3.5 in), text at 7-8 pt.
PAPER = Style(width=3.4, height=2.5, font=8, tick=7, legend=7)


@dataclass(frozen=True)
class Plot:
    """One chart of a dataset: ``kind`` names it in file names (``metrics``, ``cmc``,
    ``progressive``); ``caption`` is plain text; ``draw(style)`` returns the Figure."""

    kind: str
    alt: str
    caption: str
    draw: Callable[[Style], Any]


def dataset_plots(doc: dict[str, Any], rows: list[dict[str, Any]]) -> list[Plot]:
    """The charts of one dataset's ``rows`` (its results, in encoder order): the metrics
    (across encoders with two or more, else bars), the CMC curves when any encoder has
    one, the progressive curve when any has one."""
    colors = _colors(doc["encoders"])
    conf = view.confidence_label(doc)
    dataset = rows[0]["dataset"]
    # a caption names the intervals only when they are drawn
    intervals = view.has_intervals(rows)
    if len(rows) >= 2:
        sweep = sweep_positions(rows) is not None
        # trend_chart draws a metric's intervals only when every encoder has them (a
        # metric one encoder lacks, e.g. another ks, has no interval there)
        without = [r["encoder"] for r in rows if not r.get("ci95")]
        bare = [n for n in metric_names(rows) if not all(ci(r, n) for r in rows)]
        why = f"{', '.join(without)}: none computed" if without else "not every encoder has them"
        drawn = (
            ""
            if not intervals
            else f"; {'band' if sweep else 'bars'}: {conf} interval"
            if not bare
            else f"; no intervals drawn ({why})"
            if len(bare) == len(metric_names(rows))
            else f"; {'band' if sweep else 'bars'}: {conf} interval, none for "
            f"{', '.join(bare)} ({why})"
        )
        plots = [
            Plot(
                "metrics",
                f"metrics across encoders on {dataset}",
                (
                    "Each metric across the checkpoints of the sweep (x: the number in "
                    "each file name)"
                    if sweep
                    else "Each metric per encoder"
                )
                + drawn
                + "; ringed: the best",
                lambda style: trend_chart(rows, style),
            )
        ]
    else:
        plots = [
            Plot(
                "metrics",
                f"metrics on {dataset}",
                f"Metrics, with {conf} intervals" if intervals else "Metrics",
                lambda style: bar_chart(rows, colors, style),
            )
        ]
    if any(r["cmc"] for r in rows):
        plots.append(
            Plot(
                "cmc",
                f"CMC curves on {dataset}",
                f"CMC: % of {view.cmc_units(rows[0]['protocol'])} with the first match at rank ≤ k",
                lambda style: cmc_chart(rows, colors, style),
            )
        )
    if any(r.get("progressive") for r in rows):
        plots.append(
            Plot(
                "progressive",
                f"rank against completion on {dataset}",
                "Target's mean 1/rank against sketch completion (m@B averages it over "
                "steps)"
                + (
                    f"; band: {conf} interval"
                    if any(all(r["progressive"]["ci95"]) for r in rows if r.get("progressive"))
                    else ""
                ),
                lambda style: progressive_chart(rows, colors, style),
            )
        )
    verified = view.verification_rows(rows)
    if verified:
        plots.append(
            Plot(
                "roc",
                f"ROC curves on {dataset}",
                "ROC over every valid query-gallery pair: TPR at the largest threshold "
                "with FPR <= x (exact at each marked level)",
                lambda style: roc_chart(verified, colors, style),
            )
        )
        drawn = view.histogram_rows(rows)
        plots.append(
            Plot(
                "distances",
                f"distance histograms on {dataset}",
                "Distances of positive (same label, solid) and negative (dashed) pairs, "
                "each normalised to unit area"
                + ("" if len(drawn) == len(verified) else f" ({drawn[0]['encoder']}: the best)"),
                lambda style: distance_chart(drawn, colors, style),
            )
        )
    return plots


def png(fig) -> str:
    """A matplotlib figure as a base64 PNG: 256 colours (a third of the bytes), no
    timestamp or version in the file."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    buffer.seek(0)
    with Image.open(buffer) as image:
        small = image.convert("RGB").quantize(
            256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
        )
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _label(name: Any) -> str:
    """A name as matplotlib text: ``$`` escaped (mathtext read ``$x$`` as math, and
    failed on ``$\\x$``), a leading ``_`` behind a zero-width space (a label starting
    with ``_`` is left out of the legend)."""
    text = str(name).replace("$", r"\$")
    return "\u200b" + text if text.startswith("_") else text


def _figure(width: float, height: float, style: Style):
    """A figure of the style's size (else ``width`` x ``height`` inches) and one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(style.width or width, style.height or height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.tick_params(labelsize=style.tick)
    return fig, ax


def _colors(names: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {e: cmap(i % cmap.N) for i, e in enumerate(names)}


def _metric_colors(names: list[str]) -> dict[str, Any]:
    """Metric colours, from a palette the encoder colours (:func:`_colors`, tab10/tab20)
    never use, so a colour means a metric in one chart and an encoder in another."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return {n: cmap(0.9 * i / max(1, len(names) - 1)) for i, n in enumerate(names)}


def bar_chart(rows: list[dict[str, Any]], colors: dict[str, Any], style: Style = SCREEN):
    """Grouped bars: each metric (x) for each encoder (colour), with 95% error bars;
    a Figure."""
    names = metric_names(rows)
    fig, ax = _figure(min(4.6, max(3.2, 0.9 + 0.5 * len(names))), 2.8, style)
    width = 0.8 / len(rows)
    x = np.arange(len(names))
    for i, r in enumerate(rows):
        values = np.array([r["metrics"].get(n, np.nan) for n in names])
        cis = [ci(r, n) for n in names]
        err = np.array(
            [[v - c[0], c[1] - v] if c else [0.0, 0.0] for v, c in zip(values, cis, strict=True)]
        ).T
        ax.bar(
            x + (i - (len(rows) - 1) / 2) * width,
            values,
            width,
            label=_label(r["encoder"]),
            color=colors[r["encoder"]],
            yerr=np.clip(err, 0, None),
            capsize=2,
            error_kw={"lw": 0.8},
        )
    # ~14 characters of tick label per inch: slant the names when they would overlap
    long = sum(len(n) + 1 for n in names) > 14 * fig.get_size_inches()[0] * 0.8
    ax.set_xticks(
        x, [_label(n) for n in names], rotation=30 if long else 0, ha="right" if long else "center"
    )
    ax.set_ylim(0, 100)
    ax.set_ylabel("%", fontsize=style.font)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=style.legend, loc="upper right", frameon=False)
    return fig


def trend_chart(rows: list[dict[str, Any]], style: Style = SCREEN):
    """Every metric (colour) across the encoders of a dataset, with its 95% interval;
    a Figure.

    A checkpoint sweep (:func:`~rankwise.report.view.sweep_positions`) is drawn as lines
    over the number in each checkpoint's name (e.g. the epoch), shaded by the interval;
    other encoders have no order, so they are points with interval bars, never joined.
    The best encoder (first headline metric) is ringed.
    """
    names = metric_names(rows)
    colors = _metric_colors(names)
    fig, ax = _figure(3.8, 2.8, style)
    positions = sweep_positions(rows)
    x = np.array(positions if positions is not None else range(len(rows)), dtype=float)
    low, high = 100.0, 0.0
    for j, n in enumerate(names):
        values = np.array([r["metrics"].get(n, np.nan) for r in rows])
        cis = [ci(r, n) for r in rows]
        if positions is not None:
            ax.plot(x, values, color=colors[n], lw=1.6, marker="o", ms=3, label=_label(n))
            if all(cis):
                lo, hi = np.array(cis).T
                ax.fill_between(x, lo, hi, color=colors[n], alpha=0.15, lw=0)
        else:
            # side by side within each encoder, so equal values stay distinguishable
            shift = (j - (len(names) - 1) / 2) * min(0.12, 0.6 / max(1, len(names)))
            err = None
            if all(cis):
                lo, hi = np.array(cis).T
                # never negative (an interval can end an ulp inside its value's rounding)
                err = np.clip(np.vstack([values - lo, hi - values]), 0, None)
            ax.errorbar(
                x + shift,
                values,
                yerr=err,
                color=colors[n],
                fmt="o",
                ms=3.5,
                lw=1.0,
                capsize=2,
                label=_label(n),
            )
        if all(cis):
            lo, hi = np.array(cis).T
            low, high = min(low, lo.min()), max(high, hi.max())
        low, high = min(low, np.nanmin(values)), max(high, np.nanmax(values))
    head = (headline_names(rows) or [""])[0]
    if head in names:
        b = best_row(rows)
        shift = 0.0
        if positions is None:  # the headline metric's point sits at its own offset
            j = names.index(head)
            shift = (j - (len(names) - 1) / 2) * min(0.12, 0.6 / max(1, len(names)))
        ax.plot(
            [x[b] + shift],
            [rows[b]["metrics"][head]],
            marker="o",
            ms=10,
            mfc="none",
            mec="black",
            mew=1.2,
            ls="none",
            label=_label(f"best ({head})"),
        )
    pad = max(2.0, 0.06 * (high - low))
    ax.set_ylim(max(0.0, low - pad), min(100.0, high + pad) + 0.5)
    if positions is not None:
        ax.set_xlabel("checkpoint (number in its file name)", fontsize=style.font)
        ax.margins(x=0.05)
    else:
        labels = [_label(r["encoder"]) for r in rows]
        long = sum(len(e) for e in labels) > 36
        ax.set_xticks(x, labels, rotation=25 if long else 0, ha="right" if long else "center")
        ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylabel("%", fontsize=style.font)
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=style.legend,
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        frameon=False,
        handlelength=1.2,
    )
    return fig


def _percent_axes(ax, xlabel: str, ylabel: str, legend_loc: str, style: Style) -> None:
    """The common frame of the curve plots: a 0-100 % y axis, labels, grid, legend."""
    ax.set_ylim(0, 101)
    ax.set_xlabel(xlabel, fontsize=style.font)
    ax.set_ylabel(ylabel, fontsize=style.font)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=style.legend, loc=legend_loc)


_DASHES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P")


def cmc_chart(rows: list[dict[str, Any]], colors: dict[str, Any], style: Style = SCREEN):
    """CMC curves, one per encoder that has one (at least one must); a Figure."""
    rows = [r for r in rows if r["cmc"]]
    fig, ax = _figure(3.2, 2.8, style)
    # Equal curves (two encoders at 100% from rank 1) must not hide each other: each
    # encoder also has its own dash pattern and marker.
    for i, r in enumerate(rows):
        ks = np.arange(1, len(r["cmc"]) + 1)
        ax.plot(
            ks,
            r["cmc"],
            label=_label(r["encoder"]),
            color=colors[r["encoder"]],
            lw=1.6,
            ls=_DASHES[i % len(_DASHES)],
            marker=_MARKERS[i % len(_MARKERS)],
            ms=3.5,
            markevery=(i % 3, 3) if len(ks) > 10 else None,
        )
    # Stop where every curve has reached 100% (at least rank 10): the rest is flat.
    full = [
        int(np.argmax(np.asarray(r["cmc"]) >= 100.0)) + 1
        if r["cmc"][-1] >= 100.0
        else len(r["cmc"])
        for r in rows
    ]
    ax.set_xlim(1, max(2, min(len(rows[0]["cmc"]), max(10, *full))))
    _percent_axes(ax, "rank k", "% matched at rank <= k", "lower right", style)
    return fig


def progressive_chart(rows: list[dict[str, Any]], colors: dict[str, Any], style: Style = SCREEN):
    """Mean reciprocal rank of the target (%) against sketch completion, per encoder
    that has a progressive curve (at least one must), shaded by its 95% interval; a
    Figure."""
    rows = [r for r in rows if r.get("progressive")]
    fig, ax = _figure(3.2, 2.8, style)
    for r in rows:
        curve = r["progressive"]
        x = np.array(curve["completion"])
        ax.plot(
            x,
            curve["mean_reciprocal_rank"],
            label=_label(r["encoder"]),
            color=colors[r["encoder"]],
            lw=1.6,
            marker="o",
            ms=3,
        )
        if all(curve["ci95"]):
            lo, hi = np.array(curve["ci95"]).T
            ax.fill_between(x, lo, hi, color=colors[r["encoder"]], alpha=0.15, lw=0)
    ax.set_xlim(0, 102)
    _percent_axes(ax, "sketch completion (%)", "mean 1 / rank of target (%)", "upper left", style)
    return fig


def roc_chart(rows: list[dict[str, Any]], colors: dict[str, Any], style: Style = SCREEN):
    """ROC curves (log FPR, TPR %) of the rows' verification results; a Figure."""
    fig, ax = _figure(3.2, 2.8, style)
    for i, r in enumerate(rows):
        roc = r["verification"]["roc"]
        ax.plot(
            roc["fpr"],
            roc["tpr"],
            label=_label(r["encoder"]),
            color=colors[r["encoder"]],
            lw=1.6,
            ls=_DASHES[i % len(_DASHES)],
            marker=_MARKERS[i % len(_MARKERS)],
            ms=3,
        )
    ax.set_xscale("log")
    _percent_axes(ax, "false positive rate", "true positive rate (%)", "upper left", style)
    return fig


def distance_chart(rows: list[dict[str, Any]], colors: dict[str, Any], style: Style = SCREEN):
    """Positive (solid) and negative (dashed) pair-distance densities, one panel per row
    (encoders' distances differ in scale); a Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(rows)
    fig = Figure(figsize=(style.width or 3.2, style.height or 1.2 + 0.9 * n), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, rows, strict=True):
        ax.tick_params(labelsize=style.tick)
        hist = r["verification"]["histogram"]
        edges = np.asarray(hist["edges"])
        width = np.diff(edges)
        width[width == 0] = 1.0  # every distance equal: one spike, not a division by 0
        for kind, ls in (("positive", "-"), ("negative", "--")):
            counts = np.asarray(hist[kind], dtype=float)
            density = counts / max(counts.sum(), 1.0) / width
            ax.stairs(density, edges, color=colors[r["encoder"]], ls=ls, lw=1.4, label=kind)
        ax.set_yticks([])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=style.legend, loc="upper right", title=_label(r["encoder"]),
                  title_fontsize=style.legend)  # fmt: skip
    axes[-1].set_xlabel(
        _label(f"{rows[0]['verification'].get('distance', '')} distance"), fontsize=style.font
    )
    return fig
