"""The Python API's inputs in the forms the README allows (DataFrames, arrays, ``ks``):
each gives the numbers of the same data as CSV files, or one error line naming it."""

import numpy as np
import pandas as pd
import pytest

import rankwise
from rankwise.errors import RankwiseError

# GALLERY has a camera column under the default protocol: the hint it gives is tested
# below (pytest.warns and simplefilter("error") still see it), elsewhere it is noise
pytestmark = pytest.mark.filterwarnings("ignore::rankwise.ProtocolHint")

QUERY_EMB = np.eye(3, dtype=np.float32)
GALLERY = pd.DataFrame({"id": ["g0", "g1", "g2"], "label": ["a", "b", "c"], "camera": [1, 2, 3]})


def _query(**columns):
    return pd.DataFrame({"id": ["q0", "q1", "q2"], "label": ["a", "b", "c"], **columns})


@pytest.mark.parametrize(
    "query, protocol, column",
    [
        # None, NaN and pd.NA were read as the labels "None", "nan", "<NA>": such items
        # matched each other (or nothing) instead of being refused like an empty cell
        (_query(label=["a", None, "c"]), "recall", "label"),
        (_query(label=[1.0, np.nan, 3.0]), "recall", "label"),
        (_query(label=pd.array([1, None, 3], dtype="Int64")), "recall", "label"),
        (_query(label=pd.Categorical(["a", None, "c"])), "recall", "label"),
        (pd.DataFrame({"id": ["q0", None, "q2"], "label": ["a", "b", "c"]}), "recall", "id"),
        (_query(camera=[1.0, np.nan, 3.0]), "reid", "camera"),
    ],
)
def test_a_missing_value_in_a_dataframe_is_an_empty_cell(query, protocol, column):
    with pytest.raises(RankwiseError, match=rf"<query table>: row .*: empty '{column}'"):
        rankwise.evaluate(query, GALLERY, QUERY_EMB, QUERY_EMB, protocol=protocol)


def test_missing_values_in_other_columns_are_kept_and_ignored():
    query = _query(note=[None, np.nan, "x"])
    expected = rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB).to_json()
    assert rankwise.evaluate(query, GALLERY, QUERY_EMB, QUERY_EMB).to_json() == expected


@pytest.mark.parametrize("manifest", [None, {"id": ["q0"], "label": ["a"]}, _query()["label"]])
def test_a_manifest_neither_path_nor_dataframe_is_one_line(manifest):
    with pytest.raises(RankwiseError, match=r"query manifest must be a CSV file path or a pandas"):
        rankwise.evaluate(manifest, GALLERY, QUERY_EMB, QUERY_EMB)


def test_a_dataframe_naming_a_column_twice_is_one_line():
    # the same name exactly (not only after stripping): an AttributeError from pandas
    query = pd.DataFrame([["q0", "a", "a"]], columns=["id", "label", "label"])
    with pytest.raises(RankwiseError, match=r"<query table>: column 'label' appears twice"):
        rankwise.evaluate(query, GALLERY, QUERY_EMB[:1], QUERY_EMB)


@pytest.mark.parametrize(
    "query, gallery, protocol, message",
    [
        # named "row 3", the line a CSV file would have: another row of the table
        (
            _query(label=["a", "", "c"]).set_index(pd.Index([7, 8, 9])),
            GALLERY,
            "recall",
            r"row 1 \(0-based\): empty 'label'",
        ),
        (
            _query(id=["q0", "q1", "q1"]),
            GALLERY,
            "recall",
            r"duplicate id 'q1' at rows 1 \(0-based\) and 2 \(0-based\)",
        ),
        (
            _query(id=["q0", "q1", "g2"], label=["a", "b", "b"]),
            GALLERY,
            "recall",
            r"id 'g2' is a query \(row 2 \(0-based\), .*gallery item \(row 2 \(0-based\)",
        ),
        (
            _query(sketch=[1, 1, 2], step=[1, 1, 1], label=["a", "a", "c"]),
            GALLERY,
            "progressive",
            r"query table: row 1 \(0-based\): sketch '1' has step 1 twice",
        ),
        (
            _query(label=["a", "a", "c"], camera=[1, 1, 2]),
            GALLERY.assign(id=["g0", "q1", "g2"]),
            "reid",
            r"gallery table: row 1 \(0-based\): id 'q1' is also a query item",
        ),
    ],
)
def test_errors_name_a_dataframe_row_by_its_position(query, gallery, protocol, message):
    options = {"multi_query": "mean"} if "camera" in query else {}
    with pytest.raises(RankwiseError, match=message):
        rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB, protocol=protocol, **options)


