"""asv suite: the canonical cases of numbapool._cases, per thread count.

Fixed inputs come from a cache (``make_input``), compilation happens in ``setup`` outside
the timed body, and ``timeraw_`` measures import plus a first call in a fresh process.
"""

import numba

from numbapool._bench import FIRST_CALL_INPUT, FIRST_CALLS
from numbapool._cases import CASES, CASES_BY_NAME, make_input, ready, runner

CASE_NAMES = [case.name for case in CASES]
THREADS = sorted({1, numba.config.NUMBA_NUM_THREADS})


class Pooling:
    params = (CASE_NAMES, THREADS)
    param_names = ["case", "threads"]
    timeout = 300

    def setup(self, name, threads):
        self.case = CASES_BY_NAME[name]
        self.x = make_input(self.case.shape, self.case.dtype, self.case.data)
        numba.set_num_threads(threads)
        self.call = runner(self.case, self.x)
        ready(self.call)  # compile (or load from the disk cache) before timing

    def time_call(self, name, threads):
        self.call()

    def peakmem_call(self, name, threads):
        self.call()


class FirstCall:
    """Import and each operator's first call in a fresh process, on an input that takes the
    parallel kernels (numbapool._bench.FIRST_CALLS); the disk cache is warm after the first
    repeat. ``python -m numbapool bench --first-call`` also times it on an empty cache."""

    params = list(FIRST_CALLS)
    param_names = ["call"]
    repeat = 3
    number = 1
    timeout = 600

    def timeraw_import_and_first_call(self, name):
        return (
            f"import numpy as np\nimport numbapool\nx = {FIRST_CALL_INPUT}\n{FIRST_CALLS[name]}\n"
        )
