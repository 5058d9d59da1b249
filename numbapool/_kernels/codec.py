"""Element loads and stores, dispatched on the storage dtype numba sees.

Numba has no float16 or bfloat16 arrays on the CPU, so 16-bit floats travel as their bit
patterns and are decoded element by element inside the loops (never a whole-array pass):

    float16  -> uint16 view, decoded with LLVM's half <-> float conversions
    bfloat16 -> int16 view, decoded by placing the 16 bits on top of a float32

The two 16-bit formats use different integer types so that numba's type dispatch alone
picks the decoder. Everything else is loaded as itself. AveragePool sums accumulate in
float32, or in float64 for float64 input; LpPool and global sums in float64. Results are
rounded once on store.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic, overload

from . import INLINED
from .scratch import allocation


def _half_bits_to_float32(builder, bits):
    return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())


@intrinsic
def _float32_to_half_bits(typingctx, value):
    # fptrunc rounds to nearest, ties to even, and keeps NaN and infinities.
    def codegen(context, builder, signature, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.bitcast(half, ir.IntType(16))

    return types.uint16(types.float32), codegen


def _bfloat16_bits_to_float32(builder, bits):
    wide = builder.zext(bits, ir.IntType(32))
    return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())


@intrinsic
def float32_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def float64_bits(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def signed_bits(typingctx, value):
    """A float32's or float64's bits as a signed integer of its width: -0's is the
    smallest of that width, and no other value's (every other negative value has bits of
    its magnitude set)."""
    if value not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(value.bitwidth))

    return (types.int32 if value == types.float32 else types.int64)(value), codegen


@intrinsic
def are_negative_zero_bits(typingctx, bits):
    """Whether signed_bits' integer is a -0's: only its sign bit set."""
    if bits not in (types.int32, types.int64):
        return None

    def codegen(context, builder, signature, args):
        sign_alone = ir.Constant(ir.IntType(bits.bitwidth), 1 << (bits.bitwidth - 1))
        return builder.icmp_unsigned("==", args[0], sign_alone)

    return types.boolean(bits), codegen


@intrinsic
def float64_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def _low_16_bits_as_int16(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.trunc(args[0], ir.IntType(16))

    return types.int16(types.uint32), codegen


# decode and as_accumulator are intrinsics, which emit their conversion in place at each
# call: as overloads that numba inlines (and encode as one, rather than compiled once for
# LLVM to inline), each call site's IR was copied and typed again, 12 % of the Python calls
# of a warmup of MaxPool and AveragePool in float32 and float16 (cProfile)


@intrinsic
def decode(typingctx, value):
    """The value of one stored element, in the type the loops compute in."""
    if value == types.uint16:
        return types.float32(
            value
        ), lambda context, builder, signature, args: _half_bits_to_float32(builder, args[0])
    if value == types.int16:
        return types.float32(
            value
        ), lambda context, builder, signature, args: _bfloat16_bits_to_float32(builder, args[0])
    if isinstance(value, (types.Float, types.Integer)):
        value = types.unliteral(value)
        return value(value), lambda context, builder, signature, args: args[0]
    return None


def encode(value, out):
    """``value`` rounded once to the element type of the array ``out``."""


@overload(encode, jit_options=INLINED)
def _encode_overload(value, out):
    dtype = out.dtype
    if dtype == types.uint16:
        return lambda value, out: _float32_to_half_bits(narrow_to_float32(value))

    if dtype == types.int16:

        def to_bfloat16(value, out):
            bits = float32_bits(narrow_to_float32(value))
            if value != value:  # a quiet NaN that keeps the sign
                return _low_16_bits_as_int16((bits >> np.uint32(16)) | np.uint32(0x0040))
            # round to nearest, ties to even, on the 16 bits that are dropped
            rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
            return _low_16_bits_as_int16((bits + rounding) >> np.uint32(16))

        return to_bfloat16
    if isinstance(dtype, types.Float):
        return lambda value, out: dtype(value)
    return None


@intrinsic
def _float32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


def narrow_to_float32(value):
    """float64 -> float32 rounded to odd, so that a second rounding to 16 bits is exact."""


@overload(narrow_to_float32, jit_options=INLINED)
def _narrow_to_float32_overload(value):
    if value == types.float64:

        def round_to_odd(value):
            nearest = np.float32(value)
            if np.float64(nearest) == value or value != value:
                return nearest
            bits = float32_bits(nearest)
            if abs(np.float64(nearest)) > abs(value):
                bits -= np.uint32(1)  # step toward zero: the truncated value
            return _float32_from_bits(bits | np.uint32(1))

        return round_to_odd
    return lambda value: np.float32(value)


def _accumulates_in_float64(like) -> bool:
    """``like`` is an input array (sums over float64 input accumulate in float64, the rest in
    float32) or an accumulator value, whose own type decides."""
    kind = like.dtype if isinstance(like, types.Array) else like
    return kind == types.float64


@intrinsic
def as_accumulator(typingctx, value, like):
    """``value`` in the accumulator type of ``like`` (see _accumulates_in_float64)."""
    if not isinstance(value, (types.Float, types.Integer)):
        return None
    value = types.unliteral(value)
    accumulator = types.float64 if _accumulates_in_float64(like) else types.float32

    def codegen(context, builder, signature, args):
        return context.cast(builder, args[0], value, accumulator)

    return accumulator(value, like), codegen


@intrinsic
def accumulator_array(typingctx, size, like):
    """An uninitialized scratch array (scratch.empty) of ``size`` accumulators of the type of
    ``like``."""
    if not isinstance(size, types.Integer):
        return None
    array_type = types.Array(
        types.float64 if _accumulates_in_float64(like) else types.float32, 1, "C"
    )
    return array_type(size, like), allocation(array_type)
