"""A warm disk cache is complete: a fresh process that makes the calls an earlier process
made compiles nothing and writes nothing to the cache.

The calls: ``numbapool.warmup`` of every operator in float32 (every kind of kernel the
dispatcher chooses, each at a serial and a parallel size, the global pools on one thread
too, and the dask sums' kernels), and in every other dtype a 3x3 stride-2 MaxPool (an
input-rows-first kind), a GlobalMaxPool and a GlobalAveragePool at both sizes; every kind
in every dtype would take more than the suite's whole budget to compile. The first calls
run in two processes at once, one per kernel family, and a third process makes them all;
they share a cache directory of their own, empty before the first (the suite's own is
filled meanwhile by the other tests). In each process, every scratch array the kernels
allocated is freed by the time the calls end (numba's runtime counts them).
"""

import json
import os
import subprocess
import sys

import pytest

from numbapool._kernels import parallel

# The names of the kernels that make the parallel driver here
DRIVER = {kernel.py_func.__name__ for kernel in parallel.driver_kernels()}
# numba announces every compilation that its disk cache did not spare ("numba:compile"):
# the function's name, and whether it has a disk cache to write to. The start of each
# script below.
_RECORDER = """
import json
from numba.core import event

compiled = []


class Record(event.Listener):
    def on_start(self, compilation):
        dispatcher = compilation.data["dispatcher"]
        # whether it has a disk cache: numba's own overloads compile inside the process only
        writes = type(dispatcher._cache).__name__ != "NullCache"
        compiled.append((dispatcher.py_func.__qualname__, writes))

    def on_end(self, compilation):
        pass


event.register("numba:compile", Record())
"""

_RECORD_COMPILES = (
    _RECORDER
    + """
import sys
import numpy as np
import numbapool
from numbapool import _warmup
from numbapool._kernels import parallel

groups = sys.argv[1:]
ops = {"maxima": ["MaxPool", "MaxUnpool", "GlobalMaxPool"],
       "sums": ["AveragePool", "LpPool", "GlobalAveragePool", "GlobalLpPool"]}
numbapool.warmup([op for group in groups for op in ops[group]], dtypes=["float32"],
                 progress=False, processes=1)
for name, dtype in _warmup.DTYPE_NAMES.items():
    floating = dtype.kind == "f" or name == "bfloat16"
    for side in (4, 128):
        x = np.zeros((1, 4, side, side), dtype)
        if "maxima" in groups:
            numbapool.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
            if floating:
                numbapool.global_max_pool(x)
        if "sums" in groups and floating:
            numbapool.global_average_pool(x)
# the parallel drivers that compile in the background, done (a process waits at exit too)
parallel.wait_for_drivers()
# the kernels' scratch arrays, allocated through numba's runtime and freed by the kernels'
# own code (_kernels/scratch.py), counted with NUMBA_NRT_STATS set
from numba.core.runtime import rtsys
stats = rtsys.get_allocation_stats()
# numba refreshes its target context before every compile (and before its own cache's
# loads, which numbapool's cache skips): the refresh imports numba.np.linalg, and with it
# scipy.linalg where scipy is installed
print(json.dumps({"compiled": compiled, "refreshed": "numba.np.linalg" in sys.modules,
                  "allocated": stats.mi_alloc, "unfreed": stats.mi_alloc - stats.mi_free}))
"""
)


def _cache_files(cache=None) -> dict:
    """Every file in the cache directory (NUMBA_CACHE_DIR's by default): its size and
    modification time."""
    files = {}
    for directory, _, names in os.walk(cache or os.environ["NUMBA_CACHE_DIR"]):
        for name in names:
            status = os.stat(os.path.join(directory, name))
            files[os.path.join(directory, name)] = (status.st_size, status.st_mtime_ns)
    return files


def _start(*groups) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _RECORD_COMPILES, *groups],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen) -> dict:
    """The process's record, once every scratch array its kernels allocated is found
    freed."""
    out, err = process.communicate(timeout=1800)
    assert process.returncode == 0, err
    record = json.loads(out.splitlines()[-1])
    assert record.pop("allocated") > 0 and record.pop("unfreed") == 0, out
    return record


