"""The csv-module parse of manifests and id files reads what pandas' parse read.

``read_csv_strings`` was ``pandas.read_csv(dtype=str, keep_default_na=False,
na_filter=False, encoding="utf-8-sig", index_col=False)`` with the names and the values
stripped of spaces and tabs; the reference below is exactly that, run over files that
tokenise differently in naive parsers."""

from __future__ import annotations

import re
import warnings

import pandas as pd
import pytest

from rankwise.errors import RankwiseError, first_line
from rankwise.manifest import read_csv_strings

CORPUS = {
    "plain": "id,label\nq1,1\nq2,2\n",
    "bom": "\ufeffid,label\nq1,1\n",
    "quoted comma": 'id,label\n"a,b",1\n"c,,d","2,"\n',
    "quoted newline": 'id,label\n"a\nb",1\nc,"x\n\ny"\n',
    "quoted crlf in crlf file": 'id,label\r\n"a\r\nb",1\r\nc,2\r\n',
    "quote inside a value": 'id,label\na"b,1\n"a"b,2\n"say ""hi""",3\n',
    "short rows": "id,label,note\nq1\nq2,2\nq3,3,x\n",
    "whitespace-only lines": "id,label\n   \n\t\nq1,1\n \t \nq2,2\n",
    "blank lines": "\n\nid,label\n\nq1,1\n\n\nq2,2\n\n",
    "quoted empty line": 'id,label\n""\nq1,1\n',
    "empty fields": "id,label\n,\nq1,\n",
    "no trailing newline": "id,label\nq1,1\nq2,2",
    "crlf": "id,label\r\nq1,1\r\nq2,2\r\n",
    "cr": "id,label\rq1,1\rq2,2\r",
    "spaces around values": "id , label\n q1 , 1 \n\tq2\t,\t2\t\n",
    "spaces around quotes": 'id,label\n "a" ,1\n"  b  ",2\n',
    "tabs": "id\tlabel\nq1\t1\n",
    "unicode": "id,label\nq\u00e9,\u4e2d\n\u00a0x\u00a0,\U0001f600\n",
    "no-break space line": "id,label\n\u00a0\nq1,1\n",
    "header only": "id,label\n",
    "header only, no newline": "id,label",
    "empty column names": "id,,label,\nq,1,2,3\n",
    "blank column name": "id, ,label\nq,1,2\n",
    "nul": "id,label\n\x00a,b\n",
    "control character line": "id,label\nq1,1\n\x1a\n",
}


def _reference(path) -> dict[str, list[str]]:
    """Today's parse with pandas, as ``read_csv_strings`` did it before."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.ParserWarning)
        table = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            encoding="utf-8-sig",
            index_col=False,
        )
    return {str(c).strip(): [v.strip(" \t") for v in table[c]] for c in table.columns}


@pytest.mark.parametrize("name", list(CORPUS))
def test_cells_are_what_pandas_read(tmp_path, name):
    path = tmp_path / "m.csv"
    path.write_bytes(CORPUS[name].encode("utf-8"))
    expected = _reference(path)
    table = read_csv_strings(path, "CSV manifest")
    assert {c: table[c].tolist() for c in table.columns} == expected
    assert table.columns == list(expected)  # the file's order
    assert len(table) == len(next(iter(expected.values())))


def test_a_blank_line_of_a_cr_file_shifts_no_value(tmp_path):
    """A file with old-Mac line ends (CR alone): pandas' tokenizer dropped the delimiter
    after a blank line, so the next row's values moved one column left (id '2', label
    'z', silently); the csv module reads the row as written."""
    path = tmp_path / "m.csv"
    path.write_bytes(b"note,id,label,extra\rx,q0,1,a\r\r,q1,2,z\r")
    table = read_csv_strings(path, "CSV manifest")
    assert table["id"].tolist() == ["q0", "q1"] and table["label"].tolist() == ["1", "2"]
    assert table["note"].tolist() == ["x", ""] and table["extra"].tolist() == ["a", "z"]


def test_a_short_row_reads_empty_values(tmp_path):
    """What pandas gave (na_filter off): an empty string, not NaN, for a missing field."""
    (tmp_path / "m.csv").write_text("id,label,note\nq1\nq2,2,x\n")
    table = read_csv_strings(tmp_path / "m.csv", "CSV manifest")
    assert table["label"].tolist() == ["", "2"] and table["note"].tolist() == ["", "x"]


@pytest.mark.parametrize(
    "text",
    [
        'id,label\nq1,"7,1\nq2,3\n',
        'id,label\nq1,1\nq2,"7,1',
        'id,label\nq0,a\n\nq1,"x\n',
        'id,label\n"a\n\nb",1\n\n \nq,"x\n',
        '\n\nid,label\nq,1\n"x\n',
        'id,label\nq1,1\n"',  # a lone quote, no line break after it: was read as no row
    ],
)
def test_a_quote_left_open_is_pandas_message(tmp_path, text):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(pd.errors.ParserError) as reference:
        _reference(path)
    with pytest.raises(RankwiseError, match=re.escape(f"({first_line(reference.value)}); fix")):
        read_csv_strings(path, "CSV manifest", fix="fix")


@pytest.mark.parametrize("text", ["", "\n\n", "\n \t\n"])
def test_a_file_without_a_header_is_pandas_message(tmp_path, text):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(pd.errors.EmptyDataError) as reference:
        _reference(path)
    message = f"m.csv: not a readable CSV manifest ({reference.value})"
    with pytest.raises(RankwiseError, match=re.escape(message)):
        read_csv_strings(path, "CSV manifest")


@pytest.mark.parametrize(
    "header, message",
    [
        ("id,label, label", "the header names column 'label' twice"),
        ("id, ,  ", "column '' appears twice (after stripping spaces)"),
    ],
)
def test_a_column_named_twice_after_stripping_is_refused(tmp_path, header, message):
    """pandas would rename the copy (``label.1``) or keep both blank names; either way a
    column would be read by the wrong name."""
    (tmp_path / "m.csv").write_text(f"{header}\nq,1,2\n")
    with pytest.raises(RankwiseError, match=re.escape(message)):
        read_csv_strings(tmp_path / "m.csv", "CSV manifest")
