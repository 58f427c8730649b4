"""Re-identification benchmark loaders: VeRi-776, DukeMTMC-reID, CUHK03-NP, identity folders.

Each loader returns ``{"query": table, "gallery": table}`` with absolute ``path``
values made relative to ``out`` (see :func:`rankwise.datasets.prepare_dataset`,
which registers them in ``LOADERS``).  Every loader is named after its benchmark,
so the loader name in a config and in ``rankwise prepare`` says which benchmark
and which protocol the numbers belong to.

``veri776`` {root}
    ``image_query/`` and ``image_test/`` with their lists ``name_query.txt`` and
    ``name_test.txt`` (one file name per line).  Only listed files are used, in list
    order (fast-reid's ``veri.py`` globs every ``*.jpg`` of both folders: the same
    files in the release).  Names ``VVVV_cCCC_FFFFFFFF_N.jpg`` (``0002_c002_00030600_0.jpg``):
    label = ``str(int(V))``, camera = ``int(C)``, frame = ``int(F)``, id = the stem.
    Protocol ``reid``: a query's own vehicle under its own camera is excluded, which
    is what VeRi's ``jk_index.txt`` lists as junk.  An image named in both lists has
    one id, so it is never its own match.
``dukemtmc`` {root}
    DukeMTMC-reID: ``query/`` and ``bounding_box_test/`` holding
    ``PPPP_cC_fFFFFFFF.jpg`` (``0005_c2_f0046985.jpg``: person 5, camera 2, frame
    46985 of that camera's video).  label = ``str(int(P))``, camera = C, frame = F.
    Protocol ``reid`` (a ``-1`` label, which the release has none of, would be junk by
    its default ``junk_labels``; torchreid and fast-reid would keep it as an identity).
``cuhk03-np`` {root, variant}
    CUHK03 under the new protocol (Zhong et al., CVPR 2017; 767 / 700 identities):
    ``<root>/labeled/`` or ``<root>/detected/`` (``variant``: ``labeled`` = manually
    drawn boxes, ``detected`` = DPM boxes; papers report both, so there is no default),
    each with ``query/`` and ``bounding_box_test/`` of ``PPPP_cC_N.png`` images.
    label = ``str(int(P))``, camera = C (1 or 2), with the Market-1501 pattern
    ``([-\\d]+)_c(\\d)`` the release's names follow; whatever follows the camera stays
    in the id.  torchreid and fast-reid have no loader for this release: their
    ``cuhk03`` classes build the same 767 / 700 split from ``cuhk-03.mat`` and the
    new-protocol ``.mat`` configs, with other image names, so ids differ from theirs
    (the classic 20-split protocol is not supported here).  Protocol ``reid`` (the
    CUHK03-NP numbers papers report; single-gallery-shot is the old protocol's CMC).
``identity-folders`` {root, queries_per_id=1, min_crops=2, seed=0}
    ``<root>/<identity>/<crop>.(jpg|jpeg|png|bmp)``, the layout of the ``reid``
    package's identity crops (and of the ``mot`` loader's ``crops/``).  Query and
    gallery are derived as the ``reid`` package's ``RetrievalProtocol`` does, so the
    same seed gives the same split on a tree without hidden entries: identities
    (folders, sorted by name; hidden and empty ones skipped, and hidden files, which
    ``reid`` counts: ``.ipynb_checkpoints/`` as an identity, macOS ``._*.jpg`` as
    crops, each shifting its shared shuffle) with fewer than ``min_crops`` crops are
    dropped from both sides; one ``random.Random(seed)`` shuffles each remaining
    identity's crops (sorted by file name) in turn, the first ``queries_per_id`` become
    queries, the rest the gallery.  label = the folder name, id = ``<folder>/<file>``.
    Two kept identity folders whose names differ only by spaces around them (``0001``
    and ``0001 ``) are refused: a manifest's values do not keep those spaces.
    The folders carry no camera, so there is no ``camera`` column: evaluate with
    protocol ``recall``, whose numbers equal the ``reid`` package's retrieval metrics
    (its synthetic cameras, 0 for queries and 1 for the gallery, exclude nothing;
    recall@K = its rankK).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import RankwiseError
from .manifest import read_utf8_text
from .options import Option, OptionSet

# ---------------------------------------------------------------- option checks


def int_option(loader: str, opts: dict[str, Any], name: str, minimum: int) -> int:
    """``opts[name]`` as an int >= ``minimum``, else a RankwiseError naming the option."""
    value = opts[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RankwiseError(
            f"{loader}: option {name} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def choice_option(loader: str, opts: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    """``opts[name]`` if it is one of ``choices``, else a RankwiseError listing them."""
    value = opts[name]
    if value not in choices:
        raise RankwiseError(
            f"{loader}: option {name} must be one of {', '.join(choices)}; got {value!r}"
        )
    return value


# ---------------------------------------------------------------- Market-1501-like file names


@dataclass(frozen=True)
class Naming:
    """A benchmark's image-name convention: a regex over the stem and its fields."""

    benchmark: str
    pattern: re.Pattern[str]
    convention: str  # e.g. PPPP_cC_fFFFFFFF.jpg
    example: str
    fields: Callable[[re.Match[str]], dict[str, Any]]  # label, camera[, frame]


