"""The command line as a whole: start-up imports, the console script, hints and messages.

Everything runs the real ``rankwise`` console script (or the interpreter) in a fresh
process: what matters here is what a process imports and prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import RANKWISE, ROOT, run_rankwise

HEAVY = ("numpy", "pandas", "numba", "dask", "zarr", "matplotlib", "sklearn", "snakemake")
COMMANDS = ("evaluate", "rank", "metrics", "compare", "ci", "scores", "report", "prepare", "encode")


def _imported_after(argv: list[str]) -> list[str]:
    """Top-level heavy packages in sys.modules after ``rankwise ARGV`` (in-process)."""
    code = (
        "import sys\n"
        "from rankwise.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], *([c, "--help"] for c in COMMANDS)],
    ids=lambda a: " ".join(a),
)
def test_help_and_version_import_nothing_heavy(argv):
    assert _imported_after(argv) == []


def test_import_rankwise_is_light_and_the_api_is_lazy():
    code = (
        "import sys, rankwise\n"
        f"before = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "evaluate = rankwise.evaluate\n"
        "from rankwise.api import evaluate as direct\n"
        "print(before, evaluate is direct, 'evaluate' in dir(rankwise),\n"
        "      sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pandas'}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # the API module itself needs numpy only: pandas and the engine load when ranking
    assert proc.stdout.split() == ["[]", "True", "True", "['numpy']"]
    proc = subprocess.run(
        [sys.executable, "-c", "import rankwise; rankwise.nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "module 'rankwise' has no attribute 'nope'" in proc.stderr


def test_console_script_answers_every_help():
    import rankwise

    proc = run_rankwise("--version")
    assert (
        proc.returncode == 0 and proc.stdout.strip() == f"rankwise, version {rankwise.__version__}"
    )
    listing = run_rankwise("--help").stdout
    for command in COMMANDS:
        assert f"  {command} " in listing
        proc = run_rankwise(command, "--help")
        assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: rankwise {command}")


# ---------------------------------------------------------------- the protocol hint


def _unit(*degrees: float) -> np.ndarray:
    angles = np.deg2rad(degrees)
    return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def _toy(tmp_path, *, camera: bool, junk: bool):
    """Queries q0 (label 1, camera 1, at 0 degrees) and q1 (label 2, camera 1, at 90).
    Gallery: g0 (label 1, camera 1, 1 degree: q0's same-camera twin), g1 (label 1,
    camera 2, 10), g2 (label 2, camera 2, 80), g3 (label -1 if junk else 3, camera 1, 89)."""
    q_rows = ["q0,1,1", "q1,2,1"]
    g_rows = ["g0,1,1", "g1,1,2", "g2,2,2", f"g3,{-1 if junk else 3},1"]
    header = "id,label,camera" if camera else "id,label"
    strip = (lambda r: r) if camera else (lambda r: r.rsplit(",", 1)[0])
    (tmp_path / "q.csv").write_text("\n".join([header, *map(strip, q_rows)]) + "\n")
    (tmp_path / "g.csv").write_text("\n".join([header, *map(strip, g_rows)]) + "\n")
    np.save(tmp_path / "q.npy", _unit(0, 90))
    np.save(tmp_path / "g.npy", _unit(1, 10, 80, 89))
    return [
        "--query",
        tmp_path / "q.csv",
        "--gallery",
        tmp_path / "g.csv",
        "--query-embeddings",
        tmp_path / "q.npy",
        "--gallery-embeddings",
        tmp_path / "g.npy",
    ]


@pytest.mark.parametrize(
    "camera, junk, why, bom",
    [
        (True, False, "a 'camera' column", False),
        (False, True, "gallery label -1", False),
        (True, True, "a 'camera' column", False),
        (True, False, "a 'camera' column", True),  # Excel's "CSV UTF-8", camera first
    ],
)
def test_reid_looking_manifests_get_a_note(tmp_path, camera, junk, why, bom):
    inputs = _toy(tmp_path, camera=camera, junk=junk)
    if bom:
        for name in ("q.csv", "g.csv"):
            table = pd.read_csv(tmp_path / name, dtype=str)
            table = table[["camera", "id", "label"]]
            table.to_csv(tmp_path / name, index=False, encoding="utf-8-sig")
    proc = run_rankwise("evaluate", *inputs, "--output", tmp_path / "r.json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: ran --protocol recall")
    assert f"({why})" in lines[0] and "--protocol reid" in lines[0]
    assert json.loads((tmp_path / "r.json").read_text())["protocol"] == "recall"
    # an explicit protocol, either one, silences it
    for protocol in ("recall", "reid"):
        if protocol == "reid" and not camera:
            continue
        proc = run_rankwise("evaluate", *inputs, "--protocol", protocol)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    proc = run_rankwise("rank", *inputs, "--out", tmp_path / "ranks.zarr")
    assert proc.returncode == 0 and "note: ran --protocol recall" in proc.stderr


def test_the_note_is_one_line_naming_both_flags(tmp_path):
    # the note's test is shared with the Python API's warning: its words stay the CLI's
    # (flags, not keywords), and no Python warning joins it on stderr
    proc = run_rankwise("evaluate", *_toy(tmp_path, camera=False, junk=True))
    assert proc.returncode == 0 and proc.stderr == (
        "note: ran --protocol recall (the default), but the manifests look like "
        "re-identification data (gallery label -1); pass --protocol reid to exclude "
        "same-camera matches and junk labels, or --protocol recall to silence this note\n"
    )


def test_plain_retrieval_manifests_get_no_note(tmp_path):
    proc = run_rankwise("evaluate", *_toy(tmp_path, camera=False, junk=False))
    assert proc.returncode == 0 and proc.stderr == ""
    assert "recall@1: 50.00" in proc.stdout  # q0 -> g0 (label 1: hit), q1 -> g3 (label 3)


def test_reid_protocol_changes_the_numbers_the_note_is_about(tmp_path):
    """The note is not noise: on the toy, reid drops q0's same-camera twin g0."""
    inputs = _toy(tmp_path, camera=True, junk=True)
    recall = run_rankwise("evaluate", *inputs, "--protocol", "recall").stdout
    reid = run_rankwise("evaluate", *inputs, "--protocol", "reid").stdout
    assert "recall@1: 50.00" in recall  # q0 -> g0 (same label), q1 -> g3 (junk)
    assert "rank1: 100.00" in reid  # q0 -> g1, q1 -> g2: g0 and g3 are not ranked


