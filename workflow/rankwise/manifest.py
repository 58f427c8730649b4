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
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from .errors import RankwiseError, first_line
from .registry import INTEGER_COLUMNS as _INTEGER_COLUMNS
from .registry import PROTOCOLS, REGISTRY, ROLES, get_protocol

__all__ = [
    "MAX_INTEGER",
    "PROTOCOLS",
    "check_nonempty",
    "check_protocol",
    "first_non_utf8_line",
    "read_csv_strings",
    "read_manifest",
    "read_utf8_text",
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
#: ``attrs["rows"]`` of a manifest read from a DataFrame: rows are named by position.
_POSITIONS = "positions"


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
    source: str | os.PathLike | pd.DataFrame,
    *,
    protocol: str | None = None,
    role: str | None = None,
    extra_columns: tuple[str, ...] = (),
) -> pd.DataFrame:
    """Read and validate a manifest (see the module docstring for what is checked).

    Parameters
    ----------
    source : path to a CSV file, or a DataFrame with the same columns.
    protocol : one of ``PROTOCOLS``, deciding the required columns; ``None`` (not
        known, e.g. when encoding): the columns every protocol requires.
    role : ``"query"`` or ``"gallery"``; ``None``: the columns required in both roles.
    extra_columns : further required columns (non-empty values).

    Returns
    -------
    DataFrame of strings (integer columns ``frame``/``step`` as int64), index 0..N-1.
    """
    what = f"{role} manifest" if role else "manifest"
    name = str(source) if not isinstance(source, pd.DataFrame) else f"<{role or 'manifest'} table>"
    if isinstance(source, pd.DataFrame):
        # before any column is read: source[col] of a name given twice is a DataFrame
        _check_unique_columns([str(c).strip() for c in source.columns], name)
        table = source.astype(str).reset_index(drop=True)
        table.attrs = {"rows": _POSITIONS}  # messages name positions (row_line)
        for col in source.columns:  # keep integer columns given as numbers exact
            if col in _INTEGER_COLUMNS and pd.api.types.is_integer_dtype(source[col]):
                table[col] = source[col].astype(str).to_numpy()
            elif pd.api.types.is_float_dtype(source[col]):
                whole = whole_number_text(source[col].to_numpy(dtype=float, na_value=np.nan))
                if whole is not None:
                    table[col] = whole
        # A missing value (None, NaN, pd.NA) is an empty cell, as in a CSV file, not the
        # label "None" / "nan" / "<NA>" that astype(str) writes, shared by every such row.
        table = table.mask(source.isna().to_numpy(), "")
        table = _stripped(table)
    elif not isinstance(source, (str, os.PathLike)):
        raise RankwiseError(
            f"the {what} must be a CSV file path or a pandas DataFrame; got {type(source).__name__}"
        )
    else:
        path = Path(source)
        if not path.is_file():
            raise RankwiseError(f"{path}: {what} not found; pass an existing CSV file")
        table = read_csv_strings(
            path, "CSV manifest", fix="write one header line and one row per item"
        )
    table.columns = [str(c).strip() for c in table.columns]
    _check_unique_columns(list(table.columns), name)
    needed = required_columns(protocol, role) + tuple(extra_columns)
    missing = [c for c in needed if c not in table.columns]
    if missing:
        by = f"protocol {protocol!r}" if protocol is not None else "every protocol"
        raise RankwiseError(
            f"{name}: missing column(s) {', '.join(missing)} required by "
            f"{by} for the {role or 'query and the gallery'}; "
            f"{_missing_fix(list(table.columns), missing)} "
            f"(found: {', '.join(table.columns) or 'none'})"
        )
    if len(table) == 0:
        raise RankwiseError(f"{name}: the {what} has no rows; it needs at least one item")
    check_nonempty(table, [c for c in needed if c not in _INTEGER_COLUMNS], name)
    _refuse_nul(table, name)
    ids = table["id"].to_numpy()
    dup = pd.Series(ids).duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(ids == ids[i])[0])
        raise RankwiseError(
            f"{name}: duplicate id {ids[i]!r} at rows {row_line(first, table)} and "
            f"{row_line(i, table)}; ids must be unique within a manifest"
        )
    for col in _INTEGER_COLUMNS:
        if col in needed:
            table[col] = _to_int(table[col], name, col, table)
    return table


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


