"""A cache hint for loops whose memory access the hardware prefetchers follow too late."""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from . import INLINED

_I32 = ir.IntType(32)
# How far ahead of its reads a loop asks for memory, and a cache line
AHEAD_BYTES = 4096
LINE_BYTES = 64


@intrinsic
def prefetch(typingctx, array, index):
    """Ask the CPU to bring the cache line of ``array[index]`` into its nearest cache for a
    read (LLVM's ``llvm.prefetch``). Only a hint: it changes no value and never faults, so
    ``index`` may lie past the end of ``array``."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        hint = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [address.type, _I32, _I32, _I32])
        )
        # read (0), keep in all cache levels (3), data cache (1)
        builder.call(
            hint, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)]
        )
        return context.get_dummy_value()

    return types.void(array, index), codegen


def prefetch_range(flat, start, count):
    """Ask for the cache lines of flat[start:start + count]."""


# Compiled once per dtype for LLVM to inline, not inlined in numba's IR at each call site:
# the columns kernel's first call took 0.2 to 0.4 s less (fresh processes in turn)
@overload(prefetch_range, jit_options=INLINED)
def _prefetch_range_overload(flat, start, count):
    # in elements of this dtype, as a constant: an array's itemsize is read at run time
    line = np.uint64(LINE_BYTES * 8 // flat.dtype.bitwidth)

    def impl(flat, start, count):
        offset = np.uint64(0)
        while offset < count:  # not a range with a step: that divides for its count
            prefetch(flat, start + offset)
            offset += line

    return impl


def prefetch_ahead(flat, start, count):
    """Ask for the cache lines of flat[start:start + count] shifted AHEAD_BYTES on: the
    data a loop over short stretches (say, channels of 7x7) reaches next, which the
    hardware prefetchers, tuned to long streams, bring too late."""


@overload(prefetch_ahead, jit_options=INLINED)
def _prefetch_ahead_overload(flat, start, count):
    ahead = np.uint64(AHEAD_BYTES * 8 // flat.dtype.bitwidth)

    def impl(flat, start, count):
        prefetch_range(flat, start + ahead, count)

    return impl


# Inputs from this size on are read with prefetch_ahead by the columns kernel (MaxPool),
# the fixed windows' sums and MaxPool with Indices' row kernel. The columns kernel asks
# for the rows an output row steps over: MaxPool 3x3 s2 with pads over 9.6 MB of float64
# took 0.84 of the time with it; smaller inputs, which the caches hold, gained nothing.
PREFETCH_INPUT_BYTES = 8 << 20
