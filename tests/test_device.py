"""The engine's device option: the torch path gives the numpy path's numbers, exactly.

Where there is no GPU, ``device="torch-cpu"`` runs the ``cuda`` code path (torch.matmul
on device-resident rows, similarities copied back, the same counting kernel) on torch's
CPU device, whose BLAS rounds differently from numpy's; where torch sees a GPU, the
comparisons also run with ``device="cuda"``. A backend that pushes every
similarity by almost the whole error bound shows that any float32 matmul within the
bound (any summation order, FMA or not) gives the same numbers, and a control pushed
beyond the bound shows the near-tie data notices.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import (
    float32_settings,
    ieee_float32_settings,
    planned_jobs,
    run_rankwise,
    snakemake,
)

import rankwise
from rankwise import RankwiseError, devices, kernels
from rankwise import pipeline_config as pc
from rankwise.ranking import EngineOptions

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()

PROTOCOLS = ["recall", "reid", "reassociation", "progressive"]
#: The torch devices compared with cpu: torch's CPU device always, a GPU where there is one.
TORCH_DEVICES = ["torch-cpu"] + (["cuda"] if HAS_CUDA else [])


def _rank_both(case, device, **kw):
    """The ranks store's arrays and attrs, and the metrics, of one run."""
    options = case.kwargs(device=device, **kw)
    ks = options.pop("ks", (1, 5, 10))
    result = rankwise.rank(*case.args(), **options)
    metrics = rankwise.api.result_from_ranks(result, ks=ks)
    return result, metrics


def _assert_identical(a, b):
    ra, ma = a
    rb, mb = b
    arrays_a, arrays_b = ra.arrays(), rb.arrays()
    assert set(arrays_a) == set(arrays_b)
    for name in arrays_a:
        assert np.array_equal(arrays_a[name], arrays_b[name]), name
        assert arrays_a[name].dtype == arrays_b[name].dtype, name
    assert ra.attrs == rb.attrs
    assert ma.to_json() == mb.to_json()
    for key, values in ma.per_query.items():
        if not isinstance(values, dict):
            assert np.array_equal(np.asarray(values), np.asarray(mb.per_query[key])), key


def _case(make_case, protocol, distance):
    # "float": continuous data, whose similarities numpy's and torch's BLAS round
    # differently (the "int"/"sign" families are exact in float32 everywhere)
    options = {"ks": (1, 2, 5)} if protocol != "reassociation" else {}
    case = make_case(protocol, distance, "float", 3)
    case.options = {**case.options, **options}
    return case


# ---------------------------------------------------------------- same numbers


@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
@pytest.mark.parametrize("query_block,gallery_chunk,workers", [(5, 7, 1), (5, 7, 2), (64, 8192, 2)])
def test_torch_equals_cpu(
    make_case, device, protocol, distance, query_block, gallery_chunk, workers
):
    case = _case(make_case, protocol, distance)
    kw = dict(query_block=query_block, gallery_chunk=gallery_chunk, workers=workers)
    cpu = _rank_both(case, "cpu", **kw)
    assert cpu[1].num_queries > 0
    _assert_identical(_rank_both(case, device, **kw), cpu)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_reid_keeping_same_camera_and_junk_equals_cpu(make_case, distance):
    case = _case(make_case, "reid", distance)
    for kw in ({"exclude_same_camera": False}, {"junk_labels": ("-1", "0")}):
        _assert_identical(
            _rank_both(case, "torch-cpu", gallery_chunk=9, **kw),
            _rank_both(case, "cpu", gallery_chunk=9, **kw),
        )


@pytest.mark.parametrize("extra", [{"aqe": "3,3"}, {"rerank": "6,3,0.3"}])
def test_query_expansion_and_reranking_run_on_the_cpu_whatever_the_device(make_case, extra):
    # AQE's expansion and re-ranking use their own CPU code; the count pass after AQE
    # runs on the device.  Either way: the cpu numbers.
    case = _case(make_case, "reid", "cosine")
    _assert_identical(
        _rank_both(case, "torch-cpu", gallery_chunk=11, **extra),
        _rank_both(case, "cpu", gallery_chunk=11, **extra),
    )


