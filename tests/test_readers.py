"""One reader per input kind: manifests with and without a protocol, embeddings with the
manifest check, and open_inputs (the query/gallery/embeddings quadruple)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rankwise
from rankwise.embeddings import MANIFEST_SHA256, open_embeddings
from rankwise.encoders import encode_manifest
from rankwise.errors import RankwiseError
from rankwise.inputs import open_inputs
from rankwise.manifest import read_manifest, required_columns
from rankwise.registry import REGISTRY


def test_columns_when_protocol_or_role_is_unknown():
    """Unknown protocol/role: the columns every protocol requires, from the registry."""
    assert required_columns(None, None) == ("id", "label")
    assert required_columns(None, "query") == ("id", "label")
    assert required_columns("progressive", None) == ("id", "label")
    assert required_columns("reid", None) == ("id", "label", "camera")
    assert required_columns("reassociation", "gallery") == ("id", "label", "sequence", "frame")
    every = set.intersection(
        *(set(s.required_columns(r)) for s in REGISTRY.values() for r in ("query", "gallery"))
    )
    assert set(required_columns(None, None)) == every
    with pytest.raises(RankwiseError, match=r"role must be one of query, gallery; got 'probe'"):
        required_columns(None, "probe")


def test_read_manifest_without_protocol(tmp_path):
    """Checks what every protocol needs; other columns are kept, not interpreted (a
    non-integer 'step' is not an error when no protocol asks for it)."""
    (tmp_path / "m.csv").write_text("id,label,sketch,step\na,1,s,x\nb,2,s,3\n")
    table = read_manifest(tmp_path / "m.csv")
    assert table["id"].tolist() == ["a", "b"] and table["step"].tolist() == ["x", "3"]
    with pytest.raises(RankwiseError, match=r"row 2: column 'step' must be an integer"):
        read_manifest(tmp_path / "m.csv", protocol="progressive", role="query")
    (tmp_path / "dup.csv").write_text("id,label\na,1\na,2\n")
    with pytest.raises(RankwiseError, match=r"dup\.csv: duplicate id 'a' at rows 2 and 3"):
        read_manifest(tmp_path / "dup.csv")


@pytest.fixture
def files(tmp_path: Path) -> dict:
    rng = np.random.default_rng(4)
    query = pd.DataFrame(
        {"id": [f"q{i}" for i in range(5)], "label": list("01201"), "camera": list("aabba")}
    )
    gallery = pd.DataFrame(
        {"id": [f"g{i}" for i in range(9)], "label": list("012012012"), "camera": list("bbbaaabbb")}
    )
    out = {
        "q_csv": tmp_path / "query.csv",
        "g_csv": tmp_path / "gallery.csv",
        "qe": rng.normal(size=(5, 4)).astype(np.float32),
        "ge": rng.normal(size=(9, 4)).astype(np.float32),
    }
    query.to_csv(out["q_csv"], index=False)
    gallery.to_csv(out["g_csv"], index=False)
    for side in ("q", "g"):
        np.save(tmp_path / f"{side}.npy", out[f"{side}e"])
        encode_manifest(
            out[f"{side}_csv"],
            "precomputed",
            {"path": str(tmp_path / f"{side}.npy")},
            tmp_path / f"{side}.zarr",
            progress=False,
        )
    out["q_store"], out["g_store"] = tmp_path / "q.zarr", tmp_path / "g.zarr"
    return out


def test_encode_checks_the_protocol_when_given(files, tmp_path):
    """encode knows no protocol by default; given one (and a role), it checks that
    protocol's columns as ranking will."""
    args = ("precomputed", {"path": str(tmp_path / "q.npy")})
    encode_manifest(
        files["q_csv"], *args, tmp_path / "a.zarr", progress=False, protocol="reid", role="query"
    )
    with pytest.raises(
        RankwiseError,
        match=r"query\.csv: missing column\(s\) sketch, step "
        r"required by protocol 'progressive' for the query",
    ):
        encode_manifest(
            files["q_csv"],
            *args,
            tmp_path / "b.zarr",
            progress=False,
            protocol="progressive",
            role="query",
        )
    assert not (tmp_path / "b.zarr").exists()


