#!/usr/bin/env python
"""Where the rank engine's time goes, per stage, on bench.py's synthetic data.

    python benchmarks/profile_stages.py --scale market --distribution all
    nice python benchmarks/profile_stages.py --scale msmt --distribution all --repeat 2

The engine runs in this process (``rankwise.api.rank`` then the metrics, the same calls
``rankwise evaluate`` makes) on the numba kernels (``RANKWISE_KERNELS=numba``: a normal
run uses their C counterparts, :mod:`rankwise.native`, which take the same steps but
cannot be timed step by step from outside) with ``workers=1``, so the stages run one
after another and their times add up to the whole.  Nothing in the package is changed:
this script wraps the engine's stage functions with timers before the run
(``rankwise.ranking`` and ``rankwise.kernels`` look them up by name at call time), so
normal runs carry no instrumentation at all.  Stages:

    setup            manifests read and checked, protocol problem built (open_inputs)
    read             embedding rows read (EmbeddingSource.read: Zarr chunks decoded; a
                     .npy is memory-mapped, so its pages are read by ``prepare``)
    prepare          rows normalised and checked (kernels.prepare_rows)
    exact keys       pass 1: float64 keys of the relevant pairs (kernels.pair_keys)
    BLAS             pass 2: the float32 tile similarities (the ``@`` in _count_task:
                     _count_task's time minus count_tile's)
    prefilter        count_tile's per-row set-up and float32 proxy pass (thresholds
                     mapped to float32 bounds, one vectorised pass over the row)
    counting         count_tile's compaction of the items ahead of the deepest
                     threshold, their threshold positions, the float32 settle test
                     and the float64 test (own bound) of the items it leaves open
    exact fallback   count_tile's float64 keys of the pairs still too close to call
                     (a fast any-order sum, the canonical sum where that is too close)
    finish           _plain_ranks outside its two passes: the threshold sort
                     (lexsort) and ranks_from_hist
    scheduling/other what remains of compute_ranks (Dask graphs, sums of the tile
                     counts, copies of query blocks, the memory estimate)
    metrics          per-query metrics from the ranks (result_from_ranks)

count_tile is one compiled function, so its three parts are separated with two variants
of its own source, derived here with ``ast`` and compiled once (never used for a number):
``no-fallback`` (the tile's open pairs are never decided) and ``prefilter-only`` (every
row stops after its proxy pass).  Every tile is timed with the real kernel and with both
variants on the same arrays (order alternating per tile): exact fallback = real -
no-fallback, counting = no-fallback - prefilter-only, prefilter = prefilter-only.  A
third variant counts the items reaching each step (ahead of the deepest threshold, left
open by the float32 test, still too close to call with their own bound).  When
count_tile's source no longer has the expected shape the split is reported as "not
separable".
Variant time is excluded from every stage; the unprofiled engine time of a plain run
(same process, same data) is printed beside the profiled total as a check.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import os
import sys
import textwrap
import time
from pathlib import Path

# The stages are timed by wrapping the numba kernels (rankwise.kernels): the C kernels
# that a ranking process uses by default (rankwise.native) take the same steps but cannot
# be split from outside, so this script runs the engine on numba's.
os.environ["RANKWISE_KERNELS"] = "numba"

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (the data generator, next to this file)

STAGES = (
    "setup",
    "read",
    "prepare",
    "exact keys",
    "BLAS",
    "prefilter",
    "counting",
    "exact fallback",
    "finish",
    "scheduling/other",
    "metrics",
)


# ====================================================================== count_tile variants


class _Variant(ast.NodeTransformer):
    """Rewrites count_tile's source (see the module docstring); ``found`` says what matched."""

    def __init__(self, kind: str):
        self.kind = kind
        self.found: set[str] = set()

    def visit_FunctionDef(self, node):
        node.decorator_list = []
        if self.kind == "count":
            node.args.args.append(ast.arg(arg="steps"))
        self.generic_visit(node)
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        test = ast.unparse(node.test)
        body = ast.unparse(node.body[0]) if node.body else ""
        # after the row's float32 proxies: ``if dense == 0: continue``
        if test == "dense == 0" and body == "continue":
            self.found.add("prefilter")
            if self.kind == "prefilter":  # every row stops after its proxy pass
                node.test = ast.Constant(True)
        # before the tile's open pairs: ``if n_amb == 0: return hist``
        elif test == "n_amb == 0" and body == "return hist":
            self.found.add("fallback")
            if self.kind == "nofallback":  # the open pairs are never decided
                node.test = ast.Constant(True)
            elif self.kind == "count":
                return [_stmt("steps[2] += n_amb"), node]
        return node

    def visit_Assign(self, node):
        self.generic_visit(node)
        # ``n_open = 0``: the row's compacted items (n) are about to be settled
        if ast.unparse(node) == "n_open = 0":
            self.found.add("settle")
            if self.kind == "count":
                return [_stmt("steps[0] += n"), node]
        return node

    def visit_For(self, node):
        self.generic_visit(node)
        # ``for u in range(n_open):`` the float64 test of items float32 left open
        if ast.unparse(node.iter) == "range(n_open)":
            self.found.add("open")
            if self.kind == "count":
                return [_stmt("steps[1] += n_open"), node]
        return node


