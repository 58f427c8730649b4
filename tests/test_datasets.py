"""Dataset loaders: real trees with the real naming conventions, written to tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from PIL import Image

from rankwise.datasets import LOADERS, prepare_dataset, seeded_split
from rankwise.errors import RankwiseError


def _image(path: Path, value: int = 128) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 4, 3), value, np.uint8)).save(path)
    return path


def _read(out: Path, split: str) -> pd.DataFrame:
    return pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)


def _assert_paths_resolve(out: Path) -> None:
    for split in ("query", "gallery"):
        for p in _read(out, split)["path"]:
            assert (out / p).is_file(), f"{split}: {p} does not resolve from {out}"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------- market1501

MARKET_QUERY = ["0002_c1s1_000451_00.jpg", "0007_c3s2_012345_00.jpg"]
MARKET_GALLERY = [
    "0002_c2s1_000500_01.jpg",
    "0002_c1s1_000460_02.jpg",
    "0007_c6s4_002201_01.jpg",
    "0000_c2s1_000100_01.jpg",
    "-1_c1s1_000200_03.jpg",
    "1501_c5s3_065432_04.jpg",
]


@pytest.fixture
def market(tmp_path: Path) -> Path:
    root = tmp_path / "data" / "Market-1501-v15.09.15"
    for name in MARKET_QUERY:
        _image(root / "query" / name)
    for name in MARKET_GALLERY:
        _image(root / "bounding_box_test" / name)
    (root / "bounding_box_test" / "Thumbs.db").write_bytes(b"\0")  # shipped with Market
    _image(root / "bounding_box_train" / "0001_c1s1_000001_01.jpg")  # training: not read
    return root


def test_market1501_manifest(market: Path, tmp_path: Path):
    out = tmp_path / "results" / "manifests" / "market"
    summary = prepare_dataset("market1501", {"root": str(market)}, out)
    assert summary["query"] == 2 and summary["gallery"] == 6
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert list(query.columns) == ["id", "label", "camera", "sequence", "frame", "path"]
    assert query["label"].tolist() == ["2", "7"]
    assert query["camera"].tolist() == ["1", "3"]
    assert query["sequence"].tolist() == ["c1s1", "c3s2"]
    assert query["frame"].tolist() == ["451", "12345"]
    by_id = gallery.set_index("id")
    assert by_id.loc["-1_c1s1_000200_03", "label"] == "-1"  # junk
    assert by_id.loc["0000_c2s1_000100_01", "label"] == "0"  # distractor
    assert by_id.loc["1501_c5s3_065432_04", ["label", "camera", "sequence", "frame"]].tolist() == [
        "1501",
        "5",
        "c5s3",
        "65432",
    ]
    assert sorted(gallery["id"]) == sorted(Path(n).stem for n in MARKET_GALLERY)
    assert not any(p.startswith("/") for p in gallery["path"])  # relative to the manifest
    _assert_paths_resolve(out)


def test_market1501_bad_file_name_names_the_file(market: Path, tmp_path: Path):
    _image(market / "query" / "person7.jpg")
    with pytest.raises(RankwiseError, match=r"person7\.jpg.*PPPP_cCsS_FFFFFF_BB"):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"root": "no/such/market"}, r"no/such/market: Market-1501 root folder not found"),
        ({}, r"market1501: missing option\(s\) root"),
        (
            {"root": ".", "seed": 1},
            r"unknown option\(s\) seed; valid options: gallery_folder, "
            r"query_folder, root",
        ),
    ],
)
def test_market1501_option_errors(options, message, tmp_path: Path):
    with pytest.raises(RankwiseError, match=message):
        prepare_dataset("market1501", options, tmp_path / "out")


def test_market1501_missing_split_folder(market: Path, tmp_path: Path):
    for file in (market / "query").iterdir():
        file.unlink()
    (market / "query").rmdir()
    with pytest.raises(RankwiseError, match=r"query: Market-1501 query folder not found"):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")


def test_a_root_one_level_too_high_names_the_folder_inside(market: Path, tmp_path: Path):
    """options.root at the folder holding the dataset's folder (the extracted archive's
    parent): the message named the options to fix (MSMT17: options.images, which does not
    help); it names the folder inside that is the root."""
    with pytest.raises(
        RankwiseError,
        match=rf"query: Market-1501 query folder not found; {re.escape(str(market))} holds "
        r"query/ and bounding_box_test/: set options.root to it",
    ):
        prepare_dataset("market1501", {"root": str(market.parent)}, tmp_path / "out")
    msmt = tmp_path / "datasets/MSMT17_V1"
    _msmt17(msmt)
    with pytest.raises(
        RankwiseError,
        match=rf"no image folder test/ .* found; {re.escape(str(msmt))} holds list_query\.txt "
        r"and list_gallery\.txt: set options.root to it",
    ):
        prepare_dataset("msmt17", {"root": str(msmt.parent)}, tmp_path / "out")
    with pytest.raises(
        RankwiseError,
        match=rf"list_query\.txt: MSMT17 list file not found; {re.escape(str(msmt))} holds",
    ):
        prepare_dataset("msmt17", {"root": str(msmt.parent), "images": "."}, tmp_path / "out")


def test_market1501_one_stem_in_two_formats_names_both_files(market: Path, tmp_path: Path):
    """x.jpg and x.png would be one id twice: refused at prepare, naming both files."""
    _image(market / "bounding_box_test" / "0002_c2s1_000500_01.png")
    with pytest.raises(
        RankwiseError,
        match=r"bounding_box_test/0002_c2s1_000500_01\.jpg and .*bounding_box_test/"
        r"0002_c2s1_000500_01\.png: two images with the same name '0002_c2s1_000500_01' "
        r"\(the image id\); remove one",
    ):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")
    assert not (tmp_path / "out" / "gallery.csv").exists()


def test_market1501_names_a_folder_or_a_broken_link_named_like_an_image(
    market: Path, tmp_path: Path
):
    folder = market / "bounding_box_test" / "0009_c1s1_000001_00.jpg"
    folder.mkdir()
    with pytest.raises(
        RankwiseError, match=r"0009_c1s1_000001_00\.jpg: named like an image but a folder"
    ):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")
    folder.rmdir()
    link = market / "query" / "0009_c1s1_000001_00.jpg"
    link.symlink_to(tmp_path / "moved" / "0009_c1s1_000001_00.jpg")
    with pytest.raises(
        RankwiseError,
        match=r"query/0009_c1s1_000001_00\.jpg: broken symbolic link \(to .*moved/"
        r"0009_c1s1_000001_00\.jpg\); point it at the image or remove it",
    ):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")
    # a link to an existing image is an image
    _image(tmp_path / "moved" / "0009_c1s1_000001_00.jpg")
    assert prepare_dataset("market1501", {"root": str(market)}, tmp_path / "out")["query"] == 3


# ---------------------------------------------------------------- msmt17


def _msmt17(root: Path, images: str = "test") -> None:
    query = ["0000/0000_000_01_0303morning_0015_0.jpg 0", "0001/0001_004_12_0303noon_0871_1.jpg 1"]
    gallery = [
        "0000/0000_001_05_0303morning_0033_0.jpg 0",
        "0001/0001_000_12_0303noon_0850_0.jpg 1",
        "0001/0001_002_15_0303afternoon_1020_2.jpg 1",
        "0002/0002_000_03_0302morning_0101_0.jpg 2",
    ]
    for split, lines in (("query", query), ("gallery", gallery)):
        (root / f"list_{split}.txt").parent.mkdir(parents=True, exist_ok=True)
        (root / f"list_{split}.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            _image(root / images / line.split()[0])


def test_msmt17_manifest(tmp_path: Path):
    root = tmp_path / "MSMT17_V1"
    _msmt17(root)
    out = tmp_path / "out"
    summary = prepare_dataset("msmt17", {"root": str(root)}, out)
    assert (summary["query"], summary["gallery"]) == (2, 4)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert query["id"].tolist() == ["0000_000_01_0303morning_0015_0", "0001_004_12_0303noon_0871_1"]
    assert query["label"].tolist() == ["0", "1"]
    assert query["camera"].tolist() == ["1", "12"]
    assert gallery["camera"].tolist() == ["5", "12", "15", "3"]
    assert gallery["label"].tolist() == ["0", "1", "1", "2"]
    _assert_paths_resolve(out)


def test_msmt17_v2_layout_is_detected(tmp_path: Path):
    root = tmp_path / "MSMT17_V2"
    _msmt17(root, images="mask_test_v2")
    prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")
    _assert_paths_resolve(tmp_path / "out")


def test_msmt17_missing_image_names_list_line(tmp_path: Path):
    root = tmp_path / "MSMT17_V1"
    _msmt17(root)
    (root / "test" / "0001" / "0001_000_12_0303noon_0850_0.jpg").unlink()
    with pytest.raises(
        RankwiseError,
        match=r"list_gallery\.txt: line 2: image .*"
        r"0001_000_12_0303noon_0850_0\.jpg not found",
    ):
        prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")


def test_msmt17_list_files_in_utf8_with_bom_or_another_encoding(tmp_path: Path):
    """A Latin-1 byte gave a UnicodeDecodeError traceback (audit 2026-12-02); a byte-order
    mark (Windows editors) is read past."""
    root = tmp_path / "MSMT17_V1"
    _msmt17(root)
    listing = root / "list_gallery.txt"
    listing.write_bytes(b"\xef\xbb\xbf" + listing.read_bytes())
    summary = prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "bom")
    assert summary["gallery"] == 4
    listing.write_bytes(listing.read_bytes().replace(b"morning_0033", b"matin\xe9_0033"))
    with pytest.raises(
        RankwiseError,
        match=r"list_gallery\.txt: not a readable MSMT17 list file: line 1 is not UTF-8 text "
        r"\(byte 0xe9: .*\); save it as UTF-8$",
    ):
        prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")


def test_msmt17_bad_line(tmp_path: Path):
    root = tmp_path / "MSMT17_V1"
    _msmt17(root)
    with open(root / "list_query.txt", "a") as handle:
        handle.write("0003/0003_000_01_x.jpg\n")
    with pytest.raises(
        RankwiseError,
        match=r"list_query\.txt: line 3: expected 'pid/file\.jpg "
        r"label'",
    ):
        prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")


def test_msmt17_camera_field_int_cannot_read_is_one_line(tmp_path: Path):
    """'0²' is a digit string to str.isdigit but not to int(): a ValueError traceback
    before; a decimal digit of another script (Arabic-Indic 01) reads as int() reads it, as
    torchreid's int(img_path.split('_')[2]) does."""
    root = tmp_path / "MSMT17_V1"
    _msmt17(root)
    arabic_01, superscript = "\u0660\u0661", "0\u00b2"
    for name, camera in (
        (f"0003_000_{arabic_01}_0303noon_0001_0.jpg", "1"),
        (f"0003_000_{superscript}_x.jpg", None),
    ):
        _image(root / "test" / "0003" / name)
        (root / "list_query.txt").write_text(f"0003/{name} 3\n", encoding="utf-8")
        if camera is not None:
            prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")
            assert _read(tmp_path / "out", "query")["camera"].tolist() == [camera]
            continue
        with pytest.raises(RankwiseError, match=r"list_query\.txt: line 1: cannot read the camera"):
            prepare_dataset("msmt17", {"root": str(root)}, tmp_path / "out")