def test_the_torch_path_really_rounds_differently():
    # What makes the equalities above worth having: torch's BLAS and numpy's round the
    # same float32 products differently (on this machine most of a 512-d tile differs).
    rng = np.random.default_rng(0)
    q = rng.standard_normal((64, 512)).astype(np.float32)
    g = rng.standard_normal((256, 512)).astype(np.float32)
    tiles = devices.tiles_for("torch-cpu")
    with tiles.exact_float32():
        via_torch = tiles.similarities(tiles.upload(q), tiles.upload(g))
    via_numpy = devices.tiles_for("cpu").similarities(q, g)
    assert via_torch.dtype == via_numpy.dtype == np.float32
    assert via_torch.shape == via_numpy.shape == (64, 256)
    bound = kernels.error_bound_factor(512) * np.outer(
        np.linalg.norm(q, axis=1), np.linalg.norm(g, axis=1)
    )
    assert np.all(np.abs(via_torch.astype(np.float64) - via_numpy) <= bound)
    if np.array_equal(via_torch, via_numpy):
        pytest.skip("torch and numpy use the same BLAS kernel here: the paths agree trivially")


# ---------------------------------------------------------------- near ties


def _near_tie_case(distance: str, seed: int = 0, dim: int = 64):
    """20 anchors; per anchor a query near it, the anchor itself (relevant), 8 "twins"
    (the anchor with 1-3 entries moved by 1-2 float32 ulps) of other labels, 2 exact
    duplicates of other labels and one twin of the same label.  The query's distances
    to all of them agree to ~1e-7: far inside the float32 error bound, so only the
    exact float64 key can order them."""
    rng = np.random.default_rng(seed)
    n = 20
    base = rng.standard_normal((n, dim)).astype(np.float32)
    g_emb, g_rows = [], []

    def add(emb, label):
        g_rows.append({"id": f"g{len(g_rows)}", "label": str(label), "camera": len(g_rows) % 3})
        g_emb.append(emb)

    for a in range(n):
        add(base[a], a)
        for t in range(11):
            twin = base[a].copy()
            if t < 9 or t == 10:  # twins; t == 9: an exact duplicate; t == 10: same label
                for k in rng.choice(dim, rng.integers(1, 4), replace=False):
                    for _ in range(rng.integers(1, 3)):
                        twin[k] = np.nextafter(twin[k], np.float32(rng.choice([-np.inf, np.inf])))
            label = a if t == 10 else (a + 1 + t) % n
            add(twin, -1 if t == 8 else label)  # one junk twin (reid)
        add(base[a].copy(), (a + 7) % n)  # an exact duplicate of another label
    q_emb = base + np.float32(0.05) * rng.standard_normal(base.shape).astype(np.float32)
    query = pd.DataFrame(
        {"id": [f"q{i}" for i in range(n)], "label": [str(i) for i in range(n)], "camera": 5}
    )
    gallery = pd.DataFrame(g_rows)
    perm = rng.permutation(len(gallery))  # twins not next to their anchor
    return (
        query,
        gallery.iloc[perm].reset_index(drop=True),
        q_emb.astype(np.float32),
        np.asarray(g_emb, np.float32)[perm],
    )


def _canonical_ranks(query, gallery, qe, ge, cosine):
    """Brute force (recall protocol, ids all distinct): DESIGN.md's rank rule on the
    canonical float64 keys of every pair, per query, sorted."""
    qr = kernels.prepare_rows(qe, cosine)[0]
    gr = kernels.prepare_rows(ge, cosine)[0]
    keys = kernels.tile_keys(qr, gr, cosine)
    glab = gallery["label"].to_numpy()
    out = []
    for i, lab in enumerate(query["label"]):
        rel = glab == lab
        row = keys[i]
        ranks = []
        for j in np.flatnonzero(rel):
            ahead_rel = (row[rel] < row[j]) | ((row[rel] == row[j]) & (np.flatnonzero(rel) < j))
            ranks.append(1 + int(np.sum(~rel & (row <= row[j]))) + int(np.sum(ahead_rel)))
        out.append(sorted(ranks))
    return out, keys


