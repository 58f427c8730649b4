"""Query / gallery manifests: one CSV row per item, in embedding row order.

Columns (README, "Inputs"): ``id`` and ``label`` always; ``camera`` for ``reid``;
``sequence`` and integer ``frame`` for ``reassociation``; ``sketch`` and integer
``step`` for ``progressive`` queries; ``path`` when encoding images.  Every value
is read as a string (labels compare as strings), without the spaces around it (``q1, 5, 1``
reads as ``q1``, ``5``, ``1``); other columns are kept.

:func:`read_manifest` is the one reader, used by every command (``evaluate``/``rank``
through :func:`rankwise.inputs.open_inputs`, ``encode``, the loaders, the statistics).
What it checks depends on what the caller knows:

- with ``protocol`` and ``role`` (ranking): the protocol's columns for that role;
- without them (``encode``, which learns neither): the columns *every* protocol needs
  in every role, i.e. ``id`` and ``label``.  So a manifest that no protocol could rank
  (no label, an empty id or label, a duplicate id, no rows, not a CSV) fails at encode
  time; the protocol-specific columns (``camera``, ``sequence``/``frame``,
  ``sketch``/``step``) are checked when the manifest is ranked, or at encode time
  when the caller passes the protocol.

Checked in every case: a readable CSV with a header, unique column names, no row with
more fields than the header, at least one row, no empty value in a required column,
unique ids, integers within ``-MAX_INTEGER..MAX_INTEGER`` in the required integer
columns.
"""

from __future__ import annotations

import csv
import gc
import itertools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import RankwiseError, first_line
from .registry import INTEGER_COLUMNS as _INTEGER_COLUMNS
from .registry import PROTOCOLS, REGISTRY, ROLES, get_protocol
from .table import Table, factorize, is_dataframe

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MAX_INTEGER",
    "PROTOCOLS",
    "check_nonempty",
    "check_protocol",
    "first_non_utf8_line",
    "read_csv_strings",
    "read_manifest",
    "read_utf8_text",
    "reid_signs",
    "required_columns",
    "row_line",
]

