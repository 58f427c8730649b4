"""One writer per store at a time (rankwise.store.atomic_directory's lock).

A job of a killed Snakemake run keeps running; the rerun's job of the same store used to
delete that job's ``<out>.tmp`` and write it again while the first kept writing chunks
into it, and the first then renamed the mix over the result.  Now:

- a second writer of a path that a live process is writing stops at once with one line
  (exit status 2), touching nothing of the first's; the first finishes with its own
  store, and a rerun then replaces it;
- a dead writer's leftovers (``<out>.tmp``, its ``<out>.lock``) never block a write:
  the next one removes them;
- the lock file's unlink-while-locked race: a writer that locked a lock file after its
  holder deleted it starts over on the file now at the path;
- a file system without ``flock`` writes unlocked;
- ``write_bytes_atomic``: two processes writing one file at once never leave it mixed or
  cut short.

The first writer is a small Python process that enters ``write_embeddings`` and waits
after its first batch while a ``hold`` file exists; the second is the real CLI.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from helpers import run_rankwise
from PIL import Image

from rankwise.errors import RankwiseError
from rankwise.store import atomic_directory, open_complete_group, write_bytes_atomic

HOLDER = """
import os, sys, time
import numpy as np
from rankwise.store import write_embeddings

out, hold, held = sys.argv[1:4]
data = np.arange(48, dtype=np.float32).reshape(12, 4)


def batches():
    yield data[:6]
    open(held, "w").close()
    while os.path.exists(hold):
        time.sleep(0.02)
    yield data[6:]