@pytest.mark.parametrize("ks", [None, 5.0, True])
def test_ks_neither_integers_nor_text_is_one_line(ks):
    # a TypeError ("'NoneType' object is not iterable") before
    with pytest.raises(
        RankwiseError, match=r"ks must be positive integers .*; got (None|5\.0|True)"
    ):
        rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB, ks=ks)


@pytest.mark.parametrize(
    "labels, options, message",
    [
        # None / NaN were the labels "None" / "nan": items without one matched each other
        ([["a", None, "c"], ["a", "b", "c"]], {}, r"query_labels\[1\] is missing \(None\)"),
        ([["a", "b", "c"], [1.0, 2.0, np.nan]], {}, r"gallery_labels\[2\] is missing \(nan\)"),
        ([["a", "b", "c"], ["a", "b", "c"]], {"query_ids": ["q0", None, "q2"]}, r"query_ids\[1\]"),
        # pandas' "All arrays must be of the same length", numpy's "len() of unsized object"
        ([["a", "b", "c"], ["a", "b"]], {}, r"gallery_labels must be 1-D with 3 values, one per"),
        ([["a", "b", "c"], ["a", "b", "c"]], {"gallery_ids": ["g0"]}, r"gallery_ids must be 1-D"),
        (
            [[["a"], ["b"], ["c"]], ["a", "b", "c"]],
            {},
            r"query_labels must be 1-D .* shape \(3, 1\)",
        ),
        (["abc", ["a", "b", "c"]], {}, r"query_labels must be 1-D .* got shape \(\)"),
    ],
)
def test_recall_at_k_refuses_labels_and_ids_in_one_line(labels, options, message):
    with pytest.raises(RankwiseError, match=message):
        rankwise.recall_at_k(QUERY_EMB, QUERY_EMB, *labels, **options)


def test_recall_at_k_numbers_its_items_apart_from_the_other_sides_ids():
    # Without query ids, query i was "q<i>": the gallery item with id "q0" was taken for
    # query 0 itself and left out of its ranking (recall@1 0 instead of 100).
    query, gallery = np.array([[1.0, 0.0]]), np.array([[1.0, 0.0], [1.0, 0.5], [0.0, 1.0]])
    got = rankwise.recall_at_k(
        query, gallery, ["a"], ["a", "b", "a"], ks=(1,), gallery_ids=["q0", "x", "y"]
    )
    assert got == {"recall@1": 100.0}


def test_to_json_is_a_copy():
    result = rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB)
    metrics = dict(result.metrics)
    report = result.to_json()
    report["metrics"]["rank1"] = -1.0
    assert result.metrics == metrics and result.to_json()["metrics"] == metrics


def test_whole_float_labels_are_the_integer_labels():
    # pandas stores integers with a gap as float64: the labels were "1.0" against the
    # gallery's "1" (no query had a relevant item) and -1.0 was not the junk label -1
    query = pd.DataFrame({"id": ["q0", "q1", "q2"], "label": [1, 2, 3], "camera": [1, 1, 1]})
    gallery = pd.DataFrame(
        {"id": ["g0", "g1", "g2", "g3"], "label": [1, 2, 3, -1], "camera": [2, 2, 2, 2]}
    )
    emb = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    emb[3] = emb[0] + 1e-3
    qemb = np.concatenate([emb[3:], emb[1:3]])  # q0 is the junk item: nearer than g0
    expected = rankwise.evaluate(query, gallery, qemb, emb, protocol="reid").to_json()
    assert expected["metrics"]["rank1"] == 100
    as_floats = {
        "label": gallery["label"].astype(float),
        "camera": gallery["camera"].astype(float),
    }
    for q, g in [
        (query.assign(label=query["label"].astype(float)), gallery),
        (query, gallery.assign(**as_floats)),
        # both sides float: the labels matched, but g3 ("-1.0") was ranked ahead of g0
        (query.assign(label=query["label"].astype(float)), gallery.assign(**as_floats)),
    ]:
        assert rankwise.evaluate(q, g, qemb, emb, protocol="reid").to_json() == expected
    got = rankwise.recall_at_k(emb[:3], emb, [1.0, 2.0, 3.0], ["1", "2", "3", "-1"], ks=(1,))
    assert got == rankwise.recall_at_k(emb[:3], emb, [1, 2, 3], [1, 2, 3, -1], ks=(1,))