# ---------------------------------------------------------------- folder


def _folder(root: Path, counts: dict[str, int]) -> None:
    for label, n in counts.items():
        for i in range(n):
            _image(root / label / f"img{i:02d}.png", value=i)


def test_folder_split_dirs(tmp_path: Path):
    _folder(tmp_path / "q", {"cat": 1, "dog": 2})
    _folder(tmp_path / "g", {"cat": 3, "dog": 2, "eel": 1})
    (tmp_path / "g" / "cat" / "notes.txt").write_text("not an image")
    out = tmp_path / "out"
    prepare_dataset(
        "folder", {"query_dir": str(tmp_path / "q"), "gallery_dir": str(tmp_path / "g")}, out
    )
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert query["label"].tolist() == ["cat", "dog", "dog"]
    assert gallery["label"].tolist() == ["cat"] * 3 + ["dog"] * 2 + ["eel"]
    # different folders: the same relative name is a different item
    assert set(query["id"]).isdisjoint(gallery["id"])
    _assert_paths_resolve(out)


def test_folder_same_dir_shares_ids(tmp_path: Path):
    _folder(tmp_path / "all", {"a": 2, "b": 2})
    out = tmp_path / "out"
    options = {"query_dir": str(tmp_path / "all"), "gallery_dir": str(tmp_path / "all")}
    prepare_dataset("folder", options, out)
    assert _read(out, "query")["id"].tolist() == _read(out, "gallery")["id"].tolist()


