"""Threads, thread counts, forked children and processes sharing one cache directory."""

import concurrent.futures
import errno
import itertools
import multiprocessing
import os
import subprocess
import sys
import time

import numba
import numpy as np
import pytest
from reference import pool

import numbapool
from numbapool import _cache, _numba
from numbapool._kernels.threads import use_threads

RNG = np.random.default_rng(5)
# Big enough for the parallel kernels (more than 2**15 output-taps).
X = RNG.standard_normal((2, 8, 48, 48)).astype(np.float32)

CALLS = {
    "max_pool": lambda x: numbapool.max_pool(
        x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1], return_indices=True
    ),
    "average_pool": lambda x: numbapool.average_pool(x, [3, 3], pads=[1, 1, 1, 1]),
    "lp_pool": lambda x: numbapool.lp_pool(x, [2, 3], p=3),
    "global_max_pool": numbapool.global_max_pool,
    "global_average_pool": numbapool.global_average_pool,
}


def results(x=X):
    out = {}
    for name, call in CALLS.items():
        value = call(x)
        out[name] = value if isinstance(value, tuple) else (value,)
    return out


def assert_same(got, expected):
    assert got.keys() == expected.keys()
    for name in expected:
        for a, b in zip(got[name], expected[name]):
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_results_do_not_depend_on_the_thread_count():
    with numbapool.threads(1):
        serial = results()
    assert_same(results(), serial)
    y = pool("AveragePool", X.astype(np.float64), [3, 3], pads=[1, 1, 1, 1])
    np.testing.assert_allclose(serial["average_pool"][0], y, rtol=1e-6, atol=1e-6)


def test_threads_block_and_program_setting():
    numba_before = numba.get_num_threads()
    limit = numba.config.NUMBA_NUM_THREADS
    with numbapool.threads(1):
        assert numbapool.get_num_threads() == 1
        numbapool.max_pool(X, [3, 3])
        assert numba.get_num_threads() == numba_before  # numba's own setting is left alone
    try:
        numbapool.set_num_threads(1)
        assert numbapool.get_num_threads() == 1
        with numbapool.threads(limit):  # a block overrides the program setting
            assert numbapool.get_num_threads() == limit
        with concurrent.futures.ThreadPoolExecutor(1) as pool_:  # and it holds in other threads
            assert pool_.submit(numbapool.get_num_threads).result() == 1
    finally:
        numbapool.set_num_threads(None)
    assert numbapool.get_num_threads() == numba.get_num_threads()


@numba.njit(parallel=True)
def _thread_ids_on(threads, n):
    """Which numba threads run a prange loop of n steps inside a kernel that asks for
    ``threads`` as numbapool's parallel kernels do, the thread count in force in each step,
    and numba's count after it."""
    before = use_threads(threads)
    ids = np.zeros(n, np.int64)
    counts = np.zeros(n, np.int64)
    for i in numba.prange(n):
        ids[i] = numba.get_thread_id()
        counts[i] = numba.get_num_threads()
    use_threads(before)
    return ids, counts, numba.get_num_threads()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_a_parallel_kernel_runs_on_the_count_it_is_given_and_restores_numbas():
    # Under TBB a step goes to whichever thread is free, the calling thread included, so
    # which threads run steps is the scheduler's; the count in force in each is the kernel's
    numba_before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        ids, counts, after = _thread_ids_on(2, 10_000)
        assert set(ids) <= {0, 1} and set(counts) == {2} and after == 1
        numba.set_num_threads(2)
        ids, counts, after = _thread_ids_on(1, 10_000)
        assert set(ids) == {0} and set(counts) == {1} and after == 2
        numba.set_num_threads(1)
        with numbapool.threads(2):  # and numbapool's calls leave numba's setting alone
            np.testing.assert_array_equal(
                numbapool.global_average_pool(X), results()["global_average_pool"][0]
            )
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(numba_before)


@pytest.mark.parametrize(
    "bad, error", [(0, ValueError), (10**6, ValueError), ("2", TypeError), (1.5, TypeError)]
)
def test_bad_thread_counts_name_the_value(bad, error):
    with pytest.raises(error, match=repr(bad) if error is TypeError else str(bad)):
        numbapool.set_num_threads(bad)
    with pytest.raises(error):
        with numbapool.threads(bad):
            pass