DUKEMTMC_NAMING = Naming(
    "DukeMTMC-reID",
    re.compile(r"^(-?\d+)_c(\d+)_f(\d+)$"),
    "PPPP_cC_fFFFFFFF.jpg",
    "0005_c2_f0046985.jpg",
    lambda m: {"label": str(int(m[1])), "camera": int(m[2]), "frame": int(m[3])},
)

# CUHK03-NP names follow Market-1501's ([-\d]+)_c(\d), cameras 1..2.
CUHK03_NAMING = Naming(
    "CUHK03-NP",
    re.compile(r"^(-?\d+)_c([12])(?:_.*)?$"),
    "PPPP_cC_N.png (camera C = 1 or 2)",
    "0003_c1_1.png",
    lambda m: {"label": str(int(m[1])), "camera": int(m[2])},
)

VERI776_NAMING = Naming(
    "VeRi-776",
    re.compile(r"^(\d+)_c(\d+)_(\d+)_(\d+)$"),
    "VVVV_cCCC_FFFFFFFF_N.jpg",
    "0002_c002_00030600_0.jpg",
    lambda m: {"label": str(int(m[1])), "camera": int(m[2]), "frame": int(m[3])},
)


def _parse_name(path: Path, naming: Naming, where: str) -> dict[str, Any]:
    match = naming.pattern.match(path.stem)
    if match is None:
        raise RankwiseError(
            f"{where}: file name {path.name!r} does not follow the "
            f"{naming.benchmark} convention {naming.convention} (e.g. "
            f"{naming.example}); rename or remove it"
        )
    return {"id": path.stem, **naming.fields(match), "path": str(path.absolute())}


def named_images_table(folder: Path, naming: Naming) -> pd.DataFrame:
    """One row per image directly in ``folder``, sorted by name; absolute paths.

    Columns: ``id`` (the stem), the naming's fields (``label``, ``camera``, ...), ``path``.
    Other files (``Thumbs.db``) and hidden files are skipped; a folder or a dangling link
    named like an image, and two images with one stem (``x.jpg``, ``x.png``), are errors.
    """
    from .datasets import check_unique_stems, image_files

    files = image_files(folder)
    if not files:
        raise RankwiseError(
            f"{folder}: no images found; expected {naming.benchmark} files "
            f"named like {naming.example}"
        )
    check_unique_stems(files)
    return pd.DataFrame([_parse_name(p, naming, str(p)) for p in files])


def _market_format(root: Path, naming: Naming, holder: str) -> dict[str, pd.DataFrame]:
    tables = {}
    for split, name in (("query", "query"), ("gallery", "bounding_box_test")):
        folder = root / name
        if not folder.is_dir():
            raise RankwiseError(
                f"{folder}: {naming.benchmark} {split} folder not found; "
                f"{holder} must be the folder holding query/ and "
                "bounding_box_test/"
            )
        tables[split] = named_images_table(folder, naming)
    return tables


