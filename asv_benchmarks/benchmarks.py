"""asv suite: the canonical cases of numbapool._cases, per thread count.

Fixed inputs come from a cache (``make_input``), compilation happens in ``setup`` outside
the timed body, and ``timeraw_`` measures import plus a first call in a fresh process.
"""

import numba

from numbapool._cases import CASES, CASES_BY_NAME, make_input, runner

CASE_NAMES = [case.name for case in CASES]
THREADS = sorted({1, numba.config.NUMBA_NUM_THREADS})


class Pooling:
    params = (CASE_NAMES, THREADS)
    param_names = ["case", "threads"]
    timeout = 300

    def setup(self, name, threads):
        self.case = CASES_BY_NAME[name]
        self.x = make_input(self.case.shape, self.case.dtype)
        numba.set_num_threads(threads)
        self.call = runner(self.case, self.x)
        self.call()  # compile (or load from the disk cache) before timing

    def time_call(self, name, threads):
        self.call()

    def peakmem_call(self, name, threads):
        self.call()


class FirstCall:
    """Import and the first max_pool in a fresh process (the disk cache warm after one run)."""

    repeat = 3
    number = 1

    def timeraw_import_and_first_max_pool(self):
        return """
import numpy as np
import numbapool
numbapool.max_pool(np.ones((1, 3, 8, 8), np.float32), [2, 2], strides=[2, 2])
"""