def _near_pairs(gallery, query, keys, qe, ge, cosine) -> int:
    """Non-relevant (query, item) pairs whose key lies within the error bound of one of
    the query's relevant keys: each sends the kernel to the float64 fallback."""
    bound = kernels.error_bound_factor(qe.shape[1])
    qn = np.sqrt(kernels.prepare_rows(qe, cosine)[1])
    gn = np.sqrt(kernels.prepare_rows(ge, cosine)[1])
    glab = gallery["label"].to_numpy()
    count = 0
    for i, lab in enumerate(query["label"]):
        rel = glab == lab
        eps = bound * qn[i] * gn if cosine else bound * (qn[i] + gn) ** 2
        gaps = np.abs(keys[i][~rel][:, None] - keys[i][rel][None, :])
        count += int(np.sum((gaps < eps[~rel][:, None]).any(axis=1)))
    return count


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_near_ties_are_decided_exactly_on_both_paths(distance):
    query, gallery, qe, ge = _near_tie_case(distance)
    cosine = distance == "cosine"
    expected, keys = _canonical_ranks(query, gallery, qe, ge, cosine)
    assert _near_pairs(gallery, query, keys, qe, ge, cosine) >= 150  # the fallback runs
    runs = {}
    for device in ("cpu", *TORCH_DEVICES):
        for qb, gc, w in [(3, 17, 1), (7, 64, 2), (1024, 8192, 2)]:
            result = rankwise.rank(
                query,
                gallery,
                qe,
                ge,
                distance=distance,
                device=device,
                query_block=qb,
                gallery_chunk=gc,
                workers=w,
            )
            got = [
                result.ranks[result.offsets[i] : result.offsets[i + 1]].tolist()
                for i in range(len(result.query_index))
            ]
            assert got == [expected[q] for q in result.query_index], (device, qb, gc, w)
            runs[(device, qb, gc, w)] = result
    first = next(iter(runs.values()))
    for result in runs.values():
        for name, array in first.arrays().items():
            assert np.array_equal(result.arrays()[name], array), name


@pytest.mark.parametrize("device", TORCH_DEVICES)
@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_reid_near_ties_torch_equals_cpu(device, distance):
    query, gallery, qe, ge = _near_tie_case(distance, seed=1)
    kw = dict(protocol="reid", distance=distance, query_block=6, gallery_chunk=50)
    a = rankwise.rank(query, gallery, qe, ge, device="cpu", workers=2, **kw)
    b = rankwise.rank(query, gallery, qe, ge, device=device, workers=2, **kw)
    for name, array in a.arrays().items():
        assert np.array_equal(b.arrays()[name], array), name


class _Pushed(devices.NumpyTiles):
    """A float32 matmul whose every value is off by ``scale * D * u * |q| |g|`` (signs
    seeded per tile): ``scale`` < 1 is a matmul within the bound the engine assumes
    (``error_bound_factor`` = 2 (D + 2) u), whatever summation order made it."""

    host = False  # its products, not the C kernels' fused ones, are the ones counted

    def __init__(self, scale: float):
        self.scale = scale

    def similarities(self, q, g):
        exact = (q.astype(np.float64) @ g.astype(np.float64).T).astype(np.float32)
        rng = np.random.default_rng(q.shape[0] * 7919 + g.shape[0])
        norms = np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(g, axis=1)[None, :]
        push = self.scale * q.shape[1] * 2.0**-24 * norms
        return (exact + rng.choice([-1.0, 1.0], exact.shape) * push).astype(np.float32)


