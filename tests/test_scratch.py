"""The kernels' scratch arrays (numbapool/_kernels/scratch.py): allocated and freed by the
kernels' own code, which compiles without numba's reference counting. That every kernel
frees what it allocates is checked in tests/test_first_call.py, over every kind of kernel."""

import numpy as np
import pytest
from numba import njit

from numbapool._kernels.scratch import empty, full, release


@njit(_nrt=False)
def _filled_sum(size, value):
    ones = full(size, value, np.float64)
    indices = empty(size, np.int64)
    total = 0.0
    for i in range(size):
        indices[i] = i
        total += ones[indices[i]]
    release(ones, indices)
    return total


def test_scratch_arrays_hold_what_is_written():
    assert _filled_sum(1000, 0.5) == 500.0
    assert _filled_sum(0, 0.5) == 0.0


def test_a_scratch_array_past_the_memory_raises_memory_error():
    with pytest.raises(MemoryError, match="scratch array"):
        _filled_sum(1 << 60, 1.0)
