"""Loops written as LLVM vector code, where numba's loops vectorize badly.

A channel's float64 sum: LLVM vectorizes ``for i in range(n): total += x[i]`` as a 32-wide
body, then a 4-wide loop and a scalar loop for the elements left, each ending in a
horizontal sum. On a channel of 7x7 the body runs once and the leftovers cost the most.
Here the body is 8 wide (32 wide in four accumulators for long channels), and the
elements left come in masked loads, which read nothing past the channel; short channels'
horizontal sums go 8 channels at a time (transposed_sums). float32 elements, and float16
and bfloat16 ones as codec.py stores them, decoded 8 at a time.
GlobalMaxPool's maximum of a channel's order keys (vector_key_max) goes the same way, and
so does MaxPool's fold of input rows of 8- and 16-bit elements (row_fold_first,
row_fold_more), whose rows of a hundred elements or so numba's loop left mostly to its
scalar leftovers.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

WIDTH = 8  # float64 lanes in a 512-bit vector
_I1, _I32, _I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
_F32, _F64 = ir.FloatType(), ir.DoubleType()
_V32, _V64 = ir.VectorType(_F32, WIDTH), ir.VectorType(_F64, WIDTH)
_VI32 = ir.VectorType(_I32, WIDTH)


def _declare(builder, name, result, arguments):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, arguments),
                                          name)


def _splat(builder, value, lanes):
    """A vector of ``lanes`` copies of ``value``."""
    vector = ir.VectorType(value.type, lanes)
    first = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, first,
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def _vector_loop(builder, count, step, initial, add):
    """Emit a loop over i in [0, whole) by ``step``, ``whole`` the multiple of ``step``
    (a power of two) at most ``count``, carrying the LLVM values ``initial``: each pass
    replaces them with ``add(i, values)``. Returns (the values after it, ``whole``), the
    builder placed after the loop, where the elements [whole, count) remain."""
    whole = builder.and_(count, ir.Constant(_I64, -step))
    entry = builder.block
    head = builder.append_basic_block("vectors.head")
    body = builder.append_basic_block("vectors.body")
    tail = builder.append_basic_block("vectors.tail")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    values = [builder.phi(value.type) for value in initial]
    for phi, value in zip(values, initial):
        phi.add_incoming(value, entry)
    builder.cbranch(builder.icmp_unsigned("<", i, whole), body, tail)
    builder.position_at_end(body)
    for phi, value in zip(values, add(i, values)):
        phi.add_incoming(value, body)
    i.add_incoming(builder.add(i, ir.Constant(_I64, step)), body)
    builder.branch(head)
    builder.position_at_end(tail)
    return values, whole


def _left_lanes(builder, count, whole, first, lanes):
    """Which of the lanes [first, first + lanes) hold one of the count - whole elements
    left after _vector_loop: the mask of a masked load."""
    lane_numbers = ir.Constant(ir.VectorType(_I64, lanes), list(range(first, first + lanes)))
    return builder.icmp_unsigned("<", lane_numbers,
                                 _splat(builder, builder.sub(count, whole), lanes))


def _float32_vector(builder, loaded, storage):
    """The float32 values of vector ``loaded`` of elements stored as ``storage`` (codec.py:
    uint16 bits of float16, int16 bits of bfloat16)."""
    if storage == types.uint16:
        wide = builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(), WIDTH)), _V32)
        # LLVM would take the magnitudes from the 16 bits and convert them a second time
        return builder.call(_declare(builder, "llvm.arithmetic.fence.v8f32", _V32, [_V32]),
                            [wide])
    if storage == types.int16:
        wide = builder.shl(builder.zext(loaded, _VI32), ir.Constant(_VI32, [16] * WIDTH))
        return builder.bitcast(wide, _V32)
    return loaded


# numba's element type -> (the LLVM vector of WIDTH elements, its intrinsics' suffix)
_STORED = {types.float32: (_V32, "v8f32"),
           types.uint16: (ir.VectorType(ir.IntType(16), WIDTH), "v8i16"),
           types.int16: (ir.VectorType(ir.IntType(16), WIDTH), "v8i16")}
STORAGE = tuple(_STORED)


def _lane_sums(builder, data, start, count, storage, accumulators):
    """(float64 vector, float32 vector) whose lanes add up to the float64 sum and to the
    float32 sum of the magnitudes of data[start:start + count] (float32, or 16-bit floats
    stored as codec.py says; ``storage`` numba's type of them), ``accumulators`` vectors
    side by side, the elements left in masked loads whose lanes past the end load +0."""
    stored, suffix = _STORED[storage]
    pointer = stored.as_pointer()
    magnitude_bits = ir.Constant(_VI32, [0x7FFFFFFF] * WIDTH)
    # The float64 total is added as x * 1 + total, which rounds as x + total does: the
    # multiply-add units take it, and the adders keep the magnitudes and the conversions
    # (0.89 of the time on 56x56 channels, 0.91 on 7x7). The fence hides the 1 from LLVM,
    # which would fold the product back into an addition.
    ones = builder.call(_declare(builder, "llvm.arithmetic.fence.v8f64", _V64, [_V64]),
                        [ir.Constant(_V64, [1.0] * WIDTH)])
    multiply_add = _declare(builder, "llvm.fmuladd.v8f64", _V64, [_V64] * 3)

    def vector_at(offset):
        return builder.bitcast(builder.gep(data, [builder.add(start, offset)]), pointer)

    def add(sums, loaded):
        total, magnitudes = sums
        vector = _float32_vector(builder, loaded, storage)
        magnitude = builder.and_(builder.bitcast(vector, _VI32), magnitude_bits)
        return (builder.call(multiply_add, [builder.fpext(vector, _V64), ones, total]),
                builder.fadd(magnitudes, builder.bitcast(magnitude, _V32)))

    def add_vectors(i, values):  # values: (total, magnitudes) per accumulator
        added = []
        for k in range(accumulators):
            loaded = builder.load(vector_at(builder.add(i, ir.Constant(_I64, k * WIDTH))),
                                  align=2)
            added += add(values[2 * k:2 * k + 2], loaded)
        return added

    zeros = [ir.Constant(_V64, [0.0] * WIDTH), ir.Constant(_V32, [0.0] * WIDTH)]
    values, whole = _vector_loop(builder, count, WIDTH * accumulators, zeros * accumulators,
                                 add_vectors)
    # up to WIDTH * accumulators - 1 elements left: one masked load per accumulator
    masked_load = _declare(builder, f"llvm.masked.load.{suffix}.p0", stored,
                           [pointer, _I32, ir.VectorType(_I1, WIDTH), stored])
    sums = None
    for k in range(accumulators):
        loaded = builder.call(masked_load, [
            vector_at(builder.add(whole, ir.Constant(_I64, k * WIDTH))),
            ir.Constant(_I32, 2), _left_lanes(builder, count, whole, k * WIDTH, WIDTH),
            ir.Constant(stored, None)])
        pair = add(values[2 * k:2 * k + 2], loaded)
        sums = pair if sums is None else tuple(builder.fadd(a, b) for a, b in zip(sums, pair))
    return sums


@intrinsic
def vector_sums(typingctx, flat, start, count):
    """``(flat, start, count) -> (total, magnitudes)``: over the elements
    flat[start:start + count] (float32, or 16-bit floats stored as codec.py says), their
    float64 sum and the float32 sum of their magnitudes, each added in an order of its own
    (four vectors side by side, then a horizontal sum): long channels."""
    if not (isinstance(flat, types.Array) and flat.dtype in _STORED
            and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None
    signature = types.UniTuple(types.float64, 2)(flat, types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        total, magnitudes = _lane_sums(builder, data, args[1], args[2],
                                       signature.args[0].dtype, 4)
        total = builder.call(_declare(builder, "llvm.vector.reduce.fadd.v8f64", _F64,
                                      [_F64, _V64]),
                             [ir.Constant(_F64, -0.0), total], fastmath=("reassoc",))
        magnitudes = builder.call(_declare(builder, "llvm.vector.reduce.fadd.v8f32", _F32,
                                           [_F32, _V32]),
                                  [ir.Constant(_F32, -0.0), magnitudes], fastmath=("reassoc",))
        return context.make_tuple(builder, signature.return_type,
                                  [total, builder.fpext(magnitudes, _F64)])

    return signature, codegen


def _scratch(array_type, element):
    return (isinstance(array_type, types.Array) and array_type.dtype == element
            and array_type.mutable and array_type.ndim == 1 and array_type.layout == "C")


def _vector_pointer(context, builder, array_type, array, at, vector):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())


@intrinsic
def vector_lane_sums(typingctx, flat, start, count, lane_totals, lane_magnitudes, slot):
    """``(flat, start, count, lane_totals, lane_magnitudes, slot)``: the lanes of one
    vector each whose sums are the float64 sum and the float32 sum of the magnitudes of
    flat[start:start + count] (as vector_sums adds them, in one vector: short channels),
    stored at lane_totals and lane_magnitudes[WIDTH * slot:WIDTH * (slot + 1)], for
    transposed_sums to add up WIDTH channels at a time."""
    if not (isinstance(flat, types.Array) and flat.dtype in _STORED
            and _scratch(lane_totals, types.float64) and _scratch(lane_magnitudes, types.float32)):
        return None
    signature = types.none(flat, types.uint64, types.uint64, lane_totals, lane_magnitudes,
                           types.uint64)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        sums = _lane_sums(builder, data, args[1], args[2], signature.args[0].dtype, 1)
        at = builder.mul(args[5], ir.Constant(_I64, WIDTH))
        for k, (value, vector) in enumerate(zip(sums, (_V64, _V32))):
            builder.store(value, _vector_pointer(context, builder, signature.args[3 + k],
                                                 args[3 + k], at, vector), align=4)
        return context.get_dummy_value()

    return signature, codegen


def _transposed(builder, vectors):
    """The vector whose lane k is the sum of the lanes of vectors[k] (WIDTH vectors of
    WIDTH lanes). Each level adds two vectors' halves of partial sums at once, a pair of
    shuffles and one add for every two vectors: 7 adds for 8 vectors, where 8 horizontal
    sums take 3 each."""
    partials = WIDTH  # lanes that each vector's partial sums take
    while len(vectors) > 1:
        sources = WIDTH // partials  # vectors whose partials each vector holds
        half = partials // 2
        low = [s * partials + i for s in range(sources) for i in range(half)]
        low += [WIDTH + lane for lane in low]
        high = [lane + half for lane in low]
        vectors = [builder.fadd(builder.shuffle_vector(a, b, ir.Constant(_VI32, low)),
                                builder.shuffle_vector(a, b, ir.Constant(_VI32, high)))
                   for a, b in zip(vectors[::2], vectors[1::2])]
        partials = half
    return vectors[0]


@intrinsic
def transposed_sums(typingctx, lane_totals, lane_magnitudes, totals, bounds, at):
    """``(lane_totals, lane_magnitudes, totals, bounds, at)``: for the WIDTH channels whose
    lanes vector_lane_sums stored, totals[at + k] = channel k's float64 sum and
    bounds[at + k] = twice the float32 sum of its magnitudes, the horizontal sums taken
    WIDTH at a time (_transposed): 7x7 channels in 0.83 to 0.89 of the time of one
    horizontal sum per channel."""
    if not (_scratch(lane_totals, types.float64) and _scratch(lane_magnitudes, types.float32)
            and _scratch(totals, types.float64) and _scratch(bounds, types.float64)):
        return None
    signature = types.none(lane_totals, lane_magnitudes, totals, bounds, types.uint64)

    def codegen(context, builder, signature, args):
        total, magnitudes = (
            _transposed(builder, [builder.load(_vector_pointer(
                context, builder, signature.args[k], args[k], ir.Constant(_I64, WIDTH * lane),
                vector), align=4) for lane in range(WIDTH)])
            for k, vector in enumerate((_V64, _V32)))
        bound = builder.fmul(builder.fpext(magnitudes, _V64), ir.Constant(_V64, [2.0] * WIDTH))
        for k, value in ((2, total), (3, bound)):
            builder.store(value, _vector_pointer(context, builder, signature.args[k], args[k],
                                                 args[4], _V64), align=8)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def vector_key_max(typingctx, bits, start, count, magnitude_mask, sign_shift):
    """``(bits, start, count, magnitude_mask, sign_shift) -> (largest key, largest
    magnitude)`` over the signed integers bits[start:start + count] (a channel's float
    bit patterns, count >= 1): the largest of their order keys (global_.order_key: bits
    ^ ((bits >> sign_shift) & magnitude_mask)) and of their magnitudes (bits &
    magnitude_mask), each a 512-bit vector at a time, the last elements in one masked
    load whose lanes past the end take no part."""
    if not (isinstance(bits, types.Array) and isinstance(bits.dtype, types.Integer)
            and bits.dtype.signed and bits.dtype.bitwidth in (16, 32, 64)):
        return None
    element = bits.dtype
    signature = types.UniTuple(element, 2)(bits, types.uint64, types.uint64, element, element)
    lanes = 512 // element.bitwidth
    scalar = ir.IntType(element.bitwidth)
    vector = ir.VectorType(scalar, lanes)
    suffix = f"v{lanes}i{element.bitwidth}"

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        start, count = args[1], args[2]
        mask, shift = _splat(builder, args[3], lanes), _splat(builder, args[4], lanes)
        smallest = ir.Constant(vector, [-(1 << (element.bitwidth - 1))] * lanes)
        pointer = vector.as_pointer()

        def vector_at(offset):
            return builder.bitcast(builder.gep(data, [builder.add(start, offset)]), pointer)

        def keys_and_magnitudes(loaded):
            key = builder.xor(loaded, builder.and_(builder.ashr(loaded, shift), mask))
            return key, builder.and_(loaded, mask)

        def fold(best, new):
            return [builder.select(builder.icmp_signed(">", a, b), a, b)
                    for a, b in zip(best, new)]

        best, whole = _vector_loop(
            builder, count, lanes, [smallest, ir.Constant(vector, [0] * lanes)],
            lambda i, best: fold(best, keys_and_magnitudes(builder.load(vector_at(i),
                                                                        align=2))))
        inside = _left_lanes(builder, count, whole, 0, lanes)
        masked_load = _declare(builder, f"llvm.masked.load.{suffix}.p0", vector,
                               [pointer, _I32, ir.VectorType(_I1, lanes), vector])
        loaded = builder.call(masked_load, [vector_at(whole), ir.Constant(_I32, 2), inside,
                                            ir.Constant(vector, None)])
        key, magnitude = keys_and_magnitudes(loaded)
        key = builder.select(inside, key, smallest)  # lanes past the end: no part
        magnitude = builder.select(inside, magnitude, ir.Constant(vector, [0] * lanes))
        best = fold(best, (key, magnitude))
        results = [builder.call(_declare(builder, f"llvm.vector.reduce.smax.{suffix}", scalar,
                                         [vector]), [value]) for value in best]
        return context.make_tuple(builder, signature.return_type, results)

    return signature, codegen


# A MaxPool row fold's elements (8 and 16 bits: columns.py keeps numba's loop for
# float32 and float64): numba's type -> (LLVM's element, lanes in a vector, the
# intrinsics' suffix, how the fold compares them). 16-bit floats 16 to a vector, their
# values one 512-bit vector of float32 (32 to a vector: MaxPool 3x3 s2 float16 1.1x slower)
_I8, _I16 = ir.IntType(8), ir.IntType(16)
_FOLDED = {types.uint16: (_I16, 16, "v16i16", "float16"),
           types.int16: (_I16, 16, "v16i16", "bfloat16"),
           types.int8: (_I8, 64, "v64i8", "signed"),
           types.uint8: (_I8, 64, "v64i8", "unsigned")}


def _row_fold(with_columns):
    """An intrinsic ``(columns, base, source, at0, at1, at2, count)``: for k < count,
    columns[base + k] = the first maximum (maxima.fold_max: ties keep the first, the first
    NaN wins) of, in order, columns[base + k] itself when ``with_columns``, then
    source[at0 + k], source[at1 + k] and source[at2 + k], as raw elements (16-bit floats
    compared decoded, codec.py). ``columns`` and ``source`` are distinct arrays.

    A vector at a time (_FOLDED), four to a pass while four remain; the last elements as
    the last whole vector again, ending at ``count`` (overlapping the one before: a
    maximum taken twice changes nothing), or, under one vector's length, in masked loads
    and a masked store (masked ones for every row's last elements made the resnet stem
    1.15x slower)."""

    @intrinsic
    def row_fold(typingctx, columns, base, source, at0, at1, at2, count):
        if not (isinstance(columns, types.Array) and isinstance(source, types.Array)
                and columns.dtype == source.dtype and columns.dtype in _FOLDED
                and all(isinstance(t, types.Integer) for t in (base, at0, at1, at2, count))):
            return None
        signature = types.none(columns, types.uint64, source, types.uint64, types.uint64,
                               types.uint64, types.uint64)
        element, lanes, suffix, compare = _FOLDED[columns.dtype]
        vector = ir.VectorType(element, lanes)
        floats = ir.VectorType(_F32, lanes)

        def codegen(context, builder, sig, args):
            columns_data = context.make_array(sig.args[0])(context, builder, args[0]).data
            source_data = context.make_array(sig.args[2])(context, builder, args[2]).data
            base, at0, at1, at2, count = args[1], args[3], args[4], args[5], args[6]
            pointer = vector.as_pointer()

            def at(data, start, i):
                return builder.bitcast(builder.gep(data, [builder.add(start, i)]), pointer)

            def value(loaded):
                if compare == "float16":
                    return builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(),
                                                                               lanes)), floats)
                if compare == "bfloat16":
                    wide = builder.zext(loaded, ir.VectorType(_I32, lanes))
                    return builder.bitcast(builder.shl(wide, ir.Constant(wide.type,
                                                                         [16] * lanes)), floats)
                return loaded

            def fold(kept, new):  # maxima.keeps: kept >= new, or kept a NaN
                # (raw elements, their values): the kept value is not decoded again
                (kept_raw, a), (new_raw, b) = kept, new
                if compare == "signed":
                    keep = builder.icmp_signed(">=", a, b)
                elif compare == "unsigned":
                    keep = builder.icmp_unsigned(">=", a, b)
                else:
                    keep = builder.or_(builder.fcmp_ordered(">=", a, b),
                                       builder.fcmp_unordered("uno", a, a))
                return builder.select(keep, kept_raw, new_raw), builder.select(keep, a, b)

            def folded(load, i):
                rows = [load(at(source_data, start, i)) for start in (at0, at1, at2)]
                if with_columns:
                    rows.insert(0, load(at(columns_data, base, i)))
                result = (rows[0], value(rows[0]))
                for row in rows[1:]:
                    result = fold(result, (row, value(row)))
                return result[0]

            def vectors(i, offset, n):
                for k in range(n):
                    j = builder.add(builder.add(i, offset), ir.Constant(_I64, k * lanes))
                    result = folded(lambda p: builder.load(p, align=1), j)
                    builder.store(result, at(columns_data, base, j), align=1)
                return []

            # four vectors to a pass, then one, then the rest
            zero = ir.Constant(_I64, 0)
            _, fours = _vector_loop(builder, count, 4 * lanes, [],
                                    lambda i, values: vectors(i, zero, 4))
            _, ones = _vector_loop(builder, builder.sub(count, fours), lanes, [],
                                   lambda i, values: vectors(i, fours, 1))
            whole = builder.add(fours, ones)
            left = builder.icmp_unsigned("<", whole, count)
            long = builder.icmp_unsigned(">=", count, ir.Constant(_I64, lanes))
            with builder.if_then(left):
                with builder.if_else(long) as (overlapping, masked):
                    with overlapping:  # the last whole vector again, ending at count
                        vectors(builder.sub(count, ir.Constant(_I64, lanes)), zero, 1)
                    with masked:
                        mask_type = ir.VectorType(_I1, lanes)
                        masked_load = _declare(builder, f"llvm.masked.load.{suffix}.p0", vector,
                                               [pointer, _I32, mask_type, vector])
                        masked_store = _declare(builder, f"llvm.masked.store.{suffix}.p0",
                                                ir.VoidType(), [vector, pointer, _I32, mask_type])
                        inside = _left_lanes(builder, count, whole, 0, lanes)
                        alignment = ir.Constant(_I32, 1)
                        result = folded(lambda p: builder.call(
                            masked_load, [p, alignment, inside, ir.Constant(vector, None)]),
                            whole)
                        builder.call(masked_store, [result, at(columns_data, base, whole),
                                                    alignment, inside])
            return context.get_dummy_value()

        return signature, codegen

    return row_fold


row_fold_first = _row_fold(False)
row_fold_more = _row_fold(True)
