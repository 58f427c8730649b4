"""The rank engine on a dask.distributed cluster gives the threaded scheduler's numbers."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import zarr

import rankwise

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as lc:
        with distributed.Client(lc) as client:
            yield client


def _reid_files(tmp_path, seed=0, n_q=80, n_g=700, dim=12):
    rng = np.random.default_rng(seed)
    glab = rng.integers(-1, 40, n_g)
    qlab = rng.integers(0, 45, n_q)
    pd.DataFrame(
        {"id": [f"g{i}" for i in range(n_g)], "label": glab, "camera": rng.integers(0, 4, n_g)}
    ).to_csv(tmp_path / "g.csv", index=False)
    pd.DataFrame(
        {"id": [f"q{i}" for i in range(n_q)], "label": qlab, "camera": rng.integers(0, 4, n_q)}
    ).to_csv(tmp_path / "q.csv", index=False)
    ge = rng.integers(-3, 4, (n_g, dim)).astype(np.float32)
    ge[5:25] = ge[0]  # exact duplicates: ties across chunks
    np.save(tmp_path / "g.npy", ge)
    np.save(tmp_path / "q.npy", rng.integers(-3, 4, (n_q, dim)).astype(np.float32))
    return [tmp_path / n for n in ("q.csv", "g.csv", "q.npy", "g.npy")]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_local_cluster_matches_threads(tmp_path, cluster, distance):
    files = _reid_files(tmp_path)
    kwargs = dict(protocol="reid", distance=distance, query_block=17, gallery_chunk=64)
    threaded = rankwise.evaluate(*files, workers=2, **kwargs)
    on_cluster = rankwise.evaluate(*files, scheduler=cluster, **kwargs)
    assert on_cluster.metrics == threaded.metrics
    assert on_cluster.num_skipped == threaded.num_skipped
    np.testing.assert_array_equal(
        on_cluster.per_query["first_rank"], threaded.per_query["first_rank"]
    )


def test_tile_buffers_are_not_kept_by_the_workers(tmp_path, cluster):
    """The count pass's reused tile buffers (rankwise.devices.NumpyTiles) live in each
    worker process: they are freed there too at the end of the run, failed or not, as in
    a threaded one (a worker kept one per thread, between runs, for as long as it lived)."""

    def held() -> int:
        from rankwise import devices

        return sum(buffer.nbytes for buffer in devices._SCRATCH)

    def fail_tiles(fail: bool) -> None:
        from rankwise.native import engine_kernels

        kernels = engine_kernels()  # the worker's kernel set: C or numba
        if fail:
            kernels.kept_count_tile = kernels.count_tile
            kernels.count_tile = lambda *args: 1 / 0  # after the tile's buffer is taken
        else:
            kernels.count_tile = kernels.kept_count_tile

    def blas_tiles(on: bool) -> None:
        """Tiles from numpy's BLAS on the worker (its C kernels' fused tile kernel
        writes no tile, into no buffer), or back to its own choice."""
        from rankwise.native import engine_kernels

        kernels = engine_kernels()
        if on:
            kernels.kept_fused, kernels.fused = getattr(kernels, "fused", False), False
        else:
            kernels.fused = kernels.kept_fused

    files = _reid_files(tmp_path, seed=9)
    kwargs = dict(protocol="reid", query_block=17, gallery_chunk=64, scheduler=cluster)
    cluster.run(blas_tiles, True)
    try:
        rankwise.evaluate(*files, **kwargs)
        by_worker = cluster.run(held)
        assert len(by_worker) == 2 and set(by_worker.values()) == {0}, by_worker
        # and after a run that failed in a tile (they were kept until the next good run)
        cluster.run(fail_tiles, True)
        try:
            with pytest.raises(ZeroDivisionError):
                rankwise.evaluate(*files, **kwargs)
        finally:
            cluster.run(fail_tiles, False)
    finally:
        cluster.run(blas_tiles, False)
    by_worker = cluster.run(held)
    assert len(by_worker) == 2 and set(by_worker.values()) == {0}, by_worker


PROGRESS_ON_A_CLUSTER = """
import operator, sys
import distributed
from dask.callbacks import Callback
from rankwise.ranking import EngineOptions, _Runner

