#!/usr/bin/env python
"""Benchmark ``rankwise evaluate --protocol reid`` against a matmul floor and the
usual full-argsort evaluation, on synthetic Market/MSMT-like re-identification data.

    python benchmarks/bench.py --scale tiny
    python benchmarks/bench.py --scale market --methods matmul,argsort,rankwise --workers 2
    python benchmarks/bench.py --scale msmt --out benchmarks/results/msmt.json
    python benchmarks/bench.py --scale market --methods matmul,rankwise,rankwise-gpu
    python benchmarks/bench.py --scale market,msmt --distribution all --repeat 2   # the issue's run

``rankwise-gpu`` is ``rankwise evaluate --device cuda``: it runs when torch sees a CUDA
device and is reported as "no GPU" otherwise (``--gpu-device torch-cpu`` runs its code path
on the CPU instead); its numbers must equal ``rankwise``'s.

Each method runs in its own process, started by a tiny wrapper process that reports
the method's wall time and peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``), so the
numbers are per method and not inflated by this driver process.  See README.md.

The environment is left as it is (no BLAS thread variables, no OPENBLAS_CORETYPE are
set or changed); their values are recorded in the JSON output.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

GEN_VERSION = 1  # bump when the generator changes: the data cache key changes
GEN_CHUNK = 65536  # rows generated (and seeded) per chunk
ZARR_CHUNK = 16384  # rows per Zarr chunk of the gallery store (as rankwise writes)

# Q x G x D, identities, cameras, distractor (label 0) and junk (label -1) fractions of
# the gallery, noise level (tuned so rank-1 is realistic, 60-90 %), gallery format.
SCALES = {
    "tiny": dict(
        n_query=500,
        n_gallery=5_000,
        dim=64,
        n_ids=100,
        n_cams=6,
        distractor_frac=0.10,
        junk_frac=0.01,
        noise=1.1,
        gallery_format="npy",
    ),
    "market": dict(
        n_query=3_368,
        n_gallery=15_913,
        dim=512,
        n_ids=750,
        n_cams=6,
        distractor_frac=0.17,
        junk_frac=0.01,
        noise=2.1,
        gallery_format="npy",
    ),
    "msmt": dict(
        n_query=11_659,
        n_gallery=82_161,
        dim=512,
        n_ids=3_060,
        n_cams=6,
        distractor_frac=0.05,
        junk_frac=0.01,
        noise=2.1,
        gallery_format="npy",
    ),
    "large": dict(
        n_query=20_000,
        n_gallery=1_000_000,
        dim=256,
        n_ids=10_000,
        n_cams=6,
        distractor_frac=0.80,
        junk_frac=0.01,
        noise=1.4,
        gallery_format="zarr",
    ),
    "memory": dict(
        n_query=20_000,
        n_gallery=200_000,
        dim=64,
        n_ids=5_000,
        n_cams=6,
        distractor_frac=0.50,
        junk_frac=0.01,
        noise=0.95,
        gallery_format="npy",
    ),
}
# Data distributions (overrides of a scale's parameters). The counting work grows with the
# number of non-relevant items near a relevant item's distance, so the engine's cost
# depends on how good the "model" is:
#   default  the scale's own parameters (rank-1 60-95 %, mAP 45-75 %);
#   hard     a weak early checkpoint: many cameras with strong camera offsets and more
#            noise, so relevant items sit deep in the ranking (mAP ~10-20 %, mINP ~1 %);
#   easy     a strong model: less noise (mAP ~80 %+).
# ``noise_scale`` multiplies the scale's noise; ``cam_offset`` is the camera offset's
# standard deviation relative to an identity centre (0.3 by default).
DISTRIBUTIONS = {
    "default": {},
    "hard": {"n_cams": 15, "cam_offset": 0.7, "noise_scale": 1.1},
    "easy": {"noise_scale": 0.9},
}
SEED = 20240601
ALL_METHODS = ("matmul", "argsort", "rankwise", "rankwise-gpu")
KS = (1, 5, 10)
GB = 1024**3
MB = 1024**2

# The wrapper: starts one method, waits, reports wall time and the peak RSS of its
# child (RUSAGE_CHILDREN of a process that has only that child).  It imports nothing
# heavy, so the child's ru_maxrss (which includes the parent's high-water mark at
# exec time on Linux) is not inflated by the driver.
WRAPPER = r"""
import json, os, resource, subprocess, sys, time
cmd = json.loads(sys.argv[1]); out = sys.argv[2]; log = sys.argv[3]; timeout = float(sys.argv[4])
with open(log, "wb") as fh:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        rc = p.wait(timeout=timeout if timeout > 0 else None)
    except subprocess.TimeoutExpired:
        p.kill(); rc = p.wait(); rc = "timeout"
    wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(out, "w") as fh:
    json.dump({"rc": rc, "wall_s": wall, "peak_rss_mb": ru.ru_maxrss / 1024.0,
               "user_s": ru.ru_utime, "sys_s": ru.ru_stime}, fh)