def test_a_second_process_compiles_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))  # the processes below inherit it
    monkeypatch.setenv("NUMBA_NRT_STATS", "1")  # their scratch arrays counted (_finish)
    assert not _cache_files(), "the first processes must meet an empty cache"
    # Two first processes at once, one per kernel family (one per core here); the parallel
    # driver is all they share, and both may compile it and save it, in turns
    # (_numba.locked_cache)
    records = [_finish(process) for process in [_start("maxima"), _start("sums")]]
    maxima, sums = ({name for name, writes in record["compiled"] if writes} for record in records)
    assert maxima & sums <= DRIVER
    # one parallel driver serves every kernel, dtype and launch (parallel.BlockCall)
    for record in records:
        compiled = [name for name, _ in record["compiled"]]
        assert all(compiled.count(name) <= 1 for name in DRIVER)
    # the parallel driver and the kernels it calls are among what they compiled
    assert (
        DRIVER
        | {
            "max_pool_units_with_indices",
            "sum_pool_units",
            "global_max_units",
            "global_sum_units",
            "max_unpool",
            "column_units",
            "row_units",
            "fixed_max_units",
            "fixed_sum_units",
            "plane_sum_units",
            "wide_sum_units",
            "indexed_max_units",
            "max_plane_units",
            "block_sum_units",
        }
        <= maxima | sums
    )
    filled = _cache_files()
    assert filled
    # a process making every call of both compiles nothing and writes nothing, and loads
    # without numba's refresh of its whole target context (0.2 to 0.5 s of a first call)
    assert _finish(_start("maxima", "sums")) == {"compiled": [], "refreshed": False}
    assert _cache_files() == filled


_WARMUP = (
    _RECORDER
    + """
import sys
import numbapool
from numbapool._kernels import global_
numbapool.warmup(["GlobalAveragePool", "GlobalLpPool"], ["float32", "float64"],
                 progress=False, processes=int(sys.argv[1]), load=sys.argv[2] == "load")
# GlobalAveragePool's float32 kernel, a worker's task where there are workers
print(json.dumps([compiled, len(global_.block_sum_units.overloads)]))
"""
)


def _warmup_here(cache_dir, processes: int, load: str):
    """_WARMUP in a fresh process on ``cache_dir``: the kernels that process compiled and
    saved, and how many GlobalAveragePool float32 kernels it holds (loaded or compiled)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    result = subprocess.run(
        [sys.executable, "-c", _WARMUP, str(processes), load],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr
    compiled, loaded = json.loads(result.stdout.splitlines()[-1])
    return [name for name, writes in compiled if writes], loaded


@pytest.mark.parametrize("load, loaded", [("load", 1), ("skip", 0)])
def test_warmup_workers_leave_a_complete_cache(tmp_path, load, loaded):
    # The calling process runs one task (and compiles it: the cache is empty), two
    # workers the others at once, saving entries of the same kernels (the summing kernel
    # per dtype and kind of p, the parallel driver); the calling process loads each task's
    # kernels as its worker finishes it, or none of them with load=False (as `python -m
    # numbapool warmup`, a process that exits next).
    # A later process compiles nothing and writes nothing either way.
    compiled, held = _warmup_here(tmp_path, 2, load)
    assert "global_sum_units" in compiled and held == loaded
    filled = _cache_files(str(tmp_path))
    assert _warmup_here(tmp_path, 1, "load") == ([], 1)
    assert _cache_files(str(tmp_path)) == filled


_DRIVER_IN_BACKGROUND = (
    _RECORDER
    + """
import sys
import numpy as np
import numbapool
from numbapool._kernels import parallel

asked = []
if sys.argv[1:] == ["handover"]:  # the driver is ready once a first piece has run serially
    ready_driver = parallel.ready_driver

    def ready_after_a_piece():
        asked.append(True)
        if len(asked) > 1:
            parallel.wait_for_drivers()
        return ready_driver()

    parallel.ready_driver = ready_after_a_piece
x = np.random.default_rng(0).standard_normal((2, 16, 96, 96)).astype(np.float32)
first = numbapool.max_pool(x, [3, 3], strides=[2, 2])
compiling = [not future.done() for future in parallel._started()]
drivers_at_once = len(parallel.driver_kernels()[0].overloads)
parallel.wait_for_drivers()
through_driver = numbapool.max_pool(x, [3, 3], strides=[2, 2])
with numbapool.threads(1):
    serial = numbapool.max_pool(x, [3, 3], strides=[2, 2])
print(json.dumps({"compiling": compiling, "drivers": drivers_at_once, "asked": len(asked),
                  "same": bool(np.array_equal(first, through_driver)
                               and np.array_equal(first, serial)),
                  "compiled": sorted({name for name, _ in compiled})}))
