#!/usr/bin/env python
"""The C kernels' tile counting alone, on tiles captured from a real run: ms per tile of
``count_fused`` (products and counts in one pass), of the products alone (the same call
on rows without thresholds) and of ``count_tile`` on a BLAS tile, for one or more builds
of ``_native_kernels.c`` (e.g. the package's and an edited copy), interleaved.

    python benchmarks/bench_tiles.py --scale msmt --distribution hard
    python benchmarks/bench_tiles.py --distribution default --source new.c --source old.c

A ``--source`` must export the functions the package's ``native.py`` loads (an edited
copy of the current file; an older revision may lack one).  ``rankwise.rank`` runs once
on bench.py's data with one worker; the arguments of its
first ``--tiles`` full tiles (``--query-block`` x ``--gallery-chunk``) are kept in memory
(~35 MB a tile at msmt scale).  Each build is compiled like the package's (same flags)
and must pass the package's self-test; every build's histograms must equal the first
build's ``count_tile`` on every tile (else the script stops).  Per build and kind: the
min and the median over ``--rounds`` rounds of the mean time per tile, one thread, in
this process (no start-up, no Dask).  The environment is left as it is.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (the data generator, next to this file)


def capture(files: dict, n_tiles: int, block: int, chunk: int) -> list[tuple]:
    """count_fused's arguments (packed rows first) of the run's first full tiles."""
    import rankwise
    from rankwise import native

    kernels = native.engine_kernels()
    if not getattr(kernels, "fused", False):
        raise SystemExit(
            "bench_tiles: these kernels have no fused tile kernel (neither AVX-512 nor AVX2 + FMA)"
        )
    kept: list[tuple] = []
    real = kernels.count_fused

    def keep(*args):
        qrows, grows = args[2], args[6]
        if len(kept) < n_tiles and len(qrows) == block and len(grows) == chunk:
            kept.append(tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args))
        return real(*args)

    kernels.count_fused = keep
    try:
        rankwise.rank(
            str(files["query"]), str(files["gallery"]), str(files["query_emb"]),
            str(files["gallery_emb"]), protocol="reid", distance="euclidean", workers=1,
            query_block=block, gallery_chunk=chunk,
        )  # fmt: skip
    finally:
        del kernels.count_fused
    if not kept:
        raise SystemExit(f"bench_tiles: no full {block} x {chunk} tile in this run")
    return kept


def build(source: Path, folder: Path, tag: int):
    """``source`` compiled as the package compiles its own, then self-tested."""
    from rankwise import native

    out = folder / f"kernels_{tag}.so"
    cc = native._compiler() or "cc"
    subprocess.run([cc, *native.FLAGS, "-o", str(out), str(source), "-lm"], check=True)
    kernels = native.NativeKernels(ctypes.CDLL(str(out)), out)
    native.self_test(kernels)
    return kernels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="msmt", choices=sorted(bench.SCALES))
    ap.add_argument("--distribution", default="hard", choices=("default", "hard", "easy"))
    ap.add_argument("--source", type=Path, action="append", help="a _native_kernels.c (repeat)")
    ap.add_argument("--tiles", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--query-block", type=int, default=1024)
    ap.add_argument("--gallery-chunk", type=int, default=8192)
    ap.add_argument("--data-root", type=Path, default=HERE / "results" / "data")
    ap.add_argument("--out", type=Path, default=None, help="JSON of the timings")
    args = ap.parse_args(argv)

    from rankwise import native

    sources = args.source or [Path(native.__file__).with_name("_native_kernels.c")]
    folder, _ = bench.ensure_data(args.scale, args.data_root, None, args.distribution)
    tiles = capture(bench.data_files(folder), args.tiles, args.query_block, args.gallery_chunk)
    with tempfile.TemporaryDirectory() as tmp:
        builds = [build(s, Path(tmp), i) for i, s in enumerate(sources)]
        sims = [t[2] @ t[6].T for t in tiles]  # count_tile's BLAS tiles, once
        want = [builds[0].count_tile(s, *t[2:]) for s, t in zip(sims, tiles, strict=True)]
        bare = []  # the same tiles without thresholds: the products alone
        for t in tiles:
            t = list(t)
            t[11], t[12] = t[11][:0], np.zeros_like(t[12])
            bare.append(tuple(t))
        kinds = {
            "count_fused": lambda k: [k.count_fused(*t) for t in tiles],
            "products alone": lambda k: [k.count_fused(*t) for t in bare],
            "count_tile": lambda k: [
                k.count_tile(s, *t[2:]) for s, t in zip(sims, tiles, strict=True)
            ],
        }
        times: dict = {}
        for _ in range(args.rounds):
            for source, k in zip(sources, builds, strict=True):
                for kind, run in kinds.items():
                    t0 = time.perf_counter()
                    got = run(k)
                    ms = 1000.0 * (time.perf_counter() - t0) / len(tiles)
                    if kind != "products alone" and not all(
                        np.array_equal(g, w) for g, w in zip(got, want, strict=True)
                    ):
                        raise SystemExit(f"bench_tiles: {source} ({kind}): other histograms")
                    times.setdefault(str(source), {}).setdefault(kind, []).append(ms)
    print(
        f"{args.scale} {args.distribution}, {len(tiles)} tiles of {args.query_block} x "
        f"{args.gallery_chunk}, {args.rounds} rounds, load {os.getloadavg()[0]:.2f}: "
        "ms per tile, min / median"
    )
    for source, by_kind in times.items():
        cells = [f"{k} {min(v):.2f} / {statistics.median(v):.2f}" for k, v in by_kind.items()]
        print(f"  {source}: " + ", ".join(cells))
    if args.out:
        args.out.write_text(json.dumps({"data": str(folder), "times": times}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
