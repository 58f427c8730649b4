"""The manifest table and its first-appearance numbering (rankwise.table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rankwise.table import Table, factorize, is_dataframe


def test_factorize_numbers_by_first_appearance_as_pandas_did():
    rng = np.random.default_rng(0)
    values = np.array([f"id{k}" for k in rng.integers(0, 50, 500)], dtype=object)
    codes, uniques = factorize(values)
    ref_codes, ref_uniques = pd.factorize(values)
    np.testing.assert_array_equal(codes, ref_codes)
    assert uniques.tolist() == ref_uniques.tolist()
    assert codes.dtype == np.int64 and (uniques[codes] == values).all()
    # not sorted (np.unique's order): seeded draws and stored unit keys depend on it
    assert factorize(["b", "a", "b", "c"])[0].tolist() == [0, 1, 0, 2]
    assert factorize(iter(["b", "a"]))[1].tolist() == ["b", "a"]
    empty_codes, empty_uniques = factorize(np.array([], dtype=object))
    assert empty_codes.shape == (0,) and empty_uniques.shape == (0,)


def test_a_table_holds_columns_and_selects_rows():
    table = Table(
        {"id": np.array(["a", "b", "c"], dtype=object), "frame": np.array([3, 1, 2])},
        csv_path="m.csv",
    )
    assert len(table) == 3 and table.columns == ["id", "frame"]
    assert "id" in table and "label" not in table
    part = table.take(np.array([2, 0]))
    assert part["id"].tolist() == ["c", "a"] and part["frame"].tolist() == [2, 3]
    assert part.csv_path == "m.csv" and not part.positions  # as DataFrame.iloc kept attrs
    with pytest.raises(ValueError, match="2 values for a table of 3 rows"):
        table["label"] = np.array(["x", "y"], dtype=object)
    with pytest.raises(ValueError, match="unequal lengths"):
        Table({"id": np.array(["a"]), "label": np.array(["1", "2"])})
    frame = table.to_frame()
    assert frame.to_dict("list") == {"id": ["a", "b", "c"], "frame": [3, 1, 2]}
    assert is_dataframe(frame) and not is_dataframe(table)
