"""Bad input: one clear line, exit status 2, nothing written (DESIGN.md, Errors).

Every case runs the real ``rankwise`` console script as a subprocess and checks that

- the exit status is 2 and no traceback is printed;
- stderr shows exactly one line, starting with ``error:``, that matches the case's
  regex (which names the file, the row or column, and what to do);
- a pre-existing ``--output`` file is untouched (same bytes, no ``.tmp`` beside it);
- ``rankwise rank --out`` leaves no store (and no ``.tmp``) behind, and an older
  complete store under that name keeps every byte.

Cases marked ``xfail(strict=True)`` document a message that does not yet meet the
contract; the fix belongs to a file owned by someone else (see the reason).  They turn
into failures as soon as the fix lands, so the marker gets removed.

Pipeline cases (config validation, missing images and checkpoints) run once the
Snakefile and ``rankwise encode`` exist.

Speed: importing rankwise costs ~0.8 s of CPU per process, most of this file's time.
So each case runs in a *forked* child of one server process that imported the console
script's entry point (``rankwise.cli:main``) once: a separate process, with its own
exit status and stderr, running exactly what the ``rankwise`` script runs.
``test_forked_cli_matches_console_script`` checks that both give the same status and
output; ``RANKWISE_REAL_CLI=1`` runs every case through the console script instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import RANKWISE, run_rankwise

ROOT = Path(__file__).resolve().parents[1]


run_script = run_rankwise


# The server: imports the entry point once, then forks one child per request.  The
# child does what the console script does (`sys.exit(main())`): exit status, stdout
# and stderr come from it alone.  Nothing in the server starts a thread before fork.
_SERVER = r"""
import json, os, signal, sys, traceback
from rankwise.cli import main

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            signal.alarm(req["timeout"])
            if req["cwd"]:
                os.chdir(req["cwd"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                os.dup2(os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = ["rankwise", *req["args"]]
            try:
                sys.exit(main())
            except SystemExit as exc:
                code = exc.code
                if code is None:
                    code = 0
                elif not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if "code" in dir() else 1)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class _Forker:
    def __init__(self, folder: Path):
        self.folder = folder
        self.count = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, *args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
        self.count += 1
        out, err = self.folder / f"{self.count}.out", self.folder / f"{self.count}.err"
        request = {
            "args": list(map(str, args)),
            "cwd": str(cwd) if cwd else None,
            "stdout": str(out),
            "stderr": str(err),
            "timeout": int(timeout),
        }
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError("the rankwise fork server died")
        return subprocess.CompletedProcess(
            [RANKWISE, *request["args"]], json.loads(reply)["rc"], out.read_text(), err.read_text()
        )

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


_FORKER: _Forker | None = None


@pytest.fixture(scope="module", autouse=True)
def _fork_server(tmp_path_factory):
    global _FORKER
    if os.environ.get("RANKWISE_REAL_CLI") == "1" or not hasattr(os, "fork"):
        yield
        return
    _FORKER = _Forker(tmp_path_factory.mktemp("forked_cli"))
    yield
    _FORKER.close()
    _FORKER = None


def run(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """``rankwise *args`` in its own process (forked from the server, or the script)."""
    if _FORKER is None:
        return run_script(*args, cwd=cwd, timeout=timeout)
    return _FORKER(*args, cwd=cwd, timeout=timeout)


def visible_lines(stderr: str) -> list[str]:
    """What a terminal shows: per line the text after the last carriage return
    (a cleared progress bar leaves only ``\\r`` and spaces), blank lines dropped."""
    lines = [line.rsplit("\r", 1)[-1].strip() for line in stderr.split("\n")]
    return [line for line in lines if line]


def assert_one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> str:
    shown = visible_lines(proc.stderr)
    context = f"\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, "a traceback was printed" + context
    assert proc.returncode == 2, f"exit status {proc.returncode}, expected 2" + context
    assert len(shown) == 1, f"expected one line on stderr, got {len(shown)}" + context
    line = shown[0]
    assert line.startswith("error: "), "the line must start with 'error: '" + context
    assert re.search(pattern, line), f"{line!r} does not match {pattern!r}"
    return line


def tree_digest(path: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``path`` (or of ``path`` itself)."""
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


# ---------------------------------------------------------------------------
# the inputs: one valid set of files and many broken variants
# ---------------------------------------------------------------------------

Q, G, D = 6, 12, 8


def _write_zarr_variants(d: Path, gallery: np.ndarray) -> None:
    import zarr

    from rankwise.store import write_embeddings

    write_embeddings(
        d / "g_store.zarr", iter([gallery]), G, attrs={"encoder": "test"}, chunk_rows=4
    )
    # a store whose complete mark is missing (written by hand, or an old crash)
    shutil.copytree(d / "g_store.zarr", d / "g_incomplete.zarr")
    zarr.open_group(str(d / "g_incomplete.zarr"), mode="r+").attrs["complete"] = False
    # only the temporary store of an interrupted run
    shutil.copytree(d / "g_store.zarr", d / "g_left.zarr.tmp")
    # a group without the array
    zarr.open_group(str(d / "g_nogroup.zarr"), mode="w")
    nested = zarr.open_group(str(d / "g_nested.zarr"), mode="w")  # 'embeddings' a group
    nested.create_group("embeddings").create_array("x", data=gallery)
    objects = np.empty(len(gallery), dtype=object)  # a valid .npy of Python objects
    objects[:] = list(gallery)
    np.save(d / "g_objects.npy", objects, allow_pickle=True)
    # a chunk with garbage bytes (rows 4-7), and a chunk file deleted (rows 8-11)
    shutil.copytree(d / "g_store.zarr", d / "g_badchunk.zarr")
    (d / "g_badchunk.zarr" / "embeddings" / "c" / "1" / "0").write_bytes(b"garbage" * 9)
    shutil.copytree(d / "g_store.zarr", d / "g_nochunk.zarr")
    (d / "g_nochunk.zarr" / "embeddings" / "c" / "2" / "0").unlink()
    # a store with 11 rows for a 12-row manifest
    write_embeddings(d / "g_short.zarr", iter([gallery[:11]]), 11, attrs={"encoder": "t"})
    (d / "not_a_store").mkdir()


@pytest.fixture(scope="module")
def d(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad_inputs")
    rng = np.random.default_rng(0)
    q = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(Q)],
            "label": [str(i // 2) for i in range(Q)],
            "camera": [1] * Q,
            "sequence": ["A"] * Q,
            "frame": list(range(Q)),
            "sketch": [f"s{i // 2}" for i in range(Q)],
            "step": [1 + i % 2 for i in range(Q)],
        }
    )
    g = pd.DataFrame(
        {
            "id": [f"g{i}" for i in range(G)],
            "label": [str(i % 3) for i in range(G)],
            "camera": [2] * G,
            "sequence": ["A"] * G,
            "frame": list(range(G)),
        }
    )
    qe = rng.normal(size=(Q, D)).astype(np.float32)
    ge = rng.normal(size=(G, D)).astype(np.float32)
    q.to_csv(d / "q.csv", index=False)
    g.to_csv(d / "g.csv", index=False)
    np.save(d / "q.npy", qe)
    np.save(d / "g.npy", ge)

    # manifests
    q.drop(columns=["camera"]).to_csv(d / "q_nocam.csv", index=False)
    q.drop(columns=["label"]).to_csv(d / "q_nolabel.csv", index=False)
    q.drop(columns=["sketch"]).to_csv(d / "q_nosketch.csv", index=False)
    g.drop(columns=["frame"]).to_csv(d / "g_noframe.csv", index=False)
    bad = q.copy()
    bad.loc[3, "id"] = "q1"
    bad.to_csv(d / "q_dup.csv", index=False)
    bad = g.copy()
    bad.loc[10, "id"] = "g0"
    bad.to_csv(d / "g_dup.csv", index=False)
    q.iloc[:0].to_csv(d / "q_empty.csv", index=False)
    g.iloc[:0].to_csv(d / "g_empty.csv", index=False)
    bad = g.copy()
    bad["label"] = "other" + bad["label"]
    bad.to_csv(d / "g_nomatch.csv", index=False)
    bad = g.copy()
    bad["camera"] = 1  # every match is on the query's camera
    bad.to_csv(d / "g_samecam.csv", index=False)
    bad = q.astype(str)
    bad.loc[2, "frame"] = "2.5"
    bad.loc[4, "step"] = "x"
    bad.to_csv(d / "q_badint.csv", index=False)
    bad = g.astype(str)
    bad.loc[3, "frame"] = ""
    bad.to_csv(d / "g_emptyframe.csv", index=False)
    (d / "q_ragged.csv").write_text("id,label\nq0,0\nq1,0\nq2,1,extra\n")
    (d / "q_binary.csv").write_bytes(bytes(range(256)) * 4)

    # embeddings
    np.save(d / "q5.npy", qe[:5])
    np.save(d / "q0.npy", qe[:0])
    np.save(d / "q1d.npy", qe[:, 0])
    np.save(d / "q4d.npy", qe[:, :4])
    bad = ge.copy()
    bad[7, 3] = np.nan
    np.save(d / "g_nan.npy", bad)
    bad = qe.copy()
    bad[1, 0] = np.inf
    np.save(d / "q_inf.npy", bad)
    bad = ge.copy()
    bad[4] = 0
    np.save(d / "g_zero.npy", bad)
    bad = qe.copy()
    bad[2] = 0
    np.save(d / "q_zero.npy", bad)
    np.save(d / "q_text.npy", np.array([["a"] * D] * Q))
    raw = (d / "g.npy").read_bytes()
    (d / "g_trunc.npy").write_bytes(raw[: len(raw) // 2])
    (d / "g_garbage.npy").write_bytes(b"\x00not numpy" * 50)
    np.savez(d / "g_archive.npz", embeddings=ge)
    shutil.move(d / "g_archive.npz", d / "g_archive.npy")
    _write_zarr_variants(d, ge)

    # stores that record the manifest they were encoded from, and other manifests
    from rankwise.encoders import encode_manifest

    for side in ("q", "g"):
        encode_manifest(
            d / f"{side}.csv",
            "precomputed",
            {"path": str(d / f"{side}.npy")},
            d / f"{side}_enc.zarr",
            progress=False,
        )
    q.iloc[::-1].to_csv(d / "q_sorted.csv", index=False)  # same rows, another order
    pd.concat([g, g.iloc[:1].assign(id="g_new")]).to_csv(d / "g_added.csv", index=False)
    bad = q.copy()
    bad.loc[2, "label"] = " "
    bad.to_csv(d / "q_blanklabel.csv", index=False)
    return d


def inputs(d: Path, q="q.csv", g="g.csv", qe="q.npy", ge="g.npy") -> list[str]:
    return [
        "--query",
        d / q,
        "--gallery",
        d / g,
        "--query-embeddings",
        d / qe,
        "--gallery-embeddings",
        d / ge,
    ]


# (id, input files, extra options, regex of the one stderr line)
CASES = [
    # shapes
    (
        "rows-mismatch",
        dict(qe="q5.npy"),
        [],
        r"q5\.npy: query embeddings have 5 rows but \S*q\.csv has 6 rows; rows must align",
    ),
    (
        "rows-mismatch-zarr",
        dict(ge="g_short.zarr"),
        [],
        r"g_short\.zarr: gallery embeddings have 11 rows but \S*g\.csv has 12 rows",
    ),
    ("zero-row-npy", dict(qe="q0.npy"), [], r"q0\.npy: query embeddings have 0 rows"),
    ("one-d-npy", dict(qe="q1d.npy"), [], r"q1d\.npy: query embeddings must be 2-D"),
    ("text-npy", dict(qe="q_text.npy"), [], r"q_text\.npy: query embeddings have dtype <U1"),
    pytest.param("dim-mismatch", dict(qe="q4d.npy"), [], r"q4d\.npy.*dimension 4.*g\.npy.*8"),
    (
        "dim-mismatch-message",
        dict(qe="q4d.npy"),
        [],
        r"dimension 4 but .*\b8\b.*; encode both with the same model",
    ),
    # values
    (
        "nan-gallery-row",
        dict(ge="g_nan.npy"),
        [],
        r"g_nan\.npy: gallery embeddings row 7 \(0-based\) contains NaN or inf; fix or drop",
    ),
    (
        "inf-query-row",
        dict(qe="q_inf.npy"),
        ["--distance", "euclidean"],
        r"q_inf\.npy: query embeddings row 1 \(0-based\) contains NaN or inf",
    ),
    (
        "zero-vector-cosine-gallery",
        dict(ge="g_zero.npy"),
        [],
        r"g_zero\.npy: gallery embeddings row 4 \(0-based\) is a zero vector.*--distance euclidean",
    ),
    (
        "zero-vector-cosine-query",
        dict(qe="q_zero.npy"),
        ["--distance", "cosine"],
        r"q_zero\.npy: query embeddings row 2 \(0-based\) is a zero vector",
    ),
    # columns and rows of the manifests
    (
        "missing-camera-reid",
        dict(q="q_nocam.csv"),
        ["--protocol", "reid"],
        r"q_nocam\.csv: missing column\(s\) camera required by protocol 'reid' for the query; add",
    ),
    (
        "missing-frame-reassociation",
        dict(g="g_noframe.csv"),
        ["--protocol", "reassociation"],
        r"g_noframe\.csv: missing column\(s\) frame required by protocol 'reassociation' for the "
        r"gallery",
    ),
    (
        "missing-sketch-progressive",
        dict(q="q_nosketch.csv"),
        ["--protocol", "progressive"],
        r"q_nosketch\.csv: missing column\(s\) sketch required by protocol 'progressive'",
    ),
    ("missing-label", dict(q="q_nolabel.csv"), [], r"q_nolabel\.csv: missing column\(s\) label"),
    (
        "duplicate-id-query",
        dict(q="q_dup.csv"),
        [],
        r"q_dup\.csv: duplicate id 'q1' at rows 3 and 5; ids must be unique",
    ),
    (
        "duplicate-id-gallery",
        dict(g="g_dup.csv"),
        [],
        r"g_dup\.csv: duplicate id 'g0' at rows 2 and 12",
    ),
    (
        "empty-query",
        dict(q="q_empty.csv", qe="q0.npy"),
        [],
        r"q_empty\.csv: the query manifest has no rows; it needs at least one item",
    ),
    ("empty-gallery", dict(g="g_empty.csv"), [], r"g_empty\.csv: the gallery manifest has no rows"),
    (
        "non-integer-frame",
        dict(q="q_badint.csv"),
        ["--protocol", "reassociation"],
        r"q_badint\.csv: row 4: column 'frame' must be an integer, found '2\.5'",
    ),
    (
        "empty-frame",
        dict(g="g_emptyframe.csv"),
        ["--protocol", "reassociation"],
        r"g_emptyframe\.csv: row 5: column 'frame' must be an integer, found ''",
    ),
    (
        "non-integer-step",
        dict(q="q_badint.csv"),
        ["--protocol", "progressive"],
        r"q_badint\.csv: row 6: column 'step' must be an integer, found 'x'",
    ),
    (
        "no-valid-match",
        dict(g="g_nomatch.csv"),
        [],
        r"no query has a valid match in the gallery under protocol 'recall'.*same ids",
    ),
    pytest.param(
        "no-valid-match-names-files", dict(g="g_nomatch.csv"), [], r"q\.csv.*g_nomatch\.csv"
    ),
    (
        "no-valid-match-same-camera",
        dict(g="g_samecam.csv"),
        ["--protocol", "reid"],
        r"no query has a valid match.*'reid'.*other-camera matches",
    ),
    # names and numbers on the command line
    (
        "unknown-protocol",
        {},
        ["--protocol", "rei-d"],
        r"unknown protocol 'rei-d'; valid protocols: recall, reid, reassociation, progressive",
    ),
    (
        "unknown-distance",
        {},
        ["--distance", "cosin"],
        r"unknown distance 'cosin'; valid distances: cosine, euclidean",
    ),
    pytest.param("unknown-ap", {}, ["--ap", "trapz"], r"error: .*'trapz'.*standard.*trapezoid"),
    pytest.param(
        "non-integer-option",
        {},
        ["--query-block", "x"],
        r"error: Invalid value for '--query-block': 'x' is not a valid integer",
    ),
    ("ks-zero", {}, ["--ks", "0"], r"--ks must be positive integers .*got '0'"),
    ("ks-negative", {}, ["--ks", "1,-5"], r"--ks must be positive integers .*got '-5'"),
    ("ks-float", {}, ["--ks", "1.5"], r"--ks must be positive integers .*got '1\.5'"),
    ("ks-word", {}, ["--ks", "1,five"], r"--ks must be positive integers .*got 'five'"),
    ("ks-empty", {}, ["--ks", ""], r"--ks must be positive integers"),
    (
        "gap-frames-zero",
        {},
        ["--protocol", "reassociation", "--gap-frames", "0"],
        r"--gap-frames must be an integer in 1\.\.2147483647, got 0",
    ),
    ("query-block-zero", {}, ["--query-block", "0"], r"--query-block must be a positive integer"),
    (
        "gallery-chunk-negative",
        {},
        ["--gallery-chunk", "-3"],
        r"--gallery-chunk must be a positive integer",
    ),
    ("workers-zero", {}, ["--workers", "0"], r"--workers must be a positive integer"),
    # --memory-limit: refused before the gallery is read (its NaN row is never reached)
    (
        "memory-limit-too-small",
        dict(ge="g_nan.npy"),
        ["--memory-limit", "1"],
        r"memory limit 1 MB cannot be met: this run needs about \d+ MB \(6 queries x 12 gallery "
        r"x 8 dims, tiles 6 x 12, .*\); even one-row tiles on one worker need about \d+ MB: "
        r"raise the limit",
    ),
    (
        "memory-limit-zero",
        {},
        ["--memory-limit", "0"],
        r"--memory-limit must be a positive number of MB, got 0",
    ),
    pytest.param(
        "memory-limit-nan",
        {},
        ["--memory-limit", "nan"],
        r"--memory-limit must be a positive number of MB, got nan",
    ),
    # files
    (
        "manifest-not-found",
        dict(q="nope.csv"),
        [],
        r"nope\.csv: query manifest not found; pass an existing CSV file",
    ),
    (
        "manifest-ragged",
        dict(q="q_ragged.csv"),
        [],
        r"q_ragged\.csv: not a readable CSV manifest \(.*line 4.*\); write one header line",
    ),
    ("manifest-binary", dict(q="q_binary.csv"), [], r"q_binary\.csv: not a readable CSV manifest"),
    (
        "npy-not-found",
        dict(qe="nope.npy"),
        [],
        r"nope\.npy: query embeddings not found; pass a \.npy file or a Zarr store",
    ),
    (
        "npy-truncated",
        dict(ge="g_trunc.npy"),
        [],
        r"g_trunc\.npy: not a readable \.npy file .*truncated or corrupt: write it again",
    ),
    (
        "npy-garbage",
        dict(ge="g_garbage.npy"),
        [],
        r"g_garbage\.npy: not a \.npy file \(no NumPy header\); give an array written by numpy",
    ),
    (
        "npz-archive",
        dict(ge="g_archive.npy"),
        [],
        r"g_archive\.npy: expected a single \.npy array \(numpy\.save\), found an \.npz archive",
    ),
    # Zarr stores
    ("zarr-not-found", dict(ge="nope.zarr"), [], r"nope\.zarr: gallery embeddings not found"),
    (
        "zarr-leftover-tmp",
        dict(ge="g_left.zarr"),
        [],
        r"g_left\.zarr: gallery embeddings not found, only an incomplete 'g_left\.zarr\.tmp' left "
        r"by an interrupted run; run the command",
    ),
    (
        "zarr-incomplete",
        dict(ge="g_incomplete.zarr"),
        [],
        r"g_incomplete\.zarr: incomplete embedding store \(an interrupted encode\); "
        r"encode again \(it replaces the store\)",
    ),
    (
        "zarr-no-array",
        dict(ge="g_nogroup.zarr"),
        [],
        r"g_nogroup\.zarr: Zarr group has no array 'embeddings'",
    ),
    (
        "zarr-embeddings-a-group",
        dict(ge="g_nested.zarr"),
        [],
        r"g_nested\.zarr/embeddings is a Zarr group, not an array; store the \(N, D\)",
    ),
    (
        "npy-of-objects",
        dict(ge="g_objects.npy"),
        [],
        r"g_objects\.npy: an array of Python objects \(pickled\), not numbers; save the "
        r"embeddings as numbers",
    ),
    ("zarr-not-a-store", dict(ge="not_a_store"), [], r"not_a_store: not a readable Zarr store"),
    (
        "zarr-corrupt-chunk",
        dict(ge="g_badchunk.zarr"),
        [],
        r"g_badchunk\.zarr: cannot read rows 4-7 \(0-based\) of the gallery embeddings .*write it "
        r"again",
    ),
    (
        "zarr-missing-chunk",
        dict(ge="g_nochunk.zarr"),
        ["--distance", "euclidean"],
        r"g_nochunk\.zarr: rows 8-11 \(0-based\) of the gallery embeddings are missing from the "
        r"Zarr store",
    ),
    # a store opened with a manifest other than the one it was encoded from
    (
        "store-manifest-resorted",
        dict(q="q_sorted.csv", qe="q_enc.zarr"),
        [],
        r"q_enc\.zarr: query embeddings were encoded from \S*/q\.csv \(sha256 [0-9a-f]{12}\), "
        r"but \S*/q_sorted\.csv has other content \(sha256 [0-9a-f]{12}\), so rows would not "
        r"align: pass the manifest the store was encoded from, or encode \S*/q_sorted\.csv again",
    ),
    (
        "store-manifest-rows-added",
        dict(g="g_added.csv", ge="g_enc.zarr"),
        [],
        r"g_enc\.zarr: gallery embeddings were encoded from \S*/g\.csv .*but \S*/g_added\.csv "
        r"has other content",
    ),
]


def _case_id(case) -> str:
    return case.values[0] if hasattr(case, "values") else case[0]


@pytest.mark.parametrize("name, files, extra, pattern", CASES, ids=[_case_id(c) for c in CASES])
def test_evaluate_refuses(d, tmp_path, name, files, extra, pattern):
    output = tmp_path / "report.json"
    output.write_text("SENTINEL: an earlier report\n")
    proc = run("evaluate", *inputs(d, **files), *extra, "--output", output)
    assert_one_line_error(proc, pattern)
    assert output.read_text() == "SENTINEL: an earlier report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


RANK_CASES = [
    "rows-mismatch",
    "nan-gallery-row",
    "zero-vector-cosine-gallery",
    "no-valid-match",
    "unknown-protocol",
    "zarr-corrupt-chunk",
    "zarr-missing-chunk",
    "memory-limit-too-small",
    "store-manifest-resorted",
    "store-manifest-rows-added",
]


@pytest.fixture(scope="module")
def ranks_store(d) -> Path:
    """A complete ranks store of the valid inputs."""
    out = d / "good_ranks.zarr"
    proc = run("rank", *inputs(d), "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize(
    "name, existing",
    [(n, i % 2 == 1) for i, n in enumerate(RANK_CASES)],
    ids=[f"{n}-{'old-store' if i % 2 else 'no-store'}" for i, n in enumerate(RANK_CASES)],
)
def test_rank_leaves_no_store(d, tmp_path, ranks_store, name, existing):
    """A failed `rank` writes nothing under --out (nor a .tmp), and an older store keeps
    every byte.  Half the cases start with an old store, half without."""
    case = next(c for c in CASES if _case_id(c) == name)
    _, files, extra, pattern = case
    out = tmp_path / "ranks.zarr"
    if existing:
        shutil.copytree(ranks_store, out)
    before = tree_digest(out) if existing else None
    proc = run("rank", *inputs(d, **files), *extra, "--out", out)
    assert_one_line_error(proc, pattern)
    assert not (tmp_path / "ranks.zarr.tmp").exists()
    if existing:
        assert tree_digest(out) == before
    else:
        assert not out.exists()


def test_valid_inputs_work(d, tmp_path):
    """Control: the unbroken files evaluate (so every failure above is the broken file's)."""
    proc = run("evaluate", *inputs(d), "--output", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["num_queries"] == Q and report["num_gallery"] == G
    # a zero vector is fine under euclidean, and a complete Zarr store reads like the .npy
    proc = run("evaluate", *inputs(d, ge="g_zero.npy"), "--distance", "euclidean")
    assert proc.returncode == 0, proc.stderr
    proc = run("evaluate", *inputs(d, ge="g_store.zarr"), "--output", tmp_path / "z.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "z.json").read_text()) == report
    # a limit the run fits in changes nothing
    proc = run("evaluate", *inputs(d), "--memory-limit", "100000", "--output", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "m.json").read_text()) == report
    # stores that record their manifest open with it, or with a byte-identical copy
    shutil.copy(d / "q.csv", tmp_path / "q_copy.csv")
    proc = run(
        "evaluate",
        "--query",
        tmp_path / "q_copy.csv",
        "--gallery",
        d / "g.csv",
        "--query-embeddings",
        d / "q_enc.zarr",
        "--gallery-embeddings",
        d / "g_enc.zarr",
        "--output",
        tmp_path / "e.json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "e.json").read_text()) == report


def test_forked_cli_matches_console_script(d, tmp_path):
    """The fork server runs exactly what the console script runs: same status, same
    stdout, same stderr, for an error raised early (manifest), one raised inside the
    Dask engine (a NaN gallery row), and a success."""
    argvs = [
        ["evaluate", *inputs(d, q="q_dup.csv")],
        ["rank", *inputs(d, ge="g_nan.npy"), "--out", tmp_path / "r.zarr"],
        ["evaluate", *inputs(d), "--ks", "1,2"],
    ]
    for argv in argvs:
        script, forked = run_script(*argv), run(*argv)
        assert (script.returncode, script.stdout, visible_lines(script.stderr)) == (
            forked.returncode,
            forked.stdout,
            visible_lines(forked.stderr),
        )
    assert not (tmp_path / "r.zarr").exists()


# ---------------------------------------------------------------------------
# metrics / compare / ci on ranks stores
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_stores(d, ranks_store) -> Path:
    import zarr

    shutil.copytree(ranks_store, d / "r_incomplete.zarr")
    group = zarr.open_group(str(d / "r_incomplete.zarr"), mode="r+")
    group.attrs["complete"] = False
    shutil.copytree(ranks_store, d / "r_left.zarr.tmp")
    shutil.copytree(ranks_store, d / "r_noarray.zarr")
    shutil.rmtree(d / "r_noarray.zarr" / "ranks")
    # a partial copy: a chunk file of the ranks gone (zarr would read zeros)
    shutil.copytree(ranks_store, d / "r_nochunk.zarr")
    chunks = sorted(p for p in (d / "r_nochunk.zarr" / "ranks" / "c").rglob("*") if p.is_file())
    chunks[0].unlink()
    # the same of the unit keys (the statistics' unit order: read as zeros, exit 0)
    shutil.copytree(ranks_store, d / "r_nokeys.zarr")
    keys = d / "r_nokeys.zarr" / "unit_key" / "c"
    for chunk in [p for p in keys.rglob("*") if p.is_file()]:
        chunk.unlink()
    # a chunk file cut short
    shutil.copytree(ranks_store, d / "r_cut.zarr")
    chunk = sorted(p for p in (d / "r_cut.zarr" / "ranks" / "c").rglob("*") if p.is_file())[0]
    chunk.write_bytes(chunk.read_bytes()[:5])
    return d


STORE_CASES = [
    ("missing", ["metrics", "{d}/r_none.zarr"], r"r_none\.zarr: store not found"),
    (
        "leftover-tmp",
        ["metrics", "{d}/r_left.zarr"],
        r"r_left\.zarr: store not found \(found an incomplete 'r_left\.zarr\.tmp' from an "
        r"interrupted run: run the command again\)",
    ),
    (
        "no-complete-mark",
        ["metrics", "{d}/r_incomplete.zarr"],
        r"r_incomplete\.zarr: incomplete store \(no 'complete' mark\); run the command that "
        r"writes it again \(it replaces the store\)",
    ),
    (
        "missing-array",
        ["metrics", "{d}/r_noarray.zarr"],
        r"r_noarray\.zarr: ranks store lacks array 'ranks'; run `rankwise rank` again with this "
        r"--out \(it replaces the store\)",
    ),
    (
        "missing-chunk",
        ["metrics", "{d}/r_nochunk.zarr"],
        r"r_nochunk\.zarr: the ranks store is inconsistent \(a rank below 1\): an interrupted "
        r"write or a partial copy; run `rankwise rank` again",
    ),
    (
        "missing-key-chunk",
        ["ci", "{d}/r_nokeys.zarr"],
        r"r_nokeys\.zarr: the ranks store is inconsistent \(a unit key listed twice\)",
    ),
    (
        "cut-chunk",
        ["scores", "{d}/r_cut.zarr"],
        r"r_cut\.zarr: array 'ranks' of the ranks store cannot be read \(\w+\); the store is "
        r"corrupt",
    ),
    (
        "wrong-kind",
        ["metrics", "{d}/g_store.zarr"],
        r"g_store\.zarr: a rankwise embeddings store, not a ranks store; give the ranks store "
        r"written by `rankwise rank`",
    ),
    ("not-a-store", ["metrics", "{d}/g.npy"], r"g\.npy: not a readable Zarr store"),
    (
        "metrics-ks",
        ["metrics", "{d}/good_ranks.zarr", "--ks", "5,0"],
        r"--ks must be positive integers .*got '0'",
    ),
    (
        "compare-unknown-metric",
        ["compare", "{d}/good_ranks.zarr", "{d}/good_ranks.zarr", "--metrics", "map,precision"],
        r"unknown metric 'precision' for protocol 'recall'; valid metrics: recall@K, map, mrr, "
        r"minp",
    ),
    (
        "ci-metric-of-other-protocol",
        ["ci", "{d}/good_ranks.zarr", "--metrics", "rank1"],
        r"unknown metric 'rank1' for protocol 'recall'; valid metrics: recall@K",
    ),
    ("scores-ks", ["scores", "{d}/good_ranks.zarr", "--ks", "x"], r"--ks must be positive"),
]


@pytest.mark.parametrize("name, argv, pattern", STORE_CASES, ids=[c[0] for c in STORE_CASES])
def test_store_commands_refuse(bad_stores, tmp_path, name, argv, pattern):
    argv = [a.format(d=bad_stores) for a in argv]
    output = tmp_path / "out.json"
    output.write_text("SENTINEL\n")
    proc = run(*argv, "--output", output)
    assert_one_line_error(proc, pattern)
    assert output.read_text() == "SENTINEL\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# ---------------------------------------------------------------------------
# report: the worst queries reopen the inputs the ranks store names
# ---------------------------------------------------------------------------


def _break_gallery_row(work: Path) -> None:
    gallery = np.load(work / "g.npy")
    gallery[7, 3] = np.nan
    np.save(work / "g.npy", gallery)


def _resort_query_manifest(work: Path) -> None:
    table = pd.read_csv(work / "q.csv", dtype=str, keep_default_na=False)
    table.iloc[::-1].to_csv(work / "q.csv", index=False)


def _encode_query_again(work: Path) -> None:
    """The query store encoded again from another file (the same rows, a copy)."""
    from rankwise.encoders import encode_manifest

    shutil.rmtree(work / "q.zarr")
    shutil.copy(work / "q.npy", work / "copy.npy")
    options = {"path": str(work / "copy.npy")}
    encode_manifest(work / "q.csv", "precomputed", options, work / "q.zarr", progress=False)


# (id, what changes after ranking, regex of the one stderr line)
REPORT_CASES = [
    (
        "report-nan-gallery-row",
        _break_gallery_row,
        r"g\.npy: gallery embeddings row 7 \(0-based\) contains NaN or inf; fix or drop",
    ),
    (
        "report-query-manifest-changed",
        _resort_query_manifest,
        r"\S*q\.csv: not the query manifest the ranks were computed from \(its sha256 "
        r"[0-9a-f]{12} differs from the ranks store's [0-9a-f]{12}: edited, re-sorted or "
        r"another file\); restore it, or rank again",
    ),
    (
        "report-query-embeddings-encoded-again",
        _encode_query_again,
        r"\S*q\.zarr: not the query embeddings the ranks were computed from \(its "
        r"'\w+' differs from the ranks store's record: encoded again or another "
        r"store\); restore them, or rank again",
    ),
]


@pytest.mark.parametrize("name, change, pattern", REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report_refuses_changed_inputs(d, tmp_path, name, change, pattern):
    """`rankwise report` lists each worst query's nearest gallery items from the
    manifests and embeddings the ranks store names: inputs changed since ranking (a NaN
    row, a re-sorted manifest) stop it with one line, and no report is written."""
    from rankwise.encoders import encode_manifest

    work = tmp_path / "work"
    work.mkdir()
    for name_ in ("q.csv", "g.csv", "g.npy", "q.npy"):
        shutil.copy(d / name_, work / name_)
    encode_manifest(
        work / "q.csv", "precomputed", {"path": str(d / "q.npy")}, work / "q.zarr", progress=False
    )
    metrics = work / "metrics" / "toy" / "enc.json"
    for argv in (
        [
            "rank",
            "--query",
            work / "q.csv",
            "--gallery",
            work / "g.csv",
            "--query-embeddings",
            work / "q.zarr",
            "--gallery-embeddings",
            work / "g.npy",
            "--out",
            work / "ranks.zarr",
        ],
        ["metrics", work / "ranks.zarr", "--output", metrics],
    ):
        proc = run(*argv)
        assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    proc = run("report", metrics, "--out-dir", out, "--resamples", "0")
    assert proc.returncode == 0, proc.stderr  # control: the unchanged inputs report
    shutil.rmtree(out)
    change(work)
    proc = run("report", metrics, "--out-dir", out, "--resamples", "0")
    assert_one_line_error(proc, pattern)
    assert not out.exists() or sorted(out.iterdir()) == []


def test_output_blocked_by_a_file_is_one_line(d, tmp_path):
    """An output path through an existing file is refused when the options are parsed,
    before any work: one line naming that file, exit status 2, nothing on stdout (no
    ranking ran), for every writing command."""
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder\n")
    ranks, metrics = tmp_path / "ranks.zarr", tmp_path / "m.json"
    assert run("rank", *inputs(d), "--out", ranks).returncode == 0
    assert run("metrics", ranks, "--output", metrics).returncode == 0
    pattern = rf"{re.escape(str(blocker))} is a file where a folder is needed"
    for argv in (
        ["evaluate", *inputs(d), "--output", blocker / "sub" / "r.json"],
        ["rank", *inputs(d), "--out", blocker / "r.zarr"],
        ["metrics", ranks, "--output", blocker / "m.json"],
        ["metrics", ranks, "--stats-output", blocker / "m.npz"],
        [
            "report",
            metrics,
            "--resamples",
            "0",
            "--json",
            tmp_path / "r.json",
            "--figures",
            blocker / "figures",
        ],
        [
            "encode",
            "--manifest",
            d / "q.csv",
            "--kind",
            "precomputed",
            "--options",
            json.dumps({"path": str(d / "q.npy")}),
            "--out",
            blocker / "q.zarr",
        ],
    ):
        proc = run(*argv)
        assert_one_line_error(proc, pattern)
        assert proc.stdout == ""
    assert blocker.read_text() == "a file, not a folder\n"
    assert not (tmp_path / "r.json").exists()  # the report wrote nothing


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_os_error_while_writing_is_one_line(d):
    """A file-system error the up-front check cannot foresee (here /proc, a folder no one
    can create files in, even root) is one line naming the path, exit status 2."""
    proc = run("evaluate", *inputs(d), "--output", "/proc/rankwise-test.json")
    line = assert_one_line_error(proc, r"/proc/rankwise-test\.json\S*: ")
    assert "can be read or written" in line
    assert proc.stdout == ""  # no metrics that look like a finished run


# ---------------------------------------------------------------------------
# the pipeline: encode, config validation
# ---------------------------------------------------------------------------


def _has_encode() -> bool:
    source = ROOT / "workflow" / "rankwise" / "cli" / "pipeline.py"
    return source.exists() and "def encode(" in source.read_text()


needs_encode = pytest.mark.skipif(not _has_encode(), reason="`rankwise encode` not there yet")
needs_pipeline = pytest.mark.skipif(
    not (ROOT / "Snakefile").exists(), reason="the Snakefile is not there yet"
)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    (d / "img").mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (16, 8, 3), dtype=np.uint8)).save(d / f"img/{i}.png")
    (d / "img/broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    rows = "id,label,path\na,0,img/0.png\nb,1,img/1.png\nc,2,img/2.png\n"
    (d / "ok.csv").write_text(rows)
    (d / "missing.csv").write_text(rows.replace("img/1.png", "img/gone.png"))
    (d / "broken.csv").write_text(rows.replace("img/2.png", "img/broken.png"))
    (d / "nopath.csv").write_text("id,label\na,0\n")
    (d / "emptypath.csv").write_text(rows.replace("img/1.png", " "))
    return d


ENCODE_CASES = [
    (
        "missing-image",
        "missing.csv",
        "pixels",
        "{}",
        r"missing\.csv: row 3 \(id 'b'\): image 'img/gone\.png' not found \(looked for "
        r".*img/gone\.png\); fix the 'path' column or restore the file",
    ),
    (
        "unreadable-image",
        "broken.csv",
        "pixels",
        "{}",
        r"broken\.csv: row 4 \(id 'c'\): cannot decode image .*broken\.png .*replace the file",
    ),
    (
        "missing-path-column",
        "nopath.csv",
        "pixels",
        "{}",
        r"nopath\.csv: missing column 'path' needed by the pixels encoder",
    ),
    (
        "empty-path",
        "emptypath.csv",
        "pixels",
        "{}",
        r"emptypath\.csv: row 3: empty 'path'; every item needs a path",
    ),
    (
        "missing-onnx-checkpoint",
        "ok.csv",
        "onnx",
        '{"model": "ckpt/missing.onnx"}',
        r"ckpt/missing\.onnx: onnx model file not found; check options\.model",
    ),
    (
        "missing-python-checkpoint",
        "ok.csv",
        "python",
        '{"factory": "numpy:ones", "checkpoint": "ckpt/epoch9.pt"}',
        r"ckpt/epoch9\.pt: .*not found",
    ),
    ("unknown-kind", "ok.csv", "resnet", "{}", r"unknown encoder kind 'resnet'; valid kinds: "),
]


@needs_encode
@pytest.mark.parametrize(
    "name, manifest, kind, options, pattern", ENCODE_CASES, ids=[c[0] for c in ENCODE_CASES]
)
def test_encode_refuses(images, tmp_path, name, manifest, kind, options, pattern):
    out = tmp_path / "emb.zarr"
    proc = run(
        "encode",
        "--manifest",
        images / manifest,
        "--kind",
        kind,
        "--options",
        options,
        "--out",
        out,
        "--no-progress",
        cwd=tmp_path,
    )
    assert_one_line_error(proc, pattern)
    assert not out.exists() and not (tmp_path / "emb.zarr.tmp").exists()


# `rankwise encode` reads its manifest and its precomputed vectors with the readers
# ranking uses: (id, manifest, precomputed source, regex of the one stderr line)
READER_ENCODE_CASES = [
    (
        "precomputed-missing-chunk",
        "g.csv",
        "g_nochunk.zarr",
        r"g_nochunk\.zarr: rows 8-11 \(0-based\) of the precomputed embeddings are missing from "
        r"the Zarr store \(no chunk file 'c/2/0'\); the store is incomplete",
    ),
    (
        "precomputed-corrupt-chunk",
        "g.csv",
        "g_badchunk.zarr",
        r"g_badchunk\.zarr: cannot read rows 4-7 \(0-based\) of the precomputed embeddings",
    ),
    (
        "precomputed-incomplete-store",
        "g.csv",
        "g_incomplete.zarr",
        r"g_incomplete\.zarr: incomplete embedding store \(an interrupted encode\); "
        r"encode again \(it replaces the store\)",
    ),
    (
        "precomputed-rows",
        "g.csv",
        "g_short.zarr",
        r"g_short\.zarr: precomputed embeddings have 11 rows but \S*g\.csv has 12 rows",
    ),
    (
        "precomputed-text-dtype",
        "q.csv",
        "q_text.npy",
        r"q_text\.npy: precomputed embeddings have dtype <U1; expected numbers",
    ),
    (
        "precomputed-store-of-other-manifest",
        "q_sorted.csv",
        "q_enc.zarr",
        r"q_enc\.zarr: precomputed embeddings were encoded from \S*/q\.csv .*but "
        r"\S*/q_sorted\.csv has other content",
    ),
    (
        "encode-duplicate-id",
        "q_dup.csv",
        "q.npy",
        r"q_dup\.csv: duplicate id 'q1' at rows 3 and 5; ids must be unique",
    ),
    (
        "encode-missing-label",
        "q_nolabel.csv",
        "q.npy",
        r"q_nolabel\.csv: missing column\(s\) label required by every protocol for the query "
        r"and the gallery; add them",
    ),
    (
        "encode-blank-label",
        "q_blanklabel.csv",
        "q.npy",
        r"q_blanklabel\.csv: row 4: empty 'label'; every item needs a label",
    ),
    (
        "encode-no-rows",
        "q_empty.csv",
        "q0.npy",
        r"q_empty\.csv: the manifest has no rows; it needs at least one item",
    ),
    (
        "encode-manifest-not-found",
        "nope.csv",
        "q.npy",
        r"nope\.csv: manifest not found; pass an existing CSV file",
    ),
]


@pytest.mark.parametrize(
    "name, manifest, source, pattern", READER_ENCODE_CASES, ids=[c[0] for c in READER_ENCODE_CASES]
)
def test_encode_reader_refuses(d, tmp_path, name, manifest, source, pattern):
    out = tmp_path / "emb.zarr"
    proc = run(
        "encode",
        "--manifest",
        d / manifest,
        "--kind",
        "precomputed",
        "--options",
        json.dumps({"path": str(d / source)}),
        "--out",
        out,
        "--no-progress",
    )
    assert_one_line_error(proc, pattern)
    assert sorted(tmp_path.iterdir()) == []


def test_encode_precomputed_copies_the_rows(d, tmp_path):
    """Control: the intact sources encode to exactly their rows."""
    from rankwise.embeddings import open_embeddings

    for source in ("g.npy", "g_store.zarr", "g_enc.zarr"):
        out = tmp_path / f"{source}.zarr"
        proc = run(
            "encode",
            "--manifest",
            d / "g.csv",
            "--kind",
            "precomputed",
            "--options",
            json.dumps({"path": str(d / source)}),
            "--out",
            out,
            "--no-progress",
        )
        assert proc.returncode == 0, proc.stderr
        np.testing.assert_array_equal(
            open_embeddings(out, name="x").read(0, G), np.load(d / "g.npy")
        )


def snakemake_dry_run(workdir: Path, config: str) -> subprocess.CompletedProcess:
    (workdir / "config.yaml").write_text(config)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(ROOT / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--replace-workflow-config",
        "--cores",
        "1",
        "--workflow-profile",
        "none",
        "--dry-run",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _config(dataset_extra: str = "", encoder: str = "{kind: pixels}", engine: str = "") -> str:
    return (
        "datasets:\n  d:\n    loader: demo-market\n    options: {seed: 1}\n"
        "    protocol: reid\n" + dataset_extra + f"encoders:\n  e: {encoder}\n" + engine
    )


CONFIG_CASES = [
    (
        "unknown-dataset-key",
        _config("    protocl: recall\n"),
        [r"config\.yaml:6: datasets\.d\.protocl: unknown key 'protocl'; did you mean 'protocol'\?"],
    ),
    (
        "unknown-top-key",
        _config() + "engnie: {threads: 1}\n",
        [r"config\.yaml:8: engnie: unknown key 'engnie'; did you mean 'engine'\?"],
    ),
    (
        "wrong-type-ks",
        _config("    ks: [1, five]\n"),
        [r"config\.yaml:6: datasets\.d\.ks\[1\]: expected integer, got 'five'"],
    ),
    (
        "wrong-type-engine",
        _config(engine="engine: {threads: two}\n"),
        [r"config\.yaml:8: engine\.threads: expected integer, got 'two'"],
    ),
    (
        "unknown-encoder-option",
        _config(encoder="{kind: pixels, options: {colour: true}}"),
        [
            r"config\.yaml:7: encoders\.e\.options\.colour: unknown key 'colour'; "
            r"valid: grayscale, "
            r"size"
        ],
    ),
    (
        "missing-checkpoint",
        _config(encoder="{kind: onnx, options: {model: ckpt/net.onnx, input_size: [16, 8]}}"),
        [
            r"config\.yaml:7: encoders\.e\.options\.model: ckpt/net\.onnx not found .*; fix the "
            r"path or remove the entry"
        ],
    ),
]


@needs_pipeline
@pytest.mark.parametrize("name, config, patterns", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_pipeline_config_refused(tmp_path, name, config, patterns):
    """Snakemake stops before any job with one line naming the file, line and key path."""
    proc = snakemake_dry_run(tmp_path, config)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]  # the commands' status for bad input
    assert len(text.strip().splitlines()) <= 3, text[-3000:]
    for pattern in patterns:
        assert re.search(pattern, text), f"{pattern!r} not in:\n{text[-3000:]}"
    assert not (tmp_path / "results").exists()


# ---------------------------------------------------------------------------
# large inputs: a 2M x 128 gallery in a Zarr store (RANKWISE_SLOW=1)
# ---------------------------------------------------------------------------

LARGE_G, LARGE_D, LARGE_Q, LARGE_CHUNK = 2_000_000, 128, 200, 65_536
_skip_unless_slow = pytest.mark.skipif(
    os.environ.get("RANKWISE_SLOW") != "1", reason="2M x 128 gallery (~1 min); set RANKWISE_SLOW=1"
)


def slow(test):
    """``@pytest.mark.slow``, skipped unless ``RANKWISE_SLOW=1``."""
    return pytest.mark.slow(_skip_unless_slow(test))


# Runs one command and reports the peak RSS of its process tree's largest process:
# RUSAGE_CHILDREN of a fresh interpreter whose only child is that command.
_MEASURE = r"""
import json, resource, subprocess, sys, time
start = time.monotonic()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
                  "seconds": time.monotonic() - start,
                  "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def measured(*args) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, RANKWISE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> dict:
    """2M x 128 integer-valued float32 gallery (exact euclidean distances, many ties) in a
    Zarr store chunked by 65,536 rows; 200 queries that are noisy copies of gallery rows."""
    import zarr

    d = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(5)
    glab = rng.integers(0, 20_000, LARGE_G)
    pd.DataFrame({"id": np.char.add("g", np.arange(LARGE_G).astype(str)), "label": glab}).to_csv(
        d / "g.csv", index=False
    )
    source_rows = np.sort(rng.choice(LARGE_G, LARGE_Q, replace=False))
    pd.DataFrame({"id": [f"q{i}" for i in range(LARGE_Q)], "label": glab[source_rows]}).to_csv(
        d / "q.csv", index=False
    )
    group = zarr.open_group(str(d / "g.zarr"), mode="w")
    array = group.create_array(
        "embeddings", shape=(LARGE_G, LARGE_D), dtype="float32", chunks=(LARGE_CHUNK, LARGE_D)
    )
    queries = np.empty((LARGE_Q, LARGE_D), np.float32)
    for start in range(0, LARGE_G, LARGE_CHUNK):
        stop = min(start + LARGE_CHUNK, LARGE_G)
        rows = np.random.default_rng(start).integers(-3, 4, (stop - start, LARGE_D))
        rows = rows.astype(np.float32)
        array[start:stop] = rows
        inside = (source_rows >= start) & (source_rows < stop)
        queries[inside] = rows[source_rows[inside] - start]
    queries += rng.integers(-1, 2, queries.shape).astype(np.float32)
    np.save(d / "q.npy", queries)
    argv = [
        "--query",
        d / "q.csv",
        "--gallery",
        d / "g.csv",
        "--query-embeddings",
        d / "q.npy",
        "--gallery-embeddings",
        d / "g.zarr",
        "--protocol",
        "recall",
        "--distance",
        "euclidean",
        "--workers",
        "2",
    ]
    # the estimate, from the refusal of an impossible limit
    refused = measured("rank", *argv, "--memory-limit", "1", "--out", d / "refused.zarr")
    match = re.search(r"needs about (\d+) MB", refused["stderr"])
    assert refused["rc"] == 2 and match, refused["stderr"]
    assert not (d / "refused.zarr").exists()
    estimate = int(match[1])
    # the run, under that limit
    run_ = measured("rank", *argv, "--memory-limit", estimate, "--out", d / "ranks.zarr")
    return {"dir": d, "estimate": estimate, "run": run_, "refused": refused, "labels": glab}


@slow
def test_large_gallery_runs_in_bounded_memory(large):
    run_ = large["run"]
    assert run_["rc"] == 0, run_["stderr"][-3000:]
    gallery_mb = LARGE_G * LARGE_D * 4 / 2**20  # 977 MB of float32
    print(
        f"estimate {large['estimate']} MB, peak RSS {run_['peak_mb']:.0f} MB, "
        f"{run_['seconds']:.0f} s; refusal: peak {large['refused']['peak_mb']:.0f} MB, "
        f"{large['refused']['seconds']:.1f} s"
    )
    assert run_["peak_mb"] < 0.8 * gallery_mb, "the gallery was held in memory"


@slow
def test_large_gallery_memory_limit_is_honoured(large):
    """A run accepted under --memory-limit X stays under X MB."""
    assert large["run"]["rc"] == 0
    assert large["run"]["peak_mb"] <= large["estimate"], (
        f"peak {large['run']['peak_mb']:.0f} MB > accepted limit {large['estimate']} MB"
    )


@slow
def test_large_gallery_ranks_match_brute_force(large):
    """Ranks of 20 queries against an exact float64 count over the 2M rows."""
    import zarr

    from rankwise.store import read_ranks

    assert large["run"]["rc"] == 0, large["run"]["stderr"][-3000:]
    d = large["dir"]
    arrays, attrs = read_ranks(d / "ranks.zarr")
    assert attrs["num_gallery"] == LARGE_G and attrs["num_queries"] == LARGE_Q
    pick = np.random.default_rng(0).choice(LARGE_Q, 20, replace=False)
    q = np.load(d / "q.npy")[pick].astype(np.float64)
    qlab = pd.read_csv(d / "q.csv")["label"].to_numpy()[pick]
    gallery = zarr.open_array(str(d / "g.zarr"), path="embeddings", mode="r")
    dist = np.empty((len(pick), LARGE_G))
    for start in range(0, LARGE_G, LARGE_CHUNK):
        g = gallery[start : start + LARGE_CHUNK].astype(np.float64)
        dist[:, start : start + len(g)] = (
            (g * g).sum(1)[None, :] - 2 * q @ g.T + (q * q).sum(1)[:, None]
        )
    position = {int(i): n for n, i in enumerate(arrays["query_index"])}
    for k, i in enumerate(pick):
        relevant = large["labels"] == qlab[k]
        rel = np.sort(dist[k, relevant])
        other = np.sort(dist[k, ~relevant])
        expected = 1 + np.searchsorted(other, rel, side="right") + np.arange(len(rel))
        n = position[int(i)]
        got = arrays["ranks"][arrays["offsets"][n] : arrays["offsets"][n + 1]]
        np.testing.assert_array_equal(got, expected)


def test_reassociation_without_any_candidate_names_gap_frames():
    """No query has an item of its sequence at frame + gap_frames: the message says so
    (not "check the labels")."""
    import rankwise
    from rankwise.errors import RankwiseError

    rows = [
        {"id": f"t{t}_f{f}", "label": f"t{t}", "sequence": "S", "frame": f}
        for f in range(1, 6)
        for t in range(3)
    ]
    table = pd.DataFrame(rows)
    emb = np.random.default_rng(0).normal(size=(len(rows), 4)).astype(np.float32)
    with pytest.raises(RankwiseError, match=r"gap_frames=10 \(gallery frames 1\.\.5; 15 queries"):
        rankwise.evaluate(table, table, emb, emb, protocol="reassociation", gap_frames=10)
    ok = rankwise.evaluate(table, table, emb, emb, protocol="reassociation", gap_frames=4)
    assert (ok.num_queries, ok.num_skipped) == (3, 12)  # only frame 1 has frame + 4


# ---------------------------------------------------------------------------
# outputs never destroy inputs or a user's folder
# ---------------------------------------------------------------------------


def test_outputs_never_replace_what_an_input_store_or_report_names(d, tmp_path):
    """A ranks store names its manifests and embeddings, a metrics JSON those and its
    ranks store: `ci --by identity` and the report read them again. `metrics r.zarr
    --text-output q.csv` replaced the manifest (exit 0); now one line, nothing written."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("q.csv", "g.csv", "q.npy", "g.npy"):
        shutil.copy(d / name, work / name)
    store = work / "r.zarr"
    assert run("rank", *inputs(work), "--out", store).returncode == 0
    before = {name: (work / name).read_bytes() for name in ("q.csv", "g.csv", "q.npy")}
    cases = [
        (["metrics", store, "--text-output", work / "q.csv"], "--text-output", "query manifest"),
        (["scores", store, "--output", work / "g.csv"], "--output", "gallery manifest"),
        (["compare", store, store, "--output", work / "q.csv"], "--output", "query manifest"),
        (["ci", store, "--output", work / "q.npy"], "--output", "query embeddings"),
    ]
    for args, flag, what in cases:
        proc = run(*args)
        assert_one_line_error(proc, rf"{flag} \S+ is also its {what}, named by \S*r\.zarr")
    metrics = work / "m.json"
    assert run("metrics", store, "--output", metrics).returncode == 0
    proc = run(
        "report", metrics, "--resamples", 10, "--out-dir", work / "rep", "--md", work / "q.npy"
    )
    assert_one_line_error(proc, r"--md \S+q\.npy is also its query embeddings, named by \S*m\.json")
    assert {name: (work / name).read_bytes() for name in before} == before
    # the files --out-dir fills in are checked alike: an input metrics file named
    # report.json was replaced by the report (exit 0), and the next report read that
    report_json = work / "report.json"
    shutil.copy(metrics, report_json)
    kept = report_json.read_bytes()
    for where in (["--out-dir", work], []):  # named, and the default: the working folder
        proc = run("report", metrics, report_json, "--resamples", 10, *where, cwd=work)
        assert_one_line_error(
            proc,
            r"--out-dir \S*report\.json is also metrics \(an input\): it would be overwritten; "
            "give --out-dir another folder, or name the files with --html, --md and --json",
        )
    assert report_json.read_bytes() == kept and not (work / "report.html").exists()


def test_a_store_ranked_on_relative_paths_names_its_files_from_any_folder(d, tmp_path):
    """A ranks store keeps its manifests' and embeddings' paths as typed, relative to
    the folder `rankwise rank` ran in: from another folder the output check looked for
    them there and `ci r.zarr --output q.csv` in the data's folder replaced the query
    manifest (exit 0). The store now records that folder: refused from anywhere, and
    `ci --by identity` finds the query labels from anywhere too."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("q.csv", "g.csv", "q.npy", "g.npy"):
        shutil.copy(d / name, data / name)
    relative = inputs(Path("data"))
    assert run("rank", *relative, "--out", "data/r.zarr", cwd=tmp_path).returncode == 0
    before = {name: (data / name).read_bytes() for name in ("q.csv", "g.csv", "q.npy")}
    for args, what in (
        (["ci", "r.zarr", "--resamples", 10, "--output", "q.csv"], "query manifest"),
        (["scores", "r.zarr", "--output", "g.csv"], "gallery manifest"),
        (["metrics", "r.zarr", "--text-output", "q.npy"], "query embeddings"),
    ):
        proc = run(*args, cwd=data)
        assert_one_line_error(proc, rf"\S+ is also its {what}, named by r\.zarr \(an input\)")
    assert {name: (data / name).read_bytes() for name in before} == before
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    by_identity = ["--resamples", 20, "--by", "identity", "--metrics", "map"]
    here = run("ci", "data/r.zarr", *by_identity, cwd=tmp_path)
    there = run("ci", "../data/r.zarr", *by_identity, cwd=elsewhere)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert here.stdout.split("\n", 1)[1] == there.stdout.split("\n", 1)[1]  # after the name


def test_outputs_never_land_inside_an_input_store(ranks_store, tmp_path):
    """`ci r.zarr --output r.zarr/zarr.json` replaced the store's metadata (exit 0; every
    later command: "incomplete store"); an output inside a store an input is or names
    is now one line, nothing written."""
    store = tmp_path / "r.zarr"
    shutil.copytree(ranks_store, store)
    before = {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    cases = [
        (["ci", store, "--resamples", 5, "--output", store / "zarr.json"], "--output", "ranks"),
        (["compare", store, store, "--output", store / "c.json"], "--output", "ranks_a"),
    ]
    for args, flag, what in cases:
        proc = run(*args)
        assert_one_line_error(proc, rf"{flag} \S+ is inside \S*r\.zarr, {what} \(an input\)")
    metrics = tmp_path / "m.json"
    assert run("metrics", store, "--output", metrics).returncode == 0
    proc = run("report", metrics, "--resamples", 5, "--json", store / "rep.json")
    assert_one_line_error(proc, r"--json \S+ is inside \S*r\.zarr, its ranks store, named by")
    assert {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} == before


def test_a_ranks_store_without_an_evaluated_query_is_refused(ranks_store, tmp_path):
    """`rankwise rank` never writes one, but another writer may: `metrics` printed nan and
    wrote NaN (not JSON), `scores` a header alone, exit 0. One line naming the store."""
    from rankwise.store import read_ranks, write_ranks

    arrays, attrs = read_ranks(ranks_store)
    empty = {k: v[:0] for k, v in arrays.items()} | {"offsets": arrays["offsets"][:1]}
    attrs = {k: v for k, v in attrs.items() if k not in ("complete", "kind")}
    attrs |= {"num_skipped": attrs["num_queries"] + attrs["num_skipped"], "num_queries": 0}
    store = tmp_path / "empty.zarr"
    write_ranks(store, empty, attrs)
    for command in (["metrics"], ["scores"], ["ci", "--resamples", 5]):
        proc = run(*command, store)
        assert_one_line_error(proc, r"empty\.zarr: the ranks store has no evaluated query \(")


def test_outputs_never_land_inside_any_rankwise_store(ranks_store, d, tmp_path):
    """A store that is not an input of the command was not protected: `verify ...
    --output r.zarr/zarr.json` or `ci other.zarr --output r.zarr/ranks/zarr.json`
    replaced its metadata (exit 0; then "incomplete store ... run the command that
    writes it again", which refused to replace "a folder that is not a rankwise
    store"). One line now, nothing written."""
    store, other = tmp_path / "r.zarr", tmp_path / "other.zarr"
    shutil.copytree(ranks_store, store)
    shutil.copytree(ranks_store, other)
    before = {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    for args, target in (
        (["verify", *inputs(d), "--output"], store / "zarr.json"),
        (["ci", other, "--resamples", 5, "--output"], store / "ranks" / "zarr.json"),
        (["scores", other, "--output"], store / "new" / "scores.csv"),
    ):
        proc = run(*args, target)
        assert_one_line_error(
            proc, r"--output \S+ is inside the rankwise ranks store \S*r\.zarr: writing there"
        )
    assert {p: p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} == before
    assert run("metrics", store).returncode == 0


def test_outputs_never_land_inside_an_input_embedding_store(d, tmp_path):
    """The check above covered only the stores a ranks store or metrics JSON argument
    is or names: `evaluate --query-embeddings q.zarr --output q.zarr/zarr.json` replaced
    the embedding store's metadata (exit 0; its manifest and encoder records lost), and
    `rank --out g.zarr/r.zarr` wrote a store inside the gallery's. One line now."""
    stores = {}
    for split in ("q", "g"):
        stores[split] = tmp_path / f"{split}.zarr"
        options = json.dumps({"path": str(d / f"{split}.npy")})
        args = ("--manifest", d / f"{split}.csv", "--kind", "precomputed", "--options", options)
        assert run("encode", *args, "--out", stores[split], "--no-progress").returncode == 0
    before = {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()}
    given = inputs(d, qe=stores["q"], ge=stores["g"])
    proc = run("evaluate", *given, "--output", stores["q"] / "zarr.json")
    assert_one_line_error(proc, r"--output \S+ is inside \S*q\.zarr, --query-embeddings \(an")
    proc = run("rank", *given, "--out", stores["g"] / "r.zarr")
    assert_one_line_error(proc, r"--out \S+ is inside \S*g\.zarr, --gallery-embeddings \(an")
    assert {p: p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file()} == before


def test_out_replaces_only_a_store_of_its_own_kind(d, ranks_store, tmp_path):
    """`rank --out` / `encode --out` on a user's folder or on an input store was deleted and
    replaced; now refused before any work. An old ranks store is still replaced."""
    mine = tmp_path / "mydata"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    proc = run("rank", *inputs(d), "--out", mine)
    assert_one_line_error(proc, r"mydata is a folder that is not a rankwise store; the ranks store")
    assert (mine / "notes.txt").read_text() == "keep me\n"
    proc = run("rank", *inputs(d, ge="g_store.zarr"), "--out", d / "g_store.zarr")
    assert_one_line_error(proc, r"g_store\.zarr is a rankwise embeddings store; the ranks store")
    proc = run("encode", "--manifest", d / "q.csv", "--kind", "pixels", "--out", mine)
    assert_one_line_error(proc, r"mydata is a folder that is not a rankwise store; the embed")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert "remove it" not in proc.stderr  # never advice to delete what may be an input
    again = tmp_path / "again.zarr"
    shutil.copytree(ranks_store, again)
    assert run("rank", *inputs(d), "--out", again).returncode == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run("rank", *inputs(d), "--out", empty).returncode == 0


def test_an_output_is_never_an_input_or_another_output(d, tmp_path):
    gallery = tmp_path / "g.csv"
    shutil.copy(d / "g.csv", gallery)
    before = gallery.read_bytes()
    proc = run(
        "evaluate", *inputs(d)[:2], "--gallery", gallery, *inputs(d)[4:], "--output", gallery
    )
    assert_one_line_error(proc, r"--output .*g\.csv is also --gallery \(an input\)")
    assert gallery.read_bytes() == before
    out = tmp_path / "m.json"
    store = tmp_path / "r.zarr"
    assert run("rank", *inputs(d), "--out", store).returncode == 0
    proc = run("metrics", store, "--output", out, "--text-output", out)
    assert_one_line_error(proc, r"--text-output .*m\.json is also --output \(an output\)")
    assert not out.exists()


def test_an_output_link_is_written_through_and_a_fifo_as_a_stream(d, tmp_path):
    """The write-then-rename replaced a symbolic link with a file (its target, e.g. a
    "latest" result, kept the old content) and a FIFO or device (``/dev/null``) with
    a regular file. A link's target is replaced now, a non-regular path is written."""
    plain = tmp_path / "plain.json"
    assert run("evaluate", *inputs(d), "--output", plain).returncode == 0
    expected = plain.read_text()
    target, link = tmp_path / "runs" / "latest-target.json", tmp_path / "latest.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link.symlink_to(target)
    assert run("evaluate", *inputs(d), "--output", link).returncode == 0
    assert link.is_symlink() and target.read_text() == expected
    assert sorted(p.name for p in target.parent.iterdir()) == ["latest-target.json"]

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    assert run("evaluate", *inputs(d), "--output", fifo).returncode == 0
    reader.join(30)
    assert received == [expected] and stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.skipif(not Path("/proc/self/fd/1").exists(), reason="no /proc")
def test_an_output_that_is_standard_output_or_unwritable_beside(d, tmp_path):
    proc = run("evaluate", *inputs(d), "--output", "/proc/self/fd/1")  # a pipe here
    assert proc.returncode == 0, proc.stderr
    report, _ = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    assert report["num_queries"] > 0
    if Path("/proc/version").is_file():  # no file can be created in /proc: named as given
        proc = run("evaluate", *inputs(d), "--output", "/proc/version")
        assert_one_line_error(proc, r"^error: /proc/version: ")
        assert ".tmp" not in proc.stderr


def test_compare_refuses_stores_ranked_on_other_manifests(d, ranks_store, tmp_path):
    """Same shapes, other queries: paired row by row they gave wrong p-values."""
    other = tmp_path / "q_other.csv"
    table = pd.read_csv(d / "q.csv")
    table["id"] = "other_" + table["id"]
    table.to_csv(other, index=False)
    store = tmp_path / "other.zarr"
    assert run("rank", *inputs(d, q=other), "--out", store).returncode == 0
    proc = run("compare", ranks_store, store, "--resamples", "20")
    assert_one_line_error(proc, r"other\.zarr: ranked on another query manifest than")


def test_a_file_named_npy_that_is_not_one_says_so(d, tmp_path):
    fake = tmp_path / "g.npy"
    shutil.copy(d / "g.csv", fake)
    proc = run("evaluate", *inputs(d, ge=fake))
    assert_one_line_error(proc, r"g\.npy: not a \.npy file \(no NumPy header\); give an array")


def test_a_failed_prepare_leaves_no_output_folder(tmp_path):
    out = tmp_path / "prepared"
    options = json.dumps({"root": str(tmp_path / "nope")})
    proc = run("prepare", "--loader", "market1501", "--options", options, "--out-dir", out)
    assert_one_line_error(proc, r"Market-1501 root folder not found")
    assert not out.exists()


def test_api_reads_junk_labels_and_ks_like_the_cli(d):
    import rankwise

    args = [d / "q.csv", d / "g.csv", d / "q.npy", d / "g.npy"]
    cli = rankwise.evaluate(*args, protocol="reid", junk_labels=("1", "0"), ks=(5,))
    # "1,0" was split into characters ('1', ',', '0'); 5 was "not iterable"
    api = rankwise.evaluate(*args, protocol="reid", junk_labels="1,0", ks=5)
    assert api.to_json() == cli.to_json()
    one = rankwise.evaluate(*args, protocol="reid", junk_labels=1)
    assert one.to_json() == rankwise.evaluate(*args, protocol="reid", junk_labels="1").to_json()


def test_first_line_of_an_exception_for_one_line_messages():
    from rankwise.errors import first_line

    assert first_line(ValueError("\n  bad header\nsecond line")) == "bad header"
    assert first_line(EOFError()) == "EOFError"  # no text: the type names it
    assert first_line(RuntimeError("   ")) == "RuntimeError"
    long = first_line(RuntimeError("x" * 500), limit=120)
    assert len(long) == 120 and long.endswith("...")  # a cut shows it is cut
    assert first_line(RuntimeError("y" * 120), limit=120) == "y" * 120


def test_the_first_bad_gallery_row_is_named_whatever_the_task_order(tmp_path):
    """Two bad rows in one group of chunks run side by side: the chunk that finishes
    first used to name its row (here the one-row last chunk, row N); the message names
    the first bad row, N - 1, on every run."""
    import rankwise
    from rankwise import RankwiseError

    n, dim = 200_000, 64
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(n + 1, dim)).astype(np.float32)
    gallery[n - 1, 0] = np.nan  # the end of the big first chunk
    gallery[n, 0] = np.nan  # the one-row second chunk, done first
    query = rng.normal(size=(3, dim)).astype(np.float32)
    q = pd.DataFrame({"id": ["q0", "q1", "q2"], "label": ["a", "b", "c"]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(n + 1)], "label": ["a", "b", "c"] * 66667})
    for _ in range(3):
        with pytest.raises(
            RankwiseError, match=rf"gallery embeddings row {n - 1} \(0-based\) contains NaN"
        ):
            rankwise.evaluate(q, g, query, gallery, gallery_chunk=n, workers=2)


def test_api_advice_names_parameters_not_flags(d):
    """The engine's advice, built in Dask's worker threads, named the command line's flags
    to Python callers too ("use --distance euclidean"); from Python it names the
    parameter (the command line's case, zero-vector-cosine-gallery above, the flag)."""
    import rankwise

    with pytest.raises(rankwise.RankwiseError) as caught:
        rankwise.evaluate(d / "q.csv", d / "g.csv", d / "q.npy", d / "g_zero.npy", workers=2)
    message = str(caught.value)
    assert re.search(
        r"row 4 \(0-based\) is a zero vector.*; fix that item or use distance euclidean$", message
    )
    assert "--" not in message


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_device_as_output_names_the_path(d):
    """A write that fails with a full disk names the output, not only the reason (was
    ``error: No space left on device``)."""
    proc = run("evaluate", *inputs(d), "--output", "/dev/full")
    line = assert_one_line_error(proc, r"/dev/full: No space left on device")
    assert "can be read or written" in line


def test_file_size_limit_while_writing_a_store_names_it(d, tmp_path):
    """``ulimit -f`` (EFBIG: Python ignores SIGXFSZ) met inside zarr's writes of a ranks
    store: one line naming the store (was ``error: File too large``), nothing left."""
    import resource

    out = tmp_path / "r.zarr"
    proc = subprocess.run(
        [RANKWISE, "rank", *map(str, inputs(d)), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64)),
    )
    assert_one_line_error(proc, re.escape(str(out)) + r": File too large")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
