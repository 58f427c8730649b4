"""Dataset loaders: each writes one normalised manifest per split.

:func:`prepare_dataset` is the one entry point (``rankwise prepare`` calls it). It
writes ``out_dir/query.csv`` and ``out_dir/gallery.csv`` with the README's manifest
columns ("Inputs": ``id``, ``label``, then ``camera``, ``sequence``, ``frame``,
``sketch``, ``step`` where the loader knows them, and ``path``), each written to a
temporary name and renamed.  ``path`` is relative to ``out_dir`` (the manifest's folder), so a
manifest keeps working when the tree holding both is moved.

Loaders (options in braces, defaults after ``=``):

``market1501`` {root, query_folder="query", gallery_folder="bounding_box_test"}
    The standard Market-1501 tree. File names ``PPPP_cCsS_FFFFFF_BB.jpg``: person
    id P (``-1`` junk, ``0000`` distractor), camera C, sequence S, frame F, box B.
    label = ``str(int(P))`` (``"-1"``, ``"0"``, ``"2"``), camera = C,
    sequence = ``c{C}s{S}``, frame = F, id = the file stem.
``msmt17`` {root, images=auto}
    ``list_query.txt`` / ``list_gallery.txt`` (lines ``pid/file.jpg label``) and the
    images under ``test/`` (MSMT17_V1) or ``mask_test_v2/`` (MSMT17_V2). camera =
    the file name's third field (``0000_000_01_0303morning_0015_0.jpg`` -> 1).
``folder`` {query_dir, gallery_dir} or {root, query_fraction=0.2, seed=0}
    One subfolder per label (images at any depth below it; linked folders are
    followed).  With ``root``, a seeded ``query_fraction`` of each label's images
    become queries (at least one, and at least one stays in the gallery; labels with
    one image stay in the gallery).  With ``query_dir == gallery_dir`` the two
    manifests share ids (leave-one-out retrieval: an image is never its own match).
    Two label folders whose names differ only by spaces around them (``cat`` and
    ``cat ``) are refused: a manifest's values do not keep those spaces.
``manifest`` {query, gallery, protocol="recall"}
    The user's own CSVs, validated (``rankwise.manifest.read_manifest`` for the
    protocol's columns) and copied; relative ``path`` values are rewritten to stay
    valid from ``out_dir``.
``veri776`` {root}, ``dukemtmc`` {root}, ``cuhk03-np`` {root, variant}
    VeRi-776 (``name_query.txt`` / ``name_test.txt`` order), DukeMTMC-reID and
    CUHK03-NP (``labeled`` | ``detected``) in their own naming conventions; protocol
    ``reid`` (see :mod:`rankwise.datasets_reid`).
``identity-folders`` {root, queries_per_id=1, min_crops=2, seed=0}
    One folder per identity, split into query / gallery as the ``reid`` package's
    ``RetrievalProtocol`` does; protocol ``recall`` (see :mod:`rankwise.datasets_reid`).
``mot`` {root, split="train", sequences=null, frames="all", classes=[1],
min_visibility=0.0, min_size=0}
    MOTChallenge ground truth cut into crops under ``out_dir/crops/``; query = gallery =
    the crops, with ``sequence`` and ``frame``; protocol ``reassociation`` (see
    :mod:`rankwise.mot`).
``digits``, ``demo-market``, ``demo-reassociation``, ``demo-progressive``
    Offline demo data generated under ``out_dir/images/`` (see :mod:`rankwise.demo`).
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .demo import OPTIONS as DEMO_OPTIONS
from .errors import RankwiseError
from .manifest import read_utf8_text
from .options import Option, OptionSet
from .registry import PROTOCOLS
from .store import atomic_directory, write_text_atomic

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
)
COLUMN_ORDER = ("id", "label", "camera", "sequence", "frame", "sketch", "step", "path")
SPLITS = ("query", "gallery")


# ---------------------------------------------------------------- helpers


def _existing_dir(value: Any, what: str) -> Path:
    path = Path(str(value)).expanduser()
    if not path.is_dir():
        raise RankwiseError(
            f"{path}: {what} folder not found; check the path "
            f"(relative paths start from {Path.cwd()})"
        )
    return path


def _existing_file(value: Any, what: str) -> Path:
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise RankwiseError(
            f"{path}: {what} not found; check the path (relative paths start from {Path.cwd()})"
        )
    return path


def check_utf8_name(path: str | os.PathLike, shown: str | os.PathLike | None = None) -> None:
    """Refuse a path whose name is not UTF-8 (its bytes, as the file system holds them).

    A name in another encoding (Latin-1, Windows-1252, a zip archive made on Windows
    and unpacked here) cannot be written to a UTF-8 manifest: the loaders stopped with a
    UnicodeEncodeError traceback.  ``shown`` (default ``path``) is the path the message
    names, its undecodable bytes written as ``\\xe9``.
    """
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        name = os.fsencode(path if shown is None else shown).decode("utf-8", "backslashreplace")
        raise RankwiseError(
            f"{name}: this path is not UTF-8 text (byte 0x{raw[exc.start]:02x}: named in another "
            "encoding, e.g. Latin-1 or Windows-1252, as zip archives made on Windows unpack), so "
            "no UTF-8 manifest can hold it; rename it in UTF-8, e.g. "
            "convmv -f latin1 -t utf8 -r --notest <folder>"
        ) from None


def relative_path(target: str | os.PathLike, base: str | os.PathLike) -> str:
    """``target`` relative to folder ``base`` (POSIX separators; absolute if impossible).

    A result that is not UTF-8 text (:func:`check_utf8_name`, naming ``target``) is an error.
    """
    real_target = os.path.realpath(target)
    try:
        rel = Path(os.path.relpath(real_target, os.path.realpath(base))).as_posix()
    except ValueError:  # another drive on Windows
        rel = Path(real_target).as_posix()
    check_utf8_name(rel, target)
    if rel[:1] in (" ", "\t"):  # a manifest's values are read without the spaces around
        rel = "./" + rel  # them: ' dog/1.png' came back as 'dog/1.png', a missing file
    return rel


def walk_files(folder: Path, hidden: bool = False) -> list[Path]:
    """Every non-hidden entry below ``folder`` that is not a folder, at any depth, sorted.

    Symbolic links to folders are followed (a linked sub-tree counts), except a link
    back to a folder on its own path (a loop), which would list the same files again
    and again.  Hidden files and folders are skipped (listed with ``hidden``: a Zarr v2
    store's ``.zarray``); dangling links are listed (the caller decides).  The loaders
    and the pipeline's fingerprints (:func:`rankwise.pipeline_config.dataset_fingerprints`,
    :func:`rankwise.pipeline_config.folder_digest`) walk with it, so they see the same
    files.
    """
    found: list[Path] = []
    chains = {os.fspath(folder): frozenset({os.path.realpath(folder)})}
    for top, dirs, files in os.walk(folder, followlinks=True):
        chain = chains.pop(top)
        kept = []
        for name in sorted(dirs):
            real = os.path.realpath(os.path.join(top, name))
            if (name.startswith(".") and not hidden) or real in chain:
                continue
            chains[os.path.join(top, name)] = chain | {real}
            kept.append(name)
        dirs[:] = kept
        found += [Path(top) / name for name in files if hidden or not name.startswith(".")]
    return sorted(found)


def check_image_file(path: Path) -> Path:
    """``path``, named like an image, if it is a file; else an error naming it.

    A folder or a dangling link with an image's name looks like data: skipping it
    would drop an image silently, and the encoder would fail on it later.
    """
    if path.is_file():
        return path
    if path.is_symlink():
        raise RankwiseError(
            f"{path}: broken symbolic link (to {os.readlink(path)}); point it at the "
            "image or remove it"
        )
    kind = "a folder" if path.is_dir() else "not a regular file"
    raise RankwiseError(f"{path}: named like an image but {kind}; rename or remove it")


def image_files(folder: Path, extensions: Collection[str] = IMAGE_EXTENSIONS) -> list[Path]:
    """The images directly in ``folder`` (by extension), sorted; hidden ones skipped.

    Each must be a file (:func:`check_image_file`); other names (``Thumbs.db``) are
    ignored.
    """
    names = sorted(
        p for p in folder.iterdir() if p.suffix.lower() in extensions and not p.name.startswith(".")
    )
    return [check_image_file(p) for p in names]


def check_unique_stems(files: list[Path]) -> None:
    """Refuse two images with one stem (``x.jpg``, ``x.png``): the stem is their id."""
    seen: dict[str, Path] = {}
    for path in files:
        if path.stem in seen:
            raise RankwiseError(
                f"{seen[path.stem]} and {path}: two images with the same name {path.stem!r} "
                "(the image id); remove one"
            )
        seen[path.stem] = path


def _images_in(folder: Path) -> list[Path]:
    """Image files at any depth below ``folder`` (:func:`walk_files`), sorted."""
    return [check_image_file(p) for p in walk_files(folder) if p.suffix.lower() in IMAGE_EXTENSIONS]


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in COLUMN_ORDER if c in table.columns]
    cols += [c for c in table.columns if c not in cols]
    return table[cols].reset_index(drop=True)


def _write_csv_atomic(table: pd.DataFrame, path: Path) -> None:
    write_text_atomic(path, table.to_csv(index=False))


def seeded_split(labels: list[str] | np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of query rows: ``fraction`` of each label's rows, seeded per label.

    Each label with n >= 2 rows sends ``clip(round(fraction * n), 1, n - 1)`` of them to
    the queries, drawn with a generator seeded by ``(seed, crc32(label))``: adding or
    removing a label never changes another label's split.  Labels with one row stay in
    the gallery (a query needs a match).
    """
    if not 0.0 < float(fraction) < 1.0:
        raise RankwiseError(f"query_fraction must be between 0 and 1 (exclusive), got {fraction!r}")
    labels = np.asarray([str(x) for x in labels])
    mask = np.zeros(len(labels), dtype=bool)
    for label in sorted(set(labels.tolist())):
        rows = np.flatnonzero(labels == label)
        if len(rows) < 2:
            continue
        n_query = int(np.clip(round(float(fraction) * len(rows)), 1, len(rows) - 1))
        rng = np.random.default_rng([int(seed), zlib.crc32(label.encode("utf-8"))])
        mask[rng.choice(rows, size=n_query, replace=False)] = True
    return mask


