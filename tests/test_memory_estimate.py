"""The memory estimate behind ``--memory-limit``, with re-ranking and query expansion.

Each configuration runs in a fresh process that reports its peak RSS (``VmHWM``) and
the estimate the engine would refuse with: the estimate must hold the real peak and not
overshoot it wildly (a limit set from it must be usable).  A limit between the plain
estimate and the re-ranking one refuses re-ranking in one line, before any work, and lets
the plain ranking run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import run_rankwise, write_inputs

import rankwise
from rankwise.errors import RankwiseError

PROBE = r"""
import json, sys
import numpy as np, pandas as pd
import rankwise
from rankwise.errors import RankwiseError

nq, ng, dim, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
centres = rng.normal(size=(nq // 4, dim)).astype(np.float32)
ql, gl = rng.integers(0, len(centres), nq), rng.integers(0, len(centres), ng)
qe = (centres[ql] + rng.normal(size=(nq, dim))).astype(np.float32)
ge = (centres[gl] + rng.normal(size=(ng, dim))).astype(np.float32)
q = pd.DataFrame({"id": [f"q{i}" for i in range(nq)], "label": ql.astype(str)})
g = pd.DataFrame({"id": [f"g{i}" for i in range(ng)], "label": gl.astype(str)})
kw = {}
if "rerank" in mode:
    kw["rerank"] = {"k1": 20, "k2": 6, "lambda": 0.3}
if "aqe" in mode:
    kw["aqe"] = {"k": 5, "alpha": 3.0}
if len(sys.argv) > 5:
    kw["gallery_chunk"] = int(sys.argv[5])
rankwise.rank(q, g, qe, ge, protocol="recall", workers=2, **kw)
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a big pytest
# process would report its parent's size
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
try:
    rankwise.rank(q, g, qe, ge, protocol="recall", workers=2, memory_limit_mb=1, **kw)
except RankwiseError as error:
    estimate = float(str(error).split("about ")[1].split(" MB")[0])
print(json.dumps({"peak": peak, "estimate": estimate}))
"""


@pytest.mark.parametrize(
    "mode, sizes",
    [
        *((mode, (2000, 16000, 192)) for mode in ("plain", "rerank", "aqe", "rerank+aqe")),
        ("rerank+aqe", (40, 300, 16)),  # tiles no larger than Q x G
        # 313 small gallery chunks: the tiles' counts piled up behind their sums (the
        # next chunk was read once its tiles were counted, not summed), ~1 GB at 50,000
        # gallery rows, where the estimate said 142 MB
        ("plain", (2000, 20000, 8, 64)),
    ],
)
def test_the_estimate_holds_the_measured_peak(mode, sizes):
    sizes, chunk = sizes[:3], sizes[3:]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, sizes), mode, *map(str, chunk)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["peak"] <= got["estimate"] <= 2.5 * got["peak"], got


def _case(n_query=300, n_gallery=3000, dim=64, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 50, n_query + n_gallery).astype(str)
    emb = rng.normal(size=(n_query + n_gallery, dim)).astype(np.float32)
    q = pd.DataFrame({"id": [f"q{i}" for i in range(n_query)], "label": labels[:n_query]})
    g = pd.DataFrame({"id": [f"g{i}" for i in range(n_gallery)], "label": labels[n_query:]})
    return q, g, emb[:n_query], emb[n_query:]


def _estimate(*case, **kw) -> float:
    with pytest.raises(RankwiseError) as info:
        rankwise.rank(*case, protocol="recall", memory_limit_mb=1e-3, **kw)
    return float(str(info.value).split("about ")[1].split(" MB")[0])


def test_a_limit_between_plain_and_reranking_refuses_only_reranking():
    case = _case()
    plain = _estimate(*case)
    rerank = {"k1": 20, "k2": 6, "lambda": 0.3}
    reranked = _estimate(*case, rerank=rerank)
    expanded = _estimate(*case, aqe={"k": 5, "alpha": 3.0})
    assert plain < reranked and plain < expanded
    limit = (plain + reranked) / 2
    rankwise.rank(*case, protocol="recall", memory_limit_mb=limit)  # runs
    advice = r"workers, re-ranking\); lower query_block, gallery_chunk or workers"
    with pytest.raises(RankwiseError, match=advice):
        rankwise.rank(*case, protocol="recall", memory_limit_mb=limit, rerank=rerank)


def test_tiny_runs_are_not_charged_for_tiles_larger_than_their_pairs():
    """8 queries x 26 gallery items were estimated ~100 MB above the plain ranking (a
    full-size tile per worker), and lowering --query-block or --gallery-chunk, which the
    refusal advises, changed nothing.  (Re-ranking and query expansion import numba,
    which a plain ranking on the C kernels does not: that much more is theirs.)"""
    from rankwise.native import engine_kernels
    from rankwise.ranking import _BASE_MB, _BASE_NATIVE_MB

    native = getattr(engine_kernels(), "name", "") == "native"
    numba = _BASE_MB - _BASE_NATIVE_MB if native else 0.0
    case = _case(n_query=8, n_gallery=26, dim=4)
    plain = _estimate(*case, workers=1)
    for extra in ({"rerank": "5,2,0.3"}, {"aqe": "3,3"}, {"rerank": "5,2,0.3", "aqe": "3,3"}):
        assert _estimate(*case, workers=1, **extra) < plain + numba + 1.0, extra


def test_cli_refuses_reranking_over_the_limit_in_one_line(tmp_path):
    case = _case()
    limit = (_estimate(*case) + _estimate(*case, rerank={"k1": 20, "k2": 6, "lambda": 0.3})) / 2
    args = write_inputs(tmp_path, *case)
    out = tmp_path / "ranks.zarr"
    proc = run_rankwise(
        "rank", *args, "--protocol", "recall", "--rerank", "20,6,0.3",
        "--memory-limit", f"{limit:.1f}", "--out", out,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "re-ranking" in lines[0] and "cannot be met" in lines[0]
    assert "lower --query-block, --gallery-chunk or --workers" in lines[0]  # the flags
    assert not out.exists()


def test_the_advice_names_the_options_as_the_caller_writes_them(tmp_path):
    """The engine's advice named the command line's flags to Python callers too
    ("lower --query-block"), who pass ``query_block``; a command run in this process
    names the flags, and Python calls after it the parameters again."""
    from click.testing import CliRunner

    from rankwise.cli import main

    case = _case()
    rerank = {"k1": 20, "k2": 6, "lambda": 0.3}
    limit = (_estimate(*case) + _estimate(*case, rerank=rerank)) / 2
    api = r"lower query_block, gallery_chunk or workers, or raise the limit"
    with pytest.raises(RankwiseError, match=api):
        rankwise.rank(*case, protocol="recall", memory_limit_mb=limit, rerank=rerank)
    args = write_inputs(tmp_path, *case)
    out = CliRunner().invoke(
        main,
        ["rank", *map(str, args), "--protocol", "recall", "--rerank", "20,6,0.3",
         "--memory-limit", f"{limit:.1f}", "--out", str(tmp_path / "r.zarr")],
    )  # fmt: skip
    assert out.exit_code == 2
    assert "lower --query-block, --gallery-chunk or --workers, or raise the limit" in out.output
    with pytest.raises(RankwiseError, match=api):
        rankwise.rank(*case, protocol="recall", memory_limit_mb=limit, rerank=rerank)


def test_a_gallery_store_of_large_storage_chunks_is_charged_for_them(tmp_path):
    """Tiles take whole storage chunks of a Zarr gallery: with one 20,000-row chunk the
    refusal advised lowering gallery_chunk, which changed nothing (and the least tile it
    weighed was one row)."""
    import zarr

    q, g, qe, ge = _case(n_query=500, n_gallery=20_000, dim=16)
    zarr.create_array(str(tmp_path / "g.zarr"), data=ge, chunks=ge.shape)
    small = _estimate(q, g, qe, ge, workers=1, query_block=1, gallery_chunk=64)
    stored = _estimate(q, g, qe, str(tmp_path / "g.zarr"), workers=1, query_block=1)
    assert stored > small
    limit = (small + stored) / 2
    with pytest.raises(
        RankwiseError,
        match=rf"even one-row tiles on one worker need about {stored:.0f} MB \(tiles take "
        r"whole storage chunks of the gallery store: 20000 rows\): raise the limit, or "
        r"write the store with smaller chunks$",
    ):
        rankwise.rank(
            q, g, qe, str(tmp_path / "g.zarr"), protocol="recall", workers=1,
            query_block=1, gallery_chunk=64, memory_limit_mb=limit,
        )  # fmt: skip
