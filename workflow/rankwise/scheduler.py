"""The engine's task graphs on local threads, without importing Dask.

A graph is a dict ``key -> task or value``; a task is a tuple ``(func, *args)``.  An
argument that is a key of the graph stands for that key's result, a list argument
element by element (a combine step's list of tiles); anything else is passed as it is.
That is the part of Dask's graph format the engine writes (:mod:`rankwise.ranking`,
:mod:`rankwise.rerank`), so the same graphs run on a dask.distributed cluster.
Importing Dask costs 0.06-0.09 s, which every threaded run paid before its first tile.

Tasks start in the graph's order as their inputs become ready, at most ``num_workers``
at a time; a result is dropped once every task that reads it has run (unless asked
for), so a gallery chunk lives only as long as its tiles.  The first task error is
raised as it is (a :class:`~rankwise.errors.RankwiseError` stays one line); tasks not
yet started are cancelled.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any


def _is_task(value: Any) -> bool:
    return isinstance(value, tuple) and bool(value) and callable(value[0])


def _refs(arg: Any, graph: dict) -> Iterable[Hashable]:
    """Keys of ``graph`` that argument ``arg`` stands for."""
    if isinstance(arg, list):
        for item in arg:
            yield from _refs(item, graph)
        return
    try:
        if arg in graph:
            yield arg
    except TypeError:  # unhashable data (arrays, dicts): a value, not a key
        pass


def _resolve(arg: Any, graph: dict, results: dict) -> Any:
    if isinstance(arg, list):
        return [_resolve(item, graph, results) for item in arg]
    try:
        if arg in graph:
            return results[arg]
    except TypeError:
        pass
    return arg


def run_threads(graph: dict, keys: list, num_workers: int) -> list:
    """Results of ``keys`` (in that order), running ``graph`` on ``num_workers`` threads."""
    deps = {
        key: (
            list(dict.fromkeys(r for arg in value[1:] for r in _refs(arg, graph)))
            if _is_task(value)
            else []
        )
        for key, value in graph.items()
    }
    dependents: dict[Hashable, list] = {key: [] for key in graph}
    for key, needs in deps.items():
        for need in needs:
            dependents[need].append(key)
    missing = {key: len(needs) for key, needs in deps.items()}
    uses = {key: len(users) for key, users in dependents.items()}
    wanted = set(keys)
    results: dict[Hashable, Any] = {}
    ready = deque(key for key, n in missing.items() if n == 0)
    running: dict[Future, Hashable] = {}
    pool = ThreadPoolExecutor(max(1, num_workers), thread_name_prefix="rankwise")
    failed = True
    try:
        while ready or running:
            while ready:
                key = ready.popleft()
                value = graph[key]
                if not _is_task(value):  # data placed in the graph: ready at once
                    _finish(key, value, deps, dependents, missing, uses, wanted, results, ready)
                    continue
                args = [_resolve(arg, graph, results) for arg in value[1:]]
                running[pool.submit(value[0], *args)] = key
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                key = running.pop(future)
                _finish(
                    key, future.result(), deps, dependents, missing, uses, wanted, results, ready
                )
        failed = False
    finally:
        # after an error, don't wait for queued tasks; a running one finishes on its own
        pool.shutdown(wait=not failed, cancel_futures=True)
    return [results[key] for key in keys]


def _finish(key, result, deps, dependents, missing, uses, wanted, results, ready) -> None:
    """Record ``key``'s result, release inputs nobody needs any more, queue ready tasks."""
    results[key] = result
    for need in deps[key]:
        uses[need] -= 1
        if uses[need] == 0 and need not in wanted:
            del results[need]
    for user in dependents[key]:
        missing[user] -= 1
        if missing[user] == 0:
            ready.append(user)
