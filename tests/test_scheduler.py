"""rankwise.scheduler: the engine's graphs on local threads, against Dask's own scheduler.

The graphs have the engine's shapes (ranking._pass_counts: per-chunk "prep" tasks, data
placed in the graph, per-tile tasks reading both, a combine step over a list of tiles;
rerank: independent tasks sharing one array).  Every result must equal dask.threaded's
on the same graph, for every worker count; errors come out as raised.
"""

from __future__ import annotations

import threading
import time
import weakref

import dask.threaded
import numpy as np
import pytest

from rankwise.errors import RankwiseError
from rankwise.scheduler import run_threads


def _prep(x, c):
    return x[c::3] * 2.0


def _tile(prep, block, meta):
    return np.array([prep.sum() * block["w"] + meta["lab"].sum()])


def _combine(parts):
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _engine_like_graph(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(30)
    blocks = [{"w": float(w)} for w in rng.integers(1, 5, 4)]
    graph: dict = {}
    for c in range(3):
        graph[("prep", c)] = (_prep, x, c)
        graph[("gmeta", c)] = {"lab": rng.integers(0, 9, 5)}  # data, not a task
    out = []
    for b, block in enumerate(blocks):
        tiles = []
        for c in range(3):
            graph[("tile", b, c)] = (_tile, ("prep", c), block, ("gmeta", c))
            tiles.append(("tile", b, c))
        graph[("sum", b)] = (_combine, tiles)
        out.append(("sum", b))
    return graph, out


@pytest.mark.parametrize("workers", [1, 2, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_results_equal_dask_threaded(workers, seed):
    graph, keys = _engine_like_graph(seed)
    expected = dask.threaded.get(graph, keys, num_workers=workers)
    got = run_threads(graph, keys, workers)
    assert len(got) == len(expected) == len(keys)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    # keys asked in another order come back in that order; intermediate keys too
    asked = [keys[2], ("prep", 1), keys[0], ("gmeta", 2)]
    for a, b in zip(
        run_threads(graph, asked, workers), dask.threaded.get(graph, asked), strict=True
    ):
        np.testing.assert_array_equal(
            a if not isinstance(a, dict) else a["lab"], b if not isinstance(b, dict) else b["lab"]
        )


def test_independent_tasks_and_hand_computed_values():
    shared = np.arange(6.0)
    graph = {("nn", lo): (np.sum, shared[lo : lo + 2]) for lo in (0, 2, 4)}
    graph["total"] = (sum, [("nn", 0), ("nn", 2), ("nn", 4)])
    graph["pair"] = (divmod, "total", 4)  # a string key, and a plain int argument
    assert run_threads(graph, ["total", "pair", ("nn", 2)], 2) == [15.0, (3.0, 3.0), 5.0]


def test_tasks_run_concurrently_up_to_num_workers():
    active, peak, lock = [0], [0], threading.Lock()

    def task(i):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return i

    graph = {("t", i): (task, i) for i in range(6)}
    assert run_threads(graph, [("t", i) for i in range(6)], 2) == list(range(6))
    assert peak[0] == 2
    peak[0] = 0
    run_threads(graph, [("t", 0)], 1)
    assert peak[0] == 1


def test_a_result_is_released_once_its_readers_ran():
    refs = {}

    class Chunk:  # weak-referenceable stand-in for a prepared gallery chunk
        pass

    def prep(c):
        chunk = Chunk()
        refs[c] = weakref.ref(chunk)
        return chunk

    def tile(chunk, c):
        return c

    def after(previous_tile):
        # chunk 0's only reader ran before this task was queued: chunk 0 is gone
        return refs[0]() is None

    graph = {("prep", 0): (prep, 0), ("tile", 0): (tile, ("prep", 0), 0)}
    graph["check"] = (after, ("tile", 0))
    assert run_threads(graph, ["check"], 1) == [True]


def test_the_first_error_is_raised_as_it_is_and_queued_tasks_are_cancelled():
    started = []

    def bad():
        raise RankwiseError("gallery.npy: gallery embeddings row 7 (0-based) contains NaN")

    def slow(i):
        started.append(i)
        time.sleep(0.02)
        return i

    graph = {"bad": (bad,), **{("slow", i): (slow, i) for i in range(50)}}
    with pytest.raises(RankwiseError, match=r"^gallery.npy: gallery embeddings row 7"):
        run_threads(graph, ["bad", *[("slow", i) for i in range(50)]], 1)
    assert len(started) < 50
    # a task depending on a failed one never runs
    ran = []
    graph = {"bad": (bad,), "after": (ran.append, "bad")}
    with pytest.raises(RankwiseError):
        run_threads(graph, ["after"], 2)
    assert ran == []
