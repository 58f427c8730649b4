#!/usr/bin/env python
"""Start-up of ``rankwise evaluate`` / ``rankwise rank``: time from process start to the
first tile, on bench.py's synthetic data (Market-1501 scale by default).

    python benchmarks/bench_startup.py                      # best of 5, market, default data
    python benchmarks/bench_startup.py --repeat 5 --cold    # + one run with empty kernel caches
    python benchmarks/bench_startup.py --kernels numba      # the numba kernels instead of C
    python benchmarks/bench_startup.py --importtime         # + the slowest imports (-X importtime)
    python benchmarks/bench_startup.py --commands metrics   # `rankwise metrics` on a ranks store

Every run is its own process: a small probe (``PROBE`` below) starts the interpreter,
imports ``rankwise.cli`` exactly as the console script does and calls ``main()`` with
the command's arguments.  An import hook wraps a few functions of ``rankwise.ranking``
when that module is first imported (so the import order is the command's own) and
records wall-clock timestamps, relative to the moment the parent started the process:

    cli imported          ``from rankwise.cli import main`` returned
    engine entered        ``compute_ranks`` called: manifests read, protocol problem
                          built, every import of the rank path done
    queries prepared      the query rows normalised and checked (first kernel call:
                          the C kernels' library loaded, or with numba's kernels
                          numba's target initialisation + ``prepare_rows`` cache load)
    first pass-1 task     the first gallery chunk's threshold task starts
    first tile            the first (query block x gallery chunk) tile task starts
                          (pass 1 over the whole gallery is done by then)
    first tile done       that tile's counts are back (includes ``count_tile``'s cache load)
    ranks done            ``compute_ranks`` returned
    exit                  ``main()`` returned (metrics, JSON report / ranks store written)

plus the parent's wall time of the whole process (``metrics`` has only the first and
the last two: it runs no engine).  ``--help`` and a bare ``python -c
pass`` are timed the same way for reference.  The table shows the best (minimum) of
``--repeat`` runs per column and the spread (max - min); the load average is printed.
Results: ``benchmarks/results/startup-<scale>.json``.  The environment is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (the data generator, next to this file)

EVENTS = (
    "cli imported",
    "engine entered",
    "queries prepared",
    "first pass-1 task",
    "first tile",
    "first tile done",
    "ranks done",
    "exit",
)

# argv[1]: JSON list of rankwise arguments; argv[2]: where to write the timestamps.
PROBE = r"""
import sys, time
T = {"interpreter": time.time()}
import importlib.abc, importlib.util, json