"""


# ====================================================================== data


def scale_params(
    scale: str, gallery_format: str | None = None, distribution: str = "default"
) -> dict:
    p = dict(SCALES[scale])
    if gallery_format:
        p["gallery_format"] = gallery_format
    overrides = dict(DISTRIBUTIONS[distribution])
    if "noise_scale" in overrides:
        p["noise"] = round(p["noise"] * overrides.pop("noise_scale"), 6)
    p.update(overrides)
    if distribution != "default":  # the default's cache key is unchanged
        p["distribution"] = distribution
    p.update(seed=SEED, gen_version=GEN_VERSION, gen_chunk=GEN_CHUNK)
    return p


def data_key(params: dict) -> str:
    blob = json.dumps(params, sort_keys=True).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


def _layout(p: dict):
    """Labels and cameras of query and gallery rows (small int arrays)."""
    import numpy as np

    rng = np.random.default_rng([p["seed"], 0])
    nq, ng, n_ids, n_cams = p["n_query"], p["n_gallery"], p["n_ids"], p["n_cams"]
    # queries: identities 1..n_ids in turn; an identity's k-th query is seen by camera
    # (start + k) mod n_cams, so its queries come from different cameras (Market-like)
    q_lab = (np.arange(nq) % n_ids) + 1
    k = np.arange(nq) // n_ids
    start = rng.integers(0, n_cams, n_ids + 1)
    q_cam = (start[q_lab] + k) % n_cams + 1
    qperm = rng.permutation(nq)
    q_lab, q_cam = q_lab[qperm], q_cam[qperm]
    # gallery: identity images (every identity at least once, in turn), distractors
    # (label 0), junk (label -1); random cameras; shuffled
    n_junk = int(round(p["junk_frac"] * ng))
    n_dis = int(round(p["distractor_frac"] * ng))
    n_pos = ng - n_junk - n_dis
    g_lab = np.concatenate(
        [(np.arange(n_pos) % n_ids) + 1, np.zeros(n_dis, np.int64), -np.ones(n_junk, np.int64)]
    )
    g_cam = rng.integers(1, n_cams + 1, ng)
    gperm = rng.permutation(ng)
    g_lab, g_cam = g_lab[gperm], g_cam[gperm]
    centres = rng.standard_normal((n_ids + 1, p["dim"]), dtype=np.float32)
    centres /= math.sqrt(p["dim"])
    cam_off = rng.standard_normal((n_cams + 1, p["dim"]), dtype=np.float32)
    cam_off *= p.get("cam_offset", 0.3) / math.sqrt(p["dim"])
    return q_lab, q_cam, g_lab, g_cam, centres, cam_off


def _embedding_chunks(p: dict, labels, cams, centres, cam_off, stream: int):
    """Yield float32 chunks: identity centre (+ camera offset) + noise, chunk-seeded."""
    import numpy as np

    d, sigma = p["dim"], p["noise"] / math.sqrt(p["dim"])
    n = len(labels)
    for c, s in enumerate(range(0, n, GEN_CHUNK)):
        e = min(n, s + GEN_CHUNK)
        rng = np.random.default_rng([p["seed"], stream, c])
        lab, cam = labels[s:e], cams[s:e]
        x = rng.standard_normal((e - s, d), dtype=np.float32)
        x *= sigma
        pos = lab > 0
        x[pos] += centres[lab[pos]]
        dis = lab == 0  # distractors: each its own random "person"
        if dis.any():
            x[dis] += rng.standard_normal((int(dis.sum()), d), dtype=np.float32) / math.sqrt(d)
        junk = lab < 0  # junk: a weak, partial view of some identity
        if junk.any():
            who = rng.integers(1, len(centres), int(junk.sum()))
            x[junk] += 0.5 * centres[who]
        x += cam_off[cam]
        yield x


def _write_manifest(path: Path, prefix: str, labels, cams) -> None:
    width = len(str(len(labels)))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write("id,label,camera\n")
        step = 100_000
        for s in range(0, len(labels), step):
            fh.write(
                "".join(
                    f"{prefix}{i:0{width}d},{lab},{c}\n"
                    for i, lab, c in zip(
                        range(s, min(s + step, len(labels))),
                        labels[s : s + step].tolist(),
                        cams[s : s + step].tolist(),
                        strict=True,
                    )
                )
            )
    os.replace(tmp, path)


def _write_npy(path: Path, n: int, d: int, chunks) -> None:
    import numpy as np

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": "<f4", "fortran_order": False, "shape": (n, d)}
        )
        rows = 0
        for x in chunks:
            fh.write(np.ascontiguousarray(x, dtype="<f4").tobytes())
            rows += len(x)
    assert rows == n
    os.replace(tmp, path)


def _write_zarr(path: Path, n: int, d: int, chunks, params: dict) -> None:
    """A rankwise-style embedding store: group, array "embeddings" (N, D) float32
    chunked along N, attrs kind/complete; written to <path>.tmp then renamed."""
    import zarr

    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    group = zarr.open_group(str(tmp), mode="w")
    arr = group.create_array("embeddings", shape=(n, d), dtype="float32", chunks=(ZARR_CHUNK, d))
    row = 0
    for x in chunks:  # GEN_CHUNK is a multiple of ZARR_CHUNK: aligned
        arr[row : row + len(x)] = x
        row += len(x)
    assert row == n
    group.attrs.update(
        {
            "kind": "embeddings",
            "encoder": "synthetic-bench",
            "checkpoint_hash": data_key(params),
            "manifest_hash": "",
            "rankwise_version": "",
            "complete": True,
        }
    )
    if path.exists():
        shutil.rmtree(path)
    os.rename(tmp, path)


def ensure_data(
    scale: str, root: Path, gallery_format: str | None = None, distribution: str = "default"
) -> tuple[Path, dict]:
    """Generate (once) and return the data folder of ``scale`` x ``distribution``."""
    params = scale_params(scale, gallery_format, distribution)
    folder = root / scale / data_key(params)
    if (folder / "DONE").exists():
        return folder, params
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"[data] generating {scale} -> {folder}", flush=True)
    q_lab, q_cam, g_lab, g_cam, centres, cam_off = _layout(params)
    _write_manifest(folder / "query.csv", "q", q_lab, q_cam)
    _write_manifest(folder / "gallery.csv", "g", g_lab, g_cam)
    d = params["dim"]
    _write_npy(
        folder / "query.npy",
        len(q_lab),
        d,
        _embedding_chunks(params, q_lab, q_cam, centres, cam_off, stream=1),
    )
    chunks = _embedding_chunks(params, g_lab, g_cam, centres, cam_off, stream=2)
    if params["gallery_format"] == "zarr":
        _write_zarr(folder / "gallery.zarr", len(g_lab), d, chunks, params)
    else:
        _write_npy(folder / "gallery.npy", len(g_lab), d, chunks)
    (folder / "params.json").write_text(json.dumps(params, indent=1))
    (folder / "DONE").write_text(f"{time.perf_counter() - t0:.1f} s\n")
    print(f"[data] done in {time.perf_counter() - t0:.1f} s", flush=True)
    return folder, params


def data_files(folder: Path) -> dict:
    g = folder / "gallery.zarr"
    return {
        "query": folder / "query.csv",
        "gallery": folder / "gallery.csv",
        "query_emb": folder / "query.npy",
        "gallery_emb": g if g.exists() else folder / "gallery.npy",
    }


# ====================================================================== readers


def _npy_shape_offset(path: Path):
    import numpy as np

    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(fh)
        assert not fortran and dtype == np.float32, (path, dtype)
        return shape, fh.tell()


def iter_rows(path: Path, chunk: int):
    """Yield (start, float32 block) over the rows of a .npy file or Zarr store, reading
    one block at a time (no memory map, so resident memory stays one block)."""
    import numpy as np

    path = Path(path)
    if path.suffix == ".npy":
        (n, d), offset = _npy_shape_offset(path)
        with open(path, "rb") as fh:
            fh.seek(offset)
            for s in range(0, n, chunk):
                m = min(chunk, n - s)
                yield s, np.fromfile(fh, dtype=np.float32, count=m * d).reshape(m, d)
    else:
        import zarr

        node = zarr.open(str(path), mode="r")
        arr = node["embeddings"] if isinstance(node, zarr.Group) else node
        for s in range(0, arr.shape[0], chunk):
            yield s, np.asarray(arr[s : s + chunk], dtype=np.float32)


def n_rows_dim(path: Path) -> tuple[int, int]:
    path = Path(path)
    if path.suffix == ".npy":
        return tuple(_npy_shape_offset(path)[0])
    import zarr

    node = zarr.open(str(path), mode="r")
    arr = node["embeddings"] if isinstance(node, zarr.Group) else node
    return tuple(arr.shape)


def load_all(path: Path):
    import numpy as np

    n, d = n_rows_dim(path)
    out = np.empty((n, d), np.float32)
    for s, x in iter_rows(path, GEN_CHUNK):
        out[s : s + len(x)] = x
    return out


def read_manifest(path: Path):
    import numpy as np

    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return (
        np.array([int(r["label"]) for r in rows], np.int64),
        np.array([int(r["camera"]) for r in rows], np.int64),
    )


# ====================================================================== methods (workers)


def worker_matmul(files: dict, args) -> dict:
    """The floor: Q x G float32 products in (query block x gallery chunk) tiles, reading
    the same files; the products are discarded (a strided checksum keeps them live)."""
    import numpy as np

    if args.matmul_blas_threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.matmul_blas_threads)
    t0 = time.perf_counter()
    q = load_all(files["query_emb"])
    t_load = time.perf_counter() - t0
    checksum, qb = 0.0, args.query_block
    # one tile buffer, reused (as the engine does): a fresh 32 MB product per tile would
    # add page faults and zeroing to the floor
    buffer = np.empty(min(qb, len(q)) * args.gallery_chunk, dtype=np.float32)
    t1 = time.perf_counter()
    for _, g in iter_rows(files["gallery_emb"], args.gallery_chunk):
        gt = g.T
        for s in range(0, len(q), qb):
            block = q[s : s + qb]
            out = buffer[: len(block) * len(g)].reshape(len(block), len(g))
            tile = np.matmul(block, gt, out=out)
            checksum += float(tile[::61, ::67].sum())
    return {"checksum": checksum, "load_query_s": t_load, "compute_s": time.perf_counter() - t1}


def worker_argsort(files: dict, args) -> dict:
    """The usual method (torchreid / fast-reid eval_market1501): full Q x G euclidean
    distance matrix (float32), np.argsort(axis=1), then a Python loop over queries that
    drops same-pid-same-camera and junk gallery items and accumulates CMC, AP and INP."""
    import numpy as np

    times = {}
    t0 = time.perf_counter()
    q_pids, q_cams = read_manifest(files["query"])
    g_pids, g_cams = read_manifest(files["gallery"])
    q = load_all(files["query_emb"]).astype(args.argsort_dtype, copy=False)
    g = load_all(files["gallery_emb"]).astype(args.argsort_dtype, copy=False)
    times["load_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()  # squared euclidean, as torchreid's euclidean distance
    distmat = q @ g.T
    distmat *= -2.0
    distmat += (q * q).sum(1)[:, None]
    distmat += (g * g).sum(1)[None, :]
    del q, g
    times["distance_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    indices = np.argsort(distmat, axis=1)
    del distmat
    times["argsort_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    max_rank = max(KS)
    all_cmc, all_ap, all_inp, all_rr = [], [], [], []
    num_skipped = 0
    junk = set(int(x) for x in args.junk_labels.split(","))
    junk_arr = np.array(sorted(junk), np.int64)
    for q_idx in range(len(q_pids)):
        q_pid, q_cam = q_pids[q_idx], q_cams[q_idx]
        order = indices[q_idx]
        pids_o = g_pids[order]
        remove = ((pids_o == q_pid) & (g_cams[order] == q_cam)) | np.isin(pids_o, junk_arr)
        keep = np.invert(remove)
        raw_cmc = (pids_o[keep] == q_pid).astype(np.int32)
        if not np.any(raw_cmc):
            num_skipped += 1
            continue
        cmc = raw_cmc.cumsum()
        pos_idx = np.where(raw_cmc == 1)[0]
        max_pos_idx = np.max(pos_idx)
        all_inp.append(cmc[max_pos_idx] / (max_pos_idx + 1.0))
        all_rr.append(1.0 / (pos_idx[0] + 1.0))
        cmc[cmc > 1] = 1
        all_cmc.append(cmc[:max_rank])
        num_rel = raw_cmc.sum()
        if args.argsort_ap == "torchreid":  # torchreid's eval_market1501 line, verbatim
            tmp_cmc = raw_cmc.cumsum()
            tmp_cmc = [x / (i + 1.0) for i, x in enumerate(tmp_cmc)]
            tmp_cmc = np.asarray(tmp_cmc) * raw_cmc
        else:  # fast-reid's vectorised form
            tmp_cmc = raw_cmc.cumsum() / (np.arange(raw_cmc.size) + 1.0)
            tmp_cmc = tmp_cmc * raw_cmc
        all_ap.append(tmp_cmc.sum() / num_rel)
    times["loop_s"] = time.perf_counter() - t0
    cmc = np.asarray(all_cmc, np.float64).mean(0)
    metrics = {f"rank{k}": 100.0 * float(cmc[k - 1]) for k in KS}
    metrics.update(
        map=100.0 * float(np.mean(all_ap)),
        minp=100.0 * float(np.mean(all_inp)),
        mrr=100.0 * float(np.mean(all_rr)),
    )
    return {
        "metrics": metrics,
        "num_queries": len(all_ap),
        "num_skipped": num_skipped,
        "num_gallery": int((~np.isin(g_pids, junk_arr)).sum()),
        **times,
    }


def worker_main(args) -> None:
    import numpy as np
    import threadpoolctl

    files = {k: Path(v) for k, v in json.loads(args.worker_files).items()}
    fn = {"matmul": worker_matmul, "argsort": worker_argsort}[args.worker]
    out = fn(files, args)
    out["threadpools"] = threadpoolctl.threadpool_info()
    out["numpy"] = np.__version__
    Path(args.worker_out).write_text(json.dumps(out, indent=1))


# ====================================================================== driver


def rankwise_exe() -> str:
    cand = Path(sys.executable).parent / "rankwise"
    if cand.exists():
        return str(cand)
    found = shutil.which("rankwise")
    if not found:
        raise SystemExit("rankwise: command not found (activate the venv: . .venv/bin/activate)")
    return found


def problem_args(files: dict) -> list[str]:
    """The ``rankwise evaluate|rank`` arguments naming the benchmark's data and protocol."""
    return [
        "--query",
        str(files["query"]),
        "--gallery",
        str(files["gallery"]),
        "--query-embeddings",
        str(files["query_emb"]),
        "--gallery-embeddings",
        str(files["gallery_emb"]),
        "--protocol",
        "reid",
        "--distance",
        "euclidean",
    ]


