"""Concurrent API calls leave the process's BLAS thread count as they found it (BLAS
limits are process-wide: overlapping per-call limits once left it pinned at 1)."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import rankwise
from rankwise.table import Table

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads():
    return [info["num_threads"] for info in threadpoolctl.threadpool_info()]


def _table(prefix: str, n: int) -> Table:
    return Table(
        {
            "id": np.array([f"{prefix}{i}" for i in range(n)], dtype=object),
            "label": np.array([str(i % 50) for i in range(n)], dtype=object),
        }
    )


def test_concurrent_evaluations_restore_blas_threads():
    rng = np.random.default_rng(0)
    nq, ng = 300, 3000
    q, g = _table("q", nq), _table("g", ng)
    qe = rng.normal(size=(nq, 32)).astype(np.float32)
    ge = rng.normal(size=(ng, 32)).astype(np.float32)
    before = _blas_threads()
    expected = rankwise.evaluate(q, g, qe, ge).metrics
    for _ in range(3):
        with ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(
                    lambda i: rankwise.evaluate(q, g, qe, ge, gallery_chunk=100 + i).metrics,
                    range(8),
                )
            )
        assert all(r == expected for r in results)
        assert _blas_threads() == before