@pytest.mark.parametrize("distance", ["cosine", "euclidean"])
def test_any_matmul_within_the_bound_gives_the_same_numbers(monkeypatch, distance):
    query, gallery, qe, ge = _near_tie_case(distance, seed=2)
    expected, _ = _canonical_ranks(query, gallery, qe, ge, distance == "cosine")

    def run(scale):
        monkeypatch.setattr(devices, "tiles_for", lambda device, label="device": _Pushed(scale))
        result = rankwise.rank(
            query, gallery, qe, ge, distance=distance, query_block=5, gallery_chunk=40, workers=1
        )
        return [
            result.ranks[result.offsets[i] : result.offsets[i + 1]].tolist()
            for i in range(len(result.query_index))
        ]

    assert run(0.9) == expected
    # Control: pushed 300 times beyond the bound, the near ties come out wrong.
    assert run(600.0) != expected


# ---------------------------------------------------------------- the option itself


def test_torch_is_never_imported_on_the_cpu_path(tmp_path):
    code = (
        "import sys, numpy as np, pandas as pd, rankwise\n"
        "q = pd.DataFrame({'id': ['q'], 'label': ['a']})\n"
        "g = pd.DataFrame({'id': ['g0', 'g1'], 'label': ['a', 'b']})\n"
        "e = np.eye(2, dtype=np.float32)\n"
        "r = rankwise.evaluate(q, g, e[:1], e, device='cpu')\n"
        "assert r.metrics['recall@1'] == 100.0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is visible")
@pytest.mark.parametrize("visible", [None, "", "-1"])
def test_auto_on_a_machine_without_gpu_does_not_import_torch(visible):
    # here: no /dev/nvidia* device node (or no visible device): no 2 s torch import
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    elif sys.platform.startswith("linux") and (
        glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg")
    ):
        pytest.skip("NVIDIA device nodes exist: auto must ask torch")
    code = (
        "import sys\n"
        "from rankwise.devices import tiles_for\n"
        "print(tiles_for('auto').name, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["cpu", "False"]


def _files(tmp_path):
    (tmp_path / "q.csv").write_text("id,label\nq0,a\n")
    (tmp_path / "g.csv").write_text("id,label\ng0,a\ng1,b\n")
    np.save(tmp_path / "q.npy", np.eye(2, dtype=np.float32)[:1])
    np.save(tmp_path / "g.npy", np.eye(2, dtype=np.float32))
    return [tmp_path / f for f in ("q.csv", "g.csv", "q.npy", "g.npy")]


VALUES = "one of cpu, cuda, auto, torch-cpu"


@pytest.mark.parametrize("value", ["gpu", "CUDA", "cuda:0", 1])
def test_bad_device_names_the_parameter(tmp_path, value):
    with pytest.raises(RankwiseError, match=rf"^device must be {VALUES}, got {value!r}$"):
        rankwise.evaluate(*_files(tmp_path), device=value)
    with pytest.raises(RankwiseError, match=rf"^device must be {VALUES}"):
        EngineOptions(device=value)


@pytest.mark.parametrize("command", ["evaluate", "rank"])
def test_bad_device_on_the_command_line_is_one_line_exit_2(tmp_path, command):
    q, g, qe, ge = _files(tmp_path)
    args = ["--query", q, "--gallery", g, "--query-embeddings", qe, "--gallery-embeddings", ge]
    if command == "rank":
        args += ["--out", tmp_path / "r.zarr"]
    proc = run_rankwise(command, *args, "--device", "gpu")
    assert proc.returncode == 2
    assert proc.stderr == f"error: --device must be {VALUES}, got 'gpu'\n"
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is visible")
def test_cuda_without_a_gpu_is_one_clear_line(tmp_path):
    files = _files(tmp_path)
    with pytest.raises(RankwiseError, match=r"^device cuda: torch \S+ .*; use device cpu or auto"):
        rankwise.evaluate(*files, device="cuda")
    args = [str(f) for f in files]
    proc = run_rankwise(
        "rank",
        *["--query", args[0], "--gallery", args[1]],
        *["--query-embeddings", args[2], "--gallery-embeddings", args[3]],
        *["--device", "cuda", "--out", tmp_path / "r.zarr"],
    )
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda: torch "), proc.stderr
    assert "use --device cpu or auto" in lines[0]
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is visible")
def test_auto_without_a_gpu_is_the_numpy_path(tmp_path):
    assert devices.tiles_for("auto").name == "cpu"
    assert rankwise.evaluate(*_files(tmp_path), device="auto").metrics["recall@1"] == 100.0


def test_cuda_without_torch_says_how_to_install_it(tmp_path):
    # torch made unimportable in a fresh interpreter (sys.modules entry None)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from rankwise.devices import tiles_for\n"
        "print(tiles_for('auto').name)\n"
        "try:\n    tiles_for('cuda', '--device')\n"
        "except Exception as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "cpu" if not HAS_CUDA else out.stdout.splitlines()[0],
        "--device cuda needs torch (pip install 'rankwise[torch]'); use --device cpu",
    ]