def method_command(method: str, files: dict, args, run_dir: Path) -> tuple[list, Path]:
    """The command line of one method, and the JSON file it writes."""
    out = run_dir / f"{method}.out.json"
    if method in ("rankwise", "rankwise-gpu"):
        cmd = [
            rankwise_exe(),
            "evaluate",
            *problem_args(files),
            "--ks",
            ",".join(map(str, KS)),
            "--workers",
            str(args.workers),
            "--output",
            str(out),
        ]
        if method == "rankwise-gpu":
            cmd += ["--device", args.gpu_device]
        cmd += shlex.split(args.rankwise_args)
    else:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            method,
            "--worker-files",
            json.dumps({k: str(v) for k, v in files.items()}),
            "--worker-out",
            str(out),
            "--query-block",
            str(args.query_block),
            "--gallery-chunk",
            str(args.gallery_chunk),
            "--junk-labels",
            args.junk_labels,
            "--argsort-dtype",
            args.argsort_dtype,
            "--argsort-ap",
            args.argsort_ap,
            "--matmul-blas-threads",
            str(args.matmul_blas_threads),
        ]
    return cmd, out


def run_method(method: str, files: dict, args, run_dir: Path, rep: int) -> dict:
    cmd, out = method_command(method, files, args, run_dir)
    if out.exists():
        out.unlink()
    meas = run_dir / f"{method}.{rep}.rusage.json"
    log = run_dir / f"{method}.{rep}.log"
    load_before = os.getloadavg()
    subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            WRAPPER,
            json.dumps(cmd),
            str(meas),
            str(log),
            str(args.timeout),
        ],
        check=True,
    )
    res = json.loads(meas.read_text())
    res.update(
        command=shlex.join(cmd),
        log=str(log),
        loadavg_before=load_before,
        loadavg_after=os.getloadavg(),
    )
    if res["rc"] != 0:
        tail = log.read_text(errors="replace")[-2000:]
        res["status"] = f"failed (rc={res['rc']})"
        res["log_tail"] = tail
        print(f"  {method}: FAILED rc={res['rc']}; last lines of {log}:\n{tail}", flush=True)
        return res
    res["status"] = "ok"
    if out.exists():
        res["output"] = json.loads(out.read_text())
    return res