def test_floats_that_are_not_whole_stay_as_written():
    query = _query(label=[0.5, 2.5, 2.0])
    gallery = GALLERY.assign(label=["0.5", "1", "2.0"])
    result = rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB)
    # the query labels read "0.5", "2.5", "2.0": the second has no gallery item
    assert (result.num_queries, result.num_skipped) == (2, 1)
    assert result.per_query["query_index"].tolist() == [0, 2]


@pytest.mark.parametrize(
    "qlabels, glabels, shown",
    [
        # a CSV that pandas wrote from a float column ("3.0") against integer labels ("3")
        (["1.0", "2.0", "3.0"], [1, 2, 3], "query label '1.0' and gallery label '1'"),
        # one label only: the others match, so the query was silently skipped
        (["a", "b", "3"], ["a", "b", "3.0"], "query label '3' and gallery label '3.0'"),
        # floats that are not all whole stay as written: 1.0 is then "1.0"
        ([0.5, 1.0, 2.0], ["0.5", "1", "2.0"], "query label '1.0' and gallery label '1'"),
    ],
)
def test_labels_that_differ_only_by_a_trailing_dot_zero_are_refused(qlabels, glabels, shown):
    with pytest.raises(
        RankwiseError,
        match=rf"{shown} differ only by a trailing '\.0' \(a column written from floats "
        r"against one written from integers\), so they would not match; write both sides' "
        r"labels as integers",
    ):
        rankwise.evaluate(
            _query(label=qlabels), GALLERY.assign(label=glabels), QUERY_EMB, QUERY_EMB
        )
    with pytest.raises(RankwiseError, match=r"no query has a valid match") as error:
        rankwise.evaluate(_query(label=["x", "y", "z"]), GALLERY, QUERY_EMB, QUERY_EMB)
    assert "trailing" not in str(error.value)


def test_cameras_that_differ_only_by_a_trailing_dot_zero_are_refused(tmp_path):
    # the same-camera rule compared "1" with "1.0": never the same camera, so every
    # same-camera match was silently kept
    query = _query(camera=[1, 2, 3])
    with pytest.raises(
        RankwiseError, match=r"query camera '1' and gallery camera '1\.0' differ only by"
    ):
        rankwise.evaluate(
            query, GALLERY.assign(camera=["1.0", "2.0", "3.0"]), QUERY_EMB, QUERY_EMB,
            protocol="reid",
        )  # fmt: skip
    # the camera rule off: cameras are not compared, nothing to refuse
    rankwise.evaluate(
        query, GALLERY.assign(camera=["1.0", "2.0", "3.0"]), QUERY_EMB, QUERY_EMB,
        protocol="reid", exclude_same_camera=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "qcameras, gcameras, shown",
    [
        # MSMT17 cameras read from its file names ("01") against the msmt17 loader's ("1")
        (["01", "02", "03"], [1, 2, 3], "query camera '01' and gallery camera '1'"),
        (["+1", "2", "3"], ["1", "2", "3"], "query camera '\\+1' and gallery camera '1'"),
        ([1, 2, 3], ["1", "002", "3"], "query camera '2' and gallery camera '002'"),
    ],
)
def test_cameras_that_differ_only_by_leading_zeros_are_refused(qcameras, gcameras, shown):
    # the same-camera rule compared "01" with "1": never the same camera, so every
    # same-camera match was silently kept (rank1 100 here, where every match is one)
    gallery = GALLERY.assign(camera=gcameras)
    with pytest.raises(
        RankwiseError,
        match=rf"{shown} are the same integer written differently \(leading zeros or a "
        r"sign\), so they would not match \(cameras are compared as written\); write both "
        r"sides' cameras the same way",
    ):
        rankwise.evaluate(_query(camera=qcameras), gallery, QUERY_EMB, QUERY_EMB, protocol="reid")
    # written the same way, every match is a same-camera one: no query can be evaluated
    with pytest.raises(RankwiseError, match=r"no query has a valid match"):
        rankwise.evaluate(_query(camera=gcameras), gallery, QUERY_EMB, QUERY_EMB, protocol="reid")
    # the camera rule off: cameras are not compared, nothing to refuse
    result = rankwise.evaluate(
        _query(camera=qcameras), gallery, QUERY_EMB, QUERY_EMB,
        protocol="reid", exclude_same_camera=False,
    )  # fmt: skip
    assert result.metrics["rank1"] == 100.0


