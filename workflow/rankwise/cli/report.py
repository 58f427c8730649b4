"""``rankwise report``: the HTML / Markdown / JSON comparison of every dataset x encoder,
with bootstrap intervals, paired tests, CMC curves and the worst queries."""

from __future__ import annotations

from pathlib import Path

import click

from .. import options as spec
from . import shared


@click.command(cls=shared.Command)
@click.argument(
    "metrics", nargs=-1, required=True, type=shared.InputPath(dir_okay=False, names="metrics")
)
@click.option(
    "--out-dir",
    type=shared.OutputPath(file_okay=False),
    default=".",
    show_default=True,
    help="Folder for report.html, report.md and report.json (unless --html, "
    "--md or --json name the files).",
)
@click.option(
    "--html",
    "html_path",
    type=shared.OutputPath(dir_okay=False),
    help="Write the self-contained HTML report here.",
)
@click.option(
    "--md",
    "md_path",
    type=shared.OutputPath(dir_okay=False),
    help="Write the Markdown report here.",
)
@click.option(
    "--json",
    "json_path",
    type=shared.OutputPath(dir_okay=False),
    help="Write the JSON report (all metrics, intervals, comparisons, provenance) here.",
)
@click.option(
    "--csv",
    "csv_path",
    type=shared.OutputPath(dir_okay=False),
    help="Also write the tidy CSV (dataset, encoder, checkpoint, metric, value, "
    "ci_low, ci_high, num_queries, num_skipped) here.",
)
@click.option(
    "--tex",
    "tex_path",
    type=shared.OutputPath(dir_okay=False),
    help="Also write the LaTeX tables (booktabs; a standalone document) here.",
)
@click.option(
    "--figures",
    "figures_dir",
    type=shared.OutputPath(file_okay=False),
    help="Also write every chart sized for a paper column, as --figure-formats says "
    "(<dataset>-metrics, -cmc, -progressive; -roc, -distances with --verification) into "
    "this folder; the HTML and Markdown link them.",
)
@spec.TITLE.click(help="Report heading.")
@spec.CMC_MAX_RANK.click(help=f"CMC curves cover ranks 1..N (N at most {spec.MAX_CMC_RANK}).")
@spec.REPORT_RESAMPLES.click(
    help="Bootstrap resamples (and random sign flips) of the 95% "
    "intervals and the paired tests; 0 leaves them out."
)
@spec.SEED.click(help="Seed of the resampling: the same seed gives the same report.")
@spec.BY.click(
    help="Resample queries (sketches for progressive), or identities with all "
    "their queries (labels from the query manifest)."
)
@spec.WORST_QUERIES.click(
    help="List the N queries with the lowest AP (m@B per sketch for "
    "progressive), with their nearest gallery items; 0: none."
)
@spec.WORST_ENCODERS.click(
    help="Whose worst queries: the best encoder of each dataset, or every one."
)
@spec.TOP_K.click(help="Nearest gallery items shown per worst query.")
@click.option(
    "--verification",
    "verification",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A `rankwise verify` JSON, <dataset>/<encoder>.json (repeatable): its TPR@FPR, "
    "ROC curve and distance histograms join that result.",
)
@click.option(
    "--cache",
    "cache_dir",
    type=shared.OutputPath(file_okay=False),
    help="Keep each paired test in this folder, keyed by both evaluations' content: "
    "a report with one new encoder recomputes only the pairs that involve it (also the "
    "worst queries and the PDF figures' font subsets). Safe to delete.",
)
@spec.FIGURE_FORMATS.click(
    help="The files of each --figures chart: SVG and PDF, or one of them (a PDF takes "
    "about twice as long: its fonts are embedded)."
)
@spec.WORKERS.click(
    help="Processes: with 2 or more the paper figures are drawn beside the documents "
    "(default: all cores; the same files either way)."
)
def report(
    metrics,
    out_dir,
    html_path,
    md_path,
    json_path,
    csv_path,
    tex_path,
    figures_dir,
    figure_formats,
    cache_dir,
    workers,
    **options,
):
    """Compare encoders across datasets from `rankwise metrics` JSON files.

    METRICS are the --output files of `rankwise metrics`, named
    <dataset>/<encoder>.json (the pipeline's results/metrics/ layout), given in the
    order the encoders should appear (e.g. epochs). The ranks store, manifests and
    embedding stores each file's provenance names are read for the intervals, the
    paired tests, the CMC curves and the worst queries, unless the statistics
    summary each file names (`rankwise metrics --stats-output`) was computed for
    the same --resamples, --seed, --by and --cmc-max-rank.
    """
    import os

    from ..extras import require

    require("matplotlib", "rankwise report")  # before the report module imports it
    from ..report import view, write_report
    from ..report.pairs import PairCache
    from ..stats import coarse_interval

    cache = PairCache(cache_dir)

    if not (html_path or md_path or json_path):
        html_path, md_path, json_path = (p for _, p, _ in _default_outputs({"out_dir": out_dir}))
    doc = write_report(
        metrics,
        html_path=html_path,
        md_path=md_path,
        json_path=json_path,
        csv_path=csv_path,
        tex_path=tex_path,
        cache=cache,
        figures_dir=figures_dir,
        figure_formats=tuple(figure_formats.split(",")),
        workers=workers or os.cpu_count() or 1,  # as the rank engine's default
        **options,
    )
    stats = doc["statistics"]  # the report's intervals: their resamples and confidence
    coarse = (
        coarse_interval(stats["resamples"], stats["confidence"]) if stats["resamples"] else None
    )
    if coarse:
        click.echo(f"note: {coarse}", err=True)
    lacking = view.missing_metrics_line(doc)
    if lacking:
        click.echo(f"note: {lacking}", err=True)
    missing = view.no_statistics_line(doc)
    if missing:
        click.echo(
            f"note: {missing} (a relative path is looked for from this folder, then "
            "from the one its evaluation ran in)",
            err=True,
        )
    for path in (html_path, md_path, json_path, csv_path, tex_path):
        if path:
            click.echo(f"wrote {path}")
    if figures_dir:
        click.echo(f"wrote {len(doc['figures'])} figures ({figure_formats}) in {figures_dir}")
    significant = sum(c["significant"] for c in doc["comparisons"])
    if cache_dir:
        click.echo(
            f"paired tests: {cache.computed} computed, {cache.extended} extended, "
            f"{cache.reused} reused ({cache_dir})"
        )
    click.echo(
        f"{len(doc['results'])} results: {len(doc['datasets'])} dataset(s) x "
        f"{len(doc['encoders'])} encoder(s); {len(doc['comparisons'])} comparisons, "
        f"{significant} significant"
    )


def _default_outputs(params: dict) -> list[tuple[str, Path, str]]:
    """report.html, report.md and report.json in --out-dir, unless --html, --md or
    --json name a file (checked against the inputs like them: an input metrics file
    named report.json was replaced)."""
    if params.get("html_path") or params.get("md_path") or params.get("json_path"):
        return []
    out = Path(params["out_dir"])
    fix = "give --out-dir another folder, or name the files with --html, --md and --json"
    return [("--out-dir", out / f"report.{ext}", fix) for ext in ("html", "md", "json")]


report.derived_outputs = _default_outputs