def gpu_visible() -> bool:
    """Whether ``rankwise --device cuda`` can run here (torch sees a CUDA device); asked
    in a subprocess so that this driver never imports torch."""
    probe = "from rankwise.devices import tiles_for; print(tiles_for('auto').name)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "cuda"


def argsort_need_bytes(p: dict, dtype: str = "float32") -> int:
    return p["n_query"] * p["n_gallery"] * ((4 if dtype == "float32" else 8) + 8)


def machine_info() -> dict:
    import numpy as np
    import threadpoolctl

    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "numpy": np.__version__,
        "threadpools": threadpoolctl.threadpool_info(),
        "env": {
            k: os.environ.get(k)
            for k in (
                "OPENBLAS_CORETYPE",
                "OPENBLAS_NUM_THREADS",
                "OMP_NUM_THREADS",
                "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS",
            )
        },
        "loadavg": os.getloadavg(),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu_model"] = next(
                (line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")),
                None,
            )
    except OSError:
        pass
    try:
        import psutil

        vm = psutil.virtual_memory()
        info["mem_total_gb"] = vm.total / GB
        info["mem_available_gb"] = vm.available / GB
    except ImportError:
        pass
    from importlib import metadata

    versions = {}
    for pkg in (
        "rankwise",
        "numpy",
        "dask",
        "zarr",
        "numba",
        "pandas",
        "threadpoolctl",
        "psutil",
        "click",
    ):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    info["versions"] = versions
    return info