graph = {("a", i): (operator.mul, i, 2) for i in range(5)}
graph["s"] = (sum, [("a", i) for i in range(5)])
ticks = [("a", i) for i in range(5)]
if __name__ == "__main__":
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None,
        silence_logs=40,
    ) as lc:
        seen, callers = [], []
        for scheduler in (lc.scheduler_address, None):  # a client of rankwise's own; threads
            runner = _Runner(EngineOptions(scheduler=scheduler, workers=2))
            try:
                # a caller's own Dask callback (dask.diagnostics.ProgressBar) still sees
                # the tasks of a threaded run
                with Callback(posttask=lambda key, *_: callers.append(key)):
                    out = list(runner.get(graph, ["s"], ticks=ticks, tick=lambda: seen.append(1)))
            finally:
                runner.close()
            print(out, len(seen))
            seen.clear()
        print(len(callers))
"""


def test_progress_counts_each_chunk_on_a_cluster(tmp_path):
    """The progress bar of `rankwise rank` ticks as each chunk's tiles are done: on a
    cluster through futures of the client rankwise connected to the address, which is
    not the default client (it failed with "No clients found" before the first tick),
    and on threads beside a caller's own Dask callbacks (the six tasks of a threaded run
    reach one); in a fresh process, so that no other test's client is the default one."""
    script = tmp_path / "progress.py"
    script.write_text(PROGRESS_ON_A_CLUSTER)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["[20] 5", "[20] 5", "6"], done.stdout


def test_scheduler_address_string(tmp_path, cluster):
    files = _reid_files(tmp_path, seed=3)
    by_address = rankwise.evaluate(
        *files, protocol="reid", gallery_chunk=100, scheduler=cluster.scheduler.address
    )
    threaded = rankwise.evaluate(*files, protocol="reid", gallery_chunk=100)
    assert by_address.metrics == threaded.metrics


def test_unreachable_scheduler_is_a_clear_error(tmp_path):
    files = _reid_files(tmp_path, seed=4)
    with pytest.raises(rankwise.RankwiseError, match="cannot reach the Dask scheduler"):
        rankwise.evaluate(*files, protocol="reid", scheduler="tcp://127.0.0.1:9")


@pytest.mark.parametrize("options", [{"rerank": "10,4,0.3"}, {"aqe": "3,3", "rerank": "6,2,0.5"}])
def test_reranking_on_a_cluster_matches_threads(tmp_path, cluster, options):
    """Re-ranking and query expansion: the cluster's numbers are the threads' (integer
    data with exact duplicates: ties across chunks and tasks)."""
    files = _reid_files(tmp_path, seed=5, n_g=300)
    kwargs = dict(protocol="reid", distance="euclidean", query_block=17, gallery_chunk=64)
    threaded = rankwise.rank(*files, workers=2, **kwargs, **options)
    on_cluster = rankwise.rank(*files, scheduler=cluster, **kwargs, **options)
    for key in ("offsets", "ranks", "query_index"):
        np.testing.assert_array_equal(getattr(on_cluster, key), getattr(threaded, key))


def test_a_scheduler_address_that_is_not_one_is_a_clear_error(tmp_path):
    """A malformed address (ValueError) was a traceback with exit status 1."""
    files = _reid_files(tmp_path, seed=5)
    for address, what in (("garbage", "missing port number"), ("http://x:1", "unknown address")):
        with pytest.raises(rankwise.RankwiseError, match=f"not a usable scheduler address.*{what}"):
            rankwise.evaluate(*files, protocol="reid", scheduler=address)


def test_a_malformed_address_is_refused_before_any_client_starts():
    """Decided without distributed's event loop: in the client's start-up the same
    mistake surfaced as a bare AssertionError once, under load (a CI run)."""
    from rankwise import ranking

    def never(*args, **kwargs):
        raise AssertionError("no client may be started for a malformed address")

    for address, what in (
        ("garbage", "missing port number in address 'garbage'"),
        ("tcp://host", "missing port number in address 'host'"),
        ("http://x:1", "unknown address scheme 'http'"),
    ):
        with pytest.raises(rankwise.RankwiseError, match=f"not a usable scheduler address.*{what}"):
            ranking._connect(never, address)


def test_a_port_where_no_scheduler_answers_does_not_hang(monkeypatch):
    """Something other than a Dask scheduler on the port: distributed's client waited
    forever. The client connects in a thread given a deadline (here 0.2 s, a client that
    never returns standing for the silent peer)."""
    import threading

    from rankwise import ranking

    never = threading.Event()

    class Silent:
        def __init__(self, address, **kwargs):
            never.wait()

    monkeypatch.setattr(ranking, "_CONNECT_S", 0.2)
    with pytest.raises(rankwise.RankwiseError, match=r"did not answer within 0\.2 s: something"):
        ranking._connect(Silent, "tcp://127.0.0.1:8799")
    never.set()


