"""Query / gallery manifests: one CSV row per item, in embedding row order.

Columns (DESIGN.md): ``id`` and ``label`` always; ``camera`` for ``reid``;
``sequence`` and integer ``frame`` for ``reassociation``; ``sketch`` and integer
``step`` for ``progressive`` queries; ``path`` when encoding images.  Every value
is read as a string (labels compare as strings); other columns are kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import RankwiseError
from .registry import INTEGER_COLUMNS as _INTEGER_COLUMNS
from .registry import PROTOCOLS, get_protocol

__all__ = ["PROTOCOLS", "check_protocol", "read_manifest", "required_columns"]


def check_protocol(protocol: str) -> str:
    """Return ``protocol`` or raise listing the valid ones."""
    return get_protocol(protocol).name


def required_columns(protocol: str, role: str) -> tuple[str, ...]:
    """Columns a manifest must have for ``protocol`` in ``role`` ('query'/'gallery')."""
    return get_protocol(protocol).required_columns(role)


def read_manifest(source: str | os.PathLike | pd.DataFrame, *, protocol: str, role: str,
                  extra_columns: tuple[str, ...] = ()) -> pd.DataFrame:
    """Read and validate a manifest.

    Parameters
    ----------
    source : path to a CSV file, or a DataFrame with the same columns.
    protocol : one of ``PROTOCOLS``; decides the required columns.
    role : ``"query"`` or ``"gallery"``.

    Returns
    -------
    DataFrame of strings (integer columns ``frame``/``step`` as int64), index 0..N-1.
    """
    name = str(source) if not isinstance(source, pd.DataFrame) else f"<{role} table>"
    if isinstance(source, pd.DataFrame):
        table = source.astype(str).reset_index(drop=True)
        for col in source.columns:  # keep integer columns given as numbers exact
            if col in _INTEGER_COLUMNS and pd.api.types.is_integer_dtype(source[col]):
                table[col] = source[col].astype(str).to_numpy()
    else:
        path = Path(source)
        if not path.is_file():
            raise RankwiseError(f"{path}: {role} manifest not found; pass an existing CSV file")
        try:
            # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the first
            # column's name.
            table = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False,
                                encoding="utf-8-sig")
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankwiseError(f"{path}: not a readable CSV manifest ({first}); "
                                "write one header line and one row per item") from None
    table.columns = [str(c).strip() for c in table.columns]
    needed = required_columns(protocol, role) + tuple(extra_columns)
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise RankwiseError(f"{name}: missing column(s) {', '.join(missing)} required by "
                            f"protocol {protocol!r} for the {role}; add them "
                            f"(found: {', '.join(table.columns) or 'none'})")
    if len(table) == 0:
        raise RankwiseError(f"{name}: the {role} manifest has no rows; it needs at least one item")
    for col in needed:
        if col in _INTEGER_COLUMNS:
            continue
        empty = np.flatnonzero(table[col].str.strip().to_numpy() == "")
        if len(empty):
            raise RankwiseError(f"{name}: row {_row(empty[0])}: empty {col!r}; every item "
                                f"needs a {col}")
    ids = table["id"].to_numpy()
    dup = pd.Series(ids).duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(ids == ids[i])[0])
        raise RankwiseError(f"{name}: duplicate id {ids[i]!r} at rows {_row(first)} and "
                            f"{_row(i)}; ids must be unique within a manifest")
    for col in _INTEGER_COLUMNS:
        if col in needed:
            table[col] = _to_int(table[col], name, col)
    return table


def _row(i: int) -> int:
    """1-based line number in the CSV file of data row ``i`` (line 1 is the header)."""
    return int(i) + 2


def _to_int(column: pd.Series, name: str, col: str) -> pd.Series:
    values = column.astype(str).str.strip()
    ok = values.str.fullmatch(r"[+-]?\d+").to_numpy()
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise RankwiseError(f"{name}: row {_row(i)}: column {col!r} must be an integer, "
                            f"found {values.iloc[i]!r}")
    return values.astype(np.int64)
