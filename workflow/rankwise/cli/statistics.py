"""``rankwise compare``, ``rankwise ci`` and ``rankwise scores``: statistics of ranks stores.

See :mod:`rankwise.stats` for the bootstrap, the sign-flip test and Holm's correction.
"""

from __future__ import annotations

import click

from .. import options as spec
from ..registry import get_protocol
from . import shared


def _units(protocol: str, by: str, n_units: int, n_clusters: int) -> str:
    protocol_spec = get_protocol(protocol)
    units, unit = protocol_spec.units, protocol_spec.unit
    if by == "identity":
        return f"{n_units} {units} in {n_clusters} identities (resampled by identity)"
    return f"{n_units} {units} (resampled by {unit})"


@click.command(cls=shared.Command)
@click.argument("ranks_a", type=shared.InputPath(names="ranks"))
@click.argument("ranks_b", type=shared.InputPath(names="ranks"))
@shared.statistics
@spec.EXACT_MAX.click(
    help="Enumerate all 2^n sign flips when there are at most this many queries (identities)."
)
@click.option("--dataset", default=None, help="Dataset name copied into the JSON rows.")
def compare(
    ranks_a,
    ranks_b,
    ks,
    metrics,
    ap,
    resamples,
    seed,
    confidence,
    by,
    labels,
    output,
    exact_max,
    dataset,
):
    """Paired comparison of two encoders' ranks stores on the same queries.

    Prints, per metric, A, B, the difference B - A (percentage points), its paired
    bootstrap interval, the sign-flip randomisation p-value and the Holm-adjusted one.
    """
    from ..options import check_ap
    from ..stats import (
        ALPHA,
        ci_key,
        coarse_interval,
        compare_ranks,
        format_p,
        never_significant,
    )
    from ..store import read_ranks

    arrays_a, attrs_a = read_ranks(ranks_a)
    arrays_b, attrs_b = read_ranks(ranks_b)
    check_ap(ap, attrs_a["protocol"], "--ap")
    rows = compare_ranks(
        arrays_a,
        attrs_a,
        arrays_b,
        attrs_b,
        ks=ks,
        metrics=metrics,
        ap=ap,
        resamples=resamples,
        seed=seed,
        by=by,
        labels=labels,
        confidence=confidence,
        exact_max=exact_max,
        dataset=dataset,
        names=(str(ranks_a), str(ranks_b)),
    )
    key = ci_key(confidence)
    first = rows[0]
    test = (
        "exact test over all sign flips"
        if first["test"] == "exact"
        else f"{resamples} random sign flips"
    )
    click.echo(
        f"A: {ranks_a}\nB: {ranks_b}\n"
        f"protocol: {attrs_a['protocol']}; "
        f"{_units(attrs_a['protocol'], by, first['num_units'], first['num_clusters'])}; "
        f"{resamples} bootstrap {'resample' if resamples == 1 else 'resamples'}, {test}, "
        f"seed {seed}"
    )
    header = ["metric", "A", "B", "diff", f"{ci_key(confidence)[2:]}% CI", "p", "p_holm"]
    body = [
        [
            r["metric"],
            f"{r['a']:.2f}",
            f"{r['b']:.2f}",
            f"{r['diff']:+.2f}",
            f"[{r[key][0]:+.2f}, {r[key][1]:+.2f}]",
            format_p(r["p_value"]),
            format_p(r["p_holm"]),
        ]
        for r in rows
    ]
    click.echo(shared.table(header, body), nl=False)
    why = never_significant(
        first["test"],
        first["num_clusters"],
        resamples,
        len(rows),
        by=by,
        units=get_protocol(attrs_a["protocol"]).units,
    )
    if why:
        click.echo(f"note: no difference can reach p_holm < {ALPHA:g}: {why}", err=True)
    coarse = coarse_interval(resamples, confidence)
    if coarse:
        click.echo(f"note: {coarse}", err=True)
    shared.write_json(
        output,
        {
            "a": str(ranks_a),
            "b": str(ranks_b),
            "protocol": attrs_a["protocol"],
            "ap": ap,
            "by": by,
            "resamples": resamples,
            "seed": seed,
            "confidence": confidence,
            "exact_max": exact_max,
            "comparisons": rows,
        },
    )