write_embeddings(out, batches(), 12, attrs={"encoder": {"kind": "held"}}, chunk_rows=6)
"""
HELD_DATA = np.arange(48, dtype=np.float32).reshape(12, 4)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    """12 images of 4 x 4 pixels and their manifest (for `rankwise encode --kind pixels`)."""
    rng = np.random.default_rng(5)
    (tmp_path / "img").mkdir()
    lines = ["id,label,path"]
    for i in range(12):
        image = rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)
        Image.fromarray(image).save(tmp_path / "img" / f"{i}.png")
        lines.append(f"i{i},{i % 4},img/{i}.png")
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "m.csv"


def encode(manifest: Path, out: Path) -> subprocess.CompletedProcess:
    return run_rankwise(
        "encode",
        "--manifest",
        manifest,
        "--kind",
        "pixels",
        "--options",
        json.dumps({"size": [2, 2]}),
        "--out",
        out,
        "--no-progress",
    )


def hold_writer(tmp_path: Path, out: Path) -> subprocess.Popen:
    """Start the first writer of ``out``; return once it holds the store, half written."""
    (tmp_path / "holder.py").write_text(HOLDER)
    hold, held = tmp_path / "hold", tmp_path / "held"
    hold.touch()
    proc = subprocess.Popen([sys.executable, tmp_path / "holder.py", out, hold, held])
    deadline = time.monotonic() + 120
    while not held.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the holding writer never held the store (exit {proc.poll()})")
        time.sleep(0.02)
    return proc


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_second_writer_stops_at_once(manifest, tmp_path):
    out = tmp_path / "emb" / "gallery.zarr"
    tmp = out.with_name("gallery.zarr.tmp")
    holder = hold_writer(tmp_path, out)
    try:
        before = files(tmp)
        assert before, "the first writer wrote nothing yet"
        proc = encode(manifest, out)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"error: {out} is being written by another process (pid {holder.pid}); wait for "
            "it to finish or stop it, then run again"
        ]
        assert files(tmp) == before  # the first writer's work untouched
        assert not out.exists()
    finally:
        (tmp_path / "hold").unlink()
        assert holder.wait(timeout=120) == 0

    # the first writer's store, complete and readable; nothing left beside it
    group = open_complete_group(out, "embeddings")
    np.testing.assert_array_equal(group["embeddings"][...], HELD_DATA)
    assert group.attrs["encoder"] == {"kind": "held"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["gallery.zarr"]

    # run again: it replaces the store
    proc = encode(manifest, out)
    assert proc.returncode == 0, proc.stderr
    group = open_complete_group(out, "embeddings")
    assert group.attrs["encoder"]["kind"] == "pixels"
    assert group["embeddings"].shape == (12, 12)
    assert sorted(p.name for p in out.parent.iterdir()) == ["gallery.zarr"]


@pytest.mark.parametrize("lock_file", ["left", "absent"])
def test_a_dead_writers_leftovers_are_removed(manifest, tmp_path, lock_file):
    """Killed mid-write, the writer leaves ``<out>.tmp`` and its lock file, which the
    next write takes over (the kernel dropped the lock); without a lock file (an older
    rankwise's leftover) too."""
    out = tmp_path / "emb" / "gallery.zarr"
    holder = hold_writer(tmp_path, out)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    lock = out.with_name("gallery.zarr.lock")
    assert sorted(p.name for p in out.parent.iterdir()) == ["gallery.zarr.lock", "gallery.zarr.tmp"]
    assert lock.read_text().split()[0] == str(holder.pid)
    if lock_file == "absent":
        lock.unlink()

    proc = encode(manifest, out)
    assert proc.returncode == 0, proc.stderr
    group = open_complete_group(out, "embeddings")
    assert group.attrs["encoder"]["kind"] == "pixels"
    assert group["embeddings"].shape == (12, 12)
    assert sorted(p.name for p in out.parent.iterdir()) == ["gallery.zarr"]


def test_a_lock_file_deleted_under_a_waiting_writer(tmp_path, monkeypatch):
    """The unlink-while-locked race, step by step: B opens the lock file; A, its holder,
    deletes it and lets go; C creates a new one and locks it; B's lock on the deleted
    file then succeeds.  B must see that the path names another file, start over, and
    be refused by C's lock, not write beside C."""
    out = tmp_path / "s"
    lock = tmp_path / "s.lock"
    with atomic_directory(out):  # A
        stale = os.open(lock, os.O_RDWR)  # B's open, before A deletes the file
    assert not lock.exists()
    with atomic_directory(out):  # C
        real_open = os.open
        calls = []

        def open_(path, flags, *args):  # B's first open returns the file it opened before
            calls.append(path)
            return stale if len(calls) == 1 else real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", open_)
        with pytest.raises(RankwiseError, match=rf"{out} is being written by another process"):
            with atomic_directory(out):  # B
                pytest.fail("B wrote while C held the lock")
        monkeypatch.undo()
        assert calls[0] == lock and len(calls) > 1  # started over on the file now there
    assert not lock.exists()


def test_the_holder_deletes_the_lock_file_before_letting_go(tmp_path, monkeypatch):
    """The other half of the race: had A let go first, B could lock the file in between
    and A then delete B's lock file, and C lock a new one beside B's write."""
    out = tmp_path / "s"
    real_close = os.close
    armed = []
    b = ExitStack()

    def close(fd):
        real_close(fd)
        if armed:  # A's first close once its block is done: its lock file's
            armed.clear()
            b.enter_context(atomic_directory(out))  # B, right after A let go

    monkeypatch.setattr(os, "close", close)
    with b:
        with atomic_directory(out):  # A
            armed.append(True)
        assert not armed, "A closed no file"
        with pytest.raises(RankwiseError, match=rf"{out} is being written by another process"):
            with atomic_directory(out):  # C, while B writes
                pytest.fail("C wrote while B held the lock")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_another_users_lock_file_is_replaced(tmp_path, monkeypatch):
    """A lock file this user cannot write (another user's killed writer left it, its pid
    in it) is locked read-only, then replaced by one naming this writer."""
    out = tmp_path / "s"
    lock = tmp_path / "s.lock"
    lock.write_text("4000000 elsewhere\n")
    real_open = os.open

    def open_(path, flags, *args):  # as for a file of another user, mode 644
        if Path(path) == lock and flags & os.O_RDWR and not flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_)
    with atomic_directory(out):
        assert lock.read_text().split()[0] == str(os.getpid())
        with pytest.raises(RankwiseError, match=rf"another process \(pid {os.getpid()}\);"):
            with atomic_directory(out):
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_without_flock_the_write_goes_on(tmp_path, monkeypatch):
    import fcntl

    tried = []

    def no_locks(fd, operation):
        tried.append(operation)
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "s"
    with atomic_directory(out) as tmp:
        (tmp / "x").write_text("done")
    assert tried, "no lock was tried"
    assert (out / "x").read_text() == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no lock file left


