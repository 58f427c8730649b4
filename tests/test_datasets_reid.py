"""VeRi-776, DukeMTMC-reID, CUHK03-NP and identity-folder loaders on generated trees.

Each tree uses the benchmark's real naming convention; every column is checked by hand.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

from rankwise.datasets import prepare_dataset
from rankwise.datasets_reid import derived_split, identity_crops
from rankwise.errors import RankwiseError

ROOT = Path(__file__).resolve().parents[1]


def _image(path: Path, value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 4, 3), value, np.uint8)).save(path)
    return path


def _read(out: Path, split: str) -> pd.DataFrame:
    return pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)


def _resolve(out: Path, table: pd.DataFrame) -> list[Path]:
    paths = [(out / p).resolve() for p in table["path"]]
    assert all(p.is_file() for p in paths)
    assert not any(p.startswith("/") for p in table["path"])  # relative to the manifest
    return paths


# ---------------------------------------------------------------- veri776

VERI_QUERY = ["0002_c002_00030600_0.jpg", "0776_c020_00012345_1.jpg"]
VERI_TEST = [
    "0002_c003_00030670_1.jpg",
    "0002_c002_00030610_0.jpg",
    "0776_c007_00000001_0.jpg",
    "0010_c014_00099999_0.jpg",
]


@pytest.fixture
def veri(tmp_path: Path) -> Path:
    root = tmp_path / "VeRi"
    for name in VERI_QUERY:
        _image(root / "image_query" / name)
    for name in VERI_TEST:
        _image(root / "image_test" / name)
    _image(root / "image_test" / "0099_c001_00000001_0.jpg")  # not listed: not used
    _image(root / "image_train" / "0001_c001_00016450_0.jpg")  # training: not read
    # the lists fix the order (not sorted) and are the only source of names
    (root / "name_query.txt").write_text("\n".join(reversed(VERI_QUERY)) + "\n")
    (root / "name_test.txt").write_text("\n".join(VERI_TEST) + "\n\n")
    return root


def test_veri776_manifest(veri: Path, tmp_path: Path):
    out = tmp_path / "out"
    summary = prepare_dataset("veri776", {"root": str(veri)}, out)
    assert (summary["query"], summary["gallery"], summary["labels"]) == (2, 4, 3)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert list(query.columns) == ["id", "label", "camera", "frame", "path"]
    assert query["id"].tolist() == ["0776_c020_00012345_1", "0002_c002_00030600_0"]
    assert query["label"].tolist() == ["776", "2"]
    assert query["camera"].tolist() == ["20", "2"]
    assert query["frame"].tolist() == ["12345", "30600"]
    assert gallery["id"].tolist() == [Path(n).stem for n in VERI_TEST]
    assert gallery["label"].tolist() == ["2", "2", "776", "10"]
    assert gallery["camera"].tolist() == ["3", "2", "7", "14"]
    assert gallery["frame"].tolist() == ["30670", "30610", "1", "99999"]
    assert [p.name for p in _resolve(out, query)] == list(reversed(VERI_QUERY))
    assert [p.parent.name for p in _resolve(out, gallery)] == ["image_test"] * 4


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "0002_c2_30600.jpg",
            r"name_test\.txt: line 5: file name '0002_c2_30600\.jpg' does not "
            r"follow the VeRi-776 convention VVVV_cCCC_FFFFFFFF_N\.jpg \(e\.g\. "
            r"0002_c002_00030600_0\.jpg\)",
        ),
        (
            "0002_c002_00030610_0.jpg",
            r"name_test\.txt: line 5: '0002_c002_00030610_0\.jpg' already "
            r"listed on line 2",
        ),
        (
            "0003_c001_00000005_0.jpg",
            r"name_test\.txt: line 5: image .*image_test/"
            r"0003_c001_00000005_0\.jpg not found",
        ),
        ("image_test/0002_c003_00030670_1.jpg", r"line 5: expected one file name per line"),
    ],
)
def test_veri776_bad_list_line(veri: Path, tmp_path: Path, line: str, message: str):
    (veri / "name_test.txt").write_text("\n".join(VERI_TEST) + "\n" + line + "\n")
    with pytest.raises(RankwiseError, match=message):
        prepare_dataset("veri776", {"root": str(veri)}, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


def test_veri776_list_in_another_encoding_is_one_line(veri: Path, tmp_path: Path):
    """A UnicodeDecodeError traceback before (audit 2026-12-02)."""
    (veri / "name_query.txt").write_bytes(b"\xff" + (veri / "name_query.txt").read_bytes())
    with pytest.raises(
        RankwiseError,
        match=r"name_query\.txt: not a readable VeRi-776 list file: line 1 is not UTF-8 text "
        r"\(byte 0xff: .*\); save it as UTF-8$",
    ):
        prepare_dataset("veri776", {"root": str(veri)}, tmp_path / "out")


def test_veri776_missing_list(veri: Path, tmp_path: Path):
    (veri / "name_query.txt").unlink()
    with pytest.raises(
        RankwiseError,
        match=r"name_query\.txt: VeRi-776 list file not found; "
        r"options\.root must be the VeRi folder",
    ):
        prepare_dataset("veri776", {"root": str(veri)}, tmp_path / "out")


# ---------------------------------------------------------------- dukemtmc

DUKE_QUERY = ["0005_c2_f0046985.jpg", "0023_c4_f0031504.jpg"]
DUKE_GALLERY = [
    "0005_c5_f0051781.jpg",
    "0005_c2_f0047105.jpg",
    "0023_c6_f0000012.jpg",
    "7139_c2_f0160815.jpg",
]


@pytest.fixture
def duke(tmp_path: Path) -> Path:
    root = tmp_path / "DukeMTMC-reID"
    for name in DUKE_QUERY:
        _image(root / "query" / name)
    for name in DUKE_GALLERY:
        _image(root / "bounding_box_test" / name)
    _image(root / "bounding_box_train" / "0001_c2_f0046182.jpg")
    (root / "README.md").write_text("shipped with the dataset")
    return root


def test_dukemtmc_manifest(duke: Path, tmp_path: Path):
    out = tmp_path / "out"
    summary = prepare_dataset("dukemtmc", {"root": str(duke)}, out)
    assert (summary["query"], summary["gallery"], summary["labels"]) == (2, 4, 3)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert list(query.columns) == ["id", "label", "camera", "frame", "path"]
    assert query["id"].tolist() == ["0005_c2_f0046985", "0023_c4_f0031504"]
    assert query["label"].tolist() == ["5", "23"]
    assert query["camera"].tolist() == ["2", "4"]
    assert query["frame"].tolist() == ["46985", "31504"]
    # files in name order
    assert gallery["id"].tolist() == [
        "0005_c2_f0047105",
        "0005_c5_f0051781",
        "0023_c6_f0000012",
        "7139_c2_f0160815",
    ]
    assert gallery["label"].tolist() == ["5", "5", "23", "7139"]
    assert gallery["camera"].tolist() == ["2", "5", "6", "2"]
    assert gallery["frame"].tolist() == ["47105", "51781", "12", "160815"]
    assert [p.stem for p in _resolve(out, gallery)] == gallery["id"].tolist()


def test_dukemtmc_rejects_market_names(duke: Path, tmp_path: Path):
    _image(duke / "query" / "0002_c1s1_000451_00.jpg")  # a Market-1501 name
    with pytest.raises(
        RankwiseError,
        match=r"query/0002_c1s1_000451_00\.jpg: file name "
        r"'0002_c1s1_000451_00\.jpg' does not follow the "
        r"DukeMTMC-reID convention PPPP_cC_fFFFFFFF\.jpg",
    ):
        prepare_dataset("dukemtmc", {"root": str(duke)}, tmp_path / "out")


def test_dukemtmc_missing_folder(tmp_path: Path):
    (tmp_path / "duke" / "query").mkdir(parents=True)
    _image(tmp_path / "duke" / "query" / DUKE_QUERY[0])
    with pytest.raises(
        RankwiseError,
        match=r"bounding_box_test: DukeMTMC-reID gallery folder "
        r"not found; options\.root must be the folder",
    ):
        prepare_dataset("dukemtmc", {"root": str(tmp_path / "duke")}, tmp_path / "out")


# ---------------------------------------------------------------- cuhk03-np


def _cuhk03(root: Path) -> None:
    for variant, shade in (("labeled", 10), ("detected", 200)):
        for name in ("0003_c1_1.png", "0003_c2_6.png", "1467_c1_2.png"):
            _image(root / variant / "query" / name, shade)
        for name in ("0003_c2_7.png", "0003_c1_3.png", "1467_c2_9.png", "0010_c2_10.png"):
            _image(root / variant / "bounding_box_test" / name, shade)
        _image(root / variant / "bounding_box_train" / "0001_c1_1.png", shade)


@pytest.mark.parametrize("variant, shade", [("labeled", 10), ("detected", 200)])
def test_cuhk03_np_manifest(tmp_path: Path, variant: str, shade: int):
    root = tmp_path / "CUHK03-NP"
    _cuhk03(root)
    out = tmp_path / variant
    summary = prepare_dataset("cuhk03-np", {"root": str(root), "variant": variant}, out)
    assert (summary["query"], summary["gallery"], summary["labels"]) == (3, 4, 3)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert list(query.columns) == ["id", "label", "camera", "path"]
    assert query["id"].tolist() == ["0003_c1_1", "0003_c2_6", "1467_c1_2"]
    assert query["label"].tolist() == ["3", "3", "1467"]
    assert query["camera"].tolist() == ["1", "2", "1"]
    assert gallery["id"].tolist() == ["0003_c1_3", "0003_c2_7", "0010_c2_10", "1467_c2_9"]
    assert gallery["label"].tolist() == ["3", "3", "10", "1467"]
    assert gallery["camera"].tolist() == ["1", "2", "2", "2"]
    for path in _resolve(out, query) + _resolve(out, gallery):
        assert path.parent.parent.name == variant  # the variant's own images
        assert np.asarray(Image.open(path))[0, 0, 0] == shade


@pytest.mark.parametrize(
    "options, message",
    [
        ({"root": "x"}, r"cuhk03-np: missing option\(s\) variant"),
        (
            {"root": "x", "variant": "manual"},
            r"cuhk03-np: option variant must be one of labeled, "
            r"detected, got 'manual'",
        ),
    ],
)
def test_cuhk03_np_option_errors(tmp_path: Path, options, message):
    with pytest.raises(RankwiseError, match=message):
        prepare_dataset("cuhk03-np", options, tmp_path / "out")


def test_cuhk03_np_bad_camera_and_missing_variant(tmp_path: Path):
    root = tmp_path / "CUHK03-NP"
    _cuhk03(root)
    _image(root / "detected" / "query" / "0004_c3_1.png")  # CUHK03 has cameras 1 and 2
    with pytest.raises(
        RankwiseError,
        match=r"'0004_c3_1\.png' does not follow the CUHK03-NP "
        r"convention PPPP_cC_N\.png \(camera C = 1 or 2\)",
    ):
        prepare_dataset("cuhk03-np", {"root": str(root), "variant": "detected"}, tmp_path / "o")
    with pytest.raises(
        RankwiseError,
        match=r"CUHK03-NP labeled folder not found; options\.root "
        r"must be the CUHK03-NP folder holding labeled/",
    ):
        prepare_dataset(
            "cuhk03-np", {"root": str(root / "detected"), "variant": "labeled"}, tmp_path / "o"
        )


def test_one_stem_in_two_formats_names_both_files(duke: Path, tmp_path: Path):
    """x.jpg and x.png are one id twice: refused at prepare (not at encode), both named."""
    root = tmp_path / "CUHK03-NP"
    _cuhk03(root)
    _image(root / "labeled" / "bounding_box_test" / "0003_c2_7.jpg")
    with pytest.raises(
        RankwiseError,
        match=r"bounding_box_test/0003_c2_7\.jpg and .*bounding_box_test/0003_c2_7\.png: "
        r"two images with the same name '0003_c2_7' \(the image id\); remove one",
    ):
        prepare_dataset("cuhk03-np", {"root": str(root), "variant": "labeled"}, tmp_path / "o")
    _image(duke / "query" / "0005_c2_f0046985.JPG")
    with pytest.raises(
        RankwiseError,
        match=r"query/0005_c2_f0046985\.JPG and .*query/0005_c2_f0046985\.jpg: two images",
    ):
        prepare_dataset("dukemtmc", {"root": str(duke)}, tmp_path / "out")


def test_a_folder_or_broken_link_named_like_an_image_is_named(duke: Path, tmp_path: Path):
    """Found at prepare time, naming the entry in the tree (not its target, not the
    generated manifest); the same rule for the identity folders' crops."""
    (duke / "query" / "0005_c2_f0000001.jpg").mkdir()
    with pytest.raises(
        RankwiseError, match=r"query/0005_c2_f0000001\.jpg: named like an image but a folder"
    ):
        prepare_dataset("dukemtmc", {"root": str(duke)}, tmp_path / "out")
    (duke / "query" / "0005_c2_f0000001.jpg").rmdir()
    (duke / "bounding_box_test" / "0005_c2_f0000002.jpg").symlink_to(tmp_path / "gone.jpg")
    with pytest.raises(
        RankwiseError,
        match=r"bounding_box_test/0005_c2_f0000002\.jpg: broken symbolic link \(to "
        r".*gone\.jpg\); point it at the image or remove it",
    ):
        prepare_dataset("dukemtmc", {"root": str(duke)}, tmp_path / "out")
    crops = tmp_path / "crops"
    _identities(crops, {"a": 2, "b": 2})
    (crops / "b" / "b_000009.jpg").symlink_to(tmp_path / "gone.jpg")
    with pytest.raises(RankwiseError, match=r"b/b_000009\.jpg: broken symbolic link"):
        identity_crops(crops)