# ---------------------------------------------------------------- dukemtmc

DUKEMTMC_OPTIONS = OptionSet(
    "dukemtmc",
    (
        Option(
            "root",
            "string",
            required=True,
            help="DukeMTMC-reID folder holding query/ and bounding_box_test/",
        ),
    ),
)


def load_dukemtmc(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    """DukeMTMC-reID ``query/`` + ``bounding_box_test/`` (protocol ``reid``)."""
    from .datasets import _existing_dir, _relative_paths

    root = _existing_dir(opts["root"], "DukeMTMC-reID root")
    return _relative_paths(_market_format(root, DUKEMTMC_NAMING, "options.root"), out)


# ---------------------------------------------------------------- cuhk03-np

CUHK03_VARIANTS = ("labeled", "detected")
CUHK03_NP_OPTIONS = OptionSet(
    "cuhk03-np",
    (
        Option(
            "root", "string", required=True, help="CUHK03-NP folder holding labeled/ and detected/"
        ),
        Option(
            "variant",
            "enum",
            None,
            choices=CUHK03_VARIANTS,
            required=True,
            help="labeled = hand-drawn boxes, detected = DPM boxes (papers report both)",
        ),
    ),
)


def load_cuhk03_np(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    """CUHK03-NP ``<root>/<variant>/{query,bounding_box_test}/`` (protocol ``reid``)."""
    from .datasets import _existing_dir, _relative_paths

    variant = choice_option("cuhk03-np", opts, "variant", CUHK03_VARIANTS)
    root = _existing_dir(opts["root"], "CUHK03-NP root")
    folder = root / variant
    if not folder.is_dir():
        raise RankwiseError(
            f"{folder}: CUHK03-NP {variant} folder not found; options.root must "
            "be the CUHK03-NP folder holding labeled/ and detected/"
        )
    return _relative_paths(_market_format(folder, CUHK03_NAMING, f"options.root/{variant}"), out)


# ---------------------------------------------------------------- veri776

VERI776_OPTIONS = OptionSet(
    "veri776",
    (
        Option(
            "root",
            "string",
            required=True,
            help="folder holding image_query/, image_test/, name_query.txt, name_test.txt",
        ),
    ),
)


def _veri_listed(root: Path, listing_name: str, folder_name: str) -> pd.DataFrame:
    listing, folder = root / listing_name, root / folder_name
    if not listing.is_file():
        raise RankwiseError(
            f"{listing}: VeRi-776 list file not found; options.root must be "
            f"the VeRi folder holding {listing_name} and {folder_name}/"
        )
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}  # name -> line
    text = read_utf8_text(listing, "VeRi-776 list file")
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.strip()
        if not name:
            continue
        where = f"{listing}: line {number}"
        if "/" in name or "\\" in name or " " in name:
            raise RankwiseError(
                f"{where}: expected one file name per line such as "
                f"{VERI776_NAMING.example}, found {name!r}"
            )
        if name in seen:
            raise RankwiseError(
                f"{where}: {name!r} already listed on line {seen[name]}; each "
                "image must appear once"
            )
        seen[name] = number
        row = _parse_name(Path(name), VERI776_NAMING, where)
        path = folder / name
        if not path.is_file():
            raise RankwiseError(f"{where}: image {path} not found; check options.root")
        rows.append({**row, "path": str(path.absolute())})
    if not rows:
        raise RankwiseError(
            f"{listing}: no file names; expected one per line such as {VERI776_NAMING.example}"
        )
    return pd.DataFrame(rows)


def load_veri776(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    """VeRi-776 query / test images in the order of ``name_query.txt`` / ``name_test.txt``."""
    from .datasets import _existing_dir, _relative_paths

    root = _existing_dir(opts["root"], "VeRi-776 root")
    tables = {
        "query": _veri_listed(root, "name_query.txt", "image_query"),
        "gallery": _veri_listed(root, "name_test.txt", "image_test"),
    }
    return _relative_paths(tables, out)


# ---------------------------------------------------------------- identity-folders

IDENTITY_FOLDERS_OPTIONS = OptionSet(
    "identity-folders",
    (
        Option("root", "string", required=True, help="folder of <identity>/<crop>.jpg"),
        Option("queries_per_id", "integer", 1, minimum=1, help="queries drawn per identity"),
        Option(
            "min_crops",
            "integer",
            2,
            minimum=2,
            help="identities with fewer crops are dropped; must exceed queries_per_id",
        ),
        Option("seed", "integer", 0, minimum=0, help="seeds the query draw"),
    ),
)
# The reid package's identity-folder extensions: the same files give the same split.
IDENTITY_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


def identity_crops(root: Path) -> list[tuple[str, list[Path]]]:
    """``(folder name, sorted crops)`` per non-empty, non-hidden identity folder, by name.

    A crop name that is not a file (a folder, a dangling link) is an error
    (:func:`rankwise.datasets.image_files`), and so is a folder or crop name that is not
    UTF-8 (:func:`rankwise.datasets.check_utf8_name`).
    """
    from .datasets import check_utf8_name, image_files

    identities = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        crops = image_files(folder, IDENTITY_EXTENSIONS)
        for crop in crops:  # <folder>/<file> is the id, the folder the label
            check_utf8_name(crop.relative_to(root), crop)
        if crops:
            identities.append((folder.name, crops))
    return identities


def derived_split(
    identities: list[tuple[str, list[Path]]], *, queries_per_id: int, min_crops: int, seed: int
) -> tuple[list[tuple[str, Path]], list[tuple[str, Path]]]:
    """The ``reid`` package's ``RetrievalProtocol`` split: ``(query, gallery)`` pairs.

    Identities with ``len(crops) < min_crops`` are dropped; one ``random.Random(seed)``
    shuffles the crops of each kept identity in turn (in ``identities`` order) and the
    first ``queries_per_id`` of the shuffled list are queries.
    """
    rng = random.Random(seed)
    query, gallery = [], []
    for name, crops in identities:
        if len(crops) < min_crops:
            continue
        order = list(range(len(crops)))
        rng.shuffle(order)
        query += [(name, crops[i]) for i in order[:queries_per_id]]
        gallery += [(name, crops[i]) for i in order[queries_per_id:]]
    return query, gallery


def load_identity_folders(opts: dict[str, Any], out: Path) -> dict[str, pd.DataFrame]:
    """A derived query / gallery split of identity folders (protocol ``recall``)."""
    from .datasets import _existing_dir, _refuse_labels_equal_when_stripped, _relative_paths

    queries = int_option("identity-folders", opts, "queries_per_id", 1)
    min_crops = int_option("identity-folders", opts, "min_crops", 1)
    seed = opts["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RankwiseError(f"identity-folders: option seed must be an integer, got {seed!r}")
    if min_crops <= queries:
        raise RankwiseError(
            f"identity-folders: option min_crops ({min_crops}) must be greater "
            f"than queries_per_id ({queries}) so that every query keeps a "
            f"gallery match; set it to {queries + 1} or more"
        )
    root = _existing_dir(opts["root"], "identity folders root")
    identities = identity_crops(root)
    if not identities:
        raise RankwiseError(
            f"{root}: no identity folders with images; expected "
            f"<root>/<identity>/<crop>.jpg (e.g. {root}/0001/000001.jpg)"
        )
    query, gallery = derived_split(
        identities, queries_per_id=queries, min_crops=min_crops, seed=seed
    )
    if not query:
        most = max(len(crops) for _, crops in identities)
        raise RankwiseError(
            f"{root}: no identity has min_crops={min_crops} crops (the most is "
            f"{most}); lower options.min_crops or add crops"
        )
    # the labels written: a dropped identity's folder merges with none
    _refuse_labels_equal_when_stripped(root, sorted({name for name, _ in query}))

    def table(pairs: list[tuple[str, Path]]) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"id": f"{name}/{path.name}", "label": name, "path": str(path.absolute())}
                for name, path in pairs
            ]
        )

    return _relative_paths({"query": table(query), "gallery": table(gallery)}, out)
