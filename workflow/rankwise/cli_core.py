"""``rankwise evaluate``, ``rankwise rank`` and ``rankwise metrics``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .api import REPORT_KEYS, format_text, rank, result_from_ranks
from .manifest import PROTOCOLS
from .metrics import AP_VARIANTS, parse_ks
from .ranking import DISTANCES
from .store import read_ranks, write_ranks, write_text_atomic

_CHOICE = dict(case_sensitive=True)


def _inputs(func):
    """Options shared by ``evaluate`` and ``rank``."""
    options = [
        click.option("--query", "query", required=True, type=click.Path(dir_okay=False),
                     help="Query manifest (CSV)."),
        click.option("--gallery", "gallery", required=True, type=click.Path(dir_okay=False),
                     help="Gallery manifest (CSV)."),
        click.option("--query-embeddings", required=True, type=click.Path(),
                     help="Query embeddings: .npy (N x D) or Zarr store."),
        click.option("--gallery-embeddings", required=True, type=click.Path(),
                     help="Gallery embeddings: .npy (N x D) or Zarr store."),
        click.option("--protocol", default="recall", show_default=True,
                     help=f"One of: {', '.join(PROTOCOLS)}."),
        click.option("--distance", default="cosine", show_default=True,
                     help=f"One of: {', '.join(DISTANCES)}."),
        click.option("--gap-frames", default=1, show_default=True, type=int,
                     help="reassociation: candidates are at frame + N."),
        click.option("--junk-labels", default="-1", show_default=True,
                     help="reid: comma-separated labels removed from the gallery."),
        click.option("--query-block", default=1024, show_default=True, type=int,
                     help="Queries per tile."),
        click.option("--gallery-chunk", default=8192, show_default=True, type=int,
                     help="Gallery rows per tile."),
        click.option("--workers", default=None, type=int,
                     help="Threads (default: all cores)."),
        click.option("--scheduler", default=None,
                     help="dask.distributed scheduler address (default: local threads)."),
        click.option("--memory-limit", "memory_limit", default=None, type=float,
                     help="MB; refuse to start when the estimated peak exceeds it."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _rank(kw, progress: bool):
    junk = tuple(j.strip() for j in kw["junk_labels"].split(",") if j.strip())
    return rank(kw["query"], kw["gallery"], kw["query_embeddings"], kw["gallery_embeddings"],
                protocol=kw["protocol"], distance=kw["distance"], gap_frames=kw["gap_frames"],
                junk_labels=junk, query_block=kw["query_block"],
                gallery_chunk=kw["gallery_chunk"], workers=kw["workers"],
                scheduler=kw["scheduler"], progress=progress,
                memory_limit_mb=kw["memory_limit"])


def _emit(report: dict, output: str | None, text_output: str | None = None) -> None:
    text = format_text(report)
    click.echo(text, nl=False)
    if output:
        write_text_atomic(output, json.dumps(report, indent=2) + "\n")
    if text_output:
        write_text_atomic(text_output, text)


@click.command()
@_inputs
@click.option("--ks", default="1,5,10", show_default=True, help="Cutoffs K, comma-separated.")
@click.option("--ap", default="standard", show_default=True, type=click.Choice(AP_VARIANTS),
              help="AP variant: standard, or the official Market-1501 trapezoid.")
@click.option("--output", type=click.Path(dir_okay=False), help="Write the JSON report here.")
def evaluate(ks, ap, output, **kw):
    """Rank and score in one go; print the text report, write the JSON report."""
    ks = parse_ks(ks)
    result = result_from_ranks(_rank(kw, progress=False), ks=ks, ap=ap)
    _emit(result.to_json(), output)


@click.command(name="rank")
@_inputs
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="Ranks store to write (Zarr, written atomically).")
def rank_command(out, **kw):
    """Compute the ranks store that every metric is computed from."""
    result = _rank(kw, progress=True)
    attrs = dict(result.attrs)
    for side in ("query", "gallery"):
        attrs[f"{side}_embeddings"] = _provenance(kw[f"{side}_embeddings"])
        attrs[f"{side}_manifest"] = str(kw[side])
    write_ranks(out, result.arrays(), attrs)
    click.echo(f"{out}: {attrs['num_queries']} queries ranked, {attrs['num_skipped']} skipped")


def _provenance(path: str) -> dict:
    """The attributes of a rankwise embedding store, or just the file name."""
    import zarr

    if Path(path).is_dir():
        try:
            attrs = dict(zarr.open_group(path, mode="r").attrs)
            return {k: v for k, v in attrs.items() if k != "complete"} | {"path": str(path)}
        except Exception:  # a bare Zarr array has no group attributes
            pass
    return {"path": str(path)}


@click.command()
@click.argument("ranks", type=click.Path())
@click.option("--ks", default="1,5,10", show_default=True, help="Cutoffs K, comma-separated.")
@click.option("--ap", default="standard", show_default=True, type=click.Choice(AP_VARIANTS))
@click.option("--output", type=click.Path(dir_okay=False), help="Write the JSON report here.")
@click.option("--text-output", type=click.Path(dir_okay=False),
              help="Write the text report here too.")
def metrics(ranks, ks, ap, output, text_output):
    """Score a ranks store: print the text report, write the JSON report (+ provenance)."""
    arrays, attrs = read_ranks(ranks)
    result = result_from_ranks((arrays, attrs), ks=parse_ks(ks), ap=ap)
    report = result.to_json()
    assert tuple(report) == REPORT_KEYS
    report["provenance"] = {k: v for k, v in attrs.items() if k not in ("complete", "kind")}
    report["provenance"].update({"ks": list(parse_ks(ks)), "ap": ap, "ranks": str(ranks)})
    _emit(report, output, text_output)


COMMANDS = [evaluate, rank_command, metrics]
