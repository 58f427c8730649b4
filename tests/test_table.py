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
    assert part.csv_path == "m.csv" and not part.positions
    assert part.source_rows.tolist() == [2, 0] and part.take([1]).source_rows.tolist() == [0]
    with pytest.raises(ValueError, match="2 values for a table of 3 rows"):
        table["label"] = np.array(["x", "y"], dtype=object)
    with pytest.raises(ValueError, match=r"unequal lengths \[1, 2, 3\]"):
        Table({"id": np.array(["a"]), "label": np.array(["1", "2"]), "x": np.arange(3)})
    frame = table.to_frame()
    assert frame.to_dict("list") == {"id": ["a", "b", "c"], "frame": [3, 1, 2]}
    assert is_dataframe(frame) and not is_dataframe(table)


def test_a_subsets_messages_name_the_line_of_the_file(tmp_path):
    """Rows taken from a manifest (an id-keyed store that dropped rows, pooled queries)
    are named in messages by their line in the file: row i of the subset was named as
    row i of the file (both before and with pandas' iloc, which kept the file's name)."""
    from rankwise.errors import RankwiseError
    from rankwise.manifest import read_manifest
    from rankwise.protocols import build_problem

    (tmp_path / "q.csv").write_text(
        "id,label,sketch,step\nq0,0,a,0\nq1,1,b,0\nq2,1,b,1\nq3,1,b,1\n"
    )
    (tmp_path / "g.csv").write_text("id,label\ng0,0\ng1,1\n")
    query = read_manifest(tmp_path / "q.csv", protocol="progressive", role="query")
    gallery = read_manifest(tmp_path / "g.csv", protocol="progressive", role="gallery")
    with pytest.raises(RankwiseError, match=r"^query manifest: row 5: sketch 'b' has step 1 twice"):
        build_problem(query.take(np.array([1, 2, 3])), gallery, "progressive")


def test_a_table_is_a_manifest_for_the_statistics_labels(tmp_path):
    """`read_manifest` returns a Table, which `query_labels` took for a sequence of
    labels ("an array of shape ()"), where the DataFrame it returned before worked."""
    from rankwise.manifest import read_manifest
    from rankwise.stats import query_labels

    (tmp_path / "q.csv").write_text("id,label,camera\nq0,7,1\nq1,8,1\n")
    table = read_manifest(tmp_path / "q.csv", protocol="reid", role="query")
    labels = query_labels({"protocol": "reid", "num_query_rows": 2}, table)
    assert labels.tolist() == ["7", "8"]