def test_many_python_threads_at_once():
    expected = results()
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        futures = [executor.submit(results) for _ in range(24)]
        for future in futures:
            assert_same(future.result(timeout=600), expected)


def _child_results(queue):
    queue.put({name: [np.asarray(a) for a in value] for name, value in results().items()})


def _multiprocessing_child_results() -> dict:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_results, args=(queue,))
    child.start()
    got = queue.get(timeout=600)
    child.join(60)
    assert child.exitcode == 0
    return {k: tuple(v) for k, v in got.items()}


def _forked_child_results() -> dict:
    """results() in a child forked from the calling thread (os.fork: multiprocessing's
    child, forked from a thread other than the main one, exits with 1 after its target
    returns, whatever numbapool does)."""
    import pickle

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its results down the pipe, then out without cleanup
        status = 1
        try:
            os.close(read_end)
            got = {name: [np.asarray(a) for a in value] for name, value in results().items()}
            with os.fdopen(write_end, "wb") as pipe:
                pickle.dump(got, pipe)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return {k: tuple(v) for k, v in pickle.loads(data).items()}


@pytest.mark.parametrize("forking_thread", ["main", "another"])
def test_forked_child_after_parallel_use_gets_right_answers(forking_thread):
    """A child forked after its parent ran parallel regions, from the main thread or
    another (where numba's TBB layer cannot shut its workers down first), gets the right
    answers, in parallel regions or serially."""
    expected = results()  # the parent has run parallel regions
    if forking_thread == "main":  # as multiprocessing's default start method on Linux
        got = _multiprocessing_child_results()
    else:
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            got = executor.submit(_forked_child_results).result(timeout=900)
    assert_same(got, expected)


_SCRIPT = """
import concurrent.futures, sys, numpy as np, numbapool
x = np.random.default_rng(5).standard_normal((2, 8, 48, 48)).astype(np.float32)
def call():
    return numbapool.max_pool(x, [3, 3], pads=[1, 1, 1, 1], return_indices=True)
with concurrent.futures.ThreadPoolExecutor(int(sys.argv[1])) as executor:
    outs = [f.result() for f in [executor.submit(call) for _ in range(16)]]
y, i = outs[0]
assert all((o[0] == y).all() and (o[1] == i).all() for o in outs)
print(float(y.sum()), int(i.sum()))
"""


@pytest.mark.parametrize(
    "setting",
    [
        {"NUMBA_THREADING_LAYER": "workqueue"},  # asked for by name
        {"NUMBA_THREADING_LAYER_PRIORITY": "workqueue omp tbb"},  # chosen by default, as where
    ],
)  # neither OpenMP nor TBB exists
def test_workqueue_layer_does_not_abort_under_threads(setting):
    env = {**os.environ, **setting}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, "4"], capture_output=True, text=True, env=env, timeout=900
    )
    assert result.returncode == 0, result.stderr
    y, i = numbapool.max_pool(X, [3, 3], pads=[1, 1, 1, 1], return_indices=True)
    assert result.stdout.split() == [str(float(y.sum())), str(int(i.sum()))]


# Parallel-size calls of three kernel families, in processes that share one cache
_CACHE_SCRIPT = """
import numpy as np, numbapool
x = np.random.default_rng(5).standard_normal((2, 8, 48, 48)).astype(np.float32)
y, i = numbapool.max_pool(x, [3, 3], pads=[1, 1, 1, 1], return_indices=True)
outs = [y, i, numbapool.max_pool(x, [3, 3], strides=[2, 2]), numbapool.global_max_pool(x)]
print([float(o.astype(np.float64).sum()) for o in outs])
"""


def _four_processes(cache_dir) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _CACHE_SCRIPT],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=900) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
    assert len({stdout for stdout, _ in outputs}) == 1
    return outputs[0][0]


def test_four_processes_on_one_empty_cache_then_on_it_warm(tmp_path):
    cache = tmp_path / "cache"
    first = _four_processes(cache)  # all four compile and write at once
    assert any(name.endswith(".nbc") for _, _, files in os.walk(cache) for name in files)
    assert _four_processes(cache) == first  # all four load at once
    y, i = numbapool.max_pool(X, [3, 3], pads=[1, 1, 1, 1], return_indices=True)
    expected = [y, i, numbapool.max_pool(X, [3, 3], strides=[2, 2]), numbapool.global_max_pool(X)]
    assert first.strip() == str([float(o.astype(np.float64).sum()) for o in expected])


