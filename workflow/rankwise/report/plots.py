"""The report's charts (matplotlib, imported when drawn), as base64 PNG."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from .view import ci, metric_names


def _png(fig) -> str:
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
    names = metric_names(rows)
    fig, ax = _figure(min(4.6, max(3.2, 0.9 + 0.5 * len(names))), 2.8)
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
            label=r["encoder"],
            color=colors[r["encoder"]],
            yerr=np.clip(err, 0, None),
            capsize=2,
            error_kw={"lw": 0.8},
        )
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
    names = metric_names(rows)
    colors = _colors(names)
    fig, ax = _figure(3.8, 2.8)
    x = np.arange(len(rows))
    low, high = 100.0, 0.0
    for n in names:
        values = np.array([r["metrics"].get(n, np.nan) for r in rows])
        ax.plot(x, values, color=colors[n], lw=1.6, marker="o", ms=3, label=n)
        cis = [ci(r, n) for r in rows]
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
    ax.legend(
        fontsize="x-small",
        loc="center left",
        bbox_to_anchor=(1.0, 0.5),
        frameon=False,
        handlelength=1.2,
    )
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
    full = [
        int(np.argmax(np.asarray(r["cmc"]) >= 100.0)) + 1
        if r["cmc"][-1] >= 100.0
        else len(r["cmc"])
        for r in rows
    ]
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
        ax.plot(
            x,
            curve["mean_reciprocal_rank"],
            label=r["encoder"],
            color=colors[r["encoder"]],
            lw=1.6,
            marker="o",
            ms=3,
        )
        if all(curve["ci95"]):
            lo, hi = np.array(curve["ci95"]).T
            ax.fill_between(x, lo, hi, color=colors[r["encoder"]], alpha=0.15, lw=0)
    ax.set_xlim(0, 102)
    _percent_axes(ax, "sketch completion (%)", "mean 1 / rank of target (%)", "upper left")
    return _png(fig)
