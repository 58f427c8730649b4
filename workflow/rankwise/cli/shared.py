"""Options and output helpers shared by the commands.

Each decorator here is built from the specs in :mod:`rankwise.options`: the flag's
default, bounds and help are the library's and the config's, and a bad value stops
with one line naming the flag (``--query-block must be a positive integer, got 0``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .. import options as spec
from ..errors import RankwiseError
from ..registry import REGISTRY


def stack(*decorators: Callable) -> Callable:
    """Apply ``decorators`` so that the options appear in the order given."""

    def apply(func):
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def nearest_existing(path: str | Path) -> Path | None:
    """``path`` itself, or the nearest folder above it, that exists (a dangling link
    counts: nothing can be created through it); None when none does."""
    p = Path(path)
    for part in (p, *p.parents):
        if os.path.lexists(part):
            return part
    return None


def in_the_way(part: str | Path) -> str:
    """The message for a file standing where a folder is needed."""
    return f"{part} is a file where a folder is needed; choose another path"


def unwritable(path: str | Path) -> str | None:
    """Why ``path`` certainly cannot be written (else None), without touching anything:
    a file where a folder is needed on the way, or, for a path that does not exist yet,
    a nearest existing folder without write permission.  (An existing path is replaced
    atomically through its folder; whatever else fails is one line at write time.)"""
    p = Path(path).absolute()
    if p.exists():
        return None
    part = nearest_existing(p.parent)
    if part is None:
        return None
    if not part.is_dir():
        return in_the_way(part)
    if not os.access(part, os.W_OK | os.X_OK):
        return f"{part}: no permission to create files in this folder"
    return None


class OutputPath(click.Path):
    """``click.Path`` of something the command writes: refused when parsed, before any
    work, if it cannot be created (:func:`unwritable`) — a long ranking run must not end
    on an output path through a file.  ``store``: the rankwise store kind written there,
    which may replace only an empty folder or a store of that kind
    (:func:`rankwise.store.check_replaceable`: never a user's folder or an input)."""

    def __init__(self, *args, store: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.store = store

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if str(value) == "-":  # not stdout: a file named "-" would appear
            self.fail("'-' is not an output path here; give a file name", param, ctx)
        if not self.dir_okay and str(value).endswith(("/", os.sep)):
            # "out/" would be written as a file named "out"
            self.fail(f"{value!r} names a folder; give a file name in it", param, ctx)
        problem = unwritable(value)
        if problem:
            self.fail(problem, param, ctx)
        if self.store is not None:
            from ..store import check_replaceable

            try:
                check_replaceable(value, self.store)
            except RankwiseError as exc:
                self.fail(str(exc), param, ctx)
        return value


class InputPath(click.Path):
    """``click.Path`` of an input that names further inputs: a ranks store (its manifests
    and embeddings, which ``--by identity``, the report and ``ci`` read again) or a
    metrics JSON (those, its ranks store and statistics).  :class:`Command` protects them
    like the inputs given on the command line."""

    def __init__(self, *args, names: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.names = names  # "ranks" or "metrics"

    def referenced(self, path: str) -> list[tuple[str, str]]:
        """``(path, what)`` of the files ``path`` names; [] when it cannot be read (the
        command itself reports that)."""
        from ..store import named_path

        if self.names == "ranks":
            from ..store import store_attrs

            attrs = store_attrs(path)
        else:
            try:
                with open(path, encoding="utf-8") as file:
                    attrs = json.load(file).get("provenance") or {}
            except (OSError, ValueError, AttributeError):
                return []
        if not isinstance(attrs, dict):
            return []
        found = []
        for side in ("query", "gallery"):
            embeddings = attrs.get(f"{side}_embeddings")
            found += [
                (attrs.get(f"{side}_manifest"), f"its {side} manifest"),
                (embeddings.get("path") if isinstance(embeddings, dict) else None,
                 f"its {side} embeddings"),
            ]  # fmt: skip
        # the manifests and embeddings as `rankwise rank` named them (relative to the folder
        # it ran in), and as the same text names a file here; a metrics file's own ranks and
        # statistics paths are relative to where `rankwise metrics` ran: as given
        files = [(p, what) for p, what in found if isinstance(p, str) and p]
        files += [(named_path(attrs, p), what) for p, what in files]
        files += [(attrs.get("ranks"), "its ranks store"), (attrs.get("stats"), "its statistics")]
        return list(dict.fromkeys((str(p), what) for p, what in files if isinstance(p, str) and p))


class Command(click.Command):
    """A rankwise command: before it runs, no output path (:class:`OutputPath`) may be an
    input path, a file an input names (:class:`InputPath`: ``metrics r.zarr
    --text-output q.csv`` replaced the manifest the store was ranked on) or another
    output's (``evaluate --output gallery.csv`` replaced the manifest, ``--output m.json
    --text-output m.json`` kept one of the two), nor lie inside a store an input is or
    names (``ci r.zarr --output r.zarr/zarr.json`` replaced the store's metadata).

    Outputs a command derives from its options (``report``'s report.json in --out-dir)
    are checked alike: ``derived_outputs(params)`` on the command returns them as
    ``(flag, path, what to do instead)``."""

    derived_outputs = None

    def invoke(self, ctx: click.Context):
        seen: dict[str, str] = {}  # real path -> the option that names it
        stores: dict[str, str] = {}  # real path -> path of every input and what one names

        def check_output(flag: str, path, fix: str | None = None) -> None:
            real = os.path.realpath(path)
            if real in seen:
                raise RankwiseError(
                    f"{flag} {path} is also {seen[real]}: it would be overwritten; "
                    f"{fix or f'give {flag} a path of its own'}"
                )
            inside = [p for p in stores if real.startswith(os.path.join(p, ""))]
            if inside and os.path.isdir(inside[0]):
                raise RankwiseError(
                    f"{flag} {path} is inside {stores[inside[0]]}, {seen[inside[0]]}: "
                    f"writing there would damage it; {fix or f'give {flag} a path outside it'}"
                )
            enclosing = _enclosing_store(real)  # any store, an input or not
            if enclosing is not None:
                folder, kind = enclosing
                raise RankwiseError(
                    f"{flag} {path} is inside the rankwise {kind} store {folder}: writing "
                    f"there would damage it; {fix or f'give {flag} a path outside it'}"
                )

        for is_output in (False, True):
            for param in self.params:
                output = isinstance(param.type, OutputPath)
                if output != is_output or not isinstance(param.type, click.Path):
                    continue
                value = ctx.params.get(param.name or "")
                for path in value if isinstance(value, (list, tuple)) else [value]:
                    if path is None or str(path) == "-":
                        continue
                    real = os.path.realpath(path)
                    flag = param.opts[0] if param.opts else str(param.name).upper()
                    if is_output:
                        check_output(flag, path)
                    seen.setdefault(real, f"{flag} {'(an output)' if is_output else '(an input)'}")
                    if not is_output:  # an embedding store as much as a ranks store
                        stores[real] = str(path)
                    if isinstance(param.type, InputPath):
                        for named, what in param.type.referenced(str(path)):
                            stores[os.path.realpath(named)] = named
                            seen.setdefault(
                                os.path.realpath(named), f"{what}, named by {path} (an input)"
                            )
        for flag, path, fix in self.derived_outputs(ctx.params) if self.derived_outputs else ():
            check_output(flag, path, fix)
            seen.setdefault(os.path.realpath(path), f"{flag} (an output)")
        return super().invoke(ctx)


def _enclosing_store(real: str):
    """:func:`rankwise.store.enclosing_store`, importing the store module (numpy) only
    when a folder above ``real`` holds Zarr metadata at all."""
    if not any(
        (folder / "zarr.json").is_file() or (folder / ".zattrs").is_file()
        for folder in Path(real).parents
    ):
        return None
    from ..store import enclosing_store

    return enclosing_store(real)


_PROTOCOL_HELP = "; ".join(f"{name}: {p.summary}" for name, p in REGISTRY.items())

#: --ks, --ap and --output: every command that reports metrics.
ks = spec.KS.click(help="Cutoffs K, comma-separated.")
ap = spec.AP.click(
    help="AP variant: standard, or the official Market-1501 trapezoid (recall and reid)."
)
output = click.option(
    "--output", type=OutputPath(dir_okay=False), help="Write the JSON report here."
)

#: The inputs and protocol options of `evaluate` and `rank`.
inputs = stack(
    click.option(
        "--query",
        "query",
        required=True,
        type=click.Path(dir_okay=False),
        help="Query manifest (CSV).",
    ),
    click.option(
        "--gallery",
        "gallery",
        required=True,
        type=click.Path(dir_okay=False),
        help="Gallery manifest (CSV).",
    ),
    click.option(
        "--query-embeddings",
        required=True,
        type=click.Path(),
        help="Query embeddings: .npy (N x D) or Zarr store.",
    ),
    click.option(
        "--gallery-embeddings",
        required=True,
        type=click.Path(),
        help="Gallery embeddings: .npy (N x D) or Zarr store.",
    ),
    # No default on the command line: without --protocol, `recall` runs and a note
    # names --protocol reid when the manifests look like re-identification data.
    spec.PROTOCOL.click(
        default=None,
        help=(
            f"{_PROTOCOL_HELP}. Without --protocol: recall, with a note on stderr when the "
            "manifests look like re-identification data (a camera column, or gallery label "
            "-1)."
        ),
    ),
    spec.DISTANCE.click(help="cosine (vectors L2-normalised) or euclidean."),
    spec.GAP_FRAMES.click(help="reassociation: candidates are at frame + N."),
    spec.QUERY_STRIDE.click(
        help="reassociation: queries only at frames divisible by N (1 = every frame); "
        "other query rows are left out, not counted as skipped."
    ),
    spec.JUNK_LABELS.click(help="reid: comma-separated labels removed from the gallery."),
    spec.EXCLUDE_SAME_CAMERA.click(
        flag="--exclude-same-camera/--keep-same-camera",
        help="reid: same label AND same camera is not ranked (default), or kept as a valid "
        "match; the query's own id is never ranked.",
    ),
    spec.MULTI_QUERY.click(
        help="reid: one query per (label, camera), pooling its query rows (mean: float64 sum "
        "in id order / n, as float32; max: element-wise), stored rows pooled as they are; "
        "none: every row is a query."
    ),
    spec.SINGLE_GALLERY_SHOT.click(
        flag="--single-gallery-shot/--all-gallery-shots",
        help="reid: CUHK03's single-gallery-shot CMC: rankK and mrr over one random valid "
        "gallery item per identity (--shot-repeats draws, seeded by --shot-seed and each "
        "query's id); map and minp on the full list.",
    ),
    spec.SHOT_REPEATS.click(
        help="--single-gallery-shot: draws per query, or 'exact' (the expectation over all "
        "draws, no sampling noise).",
        metavar="N|exact",
    ),
    spec.SHOT_SEED.click(help="--single-gallery-shot: seed of the draws."),
    spec.RERANK.click(
        default=None,
        metavar="K1,K2,LAMBDA[,VARIANT]",
        help="recall/reid: k-reciprocal re-ranking (Zhong et al. 2017), e.g. 20,6,0.3 "
        "(k2 <= k1, 0 <= lambda <= 1); VARIANT torchreid (default: torchreid's re_ranking) "
        "or fastreid (fast-reid's evaluator: its jaccard distance); default: none.",
    ),
    spec.AQE.click(
        default=None,
        metavar="K,ALPHA",
        help="recall/reid: fast-reid's average query expansion of every embedding, e.g. "
        "5,3 (before --rerank); default: none.",
    ),
    spec.DROP_JUNK.click(
        flag="--drop-junk/--keep-junk",
        help="reid with --rerank/--aqe: leave gallery rows with a junk label out of the "
        "neighbour sets too, as torchreid's and fast-reid's loaders do (default: keep them, "
        "as Zhong et al.'s code on the whole gallery); junk rows are never ranked.",
    ),
    spec.QUERY_BLOCK.click(help="Queries per tile."),
    spec.GALLERY_CHUNK.click(help="Gallery rows per tile."),
    spec.WORKERS.click(help="Threads (default: all cores)."),
    spec.SCHEDULER.click(help="dask.distributed scheduler address (default: local threads)."),
    spec.MEMORY_LIMIT.click(help="MB; refuse to start when the estimated peak exceeds it."),
    spec.DEVICE.click(
        help="Where the tile similarities run: cpu (numpy BLAS), cuda (torch on the GPU; "
        "pip install 'rankwise[torch]'), auto (cuda when torch sees a GPU, else cpu), "
        "torch-cpu (the cuda code path on the CPU, for tests). Identical numbers on every "
        "device; re-ranking (--rerank) and the expansion of --aqe run on the CPU."
    ),
)

#: The resampling options of `compare` and `ci`.
statistics = stack(
    spec.KS.click(help="Cutoffs K, comma-separated (for the default metrics)."),
    click.option(
        "--metrics",
        default=None,
        help="Metrics, comma-separated (e.g. map,rank1); default: all of the protocol's for --ks.",
    ),
    spec.AP.click(help="AP variant."),
    spec.RESAMPLES.click(
        help="Bootstrap resamples (compare: also the random sign flips of its test)."
    ),
    spec.SEED.click(help="Seed: the same seed gives the same numbers everywhere."),
    spec.CONFIDENCE.click(help="Coverage of the percentile bootstrap interval."),
    spec.BY.click(
        help="Resample queries (sketches for progressive), or identities with "
        "all their queries (labels from the query manifest)."
    ),
    click.option(
        "--labels",
        type=click.Path(dir_okay=False),
        help="--by identity: query manifest CSV (default: the one named in the ranks store).",
    ),
    click.option("--output", type=OutputPath(dir_okay=False), help="Write the JSON result here."),
)


def parse_json_options(text: str, flag: str = "--options") -> dict[str, Any]:
    """Parse a JSON object given inline or as ``@path``."""
    source = text
    if text.startswith("@"):
        file = Path(text[1:])
        if not file.is_file():
            raise RankwiseError(f"{file}: options file not found ({flag} {text})")
        source = file.read_text()
    try:
        value = json.loads(source) if source.strip() else {}
    except json.JSONDecodeError as exc:
        raise RankwiseError(
            f"{flag}: not valid JSON ({exc.msg} at line {exc.lineno} column "
            f"{exc.colno}); pass an object such as "
            '\'{"root": "data/market"}\''
        ) from None
    if not isinstance(value, dict):
        raise RankwiseError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def current_folder() -> str:
    """The current folder, or one line when it was deleted under the process (a command
    that records it failed after all its work with "No such file or directory")."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        from ..errors import RankwiseError

        raise RankwiseError(
            "the current folder no longer exists (deleted or moved); cd to an existing "
            "folder and run again"
        ) from None


def write_json(path: str | None, doc: Any) -> None:
    """Write ``doc`` as indented JSON to ``path`` (atomically), if a path is given."""
    if path:
        from ..store import write_text_atomic

        write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [header, *rows]
    ]
    return "\n".join(lines) + "\n"
