"""``rankwise report``: the HTML / Markdown / JSON comparison of every dataset x encoder."""

from __future__ import annotations

from pathlib import Path

import click


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
              help="Write the JSON report (all metrics + provenance) here.")
@click.option("--title", default="rankwise report", show_default=True, help="Report heading.")
@click.option("--cmc-max-rank", default=50, show_default=True, type=int,
              help="CMC curves cover ranks 1..N.")
def report(metrics, out_dir, html_path, md_path, json_path, title, cmc_max_rank):
    """Compare encoders across datasets from `rankwise metrics` JSON files.

    METRICS are the --output files of `rankwise metrics`, named
    <dataset>/<encoder>.json (the pipeline's results/metrics/ layout). CMC curves are
    read from the ranks store each file's provenance names.
    """
    from .report import write_report

    if not (html_path or md_path or json_path):
        out = Path(out_dir)
        html_path, md_path, json_path = (out / "report.html", out / "report.md",
                                         out / "report.json")
    doc = write_report(metrics, html_path=html_path, md_path=md_path, json_path=json_path,
                       title=title, cmc_max_rank=cmc_max_rank)
    for path in (html_path, md_path, json_path):
        if path:
            click.echo(f"wrote {path}")
    click.echo(f"{len(doc['results'])} results: {len(doc['datasets'])} dataset(s) x "
               f"{len(doc['encoders'])} encoder(s)")


COMMANDS = [report]