def test_memory_limit_counts_torch_on_a_torch_device(tmp_path):
    from rankwise.ranking import estimate_memory_mb

    # 1 query x 2 gallery x 2 dims: the estimate is the interpreter's size (+ torch's)
    cpu = estimate_memory_mb(1, 2, 2, 1, EngineOptions(), 1)
    torch_cpu = estimate_memory_mb(1, 2, 2, 1, EngineOptions(device="torch-cpu"), 1)
    # torch's share: its import measured 470-510 MB resident; with 500 a torch-cpu run
    # peaked 30-50 MB above the estimate, so 650
    assert torch_cpu - cpu == pytest.approx(650.0)
    limit = cpu + 100.0
    assert rankwise.evaluate(*_files(tmp_path), memory_limit_mb=limit, workers=1).num_queries == 1
    with pytest.raises(RankwiseError, match=r"^memory limit \S+ MB cannot be met"):
        rankwise.evaluate(*_files(tmp_path), memory_limit_mb=limit, workers=1, device="torch-cpu")


def test_tf32_is_off_while_ranking_and_restored_after(tf32_on):
    assert tf32_on != ieee_float32_settings(torch)
    tiles = devices.tiles_for("torch-cpu")
    with tiles.exact_float32():
        assert float32_settings(torch) == ieee_float32_settings(torch)
    assert float32_settings(torch) == tf32_on
    # the legacy getters a training script reads still answer (torch >= 2.9 raises on a
    # mix of its two APIs: only the one it has was written, and put back)
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.get_float32_matmul_precision() == "high"
    # a cluster's worker never entered exact_float32: each tile switches TF32 off
    q = tiles.upload(np.eye(3, dtype=np.float32))
    assert np.array_equal(tiles.similarities(q, q), np.eye(3, dtype=np.float32))
    assert float32_settings(torch) == ieee_float32_settings(torch)


def _torch_before_2_9():
    """torch < 2.9's float32 settings as its ATen Context keeps them: cuBLAS's
    ``allow_tf32`` is no flag of its own but ``float32_matmul_precision != "highest"``,
    and writing it sets that precision to ``"high"`` or ``"highest"``; no ``fp32_precision``."""
    state = {"precision": "highest"}

    class Matmul:
        @property
        def allow_tf32(self):
            return state["precision"] != "highest"

        @allow_tf32.setter
        def allow_tf32(self, on):
            state["precision"] = "high" if on else "highest"

    def set_precision(precision):
        state["precision"] = precision

    backends = SimpleNamespace(
        cuda=SimpleNamespace(matmul=Matmul()), cudnn=SimpleNamespace(allow_tf32=True)
    )
    return SimpleNamespace(
        backends=backends,
        get_float32_matmul_precision=lambda: state["precision"],
        set_float32_matmul_precision=set_precision,
    )


@pytest.mark.parametrize("precision", ["highest", "high", "medium"])
def test_torch_before_2_9_gets_its_own_matmul_precision_back(precision):
    """A caller's "medium" (oneDNN bf16 matmuls) came back as "high": the cuBLAS flag,
    restored after the precision, wrote "high" over it."""
    fake = _torch_before_2_9()
    fake.set_float32_matmul_precision(precision)
    with devices.ieee_float32(fake):
        assert fake.get_float32_matmul_precision() == "highest"
        assert fake.backends.cuda.matmul.allow_tf32 is False
        assert fake.backends.cudnn.allow_tf32 is False
    assert fake.get_float32_matmul_precision() == precision
    assert fake.backends.cudnn.allow_tf32 is True


