"""numbapool's pool of threads (_kernels/pool.py): every run of a call runs once, on the
calling thread or a worker, whatever the thread count, the number of runs, other threads'
calls, forks and exits; an error in a run is reported and leaves the pool working."""

import concurrent.futures
import os
import subprocess
import sys

import ml_dtypes
import numba
import numpy as np
import pytest
from numba import types

import numbapool
from numbapool import _dispatch, _numba, _threads
from numbapool._kernels import parallel, pool

pytestmark = pytest.mark.skipif(
    not pool.available, reason="numbapool's pool runs on Linux (x86-64 and AArch64) only"
)

_NO_BYTES = np.frombuffer(b"", np.uint8)


@numba.njit
def _count_units(begin, end, block, counts, unused_1, unused_2, unused_3):
    """A trampoline as the pool calls one (parallel._TRAMPOLINE_ARGUMENTS): adds 1 to
    counts[unit] for each unit of [begin, end); raises where a unit is the block's second
    number (the first is the number of counts)."""
    header = numba.carray(block, 2, np.int64)
    numbers = numba.carray(counts, header[0], np.int64)
    for unit in range(begin, end):
        if unit == header[1]:
            raise ValueError("a unit that raises")
        numbers[unit] += 1


def _trampoline() -> int:
    signature = (types.int64, types.int64) + (types.voidptr,) * 5
    _count_units.compile(signature)
    return _numba.compiled_overload(_count_units, signature)[1]


@pytest.fixture(scope="module")
def address():
    pool.compile_runner()
    return _trampoline()


def _counts_after(address, first, units, runs, threads, raising_unit=-1) -> np.ndarray:
    counts = np.zeros(units + 1, np.int64)
    block = np.frombuffer(np.array([units + 1, raising_unit], np.int64).tobytes(), np.uint8)
    call_arrays = (counts.view(np.uint8), _NO_BYTES, _NO_BYTES, _NO_BYTES)
    pool.run(address, first, units, runs, threads, block, call_arrays)
    return counts


def test_every_unit_runs_once_whatever_the_runs_and_threads(address):
    rng = np.random.default_rng(3)
    for _ in range(300):
        units = int(rng.integers(1, 2000))
        first = int(rng.integers(0, units))
        runs = int(rng.integers(1, min(units - first, 200) + 1))
        threads = int(rng.integers(1, 5))
        counts = _counts_after(address, first, units, runs, threads)
        expected = np.zeros(units + 1, np.int64)
        expected[first:units] = 1
        np.testing.assert_array_equal(counts, expected, err_msg=f"{first, units, runs, threads}")


