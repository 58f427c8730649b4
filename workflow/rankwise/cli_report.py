"""``rankwise report``: the HTML / Markdown / JSON comparison of every dataset x encoder,
with bootstrap intervals, paired tests, CMC curves and the worst queries."""

from __future__ import annotations

from pathlib import Path

import click

from .report import WORST_ENCODERS
from .stats import BY, DEFAULT_RESAMPLES


@click.command()
@click.argument("metrics", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out-dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Folder for report.html, report.md and report.json (unless --html, "
                   "--md or --json name the files).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Write the self-contained HTML report here.")
@click.option("--md", "md_path", type=click.Path(dir_okay=False),
              help="Write the Markdown report here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the JSON report (all metrics, intervals, comparisons, "
                   "provenance) here.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False),
              help="Also write the tidy CSV (dataset, encoder, checkpoint, metric, value, "
                   "ci_low, ci_high, num_queries, num_skipped) here.")
@click.option("--tex", "tex_path", type=click.Path(dir_okay=False),
              help="Also write the LaTeX tables (booktabs; a standalone document) here.")
@click.option("--title", default="rankwise report", show_default=True, help="Report heading.")
@click.option("--cmc-max-rank", default=50, show_default=True, type=int,
              help="CMC curves cover ranks 1..N.")
@click.option("--resamples", default=DEFAULT_RESAMPLES, show_default=True, type=int,
              help="Bootstrap resamples (and random sign flips) of the 95% intervals and "
                   "the paired tests; 0 leaves them out.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the resampling: the same seed gives the same report.")
@click.option("--by", default="query", show_default=True, type=click.Choice(BY),
              help="Resample queries (sketches for progressive), or identities with all "
                   "their queries (labels from the query manifest).")
@click.option("--worst-queries", default=5, show_default=True, type=int,
              help="List the N queries with the lowest AP (m@B per sketch for "
                   "progressive), with their nearest gallery items; 0: none.")
@click.option("--worst-encoders", default="best", show_default=True,
              type=click.Choice(WORST_ENCODERS),
              help="Whose worst queries: the best encoder of each dataset, or every one.")
@click.option("--top-k", default=10, show_default=True, type=int,
              help="Nearest gallery items shown per worst query.")
def report(metrics, out_dir, html_path, md_path, json_path, csv_path, tex_path, **options):
    """Compare encoders across datasets from `rankwise metrics` JSON files.

    METRICS are the --output files of `rankwise metrics`, named
    <dataset>/<encoder>.json (the pipeline's results/metrics/ layout), given in the
    order the encoders should appear (e.g. epochs). The ranks store, manifests and
    embedding stores each file's provenance names are read for the intervals, the
    paired tests, the CMC curves and the worst queries.
    """
    from .report import write_report

    if not (html_path or md_path or json_path):
        out = Path(out_dir)
        html_path, md_path, json_path = (out / "report.html", out / "report.md",
                                         out / "report.json")
    doc = write_report(metrics, html_path=html_path, md_path=md_path, json_path=json_path,
                       csv_path=csv_path, tex_path=tex_path, **options)
    for path in (html_path, md_path, json_path, csv_path, tex_path):
        if path:
            click.echo(f"wrote {path}")
    significant = sum(c["significant"] for c in doc["comparisons"])
    click.echo(f"{len(doc['results'])} results: {len(doc['datasets'])} dataset(s) x "
               f"{len(doc['encoders'])} encoder(s); {len(doc['comparisons'])} comparisons, "
               f"{significant} significant")


COMMANDS = [report]