def available_bytes() -> int:
    try:
        import psutil

        return psutil.virtual_memory().available
    except ImportError:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    return 0


def summarise(results: dict) -> dict:
    """Best-of-repeats summary per method: min wall, max peak RSS."""
    summ = {}
    for m, runs in results.items():
        if isinstance(runs, str):
            summ[m] = {"status": runs}
            continue
        ok = [r for r in runs if r["status"] == "ok"]
        if not ok:
            summ[m] = {"status": runs[-1]["status"]}
            continue
        best = min(ok, key=lambda r: r["wall_s"])
        summ[m] = {
            "status": "ok",
            "wall_s": best["wall_s"],
            "walls_s": [r["wall_s"] for r in ok],
            "cpu_s": best["user_s"] + best["sys_s"],
            "loadavg_before": best["loadavg_before"][0],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in ok),
            "output": best.get("output"),
        }
    return summ


def compare_gpu(summ: dict) -> dict | None:
    """``rankwise-gpu`` against ``rankwise``: the whole JSON report must be identical."""
    r, g = summ.get("rankwise", {}), summ.get("rankwise-gpu", {})
    if r.get("status") != "ok" or g.get("status") != "ok":
        return None
    ro, go = r.get("output") or {}, g.get("output") or {}
    differ = sorted(
        k
        for k in set(ro.get("metrics", {})) | set(go.get("metrics", {}))
        if ro.get("metrics", {}).get(k) != go.get("metrics", {}).get(k)
    )
    return {"identical": bool(ro) and ro == go, "metrics_that_differ": differ}


def compare_metrics(summ: dict) -> dict | None:
    a, r = summ.get("argsort", {}), summ.get("rankwise", {})
    if a.get("status") != "ok" or r.get("status") != "ok":
        return None
    am, rm = a["output"]["metrics"], (r["output"] or {}).get("metrics", {})
    diffs = {k: abs(am[k] - rm[k]) for k in am if k in rm}
    missing = sorted(set(am) - set(rm))
    counts = {
        k: (a["output"].get(k), r["output"].get(k))
        for k in ("num_queries", "num_skipped", "num_gallery")
    }
    main = [k for k in ("rank1", "map", "minp") if k in diffs]
    return {
        "argsort": am,
        "rankwise": rm,
        "abs_diff_pct_points": diffs,
        "max_abs_diff": max(diffs.values()) if diffs else None,
        "max_abs_diff_rank1_map_minp": max(diffs[k] for k in main) if main else None,
        "missing_in_rankwise": missing,
        "counts_argsort_vs_rankwise": counts,
        "counts_equal": all(x == y for x, y in counts.values()),
        "agree": bool(diffs)
        and not missing
        and max(diffs.values()) <= 1e-4
        and all(x == y for x, y in counts.values()),
    }


