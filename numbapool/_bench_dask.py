"""``python -m numbapool bench --dask``: numbapool.dask on a LocalCluster of worker processes.

Two measurements (docs/dask.md):

- throughput: an input several times the workers' memory, in a zarr store, pooled by a 3-D
  MaxPool written to another store, and by GlobalAveragePool; GB/s of input, and the
  cluster's peak memory;
- overhead: on an input that fits, the dask call (input persisted on the workers, result
  gathered) against the in-memory call in this process, interleaved, median of several.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import numbapool

MAX_POOL = dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6)
CHUNKS = (1, 4, 16, 256, 256)  # 16 MiB of float32


def _warm():
    from numbapool._cases import ready

    x = np.ones((1, 4, 8, 64, 64), np.float32)
    ready(lambda: numbapool.max_pool(x, **MAX_POOL))
    ready(lambda: numbapool.global_average_pool(x))


def _timed(function) -> tuple:
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def dask_report(
    workers: int = 2, memory_limit: str = "700MiB", large_gib: float = 4.0, rounds: int = 5
) -> str:
    import dask.array as da
    import distributed
    from distributed.diagnostics import MemorySampler

    import numbapool.dask as nd

    directory = tempfile.mkdtemp(prefix="numbapool-bench-dask-")
    lines = []
    try:
        with (
            distributed.LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                memory_limit=memory_limit,
                dashboard_address=":0",
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            client.run(_warm)
            limit = sum(w["memory_limit"] for w in client.scheduler_info()["workers"].values())
            # the large input, written to zarr by the cluster itself
            depth = max(16, int(large_gib * 2**30 / (2 * 4 * 1024 * 1024 * 4)) // 16 * 16)
            shape = (2, 4, depth, 1024, 1024)
            source = os.path.join(directory, "input.zarr")
            da.random.default_rng(0).standard_normal(
                shape, chunks=CHUNKS, dtype=np.float32
            ).to_zarr(source)
            x = da.from_zarr(source)
            lines += [
                f"input {shape} float32, {x.nbytes / 1e9:.2f} GB in chunks of "
                f"{CHUNKS} ({np.prod(CHUNKS) * 4 / 2**20:.0f} MiB), from zarr; "
                f"{workers} workers x 1 thread, memory_limit {memory_limit} each "
                f"({x.nbytes / limit:.1f}x the workers' memory together)",
                "",
                "| call | time, s | GB/s of input | cluster peak memory, MiB |",
                "| --- | ---: | ---: | ---: |",
            ]
            runs = {
                "reading the input alone (its maximum)": lambda: x.max().compute(),
                "max_pool 3x3x3 s2 pads 1, to zarr": lambda: nd.max_pool(x, **MAX_POOL).to_zarr(
                    os.path.join(directory, "max.zarr"), overwrite=True
                ),
                "global_average_pool": lambda: nd.global_average_pool(x).compute(),
            }
            for name, run in runs.items():
                sampler = MemorySampler()
                with sampler.sample(name, interval=0.1):
                    seconds, _ = _timed(run)
                peak = max(memory for _, memory in sampler.samples[name])
                lines.append(
                    f"| {name} | {seconds:.1f} | {x.nbytes / seconds / 1e9:.2f} | "
                    f"{peak / 2**20:.0f} |"
                )

        # overhead, on an input that fits everywhere: workers without a limit
        with (
            distributed.LocalCluster(
                n_workers=workers, threads_per_worker=1, dashboard_address=":0"
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            client.run(_warm)
            persisted = client.persist(
                da.random.default_rng(1).standard_normal(
                    (1, 4, 64, 512, 512), chunks=CHUNKS, dtype=np.float32
                )
            )
            small = persisted.compute()
            calls = {
                "max_pool 3x3x3 s2 pads 1": (
                    lambda: numbapool.max_pool(small, **MAX_POOL),
                    lambda: nd.max_pool(persisted, **MAX_POOL).compute(),
                ),
                "global_average_pool": (
                    lambda: numbapool.global_average_pool(small),
                    lambda: nd.global_average_pool(persisted).compute(),
                ),
                # what dask alone costs on these chunks: one cheap task per chunk, gathered
                "a copy with stride 2 (x[..., ::2, ::2, ::2])": (
                    lambda: small[..., ::2, ::2, ::2].copy(),
                    lambda: persisted[..., ::2, ::2, ::2].compute(),
                ),
            }
            lines += [
                "",
                f"overhead: input {small.shape} float32 "
                f"({small.nbytes / 2**20:.0f} MiB) persisted on the workers (no memory "
                f"limit), the in-memory call in this process, "
                f"median of {rounds} interleaved",
                "",
                "| call | in memory, s | dask, s | dask / in memory |",
                "| --- | ---: | ---: | ---: |",
            ]
            for name, (in_memory, on_dask) in calls.items():
                assert on_dask().tobytes() == in_memory().tobytes()
                times = {"memory": [], "dask": []}
                for _ in range(rounds):
                    times["memory"].append(_timed(in_memory)[0])
                    times["dask"].append(_timed(on_dask)[0])
                memory, lazy = (statistics.median(times[k]) for k in ("memory", "dask"))
                lines.append(f"| {name} | {memory:.3f} | {lazy:.3f} | {lazy / memory:.1f} |")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return "\n".join(lines)