@click.command(cls=shared.Command)
@click.argument("ranks", type=shared.InputPath(names="ranks"))
@shared.statistics
def ci(ranks, ks, metrics, ap, resamples, seed, confidence, by, labels, output):
    """Bootstrap confidence interval of every metric of one ranks store."""

    from ..metrics import per_unit
    from ..options import check_ap
    from ..stats import ci_key, coarse_interval, metric_cis, resolve_metrics
    from ..store import read_ranks

    arrays, attrs = read_ranks(ranks)
    check_ap(ap, attrs["protocol"], "--ap")
    names = resolve_metrics(attrs["protocol"], metrics, ks)
    intervals = metric_cis(
        arrays,
        attrs,
        metrics=names,
        ap=ap,
        resamples=resamples,
        seed=seed,
        by=by,
        labels=labels,
        confidence=confidence,
    )
    table = per_unit(arrays, attrs, names, ap=ap)
    point = table.means()
    spec = get_protocol(attrs["protocol"])
    click.echo(
        f"{ranks}: protocol {attrs['protocol']}, {len(table)} "
        f"{spec.unit if len(table) == 1 else spec.units}; "
        f"{resamples} bootstrap {'resample' if resamples == 1 else 'resamples'} by {by}, "
        f"seed {seed}"
    )
    header = ["metric", "value", f"{ci_key(confidence)[2:]}% CI"]
    body = [
        [n, f"{point[n]:.2f}", f"[{intervals[n][0]:.2f}, {intervals[n][1]:.2f}]"] for n in names
    ]
    click.echo(shared.table(header, body), nl=False)
    coarse = coarse_interval(resamples, confidence)
    if coarse:
        click.echo(f"note: {coarse}", err=True)
    shared.write_json(
        output,
        {
            "ranks": str(ranks),
            "protocol": attrs["protocol"],
            "ap": ap,
            "by": by,
            "resamples": resamples,
            "seed": seed,
            "confidence": confidence,
            "num_units": len(table),
            "metrics": point,
            ci_key(confidence): intervals,
        },
    )


@click.command(cls=shared.Command)
@click.argument("ranks", type=shared.InputPath(names="ranks"))
@spec.KS.click(help="Cutoffs of the hit@K columns.")
@shared.ap
@click.option(
    "--output",
    type=shared.OutputPath(dir_okay=False),
    help="Write the CSV here (default: standard output).",
)
def scores(ranks, ks, ap, output):
    """Per-query scores (per sketch for progressive) of a ranks store, as CSV.

    One row per evaluated query (a skipped query has none). Columns: query_index (the
    query's 0-based row in the query manifest; among the rows kept when id-keyed
    features left rows out: the query store's manifest_row maps it), num_relevant,
    first_rank, ap, inp, rr, hit@K (fractions and 0/1; under --single-gallery-shot, rr
    and hit@K are over the draws: fractions); progressive: sketch (a number, 0.. in
    order of first appearance in the query manifest, not the manifest's sketch value:
    join on query_index, the row of its first rendering), query_index, m@A, m@B, wm@A,
    wm@B, last_rank, hit@K.
    """
    import io

    import numpy as np
    import pandas as pd

    from ..metrics import unit_scores
    from ..options import check_ap
    from ..store import read_ranks, write_text_atomic

    arrays, attrs = read_ranks(ranks)
    check_ap(ap, attrs["protocol"], "--ap")
    table = pd.DataFrame(unit_scores(arrays, attrs, ks=ks, ap=ap))
    hits = [c for c in table.columns if c.startswith("hit@")]
    if "shot_pmf" not in arrays:  # single-gallery-shot hits are probabilities
        table[hits] = table[hits].astype(np.int64)
    buffer = io.StringIO()
    # floats in full (repr, pandas' default): read back, the same float64, and a float
    # column even where every value is whole ("1.0", not "1")
    table.to_csv(buffer, index=False)
    if output:
        write_text_atomic(output, buffer.getvalue())
        click.echo(f"{output}: {len(table)} rows")
    else:
        click.echo(buffer.getvalue(), nl=False)