def test_a_port_where_another_server_speaks_first_is_named_as_such(tmp_path):
    """A server that sends a banner (SSH) on the port: its bytes were read as a Dask
    frame's length, and the line said "not a usable scheduler address (MemoryError:
    Unable to allocate 2.82 EiB ...)" after ~1 s."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    stop = threading.Event()
    peers = []  # kept open, as an SSH server keeps its side (closed, the client retried)

    def banner() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                peer, _ = server.accept()
            except OSError:
                continue
            peers.append(peer)
            peer.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    threading.Thread(target=banner, daemon=True).start()
    files = _reid_files(tmp_path, seed=7)
    try:
        with pytest.raises(rankwise.RankwiseError) as info:
            rankwise.evaluate(*files, protocol="reid", scheduler=f"tcp://127.0.0.1:{port}")
    finally:
        stop.set()
        for sock in [server, *peers]:
            sock.close()
    message = str(info.value)
    assert "answered, but not as a Dask scheduler does" in message, message
    assert "MemoryError" not in message and "EiB" not in message
    assert "\n" not in message


def test_tls_without_a_tls_configuration_is_not_blamed_on_the_peer(tmp_path):
    """distributed refuses tls:// without an SSL context before it connects (TypeError):
    nothing listens on port 1, so "answered, but not as a Dask scheduler does: something
    else listens there" was wrong."""
    files = _reid_files(tmp_path, seed=8)
    with pytest.raises(rankwise.RankwiseError) as info:
        rankwise.evaluate(*files, protocol="reid", scheduler="tls://127.0.0.1:1")
    message = str(info.value)
    assert "not a usable scheduler address (TypeError: TLS expects" in message, message
    assert "answered" not in message and "\n" not in message


def test_a_scheduler_without_workers_is_a_clear_error(tmp_path, monkeypatch):
    """It failed after Dask's timeout with "TimeoutError: No valid workers found"."""
    from rankwise import ranking

    monkeypatch.setattr(ranking, "_WORKERS_S", 1.0)
    files = _reid_files(tmp_path, seed=6)
    with distributed.LocalCluster(
        n_workers=0, processes=False, dashboard_address=":0", silence_logs=40
    ) as lc:
        with pytest.raises(
            rankwise.RankwiseError, match=r"has no workers \(none joined within 1 s\); start some"
        ):
            rankwise.evaluate(*files, protocol="reid", scheduler=lc.scheduler_address)
        # a Client given to the API: it failed after 30 s, "TimeoutError: No valid workers
        # found"; the caller's client stays open
        with distributed.Client(lc) as client:
            with pytest.raises(
                rankwise.RankwiseError,
                match=r"at 'inproc://.*has no workers \(none joined within 1 s\); start some",
            ):
                rankwise.evaluate(*files, protocol="reid", scheduler=client)
            assert client.status == "running"


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_relative_paths_are_read_from_the_callers_folder(tmp_path, cluster, monkeypatch, kind):
    """Embedding paths relative to the caller's working directory (as the pipeline's rules
    give them): the workers, started in another folder, read the gallery relative to
    theirs, and failed (a file "corrupt or changed during the run"), or read another
    run's file of the same name there."""
    here = tmp_path / "run"
    here.mkdir()
    files = _reid_files(here, seed=7)
    if kind == "zarr":
        rows = np.load(files[3])
        zarr.create_array(here / "g.zarr", data=rows, chunks=(64, rows.shape[1]))
        files[3] = here / "g.zarr"
    threaded = rankwise.evaluate(*files, protocol="reid", gallery_chunk=100)
    monkeypatch.chdir(here)
    assert str(here) not in cluster.run(os.getcwd).values()  # the workers' folder is another
    relative = [f.name for f in files]
    on_cluster = rankwise.evaluate(*relative, protocol="reid", gallery_chunk=100, scheduler=cluster)
    assert on_cluster.metrics == threaded.metrics


def test_a_client_opened_for_an_address_is_closed(tmp_path, cluster):
    """rankwise connects to an address itself: that client was left open, as the
    process's default Dask scheduler (the caller's own dask computations then ran on the
    cluster, and failed once it was gone), after a run that succeeded or failed."""
    import dask

    def clients() -> int:
        return cluster.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.clients))

    files = _reid_files(tmp_path, seed=8)
    bad = np.load(files[3])
    bad[150] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    before = clients()
    for gallery, raises in ((files[3], False), (tmp_path / "bad.npy", True)):
        try:
            rankwise.evaluate(
                *files[:3], gallery, protocol="reid", scheduler=cluster.scheduler.address
            )
        except rankwise.RankwiseError:
            assert raises
        assert distributed.default_client() is cluster
        assert dask.config.get("scheduler") == "dask.distributed"  # the fixture's, still
        for _ in range(50):  # the scheduler hears of a closed client soon after
            if clients() == before:
                break
            time.sleep(0.1)
        assert clients() == before