def test_folder_follows_linked_sub_folders_like_the_fingerprint(tmp_path: Path):
    """A linked sub-folder inside a label folder counts (as a linked label folder does,
    and as the pipeline's fingerprint does); a link back up (a loop) is walked once."""
    from rankwise.pipeline_config import dataset_fingerprints

    _folder(tmp_path / "q", {"cat": 1})
    _folder(tmp_path / "g", {"cat": 1, "dog": 1})
    _image(tmp_path / "elsewhere" / "a.jpg")
    _image(tmp_path / "elsewhere" / "b.jpg")
    (tmp_path / "g" / "cat" / "more").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "g" / "cat" / "loop").symlink_to(tmp_path / "g" / "cat")
    (tmp_path / "g" / "dog" / "sub").mkdir()
    (tmp_path / "g" / "dog" / "sub" / "up").symlink_to(tmp_path / "g" / "dog")  # a loop too
    options = {"query_dir": str(tmp_path / "q"), "gallery_dir": str(tmp_path / "g")}
    out = tmp_path / "out"
    prepare_dataset("folder", options, out)
    gallery = _read(out, "gallery")
    assert gallery["id"].tolist() == [
        "gallery/cat/img00.png",
        "gallery/cat/more/a.jpg",
        "gallery/cat/more/b.jpg",
        "gallery/dog/img00.png",
    ]
    assert gallery["label"].tolist() == ["cat"] * 3 + ["dog"]
    _assert_paths_resolve(out)
    before = dataset_fingerprints("folder", options)["gallery"]
    _image(tmp_path / "elsewhere" / "c.jpg")
    assert dataset_fingerprints("folder", options)["gallery"] != before
    prepare_dataset("folder", options, out)
    assert "gallery/cat/more/c.jpg" in _read(out, "gallery")["id"].tolist()


