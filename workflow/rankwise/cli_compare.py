"""``rankwise compare``, ``rankwise ci`` and ``rankwise scores``: statistics of ranks stores.

See :mod:`rankwise.stats` for the bootstrap, the sign-flip test and Holm's correction.
"""

from __future__ import annotations

import io
import json

import click
import numpy as np
import pandas as pd

from .metrics import AP_VARIANTS, parse_ks, per_unit, unit_scores
from .registry import get_protocol
from .stats import (BY, DEFAULT_RESAMPLES, ci_key, compare_ranks, format_p, metric_cis,
                    resolve_metrics)
from .store import read_ranks, write_text_atomic


def _stat_options(func):
    """Options shared by ``compare`` and ``ci``."""
    options = [
        click.option("--ks", default="1,5,10", show_default=True,
                     help="Cutoffs K, comma-separated (for the default metrics)."),
        click.option("--metrics", default=None,
                     help="Metrics, comma-separated (e.g. map,rank1); default: all of the "
                          "protocol's for --ks."),
        click.option("--ap", default="standard", show_default=True,
                     type=click.Choice(AP_VARIANTS), help="AP variant."),
        click.option("--resamples", default=DEFAULT_RESAMPLES, show_default=True, type=int,
                     help="Bootstrap resamples (and random sign flips)."),
        click.option("--seed", default=0, show_default=True, type=int,
                     help="Seed: the same seed gives the same numbers everywhere."),
        click.option("--confidence", default=0.95, show_default=True, type=float,
                     help="Coverage of the percentile bootstrap interval."),
        click.option("--by", default="query", show_default=True, type=click.Choice(BY),
                     help="Resample queries (sketches for progressive), or identities "
                          "with all their queries (labels from the query manifest)."),
        click.option("--labels", type=click.Path(dir_okay=False),
                     help="--by identity: query manifest CSV (default: the one named in "
                          "the ranks store)."),
        click.option("--output", type=click.Path(dir_okay=False),
                     help="Write the JSON result here."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [header, *rows]]
    return "\n".join(lines) + "\n"


def _units(protocol: str, by: str, n_units: int, n_clusters: int) -> str:
    spec = get_protocol(protocol)
    units, unit = spec.units, spec.unit
    if by == "identity":
        return f"{n_units} {units} in {n_clusters} identities (resampled by identity)"
    return f"{n_units} {units} (resampled by {unit})"


def _write_json(path, doc) -> None:
    if path:
        write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


@click.command()
@click.argument("ranks_a", type=click.Path())
@click.argument("ranks_b", type=click.Path())
@_stat_options
@click.option("--exact-max", default=16, show_default=True, type=int,
              help="Enumerate all 2^n sign flips when there are at most this many "
                   "queries (identities).")
@click.option("--dataset", default=None, help="Dataset name copied into the JSON rows.")
def compare(ranks_a, ranks_b, ks, metrics, ap, resamples, seed, confidence, by, labels,
            output, exact_max, dataset):
    """Paired comparison of two encoders' ranks stores on the same queries.

    Prints, per metric, A, B, the difference B - A (percentage points), its paired
    bootstrap interval, the sign-flip randomisation p-value and the Holm-adjusted one.
    """
    arrays_a, attrs_a = read_ranks(ranks_a)
    arrays_b, attrs_b = read_ranks(ranks_b)
    rows = compare_ranks(arrays_a, attrs_a, arrays_b, attrs_b, ks=parse_ks(ks),
                         metrics=metrics, ap=ap, resamples=resamples, seed=seed, by=by,
                         labels=labels, confidence=confidence, exact_max=exact_max,
                         dataset=dataset, names=(str(ranks_a), str(ranks_b)))
    key = ci_key(confidence)
    first = rows[0]
    test = ("exact test over all sign flips" if first["test"] == "exact"
            else f"{resamples} random sign flips")
    click.echo(f"A: {ranks_a}\nB: {ranks_b}\n"
               f"protocol: {attrs_a['protocol']}; "
               f"{_units(attrs_a['protocol'], by, first['num_units'], first['num_clusters'])}; "
               f"{resamples} bootstrap resamples, {test}, seed {seed}")
    header = ["metric", "A", "B", "diff", f"{100 * confidence:g}% CI", "p", "p_holm"]
    body = [[r["metric"], f"{r['a']:.2f}", f"{r['b']:.2f}", f"{r['diff']:+.2f}",
             f"[{r[key][0]:+.2f}, {r[key][1]:+.2f}]", format_p(r["p_value"]),
             format_p(r["p_holm"])] for r in rows]
    click.echo(_table(header, body), nl=False)
    _write_json(output, {"a": str(ranks_a), "b": str(ranks_b),
                         "protocol": attrs_a["protocol"], "ap": ap, "by": by,
                         "resamples": resamples, "seed": seed, "confidence": confidence,
                         "exact_max": exact_max, "comparisons": rows})


@click.command()
@click.argument("ranks", type=click.Path())
@_stat_options
def ci(ranks, ks, metrics, ap, resamples, seed, confidence, by, labels, output):
    """Bootstrap confidence interval of every metric of one ranks store."""
    arrays, attrs = read_ranks(ranks)
    names = resolve_metrics(attrs["protocol"], metrics, parse_ks(ks))
    intervals = metric_cis(arrays, attrs, metrics=names, ap=ap, resamples=resamples,
                           seed=seed, by=by, labels=labels, confidence=confidence)
    table = per_unit(arrays, attrs, names, ap=ap)
    point = table.means()
    click.echo(f"{ranks}: protocol {attrs['protocol']}, {len(table)} "
               f"{get_protocol(attrs['protocol']).units}; "
               f"{resamples} bootstrap resamples by {by}, seed {seed}")
    header = ["metric", "value", f"{100 * confidence:g}% CI"]
    body = [[n, f"{point[n]:.2f}", f"[{intervals[n][0]:.2f}, {intervals[n][1]:.2f}]"]
            for n in names]
    click.echo(_table(header, body), nl=False)
    _write_json(output, {"ranks": str(ranks), "protocol": attrs["protocol"], "ap": ap,
                         "by": by, "resamples": resamples, "seed": seed,
                         "confidence": confidence, "num_units": len(table),
                         "metrics": point, ci_key(confidence): intervals})


@click.command()
@click.argument("ranks", type=click.Path())
@click.option("--ks", default="1,5,10", show_default=True, help="Cutoffs of the hit@K columns.")
@click.option("--ap", default="standard", show_default=True, type=click.Choice(AP_VARIANTS))
@click.option("--output", type=click.Path(dir_okay=False),
              help="Write the CSV here (default: standard output).")
def scores(ranks, ks, ap, output):
    """Per-query scores (per sketch for progressive) of a ranks store, as CSV.

    Columns: query_index, num_relevant, first_rank, ap, inp, rr, hit@K (fractions and
    0/1); progressive: sketch, query_index, m@A, m@B, wm@A, wm@B, last_rank, hit@K.
    """
    arrays, attrs = read_ranks(ranks)
    table = pd.DataFrame(unit_scores(arrays, attrs, ks=parse_ks(ks), ap=ap))
    hits = [c for c in table.columns if c.startswith("hit@")]
    table[hits] = table[hits].astype(np.int64)
    buffer = io.StringIO()
    table.to_csv(buffer, index=False, float_format="%.10g")
    if output:
        write_text_atomic(output, buffer.getvalue())
        click.echo(f"{output}: {len(table)} rows")
    else:
        click.echo(buffer.getvalue(), nl=False)


COMMANDS = [compare, ci, scores]
