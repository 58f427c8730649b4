"""A manifest's rows in memory: column name -> ``(N,)`` numpy array, without pandas.

What :func:`rankwise.manifest.read_manifest` returns and every command ranks or
encodes from.  pandas would cost ~0.15-0.2 s of each command's start-up (and each
Snakemake job's) for a handful of column operations, which this module's
:class:`Table` and :func:`factorize` do: columns, a row subset, and the equal-values
numbering ``pandas.factorize`` gave.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["Table", "factorize", "is_dataframe"]


class Table:
    """Ordered columns of equal length: ``(N,)`` object arrays of ``str`` (int64 for the
    integer columns ``frame``/``step`` once :func:`~rankwise.manifest.read_manifest`
    has checked them).

    ``table["id"]`` is the column's array, ``"id" in table`` asks for a column,
    ``table.columns`` lists their names in file order, ``len(table)`` counts rows and
    :meth:`take` selects rows.  ``csv_path`` names the file the rows were read from and
    ``positions`` says they came from memory (a DataFrame): error messages then name a
    row by its line in the file or by its 0-based position
    (:func:`rankwise.manifest.row_line`).  ``source_rows``: after :meth:`take`, the row
    of the table as read that each row is (``None``: the same row), which those
    messages name.
    """

    def __init__(
        self,
        columns: Mapping[str, np.ndarray],
        *,
        n_rows: int | None = None,
        csv_path: str | None = None,
        positions: bool = False,
        source_rows: np.ndarray | None = None,
    ) -> None:
        self._columns = dict(columns)
        lengths = sorted({len(values) for values in self._columns.values()})
        if n_rows is None:  # a table without columns has the rows it is told
            n_rows = lengths[0] if lengths else 0
        if set(lengths) - {n_rows}:
            raise ValueError(f"columns of unequal lengths {lengths}")
        self._n_rows = n_rows
        self.csv_path = csv_path
        self.positions = positions
        self.source_rows = source_rows

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return self._n_rows

    def __getitem__(self, column: str) -> np.ndarray:
        return self._columns[column]

    def __setitem__(self, column: str, values: np.ndarray) -> None:
        if len(values) != self._n_rows:
            raise ValueError(f"{len(values)} values for a table of {self._n_rows} rows")
        self._columns[column] = values

    def __contains__(self, column: object) -> bool:
        return column in self._columns

    def __repr__(self) -> str:
        return f"Table({self._n_rows} rows: {', '.join(self._columns)})"

    def take(self, rows: np.ndarray) -> Table:
        """Rows ``rows`` ``(M,)`` int, in that order, as a table of ``M`` rows; messages
        about its row ``i`` name the row it was in the table as read (``source_rows``),
        in the same file."""
        rows = np.asarray(rows, dtype=np.int64)
        return Table(
            {name: values[rows] for name, values in self._columns.items()},
            n_rows=len(rows),
            csv_path=self.csv_path,
            positions=self.positions,
            source_rows=rows if self.source_rows is None else self.source_rows[rows],
        )

    def to_frame(self):
        """A pandas DataFrame of the same columns (imports pandas: loaders and tests)."""
        import pandas as pd

        return pd.DataFrame(self._columns, index=pd.RangeIndex(self._n_rows))


def factorize(values: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """``(codes (N,) int64, uniques (U,) object)`` with ``uniques[codes] == values``,
    numbered by first appearance as ``pandas.factorize`` numbers them (not sorted, as
    ``np.unique`` would: seeded draws and stored unit keys depend on this order).

    A dict of the distinct values, which keeps them in insertion order: O(N) hashing,
    ~0.3 s per million distinct strings (pandas: ~0.15 s).
    """
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    code = dict.fromkeys(items)
    code.update(zip(code, range(len(code)), strict=True))  # same keys: order kept
    codes = np.fromiter(map(code.__getitem__, items), dtype=np.int64, count=len(items))
    return codes, np.fromiter(code, dtype=object, count=len(code))


def is_dataframe(source: object) -> bool:
    """Whether ``source`` is a pandas DataFrame, without importing pandas (a caller
    that made one has imported it)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(source, pd.DataFrame)