def test_folder_names_a_broken_link_named_like_an_image(tmp_path: Path):
    _folder(tmp_path / "q", {"cat": 1})
    _folder(tmp_path / "g", {"cat": 2})
    (tmp_path / "g" / "cat" / "sub").mkdir()
    (tmp_path / "g" / "cat" / "sub" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "g" / "cat" / "notes.txt").symlink_to(tmp_path / "nowhere.txt")  # not an image
    options = {"query_dir": str(tmp_path / "q"), "gallery_dir": str(tmp_path / "g")}
    with pytest.raises(RankwiseError, match=r"cat/sub/gone\.jpg: broken symbolic link"):
        prepare_dataset("folder", options, tmp_path / "out")


LATIN1 = os.fsdecode(b"caf\xe9")  # "cafe" with an e-acute in Latin-1: not UTF-8


def _one_folder_options(folder: Path, layout: str) -> dict[str, str]:
    """The folder loader's options over one folder: as ``root``, or as both splits."""
    if layout == "root":
        return {"root": str(folder)}
    return {"query_dir": str(folder), "gallery_dir": str(folder)}


@pytest.mark.parametrize("layout", ["root", "split dirs"])
def test_folder_names_a_label_folder_that_is_not_utf8(tmp_path: Path, layout: str):
    # a zip made on Windows unpacks "cafe" in Latin-1: a UnicodeEncodeError traceback (the
    # seeded split's label hash, or the CSV writer), where one line naming it belongs
    _folder(tmp_path / "all", {LATIN1: 2, "tea": 2})
    options = _one_folder_options(tmp_path / "all", layout)
    with pytest.raises(
        RankwiseError,
        match=r"all/caf\\xe9/img00\.png: this path is not UTF-8 text \(byte 0xe9: named in "
        r"another encoding, e\.g\. Latin-1 or Windows-1252, .*; rename it in UTF-8",
    ):
        prepare_dataset("folder", options, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


@pytest.mark.parametrize("layout", ["root", "split dirs"])
def test_folder_refuses_label_folders_that_differ_only_by_spaces(tmp_path: Path, layout: str):
    # a manifest's values are read without the spaces around them, so "cat " came back
    # as "cat": the two folders were silently one label
    _folder(tmp_path / "all", {"cat": 2, "cat ": 2, "dog": 2})
    options = _one_folder_options(tmp_path / "all", layout)
    with pytest.raises(
        RankwiseError,
        match=r"all: label folders 'cat' and 'cat ' differ only by spaces around the name.*; "
        r"rename one, or move its images into the other",
    ):
        prepare_dataset("folder", options, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


def test_folder_label_with_a_leading_space_beside_its_manifests(tmp_path: Path):
    # manifests written into the image folder itself: the path ' dog/i0.png' was read
    # back as 'dog/i0.png' (a manifest's values lose the spaces around them), and the
    # encode failed on a missing file; the label reads as 'dog', like any manifest's
    from rankwise.manifest import read_manifest

    _folder(tmp_path / "all", {" dog": 2, "cat": 2})
    prepare_dataset("folder", {"root": str(tmp_path / "all")}, tmp_path / "all")
    for split in ("query", "gallery"):
        frame = read_manifest(tmp_path / "all" / f"{split}.csv").to_frame()
        assert set(frame["label"]) == {"dog", "cat"}
        for path in frame["path"]:
            assert (tmp_path / "all" / path).is_file(), path
        assert "./ dog/" in (tmp_path / "all" / f"{split}.csv").read_text()


def test_cli_prepare_names_label_folders_that_differ_only_by_spaces(tmp_path: Path):
    from rankwise.cli import main

    _folder(tmp_path / "all", {"\tcat": 2, "cat": 2})
    options = json.dumps({"root": str(tmp_path / "all")})
    result = CliRunner().invoke(
        main, ["prepare", "--loader", "folder", "--options", options, "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {tmp_path}/all: label folders '\\tcat' and 'cat' differ only by spaces "
        "around the name, and a manifest's labels do not keep those, so they would be one "
        "label; rename one, or move its images into the other"
    ]


def test_market1501_under_a_folder_that_is_not_utf8(market: Path, tmp_path: Path):
    # the manifests' paths are relative to them: beside the tree under that folder they
    # need none of its name, and are written; from elsewhere they would, and are refused
    root = market.rename(tmp_path / LATIN1)
    out = root / "manifests"
    prepare_dataset("market1501", {"root": str(root)}, out)
    _assert_paths_resolve(out)
    with pytest.raises(RankwiseError, match=r"caf\\xe9/query/0002_c1s1_000451_00\.jpg: this path "):
        prepare_dataset("market1501", {"root": str(root)}, tmp_path / "out")


def test_cli_prepare_names_a_file_that_is_not_utf8(tmp_path: Path):
    from rankwise.cli import main

    _folder(tmp_path / "all", {"tea": 2})
    _image(tmp_path / "all" / "tea" / os.fsdecode(b"th\xe9.png"))
    options = json.dumps({"root": str(tmp_path / "all")})
    result = CliRunner().invoke(
        main, ["prepare", "--loader", "folder", "--options", options, "--out-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {tmp_path}/all/tea/th\\xe9.png: this path is not UTF-8 text (byte 0xe9: named "
        "in another encoding, e.g. Latin-1 or Windows-1252, as zip archives made on Windows "
        "unpack), so no UTF-8 manifest can hold it; rename it in UTF-8, e.g. convmv -f latin1 "
        "-t utf8 -r --notest <folder>"
    ]


def test_folder_seeded_split(tmp_path: Path):
    counts = {"a": 10, "b": 5, "c": 2, "d": 1}
    _folder(tmp_path / "all", counts)
    tables = {}
    for seed in (0, 0, 1):
        out = tmp_path / f"out{len(tables)}"
        prepare_dataset(
            "folder", {"root": str(tmp_path / "all"), "query_fraction": 0.3, "seed": seed}, out
        )
        tables[len(tables)] = (_read(out, "query"), _read(out, "gallery"))
        _assert_paths_resolve(out)
    query, gallery = tables[0]
    assert query.groupby("label").size().to_dict() == {"a": 3, "b": 2, "c": 1}  # d: singleton
    assert gallery.groupby("label").size().to_dict() == {"a": 7, "b": 3, "c": 1, "d": 1}
    assert set(query["id"]).isdisjoint(gallery["id"])
    assert query.equals(tables[1][0])  # same seed, same split
    assert not query["id"].equals(tables[2][0]["id"])  # another seed, another split


def test_seeded_split_is_stable_per_label():
    labels = ["a"] * 6 + ["b"] * 6
    mask = seeded_split(labels, 0.5, seed=3)
    mask_with_c = seeded_split(labels + ["c"] * 4, 0.5, seed=3)
    assert (mask == mask_with_c[:12]).all()  # adding a label leaves the others alone


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, r"folder: missing option root"),
        ({"root": "nope"}, r"nope: image folder not found"),
        ({"query_dir": "q"}, r"query_dir and gallery_dir go together"),
        ({"root": "x", "query_dir": "q", "gallery_dir": "g"}, r"not both"),
    ],
)
def test_folder_option_errors(options, message, tmp_path: Path):
    with pytest.raises(RankwiseError, match=message):
        prepare_dataset("folder", options, tmp_path / "out")


def test_folder_fraction_must_be_a_fraction(tmp_path: Path):
    _folder(tmp_path / "all", {"a": 2})
    with pytest.raises(RankwiseError, match=r"query_fraction must be between 0 and 1"):
        prepare_dataset(
            "folder", {"root": str(tmp_path / "all"), "query_fraction": 1.5}, tmp_path / "out"
        )


# ---------------------------------------------------------------- manifest


def test_manifest_loader_rewrites_paths(tmp_path: Path):
    src = tmp_path / "mine"
    _image(src / "img" / "q0.png")
    _image(src / "img" / "g0.png")
    absolute = _image(tmp_path / "elsewhere" / "g1.png")
    pd.DataFrame(
        {"id": ["q0"], "label": ["007"], "path": ["img/q0.png"], "extra": ["kept"]}
    ).to_csv(src / "q.csv", index=False)
    pd.DataFrame(
        {"id": ["g0", "g1"], "label": ["007", "NA"], "path": ["img/g0.png", str(absolute)]}
    ).to_csv(src / "g.csv", index=False)
    out = tmp_path / "results" / "manifests" / "mine"
    prepare_dataset("manifest", {"query": str(src / "q.csv"), "gallery": str(src / "g.csv")}, out)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert query["label"].tolist() == ["007"]  # labels are strings, as written
    assert gallery["label"].tolist() == ["007", "NA"]
    assert query["extra"].tolist() == ["kept"]
    assert gallery["path"].iloc[1] == str(absolute)  # absolute paths stay absolute
    assert (out / query["path"].iloc[0]).resolve() == (src / "img" / "q0.png").resolve()
    _assert_paths_resolve(out)


def test_manifest_loader_validates(tmp_path: Path):
    pd.DataFrame({"id": ["a", "a"], "label": ["1", "2"]}).to_csv(tmp_path / "q.csv", index=False)
    pd.DataFrame({"id": ["b"], "label": ["1"]}).to_csv(tmp_path / "g.csv", index=False)
    options = {"query": str(tmp_path / "q.csv"), "gallery": str(tmp_path / "g.csv")}
    with pytest.raises(RankwiseError, match=r"q\.csv: duplicate id 'a'"):
        prepare_dataset("manifest", options, tmp_path / "out")
    with pytest.raises(RankwiseError, match=r"missing column\(s\) camera"):
        prepare_dataset("manifest", {**options, "protocol": "reid"}, tmp_path / "out")
    with pytest.raises(RankwiseError, match=r"nope\.csv: query manifest not found"):
        prepare_dataset("manifest", {**options, "query": "nope.csv"}, tmp_path / "out")
    assert not (tmp_path / "out" / "query.csv").exists()


def test_unknown_loader_lists_valid_ones(tmp_path: Path):
    with pytest.raises(
        RankwiseError,
        match=r"unknown loader 'market'; valid loaders: "
        r"market1501, msmt17, folder, manifest, digits",
    ):
        prepare_dataset("market", {}, tmp_path)


# ---------------------------------------------------------------- demos


def _demo(tmp_path: Path, loader: str, name: str, **options) -> Path:
    out = tmp_path / name
    prepare_dataset(loader, options, out)
    _assert_paths_resolve(out)
    assert not (out / "images.tmp").exists()
    return out


def _same_outputs(a: Path, b: Path) -> bool:
    for split in ("query", "gallery"):
        if (a / f"{split}.csv").read_bytes() != (b / f"{split}.csv").read_bytes():
            return False
        table = _read(a, split)
        for p in table["path"].iloc[:: max(1, len(table) // 7)]:
            if _digest(a / p) != _digest(b / p):
                return False
    return True


SMALL = {
    "demo-market": {
        "identities": 6,
        "cameras": 3,
        "images_per_camera": 2,
        "distractors": 3,
        "junk": 2,
    },
    "demo-reassociation": {"sequences": 2, "frames": 4, "people": 3},
    "demo-progressive": {"targets": 12, "sketches": 5, "steps": 5},
}


@pytest.mark.parametrize("loader", sorted(SMALL))
def test_demo_is_deterministic(loader: str, tmp_path: Path):
    a = _demo(tmp_path, loader, "a", seed=4, **SMALL[loader])
    b = _demo(tmp_path, loader, "b", seed=4, **SMALL[loader])
    c = _demo(tmp_path, loader, "c", seed=5, **SMALL[loader])
    assert _same_outputs(a, b)
    assert not _same_outputs(a, c)


def test_demo_market_follows_market1501(tmp_path: Path):
    out = _demo(tmp_path, "demo-market", "m", **SMALL["demo-market"])
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert {"-1", "0"} <= set(gallery["label"])
    assert (gallery["label"] == "-1").sum() == 2 and (gallery["label"] == "0").sum() == 3
    people = set(gallery["label"]) - {"-1", "0"}
    assert len(people) == 6 and set(query["label"]) <= people
    for row in query.itertuples():  # every query has a match in another camera
        other = gallery[(gallery["label"] == row.label) & (gallery["camera"] != row.camera)]
        assert len(other) > 0
    assert all(p.startswith("images/Market-1501-demo/") for p in gallery["path"])
    assert query["id"].str.fullmatch(r"\d{4}_c\d+s\d+_\d{6}_00").all()
    # re-preparing into the same folder replaces the images
    prepare_dataset("demo-market", {**SMALL["demo-market"], "identities": 3}, out)
    files = list((out / "images").rglob("*.jpg"))
    assert len(files) == len(_read(out, "query")) + len(_read(out, "gallery"))


def test_demo_reassociation_tracks(tmp_path: Path):
    out = _demo(tmp_path, "demo-reassociation", "r", **SMALL["demo-reassociation"])
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert query.equals(gallery)
    assert set(query["sequence"]) == {"seq01", "seq02"}
    assert not query.duplicated(["sequence", "frame", "label"]).any()
    assert query.groupby("label")["sequence"].nunique().max() == 1  # a person stays in one
    assert set(query["frame"].astype(int)) <= set(range(1, 5))


def test_demo_progressive_steps(tmp_path: Path):
    out = _demo(tmp_path, "demo-progressive", "p", **SMALL["demo-progressive"])
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert len(gallery) == 12 and gallery["label"].is_unique
    assert len(query) == 25 and query["sketch"].nunique() == 5
    for _, rows in query.groupby("sketch"):
        assert rows["step"].astype(int).tolist() == [1, 2, 3, 4, 5]
        assert rows["label"].nunique() == 1 and rows["label"].iloc[0] in set(gallery["label"])
        ink = [int((np.asarray(Image.open(out / p)) > 0).sum()) for p in rows["path"]]
        assert ink == sorted(ink) and ink[0] < ink[-1]  # revealed progressively


def test_digits_demo(tmp_path: Path):
    out = _demo(tmp_path, "digits", "d", seed=0, query_fraction=0.25)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert len(query) + len(gallery) == 1797
    assert set(query["label"]) == set(gallery["label"]) == {str(d) for d in range(10)}
    assert abs(len(query) / 1797 - 0.25) < 0.01
    assert Image.open(out / query["path"].iloc[0]).size == (32, 32)


def test_demo_option_errors(tmp_path: Path):
    with pytest.raises(RankwiseError, match=r"demo-market: unknown option\(s\) people; valid "):
        prepare_dataset("demo-market", {"people": 3}, tmp_path / "x")
    with pytest.raises(RankwiseError, match=r"sketches \(9\) must be at most targets \(4\)"):
        prepare_dataset("demo-progressive", {"targets": 4, "sketches": 9}, tmp_path / "x")
    assert not (tmp_path / "x" / "images.tmp").exists()


def test_loaders_are_all_documented():
    import rankwise.datasets as datasets

    for name in LOADERS:
        assert f"``{name}``" in datasets.__doc__


# ---------------------------------------------------------------- command line


def test_cli_prepare(market: Path, tmp_path: Path):
    from rankwise.cli import main

    out = tmp_path / "cli-out"
    result = CliRunner().invoke(
        main,
        [
            "prepare",
            "--loader",
            "market1501",
            "--options",
            f'{{"root": "{market}"}}',
            "--out-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"prepared market1501: 2 query rows, 6 gallery rows, 5 labels -> {out}"
    )
    assert (out / "query.csv").is_file() and (out / "gallery.csv").is_file()


@pytest.mark.parametrize("split", ["query", "gallery"])
def test_cli_prepare_one_split_writes_that_manifest_alone(market: Path, tmp_path: Path, split):
    """The pipeline's per-split job: the same bytes as a two-split run's file, and the
    other split's manifest neither written nor touched."""
    from rankwise.cli import main

    both = tmp_path / "both"
    prepare_dataset("market1501", {"root": str(market)}, both)
    out = tmp_path / "one"
    args = ["prepare", "--loader", "market1501", "--options", json.dumps({"root": str(market)})]
    result = CliRunner().invoke(main, [*args, "--out-dir", str(out), "--split", split])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"prepared market1501: 2 query rows, 6 gallery rows, 5 labels -> {out} "
        f"({split}.csv written)"
    )
    assert sorted(p.name for p in out.iterdir()) == [f"{split}.csv"]
    # the paths are relative to the folder: the same folder depth, the same bytes
    assert (out / f"{split}.csv").read_bytes() == (both / f"{split}.csv").read_bytes()


def test_prepare_one_split_still_checks_the_other(market: Path, tmp_path: Path):
    # a bad gallery file name fails the query's job too: no split is written from a
    # dataset that does not load
    _image(market / "bounding_box_test" / "not-market.jpg")
    with pytest.raises(RankwiseError, match=r"not-market\.jpg: file name does not follow"):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "o", ("query",))
    assert not (tmp_path / "o" / "query.csv").exists()


@pytest.mark.parametrize("loader", ["demo-market", "mot"])
def test_one_split_is_refused_where_both_manifests_name_the_files_written(tmp_path, loader):
    # demo images and mot crops are rewritten for the new options: the other split's
    # manifest, left as it was, named files that no longer existed (found by review)
    from rankwise.cli import main

    args = ["prepare", "--loader", loader, "--out-dir", str(tmp_path / "o"), "--split", "query"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [
        f"error: {loader}: writes both manifests at once (both name the files it writes, "
        "images or crops); give both splits (rankwise prepare: leave out --split)"
    ]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("splits", [(), ("train",)])
def test_prepare_refuses_unknown_or_no_splits(market: Path, tmp_path: Path, splits):
    with pytest.raises(RankwiseError, match=r"give one or both of query, gallery"):
        prepare_dataset("market1501", {"root": str(market)}, tmp_path / "o", splits)


@pytest.mark.parametrize(
    "loader, options, apart",
    [
        ("manifest", {"query": "q.csv", "gallery": "g.csv"}, True),
        ("market1501", {"root": "m"}, True),
        ("msmt17", {"root": "m"}, True),
        ("folder", {"query_dir": "q", "gallery_dir": "g"}, True),
        ("folder", {"root": "all"}, False),  # one tree, a seeded split
        ("veri776", {"root": "v"}, False),
        ("mot", {"root": "m"}, False),  # writes crops both splits share
        ("demo-market", {}, False),  # generated images both splits share
    ],
)
def test_splits_apart_where_each_split_has_its_own_data(loader, options, apart):
    from rankwise.pipeline_config import splits_apart

    assert splits_apart(loader, options) is apart


@pytest.mark.parametrize(
    "args, message",
    [
        (["--loader", "nope"], "error: unknown loader 'nope'; valid loaders:"),
        (["--loader", "folder", "--options", "{root"], "error: --options: not valid JSON"),
        (["--loader", "folder", "--options", "[1]"], "error: --options: expected a JSON object"),
    ],
)
def test_cli_prepare_errors(args, message, tmp_path: Path):
    from rankwise.cli import main

    result = CliRunner().invoke(main, ["prepare", *args, "--out-dir", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert message in result.output