def read_csv_strings(path: Path, noun: str, *, fix: str = "") -> pd.DataFrame:
    """Every cell of the CSV file ``path`` as a string, names and values stripped.

    The one CSV parse of the package (manifests, id files). A byte-order mark (Excel's
    "CSV UTF-8") is not part of the first column's name. Refused, each in one line
    naming the file: a column name given twice (after stripping; pandas would rename
    the copy ``label.1`` and read the first), and rows with more fields than the header
    (a delimiter at the end of each row: pandas would take the first column as the
    index and shift every value one column left, or drop the extra fields).  ``noun``
    and ``fix`` word the message for an unreadable file.

    Spaces around a value are not part of it: a file written ``q1, -1, 3`` (a space
    after each comma) read verbatim would have label ``" -1"``, which is not the junk
    label ``-1`` and not the label ``-1`` of a file written without spaces, so such
    items would silently count as distractors or lose their matches.
    """

    def parse(on_warning: Literal["error", "ignore"]) -> pd.DataFrame:
        with warnings.catch_warnings():
            # pandas warns when rows are longer than the header (and drops their ends)
            warnings.simplefilter(on_warning, pd.errors.ParserWarning)
            return pd.read_csv(
                path,
                dtype=str,
                keep_default_na=False,
                na_filter=False,
                encoding="utf-8-sig",
                index_col=False,  # never the first column as the index
            )

    error: Exception
    try:
        names = [h.strip() for h in _csv_header(path)]
        for i, col in enumerate(names):
            if col and col in names[:i]:
                raise RankwiseError(
                    f"{path}: the header names column {col!r} twice; rename or remove "
                    f"one (header: {', '.join(names)})"
                )
        try:
            table = parse("error")
        except pd.errors.ParserWarning:
            _refuse_long_rows(path, noun, fix)
            table = parse("ignore")  # some other warning: read as usual
        table.columns = [str(c).strip() for c in table.columns]
        table.attrs["csv_path"] = str(path)  # for the line numbers of error messages
        return _stripped(table, path)
    except pd.errors.ParserError as exc:
        _refuse_long_rows(path, noun, fix)  # e.g. "Expected 3 fields in line 5, saw 4"
        error = exc
    except UnicodeDecodeError as exc:
        line = first_non_utf8_line(path)
        if line is not None:
            raise not_utf8(path, noun, line) from None
        error = exc
    except (pd.errors.EmptyDataError, csv.Error) as exc:
        error = exc
    raise RankwiseError(
        f"{path}: not a readable {noun} ({first_line(error)})" + (f"; {fix}" if fix else "")
    ) from None


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


def _stripped(table: pd.DataFrame, path: Path | None = None) -> pd.DataFrame:
    """``table`` (all strings) with the spaces and tabs around each value removed.

    Only ASCII spaces and tabs (``str.strip()`` would also take a no-break space, which
    the byte scan below does not look for: the same value would read differently
    depending on the rest of the file).  Stripping costs ~0.4 s per million rows; a file
    ``path`` with no space or tab in it (the usual case) needs none, which a byte scan
    tells in milliseconds.
    """
    if path is not None and not _has_blanks(path):
        return table
    for col in table.columns:
        table[col] = table[col].str.strip(" \t")
    return table


def _has_blanks(path: Path) -> bool:
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            if b" " in block or b"\t" in block:
                return True
    return False


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