def test_open_inputs(files):
    inputs = open_inputs(
        files["q_csv"], files["g_csv"], files["q_store"], files["g_store"], protocol="reid"
    )
    assert inputs.names == (str(files["q_csv"]), str(files["g_csv"]))
    assert inputs.query["camera"].tolist() == list("aabba")
    assert inputs.query_embeddings.shape == (5, 4) and inputs.gallery_embeddings.shape == (9, 4)
    np.testing.assert_array_equal(inputs.gallery_embeddings.read(0, 9), files["ge"])
    assert inputs.gallery_embeddings.attrs[MANIFEST_SHA256]
    # the problem it builds is the one evaluate ranks with
    problem = inputs.problem(junk_labels=("2",))
    assert problem.num_gallery == 6 and problem.options == {
        "junk_labels": ["2"],
        "exclude_same_camera": True,
    }
    # the stores and the .npy files give the same numbers
    a = rankwise.evaluate(
        files["q_csv"], files["g_csv"], files["q_store"], files["g_store"], protocol="reid"
    )
    b = rankwise.evaluate(files["q_csv"], files["g_csv"], files["qe"], files["ge"], protocol="reid")
    assert a.to_json() == b.to_json()


def test_open_inputs_checks_dimensions(files):
    with pytest.raises(
        RankwiseError,
        # the store was encoded from g.npy by the precomputed encoder: that file is named
        match=r"query embeddings has dimension 3 but .*g\.zarr \(encoded from .*g\.npy\) "
        r"has 4 .*encode both with the same model",
    ):
        open_inputs(
            files["q_csv"], files["g_csv"], files["qe"][:, :3], files["g_store"], protocol="recall"
        )


def test_manifest_check_compares_content_not_path(files, tmp_path):
    """A byte-identical copy passes; the same file edited in place does not; a table
    (no file) and a store without the attribute are not checked."""
    copy = tmp_path / "elsewhere" / "gallery.csv"
    copy.parent.mkdir()
    copy.write_bytes(files["g_csv"].read_bytes())
    open_embeddings(files["g_store"], name="gallery embeddings", n_rows=9, manifest=copy)
    open_embeddings(files["g_store"], name="gallery embeddings", n_rows=9, manifest=None)
    copy.write_bytes(files["g_csv"].read_bytes().replace(b"g0,0,b", b"g0,7,b"))
    with pytest.raises(
        RankwiseError,
        match=r"gallery embeddings were encoded from "
        r"\S*/gallery\.csv \(sha256 \w{12}\), but "
        r"\S*elsewhere/gallery\.csv has other content",
    ):
        open_embeddings(files["g_store"], name="gallery embeddings", n_rows=9, manifest=copy)
    from rankwise.store import write_embeddings

    write_embeddings(tmp_path / "plain.zarr", iter([files["ge"]]), 9, attrs={"encoder": "x"})
    open_embeddings(tmp_path / "plain.zarr", name="gallery embeddings", n_rows=9, manifest=copy)


def test_manifest_check_comes_before_the_row_count(files, tmp_path):
    """Rows added to the manifest: the message says which manifest the store belongs to,
    not only that the counts differ."""
    table = pd.read_csv(files["g_csv"], dtype=str)
    pd.concat([table, table.iloc[:1].assign(id="new")]).to_csv(tmp_path / "more.csv", index=False)
    with pytest.raises(
        RankwiseError,
        match=r"encoded from \S*gallery\.csv .*more\.csv has "
        r"other content",
    ):
        open_inputs(
            files["q_csv"],
            tmp_path / "more.csv",
            files["q_store"],
            files["g_store"],
            protocol="recall",
        )


