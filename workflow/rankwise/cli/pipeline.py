"""``rankwise prepare`` and ``rankwise encode``: the pipeline's first two stages.

    rankwise prepare --loader NAME [--options JSON] --out-dir DIR
    rankwise encode --manifest M.csv --kind KIND [--options JSON] --out STORE.zarr
        [--batch-size 64] [--threads N] [--no-progress]

``--options`` takes a JSON object, or ``@file.json`` to read it from a file.
"""

from __future__ import annotations

from pathlib import Path

import click

from .. import options as spec
from . import shared
from .shared import parse_json_options


@click.command("prepare", cls=shared.Command)
@click.option(
    "--loader",
    required=True,
    metavar="NAME",
    help="market1501, msmt17, folder, manifest, digits, demo-market, "
    "demo-reassociation, demo-progressive, veri776, dukemtmc, cuhk03-np, "
    "identity-folders or mot.",
)
@click.option(
    "--options",
    "options_text",
    default="{}",
    show_default=True,
    metavar="JSON",
    help="Loader options as a JSON object, or @file.json.",
)
@click.option(
    "--out-dir",
    required=True,
    type=shared.OutputPath(file_okay=False, path_type=Path),
    help="Folder for query.csv, gallery.csv (and images/ for demos).",
)
@click.option(
    "--split",
    type=click.Choice(["both", "query", "gallery"]),
    default="both",
    show_default=True,
    help="The manifest(s) to write; the loader reads and checks both splits either way.",
)
def prepare(loader: str, options_text: str, out_dir: Path, split: str) -> None:
    """Write normalised query and gallery manifests for a dataset."""
    from ..datasets import SPLITS, prepare_dataset

    created = not out_dir.exists()
    splits = SPLITS if split == "both" else (split,)
    try:
        summary = prepare_dataset(loader, parse_json_options(options_text), out_dir, splits)
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed run leaves nothing behind
        raise
    click.echo(
        f"prepared {loader}: {summary['query']} query rows, {summary['gallery']} "
        f"gallery rows, {summary['labels']} labels -> {out_dir}"
        + ("" if split == "both" else f" ({split}.csv written)")
    )


@click.command("encode", cls=shared.Command)
@click.option(
    "--manifest",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Manifest CSV (rows in embedding order; 'path' relative to its folder).",
)
@click.option(
    "--kind",
    required=True,
    metavar="KIND",
    help="precomputed, python, onnx, pixels, color-histogram, hog, reid, timm or torchscript.",
)
@click.option(
    "--options",
    "options_text",
    default="{}",
    show_default=True,
    metavar="JSON",
    help="Encoder options as a JSON object, or @file.json.",
)
@click.option(
    "--out",
    required=True,
    type=shared.OutputPath(file_okay=False, path_type=Path, store="embeddings"),
    help="Embedding store to write (Zarr; written atomically; replaces only an embedding store).",
)
@spec.BATCH_SIZE.click(help="Images per encoder call.")
@spec.THREADS.click(
    default=None,
    help="Decoding (and onnxruntime / torch CPU) threads [default: available CPUs, at most 8].",
)
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr."
)
def encode(
    manifest: Path,
    kind: str,
    options_text: str,
    out: Path,
    batch_size: int,
    threads: int | None,
    progress: bool,
) -> None:
    """Encode a manifest's images (or copy precomputed vectors, by row or by id) into a store."""
    from ..encoders import encode_manifest

    info = encode_manifest(
        manifest,
        kind,
        parse_json_options(options_text),
        out,
        batch_size=batch_size,
        workers=threads,
        progress=progress,
    )
    n, dim = info["shape"]
    click.echo(f"encoded {n} rows x {dim} dims with {kind} -> {out}")
    aligned = info.get("id_alignment")
    if aligned and (aligned["dropped_rows"] or aligned["ignored_features"]):
        example = f" (e.g. id {aligned['dropped_example']!r})" if aligned["dropped_example"] else ""
        click.echo(
            f"on_missing drop: {aligned['dropped_rows']} of the {aligned['manifest_rows']} "
            f"manifest rows have no features and are left out{example}; "
            f"{aligned['ignored_features']} feature rows of other ids ignored"
        )