# Entries saved to one kernel's disk cache by several processes at the same moment: each
# waits for a start time, then saves entries of its own, keys and data naming it; then one
# process loads every entry.
_SAVE_SCRIPT = """
import sys, time
from numbapool import _numba
from numbapool._kernels import maxima
index = _numba.locked_cache(maxima.max_pool_units_with_indices.py_func)._cache_file
process, start, count = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
while time.time() < start:
    pass
if process >= 0:
    for entry in range(count):
        index.save(("entry", process, entry), ("data", process, entry))
else:  # how many entries of the processes 0 to -process - 1 do not load as saved
    keys = [("entry", p, e) for p in range(-process) for e in range(count)]
    print(sum(index.load(key) != ("data",) + key[1:] for key in keys))
"""


def test_processes_saving_to_one_kernel_at_once_lose_no_entry(tmp_path):
    # numba rewrites a function's whole index per save: unlocked, processes saving at once
    # drop each other's entries, or number their data files alike
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    processes, count = 4, 40

    def run(process, start):
        return subprocess.Popen(
            [sys.executable, "-c", _SAVE_SCRIPT, str(process), str(start), str(count)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    start = time.time() + 3  # every saver started and waiting by then
    savers = [run(process, start) for process in range(processes)]
    for saver in savers:
        _, stderr = saver.communicate(timeout=600)
        assert saver.returncode == 0, stderr
    out, stderr = run(-processes, 0).communicate(timeout=600)
    assert out.strip() == "0", stderr


def test_a_file_system_without_locks_still_saves(tmp_path, monkeypatch):
    # some network file systems refuse locks: the save goes on unlocked, as numba's does
    def refuse(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_cache.fcntl, "flock", refuse)
    index = _numba._LockedIndex(str(tmp_path), "kernel-1.py311", ("a source stamp",))
    index.save(("a key",), ("its data",))
    assert index.load(("a key",)) == ("its data",)


_LAYER_SCRIPT = """
import numba, numpy as np, numbapool
x = np.random.default_rng(5).standard_normal((2, 8, 48, 48)).astype(np.float32)
y = numbapool.max_pool(x, [3, 3], strides=[2, 2])
numba.get_num_threads()  # starts numba's layer, which numbapool's pool (Linux) does not
print(numbapool._threads.threading_layer(), float(y.astype(np.float64).sum()))
"""


def _tbb_installed() -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution("tbb")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize(
    "requested, expected",
    [
        (None, "tbb"),  # numba's default choice, TBB first, takes the tbb wheel's library
        ("omp", "omp"),  # a layer asked for by name is left as asked
    ],
)
def test_tbb_layer_where_the_tbb_wheel_is_installed(requested, expected):
    """Where the ``tbb`` wheel is installed (a dependency on the platforms it is built
    for), numba's default threading layer is TBB, whose scheduler keeps a call from
    waiting on a thread that lost its core (it runs numbapool's parallel calls off
    Linux); a layer named in NUMBA_THREADING_LAYER wins."""
    if not _tbb_installed():
        pytest.skip("no tbb wheel for this platform (pyproject.toml's markers)")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY")
    }
    if requested:
        env["NUMBA_THREADING_LAYER"] = requested
    result = subprocess.run(
        [sys.executable, "-c", _LAYER_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert result.returncode == 0, result.stderr
    layer, total = result.stdout.split()
    assert layer == expected
    y = numbapool.max_pool(X, [3, 3], strides=[2, 2])
    assert total == str(float(y.astype(np.float64).sum()))


def _paced_calls(pace, calls: int, parallel: float, serial: float) -> list:
    """Whether each of ``calls`` calls of ``pace`` ran serially, each way's run taking the
    seconds given."""
    ways = []
    for _ in range(calls):
        way = pace.serial_now()
        ways.append(way)
        pace.record(way, serial if way else parallel)
    return ways


def _stretches(ways: list) -> list:
    """(way, how many calls in a row) for each stretch of calls that ran one way."""
    return [(way, len(list(calls))) for way, calls in itertools.groupby(ways)]


def test_the_threads_are_probed_once_the_calling_threads_runs_add_up_to_a_tenth_second():
    # however many calls that is: a load that lasted long enough for the probes' interval
    # to grow to its longest (PROBE_EVERY * 16 calls) no longer keeps a launch on the
    # calling thread for that many calls once it has passed
    from numbapool import _threads

    every = _threads.PROBE_EVERY
    serial = _threads.PACE_LIMIT / 2 / 10  # 1 ms, paced on 2 threads
    quiet, busy = serial / 2, 3 * serial
    pace = _threads.Pace(2)
    _paced_calls(pace, 40, quiet, serial)
    loaded = _paced_calls(pace, 40 * every, busy, serial)
    # under the load, the threads ran once the calling thread's runs since their last had
    # taken _PROBE_SECONDS: two runs (the first not counted) per that many serial calls
    between = round(_threads._PROBE_SECONDS / serial)
    probes = _stretches(loaded[loaded.index(True) :])
    assert all(way or calls == 2 for way, calls in probes)
    assert all(calls <= between for way, calls in probes if way)
    assert loaded.count(False) <= 2 * len(loaded) / between + 10
    # the load passes: the threads take the calls back within that many calls
    ways = _paced_calls(pace, 4 * between, quiet, serial)
    assert ways.index(False) <= between
    assert ways[-between:].count(True) <= 2  # a probe of the calling thread at most


def test_a_launch_runs_the_way_that_has_been_faster_and_probes_the_other():
    # _threads.Pace, fed times rather than timed: parallel runs first, then serial ones,
    # then the faster by the median of its last runs (one slow run does not decide), and
    # the other way once every PROBE_EVERY calls, or at once when the load changes; the
    # first run after a change of way is not counted, and the way runs again; a launch
    # whose parallel runs are long stays parallel
    from numbapool import _threads

    every = _threads.PROBE_EVERY
    # runs short enough that the calling thread's runs between probes here stay under
    # _PROBE_SECONDS (the next test)
    short = _threads._PROBE_SECONDS / (16 * every)
    # a serial run counts at _SERIAL_WEIGHT of its time: these serial runs count as short
    serial = short / _threads._SERIAL_WEIGHT
    pace = _threads.Pace(2)
    # a busy machine: parallel runs take twice the serial time (a lead of 1). The serial
    # runs beat the first parallel ones, which may have paid for starting up, so parallel
    # runs again at once; then PROBE_EVERY calls times 2, 4, ... later, as each of its
    # runs loses. Each way runs twice after a change of way, the first run not counted,
    # but a way's first run
    ways = _paced_calls(
        pace, 5 + 1 + 2 + (2 * every - 1) + 2 + (4 * every - 1) + 2, 2 * short, serial
    )
    assert _stretches(ways) == [
        (False, 5),
        (True, 1),
        (False, 2),
        (True, 2 * every - 1),
        (False, 2),
        (True, 4 * every - 1),
        (False, 2),
    ]
    # parallel runs five times the serial time: a lead of 4, a probe after 4 PROBE_EVERY
    # calls (times 2 after the loss above), so that probing costs the same part of the
    # launch's time
    wide = _threads.Pace(2)
    ways = _paced_calls(wide, 5 + 1 + 2 + (8 * every - 1) + 2, 5 * short, serial)
    assert _stretches(ways) == [
        (False, 5),
        (True, 1),
        (False, 2),
        (True, 8 * every - 1),
        (False, 2),
    ]
    # the machine goes quiet: parallel runs take half the serial time; the next probe
    # (8 PROBE_EVERY calls after the last) wins, the runs that follow it win too, and the
    # threads are back for good
    ways = _paced_calls(pace, 8 * every + 20, short / 2, serial)
    (way, before), (after, _) = _stretches(ways)
    assert way and before < 8 * every and not after
    assert pace.medians[0] < pace.medians[1]
    _paced_calls(pace, 1, 300 * short, serial)  # one slow parallel run
    assert _paced_calls(pace, 10, short / 2, serial) == [False] * 10
    # load comes back: the parallel runs slow to 0.9 of the serial time measured before,
    # while the serial runs now take 0.6 of it; the chosen way's slowing sends the next
    # calls to the calling thread, long before the next probe, which keeps them but for
    # probes of the threads PROBE_EVERY / 32 calls after the change (times the lead, 1
    # here), then twice that, each probe two runs
    ways = _paced_calls(pace, 40, 0.9 * short, 0.6 * short)
    assert ways.index(True) <= 5
    early = every >> _threads._EARLY_HALVINGS
    assert _stretches(ways[ways.index(True) :])[1:4] == [
        (False, 2),
        (True, 2 * early - 1),
        (False, 2),
    ]
    # parallel runs only a little faster than serial ones (0.95 of their time) do not win
    # the calls: under load their stalls do not show in a median
    close = _threads.Pace(2)
    assert _paced_calls(close, 20, 0.95 * short, short)[-10:] == [True] * 10
    # the first parallel runs paid for starting up: three of five took longer than a serial
    # run, the parallel runs after them half its time; the threads take the calls back
    # within a few calls
    starting = _threads.Pace(2)
    ways, parallel_runs = [], 0
    for _ in range(60):
        way = starting.serial_now()
        parallel_runs += not way
        starting.record(way, serial if way else (3 * short if parallel_runs <= 3 else short / 2))
        ways.append(way)
    assert ways[-40:].count(True) <= 2  # a probe of the calling thread at most
    # a passing load sends a quiet launch to the calling thread; once it has passed, the
    # threads take the calls back within a quarter of PROBE_EVERY calls (the probes after
    # the change, PROBE_EVERY / 32 calls times the lead and then twice that), not
    # PROBE_EVERY times the lead
    passing = _threads.Pace(2)
    _paced_calls(passing, 40, short / 2, serial)
    assert _paced_calls(passing, 20, 3 * short, serial)[5:15] == [True] * 10
    ways = _paced_calls(passing, every // 2, short / 2, serial)
    assert ways.index(False) <= every // 4 and ways[-10:] == [False] * 10
    # a burst's first calls after idle time (caches and workers cold): three parallel runs
    # take three times a serial run and send a quiet launch to the calling thread; the
    # threads win the calls back at their first probe, and the calling thread is next
    # probed PROBE_EVERY calls later (times the lead, 1 here), not an eighth of that
    bursting = _threads.Pace(2)
    _paced_calls(bursting, 40, short / 2, serial)
    slow = iter([3 * short] * 3)
    ways = []
    for _ in range(2 * every):
        way = bursting.serial_now()
        bursting.record(way, serial if way else next(slow, short / 2))
        ways.append(way)
    stretches = _stretches(ways)
    assert stretches[0] == (False, 3) and stretches[1][0]
    assert stretches[1][1] <= 3 * early  # the calling thread's calls, times the lead (2)
    assert not stretches[2][0] and stretches[2][1] >= every
    # a parallel run after serial ones wakes the workers and takes longer than a serial
    # run; the parallel runs after it take half the serial time: the threads win the calls
    waking = _threads.Pace(2)
    _paced_calls(waking, 6, 3 * short, serial)  # a busy start: the calling thread chosen
    ways, last = [], True
    for _ in range(4 * every):
        way = waking.serial_now()
        waking.record(way, serial if way else (1.5 if last else 0.5) * short)
        ways.append(last := way)
    assert ways[-2 * every :].count(True) <= 4  # two probes of the calling thread at most

    long = _threads.Pace(2)
    for _ in range(3 * _threads.PROBE_EVERY):
        assert not long.serial_now()
        long.record(False, _threads.PACE_LIMIT)
    # the limit is on the parallel time times the thread count, which bounds a serial run:
    # runs of a tenth of it are paced on 2 threads, not on 16
    tenth = _threads.PACE_LIMIT / 10
    assert _paced_calls(_threads.Pace(2), 6, tenth, tenth / 2)[5:] == [True]
    assert _paced_calls(_threads.Pace(16), 6, tenth, tenth / 2) == [False] * 6
    # a short launch stays paced when load makes its parallel runs longer than the limit
    busy = _threads.Pace(2)
    for number in range(3 * _threads.PROBE_EVERY):
        serial = busy.serial_now()
        slow = 10 * _threads.PACE_LIMIT if number >= 20 else short / 2
        busy.record(serial, short if serial else slow)
    assert busy.serial_now()
