#!/usr/bin/env python
"""Benchmark k-reciprocal re-ranking: rankwise (out of core) against the dense reference.

    python benchmarks/bench_rerank.py --scale tiny
    python benchmarks/bench_rerank.py --scale small --methods plain,rerank,dense
    python benchmarks/bench_rerank.py --scale msmt --methods plain,rerank   # no dense: ~35 GB

Methods, each in its own process (wall time and peak RSS of that process, from
``getrusage(RUSAGE_CHILDREN)`` in a small wrapper):

- ``plain``:  ``rankwise evaluate --protocol reid`` (no re-ranking), for scale;
- ``rerank``: the same with ``--rerank K1,K2,LAMBDA``;
- ``dense``:  the published algorithm on the whole (Q+G) x (Q+G) matrix, in float32 as
  torchreid runs it (``tests/reference.py: re_ranking(dtype=float32)``), then the
  brute-force metrics of tests/reference.py.  It needs ~3 (Q+G)^2 x 4 bytes.

The table lists each method's wall time, peak RSS and metrics, and the largest metric
difference between ``rerank`` and ``dense`` (float32 rounding in the reference; see
rankwise/rerank.py).  Data: Market-like, seeded, written once to
``benchmarks/results/rerank-data/<scale>/``.  Results: ``benchmarks/results/rerank-<scale>.json``.

Measured once on the shared 2-core development machine (noisy; k1, k2, lambda = 20, 6,
0.3; --workers 2), wall / peak RSS:

=======  ===========================  ==============  ================  =================
scale    Q x G x D                    plain           rerank            dense (float32)
=======  ===========================  ==============  ================  =================
small    1,000 x 6,000 x 128          1.2 s / 226 MB  3.4 s / 503 MB    25 s / 1.4 GB
market   3,368 x 15,913 x 512         1.6 s / 330 MB  9.8 s / 596 MB    125 s / 9.9 GB (*)
msmt     11,659 x 82,161 x 512        9.3 s / 399 MB  249 s / 1.0 GB    (~35 GB: not run)
=======  ===========================  ==============  ================  =================

MSMT17 scale again, alone on the machine (load 0.9-3.0, 2026-12-01 05:04-05:16), three data
distributions (``--noise``; rank-1 plain -> re-ranked): 1.1 (100 -> 100 %) 6.4 s / 407 MB
plain, 193 s / 1,019 MB re-ranked; 1.5 (1.2 -> 4.0 %) 8.7 s / 397 MB, 203 s / 1,046 MB;
3 (chance level) 17.0 s / 407 MB, 201 s / 982 MB.  Peak RSS <= 2 GB on every one; the
``--memory-limit`` estimate for this shape is 1,858 MB.

(*) measured alone on the quiet machine (the other rows while other jobs ran); the largest
scale the dense reference fits in this machine's 24 GB.  rerank and dense gave identical
metrics at tiny, small and market scale.  The synthetic data
are easy at 512 dimensions (rank-1 100 %); the noise level is not tuned per scale.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

# Q, G, D, identities
SCALES = {
    "tiny": (300, 2_000, 64, 100),
    "small": (1_000, 6_000, 128, 300),
    "market": (3_368, 15_913, 512, 750),
    "msmt": (11_659, 82_161, 512, 3_060),
}


def generate(scale: str, noise: float = 1.1) -> Path:
    """q.csv, g.csv, q.npy, g.npy: persons on 6 cameras, 10 % distractors, 1 % junk;
    ``noise`` is the spread of each image around its person (larger: harder data)."""
    import numpy as np
    import pandas as pd

    folder = RESULTS / "rerank-data" / (scale if noise == 1.1 else f"{scale}-noise{noise:g}")
    if (folder / "g.npy").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    n_q, n_g, dim, n_ids = SCALES[scale]
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(n_ids, dim)).astype(np.float32)
    q_lab = rng.integers(0, n_ids, n_q)
    g_lab = np.concatenate([np.arange(n_ids), rng.integers(0, n_ids, n_g - n_ids)])
    kind = rng.random(n_g)
    q = centres[q_lab] + noise * rng.normal(size=(n_q, dim)).astype(np.float32)
    g = centres[g_lab] + noise * rng.normal(size=(n_g, dim)).astype(np.float32)
    distractor, junk = kind < 0.10, (kind >= 0.10) & (kind < 0.11)
    g[distractor] = rng.normal(size=(int(distractor.sum()), dim)).astype(np.float32)
    labels = np.where(distractor, "0", np.where(junk, "-1", (g_lab + 1).astype(str)))
    pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n_q)],
            "label": (q_lab + 1).astype(str),
            "camera": rng.integers(1, 7, n_q),
        }
    ).to_csv(folder / "q.csv", index=False)
    pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_g)], "label": labels, "camera": rng.integers(1, 7, n_g)}
    ).to_csv(folder / "g.csv", index=False)
    np.save(folder / "q.npy", q.astype(np.float32))
    np.save(folder / "g.npy", g.astype(np.float32))
    return folder


def dense_worker(folder: Path, k1: int, k2: int, lam: float, out: Path) -> None:
    """The dense float32 reference (runs inside its own process)."""
    import numpy as np
    import pandas as pd

    sys.path.insert(0, str(ROOT / "tests"))
    from reference import evaluate_reference, re_ranking

    q = pd.read_csv(folder / "q.csv", dtype=str, keep_default_na=False)
    g = pd.read_csv(folder / "g.csv", dtype=str, keep_default_na=False)
    qe, ge = np.load(folder / "q.npy"), np.load(folder / "g.npy")

    def sq(a, b):  # torchreid's euclidean_squared_distance, float32
        return (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2.0 * a @ b.T

    final = re_ranking(sq(qe, ge), sq(qe, qe), sq(ge, ge), k1, k2, lam, dtype=np.float32)
    ref = evaluate_reference(
        q, g, qe, ge, protocol="reid", distance="euclidean", ks=(1, 5, 10), dist=final
    )
    out.write_text(json.dumps({"metrics": ref.metrics, "num_queries": ref.num_queries}))


def measured(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` under a wrapper process; its wall time and peak RSS (MB)."""
    wrapper = (
        "import resource, subprocess, sys, time, json;"
        "t = time.perf_counter(); rc = subprocess.call(sys.argv[1:]);"
        "wall = time.perf_counter() - t;"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024;"
        "print(json.dumps({'rc': rc, 'wall_s': wall, 'peak_rss_mb': rss}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True, timeout=timeout
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["command"] = shlex.join(cmd)
    if result["rc"] != 0:
        result["stderr"] = proc.stderr[-2000:]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=list(SCALES), default="tiny")
    parser.add_argument("--methods", default="plain,rerank,dense")
    parser.add_argument("--k1", type=int, default=20)
    parser.add_argument("--k2", type=int, default=6)
    parser.add_argument("--lambda", dest="lam", type=float, default=0.3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--noise", type=float, default=1.1, help="spread around each person (3: hard data)"
    )
    parser.add_argument("--timeout", type=float, default=6 * 3600)
    parser.add_argument(
        "--dense-worker", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.dense_worker:
        dense_worker(
            Path(args.dense_worker[0]), args.k1, args.k2, args.lam, Path(args.dense_worker[1])
        )
        return 0

    folder = generate(args.scale, args.noise)
    runs = RESULTS / f"rerank-runs-{args.scale}-{time.strftime('%Y%m%d-%H%M%S')}"
    runs.mkdir(parents=True)
    inputs = [
        "--query", str(folder / "q.csv"), "--gallery", str(folder / "g.csv"),
        "--query-embeddings", str(folder / "q.npy"), "--gallery-embeddings", str(folder / "g.npy"),
        "--protocol", "reid", "--distance", "euclidean", "--workers", str(args.workers),
    ]  # fmt: skip
    rankwise = str(Path(sys.executable).parent / "rankwise")
    rk = f"{args.k1},{args.k2},{args.lam}"
    commands = {
        "plain": [rankwise, "evaluate", *inputs, "--output", str(runs / "plain.json")],
        "rerank": [
            rankwise,
            "evaluate",
            *inputs,
            "--rerank",
            rk,
            "--output",
            str(runs / "rerank.json"),
        ],
        "dense": [
            sys.executable,
            __file__,
            "--k1",
            str(args.k1),
            "--k2",
            str(args.k2),
            "--lambda",
            str(args.lam),
            "--dense-worker",
            str(folder),
            str(runs / "dense.json"),
        ],
    }
    table = {}
    for method in args.methods.split(","):
        print(f"{method} ...", flush=True)
        run = measured(commands[method], args.timeout)
        out = runs / f"{method}.json"
        if run["rc"] == 0 and out.exists():
            run["metrics"] = json.loads(out.read_text())["metrics"]
        table[method] = run
        print(json.dumps({k: v for k, v in run.items() if k != "command"}, indent=1), flush=True)
    if "metrics" in table.get("rerank", {}) and "metrics" in table.get("dense", {}):
        a, b = table["rerank"]["metrics"], table["dense"]["metrics"]
        table["max_abs_difference_rerank_vs_dense_pp"] = max(abs(a[k] - b[k]) for k in b)
    doc = {"scale": args.scale, "shape": SCALES[args.scale], "rerank": rk, "runs": table}
    target = RESULTS / f"rerank-{args.scale}.json"
    target.write_text(json.dumps(doc, indent=1))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
