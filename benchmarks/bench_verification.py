#!/usr/bin/env python
"""Benchmark verification metrics: ``rankwise verify`` (exact, out of core) against a
dense float64 brute force over every query-gallery pair.

    python benchmarks/bench_verification.py --scale tiny
    python benchmarks/bench_verification.py --scale market --distance cosine
    python benchmarks/bench_verification.py --scale msmt --methods plain,verify  # dense: ~23 GB

Methods, each in its own process (wall time and peak RSS of that process, from
``bench_rerank.measured``):

- ``plain``:  ``rankwise evaluate --protocol reid`` on the same data, for scale;
- ``verify``: ``rankwise verify --protocol reid --fprs 1e-4,1e-3,1e-2`` (two passes over
  float32 tiles, never the pair list; rankwise/verification.py);
- ``dense``:  the brute force: the full ``Q x G`` float64 matrix of rankwise's canonical
  distances (cosine: rows L2-normalised in float64 and stored float32, ``1 - q.g`` with
  float64 products; euclidean: ``sqrt(|q|^2 + |g|^2 - 2 q.g)`` from float32 rows in
  float64), the reid masks of ``tests/reference.py: protocol_masks``, all N negatives
  sorted; with ``m = floor(x N)``, ``threshold@x = n_(m+1)`` and ``TPR@x`` = share of
  the P positives strictly below it.  It needs ~24 bytes per pair and is skipped
  ("needs ~X GB") beyond 70 % of the available RAM.

The check: verify's ``tpr@fpr`` equal to dense's exactly, ``threshold@fpr`` to 1e-9
relative, the same P and N.  dense also counts the positives within 1e-9 (relative) of
each threshold, where float64 rounding could decide the comparison: 0 in every run, so
its TPRs do not depend on its own rounding.  Data: ``bench_rerank.generate`` (Market-like,
seeded; 10 % distractors labelled 0, 1 % junk -1; ``benchmarks/results/rerank-data/``),
which bench_rerank ranks by euclidean distance (the default here too).  Results:
``benchmarks/results/verify-<scale>-<distance>.json``.

Measured once each on the shared 2-core development machine (2026-12-01 04:43-04:44 UTC,
load average 1.9-2.4 from the other sessions, ``nice``; --workers 2 for plain; euclidean
unless marked), wall / peak RSS:

==========  =====================  ======  ============  ============  ============  =========
scale       Q x G x D              pairs   plain         verify        dense (f64)   check
==========  =====================  ======  ============  ============  ============  =========
tiny        300 x 2,000 x 64       0.60 M  5.1 s/237 MB  2.6 s/222 MB  0.6 s/83 MB   identical
small       1,000 x 6,000 x 128    5.9 M   1.2 s/226 MB  1.2 s/220 MB  0.9 s/193 MB  identical
market      3,368 x 15,913 x 512   53 M    1.9 s/330 MB  7.2 s/287 MB  5.3 s/958 MB  identical
market cos  3,368 x 15,913 x 512   53 M    2.2 s/330 MB  6.2 s/288 MB  5.1 s/978 MB  identical
msmt        11,659 x 82,161 x 512  ~950 M  not run       not run       ~23 GB
==========  =====================  ======  ============  ============  ============  =========

pairs: valid query-gallery pairs (tiny 595,247; small 5,924,050; market 53,048,865 =
P 52,924 positives + N 52,995,941 negatives).  "market cos": ``--distance cosine``.  msmt
was not run (the machine is shared; dense would need ~23 GB).  "identical": TPR@FPR equal
to the last bit and thresholds within 1e-9 relative at 1e-4, 1e-3 and 1e-2, the same P
and N, and no positive within 1e-9 of a threshold.  TPR@1e-4/1e-3/1e-2: market 91.22 /
98.61 / 99.97 %, small 14.98 / 41.63 / 82.60 %; cosine at market is 100 % at every level
(the 512-d synthetic data are too easy; its thresholds still match).  tiny's plain
includes compiling the worktree's cold numba cache (1.3 s on the next run).

verify's memory stays flat (287 MB at market, below plain's 330 MB) where dense grows
by ~18 bytes a pair (958 MB at market; ~18 GB extrapolated to msmt).  Its wall time is
~3.5x plain's and above dense's at market.  In-process ``tpr_at_fpr`` on market
(euclidean) takes 3.9-6.6 s depending on the load (imports 0.6 s more); a cProfile run
spent 2.6 of 3.9 s in pass 2's per-pair kernel ``_bracket_tile`` (single-threaded; 28
ROC/FPR brackets and the display histogram per negative) and 1.0 s in the float32 tile
products of both passes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_rerank import RESULTS, SCALES, generate, measured  # noqa: E402

#: Bytes per (query, gallery) pair of the dense reference at its peak: the float64
#: distance matrix, the float64 negatives copied out of it, the masks (a few bool
#: matrices) and slack; market measured ~18.7 (958 MB).
DENSE_BYTES_PER_PAIR = 24


def canonical_distances(qe, ge, distance: str):
    """Full ``(Q, G)`` float64 distances as rankwise defines them (kernels.prepare_rows:
    cosine rows scaled by ``1 / sqrt(sum x^2)`` in float64, stored float32)."""
    import numpy as np

    def rows(x):
        x64 = np.asarray(x, dtype=np.float64)
        if distance == "cosine":
            x64 = x64 * (1.0 / np.sqrt((x64 * x64).sum(axis=1)))[:, None]
        return x64.astype(np.float32).astype(np.float64)

    q, g = rows(qe), rows(ge)
    d = q @ g.T  # float64 products
    if distance == "cosine":
        np.subtract(1.0, d, out=d)
        return d
    d *= -2.0
    d += (q * q).sum(axis=1)[:, None]
    d += (g * g).sum(axis=1)[None, :]
    np.maximum(d, 0.0, out=d)
    return np.sqrt(d, out=d)


def dense_worker(folder: Path, distance: str, fprs: list[float], out: Path) -> None:
    """The dense float64 brute force (runs inside its own process)."""
    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(ROOT / "tests"))
    from reference import protocol_masks

    q = pd.read_csv(folder / "q.csv", dtype=str, keep_default_na=False)
    g = pd.read_csv(folder / "g.csv", dtype=str, keep_default_na=False)
    d = canonical_distances(np.load(folder / "q.npy"), np.load(folder / "g.npy"), distance)
    valid, relevant = protocol_masks("reid", q, g)
    positives = np.sort(d[relevant])
    valid &= ~relevant
    del relevant
    negatives = d[valid]
    del valid, d
    negatives.sort()
    n, p = len(negatives), len(positives)
    tpr, threshold, near = {}, {}, {}
    for x in sorted(set(fprs)):
        t = float(negatives[math.floor(x * n)])  # n_(m+1), 0-based index m
        key = f"{x:g}"
        threshold[key] = t
        tpr[key] = 100.0 * int(np.searchsorted(positives, t, side="left")) / p
        lo, hi = np.searchsorted(positives, [t - 1e-9 * abs(t), t + 1e-9 * abs(t)])
        near[key] = int(hi - lo)
    out.write_text(
        json.dumps(
            {
                "tpr@fpr": tpr,
                "threshold@fpr": threshold,
                "num_positive_pairs": p,
                "num_negative_pairs": n,
                "positives_near_threshold": near,
            }
        )
    )


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def compare(verify: dict, dense: dict) -> list[str]:
    """Differences between verify's and dense's numbers (empty: identical)."""
    diffs = []
    for key in ("num_positive_pairs", "num_negative_pairs"):
        if verify[key] != dense[key]:
            diffs.append(f"{key} {verify[key]} vs {dense[key]}")
    for level, want in dense["tpr@fpr"].items():
        got = verify["tpr@fpr"].get(level)
        if got != want:
            diffs.append(f"tpr@{level} {got} vs {want}")
        got_t, want_t = verify["threshold@fpr"].get(level), dense["threshold@fpr"][level]
        if got_t is None or abs(got_t - want_t) > 1e-9 * abs(want_t):
            diffs.append(f"threshold@{level} {got_t} vs {want_t}")
    return diffs


def fmt_run(run: dict) -> str:
    if "skipped" in run:
        return run["skipped"]
    if run["rc"] != 0:
        return f"failed (rc {run['rc']})"
    mb = run["peak_rss_mb"]
    size = f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"
    return f"{run['wall_s']:.1f} s / {size}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=list(SCALES), default="tiny")
    parser.add_argument("--methods", default="plain,verify,dense")
    parser.add_argument("--distance", choices=("euclidean", "cosine"), default="euclidean")
    parser.add_argument("--fprs", default="1e-4,1e-3,1e-2")
    parser.add_argument("--workers", type=int, default=2, help="plain's --workers")
    parser.add_argument("--timeout", type=float, default=6 * 3600)
    parser.add_argument(
        "--dense-worker", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    fprs = [float(x) for x in args.fprs.split(",")]
    if args.dense_worker:
        dense_worker(Path(args.dense_worker[0]), args.distance, fprs, Path(args.dense_worker[1]))
        return 0

    folder = generate(args.scale)
    n_q, n_g, dim, _ = SCALES[args.scale]
    runs = RESULTS / f"verify-runs-{args.scale}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True)
    inputs = [
        "--query", str(folder / "q.csv"), "--gallery", str(folder / "g.csv"),
        "--query-embeddings", str(folder / "q.npy"), "--gallery-embeddings", str(folder / "g.npy"),
        "--protocol", "reid", "--distance", args.distance,
    ]  # fmt: skip
    rankwise = str(Path(sys.executable).parent / "rankwise")
    commands = {
        "plain": [rankwise, "evaluate", *inputs, "--workers", str(args.workers)],
        "verify": [rankwise, "verify", *inputs, "--fprs", args.fprs],
        "dense": [
            sys.executable,
            __file__,
            "--distance",
            args.distance,
            "--fprs",
            args.fprs,
            "--dense-worker",
            str(folder),
            str(runs / "dense.json"),
        ],
    }
    table: dict = {}
    for method in args.methods.split(","):
        out = runs / f"{method}.json"
        cmd = commands[method] + (["--output", str(out)] if method != "dense" else [])
        need = DENSE_BYTES_PER_PAIR * n_q * n_g
        if method == "dense" and need > 0.7 * available_bytes():
            table[method] = {"skipped": f"skipped: needs ~{need / 1e9:.0f} GB"}
            print(f"dense: {table[method]['skipped']}", flush=True)
            continue
        print(f"{method} ...", flush=True)
        run = measured(cmd, args.timeout)
        if run["rc"] == 0 and out.exists():
            run["result"] = json.loads(out.read_text())
        table[method] = run
        shown = {k: v for k, v in run.items() if k not in ("command", "result")}
        print(json.dumps(shown), flush=True)

    verify, dense = table.get("verify", {}), table.get("dense", {})
    if "result" in verify and "result" in dense:
        diffs = compare(verify["result"], dense["result"])
        check = "identical" if not diffs else "; ".join(diffs)
    else:
        check = "not compared"
    pairs = verify.get("result") or dense.get("result")
    n_pairs = f"{pairs['num_positive_pairs'] + pairs['num_negative_pairs']:,}" if pairs else "?"
    header = ["scale", "Q x G x D", "pairs", *table, "verify vs dense"]
    row = [
        args.scale,
        f"{n_q:,} x {n_g:,} x {dim}",
        n_pairs,
        *(fmt_run(r) for r in table.values()),
        check,
    ]
    print()
    print(" | ".join(header))
    print(" | ".join(row))
    if "result" in verify:
        print("verify:", json.dumps(verify["result"]["tpr@fpr"]))
        print("threshold:", json.dumps(verify["result"]["threshold@fpr"]))
    if "result" in dense:
        print("dense positives near threshold:", dense["result"]["positives_near_threshold"])
    doc = {
        "scale": args.scale,
        "shape": SCALES[args.scale],
        "distance": args.distance,
        "fprs": fprs,
        "check": check,
        "runs": table,
    }
    target = RESULTS / f"verify-{args.scale}-{args.distance}.json"
    target.write_text(json.dumps(doc, indent=1))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