# ---------------------------------------------------------------- market1501

_MARKET_NAME = re.compile(r"^(-?\d+)_c(\d+)s(\d+)_(\d+)_(\d+)$")


def market1501_table(folder: Path) -> pd.DataFrame:
    """Parse a folder of Market-1501 images (``PPPP_cCsS_FFFFFF_BB.jpg``); absolute paths.

    A folder or a dangling link named like an image, and two images with one stem
    (``x.jpg``, ``x.png``: one id), are errors.
    """
    files = image_files(folder)
    if not files:
        raise RankwiseError(
            f"{folder}: no images found; expected Market-1501 files named "
            "like 0002_c1s1_000451_03.jpg"
        )
    check_unique_stems(files)
    rows = []
    for path in files:
        match = _MARKET_NAME.match(path.stem)
        if match is None:
            raise RankwiseError(
                f"{path}: file name does not follow the Market-1501 "
                "convention PPPP_cCsS_FFFFFF_BB.jpg (e.g. "
                "0002_c1s1_000451_03.jpg); rename or remove it"
            )
        pid, cam, seq, frame, _box = match.groups()
        rows.append(
            {
                "id": path.stem,
                "label": str(int(pid)),
                "camera": int(cam),
                "sequence": f"c{int(cam)}s{int(seq)}",
                "frame": int(frame),
                "path": str(path.absolute()),
            }
        )
    return pd.DataFrame(rows)


