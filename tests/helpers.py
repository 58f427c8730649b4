"""Helpers shared by the test modules: the console script and Snakemake dry-run parsing."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _exe() -> str:
    for exe in (Path(sys.executable).parent / "rankwise", ROOT / ".venv" / "bin" / "rankwise"):
        if exe.exists():
            return str(exe)
    found = shutil.which("rankwise")
    if found is None:
        pytest.fail("console script `rankwise` not found next to the Python executable")
    return found


#: The `rankwise` console script of the environment running the tests.
RANKWISE = _exe()


def run_rankwise(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """The ``rankwise`` console script in a fresh process (never raises on failure)."""
    return subprocess.run(
        [RANKWISE, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def planned_jobs(text: str) -> dict[str, int]:
    """rule -> number of jobs in a Snakemake dry run's "Job stats" ({} if nothing to do)."""
    if "Nothing to be done" in text:
        return {}
    table = text[text.index("Job stats:") :]
    jobs = {}
    for line in table.splitlines()[3:]:
        match = re.fullmatch(r"(\S+)\s+(\d+)", line.strip())
        if match is None:
            break
        jobs[match[1]] = int(match[2])
    jobs.pop("total", None)
    return jobs
