"""numba's thread count and parallel chunk size for the calling thread, read and set inside
a parallel kernel.

A parallel kernel sets the count numbapool chose for the call on entry and gives numba's
back on exit, so no Python runs around the call for it (numba.get_num_threads and
numba.set_num_threads take a process-wide lock and go through ctypes on every call). These
call the threading layer's own functions, the ones numba's prange loops call themselves
(_numba, 6.); numba's jitted versions of them are not cacheable.
"""

from numba import njit

from .._numba import layer_threads, set_layer_chunk_size, set_layer_threads


@njit(inline="always")
def use_threads(count):
    """Make the prange loops that follow run on ``count`` threads (1 to NUMBA_NUM_THREADS,
    checked by the caller); returns the count before, to give back the same way."""
    before = layer_threads()
    if before != count:
        set_layer_threads(count)
    return before


@njit(inline="always")
def use_chunk_size(size):
    """Make the prange loops that follow deal their iterations out ``size`` at a time (0:
    numba's default, one equal share per thread); returns the size before."""
    return set_layer_chunk_size(size)
