"""The ``mot`` loader: MOTChallenge trees -> crops and re-association manifests.

A small MOT17-like tree (three detector variants of MOT17-02 sharing one ground truth, and
MOT17-04) with hand-chosen boxes: partly outside the image, fractional, ignored (conf 0),
other classes, low visibility, both frame halves.  Every kept row, label, frame and crop
size is written out by hand below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from helpers import png_file, png_scanlines
from PIL import Image

from rankwise.datasets import prepare_dataset
from rankwise.errors import RankwiseError

# MOT17-02: 40 x 30 frames, seqLength 6 -> first half = frames 1..4 (6 // 2 + 1).
GT_02 = [
    "1,1,2,3,10,12,1,1,1",  # x 2..12, y 3..15            -> 10 x 12
    "1,2,-5,20,10,15,1,1,0.5",  # clipped: x 0..5, y 20..30   -> 5 x 10
    "2,1,3,3,10,12,0,1,1",  # conf 0: ignored
    "2,3,30,0,20,8,1,7,1",  # class 7 (static person): only with classes null
    "3,1,35.6,10.4,10,10,1,1,0.2",  # round: x 36..40 (clipped), y 10..20 -> 4 x 10
    "5,1,0,0,8,8,1,1,1",  # second half                 -> 8 x 8
    "6,2,20.5,0.5,3,3,1,1,1",  # round half to even: x 20..24, y 0..4 -> 4 x 4
    "4,2,10,10,6,2,1,1,0.9",  #                               -> 6 x 2
]
# MOT17-04: 20 x 20 PNG frames (lossless: crop pixels are checked), seqLength 3 -> 1..2.
GT_04 = [
    "1,1,0,0,20,20,1,1,1",  # the whole frame             -> 20 x 20
    "3,1,5,5,5,5,1,1,1",  #                               -> 5 x 5
    "3,5,1,1,4,6,1,1,1",  #                               -> 4 x 6
]
# (label, frame, width, height) of every kept crop with the default options, in row order
EXPECTED = [
    ("MOT17-02_1", 1, 10, 12),
    ("MOT17-02_2", 1, 5, 10),
    ("MOT17-02_1", 3, 4, 10),
    ("MOT17-02_2", 4, 6, 2),
    ("MOT17-02_1", 5, 8, 8),
    ("MOT17-02_2", 6, 4, 4),
    ("MOT17-04_1", 1, 20, 20),
    ("MOT17-04_1", 3, 5, 5),
    ("MOT17-04_5", 3, 4, 6),
]


def _frame(width: int, height: int, frame: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    return np.stack(
        [(x * 7 + y * 3 + frame * 11 + c * 50) % 256 for c in range(3)], axis=-1
    ).astype(np.uint8)


def _sequence(
    split_dir: Path,
    name: str,
    gt: list[str],
    width: int,
    height: int,
    length: int,
    ext: str = ".jpg",
) -> Path:
    folder = split_dir / name
    (folder / "img1").mkdir(parents=True)
    (folder / "gt").mkdir()
    (folder / "seqinfo.ini").write_text(
        f"[Sequence]\nname={name}\nimDir=img1\nframeRate=30\nseqLength={length}\n"
        f"imWidth={width}\nimHeight={height}\nimExt={ext}\n"
    )
    for frame in range(1, length + 1):
        Image.fromarray(_frame(width, height, frame)).save(folder / "img1" / f"{frame:06d}{ext}")
    (folder / "gt" / "gt.txt").write_text("\n".join(gt) + "\n")
    return folder


@pytest.fixture
def mot(tmp_path: Path) -> Path:
    root = tmp_path / "MOT17"
    for detector in ("DPM", "FRCNN", "SDP"):
        _sequence(root / "train", f"MOT17-02-{detector}", GT_02, 40, 30, 6)
    _sequence(root / "train", "MOT17-04-FRCNN", GT_04, 20, 20, 3, ext=".png")
    return root


def _read(out: Path, split: str) -> pd.DataFrame:
    return pd.read_csv(out / f"{split}.csv", dtype=str, keep_default_na=False)


def _rows(out: Path) -> list[tuple[str, int, int, int]]:
    """(label, frame, crop width, crop height) per manifest row; query must equal gallery."""
    query, gallery = _read(out, "query"), _read(out, "gallery")
    assert query.equals(gallery)  # the same crops, the same ids
    rows = []
    for row in query.itertuples():
        with Image.open(out / row.path) as image:
            rows.append((row.label, int(row.frame), *image.size))
    return rows


def _empty(folder: Path) -> bool:
    """Nothing written: the folder is absent or empty."""
    return not folder.exists() or not any(folder.iterdir())


def _prepare(mot: Path, out: Path, **options) -> dict:
    return prepare_dataset("mot", {"root": str(mot), **options}, out)


def test_mot_manifest_and_crops(mot: Path, tmp_path: Path):
    out = tmp_path / "out"
    summary = _prepare(mot, out)
    assert (summary["query"], summary["gallery"], summary["labels"]) == (9, 9, 4)
    query = _read(out, "query")
    assert list(query.columns) == ["id", "label", "sequence", "frame", "path"]
    assert _rows(out) == EXPECTED  # MOT17-02's three detector variants counted once
    assert query["sequence"].tolist() == ["MOT17-02"] * 6 + ["MOT17-04"] * 3
    assert query["id"].tolist()[:2] == ["MOT17-02_1_000001", "MOT17-02_2_000001"]
    assert query["id"].is_unique
    # the reid package's identity-folder layout: crops/<seq>_<track>/<seq>_<frame>.<ext>
    assert query["path"].tolist()[0] == "crops/MOT17-02_1/MOT17-02_000001.jpg"
    assert query["path"].tolist()[-1] == "crops/MOT17-04_5/MOT17-04_000003.png"
    assert sorted(p.relative_to(out).as_posix() for p in (out / "crops").rglob("*.*")) == sorted(
        query["path"]
    )
    assert not (out / "crops.tmp").exists()


def test_mot_crops_are_the_clipped_box_pixels(mot: Path, tmp_path: Path):
    out = tmp_path / "out"
    _prepare(mot, out, sequences=["MOT17-04"])
    query = _read(out, "query")
    boxes = {
        "MOT17-04_1_000001": (0, 0, 20, 20),
        "MOT17-04_1_000003": (5, 5, 10, 10),
        "MOT17-04_5_000003": (1, 1, 5, 7),
    }  # x1, y1, x2, y2
    assert sorted(query["id"]) == sorted(boxes)
    for row in query.itertuples():
        x1, y1, x2, y2 = boxes[row.id]
        expected = _frame(20, 20, int(row.frame))[y1:y2, x1:x2]
        assert np.array_equal(np.asarray(Image.open(out / row.path)), expected)


@pytest.mark.parametrize(
    "options, kept",
    [
        ({"frames": "first-half"}, [0, 1, 2, 3, 6]),  # MOT17-02 1..4, MOT17-04 1..2
        ({"frames": "second-half"}, [4, 5, 7, 8]),
        ({"min_visibility": 0.5}, [0, 1, 3, 4, 5, 6, 7, 8]),  # 0.2 dropped, 0.5 kept (>=)
        ({"min_size": 5}, [0, 1, 4, 6, 7]),  # shorter side after clipping
        ({"sequences": ["MOT17-02-SDP", "MOT17-02-DPM"]}, [0, 1, 2, 3, 4, 5]),
        ({"sequences": ["MOT17-04"]}, [6, 7, 8]),  # base names work too
    ],
)
def test_mot_filters(mot: Path, tmp_path: Path, options: dict, kept: list[int]):
    out = tmp_path / "out"
    _prepare(mot, out, **options)
    assert _rows(out) == [EXPECTED[i] for i in kept]


def test_mot_all_classes(mot: Path, tmp_path: Path):
    out = tmp_path / "out"
    _prepare(mot, out, classes=None)
    rows = _rows(out)
    assert ("MOT17-02_3", 2, 10, 8) in rows  # class 7, clipped at x = 40
    assert len(rows) == len(EXPECTED) + 1
    assert ("MOT17-02_1", 2, 10, 12) not in rows  # conf 0 stays ignored


def test_mot_manifest_is_a_reassociation_manifest(mot: Path, tmp_path: Path):
    from rankwise.manifest import read_manifest

    out = tmp_path / "out"
    _prepare(mot, out)
    table = read_manifest(out / "query.csv", protocol="reassociation", role="query")
    assert table["frame"].astype(int).tolist() == [e[1] for e in EXPECTED]


def test_mot_matches_the_reid_package_crops(tmp_path: Path):
    pytest.importorskip("cv2")
    pytest.importorskip("reid")
    from reid.data.mot import generate_mot_patches

    root = tmp_path / "MOT17"
    for detector in ("DPM", "FRCNN"):
        _sequence(root / "train", f"MOT17-02-{detector}", GT_02, 40, 30, 6)
    _sequence(root / "train", "MOT17-05-SDP", GT_04, 20, 20, 3)
    for ours, theirs in (
        ("all", "full"),
        ("first-half", "train_half"),
        ("second-half", "val_half"),
    ):
        for extra in ({}, {"min_visibility": 0.5, "min_size": 5}):
            out = tmp_path / f"ours-{ours}-{len(extra)}"
            _prepare(root, out, frames=ours, **extra)
            crops = tmp_path / f"reid-{theirs}-{len(extra)}"
            generate_mot_patches(
                root / "train",
                crops,
                split=theirs,
                class_ids=[1],
                min_visibility=extra.get("min_visibility", 0.0),
                min_side=extra.get("min_size", 0),
            )
            want = {
                p.relative_to(crops).as_posix(): Image.open(p).size for p in crops.rglob("*.jpg")
            }
            got = {
                p.relative_to(out / "crops").as_posix(): Image.open(p).size
                for p in (out / "crops").rglob("*.jpg")
            }
            assert got == want, (ours, extra)


# ---------------------------------------------------------------- bad input


def _append_gt(mot: Path, line: str, sequences=("DPM", "FRCNN", "SDP")) -> None:
    for detector in sequences:
        with open(mot / "train" / f"MOT17-02-{detector}" / "gt" / "gt.txt", "a") as handle:
            handle.write(line + "\n")


GT = r"MOT17-02-DPM/gt/gt\.txt: line 9: "


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "1.5,1,2,3,10,12,1,1,1",
            GT + r"frame must be an integer, found '1\.5'; expected lines "
            r"such as '1,1,912,484,97,109,1,1,1'",
        ),
        ("x,1,2,3,10,12,1,1,1", GT + r"frame must be an integer, found 'x'"),
        ("2,4.2,2,3,10,12,1,1,1", GT + r"id must be an integer, found '4\.2'"),
        ("2,4,2,3,ten,12,1,1,1", GT + r"box must be a finite number, found 'ten'"),
        # nan/inf: a traceback from round() before (audit 2026-12-02)
        ("2,4,2,3,nan,12,1,1,1", GT + r"box must be a finite number, found 'nan'"),
        ("2,4,2,3,10,inf,1,1,1", GT + r"box must be a finite number, found 'inf'"),
        # a nan conf passed the conf > 0 filter silently
        ("2,4,2,3,10,12,nan,1,1", GT + r"conf must be a finite number, found 'nan'"),
        (
            "2,4,50,5,5,5,1,1,1",
            GT + r"box \(left 50, top 5, width 5, height 5\) has no pixel "
            r"inside the 40x30 image",
        ),
        ("2,4,-9,5,5,5,1,1,1", GT + r"box \(left -9, .*\) has no pixel inside the 40x30 image"),
        ("2,4,5,5,5,0,1,1,1", GT + r"box \(left 5, .*height 0\) has no pixel inside"),
        ("7,1,2,3,10,12,1,1,1", GT + r"frame 7 is outside 1\.\.6 \(seqLength in .*seqinfo\.ini\)"),
        ("2,1,2,3,10,12,1", GT + r"7 fields, 8 needed"),
        ("1,1,5,5,5,5,1,1,1", GT + r"track 1 already has a box in frame 1 \(line 1\)"),
    ],
)
def test_mot_bad_gt_line(mot: Path, tmp_path: Path, line: str, message: str):
    out = tmp_path / "out"
    _append_gt(mot, line)
    with pytest.raises(RankwiseError, match=message) as info:
        _prepare(mot, out)
    assert "\n" not in str(info.value)
    assert _empty(out)  # no crops, no crops.tmp, no manifest


def test_mot_conf0_and_filtered_rows_are_not_checked_for_boxes(mot: Path, tmp_path: Path):
    # an ignored row may lie anywhere; its frame must still be an integer in range
    _append_gt(mot, "2,9,500,500,5,5,0,1,1")
    _append_gt(mot, "2,8,500,500,5,5,1,12,1")
    _prepare(mot, tmp_path / "out")
    assert _rows(tmp_path / "out") == EXPECTED


def test_mot_visibility_needs_its_column(mot: Path, tmp_path: Path):
    _append_gt(mot, "2,4,5,5,5,5,1,1")
    _prepare(mot, tmp_path / "ok")  # 8 fields are enough without min_visibility
    with pytest.raises(
        RankwiseError,
        match=GT + r"8 fields, 9 needed \(class for "
        r"options\.classes, visibility for "
        r"options\.min_visibility\)",
    ):
        _prepare(mot, tmp_path / "out", min_visibility=0.3)


def test_mot_nan_visibility_is_refused_not_cropped(mot: Path, tmp_path: Path):
    """nan < min_visibility is False: a nan visibility passed the filter and was cropped."""
    _append_gt(mot, "2,4,5,5,5,5,1,1,nan")
    with pytest.raises(RankwiseError, match=GT + r"visibility must be a finite number"):
        _prepare(mot, tmp_path / "out", min_visibility=0.3)
    assert _empty(tmp_path / "out")


def test_mot_files_that_are_not_utf8_are_one_line(mot: Path, tmp_path: Path):
    """gt.txt and seqinfo.ini in another encoding: UnicodeDecodeError tracebacks before."""
    for detector in ("DPM", "FRCNN", "SDP"):  # the variants share one ground truth
        gt = mot / "train" / f"MOT17-02-{detector}" / "gt" / "gt.txt"
        gt.write_bytes(gt.read_bytes() + b"# caf\xe9\n")
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-02-DPM/gt/gt\.txt: not a readable MOT ground truth: line 9 is not UTF-8 "
        r"text \(byte 0xe9: .*\); save it as UTF-8$",
    ):
        _prepare(mot, tmp_path / "out")
    ini = mot / "train" / "MOT17-04-FRCNN" / "seqinfo.ini"
    ini.write_bytes(ini.read_bytes().replace(b"[Sequence]", b"[Sequence]\n; \xff"))
    with pytest.raises(RankwiseError, match=r"seqinfo\.ini: not a readable seqinfo\.ini: line 2"):
        _prepare(mot, tmp_path / "out")


def test_mot_tree_errors(mot: Path, tmp_path: Path):
    seq = mot / "train" / "MOT17-04-FRCNN"
    (seq / "img1" / "000002.png").unlink()
    gt = seq / "gt" / "gt.txt"
    gt.write_text(gt.read_text() + "2,1,0,0,5,5,1,1,1\n")
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-04-FRCNN/gt/gt\.txt: line 4: frame image "
        r".*MOT17-04-FRCNN/img1/000002\.png not found",
    ):
        _prepare(mot, tmp_path / "o")
    (seq / "seqinfo.ini").write_text(
        "[Sequence]\nname=MOT17-04\nseqLength=3\nimWidth=20\nimExt=.png\n"
    )
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-04-FRCNN/seqinfo\.ini: imHeight must be a "
        r"positive integer, found ''; expected \[Sequence\]",
    ):
        _prepare(mot, tmp_path / "o")
    # '²' is a digit to str.isdigit, not to int(): a ValueError traceback before
    (seq / "seqinfo.ini").write_text(
        "[Sequence]\nname=MOT17-04\nseqLength=3\nimWidth=20\nimHeight=2\u00b2\nimExt=.png\n",
        encoding="utf-8",
    )
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-04-FRCNN/seqinfo\.ini: imHeight must be a positive integer, found '2²'",
    ):
        _prepare(mot, tmp_path / "o")
    (seq / "seqinfo.ini").unlink()
    with pytest.raises(
        RankwiseError,
        match=r"seqinfo\.ini: not found; .*MOT17-04-FRCNN is not "
        r"a MOTChallenge sequence \(expected seqinfo\.ini, "
        r"img1/000001\.jpg and gt/gt\.txt in it\)",
    ):
        _prepare(mot, tmp_path / "o")
    with pytest.raises(
        RankwiseError,
        match=r"MOT17/test: split folder not found; options\.root "
        r"must hold test/<sequence>/",
    ):
        _prepare(mot, tmp_path / "o", split="test")
    with pytest.raises(
        RankwiseError,
        match=r"option sequences names 'MOT17-09', not found in "
        r".*train; found MOT17-02, MOT17-04",
    ):
        _prepare(mot, tmp_path / "o", sequences=["MOT17-09"])
    assert _empty(tmp_path / "o")


def test_mot_detector_variants_must_share_ground_truth(mot: Path, tmp_path: Path):
    _append_gt(mot, "2,4,5,5,5,5,1,1,1", sequences=("SDP",))
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-02-SDP/gt/gt\.txt: differs from "
        r".*MOT17-02-DPM/gt/gt\.txt; detector variants of "
        r"MOT17-02 must share one ground truth",
    ):
        _prepare(mot, tmp_path / "out")


def test_mot_frame_size_must_match_seqinfo(mot: Path, tmp_path: Path):
    Image.fromarray(_frame(21, 20, 3)).save(
        mot / "train" / "MOT17-04-FRCNN" / "img1" / "000003.png"
    )
    with pytest.raises(
        RankwiseError,
        match=r"000003\.png: image is 21x20, seqinfo\.ini says "
        r"20x20",
    ):
        _prepare(mot, tmp_path / "out")
    assert not (tmp_path / "out" / "crops").exists()
    assert not (tmp_path / "out" / "crops.tmp").exists()


def test_mot_frames_that_do_not_decode_are_one_line(mot: Path, tmp_path: Path):
    """A truncated JPEG frame was an OSError traceback; a PNG frame whose image data end
    after a whole row was cropped with black rows (PIL decodes it without an error)."""
    frames = sorted((mot / "train").glob("MOT17-02-*/img1/000003.jpg"))  # 3 detectors
    saved = [frame.read_bytes() for frame in frames]
    for frame, data in zip(frames, saved, strict=True):
        frame.write_bytes(data[:300])
    with pytest.raises(
        RankwiseError, match=r"000003\.jpg: cannot decode frame \(OSError: .*runcated"
    ):
        _prepare(mot, tmp_path / "out")
    for frame, data in zip(frames, saved, strict=True):
        frame.write_bytes(data)
    pixels = _frame(20, 20, 3)
    lines = png_scanlines(pixels)
    (mot / "train" / "MOT17-04-FRCNN" / "img1" / "000003.png").write_bytes(
        png_file(20, 20, lines[: len(lines) // 2])  # 10 of 20 rows
    )
    with pytest.raises(
        RankwiseError,
        match=r"MOT17-04: cannot decode image .*000003\.png \(its image data end 610 of 1220 "
        r"bytes early",
    ):
        _prepare(mot, tmp_path / "out")
    assert _empty(tmp_path / "out")


def test_mot_failed_run_keeps_the_previous_result(mot: Path, tmp_path: Path):
    out = tmp_path / "out"
    _prepare(mot, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    _append_gt(mot, "2,4,50,5,5,5,1,1,1")
    with pytest.raises(RankwiseError, match="no pixel inside"):
        _prepare(mot, out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"frames": "train_half"},
            r"mot: option frames must be one of all, first-half, "
            r"second-half, got 'train_half'",
        ),
        (
            {"min_visibility": 1.5},
            r"mot: option min_visibility must be a number >= 0 and <= 1, got 1.5",
        ),
        ({"min_size": -1}, r"mot: option min_size must be a non-negative integer, got -1"),
        ({"classes": 1}, r"mot: option classes must be positive integers"),
        ({"sequences": "MOT17-02"}, r"mot: option sequences must be a non-empty list"),
        (
            {"gap": 3},
            r"mot: unknown option\(s\) gap; valid options: classes, frames, "
            r"min_size, min_visibility, root, sequences, split",
        ),
        (
            {"min_visibility": 0.9, "min_size": 30},
            r"MOT17/train: no ground-truth box is left after "
            r"the filters",
        ),
    ],
)
def test_mot_option_errors(mot: Path, tmp_path: Path, options: dict, message: str):
    with pytest.raises(RankwiseError, match=message):
        _prepare(mot, tmp_path / "out", **options)
    assert _empty(tmp_path / "out")


def test_cli_prepare_mot(mot: Path, tmp_path: Path):
    from rankwise.cli import main

    out = tmp_path / "cli-out"
    args = [
        "prepare",
        "--loader",
        "mot",
        "--options",
        f'{{"root": "{mot}"}}',
        "--out-dir",
        str(out),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"prepared mot: 9 query rows, 9 gallery rows, 4 labels -> {out}"
    bad = tmp_path / "bad-out"
    _append_gt(mot, "2.5,4,5,5,5,5,1,1,1")
    result = CliRunner().invoke(main, args[:-1] + [str(bad)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "gt.txt: line 9: frame must be an integer, found '2.5'" in lines[0]
    assert _empty(bad)


def test_mot_through_the_pipeline(mot: Path, tmp_path: Path):
    """A real Snakemake run: prepare (crops under the manifest folder) -> encode -> metrics."""
    import json
    import subprocess
    import sys

    import yaml

    root = Path(__file__).resolve().parents[1]
    config = {
        "datasets": {
            "mot": {
                "loader": "mot",
                "options": {"root": str(mot)},
                "protocol": "reassociation",
                "gap_frames": 2,
                "ks": [1],
            }
        },
        "encoders": {"pixels": {"kind": "pixels", "options": {"size": [8, 4]}}},
        "engine": {"threads": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(root / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(tmp_path / "config.yaml"),
            "--cores",
            "1",
            "--workflow-profile",
            "none",
            "results/metrics/mot/pixels.json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "results/metrics/mot/pixels.json").read_text())
    # gap 2: only MOT17-04 track 1 at frame 1 has >= 2 candidates (tracks 1 and 5 at
    # frame 3) including itself; the other 8 crops are skipped
    assert (metrics["num_queries"], metrics["num_skipped"], metrics["num_gallery"]) == (1, 8, 9)
    assert (tmp_path / "results/manifests/mot/crops/MOT17-04_5/MOT17-04_000003.png").is_file()


def test_mot_crops_read_back_as_identity_folders(mot: Path, tmp_path: Path):
    """crops/ is the reid package's identity-folder layout: identity-folders reads it."""
    _prepare(mot, tmp_path / "mot")
    out = tmp_path / "ids"
    prepare_dataset("identity-folders", {"root": str(tmp_path / "mot" / "crops")}, out)
    query, gallery = _read(out, "query"), _read(out, "gallery")
    # 3 crops of MOT17-02_1, 3 of MOT17-02_2, 2 of MOT17-04_1; MOT17-04_5 has one crop
    assert query["label"].tolist() == ["MOT17-02_1", "MOT17-02_2", "MOT17-04_1"]
    assert gallery.groupby("label").size().to_dict() == {
        "MOT17-02_1": 2,
        "MOT17-02_2": 2,
        "MOT17-04_1": 1,
    }