def test_labels_that_differ_only_by_leading_zeros_are_refused():
    # Market-1501 person ids as in the file names ("0002") against the loaders' ("2"):
    # those queries were silently skipped, the others evaluated
    query = _query(label=["0001", "0002", "3"])
    gallery = GALLERY.assign(label=["1", "2", "3"])
    with pytest.raises(
        RankwiseError,
        match=r"query label '0001' and gallery label '1' are the same integer written "
        r"differently",
    ):
        rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB)
    # a spelling both sides write matches as written (tests/test_toy.py: the gallery's
    # "07" and "7"); text labels are labels of their own
    both = GALLERY.assign(label=["1", "0001", "J01"])
    result = rankwise.evaluate(_query(label=["0001", "2", "J1"]), both, QUERY_EMB, QUERY_EMB)
    assert (result.num_queries, result.num_skipped) == (1, 2)
    assert result.per_query["query_index"].tolist() == [0]


def test_a_junk_label_written_with_leading_zeros_is_refused():
    # Market-1501's distractors "0000" (file names) against the loaders' "0": the junk
    # label matched nothing, so the rows meant to be left out were silently ranked
    gallery = GALLERY.assign(label=["a", "b", "0"])
    query = _query(camera=[2, 3, 1])
    with pytest.raises(
        RankwiseError,
        match=r"gallery table: junk label '0000' matches no gallery label, but '0' does \(the "
        r"same integer written differently: leading zeros or a sign\): give the junk label "
        r"as '0'",
    ):
        rankwise.evaluate(
            query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=["-1", "0000"]
        )
    # given as written, it is the junk label
    result = rankwise.evaluate(
        query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=["-1", "0"]
    )
    assert result.num_gallery == 2


def test_a_junk_label_written_otherwise_than_the_gallery_labels_is_refused():
    gallery = GALLERY.assign(label=["a", "b", "-1.0"])
    query = _query(camera=[2, 3, 1])
    with pytest.raises(
        RankwiseError,
        match=r"gallery table: junk label '-1' matches no gallery label, but '-1\.0' does",
    ):
        rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid")
    # given as written, it is the junk label
    result = rankwise.evaluate(
        query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=["-1.0"]
    )
    assert result.num_gallery == 2
    # both spellings given (one junk list for galleries written either way): the one
    # written is junked, the other matching nothing is not an error
    for junk in (["-1", "-1.0"], ["-1.0", "-1"]):
        result = rankwise.evaluate(
            query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=junk
        )
        assert result.num_gallery == 2


@pytest.mark.parametrize(
    "column",
    [
        pd.Categorical([1.0, 2.0, 3.0]),
        pd.Series([1.0, 2.0, 3.0], dtype=object),
        pd.Series([1, 2.0, 3], dtype=object),
    ],
)
def test_categorical_and_object_columns_of_whole_floats_read_as_integers(column):
    # astype(str) wrote "1.0" for them, where a float column reads "1"
    gallery = GALLERY.assign(label=["1", "2", "3"], camera=["1", "2", "3"])
    as_ints = _query(label=[1, 2, 3], camera=[3, 1, 2])
    expected = rankwise.evaluate(as_ints, gallery, QUERY_EMB, QUERY_EMB, protocol="reid")
    got = rankwise.evaluate(
        as_ints.assign(label=column), gallery, QUERY_EMB, QUERY_EMB, protocol="reid"
    )
    assert got.to_json() == expected.to_json()
    # as cameras, 1, 2, 3 against the gallery's 1, 2, 3: every match is same-camera
    with pytest.raises(RankwiseError, match=r"no query has a valid match"):
        rankwise.evaluate(
            as_ints.assign(camera=column), gallery, QUERY_EMB, QUERY_EMB, protocol="reid"
        )