def targets(
    scale: str,
    params: dict,
    summ: dict,
    cmp: dict | None,
    baseline: Path,
    argsort_dtype: str = "float32",
) -> list:
    """The targets of the engine issue (#14) for this scale, each PASS / FAIL / n/a."""
    out = []
    mm, aw, rw = summ.get("matmul", {}), summ.get("argsort", {}), summ.get("rankwise", {})
    ok = lambda s: s.get("status") == "ok"

    def add(name, value, limit, passed, note=""):
        out.append(
            {
                "target": name,
                "value": value,
                "limit": limit,
                "result": ("PASS" if passed else "FAIL") if passed is not None else "n/a",
                "note": note,
            }
        )

    gpu = compare_gpu(summ)
    if gpu is not None:
        add(
            "rankwise-gpu report == rankwise report (exactly)",
            ", ".join(gpu["metrics_that_differ"]) or "identical",
            "identical",
            gpu["identical"],
        )
    if cmp is not None:
        dtype = argsort_dtype
        add(
            f"rankwise metrics == argsort ({dtype}) metrics (max |diff|, pct points; counts equal)",
            cmp["max_abs_diff"],
            1e-4,
            cmp["agree"],
            ""
            if cmp["agree"] or dtype == "float64"
            else "a float32 reference rounds distances itself (ties it breaks by rounding): "
            "rerun with --argsort-dtype float64 for a rounding-free one",
        )
    if scale == "msmt" and ok(rw):
        if ok(mm):
            ratio = rw["wall_s"] / mm["wall_s"]
            add(
                "msmt: rankwise wall <= 1.25 x matmul floor",
                round(ratio, 3),
                1.25,
                ratio <= 1.25,
                f"CPU-time ratio {rw['cpu_s'] / mm['cpu_s']:.2f}",
            )
        add(
            "msmt: rankwise peak RSS <= 1.5 GB",
            round(rw["peak_rss_mb"], 1),
            1.5 * 1024,
            rw["peak_rss_mb"] <= 1.5 * 1024,
            "MB, 1 GB = 1024 MB",
        )
    if scale == "market" and ok(rw) and ok(mm):
        ratio = rw["wall_s"] / mm["wall_s"]
        speed_up = f"; {aw['wall_s'] / rw['wall_s']:.2f}x faster than argsort" if ok(aw) else ""
        add(
            "market: rankwise whole process <= 1.5 x matmul floor",
            round(ratio, 3),
            1.5,
            ratio <= 1.5,
            f"CPU-time ratio {rw['cpu_s'] / mm['cpu_s']:.2f}{speed_up}",
        )
    if scale == "memory" and ok(rw):
        add(
            "memory: rankwise peak RSS < 1 GB",
            round(rw["peak_rss_mb"], 1),
            1024,
            rw["peak_rss_mb"] < 1024,
            "MB",
        )
    if scale == "large" and ok(rw):
        add(
            "large: rankwise peak RSS <= 2 GB",
            round(rw["peak_rss_mb"], 1),
            2048,
            rw["peak_rss_mb"] <= 2048,
            "MB",
        )
        base = None
        if baseline.exists():
            b = json.loads(baseline.read_text())
            bs = b.get("summary", {})
            if bs.get("rankwise", {}).get("status") == "ok":
                base = b
        if base is None:
            add(
                "large: wall <= 1.2 x linear extrapolation from msmt",
                None,
                1.2,
                None,
                f"no msmt result with rankwise at {baseline}; run --scale msmt first",
            )
        else:
            bp, bs = base["params"], base["summary"]
            qg = (params["n_query"] * params["n_gallery"]) / (bp["n_query"] * bp["n_gallery"])
            qgd = qg * params["dim"] / bp["dim"]
            rb = bs["rankwise"]["wall_s"]
            mb = (
                bs.get("matmul", {}).get("wall_s")
                if bs.get("matmul", {}).get("status") == "ok"
                else None
            )
            if mb is not None:  # matmul part scales with QGD, the rest with QG
                pred = min(mb, rb) * qgd + max(rb - mb, 0.0) * qg
                how = (
                    f"msmt matmul {mb:.1f}s x QGD ratio {qgd:.2f} + msmt (rankwise - matmul) "
                    f"{max(rb - mb, 0):.1f}s x QG ratio {qg:.2f}"
                )
            else:
                pred, how = rb * qg, f"msmt rankwise {rb:.1f}s x QG ratio {qg:.2f}"
            r = rw["wall_s"] / pred
            add(
                "large: wall <= 1.2 x linear extrapolation from msmt",
                round(r, 3),
                1.2,
                r <= 1.2,
                f"predicted {pred:.1f}s = {how}; also: x QG only -> "
                f"{rb * qg:.1f}s, x QGD only -> {rb * qgd:.1f}s",
            )
    return out


