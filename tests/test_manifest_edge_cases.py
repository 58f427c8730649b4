"""Manifest CSVs that pandas reads quietly wrong: every one is one error line or exact.

- rows with more fields than the header (a delimiter ending each row): pandas takes the
  first column as the index and shifts every value one column left;
- a column name given twice (exactly, or once with spaces): pandas renames the copy, or
  stripping the names makes two columns of one name;
- integer columns (``frame``, ``step``) beyond int64, or near its limit where
  ``frame + gap_frames`` wraps around;
- spaces after the delimiters (``q1, -1, 3``): read verbatim, the label ``" -1"`` is
  not the junk label and matches no ``-1`` of a file written without spaces.

The same CSV parse reads id files (``feature_ids.read_ids``), so they are checked too.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from helpers import input_args, run_rankwise

from rankwise.errors import RankwiseError
from rankwise.feature_ids import read_ids
from rankwise.manifest import MAX_INTEGER, read_manifest

TRAILING = "id,label,camera\nq1,alice,1,\nq2,bob,2,\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            TRAILING,
            r"m\.csv: not a readable CSV manifest \(line 2 has 4 fields but the header names 3: "
            r"id, label, camera; every row has more fields than the header.*\); write one "
            r"header line.*remove the extra delimiters",
        ),
        # only some rows: said so, not "empty 'label'" or a pandas tokenizer message
        (
            "id,label,camera\nq1,alice,1\nq2,bob,2,\nq3,carol,3\n",
            r"m\.csv: .*line 3 has 4 fields but the header names 3: .*; 1 of 3 rows have more",
        ),
        (
            "id,label\nq1,alice,\nq2,bob\n",
            r"m\.csv: .*line 2 has 3 fields but the header names 2: .*; 1 of 2 rows have more",
        ),
        # an extra value, not only an empty field: pandas would drop it silently
        (
            "id,label,camera\nq1,alice,1,x\nq2,bob,2,y\n",
            r"m\.csv: .*line 2 has 4 fields .*every row has more fields",
        ),
        (
            "id,label,camera\nq1,alice,1,,\nq2,bob,2,,\n",
            r"m\.csv: .*line 2 has 5 fields but the header names 3",
        ),
    ],
)
def test_rows_longer_than_the_header_are_an_error(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(RankwiseError, match=message):
        read_manifest(tmp_path / "m.csv")


def test_a_stray_quote_in_a_large_file_is_one_line(tmp_path):
    """A quote that never closes makes the rest of the file one field: past the csv
    module's 128 KiB field limit this raised csv.Error (a traceback) before pandas'
    message could be given."""
    rows = ["id,label,camera"] + [f"q{i},{i % 10},1" for i in range(20_000)]
    rows[3] = 'q2,"7,1'
    (tmp_path / "m.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(RankwiseError, match=r"m\.csv: not a readable .*EOF inside string"):
        read_manifest(tmp_path / "m.csv")


def test_a_trailing_delimiter_never_shifts_the_columns_in_evaluate(tmp_path):
    """The reported case: exit 0 with every label shifted, now exit 2 in one line."""
    (tmp_path / "q.csv").write_text(TRAILING)
    (tmp_path / "g.csv").write_text("id,label,camera\ng1,alice,2\ng2,bob,1\n")
    np.save(tmp_path / "q.npy", np.eye(2, 3, dtype=np.float32))
    np.save(tmp_path / "g.npy", np.eye(2, 3, dtype=np.float32))
    proc = run_rankwise(
        "evaluate",
        *input_args(tmp_path),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "q.csv: not a readable CSV manifest (line 2 has 4 fields" in lines[0]


def test_a_header_ending_with_a_delimiter_is_an_extra_column(tmp_path):
    """Header and rows agree: an unnamed (empty) column, kept, nothing shifted."""
    (tmp_path / "m.csv").write_text("id,label,\nq1,alice,\nq2,bob,\n")
    table = read_manifest(tmp_path / "m.csv")
    assert table["id"].tolist() == ["q1", "q2"] and table["label"].tolist() == ["alice", "bob"]


def test_shorter_rows_and_blank_lines_keep_their_columns(tmp_path):
    (tmp_path / "m.csv").write_text("\nid,label,note\n\nq1,alice\nq2,bob,x\n")
    table = read_manifest(tmp_path / "m.csv")
    assert {c: table[c].tolist() for c in table.columns} == {
        "id": ["q1", "q2"],
        "label": ["alice", "bob"],
        "note": ["", "x"],
    }


@pytest.mark.parametrize(
    "header, column",
    [
        ("id,label, label", "label"),
        ("id, id,label", "id"),
        ("id,label,label", "label"),  # pandas would call the copy label.1 and read the first
        ("\ufeffid,label,id", "id"),
    ],
)
def test_a_column_named_twice_is_an_error(tmp_path, header, column):
    (tmp_path / "m.csv").write_text(f"{header}\na,1,2\n", encoding="utf-8")
    with pytest.raises(RankwiseError, match=rf"m\.csv: the header names column '{column}' twice"):
        read_manifest(tmp_path / "m.csv")


def test_a_table_with_a_column_named_twice_after_stripping_is_an_error():
    import pandas as pd

    table = pd.DataFrame([["a", "1", "2"]], columns=["id", "label", " label"])
    with pytest.raises(RankwiseError, match=r"column 'label' appears twice"):
        read_manifest(table)


def _reassociation(tmp_path, frame: str):
    (tmp_path / "m.csv").write_text(f"id,label,sequence,frame\na,1,s,{frame}\nb,1,s,5\n")
    return read_manifest(tmp_path / "m.csv", protocol="reassociation", role="query")


@pytest.mark.parametrize(
    "frame",
    [
        "99999999999999999999",  # beyond int64: was an OverflowError traceback
        str(2**63 - 8),  # fits int64, but frame + gap_frames wrapped around
        str(-(2**63)),
        str(MAX_INTEGER + 1),
        "-" + str(MAX_INTEGER + 1),
        "0000000000000000000000" + str(MAX_INTEGER + 1),
    ],
)
def test_integers_out_of_range_are_an_error(tmp_path, frame):
    message = (
        rf"m\.csv: row 2: column 'frame' value {frame} is out of range; frame must be "
        rf"between -{MAX_INTEGER} and {MAX_INTEGER}"
    )
    with pytest.raises(RankwiseError, match=message):
        _reassociation(tmp_path, frame)


@pytest.mark.parametrize(
    "frame, value",
    [
        (str(MAX_INTEGER), MAX_INTEGER),
        ("-" + str(MAX_INTEGER), -MAX_INTEGER),
        ("+0000000000000000000000000012", 12),
        (" 7 ", 7),
    ],
)
def test_integers_in_range_are_exact(tmp_path, frame, value):
    table = _reassociation(tmp_path, frame)
    assert table["frame"].dtype == np.int64 and table["frame"].tolist() == [value, 5]


def test_out_of_range_step_in_evaluate_is_one_line(tmp_path):
    (tmp_path / "q.csv").write_text("id,label,sketch,step\nq1,a,s,99999999999999999999\n")
    (tmp_path / "g.csv").write_text("id,label\ng1,a\n")
    np.save(tmp_path / "q.npy", np.ones((1, 2), np.float32))
    np.save(tmp_path / "g.npy", np.ones((1, 2), np.float32))
    proc = run_rankwise(
        "evaluate",
        "--protocol",
        "progressive",
        *input_args(tmp_path),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "q.csv: row 2: column 'step' value 99999999999999999999 is out of range" in lines[0]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "id,score\na,1,\nb,2,\n",
            r"ids\.csv: not a readable CSV of ids \(line 2 has 3 fields but the header names 2",
        ),
        ("id, id\na,b\n", r"ids\.csv: the header names column 'id' twice"),
    ],
)
def test_id_files_are_read_like_manifests(tmp_path, text, message):
    (tmp_path / "ids.csv").write_text(text)
    with pytest.raises(RankwiseError, match=message):
        read_ids(tmp_path / "ids.csv")
    (tmp_path / "ok.csv").write_text("\ufeffid,score\na,1\nb,2\n", encoding="utf-8")
    assert read_ids(tmp_path / "ok.csv").tolist() == ["a", "b"]


SPACED_GALLERY = "id, label, camera\ng0, -1, 2\ng1, 1, 2 \ng2, 2, 2\ng3 ,2,1\n"


def test_spaces_around_values_are_not_part_of_them(tmp_path):
    (tmp_path / "m.csv").write_text(SPACED_GALLERY)
    table = read_manifest(tmp_path / "m.csv", protocol="reid", role="gallery")
    assert {c: table[c].tolist() for c in table.columns} == {
        "id": ["g0", "g1", "g2", "g3"],
        "label": ["-1", "1", "2", "2"],
        "camera": ["2", "2", "2", "1"],
    }
    # a table given to the API reads the same
    given = pd.DataFrame(
        {"id": [" a", "b "], "label": [" 1", "2\t"], "sequence": ["s ", "s"], "frame": [" 3", 4]}
    )
    table = read_manifest(given, protocol="reassociation", role="gallery")
    assert table["id"].tolist() == ["a", "b"] and table["label"].tolist() == ["1", "2"]
    assert table["sequence"].tolist() == ["s", "s"] and table["frame"].tolist() == [3, 4]


def _spaced_inputs(folder, gallery_csv):
    """Two queries; each one's nearest gallery item is a junk row (label -1) or a match."""
    folder.mkdir(exist_ok=True)
    q = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32)
    g = np.array([[1, 0.01, 0, 0], [1, 0.02, 0, 0], [0, 1, 0.5, 0], [0, 1, 0.01, 0]], np.float32)
    np.save(folder / "q.npy", q)
    np.save(folder / "g.npy", g)
    (folder / "q.csv").write_text("id, label, camera\nq0, 1, 1\nq1, 2, 1\n")
    (folder / "g.csv").write_text(gallery_csv)