WRITER = """
import sys
from rankwise.store import write_bytes_atomic

path, byte, times = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
for _ in range(times):
    write_bytes_atomic(path, byte * (1 << 20))
"""


def test_two_processes_writing_one_file(tmp_path):
    """Each read of the file while two processes rewrite it is one whole payload."""
    path = tmp_path / "report.json"
    write_bytes_atomic(path, b"-" * (1 << 20))
    (tmp_path / "writer.py").write_text(WRITER)
    writers = [
        subprocess.Popen(
            [sys.executable, tmp_path / "writer.py", path, byte, "150"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for byte in "ab"
    ]
    seen = set()
    while any(w.poll() is None for w in writers):
        data = path.read_bytes()
        assert len(data) == 1 << 20 and data.count(data[:1]) == len(data), "mixed or cut"
        seen.add(data[:1])
    for w in writers:
        assert w.wait() == 0, w.stderr.read()
    data = path.read_bytes()
    assert data in (b"a" * (1 << 20), b"b" * (1 << 20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "writer.py"]


def test_an_interrupt_between_the_renames_keeps_the_old_result(tmp_path, monkeypatch):
    """Ctrl-C after the old result is moved aside and before the new one is renamed in:
    the old result is put back (it was lost: ``<out>.old`` kept, the new one deleted,
    nothing under the final name, and the next write deleted ``<out>.old``)."""
    out = tmp_path / "r.zarr"
    with atomic_directory(out) as tmp:
        (tmp / "which").write_text("old")
    real = os.rename

    def rename(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if str(dst).endswith(".zarr.old"):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(out) as tmp:
            (tmp / "which").write_text("new")
    monkeypatch.setattr(os, "rename", real)
    assert (out / "which").read_text() == "old"
    assert not (tmp_path / "r.zarr.tmp").exists()
    assert not (tmp_path / "r.zarr.old").exists()
    assert not (tmp_path / "r.zarr.lock").exists()


def test_an_interrupt_during_a_commit_waits_for_every_rename(tmp_path, monkeypatch):
    """A Ctrl-C between two renames of one command's documents left m.json new beside
    m.txt old; it now waits until every file is in place, then interrupts."""
    import rankwise.store as store

    for name in ("m.json", "m.txt", "m.csv"):
        (tmp_path / name).write_text("old")
    real_replace = os.replace
    calls = []

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        calls.append(dst)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # the user's Ctrl-C, after the first rename

    monkeypatch.setattr(store.os, "replace", replace_then_interrupt)
    files = store.StagedFiles()
    for name in ("m.json", "m.txt", "m.csv"):
        files.write(tmp_path / name, b"new")
    with pytest.raises(KeyboardInterrupt):
        files.commit()
    assert len(calls) == 3
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "m.json": "new",
        "m.txt": "new",
        "m.csv": "new",
    }
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_a_dead_writers_temporary_files_are_removed_by_the_next_write(tmp_path):
    """`.<name>.<pid>.<random>.tmp` of a killed writer (a SIGKILLed report's forked
    figure child) stayed forever; the next write of that file removes it once it is old
    and its process gone, and never a live or a recent one."""
    hour_ago = time.time() - 3600
    dead = 2**31 - 1  # above Linux's pid_max: never a process
    leftovers = {
        "dead_old": f".r.svg.{dead}.0123abcd.tmp",
        "dead_recent": f".r.svg.{dead}.89abcdef.tmp",  # another host's writer, maybe
        "alive_old": f".r.svg.{os.getppid()}.00000000.tmp",
        "other_file": f".s.svg.{dead}.0123abcd.tmp",
    }
    for key, name in leftovers.items():
        (tmp_path / name).write_bytes(b"<svg")
        if key != "dead_recent":
            os.utime(tmp_path / name, (hour_ago, hour_ago))
    write_bytes_atomic(tmp_path / "r.svg", b"<svg/>")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["r.svg", *(name for key, name in leftovers.items() if key != "dead_old")]
    )