"""
)


def _run_driver_script(cache, *args) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER_IN_BACKGROUND, *args],
        env={**os.environ, "NUMBA_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_a_first_call_leaves_its_driver_to_a_background_compile(tmp_path):
    """On an empty cache a parallel-size first call runs on the calling thread while its
    parallel driver compiles on a thread of its own; the next call runs through the
    driver, with the same result, and the process waits for the compile at exit: a second
    process loads the driver and compiles nothing."""
    first = _run_driver_script(tmp_path)
    assert first["compiling"] == [True] and first["drivers"] == 0 and first["same"]
    assert DRIVER <= set(first["compiled"])
    assert _run_driver_script(tmp_path) == {
        "compiling": [],
        "drivers": 1,
        "asked": 0,
        "same": True,
        "compiled": [],
    }


def test_a_first_call_hands_the_units_left_to_its_driver_once_compiled(tmp_path):
    """A first call runs its units on the calling thread a piece at a time while its
    driver compiles; once the driver is ready, it runs the rest: here after one piece.
    Every unit runs once: the result is the serial one (np.empty would show a gap)."""
    first = _run_driver_script(tmp_path, "handover")
    assert first["asked"] == 2 and first["compiling"] == [False] and first["drivers"] == 1
    assert first["same"] and DRIVER <= set(first["compiled"])


def test_a_call_at_interpreter_exit_compiles_its_driver_in_place(tmp_path):
    """No thread can start once the interpreter shuts down: a first call from an atexit
    handler compiles its driver before it runs, instead of failing."""
    script = (
        "import atexit\n"
        "import numpy as np\n"
        "import numbapool\n"
        "x = np.ones((2, 16, 96, 96), np.float32)\n"
        "atexit.register(lambda: print(numbapool.max_pool(x, [3, 3]).sum()))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
        timeout=600,
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert float(result.stdout) == 2 * 16 * 94 * 94


_FORK_WHILE_COMPILING = """
import os
import numpy as np
import numbapool
from numbapool._kernels import parallel

x = np.ones((2, 16, 96, 96), np.float32)
numbapool.max_pool(x, [3, 3])
assert any(not future.done() for future in parallel._started())
child = os.fork()
if child == 0:  # compiles a kernel of its own, which takes numba's compiler lock
    total = numbapool.average_pool(x, [2, 2], strides=[2, 2]).sum()
    os._exit(0 if total == x.size // 4 else 1)
_, status = os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_while_a_driver_compiles_leaves_a_working_child(tmp_path):
    """A fork copies numba's compiler lock as the background compile holds it: the fork
    waits for the compile, so that the child can compile too instead of waiting forever."""
    result = subprocess.run(
        [sys.executable, "-c", _FORK_WHILE_COMPILING],
        capture_output=True,
        text=True,
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0"]


_COLLECTOR_DURING_COMPILES = (
    _RECORDER
    + """
import gc
import threading
import numpy as np
import numbapool

collector_on = []  # at the start of each compile on the calling thread: is the collector on?


class Collector(event.Listener):
    def on_start(self, compilation):
        if threading.current_thread() is threading.main_thread():
            collector_on.append(gc.isenabled())

    def on_end(self, compilation):
        pass


event.register("numba:compile", Collector())
x = np.ones((2, 16, 20, 20), np.float32)
with numbapool.threads(1):
    numbapool.max_pool(x, [3, 3], strides=[2, 2])
    after_enabled = gc.isenabled()
    gc.disable()
    numbapool.average_pool(x, [2, 2], strides=[2, 2])
    after_disabled = gc.isenabled()
print(json.dumps({"during": collector_on, "after_enabled": after_enabled,
                  "after_disabled": after_disabled,
                  "kernels": sorted({name for name, writes in compiled if writes})}))
"""
)


def test_first_calls_pause_the_collector_while_their_kernels_compile(tmp_path):
    """On an empty cache a first call's kernel compiles with Python's garbage collector
    paused, and the collector is left as it was: on again after a call that found it on,
    still off after one that found it off."""
    result = subprocess.run(
        [sys.executable, "-c", _COLLECTOR_DURING_COMPILES],
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    recorded = json.loads(result.stdout.splitlines()[-1])
    assert {"row_units", "fixed_sum_units"} <= set(recorded["kernels"])
    assert recorded["during"] and not any(recorded["during"])
    assert recorded["after_enabled"] is True and recorded["after_disabled"] is False


def test_the_collector_pause_nests_and_restores_the_state_it_found():
    import gc

    from numbapool._kernels import collector_paused

    was_enabled = gc.isenabled()
    try:
        gc.enable()
        with collector_paused():
            assert not gc.isenabled()
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer compile still runs
        assert gc.isenabled()
        try:
            with collector_paused():
                raise KeyError("a compile's error")
        except KeyError:
            pass
        assert gc.isenabled()
        gc.disable()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was_enabled else gc.disable)()