def _patch(mod):
    def wrap(name, start=None, end=None):
        f = getattr(mod, name)
        def timed(*a, **k):
            if start:
                T.setdefault(start, time.time())
            out = f(*a, **k)
            if end:
                T.setdefault(end, time.time())
            return out
        setattr(mod, name, timed)
    wrap("compute_ranks", "engine entered", "ranks done")
    wrap("prepare_chunk", None, "queries prepared")  # its first call is the queries
    wrap("_pair_keys_task", "first pass-1 task")
    wrap("_count_task", "first tile", "first tile done")

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "rankwise.ranking":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            _patch(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
from rankwise.cli import main
T["cli imported"] = time.time()
sys.argv = ["rankwise"] + json.loads(sys.argv[1])
rc = 0
try:
    main()
except SystemExit as exc:
    rc = exc.code or 0
T["exit"] = time.time()
T["rc"] = rc
T["numba_loaded"] = "numba" in sys.modules
with open(__import__("os").environ["RANKWISE_PROBE_OUT"], "w") as fh:
    json.dump(T, fh)
"""


def run_probe(args: list[str], env: dict | None = None) -> dict:
    """One process: the parent's wall time and the child's timestamps, relative to the
    moment the parent started it (seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.json"
        env = dict(os.environ if env is None else env, RANKWISE_PROBE_OUT=str(out))
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps(args)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.time() - t0
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"probe failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}")
        stamps = json.loads(out.read_text())
    res = {k: v - t0 for k, v in stamps.items() if isinstance(v, float)}
    res["wall"] = wall
    res["numba_loaded"] = stamps["numba_loaded"]
    return res


def run_plain(cmd: list[str]) -> float:
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.time() - t0


def command_args(command: str, files: dict, workers: int, out_dir: Path) -> list[str]:
    if command == "metrics":  # scores the store written once by prepare_metrics
        return ["metrics", str(out_dir / "metrics-input.zarr"), "--output", str(out_dir / "m.json")]
    args = [command, *bench.problem_args(files), "--workers", str(workers)]
    if command == "rank":
        args += ["--out", str(out_dir / "ranks.zarr")]
    else:
        args += ["--output", str(out_dir / "report.json")]
    return args


def importtime(args: list[str]) -> list[tuple[str, float]]:
    """Top-level imports of one run by cumulative time (s), from ``-X importtime``."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RANKWISE_PROBE_OUT=str(Path(tmp) / "t.json"))
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", PROBE, json.dumps(args)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=True,
        )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line[len("import time:") :].split("|")
        if name.startswith("  "):  # nested under another import
            continue
        rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])


def kernels_in_use() -> str:
    """Which kernels the rankwise being measured runs, and where they are cached."""
    code = (
        "from rankwise import native\n"
        "k = native.engine_kernels()\n"
        "if getattr(k, 'name', '') != 'native':\n"
        "    c = getattr(k.count_tile._cache, '_cache_path', 'none (compiled per process)')\n"
        "    print(f'numba ({native.why_not_native() or \"RANKWISE_KERNELS=numba\"}), cache {c}')\n"
        "else:\n"
        "    print(f'C, {k.path}')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def summarise(runs: list[dict]) -> dict:
    keys = [k for k in ("interpreter", *EVENTS, "wall") if all(k in r for r in runs)]
    return {
        k: {
            "best": min(r[k] for r in runs),
            "spread": max(r[k] for r in runs) - min(r[k] for r in runs),
        }
        for k in keys
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", choices=sorted(bench.SCALES), default="market")
    ap.add_argument("--distribution", choices=sorted(bench.DISTRIBUTIONS), default="default")
    ap.add_argument(
        "--commands", default="evaluate,rank", help="comma-separated: evaluate, rank, metrics"
    )
    ap.add_argument("--repeat", type=int, default=5, help="runs per command (best is shown)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--cold", action="store_true", help="also one run with empty kernel caches (C and numba)"
    )
    ap.add_argument(
        "--kernels", choices=("auto", "native", "numba"), help="RANKWISE_KERNELS for the runs"
    )
    ap.add_argument("--importtime", action="store_true", help="also list the slowest imports")
    ap.add_argument("--data-root", type=Path, default=RESULTS / "data")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    folder, _ = bench.ensure_data(args.scale, args.data_root, None, args.distribution)
    files = bench.data_files(folder)
    commands = [c for c in args.commands.split(",") if c]
    load_before = os.getloadavg()
    report: dict = {"scale": args.scale, "distribution": args.distribution, "data": str(folder)}
    if args.kernels:
        os.environ["RANKWISE_KERNELS"] = args.kernels  # every probe inherits it
    report["kernels"] = kernels_in_use()
    # rankwise's own bytecode, compiled once: an editable install is not compiled by pip,
    # and with PYTHONDONTWRITEBYTECODE=1 (set on some CI machines and sandboxes) every
    # measured start would compile the package's modules again (~0.07-0.1 s here)
    import compileall

    import rankwise

    compileall.compile_dir(str(Path(rankwise.__file__).parent), quiet=1)
    report["pythondontwritebytecode"] = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp)
        run_plain(["rankwise", "--help"])  # warm the file cache and numba's index
        if "metrics" in commands:  # its input: a ranks store of the same data
            rank = command_args("rank", files, args.workers, out_dir)
            rank[rank.index("--out") + 1] = str(out_dir / "metrics-input.zarr")
            run_plain(["rankwise", *rank])
        base = {
            "python -c pass": [
                run_plain([sys.executable, "-c", "pass"]) for _ in range(args.repeat)
            ],
            "rankwise --help": [run_plain(["rankwise", "--help"]) for _ in range(args.repeat)],
        }
        runs: dict[str, list[dict]] = {c: [] for c in commands}
        for _ in range(args.repeat):  # interleaved: a load spike hits every command alike
            for c in commands:
                runs[c].append(run_probe(command_args(c, files, args.workers, out_dir)))
        if args.cold:
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, NUMBA_CACHE_DIR=cache, RANKWISE_CACHE_DIR=cache)
                cold = run_probe(command_args(commands[0], files, args.workers, out_dir), env)
            report["cold"] = {"command": commands[0], **cold}
        if args.importtime:
            report["importtime"] = importtime(
                command_args(commands[0], files, args.workers, out_dir)
            )
    report["baselines"] = {k: {"best": min(v), "spread": max(v) - min(v)} for k, v in base.items()}
    report["runs"] = runs
    report["summary"] = {c: summarise(r) for c, r in runs.items()}
    report["loadavg"] = {"before": load_before, "after": os.getloadavg()}
    report["repeat"] = args.repeat
    report["command"] = " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])])

    print(f"data: {folder} ({args.scale}, {args.distribution}); kernels: {report['kernels']}")
    print(
        f"load average before {load_before[0]:.2f}, after {report['loadavg']['after'][0]:.2f};"
        f" best of {args.repeat} (spread = max - min), seconds from process start"
    )
    for name, b in report["baselines"].items():
        print(f"  {name:<22} {b['best']:.3f}  (spread {b['spread']:.3f})")
    head = "| event | " + " | ".join(f"{c} best | spread" for c in commands) + " |"
    print(head)
    print("| --- |" + " ---: | ---: |" * len(commands))
    for key in ("interpreter", *EVENTS, "wall"):
        cells = []
        for c in commands:
            s = report["summary"][c].get(key)
            cells += [f"{s['best']:.3f}", f"{s['spread']:.3f}"] if s else ["", ""]
        print(f"| {key} | " + " | ".join(cells) + " |")
    if "cold" in report:
        cold = report["cold"]
        print(
            f"cold kernel caches ({cold['command']}): first tile at {cold['first tile']:.2f} s,"
            f" wall {cold['wall']:.2f} s"
        )
    if "importtime" in report:
        print("slowest top-level imports (cumulative s, one run):")
        for name, sec in report["importtime"][:12]:
            print(f"  {name:<40} {sec:.3f}")
    out = args.out or RESULTS / f"startup-{args.scale}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