def test_zarr_chunks_of_zeros_are_zeros_not_a_partial_copy(tmp_path):
    """zarr leaves out chunk files of fill values: a user's store with a zero row in its
    own chunk is valid (it was refused as incomplete); rankwise's stores write every
    chunk, so there an absent file is still a partial copy."""
    import zarr

    from rankwise.store import write_embeddings

    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(6, 4)).astype(np.float32)
    gallery[2] = 0.0  # euclidean takes zero rows
    query = rng.normal(size=(3, 4)).astype(np.float32)
    q = pd.DataFrame({"id": ["a", "b", "c"], "label": ["0", "1", "2"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(6)], "label": ["0", "1", "2"] * 2})
    group = zarr.open_group(str(tmp_path / "user.zarr"), mode="w")
    group.create_array("embeddings", data=gallery, chunks=(1, 4))
    assert not (tmp_path / "user.zarr" / "embeddings" / "c" / "2" / "0").exists()
    want = rankwise.evaluate(q, g, query, gallery, distance="euclidean").to_json()
    got = rankwise.evaluate(q, g, query, str(tmp_path / "user.zarr"), distance="euclidean")
    assert got.to_json() == want
    store = tmp_path / "mine.zarr"
    write_embeddings(store, iter([gallery]), 6, attrs={"encoder": "t"}, chunk_rows=1)
    chunk = store / "embeddings" / "c" / "2" / "0"
    assert chunk.is_file()  # the zero row's chunk is written
    chunk.unlink()
    with pytest.raises(RankwiseError, match=r"rows 2-2 .* missing from the Zarr store"):
        rankwise.evaluate(q, g, query, str(store), distance="euclidean")


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_a_file_gone_after_opening_is_not_called_corrupt(tmp_path, kind):
    """Opened and checked, then gone when its rows are read (moved or deleted during the
    run, or a Dask worker whose machine does not see the path): the message said "the
    file is corrupt ... write it again", advice that fits neither."""
    import shutil

    import zarr

    rows = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    path = tmp_path / f"g.{kind}"
    if kind == "npy":
        np.save(path, rows)
    else:
        zarr.create_array(str(path), data=rows, chunks=(4, 4))
    source = open_embeddings(str(path), name="gallery embeddings")
    assert np.array_equal(source.read(0, 8), rows)
    (shutil.rmtree if kind == "zarr" else Path.unlink)(path)
    with pytest.raises(RankwiseError) as caught:
        source.read(0, 8)
    message = str(caught.value)
    assert message.startswith(f"{path}: cannot read rows ")
    assert "FileNotFoundError" in message
    assert "no longer there" in message and "a path every worker sees" in message
    assert "corrupt" not in message and "\n" not in message


def test_a_file_this_process_may_not_read_is_not_called_corrupt():
    """The cause named for a permission error (a Dask worker running as another user;
    the tests run as root, who may read anything, so the reason is checked directly)."""
    from rankwise.embeddings import _why_unreadable

    why = _why_unreadable(PermissionError(13, "Permission denied"))
    assert "may not read it" in why and "readable by every process" in why
    assert "corrupt" in _why_unreadable(ValueError("bad bytes"))


@pytest.mark.parametrize("kind", ["npy", "zarr", "store"])
def test_a_file_replaced_after_opening_is_refused(tmp_path, kind):
    """Another process replacing the file between two reads (an encode renaming its new
    store over the one being ranked, a ``mv`` over the .npy): the rows read before and
    after belonged to two versions, and the ranks of neither came out, exit 0."""
    import os

    import zarr

    from rankwise.store import write_embeddings

    rng = np.random.default_rng(2)
    old, new = (rng.normal(size=(8, 4)).astype(np.float32) for _ in range(2))
    path, other = tmp_path / f"g.{kind}", tmp_path / f"other.{kind}"
    for rows, where in ((old, path), (new, other)):
        if kind == "npy":
            np.save(where, rows)
        elif kind == "zarr":
            zarr.create_array(str(where), data=rows, chunks=(4, 4))
        else:
            write_embeddings(where, iter([rows]), 8, attrs={"encoder": "t"}, chunk_rows=4)
    source = open_embeddings(str(path), name="gallery embeddings")
    assert np.array_equal(source.read(0, 4), old[:4])
    assert np.array_equal(source.take(np.array([5, 1])), old[[5, 1]])
    if kind == "npy":
        os.replace(other, path)
    else:  # as rankwise's stores are replaced: the old one moved away, the new renamed in
        os.rename(path, tmp_path / "moved")
        os.rename(other, path)
    for read in (lambda: source.read(4, 8), lambda: source.take(np.array([6, 2]))):
        with pytest.raises(RankwiseError) as caught:
            read()
        assert str(caught.value) == (
            f"{path}: the gallery embeddings changed during the run (replaced, rewritten or "
            "removed by another process); wait until nothing writes it, then run again"
        )