#: Largest magnitude of a value in an integer column (``frame``, ``step``): 2**31 - 1.
#: The protocols do int64 arithmetic on frames (``frame + gap_frames``, and one key per
#: (sequence, frame) of ``sequence code * frame range + offset``); within this bound it
#: stays exact for up to 2**31 sequences, where values near 2**63 would wrap around and
#: match the wrong candidates.  Video frame numbers are far below it (VeRi-776's eight
#: digits included); timestamps in milliseconds are not, so renumber those.
MAX_INTEGER = 2**31 - 1


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` or raise listing the valid ones."""
    return get_protocol(protocol).name


def required_columns(protocol: str | None, role: str | None) -> tuple[str, ...]:
    """Columns a manifest must have for ``protocol`` in ``role`` ('query'/'gallery').

    ``None`` for either means "not known": the columns required under every protocol
    (or in every role), in registry order.
    """
    specs = [get_protocol(protocol)] if protocol is not None else list(REGISTRY.values())
    if role is not None and role not in ROLES:
        raise RankwiseError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    lists = [spec.required_columns(r) for spec in specs for r in ([role] if role else ROLES)]
    return tuple(c for c in lists[0] if all(c in other for other in lists[1:]))


def read_manifest(
    source: str | os.PathLike | pd.DataFrame | Table,
    *,
    protocol: str | None = None,
    role: str | None = None,
    extra_columns: tuple[str, ...] = (),
) -> Table:
    """Read and validate a manifest (see the module docstring for what is checked).

    Parameters
    ----------
    source : path to a CSV file, or a DataFrame (or :class:`~rankwise.table.Table` of
        strings) with the same columns.
    protocol : one of ``PROTOCOLS``, deciding the required columns; ``None`` (not
        known, e.g. when encoding): the columns every protocol requires.
    role : ``"query"`` or ``"gallery"``; ``None``: the columns required in both roles.
    extra_columns : further required columns (non-empty values).

    Returns
    -------
    Table of ``(N,)`` string columns (integer columns ``frame``/``step`` as int64).
    """
    what = f"{role} manifest" if role else "manifest"
    in_memory = is_dataframe(source) or isinstance(source, Table)
    name = f"<{role or 'manifest'} table>" if in_memory else str(source)
    if is_dataframe(source):
        table = _from_frame(source, name)
    elif isinstance(source, Table):
        _check_unique_columns([str(c).strip() for c in source.columns], name)
        table = Table(
            {str(c).strip(): _strip_blanks(source[c]) for c in source.columns},
            n_rows=len(source),
            positions=True,
        )
    elif not isinstance(source, (str, os.PathLike)):
        raise RankwiseError(
            f"the {what} must be a CSV file path or a pandas DataFrame; got {type(source).__name__}"
        )
    else:
        path = Path(source)
        if not path.is_file():
            if path.is_dir():
                raise RankwiseError(f"{path}: the {what} is a folder; pass a CSV file")
            if path.exists():  # a pipe (`<(...)`) or a device: read twice, or never ends
                raise RankwiseError(
                    f"{path}: the {what} is a pipe or device, not a file; save it to a file first"
                )
            raise RankwiseError(f"{path}: {what} not found; pass an existing CSV file")
        table = read_csv_strings(
            path, "CSV manifest", fix="write one header line and one row per item"
        )
    _check_unique_columns(table.columns, name)
    needed = required_columns(protocol, role) + tuple(extra_columns)
    missing = [c for c in needed if c not in table]
    if missing:
        by = f"protocol {protocol!r}" if protocol is not None else "every protocol"
        raise RankwiseError(
            f"{name}: missing column(s) {', '.join(missing)} required by "
            f"{by} for the {role or 'query and the gallery'}; "
            f"{_missing_fix(table.columns, missing)} "
            f"(found: {', '.join(table.columns) or 'none'})"
        )
    if len(table) == 0:
        raise RankwiseError(f"{name}: the {what} has no rows; it needs at least one item")
    check_nonempty(table, [c for c in needed if c not in _INTEGER_COLUMNS], name)
    _refuse_nul(table, name)
    ids = table["id"]
    if len(set(ids)) < len(ids):
        codes, _ = factorize(ids)
        # a first appearance has a code above every earlier one (numbered in order)
        dup = codes <= np.maximum.accumulate(np.r_[-1, codes[:-1]])
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(codes == codes[i])[0])
        raise RankwiseError(
            f"{name}: duplicate id {ids[i]!r} at rows {row_line(first, table)} and "
            f"{row_line(i, table)}; ids must be unique within a manifest"
        )
    for col in _INTEGER_COLUMNS:
        if col in needed:
            table[col] = _to_int(table[col], name, col, table)
    return table


def reid_signs(query: str | os.PathLike | Table, gallery: str | os.PathLike | Table) -> str | None:
    """What makes two manifests look like re-identification data: ``"a 'camera'
    column"`` (in either), ``"gallery label -1"`` (the junk label), or None.

    The one test behind the hint given when ``recall`` runs because no protocol was
    named: ``rankwise evaluate`` / ``rank``'s note on stderr, and the
    :class:`~rankwise.errors.ProtocolHint` warning of :func:`rankwise.api.evaluate` /
    :func:`~rankwise.api.rank`.  ``query`` and ``gallery`` are CSV paths (their headers
    are read, and the gallery's labels when neither has a ``camera`` column) or tables
    :func:`read_manifest` returned.  A file that is not a readable CSV gives None: the
    ranking reports it.
    """
    if not all(isinstance(s, Table) or os.path.isfile(s) for s in (query, gallery)):
        return None  # a pipe read here would be empty for the ranking (which says so)
    try:
        for source in (query, gallery):
            if isinstance(source, Table):
                columns = list(source.columns)
            else:
                with open(source, newline="", encoding="utf-8-sig") as file:  # BOM: no name
                    columns = [c.strip() for c in next(csv.reader(file), [])]
            if "camera" in columns:
                return "a 'camera' column"
        if "label" not in columns:  # the gallery's
            return None
        if isinstance(gallery, Table):
            labels = gallery["label"]
        else:
            labels = read_csv_strings(Path(gallery), "CSV manifest")["label"]
        if any(str(label).strip() == "-1" for label in labels):
            return "gallery label -1"
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):  # RankwiseError too
        return None
    return None


def _from_frame(source: pd.DataFrame, name: str) -> Table:
    """A DataFrame manifest's cells as text, as a CSV file of them would read: integer
    columns exact, whole-number floats as integers, a missing value an empty cell,
    spaces and tabs around values dropped; its rows named by position."""
    import pandas as pd  # the caller made a DataFrame: imported already

    # before any column is read: source[col] of a name given twice is a DataFrame
    _check_unique_columns([str(c).strip() for c in source.columns], name)
    table = source.astype(str).reset_index(drop=True)
    for col in source.columns:  # keep integer columns given as numbers exact
        if col in _INTEGER_COLUMNS and pd.api.types.is_integer_dtype(source[col]):
            table[col] = source[col].astype(str).to_numpy()
        else:
            floats = _float_values(source[col], pd)
            whole = None if floats is None else whole_number_text(floats)
            if whole is not None:
                table[col] = whole
    # A missing value (None, NaN, pd.NA) is an empty cell, as in a CSV file, not the
    # label "None" / "nan" / "<NA>" that astype(str) writes, shared by every such row.
    table = table.mask(source.isna().to_numpy(), "")
    return Table(
        {str(c).strip(): _strip_blanks(table[c].to_numpy(dtype=object)) for c in table.columns},
        n_rows=len(table),
        positions=True,  # messages name positions (row_line)
    )


def _float_values(column, pd) -> np.ndarray | None:
    """A DataFrame column's values as float64 (NaN where missing) when it holds floats: a
    float column, a categorical of floats, or an object column of numbers with a float
    among them (``astype(str)`` would write ``3.0`` for each); else None."""
    dtype = column.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        if not pd.api.types.is_float_dtype(dtype.categories):
            return None
        return np.asarray(column.astype(float), dtype=float)
    if pd.api.types.is_float_dtype(dtype):
        return column.to_numpy(dtype=float, na_value=np.nan)
    if not pd.api.types.is_object_dtype(dtype):
        return None
    present = column.notna().to_numpy()
    known = column[present].tolist()
    numbers = all(
        isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        for v in known
    )
    if not (numbers and any(isinstance(v, (float, np.floating)) for v in known)):
        return None
    if any(isinstance(v, (int, np.integer)) and abs(int(v)) > 2**53 for v in known):
        return None  # not exact as a float: each stays as written
    values = np.full(len(column), np.nan)
    values[present] = np.asarray(known, dtype=float)
    return values


def whole_number_text(values: np.ndarray) -> np.ndarray | None:
    """Float ``values`` that are all whole numbers (NaN aside), as integer text
    (``3.0`` -> ``"3"``, NaN -> ``""``); None when any is not.

    pandas stores an integer column holding a missing value as float64.  Read as text,
    its labels would be ``"3.0"`` where a CSV file or an integer column says ``"3"`` (never
    the same identity), and the junk label ``-1.0`` would not be the junk label ``-1``.
    """
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return None
    known = ~np.isnan(values)
    kept = values[known]
    if not (np.isfinite(kept).all() and (kept == np.round(kept)).all()):
        return None
    if (np.abs(kept) >= 2.0**63).any():  # beyond int64
        return None
    text = np.full(values.shape, "", dtype=object)
    text[known] = kept.astype(np.int64).astype(str)
    return text


def _missing_fix(columns: list[str], missing: list[str]) -> str:
    """The fix for missing columns: add them, unless the header says what went wrong (a
    file separated by ``;`` or tabs reads as one column; names are case-sensitive)."""
    if len(columns) == 1:
        for mark, what in ((";", "semicolons"), ("\t", "tabs")):
            if mark in columns[0]:
                return f"the header is separated by {what}: save the file comma-separated"
    lower = {c.lower(): c for c in columns}
    renames = [f"{lower[m]!r} to {m!r}" for m in missing if m in lower]
    if renames:
        return "column names are lower-case: rename " + ", ".join(renames)
    return "add them"


def read_csv_strings(path: Path, noun: str, *, fix: str = "") -> Table:
    """Every cell of the CSV file ``path`` as a string, names and values stripped.

    The one CSV parse of the package (manifests, id files), read as pandas'
    ``read_csv(dtype=str, keep_default_na=False, index_col=False)`` read them (the
    differential test holds the two together): blank lines skipped, a row shorter than
    the header padded with empty values, an empty column name called ``Unnamed: <i>``
    (one difference, pandas' bug: in a file of CR-only line ends, pandas shifted the row
    after a blank line one column left; it is read as written here).  A byte-order
    mark (Excel's "CSV UTF-8") is not part of the first column's name.
    Refused, each in one line naming the file: a column name given twice (after
    stripping), and rows with more fields than the header (a delimiter at the end of
    each row: pandas took the first column as the index and shifted every value one
    column left, or dropped the extra fields).  ``noun`` and ``fix`` word the message
    for an unreadable file.

    Spaces around a value are not part of it: a file written ``q1, -1, 3`` (a space
    after each comma) read verbatim would have label ``" -1"``, which is not the junk
    label ``-1`` and not the label ``-1`` of a file written without spaces, so such
    items would silently count as distractors or lose their matches.
    """
    with _gc_paused():
        return _read_csv_strings(path, noun, fix)


def _read_csv_strings(path: Path, noun: str, fix: str) -> Table:
    rows: list[list[str]] = []
    error: Exception | None = None
    try:
        fast = _fast_rows(path)
        if fast is not None:
            rows = fast
        else:
            rows.extend(row for _, row in _csv_rows(path))
    except UnicodeDecodeError as exc:
        try:  # the header first, as when it was read before the rest
            first = next(_csv_rows(path), None)
        except (UnicodeDecodeError, csv.Error):
            first = None
        if first is not None:
            _refuse_twice_named(path, [h.strip() for h in first[1]])
        where = first_non_utf8_line(path)
        if where is not None:
            raise not_utf8(path, noun, where) from None
        error = exc
    except csv.Error as exc:  # a quote left open: what pandas said
        error = exc
    if rows:
        _refuse_twice_named(path, [h.strip() for h in rows[0]])
    elif error is None:
        error = ValueError("No columns to parse from file")  # pandas' words
    body = rows[1:]
    if rows and max(map(len, body), default=0) > len(rows[0]):
        _refuse_long_rows(path, noun, fix)
    if error is not None:
        raise RankwiseError(
            f"{path}: not a readable {noun} ({first_line(error)})" + (f"; {fix}" if fix else "")
        ) from None
    header = rows[0]
    width = len(header)
    names = [(raw or f"Unnamed: {i}").strip() for i, raw in enumerate(header)]  # pandas'
    _check_unique_columns(names, str(path))  # blank ones: a table holds one per name
    if min(map(len, body), default=width) < width:
        for row in body:  # short rows: empty values, as pandas read them
            row.extend([""] * (width - len(row)))
    blanks = _has_blanks(path)  # else no value has a space or tab to strip
    columns = {}
    for name, values in zip(names, zip(*body, strict=True) if body else [()] * width, strict=True):
        column = np.empty(len(body), dtype=object)
        column[:] = [v.strip(" \t") for v in values] if blanks else values
        columns[name] = column
    return Table(columns, n_rows=len(body), csv_path=str(path))


def _refuse_twice_named(path: Path, names: list[str]) -> None:
    for i, col in enumerate(names):
        if col and col in names[:i]:
            raise RankwiseError(
                f"{path}: the header names column {col!r} twice; rename or remove "
                f"one (header: {', '.join(names)})"
            )


def not_utf8(path: Path, noun: str, where: tuple[int, int] | None = None) -> RankwiseError:
    """The one-line error for a text file ``path`` (a ``noun``) that is not UTF-8, at
    ``where`` (:func:`first_non_utf8_line`, found again when not given)."""
    line, byte = where or first_non_utf8_line(path) or (0, 0)
    return RankwiseError(
        f"{path}: not a readable {noun}: line {line} is not UTF-8 text (byte 0x{byte:02x}: "
        "saved in another encoding, e.g. Latin-1 or Windows-1252, or not a text file); "
        "save it as UTF-8"
    )


def read_utf8_text(path: Path, noun: str) -> str:
    """The text of ``path`` (UTF-8; a leading byte-order mark dropped), or
    :func:`not_utf8`'s one line naming the first line that is not."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise not_utf8(Path(path), noun) from None


def first_non_utf8_line(path: Path) -> tuple[int, int] | None:
    """``(line number, first bad byte)`` of the first line that is not UTF-8, or None."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return number, raw[exc.start]
    return None


def _strip_blanks(values) -> np.ndarray:
    """``(N,)`` object array of ``values`` as text without the spaces and tabs around
    them: only ASCII spaces and tabs (``str.strip()`` would also take a no-break
    space, which a CSV file's byte scan, :func:`_has_blanks`, does not look for)."""
    out = np.empty(len(values), dtype=object)
    out[:] = [str(v).strip(" \t") for v in values]
    return out


def _has_blanks(path: Path) -> bool:
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            if b" " in block or b"\t" in block:
                return True
    return False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a file's rows are made: each row is a new list
    (a tracked object), and the collections they set off would walk every earlier one,
    ~3/4 of the time of a million-row read, finding nothing to free."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def any_field_size() -> Iterator[None]:
    """Lift the csv module's field size limit (128 KiB; pandas has none) while reading:
    a long ``text`` value is a field like any other, and a quote left open reads as one
    field to the end of the file, which the pandas parse then names."""
    old = csv.field_size_limit(2**31 - 1)
    try:
        yield
    finally:
        csv.field_size_limit(old)


#: Fed to the csv reader after a file's last line (behind a line break, ``_AFTER_END``):
#: its own row, unless a quote left open at the end of the file takes it into that
#: quoted value (the csv module, not strict, says nothing where pandas said "EOF inside
#: string").  The line break first: a lone ``"`` ending a file without one would
#: otherwise open a value holding exactly the marker, which reads as its own row.
_END = "\x00end of file\x00"
_AFTER_END = ("\n", _END)


@contextmanager
def _records(path: Path) -> Iterator[Any]:
    """The csv module's records of ``path`` (UTF-8, a byte-order mark dropped, any field
    size), then ``[_END]`` unless a quote left open at the end takes it in."""
    with open(path, newline="", encoding="utf-8-sig") as handle, any_field_size():
        yield csv.reader(itertools.chain(handle, _AFTER_END))


def _spaces_alone(row: list[str]) -> bool:
    """One field of spaces and tabs alone: a blank line, unless its value was quoted."""
    return len(row) == 1 and bool(row[0]) and not row[0].strip(" \t")


def _csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each row, the line it starts on (a quoted value may
    span lines), without the blank lines pandas skipped (empty, or spaces and tabs
    alone, unquoted).  A quote open at the end of the file: its row, then csv.Error in
    pandas' words, counting rows from 0 as pandas did (blank lines included)."""
    with _records(path) as reader:
        start = 1
        lines: list[str] | None = None  # read when a row of spaces alone needs its line
        for record, row in enumerate(reader):
            if row and row[-1].endswith(_END):
                if row == [_END]:
                    return
                row[-1] = row[-1][: -len(_END)]
                yield start, row
                raise csv.Error(
                    f"Error tokenizing data. C error: EOF inside string starting at row {record}"
                )
            if _spaces_alone(row):  # quoted, or blank?
                if lines is None:
                    with open(path, newline="", encoding="utf-8-sig") as again:
                        lines = again.readlines()
                if '"' in lines[reader.line_num - 1]:
                    yield start, row
            elif row:  # an empty line is no field; a quoted empty value, one
                yield start, row
            start = reader.line_num + 1


def _fast_rows(path: Path) -> list[list[str]] | None:
    """The fields of :func:`_csv_rows`' rows, read at C speed (~4x faster: no line
    numbers); None where that takes reading row by row: a quote left open, or a row of
    spaces alone (blank unless quoted, which only its line tells)."""
    with _records(path) as reader:
        records = list(reader)
    if records.pop() != [_END]:
        return None
    rows = [row for row in records if row]  # an empty line is no field
    if any(map(_spaces_alone, rows)):
        return None
    return rows


def _refuse_long_rows(path: Path, noun: str, fix: str) -> None:
    """Raise naming the first row with more fields than the header, if there is one."""
    rows: list[tuple[int, list[str]]] = []
    with suppress(csv.Error):  # a quote left open: the rows up to it
        rows.extend(_csv_rows(path))
    header = [h.strip() for h in rows[0][1]]
    long = [(line, len(row)) for line, row in rows[1:] if len(row) > len(header)]
    if long:
        n_rows = len(rows) - 1
        scope = "every row has" if len(long) == n_rows else f"{len(long)} of {n_rows} rows have"
        raise RankwiseError(
            f"{path}: not a readable {noun} (line {long[0][0]} has {long[0][1]} fields but "
            f"the header names {len(header)}: {', '.join(header)}; {scope} more fields than "
            f"the header, so values cannot be matched to columns); "
            f"{fix + ', ' if fix else ''}as many fields in each row as the header names: "
            "remove the extra delimiters at the end of those rows, or name every column in "
            "the header"
        )


def _check_unique_columns(columns: list[str], name: str) -> None:
    for i, col in enumerate(columns):
        if col in columns[:i]:
            raise RankwiseError(
                f"{name}: column {col!r} appears twice (after stripping spaces); rename "
                "or remove one"
            )


def _refuse_nul(table: Table, name: str) -> None:
    """A NUL character names no file (the OS refuses it) and numpy's fixed-width
    strings drop it at the end of a value, so two ids could silently become one."""
    if table.csv_path:  # one scan of the file's bytes spares a scan of every column
        try:
            if b"\0" not in Path(table.csv_path).read_bytes():
                return
        except OSError:
            pass
    for col in table.columns:
        values = table[col]
        if values.dtype != object:
            continue
        nul = [i for i, v in enumerate(values) if "\x00" in str(v)]
        if nul:
            raise RankwiseError(
                f"{name}: row {row_line(nul[0], table)}: column {col!r} contains a NUL "
                "character (byte 0); remove it from the file"
            )


def check_nonempty(table: Table, columns, name: str) -> None:
    """Refuse an empty (or blank) value in ``columns``, naming the first row."""
    for col in columns:
        values = table[col]  # strings: empty, or whitespace alone (what strip() leaves empty)
        empty = np.flatnonzero((values == "") | np.fromiter(map(str.isspace, values), bool))
        if len(empty):
            raise RankwiseError(
                f"{name}: row {row_line(empty[0], table)}: empty {col!r}; every item needs "
                f"{'an' if col[0] in 'aeiou' else 'a'} {col}"
            )


def row_line(i: int, table: Table | None = None) -> int | str:
    """1-based line number in the CSV file of data row ``i`` (the header's line + 1 + i
    when no blank line or multi-line value comes between; read from the file, which
    ``table.csv_path`` names, when one does); ``"<i> (0-based)"`` for a manifest given
    as a DataFrame (``table.positions``), which has no lines."""
    # getattr: build_problem is also given DataFrames (tests), which carry neither
    source_rows = getattr(table, "source_rows", None)
    if source_rows is not None:  # a subset (Table.take): the row as read
        i = int(source_rows[int(i)])
    if getattr(table, "positions", False):
        return f"{int(i)} (0-based)"
    path = getattr(table, "csv_path", None)
    if path:
        try:
            lines = [line for line, _ in _csv_rows(Path(path))][1:]
            if i < len(lines):
                return lines[int(i)]
        except (OSError, UnicodeDecodeError, csv.Error):
            pass
    return int(i) + 2


_INTEGER = re.compile(r"[+-]?\d+")


def _to_int(column: np.ndarray, name: str, col: str, table: Table | None = None) -> np.ndarray:
    """``column`` ``(N,)`` as int64; each value an integer within
    ``-MAX_INTEGER..MAX_INTEGER``."""
    values = [str(v).strip() for v in column]
    bad = next((i for i, v in enumerate(values) if not _INTEGER.fullmatch(v)), None)
    if bad is not None:
        raise RankwiseError(
            f"{name}: row {row_line(bad, table)}: column {col!r} must be an integer, found "
            f"{values[bad]!r}"
        )
    numbers = np.zeros(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        # At most 18 significant digits convert to int64 exactly; longer ones are out of
        # range (Python's int would not overflow: the bound below is the check).
        if len(v.lstrip("+-").lstrip("0")) > 18 or abs(number := int(v)) > MAX_INTEGER:
            raise RankwiseError(
                f"{name}: row {row_line(i, table)}: column {col!r} value {v} is out of "
                f"range; {col} must be between {-MAX_INTEGER} and {MAX_INTEGER} (renumber, "
                f"e.g. subtract the first {col})"
            )
        numbers[i] = number
    return numbers