def test_a_spaced_junk_label_is_junk_in_evaluate(tmp_path):
    """The reported case: ``g0, -1, 2`` counted as a distractor ranked first (rank1 50,
    4 gallery items); the junk row is excluded, as in the file without spaces."""
    _spaced_inputs(tmp_path / "spaced", SPACED_GALLERY)
    _spaced_inputs(tmp_path / "plain", SPACED_GALLERY.replace(" ", ""))
    (tmp_path / "plain" / "q.csv").write_text("id,label,camera\nq0,1,1\nq1,2,1\n")
    reports = []
    for name in ("spaced", "plain"):
        out = tmp_path / f"{name}.json"
        proc = run_rankwise(
            "evaluate", "--protocol", "reid", *input_args(tmp_path / name), "--output", out
        )
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads(out.read_text()))
    spaced, plain = reports
    # by hand: q0 (cam 1) -> g1 (label 1, cam 2) after junk g0; q1 -> g3 is same-camera
    # (cam 1, excluded), g2 (label 2, cam 2) is its match: rank1 100, mAP 100
    assert spaced["num_gallery"] == 3
    assert spaced["metrics"]["rank1"] == 100.0 and spaced["metrics"]["map"] == 100.0
    assert spaced["metrics"] == plain["metrics"]


def test_spaces_around_ids_in_id_files_and_manifests_agree(tmp_path):
    (tmp_path / "ids.csv").write_text("id\n a\nb \n")
    (tmp_path / "m.csv").write_text("id,label\n a,1\nb ,2\n")
    assert (
        read_ids(tmp_path / "ids.csv").tolist()
        == read_manifest(tmp_path / "m.csv")["id"].tolist()
        == ["a", "b"]
    )