def _stmt(code: str):
    return ast.parse(code).body[0]


def count_tile_variants():
    """``{"nofallback", "prefilter", "count"}`` compiled variants, or None when
    count_tile's source does not have the expected shape."""
    from numba import njit

    from rankwise import kernels

    source = textwrap.dedent(inspect.getsource(kernels.count_tile.py_func))
    out = {}
    for kind in ("nofallback", "prefilter", "count"):
        tree = ast.parse(source)
        variant = _Variant(kind)
        tree = ast.fix_missing_locations(variant.visit(tree))
        if variant.found != {"prefilter", "settle", "open", "fallback"}:
            return None
        namespace = dict(vars(kernels))
        exec(compile(tree, f"<count_tile {kind}>", "exec"), namespace)
        out[kind] = njit(nogil=True)(namespace["count_tile"])
    return out


# ====================================================================== instrumentation


class Profiler:
    """Stage timers around the engine's functions (one worker: times add up).

    ``overhead`` accumulates the time this profiler itself spends (variant kernels);
    every enclosing timer subtracts what accrued during its span.
    """

    def __init__(self, variants):
        self.variants = variants
        self.t = dict.fromkeys(STAGES, 0.0)
        self.t.update(
            {
                "engine": 0.0,
                "plain": 0.0,
                "pass1": 0.0,
                "pass2": 0.0,
                "count_task": 0.0,
                "count_tile": 0.0,
                "v_nofallback": 0.0,
                "v_prefilter": 0.0,
            }
        )
        self.steps = None
        self.tiles = 0
        self.pairs = 0
        self.overhead = 0.0
        self._undo: list = []

    def timed(self, owner, name: str, stage: str):
        """Replace ``owner.name`` by a wrapper adding its net time to ``stage``."""
        func = getattr(owner, name)
        prof = self

        def wrapper(*args, **kwargs):
            o0, t0 = prof.overhead, time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                prof.t[stage] += time.perf_counter() - t0 - (prof.overhead - o0)

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, func))

    def install(self):
        import numpy as np

        from rankwise import api, embeddings, inputs, kernels, ranking

        self.timed(inputs, "open_inputs", "setup")
        self.timed(inputs.Inputs, "problem", "setup")
        self.timed(embeddings.EmbeddingSource, "read", "read")
        self.timed(kernels, "prepare_rows", "prepare")
        self.timed(kernels, "pair_keys", "exact keys")
        self.timed(ranking, "compute_ranks", "engine")
        self.timed(ranking, "_plain_ranks", "plain")
        self.timed(ranking, "_pass_thresholds", "pass1")
        self.timed(ranking, "_pass_counts", "pass2")
        self.timed(ranking, "_count_task", "count_task")
        self.timed(api, "result_from_ranks", "metrics")

        real = kernels.count_tile
        prof = self

        def count_tile(*args):
            sim = args[0]
            prof.tiles += 1
            prof.pairs += sim.size
            order = ("real", "nofallback", "prefilter")
            if prof.tiles % 2 == 0:
                order = order[::-1]
            out = None
            for kind in order if prof.variants else ("real",):
                o0 = prof.overhead
                t0 = time.perf_counter()
                if kind == "real":
                    out = real(*args)
                    prof.t["count_tile"] += time.perf_counter() - t0
                else:
                    prof.variants[kind](*args)
                    dt = time.perf_counter() - t0
                    prof.t[f"v_{kind}"] += dt
                    prof.overhead = o0 + dt
            if prof.variants:
                o0, t0 = prof.overhead, time.perf_counter()
                steps = np.zeros(3, np.int64)
                prof.variants["count"](*args, steps)
                prof.steps = steps if prof.steps is None else prof.steps + steps
                prof.overhead = o0 + time.perf_counter() - t0
            return out

        kernels.count_tile = count_tile
        self._undo.append((kernels, "count_tile", real))

    def uninstall(self):
        for owner, name, func in reversed(self._undo):
            setattr(owner, name, func)
        self._undo.clear()

    def table(self, wall: float) -> dict:
        """Stage seconds (``None`` where not separable), from the raw timers."""
        t = dict(self.t)
        stages = {s: t[s] for s in ("setup", "read", "prepare", "exact keys", "metrics")}
        stages["BLAS"] = t["count_task"] - t["count_tile"]
        if self.variants:
            stages["prefilter"] = t["v_prefilter"]
            stages["counting"] = t["v_nofallback"] - t["v_prefilter"]
            stages["exact fallback"] = t["count_tile"] - t["v_nofallback"]
        else:
            stages["prefilter"] = stages["counting"] = stages["exact fallback"] = None
            stages["prefilter + counting + exact fallback"] = t["count_tile"]
        # _plain_ranks outside its two passes: the threshold sort and ranks_from_hist
        stages["finish"] = t["plain"] - t["pass1"] - t["pass2"]
        inside = ("read", "prepare", "exact keys", "finish")
        engine_parts = sum(stages[s] for s in inside) + t["count_task"]
        stages["scheduling/other"] = t["engine"] - engine_parts
        ordered = {s: stages[s] for s in STAGES if s in stages}
        ordered.update((k, v) for k, v in stages.items() if k not in ordered)
        ordered["total"] = wall
        ordered["unaccounted"] = wall - t["engine"] - t["setup"] - t["metrics"]
        return ordered