def test_memory_limit_counts_no_tiles_of_the_schedulers_workers(tmp_path):
    """--memory-limit is this process's peak; with a scheduler the tiles are on its
    workers. Each of its threads was counted as a tile in this process: a run that fits
    was refused, advising a lower --workers, which a scheduler's run does not use."""
    files = _reid_files(tmp_path, seed=9, n_q=50, n_g=8192, dim=64)
    kwargs = dict(protocol="reid", memory_limit_mb=300)
    threaded = rankwise.evaluate(*files, workers=2, **kwargs)  # ~270 MB estimated
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=32, processes=False, dashboard_address=":0",
        silence_logs=40,
    ) as lc:  # fmt: skip
        with distributed.Client(lc) as client:
            for workers in (None, 1):
                on_cluster = rankwise.evaluate(*files, scheduler=client, workers=workers, **kwargs)
                assert on_cluster.metrics == threaded.metrics
            with pytest.raises(
                rankwise.RankwiseError,
                match=r"x 64 dims, tiles 50 x 8192, on the scheduler's workers\); even "
                r"one-row tiles need about \d+ MB: raise the limit",
            ):
                rankwise.evaluate(*files, scheduler=client, protocol="reid", memory_limit_mb=100)


def test_a_worker_killed_while_ranking_is_one_line(tmp_path):
    """A worker process that dies under a task (killed for memory, most often) raised
    distributed's KilledWorker, a multi-line traceback; now one line naming the task,
    the worker and what to change."""
    import dask

    files = _reid_files(tmp_path, seed=10)

    def die_in_every_tile() -> None:
        from rankwise.native import engine_kernels

        kernels = engine_kernels()
        kernels.count_tile = kernels.count_fused = lambda *args: os._exit(1)  # C: either

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
            silence_logs=50,
        ) as lc, distributed.Client(lc) as client:  # fmt: skip
            client.run(die_in_every_tile)
            with pytest.raises(rankwise.RankwiseError) as caught:
                # one gallery chunk: when the tile dies nothing else computes or waits
                # on that worker (with several chunks the scheduler may blame the next
                # chunk's queued read or upload instead: not what this test is about)
                rankwise.evaluate(*files, protocol="reid", gallery_chunk=1000, scheduler=client)
    message = str(caught.value)
    assert "\n" not in message
    # the scheduler blames any task it had queued on the worker: 'tile', or a data key
    assert re.match(
        r"a worker of the Dask cluster died while running rankwise's ('tile' task|tasks) "
        r"\(1 attempt\(s\); the last on tcp://",
        message,
    ), message
    assert "lower query_block and gallery_chunk" in message  # the API's names: an API call


def test_cuda_needs_a_gpu_on_the_workers_not_only_here(tmp_path, cluster, monkeypatch):
    """With a scheduler the tiles run on its workers: `cuda` was checked only where
    rankwise started, so workers without a GPU failed each task in torch (a traceback);
    `auto` chose cuda for workers that have none."""
    torch = pytest.importorskip("torch")
    from rankwise import devices

    def sees_cuda() -> bool:
        import torch

        return torch.cuda.is_available()

    if any(cluster.run(sees_cuda).values()):
        pytest.skip("the workers see a CUDA device")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # here, not on the workers
    monkeypatch.setattr(devices, "_gpu_may_be_visible", lambda: True)
    assert devices.tiles_for("cuda").name == devices.tiles_for("auto").name == "cuda"
    files = _reid_files(tmp_path, seed=11)
    kwargs = dict(protocol="reid", gallery_chunk=100, scheduler=cluster)
    with pytest.raises(
        rankwise.RankwiseError,
        match=r"^device cuda: 2 of the scheduler's 2 workers see no CUDA device \(or have no "
        r"torch\): tcp://.*; start the workers where a GPU is visible, or use device cpu or auto$",
    ):
        rankwise.evaluate(*files, device="cuda", **kwargs)
    on_auto = rankwise.evaluate(*files, device="auto", **kwargs)  # the workers' cpu
    assert on_auto.metrics == rankwise.evaluate(*files, protocol="reid", workers=1).metrics
