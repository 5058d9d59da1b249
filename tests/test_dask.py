"""numbapool.dask on a LocalCluster with worker processes: random chunkings and attributes,
every operator, bit for bit against the in-memory call."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import numbapool
import numbapool.dask as nd

da = pytest.importorskip("dask.array")  # a test dependency: present in CI
distributed = pytest.importorskip("distributed")

ROUNDS = 24
FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    ) as cluster:
        with distributed.Client(cluster) as client:
            yield client


def random_input(rng, dtype):
    rank = int(rng.integers(1, 4))
    side = {1: 23, 2: 11, 3: 6}[rank]
    shape = (
        int(rng.integers(1, 3)),
        int(rng.integers(1, 4)),
        *(int(rng.integers(1, side + 1)) for _ in range(rank)),
    )
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        values = rng.choice([info.min, 0, 1, 5, info.max], size=shape)
    else:  # few distinct values (ties), signed zeros, infinities and NaN now and then
        values = rng.choice(
            [-2.5, -1.0, -0.0, 0.0, 0.5, 3.0, 7.25, np.inf, -np.inf, np.nan],
            size=shape,
            p=[0.14, 0.14, 0.1, 0.1, 0.14, 0.14, 0.14, 0.04, 0.03, 0.03],
        )
        values = values * rng.choice([1.0, 1.0001, 0.37], size=shape)
    return np.asarray(values).astype(dtype)


def random_chunks(rng, shape):
    """Any split of every axis, chunks of 1 included."""
    chunks = []
    for size in shape:
        cuts = sorted(set(rng.integers(1, size, size=int(rng.integers(0, 4)))) if size > 1 else [])
        bounds = [0, *map(int, cuts), size]
        chunks.append(tuple(b - a for a, b in zip(bounds, bounds[1:])))
    return tuple(chunks)


def random_attributes(rng, rank, op):
    kernel = [int(k) for k in rng.integers(1, 4, rank)]
    attributes = dict(kernel_shape=kernel)
    if rng.random() < 0.7:
        attributes["strides"] = [int(s) for s in rng.integers(1, 4, rank)]
    if rng.random() < 0.4:
        attributes["dilations"] = [int(d) for d in rng.integers(1, 3, rank)]
    choice = rng.random()
    if choice < 0.5:
        attributes["pads"] = [int(p) for p in rng.integers(0, 4, 2 * rank)]
    elif choice < 0.7:
        attributes["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    attributes["ceil_mode"] = int(rng.integers(0, 2))
    if op == "MaxPool":
        attributes["storage_order"] = int(rng.integers(0, 2))
        attributes["return_indices"] = True
    elif op == "AveragePool":
        attributes["count_include_pad"] = int(rng.integers(0, 2))
    else:
        attributes["p"] = [1, 2, 3, 1.5][int(rng.integers(0, 4))]
    return attributes


def assert_bitwise_equal(got, expected):
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert got.tobytes() == expected.tobytes()


WINDOWED = {
    "MaxPool": (numbapool.max_pool, nd.max_pool),
    "AveragePool": (numbapool.average_pool, nd.average_pool),
    "LpPool": (numbapool.lp_pool, nd.lp_pool),
}


@pytest.mark.parametrize("op", sorted(WINDOWED))
def test_windowed_pools_random_chunkings(client, op):
    rng = np.random.default_rng(["AveragePool", "LpPool", "MaxPool"].index(op))
    in_memory, on_dask = WINDOWED[op]
    dtypes = FLOATS + ([np.int8, np.uint8] if op == "MaxPool" else [])
    checked = 0
    while checked < ROUNDS:
        x = random_input(rng, dtypes[int(rng.integers(0, len(dtypes)))])
        attributes = random_attributes(rng, x.ndim - 2, op)
        try:
            expected = in_memory(x, **attributes)
        except ValueError:  # e.g. a window larger than the padded input
            continue
        lazy = on_dask(da.from_array(x, chunks=random_chunks(rng, x.shape)), **attributes)
        got = (
            client.compute(lazy).result()
            if not isinstance(lazy, tuple)
            else tuple(f.result() for f in client.compute(list(lazy)))
        )
        for g, e in zip(
            got if isinstance(got, tuple) else (got,),
            expected if isinstance(expected, tuple) else (expected,),
        ):
            assert_bitwise_equal(np.asarray(g), e)
        checked += 1


GLOBAL = {
    "GlobalMaxPool": (numbapool.global_max_pool, nd.global_max_pool),
    "GlobalAveragePool": (numbapool.global_average_pool, nd.global_average_pool),
    "GlobalLpPool": (
        lambda x: numbapool.global_lp_pool(x, p=3),
        lambda x: nd.global_lp_pool(x, p=3),
    ),
}


@pytest.mark.parametrize("op", sorted(GLOBAL))
def test_global_pools_random_chunkings(client, op):
    rng = np.random.default_rng(10 + sorted(GLOBAL).index(op))
    in_memory, on_dask = GLOBAL[op]
    for _ in range(ROUNDS):
        x = random_input(rng, FLOATS[int(rng.integers(0, len(FLOATS)))])
        # irregular values, so that the order of the additions shows in the last bit
        x = (x.astype(np.float64) * rng.uniform(0.9, 1.1, x.shape)).astype(x.dtype)
        lazy = on_dask(da.from_array(x, chunks=random_chunks(rng, x.shape)))
        assert_bitwise_equal(client.compute(lazy).result(), in_memory(x))


def test_global_average_pieces_inside_float32_blocks(client):
    # GlobalAveragePool narrower than float64 adds blocks of 1024 elements in 64 float32
    # lanes (docs/semantics.md): pieces that begin and end inside a block, and inside a
    # run of lanes, carry the lanes of the block they end in
    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        x = rng.standard_normal((2, 3, 2500)) * 2.0 ** rng.integers(-8, 8, (2, 3, 2500))
        x = x.astype(dtype)
        for chunks in [(1, 2, (700, 1100, 700)), (2, 3, (1, 1023, 1025, 451)), (1, 1, 333)]:
            lazy = nd.global_average_pool(da.from_array(x, chunks=chunks))
            assert_bitwise_equal(client.compute(lazy).result(), numbapool.global_average_pool(x))


@pytest.mark.parametrize("shape", [(0, 3, 4, 4), (2, 0, 4, 4)])
def test_global_sums_of_empty_arrays(shape):
    # no channels: the running sums pass over empty pieces, as the in-memory call returns
    # an empty result of the right shape
    x = np.zeros(shape, np.float32)
    for in_memory, on_dask in (GLOBAL["GlobalAveragePool"], GLOBAL["GlobalLpPool"]):
        got = on_dask(da.from_array(x, chunks=2)).compute(scheduler="synchronous")
        expected = in_memory(x)
        assert got.shape == expected.shape and got.dtype == expected.dtype


def test_output_chunks_are_regular():
    x = da.zeros((2, 3, 100, 60), chunks=(1, 2, 25, 30), dtype=np.float32)
    y = nd.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    # 50 x 30 outputs; the windows of 25 and 30 input elements at stride 2: 13 and 15
    assert y.chunks == ((1, 1), (2, 1), (13, 13, 13, 11), (15, 15))
    assert (
        y.shape
        == numbapool.plan(
            "MaxPool", x.shape, x.dtype, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ).out_shape
    )
    # irregular input chunks: the largest sets the length
    y = nd.average_pool(x.rechunk({2: (10, 40, 50)}), [2, 1], strides=[3, 1])
    assert y.chunks[2:] == ((17, 16), (30, 30))


def test_lazy_until_computed_and_errors_at_call_time():
    x = da.ones((1, 1, 8, 8), chunks=4, dtype=np.float32)
    with pytest.raises(ValueError, match="kernel_shape"):
        nd.max_pool(x, [0, 2])
    with pytest.raises(TypeError, match="int32"):
        nd.average_pool(x.astype(np.int32), [2, 2])
    with pytest.raises(TypeError, match="uint8"):
        nd.global_average_pool(x.astype(np.uint8))
    assert isinstance(nd.global_lp_pool(x), da.Array)


def test_import_numbapool_does_not_import_dask():
    import subprocess
    import sys

    script = "import sys, numbapool; print('dask' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True
        ).stdout.strip()
        == "False"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_windows_that_all_miss_the_input(dtype):
    # along the first spatial axis every window lies in the padding: the empty-window value
    import dask

    x = np.ones((1, 1, 1, 4), dtype)
    attributes = dict(kernel_shape=[1, 1], strides=[5, 1], pads=[3, 0, 3, 0])
    expected = numbapool.max_pool(x, **attributes)
    got = dask.compute(nd.max_pool(da.from_array(x, chunks=1), **attributes), scheduler="sync")[0]
    assert got.tobytes() == expected.tobytes()
    y, indices = dask.compute(
        nd.max_pool(da.from_array(x, chunks=1), return_indices=True, **attributes), scheduler="sync"
    )[0]
    assert (indices == -1).all()


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_one_axis_windows_in_the_row_kernels(count_include_pad):
    # AveragePool over one axis at stride 2 runs in the 2-D row kernel as a window of height
    # 1 (family.rows_geometry; its units are whole rows: 8 rows to a region here); a
    # region's divisors there are still the whole call's. The last window ends past the
    # padded input (ceil_mode), where the last region's pads reach.
    x = np.random.default_rng(5).standard_normal((4, 8, 41)).astype(np.float32)
    attributes = dict(
        kernel_shape=[4], strides=[2], pads=[1, 1], ceil_mode=1, count_include_pad=count_include_pad
    )
    expected = numbapool.average_pool(x, **attributes)
    lazy = nd.average_pool(da.from_array(x, chunks=(2, 4, 9)), **attributes)
    assert_bitwise_equal(np.asarray(lazy.compute(scheduler="synchronous")), expected)


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_leading_single_tap_axes_merged_in_regions(count_include_pad):
    # a window of one tap along its leading axis runs over the other two, that axis merged
    # into the channels (_plan.channels_merged_plan); a region's divisors there are still
    # the whole call's
    # both axes' last windows end past the padded input (ceil_mode), where the last
    # regions' pads reach
    x = np.random.default_rng(6).standard_normal((2, 3, 4, 11, 10)).astype(np.float32)
    attributes = dict(
        kernel_shape=[1, 3, 3],
        strides=[1, 2, 2],
        pads=[0, 1, 1, 0, 0, 1],
        ceil_mode=1,
        count_include_pad=count_include_pad,
    )
    expected = numbapool.average_pool(x, **attributes)
    lazy = nd.average_pool(da.from_array(x, chunks=(1, 2, 3, 4, 5)), **attributes)
    assert_bitwise_equal(np.asarray(lazy.compute(scheduler="synchronous")), expected)


def _record_task_threads():
    """Make each numbapool call in this process note the thread count it runs with."""
    from numbapool import _dispatch

    if hasattr(_dispatch, "_task_threads"):
        _dispatch._task_threads.clear()
        return
    _dispatch._task_threads = []
    for name in ("run_window", "run_global"):
        original = getattr(_dispatch, name)

        def recording(*args, original=original, **kwargs):
            _dispatch._task_threads.append(numbapool.get_num_threads())
            return original(*args, **kwargs)

        setattr(_dispatch, name, recording)


def _task_threads():
    from numbapool import _dispatch

    return list(_dispatch._task_threads)


@pytest.mark.parametrize("threads", [1, 2, None])
def test_tasks_run_on_one_thread_unless_told(client, threads):
    """Each task's numbapool call runs on 1 thread by default (the worker's thread), on
    ``threads`` when given, and on the worker process's own setting with None."""
    workers_default = client.run(numbapool.get_num_threads)
    if threads == 2 and min(workers_default.values()) < 2:
        pytest.skip("needs NUMBA_NUM_THREADS >= 2 in the workers")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    dx = da.from_array(x, chunks=(1, 3, 6, 6))
    client.run(lambda: _record_task_threads())
    keywords = {} if threads == 1 else {"threads": threads}
    y = nd.max_pool(dx, [3, 3], strides=[2, 2], **keywords).compute()
    g = nd.global_max_pool(dx, **keywords).compute()
    assert_bitwise_equal(y, numbapool.max_pool(x, [3, 3], strides=[2, 2]))
    assert_bitwise_equal(g, numbapool.global_max_pool(x))
    seen = client.run(lambda: _task_threads())
    counts = [count for worker_counts in seen.values() for count in worker_counts]
    assert len(counts) >= 8  # 8 regions, and global maxima's pieces
    for address, worker_counts in seen.items():
        expected = workers_default[address] if threads is None else threads
        assert set(worker_counts) <= {expected}


def test_task_threads_checked_at_call_time():
    x = da.ones((1, 1, 8, 8), chunks=4, dtype=np.float32)
    with pytest.raises(ValueError, match="thread count"):
        nd.max_pool(x, [2, 2], threads=0)
    with pytest.raises(TypeError, match="thread count"):
        nd.global_average_pool(x, threads=1.5)