# ---------------------------------------------------------------- identity-folders


def _identities(root: Path, counts: dict[str, int]) -> None:
    for name, n in counts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            _image(root / name / f"{name}_{i:06d}.jpg", value=i)


def _reference_split(root: Path, queries_per_id: int, min_crops: int, seed: int):
    """The reid package's RetrievalProtocol, written out: sorted folders, one shared RNG."""
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    rng = random.Random(seed)
    query, gallery = [], []
    for name in folders:
        files = sorted(p.name for p in (root / name).iterdir())
        if not files or len(files) < min_crops:
            continue
        idx = list(range(len(files)))
        rng.shuffle(idx)
        query += [f"{name}/{files[i]}" for i in idx[:queries_per_id]]
        gallery += [f"{name}/{files[i]}" for i in idx[queries_per_id:]]
    return query, gallery


def test_identity_folders_split(tmp_path: Path):
    root = tmp_path / "crops"
    counts = {"MOT17-02_1": 5, "MOT17-02_12": 1, "MOT17-04_3": 3, "person7": 2, "zz": 4}
    _identities(root, counts)
    (root / "empty").mkdir()
    out = tmp_path / "out"
    options = {"root": str(root), "queries_per_id": 1, "min_crops": 2, "seed": 3}
    summary = prepare_dataset("identity-folders", options, out)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert list(query.columns) == ["id", "label", "path"]
    # MOT17-02_12 (1 crop) and the empty folder are dropped from both sides
    assert query["label"].tolist() == ["MOT17-02_1", "MOT17-04_3", "person7", "zz"]
    assert gallery.groupby("label").size().to_dict() == {
        "MOT17-02_1": 4,
        "MOT17-04_3": 2,
        "person7": 1,
        "zz": 3,
    }
    assert (summary["query"], summary["gallery"], summary["labels"]) == (4, 10, 4)
    assert set(query["id"]).isdisjoint(gallery["id"])
    assert (query["id"].str.split("/").str[0] == query["label"]).all()
    expected = _reference_split(root, 1, 2, 3)
    assert (query["id"].tolist(), gallery["id"].tolist()) == expected
    for table in (query, gallery):
        assert [f"{p.parent.name}/{p.name}" for p in _resolve(out, table)] == table["id"].tolist()