def test_a_npy_rewritten_in_place_after_opening_is_refused(tmp_path):
    import os

    rows = np.random.default_rng(3).normal(size=(8, 4)).astype(np.float32)
    path = tmp_path / "g.npy"
    np.save(path, rows)
    source = open_embeddings(str(path), name="gallery embeddings")
    assert np.array_equal(source.read(0, 8), rows)
    np.save(path, -rows)  # the same inode and size, new bytes
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # coarse clocks
    with pytest.raises(RankwiseError, match=r"changed during the run"):
        source.read(0, 8)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_stale_consolidated_metadata_is_not_what_is_checked(tmp_path, zarr_format):
    """A group's consolidated metadata is not updated when an array is rewritten
    (``open_group(mode="a").create_array(..., overwrite=True)``): the shape checked at
    opening must be the one read (it was the stale one: a traceback in the tile kernels,
    or the file refused for a dimension it no longer has)."""
    import zarr

    rng = np.random.default_rng(0)
    query = rng.normal(size=(3, 4)).astype(np.float32)
    gallery = rng.normal(size=(6, 4)).astype(np.float32)
    q = pd.DataFrame({"id": ["a", "b", "c"], "label": ["0", "1", "2"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(6)], "label": ["0", "1", "2"] * 2})
    path = str(tmp_path / "g.zarr")
    group = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    group.create_array("embeddings", data=np.ones((6, 8), np.float32), chunks=(2, 8))
    zarr.consolidate_metadata(path)
    group = zarr.open_group(path, mode="a")
    group.create_array("embeddings", data=gallery, chunks=(2, 4), overwrite=True)
    assert zarr.open(path, mode="r")["embeddings"].shape == (6, 8)  # stale
    want = rankwise.evaluate(q, g, query, gallery, distance="euclidean").to_json()
    got = rankwise.evaluate(q, g, query, path, distance="euclidean")
    assert got.to_json() == want
    assert open_embeddings(path, name="gallery embeddings").shape == (6, 4)


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_rows_read_in_another_shape_than_opened_are_refused(tmp_path, kind):
    """A file rewritten with other rows or columns after it was opened: its rows are
    refused, not handed to the engine short (which ranked memory it never filled:
    exit 0, numbers changing with --gallery-chunk)."""
    import dataclasses

    import zarr

    path = tmp_path / ("g.npy" if kind == "npy" else "g.zarr")

    def write(rows: int, dim: int) -> None:
        data = np.ones((rows, dim), np.float32)
        if kind == "npy":
            np.save(path, data)
        else:
            zarr.create_array(str(path), data=data, chunks=(2, dim), overwrite=True)

    write(6, 4)
    source = open_embeddings(str(path), name="gallery embeddings", n_rows=6)
    for rows, dim in ((4, 4), (6, 5)):
        write(rows, dim)
        # the file's identity changed: said as for any change during the run
        for read in (lambda: source.read(0, 6), lambda: source.take(np.array([5, 0]))):
            with pytest.raises(RankwiseError, match=r"changed during the run"):
                read()
        # where no identity is known, the shape read still is the shape opened
        unknown = dataclasses.replace(source, identity=None)
        with pytest.raises(RankwiseError, match=r"opened as shape \(6, 4\)\) read as shape"):
            unknown.read(0, 6)
        with pytest.raises(RankwiseError, match=r"opened as shape \(6, 4\)\) read as shape"):
            unknown.take(np.array([5, 0]))


def test_inodes_count_only_on_the_machine_that_opened_the_file():
    """A Dask worker on another machine may see the file under another inode number (a
    FUSE mount): only its size and modification time are compared there."""
    from rankwise.embeddings import _same_file

    opened = ((11, 12), (100, 5_000), "client")
    assert _same_file(opened, ((11, 12), (100, 5_000), "client"))
    assert not _same_file(opened, ((11, 99), (100, 5_000), "client"))  # renamed over it
    assert _same_file(opened, ((71, 72), (100, 5_000), "worker"))
    assert not _same_file(opened, ((71, 72), (100, 6_000), "worker"))  # written again
    assert not _same_file(opened, None)
