"""The commands that rank or encode never import pandas when their manifests are CSV
files (~0.15-0.2 s of every process and every Snakemake job): each runs in a fresh
interpreter that reports, at exit, whether pandas was imported."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

#: Runs the command line as the console script does, then says whether pandas loaded.
PROBE = """
import atexit, sys
atexit.register(lambda: print("pandas imported:", "pandas" in sys.modules, file=sys.stderr))
from rankwise.cli import main
sys.argv = ["rankwise", *sys.argv[1:]]
main()
"""

EMBEDDINGS = ["--query-embeddings", "q.npy", "--gallery-embeddings", "g.npy"]
MANIFESTS = ["--query", "q.csv", "--gallery", "g.csv", *EMBEDDINGS]

#: case -> (command, ..., query manifest, gallery manifest): the commands run in turn
CASES = {
    # recall on manifests with a gallery label -1 and no camera: the note re-reads labels
    "evaluate-recall": (
        ["evaluate", *MANIFESTS],
        "id,label\nq0,0\nq1,1\nq2,2\n",
        "id,label\ng0,0\ng1,1\ng2,2\ng3,-1\n",
    ),
    "evaluate-reid-single-shot": (
        ["evaluate", *MANIFESTS, "--protocol", "reid", "--single-gallery-shot"],
        "id,label,camera\nq0,0,1\nq1,1,1\nq2,2,1\n",
        "id,label,camera\ng0,0,2\ng1,1,2\ng2,2,2\ng3,-1,1\n",
    ),
    "rank-reid-then-metrics-by-identity": (
        ["rank", *MANIFESTS, "--protocol", "reid", "--out", "r.zarr"],
        ["metrics", "r.zarr", "--stats-output", "s.npz", "--by", "identity", "--resamples", "9"],
        "id,label,camera\nq0,0,1\nq1,1,1\nq2,2,1\n",
        "id,label,camera\ng0,0,2\ng1,1,2\ng2,2,2\ng3,-1,1\n",
    ),
    "evaluate-multi-query": (
        ["evaluate", *MANIFESTS, "--protocol", "reid", "--multi-query", "mean"],
        "id,label,camera\nq0,0,1\nq1,0,1\nq2,2,1\n",
        "id,label,camera\ng0,0,2\ng1,1,2\ng2,2,2\ng3,-1,1\n",
    ),
    "evaluate-reassociation": (
        ["evaluate", *MANIFESTS, "--protocol", "reassociation", "--gap-frames", "1"],
        "id,label,sequence,frame\nq0,0,s,1\nq1,1,s,1\nq2,2,s,1\n",
        "id,label,sequence,frame\ng0,0,s,2\ng1,1,s,2\ng2,2,s,2\ng3,0,s,3\n",
    ),
    "rank-progressive": (
        ["rank", *MANIFESTS, "--protocol", "progressive", "--out", "r.zarr"],
        "id,label,sketch,step\nq0,0,a,1\nq1,0,a,2\nq2,1,b,1\n",
        "id,label\ng0,0\ng1,1\ng2,2\ng3,3\n",
    ),
    "verify": (
        ["verify", *MANIFESTS, "--output", "v.json"],
        "id,label,camera\nq0,0,1\nq1,1,1\nq2,2,1\n",
        "id,label,camera\ng0,0,2\ng1,1,2\ng2,2,2\ng3,-1,1\n",
    ),
}


def _run(folder, args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=folder,
        timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_ranking_commands_never_import_pandas(tmp_path, case):
    *commands, query, gallery = CASES[case]
    (tmp_path / "q.csv").write_text(query)
    (tmp_path / "g.csv").write_text(gallery)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "q.npy", rng.normal(size=(3, 4)).astype(np.float32))
    np.save(tmp_path / "g.npy", rng.normal(size=(4, 4)).astype(np.float32))
    for args in commands:
        proc = _run(tmp_path, args)
        assert proc.returncode == 0, proc.stderr
        assert "pandas imported: False" in proc.stderr, proc.stderr


def test_encode_never_imports_pandas(tmp_path):
    (tmp_path / "img").mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / "img" / f"{i}.png")
    (tmp_path / "m.csv").write_text("id,label,path\na,1,img/0.png\nb,2, img/1.png\n")
    args = ["encode", "--manifest", "m.csv", "--kind", "pixels", "--out", "e.zarr"]
    proc = _run(tmp_path, [*args, "--no-progress"])
    assert proc.returncode == 0, proc.stderr
    assert "pandas imported: False" in proc.stderr, proc.stderr


def test_the_probe_sees_pandas_when_it_is_imported(tmp_path):
    """The probe itself: pandas imported before the command is reported."""
    proc = subprocess.run(
        [sys.executable, "-c", "import pandas\n" + PROBE, "--version"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert "pandas imported: True" in proc.stderr, proc.stderr
