"""Interrupted runs: SIGKILL mid-run, then run again (DESIGN.md: stores are atomic).

- ``rankwise rank`` killed while it computes: no store under the final name, ``metrics``
  refuses it with one clear line, a leftover ``<out>.tmp`` (as a kill during the write
  leaves) is named in that message and cleaned by the rerun, and the rerun's numbers
  equal an uninterrupted run's, bit for bit.
- ``rankwise encode`` killed while it writes: only ``<out>.tmp`` is left; ``rank``
  refuses the missing store and names the leftover; the rerun equals an uninterrupted
  encode.
- Snakemake killed mid-pipeline (process group, like a crash): a plain rerun is refused
  until ``--unlock``; then a dry run with ``--rerun-incomplete`` lists only the unfinished
  jobs, the rerun completes, finished jobs are not rerun (their files keep their bytes and
  mtimes) and the numbers equal a clean run's.
- A Ctrl-C while the console script imports the command line (before click's handler)
  ends as one inside a command does: ``Aborted!``, exit status 1, no traceback.

The encoder used for the kills (``HELD_ENCODER``) is a plain ``python``-kind factory that
waits after its first batch while a ``hold-<split>`` file exists: the kill lands at a known
point, with the temporary store half written, on any machine speed.  Processes are
started in their own session and killed by process group id.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import RANKWISE, planned_jobs, run_rankwise

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return run_rankwise(*args, cwd=cwd, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.rsplit("\r", 1)[-1].strip() for ln in proc.stderr.split("\n")]
    lines = [ln for ln in lines if ln]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        f"rc={proc.returncode}\n{proc.stderr[-3000:]}"
    )
    assert "Traceback" not in proc.stderr
    return lines[0]


def start(argv: list, log: Path, cwd=None) -> subprocess.Popen:
    """Start ``argv`` in its own session (process group), stdout+stderr to ``log``."""
    with open(log, "w") as fh:
        return subprocess.Popen(
            [str(a) for a in argv],
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )


def kill_when(
    proc: subprocess.Popen, condition, *, delay: float = 0.0, timeout: float = 180
) -> bool:
    """SIGKILL ``proc``'s process group ``delay`` s after ``condition()`` holds.

    Returns True if it was killed while running, False if it ended first.
    """
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if condition():
            time.sleep(delay)
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.01)
    if proc.poll() is None:  # never reached the condition: do not leave it running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        pytest.fail("the condition to kill on never held")
    return False


def metrics_json(path: Path) -> dict:
    """A metrics/report JSON without provenance (it names paths, which differ)."""
    report = json.loads(path.read_text())
    report.pop("provenance", None)
    return report


# ---------------------------------------------------------------------------
# rankwise rank
# ---------------------------------------------------------------------------

Q, G, D = 300, 40_000, 32
RANK_OPTIONS = [
    "--protocol",
    "reid",
    "--distance",
    "euclidean",
    "--gallery-chunk",
    "256",
    "--query-block",
    "64",
    "--workers",
    "1",
]


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """A reid problem large enough for `rank` to run for a couple of seconds."""
    d = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(7)
    pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(Q)],
            "label": rng.integers(0, 200, Q).astype(str),
            "camera": rng.integers(1, 4, Q),
        }
    ).to_csv(d / "q.csv", index=False)
    labels = rng.integers(-1, 200, G).astype(str)  # -1: junk, 0: distractors
    pd.DataFrame(
        {"id": [f"g{i}" for i in range(G)], "label": labels, "camera": rng.integers(1, 4, G)}
    ).to_csv(d / "g.csv", index=False)
    np.save(d / "q.npy", rng.normal(size=(Q, D)).astype(np.float32))
    np.save(d / "g.npy", rng.normal(size=(G, D)).astype(np.float32))
    return d


def rank_argv(big: Path, out: Path) -> list:
    return [
        RANKWISE,
        "rank",
        "--query",
        big / "q.csv",
        "--gallery",
        big / "g.csv",
        "--query-embeddings",
        big / "q.npy",
        "--gallery-embeddings",
        big / "g.npy",
        *RANK_OPTIONS,
        "--out",
        out,
    ]


def numbers(store: Path) -> dict:
    """The JSON report of a ranks store (what `rankwise metrics` prints), in-process."""
    from rankwise.api import result_from_ranks
    from rankwise.store import read_ranks

    return result_from_ranks(read_ranks(store), ks=(1, 5, 10)).to_json()


def test_rank_killed_then_rerun(big, tmp_path):
    import zarr

    # the uninterrupted reference
    ref = tmp_path / "ref.zarr"
    ok(subprocess.run(rank_argv(big, ref), capture_output=True, text=True, timeout=300))

    # killed once the progress bar shows a finished chunk (or a .tmp store appears)
    out = tmp_path / "ranks.zarr"
    tmp = tmp_path / "ranks.zarr.tmp"
    log = tmp_path / "killed.log"
    proc = start(rank_argv(big, out), log)
    progressed = lambda: tmp.exists() or re.search(r"\|\s*[1-9]\d*/\d+", log.read_text())
    assert kill_when(proc, progressed), (
        f"rank finished before it could be killed; make the problem bigger\n{log.read_text()}"
    )
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists(), "a killed run left a store under the final name"

    # the final name is refused, with one clear line
    line = error_line(run("metrics", out))
    assert re.search(r"ranks\.zarr: store not found", line), line

    # a kill during the write leaves a partial <out>.tmp: plant one (no complete mark,
    # an array missing); it is named in the message and must never be read
    if not tmp.exists():
        shutil.copytree(ref, tmp)
        group = zarr.open_group(str(tmp), mode="r+")
        del group.attrs["complete"]
        shutil.rmtree(tmp / "ranks")
    line = error_line(run("metrics", out, "--output", tmp_path / "m.json"))
    assert (
        "found an incomplete 'ranks.zarr.tmp' from an interrupted run: run the command "
        "again" in line
    ), line
    assert not (tmp_path / "m.json").exists()

    # rerun: completes, cleans the .tmp, and equals the uninterrupted run exactly
    ok(subprocess.run(rank_argv(big, out), capture_output=True, text=True, timeout=300))
    assert out.is_dir() and not tmp.exists()
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(out), mode="r")
    for name in ("offsets", "ranks", "query_index", "group", "step"):
        np.testing.assert_array_equal(a[name][...], b[name][...])
    report = numbers(out)
    assert report == numbers(ref)
    assert report["num_queries"] > 0 and report["num_gallery"] < G  # junk removed


# ---------------------------------------------------------------------------
# rankwise encode
# ---------------------------------------------------------------------------

HELD_ENCODER = '''"""A deterministic encoder that can be held mid-run (interruption tests).

