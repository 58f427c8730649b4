"""``rankwise prepare`` and ``rankwise encode``: the pipeline's first two stages.

    rankwise prepare --loader NAME [--options JSON] --out-dir DIR
    rankwise encode --manifest M.csv --kind KIND [--options JSON] --out STORE.zarr
        [--batch-size 64] [--threads N] [--no-progress]

``--options`` takes a JSON object, or ``@file.json`` to read it from a file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from .errors import RankwiseError


def parse_options(text: str, flag: str = "--options") -> dict[str, Any]:
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
        raise RankwiseError(f"{flag}: not valid JSON ({exc.msg} at line {exc.lineno} column "
                            f"{exc.colno}); pass an object such as "
                            "'{\"root\": \"data/market\"}'") from None
    if not isinstance(value, dict):
        raise RankwiseError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


@click.command("prepare")
@click.option("--loader", required=True, metavar="NAME",
              help="market1501, msmt17, folder, manifest, digits, demo-market, "
                   "demo-reassociation or demo-progressive.")
@click.option("--options", "options_text", default="{}", show_default=True, metavar="JSON",
              help="Loader options as a JSON object, or @file.json.")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for query.csv, gallery.csv (and images/ for demos).")
def prepare(loader: str, options_text: str, out_dir: Path) -> None:
    """Write normalised query and gallery manifests for a dataset."""
    from .datasets import prepare_dataset

    summary = prepare_dataset(loader, parse_options(options_text), out_dir)
    click.echo(f"prepared {loader}: {summary['query']} query rows, {summary['gallery']} "
               f"gallery rows, {summary['labels']} labels -> {out_dir}")


@click.command("encode")
@click.option("--manifest", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Manifest CSV (rows in embedding order; 'path' relative to its folder).")
@click.option("--kind", required=True, metavar="KIND",
              help="precomputed, python, onnx, pixels, color-histogram or hog.")
@click.option("--options", "options_text", default="{}", show_default=True, metavar="JSON",
              help="Encoder options as a JSON object, or @file.json.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Embedding store to write (Zarr; written atomically).")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Images per encoder call.")
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="Decoding (and onnxruntime) threads [default: available CPUs, at most 8].")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Progress bar on stderr.")
def encode(manifest: Path, kind: str, options_text: str, out: Path, batch_size: int,
           threads: int | None, progress: bool) -> None:
    """Encode a manifest's images (or copy precomputed vectors) into an embedding store."""
    from .encoders import encode_manifest

    info = encode_manifest(manifest, kind, parse_options(options_text), out,
                           batch_size=batch_size, workers=threads, progress=progress)
    n, dim = info["shape"]
    click.echo(f"encoded {n} rows x {dim} dims with {kind} -> {out}")


COMMANDS = [prepare, encode]
