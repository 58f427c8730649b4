#!/usr/bin/env python
"""Incremental cost of the pipeline: a new checkpoint against the whole demo, and the
report job against the number of encoders.

    python benchmarks/bench_incremental.py                 # both parts, 2 cores
    python benchmarks/bench_incremental.py --part report --encoders 4,8,16 --repeat 3

Run from the repository root with the pipeline extras installed. Each part works in a
fresh copy of the workflow (Snakefile, rules, config, profiles) under a temporary folder;
every measurement is a separate process, timed by wall clock.

1. ``demo``: ``snakemake --cores N`` of the embedded default config from scratch, then
   the same with one more encoder (``pixels-8``, raw pixels at 8 x 8) added through a
   ``--configfile``: wall times and their ratio (target: the incremental run <= 20% of
   the full run). Both include Snakemake's own start-up and DAG building; an untimed
   full run first warms numba's kernel cache. The added run's
   jobs are listed by rule with their wall seconds (the rules' benchmark files).
2. ``report``: one dataset (``digits``) and 16 weight-free encoders (raw pixels at 16
   sizes) run once through the pipeline; then ``rankwise report`` (the pipeline's
   command: statistics summaries from the metrics jobs, the pair cache) over the first
   N encoders, for each N: ``cold`` with an empty cache (every paired test computed),
   ``add one`` with the cache of the first N - 1 (the pipeline's case after adding the
   N-th checkpoint). Target: linear in N, not quadratic. The fixed cost of the jobs
   that need no numba kernel (``metrics``, ``encode``, ``prepare``: start-up, reading
   and writing, on inputs of two rows) is timed too (target < 0.3 s).

Prints a table and writes ``benchmarks/results/incremental.json`` (git-ignored) with
every run, the load average before and after, and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKFLOW = ("Snakefile", "rules", "config", "profiles", "envs")
REPORT_RESAMPLES = 1000  # the demo config's


def _copy_workflow(target: Path) -> Path:
    target.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        else:
            shutil.copy2(source, target / name)
    return target


def _timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        output = proc.stdout[-3000:] + proc.stderr[-3000:]
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{output}")
    return elapsed


def _snakemake(cores: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--cores", str(cores), *args]


def bench_demo(cores: int, repeat: int) -> dict:
    extra = {"encoders": {"pixels-8": {"kind": "pixels", "options": {"size": [8, 8]}}}}
    runs = []
    # Untimed: numba's kernel cache (beside the installed package) and the OS file cache
    # are cold after an install; a timed "full" run paying the kernels' compilation
    # (~4-5 s) would flatter the ratio.
    with tempfile.TemporaryDirectory(prefix="rankwise-incremental-warmup-") as tmp:
        _timed(_snakemake(cores), _copy_workflow(Path(tmp) / "demo"))
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="rankwise-incremental-") as tmp:
            work = _copy_workflow(Path(tmp) / "demo")
            (work / "extra.yaml").write_text(yaml.safe_dump(extra))
            load = os.getloadavg()[0]
            full = _timed(_snakemake(cores), work)
            since = time.time()
            added = _timed(_snakemake(cores, "--configfile", "extra.yaml"), work)
            jobs = _job_seconds(work / "results" / "benchmarks", since)
            runs.append(
                {
                    "full_s": full,
                    "add_one_s": added,
                    "ratio": added / full,
                    "load": load,
                    "add_one_jobs": jobs,
                }
            )
            print(f"  demo: full {full:.1f} s, +1 encoder {added:.1f} s ({added / full:.2f}x)")
            for rule, seconds in jobs.items():
                print(
                    f"    {rule:<13} {len(seconds):2d} jobs, {sum(seconds):5.1f} s "
                    f"({min(seconds):.2f}-{max(seconds):.2f} s each)"
                )
    return {"runs": runs}


def _job_seconds(folder: Path, since: float) -> dict[str, list[float]]:
    """Wall seconds of each job that ran after ``since``, by rule, from the rules'
    Snakemake benchmark files (``results/benchmarks/<rule folder>/...tsv``)."""
    out: dict[str, list[float]] = {}
    for tsv in sorted(folder.rglob("*.tsv")):
        if tsv.stat().st_mtime < since:
            continue
        rule = tsv.relative_to(folder).parts[0] if tsv.parent != folder else tsv.stem
        seconds = float(tsv.read_text().splitlines()[-1].split("\t")[0])
        out.setdefault(rule, []).append(seconds)
    return out


def _digits_config(n: int) -> dict:
    sizes = [(h, h) for h in range(4, 4 + n)]
    return {
        "datasets": {
            "digits": {
                "loader": "digits",
                "options": {"seed": 0},
                "protocol": "recall",
                "distance": "cosine",
                "ks": [1, 5, 10],
            }
        },
        "encoders": {
            f"pixels-{h:02d}": {"kind": "pixels", "options": {"size": [h, w]}} for h, w in sizes
        },
        "report": {"resamples": REPORT_RESAMPLES},
    }


def bench_report(cores: int, counts: list[int], repeat: int) -> dict:
    top = max(counts)
    config = _digits_config(top)
    names = list(config["encoders"])
    out: dict = {"counts": counts, "cold": {}, "add_one": {}}
    with tempfile.TemporaryDirectory(prefix="rankwise-report-") as tmp:
        work = _copy_workflow(Path(tmp) / "report")
        (work / "many.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        print(f"  pipeline: digits x {top} encoders ...", flush=True)
        _timed(_snakemake(cores, "--configfile", "many.yaml", "--replace-workflow-config"), work)
        resamples = str(REPORT_RESAMPLES)
        rankwise = str(Path(sys.executable).parent / "rankwise")

        def report_cmd(n: int, cache: Path) -> list[str]:
            metrics = [f"results/metrics/digits/{e}.json" for e in names[:n]]
            return [
                rankwise,
                "report",
                *metrics,
                "--resamples",
                resamples,
                "--json",
                str(cache.parent / "r.json"),
                "--html",
                str(cache.parent / "r.html"),
                "--md",
                str(cache.parent / "r.md"),
                "--cache",
                str(cache),
            ]

        for n in counts:
            cold, added = [], []
            for i in range(repeat):
                scratch = work / f"scratch-{n}-{i}"
                cache = scratch / "cache"
                scratch.mkdir()
                cold.append(_timed(report_cmd(n, cache), work))
                shutil.rmtree(cache)
                _timed(report_cmd(n - 1, cache), work)  # the report before the N-th
                added.append(_timed(report_cmd(n, cache), work))
            out["cold"][n], out["add_one"][n] = cold, added
            print(
                f"  report, {n:2d} encoders: cold {min(cold):.2f} s, "
                f"adding the {n}th {min(added):.2f} s",
                flush=True,
            )
        out.update(_fixed_costs(work, rankwise, names[0]))
    return out


def _fixed_costs(work: Path, rankwise: str, encoder: str) -> dict[str, list[float]]:
    """Wall seconds of one job of each kind that needs no numba kernel, on inputs so
    small that the time is the job's fixed cost (start-up, reading, writing), best
    of 5: ``metrics`` of a ranks store; ``encode`` (``pixels``) and ``prepare``
    (loader ``manifest``) of a two-row manifest beside the digits manifests (the same
    relative image paths)."""
    folder = work / "results" / "manifests" / "digits"
    for split in ("query", "gallery"):
        lines = (folder / f"{split}.csv").read_text().splitlines(keepends=True)
        (folder / f"tiny-{split}.csv").write_text("".join(lines[:3]))
    commands = {
        "metrics_job": [
            rankwise, "metrics", f"results/ranks/digits/{encoder}.zarr",
            "--output", str(work / "m.json"),
        ],
        "encode_job": [
            rankwise, "encode", "--manifest", str(folder / "tiny-gallery.csv"),
            "--kind", "pixels", "--options", '{"size": [8, 8]}',
            "--out", str(work / "tiny.zarr"), "--no-progress",
        ],
        "prepare_job": [
            rankwise, "prepare", "--loader", "manifest", "--options",
            json.dumps({
                "query": str(folder / "tiny-query.csv"),
                "gallery": str(folder / "tiny-gallery.csv"),
                "protocol": "recall",
            }),
            "--out-dir", str(work / "tiny-manifests"),
        ],
    }  # fmt: skip
    times: dict[str, list[float]] = {}
    for name, cmd in commands.items():
        times[name] = [_timed(cmd, work) for _ in range(5)]
        print(f"  {name.replace('_', ' ')} (fixed cost): {min(times[name]):.2f} s", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("all", "demo", "report"), default="all")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--encoders", default="4,8,16", help="report part: encoder counts")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    counts = sorted({int(x) for x in args.encoders.split(",")})
    # rankwise's bytecode compiled once (see bench_startup.py): otherwise, with
    # PYTHONDONTWRITEBYTECODE=1, every job of the pipeline compiles the package again
    import compileall

    import rankwise

    compileall.compile_dir(str(Path(rankwise.__file__).parent), quiet=1)
    result: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "cores": args.cores,
        "load_before": os.getloadavg(),
    }
    if args.part in ("all", "demo"):
        result["demo"] = bench_demo(args.cores, args.repeat)
    if args.part in ("all", "report"):
        result["report"] = bench_report(args.cores, counts, args.repeat)
    result["load_after"] = os.getloadavg()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "incremental.json").write_text(json.dumps(result, indent=2) + "\n")

    print("\n| measurement | value | target |\n| --- | --- | --- |")
    if "demo" in result:
        runs = result["demo"]["runs"]
        full = [r["full_s"] for r in runs]
        add = [r["add_one_s"] for r in runs]
        ratios = [r["ratio"] for r in runs]
        print(f"| full demo, {args.cores} cores | {statistics.median(full):.1f} s | |")
        print(f"| + one encoder | {statistics.median(add):.1f} s | |")
        verdict = "met" if max(ratios) <= 0.20 else "not met"
        spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"
        print(f"| incremental / full | {spread} | <= 0.20: {verdict} |")
    if "report" in result:
        rep = result["report"]
        for n in counts:
            print(
                f"| report job, {n} encoders: cold / adding the {n}th | "
                f"{min(rep['cold'][n]):.2f} s / {min(rep['add_one'][n]):.2f} s | linear |"
            )
        for name in ("metrics", "encode", "prepare"):
            best = min(rep[f"{name}_job"])
            verdict = "met" if best < 0.3 else "not met"
            row = f"`rankwise {name}` job, fixed cost (no numba)"
            print(f"| {row} | {best:.2f} s | < 0.3 s: {verdict} |")
    print(f"\nload average before {result['load_before']}, after {result['load_after']}")


if __name__ == "__main__":
    main()