def test_a_categorical_of_floats_with_a_missing_value_is_an_empty_cell():
    query = _query(label=pd.Categorical([1.0, None, 3.0]))
    with pytest.raises(RankwiseError, match=r"<query table>: row .*: empty 'label'"):
        rankwise.evaluate(query, GALLERY, QUERY_EMB, QUERY_EMB)


def test_object_columns_keep_integers_beyond_2_to_the_53_as_written():
    big = 2**53 + 1  # not a float64: converting the column would change the label
    query = _query(label=pd.Series([big, 2.5, 3], dtype=object))
    gallery = GALLERY.assign(label=[str(big), "2.5", "3"])
    result = rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB)
    assert (result.num_queries, result.num_skipped) == (3, 0)


def test_whole_floats_beyond_2_to_the_53_stay_whole_numbers():
    query = _query(label=[1e16, 2.0, 3.0])
    gallery = GALLERY.assign(label=["10000000000000000", "2", "3"])
    assert rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB).num_skipped == 0


@pytest.mark.parametrize(
    "options, message",
    [
        # recall (the default protocol) ranked the junk rows: junk_labels was ignored
        ({"junk_labels": ["-1", "0"]}, r"junk_labels=\('-1', '0'\) applies to protocol reid"),
        ({"exclude_same_camera": False}, r"exclude_same_camera=False applies to protocol reid"),
        ({"gap_frames": 5}, r"gap_frames=5 applies to protocol reassociation only"),
        ({"query_stride": 2}, r"query_stride=2 applies to protocol reassociation only"),
        ({"shot_seed": 7}, r"shot_seed=7 applies to protocol reid only, not 'recall'"),
    ],
)
def test_an_option_the_protocol_does_not_take_is_refused(options, message):
    with pytest.raises(RankwiseError, match=message + r".*it would be ignored; pass protocol="):
        rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB, **options)
    # its default, given explicitly, is fine
    defaults = {"junk_labels": ["-1"], "exclude_same_camera": True, "gap_frames": 1}
    rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB, **defaults)


def test_shot_options_need_single_gallery_shot():
    query = _query(camera=[2, 3, 1])
    with pytest.raises(RankwiseError, match=r"shot_repeats applies with single_gallery_shot"):
        rankwise.evaluate(query, GALLERY, QUERY_EMB, QUERY_EMB, protocol="reid", shot_repeats=3)


def test_junk_labels_are_read_like_manifest_values():
    query = _query(camera=[2, 3, 1])
    gallery = GALLERY.assign(label=["a", "b", "-1"])
    expected = rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid")
    assert expected.num_gallery == 2
    # spaces around a label (manifest cells lose theirs), a numpy array: the label -1
    for junk in ([" -1 "], np.array([-1]), np.array(["-1"]), "-1, 0", -1):
        got = rankwise.evaluate(
            query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=junk
        )
        assert got.num_gallery == 2, junk
    with pytest.raises(RankwiseError, match=r"junk_labels must be a list of labels, none empty"):
        rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=[""])


@pytest.mark.parametrize(
    "junk", [[-1.0], np.array([-1.0]), -1.0, [np.float32(-1)], ["-1", -1.0], pd.Series([-1.0])]
)
def test_junk_labels_given_as_whole_floats_read_as_integers(junk):
    # what a pandas float column gives: "junk_labels must be a list of labels, got [-1.0]";
    # read as the README reads such a label column (-1.0 is the junk label -1)
    # text labels, and a float column (read as integers)
    for labels in (["a", "b", "-1"], [1.0, 2.0, -1.0]):
        query = _query(label=["a", "b", "c"] if labels[0] == "a" else [1, 2, 3], camera=[2, 3, 1])
        gallery = GALLERY.assign(label=labels)
        got = rankwise.rank(query, gallery, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=junk)
        assert got.attrs["num_gallery"] == 2
        assert got.attrs["protocol_options"]["junk_labels"] == ["-1"]