@pytest.mark.parametrize("device", TORCH_DEVICES)
def test_ranking_with_tf32_on_gives_the_numpy_numbers(tf32_on, make_case, device):
    # on a GPU: without the switch, cuBLAS would multiply in TF32 and the error bound,
    # which assumes float32 products, would not hold
    case = _case(make_case, "reid", "cosine")
    _assert_identical(_rank_both(case, device, gallery_chunk=7), _rank_both(case, "cpu"))
    assert float32_settings(torch) == tf32_on


def test_the_cublas_context_warning_of_worker_threads_is_hidden(monkeypatch):
    """torch warns once per process when cuBLAS first runs in a thread without a current
    CUDA context (each engine worker thread; seen on an H200, two lines on the terminal
    of every --device cuda run). Benign: torch makes the primary context current itself.
    That message is hidden, no other."""
    monkeypatch.setattr(devices, "_CUBLAS_WARNING_QUIET", False)
    torchs = (
        "Attempting to run cuBLAS, but there was no current CUDA context! Attempting to "
        "set the primary context... (Triggered internally at "
        "/pytorch/aten/src/ATen/cuda/CublasHandlePool.cpp:335.)"
    )
    other = "Attempting to run cuBLAS with a tensor of another device"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        devices._quiet_cublas_context_warning()
        warnings.warn(torchs, UserWarning, stacklevel=1)
        warnings.warn(other, UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [other]


def test_on_a_cluster_torch_cpu_equals_cpu(make_case):
    # dask.distributed: device rows are not shared between tasks (copied per tile), and
    # the backend travels to the worker processes
    distributed = pytest.importorskip("distributed")
    case = _case(make_case, "reid", "euclidean")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=40,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_cluster = _rank_both(case, "torch-cpu", scheduler=client, gallery_chunk=9)
    _assert_identical(on_cluster, _rank_both(case, "cpu", gallery_chunk=9, workers=1))


# ---------------------------------------------------------------- the pipeline


def test_schema_takes_engine_device():
    schema = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
    config = {"datasets": {}, "encoders": {}, "engine": {"device": "torch-cpu"}}
    pc.check_config(config, schema)
    assert config["engine"]["device"] == "torch-cpu"
    with pytest.raises(RankwiseError, match=r"^config: engine.device: 'gpu' is not allowed"):
        pc.check_config({"datasets": {}, "encoders": {}, "engine": {"device": "gpu"}}, schema)


def _pipeline_config(device: str | None) -> dict:
    return {
        "datasets": {
            "market": {
                "loader": "demo-market",
                "options": {"seed": 0, "identities": 4, "height": 16, "width": 8},
                "protocol": "reid",
            }
        },
        "encoders": {"pixels": {"kind": "pixels", "options": {"size": [16, 8]}}},
        "engine": {"threads": 1} | ({"device": device} if device else {}),
        "report": {"resamples": 0, "worst_queries": 0},
    }


@pytest.mark.parametrize("device", ["torch-cpu", None])
def test_engine_device_reaches_the_rank_command(tmp_path, device):
    proc = snakemake(tmp_path, _pipeline_config(device), "--dry-run", "--printshellcmds")
    assert proc.returncode == 0, proc.stderr
    assert planned_jobs(proc.stdout)["rank"] == 1
    rank_lines = [line for line in proc.stdout.splitlines() if "rankwise rank " in line]
    expected = f" --device {device or 'cpu'} "  # the schema's default: cpu
    assert len(rank_lines) == 1 and expected in rank_lines[0], rank_lines


def test_a_pipeline_run_on_torch_cpu_and_switching_device_reruns_nothing(tmp_path):
    done = snakemake(tmp_path, _pipeline_config("torch-cpu"))
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "logs/ranks/market/pixels.log").read_text()
    assert "queries ranked" in log
    # the device never changes a number, so it is no rerun trigger
    again = snakemake(tmp_path, _pipeline_config("cpu"), "--dry-run")
    assert planned_jobs(again.stdout) == {}, again.stdout
