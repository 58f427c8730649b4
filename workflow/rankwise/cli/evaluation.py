"""``rankwise evaluate``, ``rankwise rank`` and ``rankwise metrics``."""

from __future__ import annotations

from pathlib import Path

import click

from .. import options as spec
from . import shared


def _reid_hint(query: str, gallery: str) -> str | None:
    """The note naming --protocol reid when the manifests look like re-identification
    data (:func:`rankwise.manifest.reid_signs`), or None."""
    from ..manifest import reid_signs

    found = reid_signs(query, gallery)
    if found is None:
        return None
    return (
        f"note: ran --protocol recall (the default), but the manifests look like "
        f"re-identification data ({found}); pass --protocol reid to exclude same-camera "
        "matches and junk labels, or --protocol recall to silence this note"
    )


#: Protocol options of `evaluate`/`rank` and their flags (the flag a user types to change
#: the default).  --multi-query and --single-gallery-shot refuse other protocols already.
_TAKEN_BY_PROTOCOL = {
    "gap_frames": "--gap-frames",
    "query_stride": "--query-stride",
    "junk_labels": "--junk-labels",
    "exclude_same_camera": "--keep-same-camera",
    "shot_repeats": "--shot-repeats",
    "shot_seed": "--shot-seed",
    "drop_junk": "--drop-junk",
}