# ====================================================================== runs


def run_once(files: dict, args, profiler: Profiler | None) -> tuple[float, dict | None]:
    """One in-process evaluation; returns its wall time (minus profiler overhead) and
    the metrics."""
    from rankwise import api

    if profiler:
        profiler.install()
    t0 = time.perf_counter()
    try:
        ranks = api.rank(
            str(files["query"]),
            str(files["gallery"]),
            str(files["query_emb"]),
            str(files["gallery_emb"]),
            protocol="reid",
            distance="euclidean",
            workers=args.workers,
            query_block=args.query_block,
            gallery_chunk=args.gallery_chunk,
        )
        result = api.result_from_ranks(ranks, ks=(1, 5, 10))
    finally:
        wall = time.perf_counter() - t0 - (profiler.overhead if profiler else 0.0)
        if profiler:
            profiler.uninstall()
    return wall, result.metrics


def fmt(x, spec="{:.2f}"):
    return "" if x is None else spec.format(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", choices=sorted(bench.SCALES), default="market")
    ap.add_argument(
        "--distribution", choices=[*sorted(bench.DISTRIBUTIONS), "all"], default="default"
    )
    ap.add_argument("--gallery-format", choices=["npy", "zarr"], default=None)
    ap.add_argument("--repeat", type=int, default=2, help="profiled runs per distribution")
    ap.add_argument(
        "--workers", type=int, default=1, help="1 (default): stage times add up to the total"
    )
    ap.add_argument("--query-block", type=int, default=1024)
    ap.add_argument("--gallery-chunk", type=int, default=8192)
    ap.add_argument("--no-split", action="store_true", help="do not split count_tile")
    ap.add_argument("--data-root", type=Path, default=RESULTS / "data")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--report-only", type=Path, default=None, help="print the side-by-side table of a JSON"
    )
    args = ap.parse_args(argv)
    if args.report_only:
        print(side_by_side(json.loads(args.report_only.read_text())))
        return 0

    dists = list(bench.DISTRIBUTIONS) if args.distribution == "all" else [args.distribution]
    t_import = time.perf_counter()
    from rankwise import api, kernels, ranking  # noqa: F401  (imports not in the table)

    variants = None if args.no_split else count_tile_variants()
    # Warm-up (untimed): numba cache loads and the variants' compilation, on tiny data.
    tiny, _ = bench.ensure_data("tiny", args.data_root)
    run_once(bench.data_files(tiny), args, Profiler(variants))
    setup_s = time.perf_counter() - t_import

    report = {
        "scale": args.scale,
        "workers": args.workers,
        "query_block": args.query_block,
        "gallery_chunk": args.gallery_chunk,
        "split": variants is not None,
        "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
        "warmup_s": setup_s,
        "distributions": {},
    }
    for dist in dists:
        folder, _ = bench.ensure_data(args.scale, args.data_root, args.gallery_format, dist)
        files = bench.data_files(folder)
        entry: dict = {"data": str(folder), "runs": []}
        load0 = os.getloadavg()
        plain_wall, metrics = run_once(files, args, None)
        for _ in range(args.repeat):
            prof = Profiler(variants)
            wall, _m = run_once(files, args, prof)
            run = {"wall": wall, "stages": prof.table(wall), "tiles": prof.tiles}
            run["pairs"] = prof.pairs
            if prof.steps is not None:
                near, searched, fallback = (int(x) for x in prof.steps)
                run["items"] = {"near": near, "searched": searched, "fallback": fallback}
            entry["runs"].append(run)
        entry.update(plain_wall=plain_wall, metrics=metrics, loadavg=[load0, os.getloadavg()])
        report["distributions"][dist] = entry
        print_table(args.scale, dist, entry)
    out = args.out or RESULTS / f"profile-{args.scale}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print("\n" + side_by_side(report))
    print(f"wrote {out}")
    return 0


