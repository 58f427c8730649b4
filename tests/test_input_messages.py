"""One line that names the file and the fix, for inputs a probe of the CLI found worded
wrongly: a verification without negative pairs (no file named), a ranks command given
an embedding store ("incomplete store"), an image path that is a folder ("cannot decode
... replace the file"), ``--output -`` / ``--output new/`` (a file named ``-`` / ``new``
appeared)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import input_args, run_rankwise
from PIL import Image


def one_error_line(proc) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def write(folder, query="id,label\nq,a\n", gallery="id,label\ng1,a\ng2,b\n"):
    (folder / "q.csv").write_text(query)
    (folder / "g.csv").write_text(gallery)
    np.save(folder / "q.npy", np.array([[0.0, 0.0]], np.float32))
    np.save(folder / "g.npy", np.array([[1.0, 0.0], [2.0, 0.0]], np.float32))


def test_verify_without_negative_pairs_names_the_manifests(tmp_path):
    write(tmp_path, gallery="id,label\ng1,a\ng2,a\n")
    proc = run_rankwise(
        "verify",
        *input_args(tmp_path),
        "--protocol",
        "recall",
        "--distance",
        "euclidean",
        "--output",
        tmp_path / "v.json",
    )
    line = one_error_line(proc)
    assert f"{tmp_path / 'q.csv'}, {tmp_path / 'g.csv'}: no negative pair" in line, line
    assert "tpr_at_fpr" not in line and not (tmp_path / "v.json").exists()


def test_a_ranks_command_given_an_embedding_store_says_which_store_it_is(tmp_path):
    (tmp_path / "img").mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / "img" / f"{i}.png")
    (tmp_path / "m.csv").write_text("id,label,path\na,1,img/0.png\nb,2,img/1.png\n")
    store = tmp_path / "e.zarr"
    encode = ["encode", "--manifest", tmp_path / "m.csv", "--kind", "pixels", "--out", store]
    assert run_rankwise(*encode, "--no-progress").returncode == 0
    line = one_error_line(run_rankwise("metrics", store))
    assert f"{store}: a rankwise embeddings store, not a ranks store; give the ranks store " in line
    assert "incomplete" not in line


def test_an_image_path_that_is_a_folder_says_so(tmp_path):
    (tmp_path / "img" / "sub dir").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "img" / "0.png")
    (tmp_path / "m.csv").write_text("id,label,path\na,1,img/0.png\nb,2,img/sub dir\n")
    proc = run_rankwise(
        "encode", "--manifest", tmp_path / "m.csv", "--kind", "pixels", "--out",
        tmp_path / "e.zarr", "--no-progress",
    )  # fmt: skip
    line = one_error_line(proc)
    assert "image 'img/sub dir' is a folder" in line and "not an image file" in line, line
    assert "replace the file" not in line


def test_an_image_path_that_is_a_pipe_says_so(tmp_path):
    # PIL blocked on the FIFO for good (and Ctrl-C waited on the decoding thread)
    import os

    Image.new("RGB", (8, 8)).save(tmp_path / "0.png")
    os.mkfifo(tmp_path / "1.png")
    (tmp_path / "m.csv").write_text("id,label,path\na,1,0.png\nb,2,1.png\n")
    proc = run_rankwise(
        "encode", "--manifest", tmp_path / "m.csv", "--kind", "pixels", "--out",
        tmp_path / "e.zarr", "--no-progress", timeout=60,
    )  # fmt: skip
    assert one_error_line(proc) == (
        f"error: {tmp_path / 'm.csv'}: row 3 (id 'b'): image '1.png' is a pipe or device "
        f"({tmp_path / '1.png'}), not an image file; fix the 'path' column"
    )


@pytest.mark.parametrize(
    "output, message, written",
    [
        ("-", "'--output': '-' is not an output path here; give a file name", "-"),
        # it wrote a file named "new" and printed "new/: ..."
        ("new/", "'--output': 'new/' names a folder; give a file name in it", "new"),
    ],
)
def test_an_output_file_path_that_names_no_file_is_refused(tmp_path, output, message, written):
    write(tmp_path)
    proc = run_rankwise("evaluate", *input_args(tmp_path), "--output", output, cwd=tmp_path)
    line = one_error_line(proc)
    assert message in line, line
    assert not (tmp_path / written).exists()


def test_cameras_written_from_floats_against_integers_are_one_line(tmp_path):
    # pandas writes a float column "1.0": against "1" the same-camera rule never applied
    # (every same-camera match silently kept, exit 0)
    write(
        tmp_path,
        query="id,label,camera\nq,a,1\n",
        gallery="id,label,camera\ng1,a,1.0\ng2,a,2.0\n",
    )
    proc = run_rankwise("evaluate", *input_args(tmp_path), "--protocol", "reid")
    line = one_error_line(proc)
    assert line == (
        f"error: {tmp_path / 'q.csv'}, {tmp_path / 'g.csv'}: query camera '1' and gallery "
        "camera '1.0' differ only by a trailing '.0' (a column written from floats against "
        "one written from integers), so they would not match; write both sides' cameras as "
        "integers"
    ), line


def test_cameras_written_with_leading_zeros_against_integers_are_one_line(tmp_path):
    # MSMT17 cameras read from its file names ("01") against the msmt17 loader's ("1"):
    # the same-camera rule never applied (the same-camera match g1 ranked, exit 0)
    write(
        tmp_path,
        query="id,label,camera\nq,a,01\n",
        gallery="id,label,camera\ng1,a,1\ng2,a,2\n",
    )
    proc = run_rankwise("evaluate", *input_args(tmp_path), "--protocol", "reid")
    line = one_error_line(proc)
    assert line == (
        f"error: {tmp_path / 'q.csv'}, {tmp_path / 'g.csv'}: query camera '01' and gallery "
        "camera '1' are the same integer written differently (leading zeros or a sign), so "
        "they would not match (cameras are compared as written); write both sides' cameras "
        "the same way, e.g. as plain integers"
    ), line


def test_a_store_output_that_is_a_symlink_is_written_through(tmp_path):
    # a link to a store (`latest.zarr -> run3.zarr`) failed after the whole ranking with
    # "OSError: Cannot call rmtree on a symbolic link", a dangling one with "Not a directory"
    import zarr

    write(tmp_path)
    (tmp_path / "link.zarr").symlink_to("target.zarr")
    (tmp_path / "dangling.zarr").symlink_to("nowhere.zarr")
    for _ in range(2):  # the second time the link's target is an old result
        for link in ("link.zarr", "dangling.zarr"):
            proc = run_rankwise(
                "rank", *input_args(tmp_path), "--distance", "euclidean", "--out", tmp_path / link
            )
            assert proc.returncode == 0, proc.stderr
            assert (tmp_path / link).is_symlink()
    for target in ("target.zarr", "nowhere.zarr"):
        group = zarr.open_group(str(tmp_path / target), mode="r")
        assert group.attrs["complete"] is True and group.attrs["kind"] == "ranks"
    assert sorted(p.name for p in tmp_path.iterdir() if ".zarr" in p.name) == [
        "dangling.zarr",
        "link.zarr",
        "nowhere.zarr",
        "target.zarr",
    ]


def test_a_deleted_current_folder_is_one_line(tmp_path):
    # `rank` records the folder it ran in: it failed after all its work with "error: No
    # such file or directory"; commands that need no folder (absolute paths) still run
    import subprocess

    from helpers import RANKWISE

    write(tmp_path)
    gone = tmp_path / "gone"

    def from_gone(*args) -> subprocess.CompletedProcess:
        gone.mkdir()
        return subprocess.run(
            ["bash", "-c", f'cd "{gone}" && rmdir "{gone}" && exec "$0" "$@"', RANKWISE,
             *map(str, args)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    args = [*input_args(tmp_path), "--distance", "euclidean"]
    proc = from_gone("rank", *args, "--out", tmp_path / "r.zarr")
    assert one_error_line(proc) == (
        "error: the current folder no longer exists (deleted or moved); cd to an existing "
        "folder and run again"
    )
    assert not (tmp_path / "r.zarr").exists()
    assert from_gone("evaluate", *args).returncode == 0
    assert run_rankwise("rank", *args, "--out", tmp_path / "r.zarr").returncode == 0
    proc = from_gone("metrics", tmp_path / "r.zarr")
    assert proc.returncode == 0 and "recall@1" in proc.stdout, proc.stderr


@pytest.mark.parametrize("which", ["q.npy", "q.csv"])
def test_an_input_that_is_a_pipe_is_one_line(tmp_path, which):
    # a FIFO (or `<(...)`) was opened twice: the run hung once its writer was done, or
    # a valid .npy was called "not a .npy file", a manifest "not found"
    import os

    write(tmp_path)
    (tmp_path / which).unlink()
    os.mkfifo(tmp_path / which)  # no writer: opening it to read would block forever
    proc = run_rankwise("evaluate", *input_args(tmp_path), timeout=60)
    what = "query embeddings are" if which == "q.npy" else "query manifest is"
    assert one_error_line(proc).startswith(
        f"error: {tmp_path / which}: the {what} in a pipe or device, not a file"
        if which == "q.npy"
        else f"error: {tmp_path / which}: the {what} a pipe or device, not a file"
    )


def test_an_all_junk_gallery_says_its_items_are_junk(tmp_path):
    # "check that query and gallery labels use the same ids ... (3 queries, 7 gallery
    # items)": the labels were fine, every gallery row was junk (-1) and so never ranked
    write(
        tmp_path,
        query="id,label,camera\n" + "".join(f"q{i},{i},1\n" for i in range(3)),
        gallery="id,label,camera\n" + "".join(f"g{i},-1,2\n" for i in range(7)),
    )
    np.save(tmp_path / "q.npy", np.eye(3, 2, dtype=np.float32) + 1)
    np.save(tmp_path / "g.npy", np.eye(7, 2, dtype=np.float32) + 1)
    line = one_error_line(run_rankwise("evaluate", *input_args(tmp_path), "--protocol", "reid"))
    assert line == (
        f"error: {tmp_path / 'g.csv'}: no query has a valid match in the gallery under "
        "protocol 'reid': all 7 gallery items have a junk label ('-1': 7 rows), and junk rows "
        "are never ranked (3 queries); check the gallery's labels, or set --junk-labels to the "
        "labels to remove"
    ), line
    assert "same ids" not in line