def test_identity_folders_options_change_the_split(tmp_path: Path):
    root = tmp_path / "crops"
    _identities(root, {"a": 6, "b": 3, "c": 2})
    splits = {}
    for key, options in {
        "base": {},
        "again": {},
        "seed": {"seed": 1},
        "two": {"queries_per_id": 2, "min_crops": 3},
    }.items():
        out = tmp_path / key
        prepare_dataset("identity-folders", {"root": str(root), **options}, out)
        splits[key] = (_read(out, "query")["id"].tolist(), _read(out, "gallery")["id"].tolist())
    assert splits["base"] == splits["again"] == _reference_split(root, 1, 2, 0)
    assert splits["seed"] == _reference_split(root, 1, 2, 1) != splits["base"]
    query, gallery = splits["two"]
    assert splits["two"] == _reference_split(root, 2, 3, 0)
    assert [q.split("/")[0] for q in query] == ["a", "a", "b", "b"]  # c (2 crops) dropped
    assert len(gallery) == 4 + 1


def test_identity_folders_match_the_reid_package(tmp_path: Path):
    pytest.importorskip("reid")
    from reid.data.identity_crops import _retrieval_split, load_identity_folders

    root = tmp_path / "crops"
    _identities(root, {"0001": 7, "0002": 1, "0003": 4, "0004": 3, "0010": 2})
    for queries, min_crops, seed in ((1, 2, 0), (2, 3, 5), (1, 4, 11)):
        split = load_identity_folders(root)
        want_q, want_g = _retrieval_split(
            split, queries_per_id=queries, min_crops=min_crops, seed=seed
        )
        got_q, got_g = derived_split(
            identity_crops(root), queries_per_id=queries, min_crops=min_crops, seed=seed
        )
        assert [str(p) for _, p in got_q] == list(want_q.image_paths)
        assert [str(p) for _, p in got_g] == list(want_g.image_paths)


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"queries_per_id": 2, "min_crops": 2},
            r"identity-folders: option min_crops \(2\) must be "
            r"greater than queries_per_id \(2\)",
        ),
        (
            {"queries_per_id": 0},
            r"identity-folders: option queries_per_id must be a positive integer, "
            r"got 0",
        ),
        ({"seed": "x"}, r"identity-folders: option seed must be a non-negative integer, got 'x'"),
        (
            {"min_crops": 9},
            r"no identity has min_crops=9 crops \(the most is 3\); lower "
            r"options\.min_crops",
        ),
    ],
)
def test_identity_folders_option_errors(tmp_path: Path, options, message):
    root = tmp_path / "crops"
    _identities(root, {"a": 3, "b": 2})
    with pytest.raises(RankwiseError, match=message):
        prepare_dataset("identity-folders", {"root": str(root), **options}, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


def test_identity_folders_without_identities(tmp_path: Path):
    _image(tmp_path / "flat" / "a.jpg")  # images at the top level: no identity folder
    with pytest.raises(
        RankwiseError,
        match=r"flat: no identity folders with images; expected "
        r"<root>/<identity>/<crop>\.jpg",
    ):
        prepare_dataset("identity-folders", {"root": str(tmp_path / "flat")}, tmp_path / "out")


@pytest.mark.parametrize("spaced", ["0001 ", "\t0001"])
def test_identity_folders_refuse_folders_that_differ_only_by_spaces(tmp_path: Path, spaced):
    # a manifest's values are read without the spaces around them, so "0001 " came back
    # as "0001": the two identities were silently one label
    _identities(tmp_path / "crops", {"0001": 3, spaced: 2, "0002": 2})
    first, second = sorted(["0001", spaced])
    with pytest.raises(
        RankwiseError,
        match=rf"crops: label folders {re.escape(repr(first))} and {re.escape(repr(second))} "
        r"differ only by spaces around the name.*; rename one, or move its images into the other",
    ):
        prepare_dataset("identity-folders", {"root": str(tmp_path / "crops")}, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()
    # a folder the split drops (fewer than min_crops crops) is written nowhere: no merge
    out = tmp_path / "kept"
    prepare_dataset("identity-folders", {"root": str(tmp_path / "crops"), "min_crops": 3}, out)
    assert _read(out, "query")["label"].tolist() == ["0001"]


@pytest.mark.parametrize("name", [b"caf\xe9", b"0003"])
def test_identity_folders_name_a_crop_or_folder_that_is_not_utf8(tmp_path: Path, name: bytes):
    # an identity folder, or a crop, named in Latin-1 (a zip made on Windows): the CSV
    # writer's UnicodeEncodeError traceback, where one line naming it belongs
    _identities(tmp_path / "crops", {"0001": 3, "0002": 2})
    if name == b"0003":
        _image(tmp_path / "crops" / "0003" / os.fsdecode(b"\xe9t\xe9.jpg"))
        _image(tmp_path / "crops" / "0003" / "b.jpg")
        shown = r"crops/0003/\\xe9t\\xe9\.jpg"
    else:
        _identities(tmp_path / "crops", {os.fsdecode(name): 2})
        shown = r"crops/caf\\xe9/caf\\xe9_000000\.jpg"
    with pytest.raises(RankwiseError, match=shown + r": this path is not UTF-8 text \(byte 0xe9"):
        prepare_dataset("identity-folders", {"root": str(tmp_path / "crops")}, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


# ---------------------------------------------------------------- CLI and example configs


def test_cli_prepare_bad_tree_exits_2_and_writes_nothing(duke: Path, tmp_path: Path):
    from rankwise.cli import main

    _image(duke / "bounding_box_test" / "duke_person.jpg")
    out = tmp_path / "cli-out"
    result = CliRunner().invoke(
        main,
        [
            "prepare",
            "--loader",
            "dukemtmc",
            "--options",
            f'{{"root": "{duke}"}}',
            "--out-dir",
            str(out),
        ],
    )
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "duke_person.jpg" in lines[0] and "0005_c2_f0046985" in lines[0]
    assert not any(out.glob("*.csv"))


def test_cli_prepare_veri776(veri: Path, tmp_path: Path):
    from rankwise.cli import main

    out = tmp_path / "cli-out"
    result = CliRunner().invoke(
        main,
        [
            "prepare",
            "--loader",
            "veri776",
            "--options",
            f'{{"root": "{veri}"}}',
            "--out-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        result.output.strip() == f"prepared veri776: 2 query rows, 4 gallery rows, "
        f"3 labels -> {out}"
    )


@pytest.mark.parametrize(
    "name, loader, protocol",
    [
        ("veri776", "veri776", "reid"),
        ("cuhk03-np", "cuhk03-np", "reid"),
        ("mot17", "mot", "reassociation"),
    ],
)
def test_example_configs_validate(name: str, loader: str, protocol: str):
    from jsonschema import Draft202012Validator

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    config = yaml.safe_load((ROOT / "config" / "examples" / f"{name}.yaml").read_text())
    Draft202012Validator(schema).validate(config)
    datasets = list(config["datasets"].values())
    assert [d["loader"] for d in datasets] == [loader] * len(datasets)
    assert {d["protocol"] for d in datasets} == {protocol}


@pytest.mark.parametrize(
    "loader, options",
    [
        ("cuhk03-np", {"root": "r", "variant": "both"}),
        ("mot", {"root": "r", "frames": "train_half"}),
        ("identity-folders", {"root": "r", "min_crops": 1}),
        ("veri776", {"root": "r", "query_folder": "q"}),
    ],
)
def test_schema_rejects_bad_loader_options(loader: str, options: dict):
    from jsonschema import Draft202012Validator

    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    config = {"datasets": {"d": {"loader": loader, "options": options}}}
    assert not Draft202012Validator(schema).is_valid(config)
    config["datasets"]["d"]["options"] = {
        "root": "r",
        **({"variant": "labeled"} if loader == "cuhk03-np" else {}),
    }
    assert Draft202012Validator(schema).is_valid(config)


def test_schema_defaults_match_the_new_loaders():
    from rankwise.datasets import LOADERS

    defs = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())["$defs"]
    for loader in ("veri776", "dukemtmc", "cuhk03-np", "mot", "identity-folders"):
        props = defs["loader_" + loader.replace("-", "_")]["properties"]
        assert {k: v["default"] for k, v in props.items() if "default" in v} == LOADERS[
            loader
        ].defaults, loader
        assert set(defs["loader_" + loader.replace("-", "_")]["required"]) == set(
            LOADERS[loader].required
        ), loader