def side_by_side(report: dict) -> str:
    """One Markdown table, the distributions side by side: the best run's seconds and
    share per stage, and the spread (max - min) of the runs' seconds."""
    dists = report["distributions"]
    best = {d: min(e["runs"], key=lambda r: r["wall"]) for d, e in dists.items()}
    head = "| stage | " + " | ".join(f"{d} s | share | spread" for d in dists) + " |"
    lines = [head, "| --- |" + " ---: | ---: | ---: |" * len(dists)]
    keys = [k for k in next(iter(best.values()))["stages"] if k not in ("total", "unaccounted")]
    for key in [*keys, "total"]:
        cells = []
        for d, e in dists.items():
            vals = [r["stages"][key] for r in e["runs"]]
            v = best[d]["stages"][key]
            if v is None:
                cells += ["not separable", "", ""]
                continue
            share = 100.0 * v / best[d]["wall"]
            cells += [f"{v:.3f}", f"{share:.1f} %", f"{max(vals) - min(vals):.3f}"]
        label = f"**{key}**" if key == "total" else key
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    rows = {
        "rank-1 / mAP / mINP": lambda d, b: "{rank1:.1f} / {map:.1f} / {minp:.1f}".format(
            **dists[d]["metrics"]
        ),
        "pairs ahead of the deepest threshold": lambda d, b: (
            f"{100 * b['items']['near'] / b['pairs']:.2f} %"
        ),
        "float64 keys (too close for float32)": lambda d, b: (
            f"{b['items']['fallback']:,} ({100 * b['items']['fallback'] / b['pairs']:.3f} %)"
        ),
        "unprofiled run (s)": lambda d, b: f"{dists[d]['plain_wall']:.2f}",
        "load average": lambda d, b: "{:.1f} -> {:.1f}".format(
            dists[d]["loadavg"][0][0], dists[d]["loadavg"][1][0]
        ),
    }
    for name, cell in rows.items():
        cells = []
        for d in dists:
            try:
                cells += [cell(d, best[d]), "", ""]
            except KeyError:  # no split: no item counts
                cells += ["", "", ""]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_table(scale: str, dist: str, entry: dict) -> None:
    runs = entry["runs"]
    m = entry["metrics"]
    load = entry["loadavg"]
    walls = ", ".join(f"{r['wall']:.2f}" for r in runs)
    print(
        f"\n{scale} / {dist}: rank-1 {m['rank1']:.1f}, mAP {m['map']:.1f}, mINP {m['minp']:.1f};"
        f" load average {load[0][0]:.2f} -> {load[1][0]:.2f}; unprofiled run"
        f" {entry['plain_wall']:.2f} s; profiled runs {walls} s"
    )
    print("| stage | seconds (best) | share | spread (max - min) |")
    print("| --- | ---: | ---: | ---: |")
    best = min(runs, key=lambda r: r["wall"])
    total = best["wall"]
    keys = [k for k in best["stages"] if k not in ("total", "unaccounted")]
    for key in keys:
        vals = [r["stages"][key] for r in runs]
        if vals[0] is None:
            print(f"| {key} | not separable | | |")
            continue
        v = best["stages"][key]
        print(f"| {key} | {v:.3f} | {100 * v / total:.1f} % | {max(vals) - min(vals):.3f} |")
    spread = max(r["wall"] for r in runs) - min(r["wall"] for r in runs)
    print(f"| total | {total:.3f} | 100 % | {spread:.3f} |")
    if "items" in best:
        it = best["items"]
        print(
            f"pairs {best['pairs']:,} in {best['tiles']} tiles; ahead of the deepest threshold"
            f" {it['near']:,} ({100 * it['near'] / best['pairs']:.2f} %), left open by float32"
            f" {it['searched']:,}, float64 keys {it['fallback']:,}"
            f" ({100 * it['fallback'] / best['pairs']:.4f} %);"
            f" unaccounted {best['stages']['unaccounted']:.3f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