def test_calls_from_several_threads_at_once_each_run_every_unit_once(address):
    """One call has the pool at a time; the others run their units on their own threads."""

    def calls(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            units = int(rng.integers(64, 4000))
            counts = _counts_after(address, 0, units, 32, 2)
            assert counts[:units].min() == counts[:units].max() == 1 and counts[units] == 0

    with concurrent.futures.ThreadPoolExecutor(4) as executor:
        for future in [executor.submit(calls, seed) for seed in range(8)]:
            future.result(timeout=600)


@numba.njit
def _count_calls(begin, end, block, counts, calls, unused_2, unused_3):
    """A trampoline that adds 1 to counts[unit] for each unit of [begin, end) and to
    calls[begin]: one mark per call of the kernel, each call starting at its own unit."""
    header = numba.carray(block, 2, np.int64)
    numbers = numba.carray(counts, header[0], np.int64)
    starts = numba.carray(calls, header[0], np.int64)
    starts[begin] += 1
    for unit in range(begin, end):
        numbers[unit] += 1


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_a_claim_takes_several_runs_while_many_are_left(address, threads):
    # each call of a kernel pays for its scratch and first rows: 256 runs of one unit on
    # up to 4 threads take far fewer calls than runs, one call on a thread of its own
    signature = (types.int64, types.int64) + (types.voidptr,) * 5
    _count_calls.compile(signature)
    counting = _numba.compiled_overload(_count_calls, signature)[1]
    units = 256
    for _ in range(20):
        counts, calls = np.zeros(units + 1, np.int64), np.zeros(units + 1, np.int64)
        block = np.frombuffer(np.array([units + 1, -1], np.int64).tobytes(), np.uint8)
        arrays = (counts.view(np.uint8), calls.view(np.uint8), _NO_BYTES, _NO_BYTES)
        pool.run(counting, 0, units, units, threads, block, arrays)
        assert counts[:units].min() == counts[:units].max() == 1 and counts[units] == 0
        assert calls.max() == 1
        if threads == 1:
            assert calls.sum() == 1
        else:
            assert 1 < calls.sum() <= units // 4


def test_a_run_that_raises_is_reported_and_the_pool_goes_on(address):
    for raising_unit in (0, 999):  # a run of the calling thread's, a run of a worker's
        with pytest.raises(RuntimeError, match="a kernel raised on a pool thread"):
            _counts_after(address, 0, 1000, 16, 2, raising_unit)
    counts = _counts_after(address, 0, 1000, 16, 2)
    assert counts[:1000].min() == counts[:1000].max() == 1


_FORK_AND_EXIT = """
import os, sys, time
import numpy as np
import numbapool
from numbapool._kernels import parallel, pool
x = np.random.default_rng(0).standard_normal((2, 64, 32, 32)).astype(np.float32)
with numbapool.threads(1):
    expected = numbapool.global_average_pool(x)
with numbapool.threads(2):
    numbapool.global_average_pool(x)
    parallel.wait_for_drivers()
    assert np.array_equal(numbapool.global_average_pool(x), expected)
parent_workers = len(pool._pool.workers)
pid = os.fork()
if pid == 0:
    status = 1
    try:
        with numbapool.threads(2):
            same = all(np.array_equal(numbapool.global_average_pool(x), expected)
                       for _ in range(100))
        alive = [worker.is_alive() for worker in pool._pool.workers]
        status = 0 if same and alive == [True] else 2
    finally:
        os._exit(status)
_, status = os.waitpid(pid, 0)
print(parent_workers, os.waitstatus_to_exitcode(status))
if sys.argv[1] == "asleep":
    time.sleep(0.2)
"""


@pytest.mark.parametrize("workers", ["spinning", "asleep"])
def test_a_forked_child_has_workers_of_its_own_and_processes_exit(workers):
    """A child forked after parallel calls makes its own pool and gets the same results; a
    process exits at once whether its workers spin or sleep."""
    result = subprocess.run(
        [sys.executable, "-c", _FORK_AND_EXIT, workers],
        env={**os.environ, "NUMBA_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "0"]


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_the_parallel_driver_here_is_the_pool():
    x = np.random.default_rng(1).standard_normal((2, 64, 32, 32)).astype(np.float32)
    with numbapool.threads(2):
        numbapool.global_average_pool(x)
        parallel.wait_for_drivers()
        numbapool.global_average_pool(x)
    assert parallel.driver_kernels() == (pool.run_call, pool.work)
    assert pool._pool is not None and len(pool._pool.workers) >= 1


GLOBAL_CALLS = {
    "GlobalAveragePool": numbapool.global_average_pool,
    "GlobalMaxPool": numbapool.global_max_pool,
    "GlobalLpPool": lambda x: numbapool.global_lp_pool(x, p=3),
}


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
@pytest.mark.parametrize("op", GLOBAL_CALLS)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_repeated_global_calls_on_the_pool_give_the_serial_bits(op, dtype, monkeypatch):
    """After its first parallel call a global pool's launch runs through its call on the
    pool (_dispatch._pooled_global): its results, parallel or on the calling thread as the
    pace chooses, and a non-contiguous input's, which takes the general path, are the
    serial ones bit for bit."""
    call = GLOBAL_CALLS[op]
    x = np.random.default_rng(2).standard_normal((2, 64, 32, 32)).astype(dtype)
    with numbapool.threads(1):
        expected = call(x)
        expected_reversed = call(x[..., ::-1])
    with numbapool.threads(2):
        results = [call(x)]
        parallel.wait_for_drivers()  # where the first call left its driver to compile
        results += [call(x) for _ in range(3)]
        assert (
            2
            in _dispatch._GLOBAL_CALLS[
                op, x.shape, x.dtype, 3.0 if op == "GlobalLpPool" else 2.0
            ].compiled
        )
        monkeypatch.setattr(_threads.Pace, "serial_now", lambda self: True)
        results.append(call(x))
        results.append(call(x[..., ::-1]))
    for result in results[:-1]:
        assert result.tobytes() == expected.tobytes()
    assert results[-1].tobytes() == expected_reversed.tobytes()
