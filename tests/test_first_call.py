"""A warm disk cache is complete: a fresh process that makes the calls an earlier process
made compiles nothing and writes nothing to the cache.

The calls: ``numbapool.warmup`` of every operator in float32 (every kind of kernel the
dispatcher chooses, each at a serial and a parallel size, the global pools on one thread
too, and the dask sums' kernels), and in every other dtype a 3x3 stride-2 MaxPool (an
input-rows-first kind), a GlobalMaxPool and a GlobalAveragePool at both sizes; every kind
in every dtype would take more than the suite's whole budget to compile. The two processes share the suite's cache directory
(conftest.py), empty before the first; the rest of the suite then loads from it.
"""

import json
import os
import subprocess
import sys

from numbapool import _cache

# numba announces every compilation that its disk cache did not spare ("numba:compile")
_RECORD_COMPILES = """
import json
from numba.core import event

compiled = []


class Record(event.Listener):
    def on_start(self, compilation):
        compiled.append(compilation.data["dispatcher"].py_func.__qualname__)

    def on_end(self, compilation):
        pass


event.register("numba:compile", Record())
import numpy as np
import numbapool
from numbapool import _warmup
numbapool.warmup(dtypes=["float32"], progress=False)
for name, dtype in _warmup.DTYPE_NAMES.items():
    for side in (4, 128):
        x = np.zeros((1, 4, side, side), dtype)
        numbapool.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        if dtype.kind == "f" or name == "bfloat16":
            numbapool.global_max_pool(x)
            numbapool.global_average_pool(x)
print(json.dumps(compiled))
"""


def _cache_files() -> dict:
    """Every file in the cache directory: its size and modification time."""
    files = {}
    for directory, _, names in os.walk(os.environ["NUMBA_CACHE_DIR"]):
        for name in names:
            status = os.stat(os.path.join(directory, name))
            files[os.path.join(directory, name)] = (status.st_size, status.st_mtime_ns)
    return files


def _process_compiles() -> list:
    result = subprocess.run([sys.executable, "-c", _RECORD_COMPILES], capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_a_second_process_compiles_nothing():
    assert _cache.CACHE_DIRECTORY.startswith(os.environ["NUMBA_CACHE_DIR"])
    assert not _cache_files(), "the first process must meet an empty cache"
    first = _process_compiles()
    # the parallel drivers and the kernels they call are among what the first compiled
    assert {"max_pool", "sum_pool", "global_max_pool", "global_sum_kernels.<locals>.parallel",
            "max_unpool", "columns_kernels.<locals>.driver",
            "fixed_window_kernels.<locals>.max_driver"} <= set(first)
    filled = _cache_files()
    assert filled
    assert _process_compiles() == []
    assert _cache_files() == filled

