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


def _rankwise_spans():
    """Every `rankwise <command> ...` the README shows: inline code spans (which may wrap
    over lines) and the lines of its fenced blocks, as (commands, text)."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", README, re.S)
    prose = re.sub(r"```[a-z]*\n.*?```", "", README, flags=re.S)
    texts = re.findall(r"`([^`]+)`", prose) + [
        line for block in fenced for line in block.replace("\\\n", " ").splitlines()
    ]
    for text in texts:
        found = re.match(r"\s*rankwise ([a-z|]+)\b(.*)", text, re.S)
        if found:
            yield found[1].split("|"), found[2]


def test_every_rankwise_command_and_flag_the_readme_shows_exists():
    """A `rankwise <command> --flag` written anywhere in the README is a command whose
    --help lists that flag (`evaluate|rank` names both)."""
    helps = {}
    problems = []
    for commands, rest in _rankwise_spans():
        flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)
        for command in commands:
            if command not in helps:
                proc = run_rankwise(command, "--help", cwd=ROOT)
                helps[command] = proc.stdout if proc.returncode == 0 else None
            if helps[command] is None:
                problems.append(f"rankwise {command}: no such command")
                continue
            for flag in flags:
                if not re.search(re.escape(flag) + r"(?![a-z0-9-])", helps[command]):
                    problems.append(f"rankwise {command} {flag}: not in its --help")
    assert len(helps) >= 8  # the spans were found
    assert not problems, problems


def test_evaluate_flags_the_readme_lists_exist():
    """The flags paragraph of "Evaluate your own embeddings" names `rankwise evaluate`'s
    own flags."""
    section = README[README.index("## Evaluate your own embeddings") : README.index("### Inputs")]
    prose = re.sub(r"```[a-z]*\n.*?```", "", section, flags=re.S)
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", prose))
    assert {"--protocol", "--rerank", "--memory-limit"} <= flags
    shown = run_rankwise("evaluate", "--help", cwd=ROOT).stdout
    missing = {f for f in flags if not re.search(re.escape(f) + r"(?![a-z0-9-])", shown)}
    assert not missing


def test_example_configs_the_readme_names_are_the_shipped_ones():
    listed = README[README.index("Starting points: `config/examples/") :].split(".\n")[0]
    named = set(re.findall(r"`(?:config/examples/)?([\w.-]+\.yaml)`", listed))
    assert named == {p.name for p in (ROOT / "config" / "examples").glob("*.yaml")}


def test_loaders_and_encoder_kinds_the_readme_lists_are_the_packages():
    from rankwise import datasets, encoders

    start = README.index("Loaders: `market1501`")
    kinds_at = re.compile(r"Encoder\s+kinds:").search(README, start)
    loaders = set(re.findall(r"`([\w-]+)`", README[start : kinds_at.start()]))
    kinds_text = README[kinds_at.end() : README.index("| benchmark |", start)]
    kinds = set(re.findall(r"`([\w-]+)`", kinds_text))
    assert loaders - {"reid"} == set(datasets.LOADERS)  # "the `reid` package's layout"
    assert set(encoders.ENCODER_KINDS) <= kinds