@pytest.mark.parametrize(
    "junk, message",
    [
        ([2.5], r"got 2\.5 in \[2\.5\]: write it as text \('2\.5'\)"),
        (np.array([-1.0, np.nan]), r"got nan in \[-1\.0, nan\]$"),
        ([True], r"got True in \[True\]$"),
    ],
)
def test_junk_labels_that_are_no_label_say_what_is_accepted(junk, message):
    query = _query(camera=[2, 3, 1])
    with pytest.raises(
        RankwiseError,
        match=r"^junk_labels must be a list of labels: text, integers, or floats that are "
        r"whole numbers \(-1\.0 is the label '-1', as in a DataFrame's float column\); " + message,
    ):
        rankwise.evaluate(query, GALLERY, QUERY_EMB, QUERY_EMB, protocol="reid", junk_labels=junk)


def test_tensors_numpy_cannot_take_and_zarr_groups_are_one_line(tmp_path):
    # torch's own RuntimeError / TypeError came through; a Zarr Group object became a
    # 0-d array of its repr ("have dtype <U..")
    torch = pytest.importorskip("torch")
    import zarr

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    group.create_array("embeddings", data=QUERY_EMB)
    cases = [
        (torch.tensor(QUERY_EMB, requires_grad=True), r"RuntimeError: .*requires grad.*"),
        (torch.tensor(QUERY_EMB, dtype=torch.bfloat16), r"TypeError: .*BFloat16"),
    ]
    for tensor, cause in cases:
        with pytest.raises(
            RankwiseError,
            match=rf"^the gallery embeddings cannot be read as a numpy array \({cause}\); "
            r"pass a float32 array \(a torch tensor: tensor\.detach\(\)\.float\(\)\.cpu\(\)"
            r"\.numpy\(\)\)$",
        ):
            rankwise.evaluate(_query(), GALLERY, QUERY_EMB, tensor)
    with pytest.raises(RankwiseError, match=r"^the gallery embeddings: a Zarr group, not an"):
        rankwise.evaluate(_query(), GALLERY, QUERY_EMB, group)
    expected = rankwise.evaluate(_query(), GALLERY, QUERY_EMB, QUERY_EMB).to_json()
    assert (
        rankwise.evaluate(_query(), GALLERY, QUERY_EMB, group["embeddings"]).to_json() == expected
    )


def test_text_labels_ending_in_dot_zero_are_labels_of_their_own():
    """'J45' and 'J45.0' (ICD-10 codes), 'v1' and 'v1.0': not integers written from
    floats; nor is a side that writes both '3' and '3.0' (each matches as written)."""
    labels = ["J45.0", "J45", "v1.0"]
    query = _query(label=labels)
    gallery = GALLERY.assign(label=["J45", "J45.0", "v1"])
    rankwise.evaluate(query, gallery, QUERY_EMB, QUERY_EMB)
    both = GALLERY.assign(label=["3", "3.0", "4"])
    rankwise.evaluate(_query(label=["3.0", "3", "4"]), both, QUERY_EMB, QUERY_EMB)


def test_a_gallery_whose_rows_are_all_junk_says_so():
    # the message said "check that query and gallery labels use the same ids ... (3
    # queries, 7 gallery items)", never that every gallery item was junk
    gallery = pd.DataFrame({"id": [f"g{i}" for i in range(7)], "label": -1, "camera": 1})
    emb = np.eye(7, 3, dtype=np.float32)
    with pytest.raises(
        RankwiseError,
        match=r"^gallery table: no query has a valid match in the gallery under protocol "
        r"'reid': all 7 gallery items have a junk label \('-1': 7 rows\), and junk rows are "
        r"never ranked \(3 queries\); check the gallery's labels, or set junk_labels to the "
        r"labels to remove$",
    ):
        rankwise.evaluate(_query(camera=[2, 3, 1]), gallery, QUERY_EMB, emb, protocol="reid")
    # some rows junk, the rest no match: the count of junk rows removed, by label
    gallery = gallery.assign(label=["-1"] * 4 + ["0", "0", "x"])
    with pytest.raises(
        RankwiseError,
        match=r"\(3 queries, 7 gallery items; junk labels removed 6 of them: '-1': 4 rows, "
        r"'0': 2 rows\): check that query and gallery labels use the same ids",
    ):
        rankwise.evaluate(
            _query(camera=[2, 3, 1]), gallery, QUERY_EMB, emb, protocol="reid", junk_labels="-1,0"
        )


