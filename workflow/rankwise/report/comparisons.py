"""Paired comparisons of the encoders of each dataset, Holm-adjusted over the report."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import RankwiseError
from ..summary import Summary
from .constants import ALL_PAIRS_MAX, ALPHA, CONFIDENCE
from .pairs import PairCache


def comparison_pairs(encoders: list[str], best: str | None = None) -> list[tuple[str, str]]:
    """The ``(a, b)`` pairs compared on one dataset, ``b`` tested against ``a``.

    Every pair (in the given order) for at most :data:`ALL_PAIRS_MAX` encoders. Beyond,
    ``2N`` tests at most instead of ``N^2 / 2``: each encoder against the previous one
    in config order (epoch to epoch), and the ``best`` one (by the first headline metric)
    against every encoder not already paired with it.
    """
    if len(encoders) <= ALL_PAIRS_MAX:
        return [(a, b) for i, a in enumerate(encoders) for b in encoders[i + 1 :]]
    pairs = list(itertools.pairwise(encoders))
    if best is not None:
        paired = {a for a, b in pairs if b == best} | {b for a, b in pairs if a == best}
        pairs += [(e, best) for e in encoders if e != best and e not in paired]
    return pairs


def ap_variant(entry: dict[str, Any]) -> str:
    return entry["provenance"]["ap"] or "standard"


def flip_resamples(resamples: int, num_tests: int) -> int:
    """Resamples (sign flips) of the paired tests: at least ``resamples``, and enough that
    the smallest Monte Carlo p-value, ``1 / (n + 1)``, survives Holm's correction over
    ``num_tests`` tests ten times over: ``n >= 10 num_tests / ALPHA`` (rounded up to
    a multiple of 1000)."""
    needed = -(-int(np.ceil(10 * num_tests / ALPHA)) // 1000) * 1000
    return max(int(resamples), needed)


def _check_pair(entry_a: dict, entry_b: dict, a: Summary, b: Summary, dataset: str) -> str | None:
    """The checks of :func:`rankwise.stats.compare_ranks` on the report's entries, and
    the same AP variant: an error names the file.  Two evaluations of the same
    manifests whose evaluated queries or galleries differ (an id-keyed store that dropped
    query or gallery rows, ``on_missing: drop``) are not an error here: the reason they
    are not compared is returned (``None``: comparable), and the report says so."""
    from ..stats import check_pairable, kept_rows, same_rows

    name_a, source = entry_a["encoder"], entry_b["source"]
    if ap_variant(entry_a) != ap_variant(entry_b):
        raise RankwiseError(
            f"{source}: AP variant {ap_variant(entry_b)!r} differs from {name_a}'s "
            f"{ap_variant(entry_a)!r} on dataset {dataset!r}; score both with the same --ap"
        )

    def side(entry: dict) -> dict[str, Any]:
        provenance = entry["provenance"]
        options = provenance["protocol_options"]
        # the manifests the ranks were computed on, as `rankwise compare` checks them:
        # the same row numbers of two other query files are other queries
        raw = provenance.get("raw") or {}  # the metrics JSON's own provenance
        manifests = {
            key: raw[key]
            for key in ("query_manifest_sha256", "gallery_manifest_sha256")
            if raw.get(key)
        }
        return {
            "protocol": entry["protocol"],
            "num_gallery": entry["num_gallery"],
            **({"protocol_options": options} if options is not None else {}),
            **manifests,
            "units": [],
        }

    side_a, side_b = side(entry_a), side(entry_b)
    galleries = None  # why the galleries differ, when dropped rows say it
    rows = [kept_rows(_alignment(e, "gallery")) for e in (entry_a, entry_b)]
    if not same_rows(*rows):  # a side dropped gallery rows, not the other's
        del side_a["num_gallery"], side_b["num_gallery"]  # the rest must pair all the same
        left_out = []
        for e, kept in zip((entry_a, entry_b), rows, strict=True):
            if kept is not None:
                n = _alignment(e, "gallery")["dropped_rows"]
                left_out.append(f"{e['encoder']} left out {n} gallery row{'' if n == 1 else 's'}")
        galleries = (
            f"they ranked different galleries ({' and '.join(left_out)} without features"
            f"{_which(rows, entry_a['num_gallery'] == entry_b['num_gallery'])}; a paired test "
            "needs the same gallery)"
        )
    check_pairable(side_a, side_b, (name_a, source))
    if galleries is not None:
        return galleries
    # the units' rows count the query rows an id-keyed store kept: equal rows of two
    # stores that kept different ones are other queries
    queries = [kept_rows(_alignment(e, "query")) for e in (entry_a, entry_b)]
    same = same_rows(*queries)
    if same and b.aligned(a.rows) is not None:  # the same queries (in any order)
        return None
    detail = "" if same else _which(queries, len(a.rows) == len(b.rows))
    return (
        f"their evaluated queries differ ({len(a.rows)} and {len(b.rows)}{detail}; a paired "
        "test needs the same queries)"
    )


def _which(rows: list[str | None], as_many: bool) -> str:
    """What the report says of two :func:`rankwise.stats.kept_rows` values that differ."""
    if "unknown" in rows:
        return ", which ones is not recorded (encoded by an earlier rankwise)"
    return ", not the same ones" if as_many else ""


def _alignment(entry: dict[str, Any], role: str) -> dict[str, Any] | None:
    """The ``role`` (query or gallery) store's ``id_alignment`` record of an evaluation
    (id-keyed features, :meth:`rankwise.feature_ids.Alignment.record`), or None."""
    return (entry["provenance"].get("id_alignment") or {}).get(role)


def compare_encoders(
    groups,
    summaries: dict[tuple[str, str], Summary | None],
    *,
    resamples: int,
    seed: int,
    by: str,
    best: dict[str, str] | None = None,
    cache: PairCache | None = None,
) -> tuple[list[dict], int, list[dict[str, str]]]:
    """Every paired comparison, Holm-adjusted together (see the module docstring), the
    sign flips they used (:func:`flip_resamples`), and the pairs not compared
    (``{"dataset", "a", "b", "reason"}``: evaluated queries that differ).

    ``summaries``: each evaluation's :class:`~rankwise.summary.Summary` (``None``: not
    compared). The difference intervals use ``resamples`` bootstrap resamples; the
    tests ``flip_resamples(resamples, number of tests)`` sign flips. ``cache`` keeps
    each pair's result (:class:`.pairs.PairCache`)."""
    from ..stats import EXACT_MAX, comparison_rows, with_holm

    cache = cache or PairCache(None)
    plan = []
    skipped: list[dict[str, str]] = []
    for dataset, entries in groups:
        by_name = {e["encoder"]: e for e in entries if summaries[dataset, e["encoder"]]}
        # the best may be an evaluation without statistics (no ranks store): not compared
        best_name = (best or {}).get(dataset)
        for a, b in comparison_pairs(list(by_name), best_name if best_name in by_name else None):
            sa, sb = summaries[dataset, a], summaries[dataset, b]
            assert sa is not None and sb is not None
            reason = _check_pair(by_name[a], by_name[b], sa, sb, dataset)
            if reason is not None:
                skipped.append({"dataset": dataset, "a": a, "b": b, "reason": reason})
                continue
            names = [n for n in by_name[a]["metrics"] if n in by_name[b]["metrics"]]
            # one side's units in the other's order: a summary of a store written before
            # unit keys lists them in store order, which the pair takes whichever side it
            # is on (the numbers of two such stores: A's clusters numbered as B's are)
            if sb.keyed or not sa.keyed:
                plan.append((dataset, a, b, names, sa, sb.aligned(sa.rows)))
            else:
                aligned = sa.aligned(sb.rows)
                assert aligned is not None
                plan.append((dataset, a, b, names, replace(aligned, cluster=sb.cluster), sb))
    n_flips = flip_resamples(resamples, sum(len(p[3]) for p in plan))
    tests = cache.compare_all(
        [(sa, sb, names) for _, _, _, names, sa, sb in plan],
        resamples=resamples,
        flips=n_flips,
        seed=seed,
        confidence=CONFIDENCE,
        exact_max=EXACT_MAX,
    )
    rows = []
    for (dataset, a, b, names, _, _), (estimates, pvalues, test) in zip(plan, tests, strict=True):
        rows += comparison_rows(
            estimates,
            names,
            pvalues,
            test,
            by=by,
            confidence=CONFIDENCE,
            dataset=dataset,
            names=(a, b),
        )
    return (
        [
            {
                "dataset": row["dataset"],
                "metric": row["metric"],
                "a": row["encoder_a"],
                "b": row["encoder_b"],
                "value_a": row["a"],
                "value_b": row["b"],
                "diff": row["diff"],
                "ci95": row["ci95"],
                "p_value": row["p_value"],
                "p_holm": row["p_holm"],
                "significant": bool(row["p_holm"] < ALPHA),
                "test": row["test"],
                "by": row["by"],
                "num_units": row["num_units"],
                "num_clusters": row["num_clusters"],
            }
            for row in with_holm(rows)
        ],
        n_flips,
        skipped,
    )