While a file ``hold-<split>`` exists in the working directory, the encode whose --out
is ``<split>.zarr`` writes ``held-<split>`` after its first batch and waits there: the
test then kills it at a known point, with its temporary store half written.
"""
import os
import sys
import time

import numpy as np


def _split():
    argv = sys.argv
    out = argv[argv.index("--out") + 1] if "--out" in argv else ""
    return os.path.basename(out.rstrip("/")).split(".")[0]


def make():
    calls = []

    def encode(images):
        calls.append(len(images))
        split = _split()
        if len(calls) > 1 and os.path.exists(f"hold-{split}"):
            open(f"held-{split}", "w").close()
            while os.path.exists(f"hold-{split}"):
                time.sleep(0.02)
        return np.stack([np.asarray(im, np.float32).reshape(-1) / 255.0 + 0.01
                         for im in images])
    return encode
'''


def _has_encode() -> bool:
    source = ROOT / "workflow" / "rankwise" / "cli" / "pipeline.py"
    return source.exists() and "def encode(" in source.read_text()


needs_encode = pytest.mark.skipif(not _has_encode(), reason="`rankwise encode` not there yet")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    from PIL import Image

    d = tmp_path_factory.mktemp("encode")
    (d / "img").mkdir()
    rng = np.random.default_rng(3)
    rows = []
    for i in range(96):
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(d / f"img/{i}.png")
        rows.append({"id": f"i{i}", "label": str(i % 12), "path": f"img/{i}.png"})
    pd.DataFrame(rows).to_csv(d / "gallery.csv", index=False)
    (d / "held_encoder.py").write_text(HELD_ENCODER)
    return d


def encode_argv(images: Path, out: Path) -> list:
    options = json.dumps({"factory": str(images / "held_encoder.py") + ":make"})
    return [
        RANKWISE,
        "encode",
        "--manifest",
        images / "gallery.csv",
        "--kind",
        "python",
        "--options",
        options,
        "--out",
        out,
        "--batch-size",
        "4",
        "--threads",
        "1",
        "--no-progress",
    ]


@needs_encode
def test_encode_killed_then_rerun(images, tmp_path):
    import zarr

    ref = tmp_path / "ref.zarr"
    ok(
        subprocess.run(
            encode_argv(images, ref), capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
    )

    # held after its first batch (some rows written to the .tmp store), then killed
    out, tmp = tmp_path / "gallery.zarr", tmp_path / "gallery.zarr.tmp"
    (tmp_path / "hold-gallery").touch()
    proc = start(encode_argv(images, out), tmp_path / "killed.log", cwd=tmp_path)
    assert kill_when(proc, (tmp_path / "held-gallery").exists), (
        "encode finished before it could be killed"
    )
    (tmp_path / "hold-gallery").unlink()
    assert not out.exists(), "a killed encode left a store under the final name"
    assert tmp.exists()

    # using the missing store fails cleanly and names the leftover
    line = error_line(
        run(
            "rank",
            "--query",
            images / "gallery.csv",
            "--gallery",
            images / "gallery.csv",
            "--query-embeddings",
            ref,
            "--gallery-embeddings",
            out,
            "--out",
            tmp_path / "r.zarr",
        )
    )
    assert (
        "gallery.zarr: gallery embeddings not found, only an incomplete "
        "'gallery.zarr.tmp' left by an interrupted run" in line
    ), line
    assert not (tmp_path / "r.zarr").exists()

    ok(
        subprocess.run(
            encode_argv(images, out), capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
    )
    assert out.is_dir() and not tmp.exists()
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(a["embeddings"][...], b["embeddings"][...])
    assert b.attrs["complete"] is True
    assert {k: v for k, v in a.attrs.items()} == {k: v for k, v in b.attrs.items()}


# ---------------------------------------------------------------------------
# Snakemake
# ---------------------------------------------------------------------------

CONFIG = """\
datasets:
  market:
    loader: demo-market
    options: {seed: 1, identities: 8, cameras: 3, images_per_camera: 2,
              queries_per_identity: 1, distractors: 6, junk: 4, height: 16, width: 8}
    protocol: reid
    distance: euclidean
    ks: [1, 5]
