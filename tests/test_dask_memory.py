"""numbapool.dask under a memory limit: worker processes allowed a few input chunks above
their baseline, the input read from a zarr store, the windowed results written to one.
Every pool at ranks 1 to 3 must finish, its output chunks regular, equal bit for bit to
the in-memory call. A task that gathers more than a few chunks gets its worker killed,
and the computation fails at once (no retries)."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import numbapool
import numbapool.dask as nd
from numbapool._kernels import parallel

da = pytest.importorskip("dask.array")  # test dependencies: present in CI
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")
zarr = pytest.importorskip("zarr")

CHUNK_BYTES = 8 * 2**20
# What a worker may use above its baseline before it is killed: a few chunks. A worker
# holds more than its running task (data in transit, spilling, zarr's buffers, a heap that
# grows): peaks of 2.5 to 6.5 chunks above the baseline were measured with every pool here
# correct, while a task that merged the inner axes whole would hold 16 chunks and a copy.
ALLOWANCE_CHUNKS = 10
# 16 float32 chunks of 8 MiB (128 MiB) per rank, the inner axes cut into all 16 (8 or 16
# along the last)
SHAPES = {
    1: ((1, 2, 2**24), (1, 2, 2**20)),
    2: ((1, 2, 2048, 8192), (1, 2, 1024, 1024)),
    3: ((1, 2, 4, 1024, 4096), (1, 2, 4, 512, 512)),
}
WINDOWED = {
    "max_pool": lambda rank: dict(kernel_shape=[3] * rank, strides=[2] * rank, pads=[1] * 2 * rank),
    "average_pool": lambda rank: dict(kernel_shape=[3] * rank, pads=[1] * 2 * rank),
    "lp_pool": lambda rank: dict(kernel_shape=[2] * rank, strides=[2] * rank, p=2),
}
GLOBAL = ["global_max_pool", "global_average_pool", "global_lp_pool"]


def _rss():
    gc.collect()
    return psutil.Process().memory_info().rss


def _set_limit(limit, dask_worker):
    dask_worker.memory_manager.memory_limit = limit


def _warm():
    """Every call of the test on a small input, so that the kernels are loaded (or
    compiled) before the baseline is taken."""
    for rank, (_, chunks) in SHAPES.items():
        x = np.ones((1, 2) + (8,) * rank, np.float32)
        big = np.ones(chunks[:2] + tuple(2 * c for c in chunks[2:]), np.float32)[..., :-3]
        for name, attributes in WINDOWED.items():
            for array in (x, big):
                getattr(numbapool, name)(array, **attributes(rank))
        for name in GLOBAL:
            for array in (x, big):
                getattr(numbapool, name)(array)
            getattr(nd, name)(da.from_array(x, chunks=4)).compute(scheduler="sync")
    parallel.wait_for_drivers()  # those compiling in the background, before the baseline


@pytest.fixture(scope="module")
def limited_client():
    # dask's defaults but pausing: with the baseline above the pause fraction of so small
    # a limit, a paused worker would never run again. Finished results still spill to disk
    # (the running sums' pieces, read faster than the chain adds them up); what must stay
    # within the limit is what tasks hold while they run.
    config = {
        "distributed.worker.memory.pause": False,
        "distributed.worker.memory.terminate": 0.95,
        "distributed.worker.memory.monitor-interval": "20ms",
        "distributed.scheduler.allowed-failures": 0,
    }
    with (
        dask.config.set(config),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit="4GiB",
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        client.run(_warm)
        baseline = max(client.run(_rss).values())
        # killed when a worker's memory passes 95% of its limit: there, baseline + allowance
        limit = int((baseline + ALLOWANCE_CHUNKS * CHUNK_BYTES) / 0.95)
        client.run(_set_limit, limit)
        client.run(_set_limit, limit, nanny=True)
        yield client


def _zarr_input(path, rank):
    shape, chunks = SHAPES[rank]
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(shape, dtype=np.float32)
    store = zarr.create_array(
        os.path.join(path, f"input-{rank}.zarr"),
        shape=shape,
        chunks=chunks,
        dtype=np.float32,
        compressors=None,
    )
    store[...] = x
    return x, da.from_zarr(os.path.join(path, f"input-{rank}.zarr"))


@pytest.mark.parametrize("rank", sorted(SHAPES))
def test_every_pool_within_a_few_chunks_of_memory(limited_client, tmp_path, rank):
    x, lazy = _zarr_input(tmp_path, rank)
    for name, attributes in WINDOWED.items():
        result = getattr(nd, name)(lazy, **attributes(rank))
        for axis_chunks in result.chunks:  # regular: all equal but the last
            assert len(set(axis_chunks[:-1])) <= 1 and axis_chunks[-1] <= axis_chunks[0]
        out = os.path.join(tmp_path, f"{name}-{rank}.zarr")
        result.to_zarr(out)  # raises on irregular chunks, fails if a worker is killed
        expected = getattr(numbapool, name)(x, **attributes(rank))
        assert zarr.open_array(out)[...].tobytes() == expected.tobytes(), name
    for name in GLOBAL:
        got = getattr(nd, name)(lazy).compute()
        assert got.tobytes() == getattr(numbapool, name)(x).tobytes(), name
