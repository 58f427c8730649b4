"""Query / gallery manifests: one CSV row per item, in embedding row order.

Columns (DESIGN.md): ``id`` and ``label`` always; ``camera`` for ``reid``;
``sequence`` and integer ``frame`` for ``reassociation``; ``sketch`` and integer
``step`` for ``progressive`` queries; ``path`` when encoding images.  Every value
is read as a string (labels compare as strings); other columns are kept.

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

Checked in every case: a readable CSV with a header, at least one row, no empty value
in a required column, unique ids, integers in the required integer columns.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import RankwiseError
from .registry import INTEGER_COLUMNS as _INTEGER_COLUMNS
from .registry import PROTOCOLS, REGISTRY, ROLES, get_protocol

__all__ = ["PROTOCOLS", "check_nonempty", "check_protocol", "read_manifest", "required_columns"]


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
        table = source.astype(str).reset_index(drop=True)
        for col in source.columns:  # keep integer columns given as numbers exact
            if col in _INTEGER_COLUMNS and pd.api.types.is_integer_dtype(source[col]):
                table[col] = source[col].astype(str).to_numpy()
    else:
        path = Path(source)
        if not path.is_file():
            raise RankwiseError(f"{path}: {what} not found; pass an existing CSV file")
        try:
            # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the first
            # column's name.
            table = pd.read_csv(
                path, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig"
            )
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankwiseError(
                f"{path}: not a readable CSV manifest ({first}); "
                "write one header line and one row per item"
            ) from None
    table.columns = [str(c).strip() for c in table.columns]
    needed = required_columns(protocol, role) + tuple(extra_columns)
    missing = [c for c in needed if c not in table.columns]
    if missing:
        by = f"protocol {protocol!r}" if protocol is not None else "every protocol"
        raise RankwiseError(
            f"{name}: missing column(s) {', '.join(missing)} required by "
            f"{by} for the {role or 'query and the gallery'}; add them "
            f"(found: {', '.join(table.columns) or 'none'})"
        )
    if len(table) == 0:
        raise RankwiseError(f"{name}: the {what} has no rows; it needs at least one item")
    check_nonempty(table, [c for c in needed if c not in _INTEGER_COLUMNS], name)
    ids = table["id"].to_numpy()
    dup = pd.Series(ids).duplicated(keep="first").to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(ids == ids[i])[0])
        raise RankwiseError(
            f"{name}: duplicate id {ids[i]!r} at rows {_row(first)} and "
            f"{_row(i)}; ids must be unique within a manifest"
        )
    for col in _INTEGER_COLUMNS:
        if col in needed:
            table[col] = _to_int(table[col], name, col)
    return table


def check_nonempty(table: pd.DataFrame, columns, name: str) -> None:
    """Refuse an empty (or blank) value in ``columns``, naming the first row."""
    for col in columns:
        empty = np.flatnonzero(table[col].astype(str).str.strip().to_numpy() == "")
        if len(empty):
            raise RankwiseError(
                f"{name}: row {_row(empty[0])}: empty {col!r}; every item needs a {col}"
            )


def _row(i: int) -> int:
    """1-based line number in the CSV file of data row ``i`` (line 1 is the header)."""
    return int(i) + 2


def _to_int(column: pd.Series, name: str, col: str) -> pd.Series:
    values = column.astype(str).str.strip()
    ok = values.str.fullmatch(r"[+-]?\d+").to_numpy()
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise RankwiseError(
            f"{name}: row {_row(i)}: column {col!r} must be an integer, found {values.iloc[i]!r}"
        )
    return values.astype(np.int64)