def _csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each non-blank row (pandas skips blank lines too); the
    line a row starts on (a quoted value may span lines)."""
    with open(path, newline="", encoding="utf-8-sig") as handle, any_field_size():
        reader = csv.reader(handle)
        start = 1
        for row in reader:
            if len(row) > 1 or any(field.strip() for field in row):
                yield start, row
            start = reader.line_num + 1


def _csv_header(path: Path) -> list[str]:
    for _, row in _csv_rows(path):
        return row
    return []


def _refuse_long_rows(path: Path, noun: str, fix: str) -> None:
    """Raise naming the first row with more fields than the header, if there is one
    (nothing when the csv module cannot read the file either: the caller's pandas
    error names the problem)."""
    header: list[str] | None = None
    first, n_long, n_rows = None, 0, 0
    try:
        for line, row in _csv_rows(path):
            if header is None:
                header = [h.strip() for h in row]
                continue
            n_rows += 1
            if len(row) > len(header):
                n_long += 1
                first = first or (line, len(row))
    except csv.Error:
        return
    if first is not None and header is not None:
        scope = "every row has" if n_long == n_rows else f"{n_long} of {n_rows} rows have"
        raise RankwiseError(
            f"{path}: not a readable {noun} (line {first[0]} has {first[1]} fields but the "
            f"header names {len(header)}: {', '.join(header)}; {scope} more fields than the "
            f"header, so values cannot be matched to columns); {fix + ', ' if fix else ''}"
            "as many fields in each row as the header names: remove the extra delimiters "
            "at the end of those rows, or name every column in the header"
        )


def _check_unique_columns(columns: list[str], name: str) -> None:
    for i, col in enumerate(columns):
        if col in columns[:i]:
            raise RankwiseError(
                f"{name}: column {col!r} appears twice (after stripping spaces); rename "
                "or remove one"
            )


def _refuse_nul(table: pd.DataFrame, name: str) -> None:
    """A NUL character names no file (the OS refuses it) and numpy's fixed-width
    strings drop it at the end of a value, so two ids could silently become one."""
    path = table.attrs.get("csv_path")
    if path:  # one scan of the file's bytes spares a scan of every column of big files
        try:
            if b"\0" not in Path(path).read_bytes():
                return
        except OSError:
            pass
    for col in table.columns:
        if pd.api.types.is_numeric_dtype(table[col]):
            continue
        nul = np.flatnonzero(table[col].astype(str).str.contains("\x00", regex=False).to_numpy())
        if len(nul):
            raise RankwiseError(
                f"{name}: row {row_line(nul[0], table)}: column {col!r} contains a NUL "
                "character (byte 0); remove it from the file"
            )


def check_nonempty(table: pd.DataFrame, columns, name: str) -> None:
    """Refuse an empty (or blank) value in ``columns``, naming the first row."""
    for col in columns:
        empty = np.flatnonzero(table[col].astype(str).str.strip().to_numpy() == "")
        if len(empty):
            raise RankwiseError(
                f"{name}: row {row_line(empty[0], table)}: empty {col!r}; every item needs "
                f"{'an' if col[0] in 'aeiou' else 'a'} {col}"
            )


def row_line(i: int, table: pd.DataFrame | None = None) -> int | str:
    """1-based line number in the CSV file of data row ``i`` (the header's line + 1 + i
    when no blank line or multi-line value comes between; read from the file, which
    ``table.attrs["csv_path"]`` names, when one does); ``"<i> (0-based)"`` for a
    manifest given as a DataFrame (``table.attrs["rows"]``), which has no lines."""
    if table is not None and table.attrs.get("rows") == _POSITIONS:
        return f"{int(i)} (0-based)"
    path = table.attrs.get("csv_path") if table is not None else None
    if path:
        try:
            lines = [line for line, _ in _csv_rows(Path(path))][1:]
            if i < len(lines):
                return lines[int(i)]
        except (OSError, UnicodeDecodeError, csv.Error):
            pass
    return int(i) + 2


def _to_int(column: pd.Series, name: str, col: str, table: pd.DataFrame | None = None) -> pd.Series:
    """``column`` as int64; each value an integer within ``-MAX_INTEGER..MAX_INTEGER``."""
    values = column.astype(str).str.strip()
    ok = values.str.fullmatch(r"[+-]?\d+").to_numpy()
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise RankwiseError(
            f"{name}: row {row_line(i, table)}: column {col!r} must be an integer, found "
            f"{values.iloc[i]!r}"
        )
    # At most 18 significant digits convert to int64 exactly; longer ones are out of range.
    digits = values.str.replace(r"^[+-]?0*", "", regex=True).str.len().to_numpy()
    short = digits <= 18
    numbers = np.zeros(len(values), dtype=np.int64)
    numbers[short] = values[short].astype(np.int64).to_numpy()
    bad = ~short | (np.abs(numbers) > MAX_INTEGER)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise RankwiseError(
            f"{name}: row {row_line(i, table)}: column {col!r} value {values.iloc[i]} is out of "
            f"range; {col} must be between {-MAX_INTEGER} and {MAX_INTEGER} (renumber, e.g. "
            f"subtract the first {col})"
        )
    return pd.Series(numbers, index=column.index)
