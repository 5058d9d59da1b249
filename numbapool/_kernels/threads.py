"""numba's thread count and parallel chunk size for the calling thread, read and set inside
a parallel kernel.

A parallel kernel sets the count numbapool chose for the call on entry and gives numba's
back on exit, so no Python runs around the call for it (numba.get_num_threads and
numba.set_num_threads take a process-wide lock and go through ctypes on every call). These
call the threading layer's own get_num_threads and set_num_threads, the functions numba's
prange loops call themselves; numba's jitted versions of the two are not cacheable.
"""

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.ufunc.parallel import _launch_threads


@intrinsic
def _layer_threads(typingctx):
    _launch_threads()  # the layer's functions exist once its threads are launched

    def codegen(context, builder, signature, args):
        # declared as numba's prange loops declare it, in the same module
        get = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(cgutils.intp_t, []), "get_num_threads")
        return builder.call(get, [])

    return types.intp(), codegen


@intrinsic
def _set_layer_threads(typingctx, count):
    if not isinstance(count, types.Integer):
        return None
    _launch_threads()

    def codegen(context, builder, signature, args):
        int32 = ir.IntType(32)
        set_ = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [int32]), "set_num_threads")
        builder.call(set_, [context.cast(builder, args[0], signature.args[0], types.int32)])
        return context.get_dummy_value()

    return types.void(count), codegen


@njit(inline="always")
def use_threads(count):
    """Make the prange loops that follow run on ``count`` threads (1 to NUMBA_NUM_THREADS,
    checked by the caller); returns the count before, to give back the same way."""
    before = _layer_threads()
    if before != count:
        _set_layer_threads(count)
    return before


@intrinsic
def _set_layer_chunk_size(typingctx, size):
    if not isinstance(size, types.Integer):
        return None
    _launch_threads()

    def codegen(context, builder, signature, args):
        # declared as numba's prange loops declare them, in the same module
        get = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(cgutils.intp_t, []), "get_parallel_chunksize")
        set_ = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [cgutils.intp_t]),
            "set_parallel_chunksize")
        before = builder.call(get, [])
        builder.call(set_, [context.cast(builder, args[0], signature.args[0], types.intp)])
        return before

    return types.intp(size), codegen


@njit(inline="always")
def use_chunk_size(size):
    """Make the prange loops that follow deal their iterations out ``size`` at a time (0:
    numba's default, one equal share per thread); returns the size before."""
    return _set_layer_chunk_size(size)