def _relative_paths(tables: dict[str, pd.DataFrame], out: Path) -> dict[str, pd.DataFrame]:
    for table in tables.values():
        table["path"] = [relative_path(p, out) for p in table["path"]]
    return tables


def _root_advice(root: Path, names: tuple[str, str], otherwise: str) -> str:
    """What to do about a dataset root that lacks ``names``: where a folder inside it
    holds them all (a root given one level too high: ``datasets/`` for
    ``datasets/Market-1501-v15.09.15/``), set the root to that folder; else ``otherwise``."""
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        folders = []
    inner = next((f for f in folders if all((f / n).exists() for n in names)), None)
    if inner is None:
        return otherwise
    return f"{inner} holds {names[0]} and {names[1]}: set options.root to it"


def _load_market1501(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    root = _existing_dir(opts["root"], "Market-1501 root")
    tables = {}
    for split, key in (("query", "query_folder"), ("gallery", "gallery_folder")):
        folder = root / str(opts[key])
        if not folder.is_dir():
            names = (f"{opts['query_folder']}/", f"{opts['gallery_folder']}/")
            advice = f"options.root must be the folder holding {names[0]} and {names[1]}"
            raise RankwiseError(
                f"{folder}: Market-1501 {split} folder not found; "
                + _root_advice(root, names, advice)
            )
        tables[split] = market1501_table(folder)
    return _relative_paths(tables, out)


# ---------------------------------------------------------------- msmt17


_MSMT17_LISTS = ("list_query.txt", "list_gallery.txt")


def _load_msmt17(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    root = _existing_dir(opts["root"], "MSMT17 root")
    if opts["images"] in (None, "", "auto"):
        candidates = [root / "test", root / "mask_test_v2"]
        images = next((c for c in candidates if c.is_dir()), None)
        if images is None:
            advice = "set options.images to the folder holding the test images"
            raise RankwiseError(
                f"{root}: no image folder test/ (MSMT17_V1) or mask_test_v2/ "
                f"(MSMT17_V2) found; {_root_advice(root, _MSMT17_LISTS, advice)}"
            )
    else:
        images = _existing_dir(root / str(opts["images"]), "MSMT17 images")
    tables = {}
    for split in SPLITS:
        listing = root / f"list_{split}.txt"
        if not listing.is_file():
            advice = "options.root must be the folder holding list_query.txt and list_gallery.txt"
            raise RankwiseError(
                f"{listing}: MSMT17 list file not found; "
                + _root_advice(root, _MSMT17_LISTS, advice)
            )
        rows = []
        text = read_utf8_text(listing, "MSMT17 list file")
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split()
            if len(fields) != 2 or not re.fullmatch(r"-?\d+", fields[1]):
                raise RankwiseError(
                    f"{listing}: line {number}: expected 'pid/file.jpg label', "
                    f"found {line.strip()!r}"
                )
            rel, label = fields
            stem = Path(rel).stem
            parts = stem.split("_")
            # isdecimal, as int() reads: '0²' is a digit string to isdigit, not to int()
            if len(parts) < 3 or not parts[2].isdecimal():
                raise RankwiseError(
                    f"{listing}: line {number}: cannot read the camera from "
                    f"{rel!r}; MSMT17 names look like "
                    "0000_000_01_0303morning_0015_0.jpg (third field = camera)"
                )
            path = images / rel
            if not path.is_file():
                raise RankwiseError(
                    f"{listing}: line {number}: image {path} not found; check "
                    "options.root / options.images"
                )
            rows.append(
                {
                    "id": stem,
                    "label": str(int(label)),
                    "camera": int(parts[2]),
                    "path": str(path.absolute()),
                }
            )
        if not rows:
            raise RankwiseError(f"{listing}: no entries; expected lines 'pid/file.jpg label'")
        table = pd.DataFrame(rows)
        dup = table["id"].duplicated()
        if dup.any():
            raise RankwiseError(
                f"{listing}: image name {table['id'][dup].iloc[0]!r} listed "
                "twice; each image must appear once"
            )
        tables[split] = table
    return _relative_paths(tables, out)


# ---------------------------------------------------------------- folder


def _labelled_images(folder: Path) -> pd.DataFrame:
    """One row per image below ``folder/<label>/``; id = path relative to ``folder``."""
    labels = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    rows = []
    for label_dir in labels:
        for path in _images_in(label_dir):
            check_utf8_name(path.relative_to(folder), path)  # the id and the label
            rows.append(
                {
                    "id": path.relative_to(folder).as_posix(),
                    "label": label_dir.name,
                    "path": str(path.absolute()),
                }
            )
    if not rows:
        raise RankwiseError(
            f"{folder}: no labelled images found; expected one subfolder per "
            "label holding its images (e.g. "
            f"{folder}/cat/001.jpg)"
        )
    _refuse_labels_equal_when_stripped(folder, sorted({row["label"] for row in rows}))
    return pd.DataFrame(rows)


def _refuse_labels_equal_when_stripped(folder: Path, labels: list[str]) -> None:
    """One line naming two label folders whose names differ only by the spaces and
    tabs around them: a manifest's values do not keep those (``cat `` is read as
    ``cat``, :func:`rankwise.manifest.read_csv_strings`), so they would be one label."""
    seen: dict[str, str] = {}
    for label in labels:
        first = seen.setdefault(label.strip(" \t"), label)
        if first != label:
            raise RankwiseError(
                f"{folder}: label folders {first!r} and {label!r} differ only by spaces "
                "around the name, and a manifest's labels do not keep those, so they "
                "would be one label; rename one, or move its images into the other"
            )


def folder_layout(opts: dict[str, Any]) -> str:
    """``"split dirs"`` (``query_dir`` and ``gallery_dir``) or ``"root"`` (one tree, a
    seeded split): which the ``folder`` loader's options give (an empty value is none),
    or the error saying what is wrong. The pipeline checks it before any job."""
    given = {k for k in ("root", "query_dir", "gallery_dir") if opts.get(k) not in (None, "")}
    if given == {"root"}:
        return "root"
    if given == {"query_dir", "gallery_dir"}:
        return "split dirs"
    if "root" in given:
        raise RankwiseError(
            "folder: give either {query_dir, gallery_dir} or {root, query_fraction, seed}, not both"
        )
    if given:
        raise RankwiseError("folder: options query_dir and gallery_dir go together; give both")
    raise RankwiseError("folder: missing option root (or query_dir and gallery_dir)")


def _load_folder(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    if folder_layout(opts) == "split dirs":
        qdir = _existing_dir(opts["query_dir"], "query")
        gdir = _existing_dir(opts["gallery_dir"], "gallery")
        query, gallery = _labelled_images(qdir), _labelled_images(gdir)
        if os.path.realpath(qdir) != os.path.realpath(gdir):
            query["id"] = "query/" + query["id"]
            gallery["id"] = "gallery/" + gallery["id"]
        return _relative_paths({"query": query, "gallery": gallery}, out)
    table = _labelled_images(_existing_dir(opts["root"], "image"))
    is_query = seeded_split(table["label"].tolist(), opts["query_fraction"], opts["seed"])
    if not is_query.any():
        raise RankwiseError(
            f"{opts['root']}: no label has two images, so no query can have a "
            "match; add images or use query_dir/gallery_dir"
        )
    return _relative_paths(
        {"query": table[is_query].copy(), "gallery": table[~is_query].copy()}, out
    )


# ---------------------------------------------------------------- manifest


def _load_manifest(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    from .manifest import read_manifest

    tables = {}
    for split in SPLITS:
        source = _existing_file(opts[split], f"{split} manifest")
        table = read_manifest(source, protocol=opts["protocol"], role=split).to_frame()
        if "path" in table.columns:
            # Absolute and empty paths are kept; relative ones are re-based on out_dir.
            table["path"] = [
                relative_path(source.parent / p, out) if p and not Path(p).is_absolute() else p
                for p in table["path"].astype(str)
            ]
        tables[split] = table
    return tables


# ---------------------------------------------------------------- registry


@dataclass(frozen=True)
class Loader:
    """A named loader: its options (defaults, bounds, required keys) and function."""

    function: Callable[..., dict[str, pd.DataFrame]]
    options: OptionSet
    generates_images: bool = False
    #: writes files both splits' manifests name (demo images, mot's crops): one split's
    #: manifest alone would be left naming files rewritten for other options
    writes_shared_files: bool = False

    @property
    def defaults(self) -> dict[str, Any]:
        return self.options.defaults

    @property
    def required(self) -> tuple[str, ...]:
        return self.options.required


def _demo(name: str) -> Callable[..., dict[str, pd.DataFrame]]:
    def run(opts: dict[str, Any], images_dir: Path) -> dict[str, pd.DataFrame]:
        from . import demo

        return demo.GENERATORS[name](opts, images_dir)

    return run


def _path(
    name: str,
    help: str,
    *,
    default: str | None = None,
    required: bool = False,
    nullable: bool = False,
) -> Option:
    return Option(name, "string", default, help=help, required=required, nullable=nullable)


LOADERS: dict[str, Loader] = {
    "market1501": Loader(
        _load_market1501,
        OptionSet(
            "market1501",
            (
                _path("root", "folder holding query/ and bounding_box_test/", required=True),
                _path("query_folder", "query image folder under root", default="query"),
                _path(
                    "gallery_folder", "gallery image folder under root", default="bounding_box_test"
                ),
            ),
        ),
    ),
    "msmt17": Loader(
        _load_msmt17,
        OptionSet(
            "msmt17",
            (
                _path("root", "folder holding list_query.txt and list_gallery.txt", required=True),
                _path(
                    "images",
                    "image folder under root; auto = test/ or mask_test_v2/",
                    default="auto",
                ),
            ),
        ),
    ),
    "folder": Loader(
        _load_folder,
        OptionSet(
            "folder",
            (
                _path("query_dir", "query folder, one subfolder per label", nullable=True),
                _path("gallery_dir", "gallery folder, one subfolder per label", nullable=True),
                _path(
                    "root", "one subfolder per label, split into query and gallery", nullable=True
                ),
                Option(
                    "query_fraction",
                    "number",
                    0.2,
                    above=0,
                    below=1,
                    help="with root: fraction of each label's images used as queries",
                ),
                Option("seed", "integer", 0, minimum=0, help="with root: seeds the split"),
            ),
            description="{query_dir, gallery_dir} or {root, query_fraction, seed}; one "
            "subfolder per label",
        ),
    ),
    "manifest": Loader(
        _load_manifest,
        OptionSet(
            "manifest",
            (
                _path("query", "query manifest CSV", required=True),
                _path("gallery", "gallery manifest CSV", required=True),
                # The workflow passes the dataset's protocol: no default in the schema.
                Option(
                    "protocol",
                    "enum",
                    "recall",
                    choices=PROTOCOLS,
                    noun="protocol",
                    schema_default=False,
                    help="columns to check; defaults to the dataset's protocol (set by the "
                    "workflow)",
                ),
            ),
        ),
    ),
}
for _name, _options in DEMO_OPTIONS.items():
    LOADERS[_name] = Loader(_demo(_name), _options, generates_images=True, writes_shared_files=True)

# Imported last: these modules import the helpers above inside their functions.
from . import datasets_reid as _reid  # noqa: E402
from . import mot as _mot  # noqa: E402

LOADERS["veri776"] = Loader(_reid.load_veri776, _reid.VERI776_OPTIONS)
LOADERS["dukemtmc"] = Loader(_reid.load_dukemtmc, _reid.DUKEMTMC_OPTIONS)
LOADERS["cuhk03-np"] = Loader(_reid.load_cuhk03_np, _reid.CUHK03_NP_OPTIONS)
LOADERS["identity-folders"] = Loader(_reid.load_identity_folders, _reid.IDENTITY_FOLDERS_OPTIONS)
LOADERS["mot"] = Loader(_mot.load_mot, _mot.MOT_OPTIONS, writes_shared_files=True)


def prepare_dataset(
    loader: str,
    options: dict[str, Any] | None,
    out_dir: str | os.PathLike,
    splits: Collection[str] = SPLITS,
) -> dict[str, Any]:
    """Write ``out_dir/query.csv`` and ``out_dir/gallery.csv`` for ``loader``.

    Parameters
    ----------
    loader : a name in ``LOADERS``.
    options : the loader's options (see the module docstring); unknown keys are errors.
    out_dir : folder of the manifests (created). Demo images go to ``out_dir/images/``.
    splits : the manifests to write (the pipeline writes a split whose data changed
        alone). The loader reads and checks both splits either way.

    Returns
    -------
    dict with ``loader``, ``out_dir``, ``query`` and ``gallery`` (row counts),
    ``labels`` (distinct labels over both splits) and ``columns``.
    """
    if loader not in LOADERS:
        raise RankwiseError(f"unknown loader {loader!r}; valid loaders: {', '.join(LOADERS)}")
    unknown = [s for s in splits if s not in SPLITS]
    if unknown or not splits:
        raise RankwiseError(f"splits {list(splits)!r}: give one or both of {', '.join(SPLITS)}")
    spec = LOADERS[loader]
    if spec.writes_shared_files and set(splits) != set(SPLITS):
        raise RankwiseError(
            f"{loader}: writes both manifests at once (both name the files it writes, "
            "images or crops); give both splits (rankwise prepare: leave out --split)"
        )
    opts = spec.options.check(options)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if spec.generates_images:
        with atomic_directory(out / "images") as tmp:
            tables = spec.function(opts, tmp)
        for table in tables.values():  # generator paths are relative to images/
            table["path"] = ["images/" + Path(p).as_posix() for p in table["path"]]
    else:
        tables = spec.function(opts, out)
    tables = {split: _ordered(tables[split]) for split in SPLITS}
    for split in SPLITS:
        if split in splits:
            _write_csv_atomic(tables[split], out / f"{split}.csv")
    labels = set(tables["query"]["label"].astype(str)) | set(tables["gallery"]["label"].astype(str))
    return {
        "loader": loader,
        "out_dir": str(out),
        "query": int(len(tables["query"])),
        "gallery": int(len(tables["gallery"])),
        "labels": len(labels),
        "columns": list(tables["query"].columns),
    }