def table(scale: str, params: dict, summ: dict) -> str:
    mm = summ.get("matmul", {})
    mw = mm.get("wall_s") if mm.get("status") == "ok" else None
    mc = mm.get("cpu_s") if mm.get("status") == "ok" else None
    aw = summ.get("argsort", {})
    aws = aw.get("wall_s") if aw.get("status") == "ok" else None
    lines = [
        f"scale `{scale}`: {params['n_query']:,} queries x {params['n_gallery']:,} gallery"
        f" x {params['dim']} dims",
        "",
        "| method | wall s | CPU s | peak RSS MB | wall / matmul | CPU / matmul "
        "| speed-up vs argsort (wall) | load avg before |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in ALL_METHODS:
        s = summ.get(m)
        if s is None:
            continue
        if s.get("status") != "ok":
            lines.append(f"| {m} | {s['status']} | | | | | | |")
            continue
        ratio = f"{s['wall_s'] / mw:.2f}" if mw else ""
        cratio = f"{s['cpu_s'] / mc:.2f}" if mc else ""
        sp = f"{aws / s['wall_s']:.2f}x" if aws and m.startswith("rankwise") else ""
        lines.append(
            f"| {m} | {s['wall_s']:.2f} | {s['cpu_s']:.2f} | {s['peak_rss_mb']:.0f} "
            f"| {ratio} | {cratio} | {sp} | {s['loadavg_before']:.1f} |"
        )
    return "\n".join(lines)


def print_report(report: dict) -> None:
    summ, cmp, tg = report["summary"], report["metrics_comparison"], report["targets"]
    info = report["machine"]
    print()
    print(report["table_markdown"])
    if cmp is not None:
        print()
        print("metrics (percent)      argsort     rankwise    |diff|")
        for k, d in cmp["abs_diff_pct_points"].items():
            print(f"  {k:<18} {cmp['argsort'][k]:>11.6f} {cmp['rankwise'][k]:>11.6f}  {d:.2e}")
        if cmp["missing_in_rankwise"]:
            print(f"  missing in rankwise output: {cmp['missing_in_rankwise']}")
        print(
            f"  max abs diff: {cmp['max_abs_diff']:.3e} pct points "
            f"(rank1/map/minp: {cmp['max_abs_diff_rank1_map_minp']:.3e}); counts "
            f"argsort vs rankwise: {cmp['counts_argsort_vs_rankwise']}"
        )
    elif summ.get("rankwise", {}).get("status") == "ok":
        rm = summ["rankwise"]["output"] or {}
        print(
            f"\nrankwise metrics: {rm.get('metrics')} (num_queries={rm.get('num_queries')}, "
            f"num_skipped={rm.get('num_skipped')})"
        )
    if tg:
        print()
        for t in tg:
            print(
                f"  [{t['result']}] {t['target']}: {t['value']} (limit {t['limit']}"
                f"{'; ' + t['note'] if t['note'] else ''})"
            )
    print(
        f"\nnote: {info['cpu_count']} CPUs, load avg {tuple(round(x, 2) for x in info['loadavg'])}"
        f" at start, {tuple(round(x, 2) for x in report.get('loadavg_end', ()))} at end; "
        "on a shared machine wall times are noisy (CPU s is steadier)."
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--scale",
        default="tiny",
        help=f"scale(s), comma-separated, of {', '.join(sorted(SCALES))}: each is run on "
        "every --distribution and shown side by side, every scale's table again at the end "
        "(market,msmt: the engine issue's one run)",
    )
    ap.add_argument(
        "--distribution",
        default="default",
        help="data distribution(s), comma-separated: default, hard (deep relevant items), "
        "easy (a strong model), or all; each is run and written "
        "(<scale>-<distribution>.json), then shown side by side",
    )
    ap.add_argument(
        "--methods",
        default=",".join(ALL_METHODS),
        help="comma list of matmul,argsort,rankwise,rankwise-gpu (default: all; "
        "rankwise-gpu: --device cuda, 'no GPU' where torch sees none)",
    )
    ap.add_argument("--workers", type=int, default=2, help="rankwise --workers (default 2)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default benchmarks/results/<scale>.json)",
    )
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=RESULTS / "data",
        help="synthetic data cache (default benchmarks/results/data)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per method; the table shows the fastest (default 1)",
    )
    ap.add_argument("--timeout", type=float, default=0, help="seconds per method run (0: none)")
    ap.add_argument("--query-block", type=int, default=1024, help="matmul floor query tile")
    ap.add_argument("--gallery-chunk", type=int, default=8192, help="matmul floor gallery tile")
    ap.add_argument(
        "--matmul-blas-threads",
        type=int,
        default=0,
        help="BLAS threads of the matmul floor (0: the library default)",
    )
    ap.add_argument(
        "--gpu-device",
        choices=("cuda", "torch-cpu"),
        default="cuda",
        help="rankwise-gpu's --device: cuda, or torch-cpu to run the same code path on the "
        "CPU where there is no GPU (a check of the column, not a GPU timing)",
    )
    ap.add_argument("--junk-labels", default="-1")
    ap.add_argument(
        "--rankwise-args",
        default="",
        help="extra arguments for `rankwise evaluate`, e.g. '--gallery-chunk 16384'",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=RESULTS / "msmt.json",
        help="msmt result JSON used to extrapolate the large scale",
    )
    ap.add_argument(
        "--gallery-format",
        choices=("npy", "zarr"),
        default=None,
        help="override the scale's gallery format (large: zarr, others: npy)",
    )
    ap.add_argument(
        "--report-only",
        type=Path,
        default=None,
        metavar="JSON",
        help="re-render table/targets of an earlier result JSON (rewrites it)",
    )
    ap.add_argument("--generate-only", action="store_true", help="only build the data cache")
    ap.add_argument(
        "--argsort-dtype",
        choices=("float32", "float64"),
        default="float32",
        help="distance dtype of the argsort method (float64: a rounding-free "
        "reference, 2x the memory)",
    )
    ap.add_argument(
        "--argsort-ap",
        choices=("vectorised", "torchreid"),
        default="vectorised",
        help="the argsort method's AP line: fast-reid's vectorised form (default) "
        "or torchreid's per-element Python list comprehension, verbatim",
    )
    ap.add_argument(
        "--force-argsort",
        action="store_true",
        help="run argsort even when it would not fit in 70%% of available RAM",
    )
    # internal: one method's worker process
    ap.add_argument("--worker", choices=("matmul", "argsort"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-files", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.command_line = (
        shlex.join(["python", os.path.relpath(sys.argv[0])] + sys.argv[1:])
        if argv is None
        else shlex.join(argv)
    )

    if args.worker:
        worker_main(args)
        return 0
    if args.report_only:
        report = json.loads(args.report_only.read_text())
        summ = summarise(report["runs"])
        cmp = compare_metrics(summ)
        report.update(
            summary=summ,
            metrics_comparison=cmp,
            targets=targets(
                report["scale"],
                report["params"],
                summ,
                cmp,
                args.baseline,
                report.get("argsort_dtype", "float32"),
            ),
            table_markdown=table(report["scale"], report["params"], summ),
        )
        args.report_only.write_text(json.dumps(report, indent=1, default=str))
        print_report(report)
        return 0

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = sorted(set(methods) - set(ALL_METHODS))
    if bad:
        ap.error(f"unknown methods {bad}; choose from {ALL_METHODS}")
    spec = "default,hard,easy" if args.distribution == "all" else args.distribution
    distributions = [d.strip() for d in spec.split(",") if d.strip()]
    bad = sorted(set(distributions) - set(DISTRIBUTIONS))
    if bad or not distributions:
        ap.error(f"unknown distributions {bad}; choose from {tuple(DISTRIBUTIONS)}")
    scales = [x.strip() for x in args.scale.split(",") if x.strip()]
    bad = sorted(set(scales) - set(SCALES))
    if bad or not scales:
        ap.error(f"unknown scales {bad}; choose from {tuple(sorted(SCALES))}")
    tables = []
    for scale in scales:
        one = argparse.Namespace(**vars(args))
        one.scale = scale
        if args.out and len(scales) > 1:  # one file per scale (and distribution)
            one.out = args.out.with_name(f"{args.out.stem}-{scale}{args.out.suffix}")
        reports = [run_distribution(one, methods, d) for d in distributions]
        if args.generate_only:
            continue
        tables.append(side_by_side(scale, reports))
        if len(reports) > 1:
            print()
            print(tables[-1])
    if len(tables) > 1:  # every scale of this run together
        print()
        print("\n\n".join(tables))
    return 0


def run_distribution(args, methods: list[str], distribution: str) -> dict:
    """Every method on one data distribution; writes and prints its report."""
    folder, params = ensure_data(args.scale, args.data_dir, args.gallery_format, distribution)
    files = data_files(folder)
    if args.generate_only:
        print(folder)
        return {}
    name = args.scale if distribution == "default" else f"{args.scale}-{distribution}"
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = RESULTS / "runs" / f"{name}-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out_path = (
        args.out.with_name(f"{args.out.stem}-{distribution}{args.out.suffix}")
        if args.out and distribution != "default"
        else args.out or RESULTS / f"{name}.json"
    )
    info = machine_info()
    print(
        f"[bench] scale={args.scale} distribution={distribution} Q={params['n_query']} "
        f"G={params['n_gallery']} D={params['dim']} methods={methods} "
        f"workers={args.workers}; cpus={info['cpu_count']} loadavg={info['loadavg']} "
        f"OPENBLAS_CORETYPE={info['env']['OPENBLAS_CORETYPE']}",
        flush=True,
    )
    results: dict = {}
    for m in methods:
        if m == "rankwise-gpu" and args.gpu_device == "cuda" and not gpu_visible():
            results[m] = "no GPU"
            print(f"  {m}: no GPU (torch sees no CUDA device, or is not installed)", flush=True)
            continue
        if m == "argsort" and not args.force_argsort:
            need, avail = argsort_need_bytes(params, args.argsort_dtype), available_bytes()
            if need > 0.7 * avail:
                results[m] = (
                    f"skipped: needs ~{need / GB:.1f} GB (Q x G {args.argsort_dtype} "
                    f"distances + int64 argsort), > 70% of available "
                    f"{avail / GB:.1f} GB"
                )
                print(f"  {m}: {results[m]}", flush=True)
                continue
        results[m] = []
    # repeats are interleaved (m1 m2 m3 m1 m2 m3 ...) so load changes hit all methods
    for rep in range(args.repeat):
        for m in methods:
            runs = results[m]
            if isinstance(runs, str) or (runs and runs[-1]["status"] != "ok"):
                continue
            print(f"  {m} (run {rep + 1}/{args.repeat}) ...", flush=True)
            r = run_method(m, files, args, run_dir, rep)
            runs.append(r)
            if r["status"] == "ok":
                print(
                    f"  {m}: {r['wall_s']:.2f} s wall, {r['user_s'] + r['sys_s']:.2f} s CPU, "
                    f"peak RSS {r['peak_rss_mb']:.0f} MB, load avg before "
                    f"{r['loadavg_before'][0]:.1f}",
                    flush=True,
                )

    summ = summarise(results)
    cmp = compare_metrics(summ)
    tg = targets(args.scale, params, summ, cmp, args.baseline, args.argsort_dtype)
    tab = table(args.scale, params, summ)
    report = {
        "scale": args.scale,
        "distribution": distribution,
        "params": params,
        "data_dir": str(folder),
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": args.command_line,
        "workers": args.workers,
        "repeat": args.repeat,
        "methods": methods,
        "argsort_dtype": args.argsort_dtype,
        "machine": info,
        "runs": results,
        "summary": summ,
        "metrics_comparison": cmp,
        "targets": tg,
        "table_markdown": tab,
        "run_dir": str(run_dir),
    }
    report["loadavg_end"] = os.getloadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"wrote {out_path}")
    return report


