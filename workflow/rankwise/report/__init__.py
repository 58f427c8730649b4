"""The comparison report: every dataset x encoder, with intervals and tests, as HTML,
Markdown and JSON (and, on request, CSV and LaTeX).

Inputs are the JSON files written by ``rankwise metrics`` (one per dataset x encoder).
Each holds the numbers and a ``provenance`` dict (the ranks store's attributes, with
the embedding stores' attributes under ``query_embeddings`` / ``gallery_embeddings``
and the ranks store's path under ``ranks``).  Names come from the pipeline layout
``.../metrics/<dataset>/<encoder>.json``: the folder is the dataset, the file stem
the encoder.  Datasets and encoders keep the order in which they are given (the
pipeline gives them in config order, so a series of checkpoints reads as epochs).

Everything else is read from the metrics job's statistics summary or the ranks store
(and, for the worst queries, the manifests and embedding stores) that the provenance
names; paths are relative to
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
``ALL_PAIRS_MAX`` of them, else of each encoder against the previous one and of the best
one with statistics against the others;
p-values from the paired sign-flip test, adjusted by Holm across every comparison in
the report; ``significant`` means ``p_holm < ALPHA``.  The intervals of the
differences use ``resamples`` bootstrap resamples; the tests :func:`flip_resamples`
sign flips: at least ``resamples``, and enough that the smallest Monte Carlo p-value
can survive Holm's correction.

Incremental: the per-evaluation statistics (intervals, CMC, completion curve, the
per-query values) come from the statistics summary the metrics job wrote
(:mod:`rankwise.summary`) when it was computed for the report's settings, else from the
ranks store; each paired test (and worst-queries list) is kept in a cache keyed by the
inputs' content (:mod:`.pairs`), so a report with one new encoder computes only the
pairs that involve it.

Outputs, all rendered from one document (:func:`build_report`, plain data) through
one view-model of cells and words (:mod:`.view`):

- JSON: the document (every metric, ``ci95``, CMC, curves, worst queries, provenance,
  and the top-level ``comparisons`` list).
- Markdown: per dataset the metrics with intervals, the differences, CMC, worst
  queries (ids) and provenance.
- CSV (tidy, one row per dataset x encoder x metric) and LaTeX (booktabs tables per
  dataset), on request.
- HTML: one self-contained file (inline CSS, plots and thumbnails as base64 PNG, no
  external link but to the paper figures); long sections are collapsed (``<details>``).
- Paper figures (:mod:`.figures`), on request: each chart as SVG and PDF, one paper
  column wide, listed in ``figures`` and linked from the HTML and Markdown.

Nothing in the output depends on the time or the machine: the same inputs and
options give the same bytes.

Modules: :mod:`.constants` (settings read by all), :mod:`.document` (the document),
:mod:`.comparisons`, :mod:`.curves`, :mod:`.worst` (its parts), :mod:`.view` (the
shared view-model), :mod:`.markdown`, :mod:`.html` (+ ``report.css``), :mod:`.plots`,
:mod:`.figures`, :mod:`.thumbnails`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from .comparisons import comparison_pairs, flip_resamples
from .constants import (
    ALL_PAIRS_MAX,
    ALPHA,
    CMC_TABLE_RANKS,
    CONFIDENCE,
    THUMBNAIL_PX,
    WORST_ENCODERS,
)
from .csv_table import render_csv
from .curves import cmc_curve, progressive_curve
from .document import build_report
from .figures import DrawInBackground, draw_figures, plan_figures, write_figures
from .html import render_html
from .latex import render_latex
from .markdown import render_markdown
from .worst import worst_queries_of

__all__ = [
    "ALL_PAIRS_MAX",
    "ALPHA",
    "CMC_TABLE_RANKS",
    "CONFIDENCE",
    "THUMBNAIL_PX",
    "WORST_ENCODERS",
    "build_report",
    "cmc_curve",
    "comparison_pairs",
    "flip_resamples",
    "progressive_curve",
    "render_csv",
    "render_html",
    "render_latex",
    "render_markdown",
    "worst_queries_of",
    "write_figures",
    "write_report",
]


def write_report(
    metrics_paths: Iterable[str | os.PathLike],
    *,
    html_path=None,
    md_path=None,
    json_path=None,
    csv_path=None,
    tex_path=None,
    figures_dir=None,
    figure_formats=("svg", "pdf"),
    workers: int = 1,
    **options,
) -> dict[str, Any]:
    """Build the report (``options``: those of :func:`build_report`) and write the
    requested files (each atomically), and the paper figures into ``figures_dir``
    as ``figure_formats`` (:mod:`.figures`; listed in ``doc["figures"]``, linked from
    HTML and Markdown); return the document.

    ``workers >= 2``: a second process starts drawing the paper figures as soon as the
    results have their statistics, while this one adds the worst queries and the paired
    tests and renders the documents, then draws the figures the other has not begun
    (the same bytes either way); the files are written once both are done, so a failure
    leaves no document linking a missing figure.
    """
    from ..store import StagedFiles

    # every file staged under a temporary name, all renamed in at the end: a failure
    # (a full disk at the third document) leaves the old report whole
    files = StagedFiles()
    figures = _Figures(figures_dir, figure_formats, files, workers, options.get("cache"))
    try:
        doc = build_report(metrics_paths, on_statistics=figures.start, **options)
        doc["figures"] = figures.entries
        texts = _render(doc, json_path, md_path, html_path, csv_path, tex_path)
        figures.finish()
        for path, text in texts:
            files.write(path, text.encode("utf-8"))
    except BaseException:
        # the child ended before its files are discarded with the others (an interrupt
        # while waiting for it: it would go on writing them after the discard)
        figures.stop()
        files.discard()
        raise
    files.commit()
    return doc


class _Figures:
    """The paper figures of :func:`write_report`: planned, and with ``workers >= 2``
    begun in a second process, when the document has its statistics (:meth:`start`,
    ``build_report``'s ``on_statistics``); drawn (the rest of them) by :meth:`finish`."""

    def __init__(self, folder, formats, files, workers: int, fonts=None):
        self.folder, self.formats, self.files, self.workers = folder, formats, files, workers
        self.fonts = fonts  # the PDF font subsets' cache (figures._vector)
        self.plan: list = []
        self.background: DrawInBackground | None = None
        self._blas: Any = None  # BLAS's thread limit while the second process draws

    @property
    def entries(self) -> list[dict[str, Any]]:
        """``doc["figures"]``."""
        return [entry for entry, _ in self.plan]

    def start(self, doc: dict[str, Any]) -> None:
        if not self.folder:
            return
        self.plan = plan_figures(doc, self.folder, self.formats)
        if self.workers >= 2 and len(self.plan) >= 2:
            from threadpoolctl import threadpool_limits

            self.background = DrawInBackground(self.plan, self.files, self.fonts)
            # the paired tests' products on one thread meanwhile: the second process has
            # the other core (two BLAS threads beside it took 1.5-2.3x as long on 2 cores);
            # BLAS splits a product's rows and columns, never a sum: the same numbers
            self._blas = threadpool_limits(1)

    def finish(self) -> None:
        if self.background is None:
            draw_figures(self.plan, self.files, self.fonts)
            return
        self.background.draw_rest()
        self.background.wait()
        self._unlimit()

    def stop(self) -> None:
        if self.background is not None:
            self.background.stop()
        self._unlimit()

    def _unlimit(self) -> None:
        if self._blas is not None:
            self._blas.restore_original_limits()
            self._blas = None


def _render(doc, json_path, md_path, html_path, csv_path, tex_path) -> list[tuple[Any, str]]:
    """``(path, text)`` of each requested document."""
    texts = []
    if json_path:
        texts.append((json_path, json.dumps(doc, indent=2) + "\n"))
    if md_path:
        texts.append((md_path, render_markdown(doc, links_from=_folder(md_path))))
    if html_path:
        texts.append((html_path, render_html(doc, links_from=_folder(html_path))))
    if csv_path:
        texts.append((csv_path, render_csv(doc)))
    if tex_path:
        texts.append((tex_path, render_latex(doc)))
    return texts


def _folder(path: str | os.PathLike) -> str:
    """The folder a written file's relative links start from."""
    return os.path.dirname(os.fspath(path)) or "."