def _typed_non_default(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was typed on the command line with a value other than its
    default (a default typed out, as the pipeline passes every option, is not)."""
    from click.core import ParameterSource

    if ctx.get_parameter_source(name) != ParameterSource.COMMANDLINE:
        return False
    param = next(p for p in ctx.command.params if p.name == name)
    return ctx.params[name] != param.process_value(ctx, param.get_default(ctx))


def _refuse_ignored_options(kw: dict, given_protocol: bool) -> None:
    """An option the protocol does not take, typed on the command line with a value other
    than its default, is an error: it would be ignored without a word (``--junk-labels
    b`` under ``recall`` kept label b).  Defaults passed explicitly (as the pipeline does
    for every dataset) are fine."""
    from ..errors import RankwiseError
    from ..registry import REGISTRY, get_protocol

    ctx = click.get_current_context()
    taken = get_protocol(kw["protocol"]).options
    for name, flag in _TAKEN_BY_PROTOCOL.items():
        if not _typed_non_default(ctx, name):
            continue
        if name in taken and name.startswith("shot_") and not kw["single_gallery_shot"]:
            raise RankwiseError(
                f"{flag} applies with --single-gallery-shot only; add it or drop {flag}"
            )
        if name in taken:
            continue
        takers = " or ".join(n for n, spec in REGISTRY.items() if name in spec.options)
        running = (
            f"not {kw['protocol']!r}" if given_protocol else "and without --protocol, recall runs"
        )
        raise RankwiseError(
            f"{flag} applies to protocol {takers} only, {running}: it would be ignored; "
            f"pass --protocol {takers.split(' or ')[0]} or drop {flag}"
        )


def _rank(kw: dict, progress: bool):
    """Rank with the command's options; returns ``(result, note or None)``."""
    from ..api import rank

    note = None
    given_protocol = kw["protocol"] is not None
    if not given_protocol:
        kw["protocol"] = "recall"
    _refuse_ignored_options(kw, given_protocol)
    if not given_protocol:
        note = _reid_hint(kw["query"], kw["gallery"])
    from ..devices import tiles_for
    from ..options import AQE, check_drop_junk, check_rerank, check_rerank_alone

    # the messages name the flags
    check_rerank(kw["rerank"], kw["protocol"], "--rerank")
    check_rerank(kw["aqe"], kw["protocol"], "--aqe", AQE)
    check_rerank_alone(
        kw["rerank"], kw["aqe"], kw["multi_query"], kw["single_gallery_shot"], flags=True
    )
    check_drop_junk(kw["drop_junk"], kw["protocol"], kw["rerank"], kw["aqe"], "--drop-junk")
    tiles_for(kw["device"], "--device")  # cuda without a usable GPU
    result = rank(
        kw["query"],
        kw["gallery"],
        kw["query_embeddings"],
        kw["gallery_embeddings"],
        protocol=kw["protocol"],
        distance=kw["distance"],
        gap_frames=kw["gap_frames"],
        query_stride=kw["query_stride"],
        junk_labels=kw["junk_labels"],
        exclude_same_camera=kw["exclude_same_camera"],
        multi_query=kw["multi_query"],
        single_gallery_shot=kw["single_gallery_shot"],
        shot_repeats=kw["shot_repeats"],
        shot_seed=kw["shot_seed"],
        rerank=kw["rerank"],
        aqe=kw["aqe"],
        drop_junk=kw["drop_junk"],
        query_block=kw["query_block"],
        gallery_chunk=kw["gallery_chunk"],
        workers=kw["workers"],
        scheduler=kw["scheduler"],
        progress=progress,
        memory_limit_mb=kw["memory_limit"],
        device=kw["device"],
    )
    return result, note


def _emit(report: dict, output: str | None, text_output: str | None = None, files=None) -> None:
    """Write the JSON and text reports (with what ``files`` stages already: all renamed
    in together, or none), then print the text report."""
    import json

    from ..api import format_text
    from ..store import StagedFiles

    text = format_text(report)
    files = files if files is not None else StagedFiles()
    # files first: a write that fails leaves one error line, not metrics that look final
    try:
        if output:
            files.write(output, (json.dumps(report, indent=2) + "\n").encode("utf-8"))
        if text_output:
            files.write(text_output, text.encode("utf-8"))
    except BaseException:
        files.discard()
        raise
    files.commit()
    click.echo(text, nl=False)


@click.command(cls=shared.Command)
@shared.inputs
@shared.ks
@shared.ap
@shared.output
def evaluate(ks, ap, output, **kw):
    """Rank and score in one go; print the text report, write the JSON report."""
    from ..api import result_from_ranks
    from ..options import check_ap

    check_ap(ap, kw["protocol"] or "recall", "--ap")  # before the ranking work
    ranks, note = _rank(kw, progress=False)
    _emit(result_from_ranks(ranks, ks=ks, ap=ap).to_json(), output)
    if note:
        click.echo(note, err=True)


@click.command(cls=shared.Command)
@click.option(
    "--query", required=True, type=click.Path(dir_okay=False), help="Query manifest (CSV)."
)
@click.option(
    "--gallery", required=True, type=click.Path(dir_okay=False), help="Gallery manifest (CSV)."
)
@click.option("--query-embeddings", required=True, type=click.Path(), help="Query embeddings.")
@click.option("--gallery-embeddings", required=True, type=click.Path(), help="Gallery embeddings.")
@click.option(
    "--protocol",
    type=click.Choice(["recall", "reid"]),
    default="reid",
    show_default=True,
    help="Which pairs are valid, and which are positive (same label).",
)
@shared.spec.DISTANCE.click(help="cosine (vectors L2-normalised) or euclidean.")
@shared.spec.JUNK_LABELS.click(help="reid: comma-separated labels removed from the gallery.")
@shared.spec.EXCLUDE_SAME_CAMERA.click(
    flag="--exclude-same-camera/--keep-same-camera",
    help="reid: same label AND same camera is not a pair (default), or a positive one.",
)
@click.option(
    "--fprs",
    default=",".join(f"{x:g}" for x in shared.spec.VERIFICATION_FPRS.default),
    show_default=True,
    help="FPR levels, comma-separated.",
)
@shared.spec.VERIFICATION_BINS.click(help="Bins of the distance histograms.")
@shared.spec.QUERY_BLOCK.click(default=256, help="Queries per tile.")
@shared.spec.GALLERY_CHUNK.click(help="Gallery rows per tile.")
@shared.spec.WORKERS.click(help="Threads of the exact second pass (default: all cores).")
@shared.output
def verify(fprs, bins, output, **kw):
    """TPR at fixed FPR, the ROC curve and the positive/negative distance histograms over
    every valid query-gallery pair (exact; see rankwise.verification); print the TPRs,
    write everything as JSON (with the inputs it read, for the report)."""
    from ..verification import check_fprs, tpr_at_fpr

    levels = check_fprs(fprs, "--fprs")  # the message names the flag
    result = tpr_at_fpr(
        kw["query"],
        kw["gallery"],
        kw["query_embeddings"],
        kw["gallery_embeddings"],
        protocol=kw["protocol"],
        distance=kw["distance"],
        fprs=levels,
        bins=bins,
        junk_labels=kw["junk_labels"],
        exclude_same_camera=kw["exclude_same_camera"],
        query_block=kw["query_block"],
        gallery_chunk=kw["gallery_chunk"],
        workers=kw["workers"],
    )
    result["inputs"] = {
        "query_manifest": str(kw["query"]),
        "gallery_manifest": str(kw["gallery"]),
        "query_embeddings": str(kw["query_embeddings"]),
        "gallery_embeddings": str(kw["gallery_embeddings"]),
        "protocol": kw["protocol"],
        "junk_labels": list(kw["junk_labels"]),
        "exclude_same_camera": kw["exclude_same_camera"],
    }
    for level, tpr in result["tpr@fpr"].items():
        click.echo(f"TPR@FPR={level}: {tpr:.2f}")
    click.echo(
        f"{result['num_positive_pairs']} positive, {result['num_negative_pairs']} negative pairs"
    )
    shared.write_json(output, result)


@click.command(name="rank", cls=shared.Command)
@shared.inputs
@click.option(
    "--out",
    required=True,
    type=shared.OutputPath(file_okay=False, store="ranks"),
    help="Ranks store to write (Zarr, written atomically; replaces only a ranks store).",
)
def rank(out, **kw):
    """Compute the ranks store that every metric is computed from."""
    from ..store import write_ranks

    working_directory = shared.current_folder()  # recorded: before the work, not after
    result, note = _rank(kw, progress=True)
    attrs = dict(result.attrs)
    from ..hashing import file_sha256

    # the paths below as given, and where they start from: read from another folder
    # (`ci --by identity`, an output's check against the store's own files) they still name
    # the same files
    attrs["working_directory"] = working_directory
    for side in ("query", "gallery"):
        attrs[f"{side}_embeddings"] = _provenance(kw[f"{side}_embeddings"])
        attrs[f"{side}_manifest"] = str(kw[side])
        # what `compare` checks: two stores ranked on other manifests do not pair
        attrs[f"{side}_manifest_sha256"] = file_sha256(kw[side])
    write_ranks(out, result.arrays(), attrs)
    n = attrs["num_queries"]
    click.echo(
        f"{out}: {n} {'query' if n == 1 else 'queries'} ranked, {attrs['num_skipped']} skipped"
    )
    if note:
        click.echo(note, err=True)


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


def _refuse_statistics_without_output() -> None:
    """`rankwise metrics` computes statistics only for --stats-output: a statistics option
    typed with another value than its default would be ignored without a word."""
    from ..errors import RankwiseError

    ctx = click.get_current_context()
    for param in ctx.command.params:
        if param.name in ("cmc_max_rank", "resamples", "seed", "by") and _typed_non_default(
            ctx, param.name
        ):
            flag = param.opts[0]
            raise RankwiseError(
                f"{flag} sets the statistics of --stats-output, which is not given: it would "
                f"be ignored; add --stats-output FILE.npz (or use `rankwise ci`), or drop {flag}"
            )


@click.command(cls=shared.Command)
@click.argument("ranks", type=shared.InputPath(names="ranks"))
@shared.ks
@shared.ap
@shared.output
@click.option(
    "--text-output", type=shared.OutputPath(dir_okay=False), help="Write the text report here too."
)
@click.option(
    "--stats-output",
    type=shared.OutputPath(dir_okay=False),
    help="Also write the statistics summary the report reads (.npz): the 95% interval "
    "of every metric, the CMC curve, the per-query values of the paired tests; "
    "computed for --resamples, --seed, --by and --cmc-max-rank.",
)
@spec.CMC_MAX_RANK.click(
    help=f"With --stats-output: the CMC curve covers ranks 1..N (N at most {spec.MAX_CMC_RANK})."
)
@spec.REPORT_RESAMPLES.click(
    help="With --stats-output: bootstrap resamples of the intervals (0: none)."
)
@spec.SEED.click(help="With --stats-output: seed of the resampling.")
@spec.BY.click(help="With --stats-output: resample queries, or identities.")
def metrics(ranks, ks, ap, output, text_output, stats_output, **statistics):
    """Score a ranks store: print the text report, write the JSON report (+ provenance)."""
    from ..api import result_from_ranks
    from ..store import read_ranks

    if not stats_output:
        _refuse_statistics_without_output()
    arrays, attrs = read_ranks(ranks)
    from ..options import check_ap

    check_ap(ap, attrs["protocol"], "--ap")
    report = result_from_ranks((arrays, attrs), ks=ks, ap=ap).to_json()
    report["provenance"] = {k: v for k, v in attrs.items() if k not in ("complete", "kind")}
    report["provenance"].update({"ks": list(ks), "ap": ap, "ranks": str(ranks)})
    from ..store import StagedFiles

    files = StagedFiles()  # the summary, the JSON and text reports: all written, or none
    if stats_output:
        from ..errors import RankwiseError
        from ..summary import summarise, write_summary

        try:
            summary = summarise(arrays, attrs, metrics=list(report["metrics"]), ap=ap, **statistics)
        except RankwiseError as exc:
            raise RankwiseError(f"{ranks}: {exc} (or --resamples 0)") from None
        write_summary(stats_output, summary, files)
        # the report uses the file only when it is still this summary (the key of its
        # per-unit values): another evaluation may have written over the path since
        report["provenance"]["stats"] = str(stats_output)
        report["provenance"]["stats_key"] = summary.key
    _emit(report, output, text_output, files)