def test_a_no_break_space_is_part_of_a_value_wherever_the_file_has_spaces(tmp_path):
    """Only spaces and tabs are stripped: a no-break space stayed or went depending on
    whether another cell of the file held an ordinary space."""
    (tmp_path / "a.csv").write_text("id,label\nq0,a\u00a0\nq1,b\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text("id,label\nq0,a\u00a0\nq 1,b\n", encoding="utf-8")
    assert read_manifest(tmp_path / "a.csv")["label"].tolist() == ["a\u00a0", "b"]
    assert read_manifest(tmp_path / "b.csv")["label"].tolist() == ["a\u00a0", "b"]


@pytest.mark.parametrize(
    "text, message",
    [
        # blank lines before the rows: the file's own line numbers
        ("id,label\n\nq0,a\n\nq1,b\nq0,a\n", "duplicate id 'q0' at rows 3 and 6"),
        ("id,label\nq0,a\n\n \nq1,b\nq2,\n", "row 6: empty 'label'; every item needs a label"),
        # a quoted value over two lines: the row starts on line 3
        ('id,label\nq0,a\n"q\n1",b\nq2,\n', "row 5: empty 'label'"),
        ("\nid,label\nq0,\n", "row 3: empty 'label'"),
        ("label,id\n1,\n", "row 2: empty 'id'; every item needs an id"),
    ],
)
def test_rows_are_named_by_their_line_in_the_file(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(RankwiseError, match=re.escape(message)):
        read_manifest(tmp_path / "m.csv")


@pytest.mark.parametrize(
    "text, fix",
    [
        (
            "id;label\nq0;a\n",
            "the header is separated by semicolons: save the file comma-separated",
        ),
        ("id\tlabel\nq0\ta\n", "the header is separated by tabs: save the file comma-separated"),
        (
            "ID,Label\nq0,a\n",
            "column names are lower-case: rename 'ID' to 'id', 'Label' to 'label'",
        ),
        ("id,name\nq0,a\n", "add them"),
    ],
)
def test_missing_columns_say_what_is_wrong_with_the_header(tmp_path, text, fix):
    """Columns that are there, separated by ';' or tabs or capitalised, are not to be
    "added"."""
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(RankwiseError, match=re.escape(f"; {fix} (found: ")):
        read_manifest(tmp_path / "m.csv")


def test_a_file_in_another_encoding_names_the_line(tmp_path):
    (tmp_path / "m.csv").write_bytes(b"id,label\nq0,a\nq1,caf\xe9\n")
    message = r"m\.csv: not a readable CSV manifest: line 3 is not UTF-8 text \(byte 0xe9: "
    with pytest.raises(RankwiseError, match=message + r".*save it as UTF-8"):
        read_manifest(tmp_path / "m.csv")
    (tmp_path / "ids.txt").write_bytes(b"q0\nq\xe9\n")
    message = r"ids\.txt: not a readable text file of ids: line 2 is not UTF-8 text \(byte 0xe9"
    with pytest.raises(RankwiseError, match=message):
        read_ids(tmp_path / "ids.txt")
    np.save(tmp_path / "ids.npy", np.array([b"q0", b"q\xe9"]))
    message = r"ids\.npy: id 1 \(0-based\), b'q\\xe9', is not UTF-8"
    with pytest.raises(RankwiseError, match=message):
        read_ids(tmp_path / "ids.npy")


@pytest.mark.parametrize("protocol", ["recall", "reid"])
def test_ids_numbered_in_each_file_with_other_labels_are_an_error(tmp_path, protocol):
    """Ids 0, 1, 2 in both files: the same id is the same item, never its own match, so
    gallery item '0' silently left query '0''s ranking (rank1 50, exit 0). Labels that
    disagree say so; shared ids with the same label are one item, as before."""
    camera = ",camera" if protocol == "reid" else ""
    c1, c2 = (",1", ",2") if protocol == "reid" else ("", "")
    (tmp_path / "q.csv").write_text(f"id,label{camera}\n0,a{c1}\n1,b{c1}\n")
    (tmp_path / "g.csv").write_text(f"id,label{camera}\n0,b{c2}\n1,b{c2}\n2,a{c2}\n")
    np.save(tmp_path / "q.npy", np.array([[1, 0], [0, 1]], np.float32))
    np.save(tmp_path / "g.npy", np.array([[0, 1], [0.1, 1], [1, 0.1]], np.float32))
    proc = run_rankwise("evaluate", "--protocol", protocol, *input_args(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        "q.csv, " in lines[0]
        and "g.csv: id '0' is a query (row 2, label 'a') and a gallery item (row 2, label 'b'); "
        "the same id is the same item"
        in lines[0]
        and "(1 of the 2 shared ids differ): give query and gallery items distinct ids" in lines[0]
    ), lines[0]
    # the same labels: one item each, left out of its own ranking, as before
    (tmp_path / "g.csv").write_text(f"id,label{camera}\n0,a{c2}\n1,b{c2}\n2,a{c2}\n")
    proc = run_rankwise("evaluate", "--protocol", protocol, *input_args(tmp_path))
    assert proc.returncode == 0, proc.stderr


def test_a_nul_character_is_one_line_in_the_reader_the_loader_and_the_fingerprint(tmp_path):
    """A NUL names no file (os.stat and realpath raise ValueError: a traceback in
    `rankwise prepare` and in the pipeline's rerun fingerprint) and numpy's fixed-width
    strings drop it at the end of an id, so it is refused, naming the line."""
    from rankwise import pipeline_config

    (tmp_path / "q.csv").write_text("id,label,path\nq0,L0,a.png\n")
    (tmp_path / "g.csv").write_text("id,label,path\ng0,L0,b.png\ng1,L1,img_\x001.png\n")
    with pytest.raises(RankwiseError, match=r"g\.csv: row 3: column 'path' contains a NUL"):
        read_manifest(tmp_path / "g.csv")
    (tmp_path / "ids.csv").write_text("id,label\nq0\x00,L0\nq0,L0\n")
    with pytest.raises(RankwiseError, match=r"ids\.csv: row 2: column 'id' contains a NUL"):
        read_manifest(tmp_path / "ids.csv")
    options = {"query": str(tmp_path / "q.csv"), "gallery": str(tmp_path / "g.csv")}
    proc = run_rankwise(
        "prepare", "--loader", "manifest", "--options", json.dumps(options),
        "--out-dir", tmp_path / "out",
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.fullmatch(r"error: \S+g\.csv: row 3: column 'path' contains a NUL.*\n", proc.stderr)
    # the rerun fingerprint (read while Snakemake builds the DAG) does not crash
    prints = pipeline_config.dataset_fingerprints("manifest", options)
    assert set(prints) == {"query", "gallery"}