# ---------------------------------------------------------------- messages


def test_metrics_on_embeddings_says_what_it_expected(tmp_path):
    np.save(tmp_path / "emb.npy", np.zeros((3, 2), np.float32))
    proc = run_rankwise("metrics", tmp_path / "emb.npy", "--output", tmp_path / "m.json")
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert "\n" not in line and "delete" not in line
    assert "emb.npy: not a readable Zarr store" in line
    assert "expected a ranks store, the Zarr folder written by `rankwise rank`" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy"]


@pytest.fixture
def without(tmp_path):
    """An environment in which importing the named top-level packages fails."""

    def env(*modules: str) -> dict:
        blocker = tmp_path / "blocker"
        blocker.mkdir(exist_ok=True)
        for module in modules:
            (blocker / f"{module}.py").write_text(
                f'raise ModuleNotFoundError("No module named {module!r}", name={module!r})\n'
            )
        paths = [str(blocker), str(ROOT / "workflow"), os.environ.get("PYTHONPATH", "")]
        return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}

    return env


@pytest.mark.parametrize(
    "module, argv, extra",
    [
        ("matplotlib", ["report", "some.json", "--out-dir", "out"], "report"),
        ("sklearn", ["prepare", "--loader", "digits", "--out-dir", "out"], "demo"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(tmp_path, without, module, argv, extra):
    (tmp_path / "some.json").write_text("{}")
    proc = subprocess.run(
        [RANKWISE, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=without(module),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"pip install 'rankwise[{extra}]'" in proc.stderr
    assert not (tmp_path / "out" / "query.csv").exists()
    assert not (tmp_path / "out" / "report.html").exists()


# ---------------------------------------------------------------- start-up and exit


def _after_evaluate(tmp_path, report: str) -> str:
    """``rankwise evaluate`` on the toy data through the console script's call
    (``main(argv)``) in a fresh interpreter; then print the expression ``report``."""
    argv = ["evaluate", *map(str, _toy(tmp_path, camera=True, junk=False)), "--protocol", "reid"]
    code = (
        "import gc, sys\n"
        "from rankwise.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"print({report})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_console_script_freezes_the_heap_before_exit(tmp_path):
    # the interpreter's final collection then skips the heap's objects (numba's, where the
    # C kernels are not built, and dask's, pandas'; bench_startup.py: ~0.3 s of the
    # process's end at Market-1501 scale with numba); without the freeze the count is 0
    assert int(_after_evaluate(tmp_path, "gc.get_freeze_count()")) > 10_000


# Every path a command reads; every other path option is something it writes.
_READ_PATHS = {
    "query",
    "gallery",
    "query_embeddings",
    "gallery_embeddings",  # manifests, embeddings
    "ranks",
    "ranks_a",
    "ranks_b",
    "labels",
    "metrics",
    "verification",
    "manifest",
}


def test_every_written_path_is_checked_before_any_work():
    """Each path option a command writes is an ``OutputPath`` (refused at parse time when
    a file stands where a folder is needed), so no run ends on an unwritable output after
    all its work; a new output option declared as a plain ``click.Path`` fails here."""
    import click

    from rankwise.cli import main
    from rankwise.cli.shared import OutputPath

    plain, written = set(), set()
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param.type, OutputPath):
                written.add((name, param.name))
            elif isinstance(param.type, click.Path):
                plain.add((name, param.name))
    assert {p for _, p in plain} <= _READ_PATHS, sorted(plain)
    assert not {p for _, p in written} & _READ_PATHS, sorted(written)
    assert ("rank", "out") in written and ("report", "figures_dir") in written