encoders:
  held:
    kind: python
    options: {factory: held_encoder.py:make, input_size: [16, 8]}
engine: {threads: 1, query_block: 5, gallery_chunk: 7, batch_size: 4}
report: {cmc_max_rank: 20}
"""

needs_pipeline = pytest.mark.skipif(
    not (ROOT / "Snakefile").exists() or not _has_encode(), reason="the pipeline is not there yet"
)


def snakemake_argv(workdir: Path, *args: str) -> list:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        ROOT / "Snakefile",
        "--directory",
        workdir,
        "--configfile",
        workdir / "config.yaml",
        "--replace-workflow-config",
        "--cores",
        "2",
        "--workflow-profile",
        "none",
        *args,
    ]


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        snakemake_argv(workdir, *args), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"snakemake {args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _workdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(CONFIG)
    (path / "held_encoder.py").write_text(HELD_ENCODER)
    return path


def _digest(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@needs_pipeline
def test_snakemake_killed_then_rerun_incomplete(tmp_path):
    clean = _workdir(tmp_path / "clean")
    snakemake(clean)

    # --cores 2: both encodes run at once; the query one is held after its first batch
    # while the gallery one finishes, then Snakemake and its jobs are killed (a crash)
    work = _workdir(tmp_path / "killed")
    emb = work / "results/embeddings/market/held"
    (work / "hold-query").touch()
    proc = start(snakemake_argv(work), tmp_path / "killed.log")
    assert kill_when(
        proc,
        lambda: (
            (work / "held-query").exists() and (emb / "gallery.zarr/.snakemake_timestamp").exists()
        ),
        delay=0.5,
    ), "snakemake finished before it could be killed"
    (work / "hold-query").unlink()
    finished, unfinished = "gallery", "query"
    assert (emb / "query.zarr.tmp").exists() and not (emb / "query.zarr").exists()
    assert not (work / "results/ranks").exists()
    before = {
        "manifests": _digest(work / "results/manifests"),
        "store": _digest(emb / f"{finished}.zarr"),
    }

    # the kill left Snakemake's lock: a plain rerun refuses and says what to do
    refused = subprocess.run(
        snakemake_argv(work, "--rerun-incomplete"), capture_output=True, text=True, timeout=300
    )
    assert refused.returncode != 0 and "--unlock" in refused.stdout + refused.stderr
    snakemake(work, "--unlock")

    # what will run: the unfinished encode and what follows, not prepare nor the other encode
    dry = snakemake(work, "--rerun-incomplete", "--dry-run")
    jobs = planned_jobs(dry.stdout + dry.stderr)
    assert jobs == {"encode": 1, "rank": 1, "metrics": 1, "report": 1, "all": 1}, jobs
    assert f"results/embeddings/market/held/{finished}.zarr" not in re.findall(
        r"output: (\S+)", dry.stdout + dry.stderr
    )

    snakemake(work, "--rerun-incomplete")
    assert not (emb / f"{unfinished}.zarr.tmp").exists()
    assert _digest(work / "results/manifests") == before["manifests"]
    assert _digest(emb / f"{finished}.zarr") == before["store"], "a finished job was rerun"
    assert planned_jobs(snakemake(work, "--dry-run").stdout) == {}

    # the same numbers as the clean run
    metrics = "results/metrics/market/held.json"
    assert metrics_json(work / metrics) == metrics_json(clean / metrics)
    strip = lambda r: {
        **r,
        "results": [{k: v for k, v in x.items() if k != "provenance"} for x in r["results"]],
    }
    assert strip(json.loads((work / "results/report.json").read_text())) == strip(
        json.loads((clean / "results/report.json").read_text())
    )


# A real SIGINT, sent by the process to itself the moment `rankwise.cli` starts to be
# imported (a meta-path finder that then lets the import go on), through the installed
# console script run as `rankwise --version` would run it.
_INTERRUPT_IMPORT = """
import os, runpy, signal, sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "rankwise.cli":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
sys.argv = [sys.argv[1], "--version"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_while_the_command_line_imports_is_aborted_not_a_traceback():
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="rankwise")
    assert script.value == "rankwise.console:main"
    proc = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_IMPORT, RANKWISE],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, "\nAborted!\n", "")
    # without the interrupt the same wrapper answers
    proc = subprocess.run([RANKWISE, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("rankwise, version")