# ---------------------------------------------------------------- the protocol hint


def _manifests(folder, kind: str, why: str):
    """Query and gallery manifests, as CSV paths or DataFrames, that look like re-ID data
    for the reason ``why`` (``camera``: both have one; ``junk``: gallery label -1) and
    not for the other, or (``none``) plain retrieval manifests."""
    query, gallery = _query(), pd.DataFrame({"id": ["g0", "g1", "g2"], "label": ["a", "b", "c"]})
    if why == "camera":
        query, gallery = query.assign(camera=[1, 1, 1]), gallery.assign(camera=[2, 2, 2])
    if why == "junk":
        gallery = gallery.assign(label=["a", "b", "-1"])
    if kind == "DataFrame":
        return query, gallery
    folder.mkdir()
    query.to_csv(folder / "q.csv", index=False)
    gallery.to_csv(folder / "g.csv", index=False)
    return str(folder / "q.csv"), folder / "g.csv"


@pytest.mark.parametrize("function", ["evaluate", "rank"])
@pytest.mark.parametrize("kind", ["path", "DataFrame"])
@pytest.mark.parametrize(
    "why, shown", [("camera", "a 'camera' column"), ("junk", "gallery label -1")]
)
def test_reid_looking_manifests_warn_when_protocol_is_left_out(
    tmp_path, function, kind, why, shown
):
    # the command line names --protocol reid in a note; the API ran recall without a word
    query, gallery = _manifests(tmp_path / why, kind, why)
    with pytest.warns(rankwise.ProtocolHint) as caught:
        result = getattr(rankwise, function)(query, gallery, QUERY_EMB, QUERY_EMB)
    assert len(caught) == 1 and issubclass(caught[0].category, UserWarning)
    assert str(caught[0].message) == (
        "ran protocol recall (the default), but the manifests look like re-identification "
        f'data ({shown}); pass protocol="reid" to exclude same-camera matches and junk '
        'labels, or protocol="recall" to silence this warning'
    )
    assert caught[0].filename == __file__  # the caller's line, through evaluate too
    protocol = result.protocol if function == "evaluate" else result.attrs["protocol"]
    assert protocol == "recall" and type(protocol) is str


@pytest.mark.parametrize("kind", ["path", "DataFrame"])
def test_a_given_protocol_or_plain_manifests_give_no_protocol_hint(tmp_path, kind):
    import inspect
    import warnings

    reid_looking = {why: _manifests(tmp_path / why, kind, why) for why in ("camera", "junk")}
    plain = _manifests(tmp_path / "none", kind, "none")
    with warnings.catch_warnings():
        warnings.simplefilter("error", rankwise.ProtocolHint)
        for function in (rankwise.evaluate, rankwise.rank):
            for query, gallery in reid_looking.values():
                function(query, gallery, QUERY_EMB, QUERY_EMB, protocol="recall")
            function(*plain, QUERY_EMB, QUERY_EMB)
            function(*reid_looking["camera"], QUERY_EMB, QUERY_EMB, protocol="reid")
        rankwise.recall_at_k(QUERY_EMB, QUERY_EMB, [1, 2, -1], [1, 2, -1])
        # a run that fails says why, and only that (the note too follows a report only)
        with pytest.raises(RankwiseError, match=r"differ only by a trailing '\.0'"):
            rankwise.evaluate(
                _query(label=["1.0", "b", "c"]),
                GALLERY.assign(label=[1, "b", "c"]),
                QUERY_EMB,
                QUERY_EMB,
            )
    # the documented default is still recall
    for function in (rankwise.evaluate, rankwise.rank):
        assert inspect.signature(function).parameters["protocol"].default == "recall"
