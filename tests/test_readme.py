"""The README stays true: its Quick start has two lines, and its example prints what it shows."""

import re
import shlex
import tomllib
from pathlib import Path

from helpers import ROOT, run_rankwise

README = (ROOT / "README.md").read_text()


def test_quick_start_is_two_lines_matching_ci():
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", README, re.S)
    lines = block[1].strip().splitlines()
    assert len(lines) == 2
    assert "snakemake --cores" in lines[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[1] in ci  # CI runs the README's test command verbatim


def test_quick_start_installs_what_the_demo_needs():
    """The default pipeline runs snakemake (extra pipeline), draws the report's charts
    (report) and builds the digits demos from scikit-learn (demo)."""
    block = re.search(r"## Quick start\s+```bash\n(.*?)```", README, re.S)
    first = block[1].strip().splitlines()[0]
    extras = re.search(r"pip install -e '\.\[([a-z,]+)\]'", first)
    assert extras, f"line 1 must install the extras: {first}"
    assert {"pipeline", "report", "demo"} <= set(extras[1].split(","))


def test_evaluate_example_prints_what_the_readme_shows(tmp_path):
    section = README[README.index("## Evaluate your own embeddings") :]
    command, shown = re.findall(r"```(?:bash)?\n(.*?)```", section, re.S)[:2]
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["rankwise", "evaluate"]
    out = argv.index("--output")
    argv[out + 1] = str(tmp_path / "report.json")
    proc = run_rankwise(*argv[1:], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown


def test_mypy_modules_are_the_ones_the_readme_names():
    """Development: mypy covers the public API and "N more modules (... every module it
    passes on today; `ranking`, `embeddings`, `summary`, the encoders, the CLI and the
    report package not yet)": the count is pyproject's list, and every module left out of
    it is one of those named."""
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    checked = {Path(f).stem for f in files}
    public = {"api", "metrics", "protocols", "registry", "options"}
    assert public <= checked
    stated = re.search(r"and on (\d+) more modules", README)
    assert stated, "the Development section's mypy sentence moved"
    assert int(stated[1]) == len(files) - len(public)
    package = ROOT / "workflow" / "rankwise"
    modules = {p.stem for p in package.glob("*.py")}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    not_yet = {"ranking", "embeddings", "summary", "encoders", "torch_encoders", "cli", "report"}
    assert modules - checked == not_yet