def side_by_side(scale: str, reports: list[dict]) -> str:
    """One row per distribution: its metrics and each method's wall time, the ratios to
    the matmul floor and to full argsort, and peak RSS."""
    lines = [
        f"scale `{scale}`, one run: floor / rankwise / full argsort per data distribution",
        "",
        "| distribution | rank-1 | mAP | mINP | floor s | rankwise s | rankwise / floor "
        "| argsort s | argsort / rankwise | rankwise peak RSS MB | rankwise-gpu s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rep in reports:
        summ = rep["summary"]
        wall = {m: summ[m]["wall_s"] for m in summ if summ[m].get("status") == "ok"}
        rw = summ.get("rankwise", {})
        metrics = ((rw.get("output") or {}).get("metrics") or {}) if rw else {}
        cell = lambda v, f="{:.2f}": f.format(v) if v is not None else "-"
        floor, ours, arg = wall.get("matmul"), wall.get("rankwise"), wall.get("argsort")
        gpu = summ.get("rankwise-gpu", {})
        gpu_cell = cell(gpu.get("wall_s")) if gpu.get("status") == "ok" else gpu.get("status", "-")
        lines.append(
            f"| {rep['distribution']} | {cell(metrics.get('rank1'), '{:.1f}')} "
            f"| {cell(metrics.get('map'), '{:.1f}')} | {cell(metrics.get('minp'), '{:.1f}')} "
            f"| {cell(floor)} | {cell(ours)} "
            f"| {cell(ours / floor if ours and floor else None)}x "
            f"| {cell(arg)} | {cell(arg / ours if arg and ours else None)}x "
            f"| {cell(rw.get('peak_rss_mb'), '{:.0f}')} | {gpu_cell} |"
        )
    shown = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    verdicts = [
        f"- {rep['distribution']}: [{t['result']}] {t['target']}: {shown(t['value'])} "
        f"(limit {shown(t['limit'])})"
        for rep in reports
        for t in rep.get("targets", [])
    ]
    if verdicts:  # a target is met only when it holds on every distribution, run after run
        lines += ["", "targets per distribution (met: PASS on every one, on repeated quiet runs):"]
        lines += verdicts
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
