"""The global pools' loops written as LLVM vector code (vectors.py).

GlobalAveragePool's float32 block sums (block_sum, add_to_lanes): their order is the rule
of docs/semantics.md, lane by lane, which numba's loop would not keep; four vectors of
float32 lanes side by side, the elements past the last whole run of lanes in loads whose
lanes past the channel take no part. float32 elements, and float16 and bfloat16 ones as
codec.py stores them, decoded a vector at a time; a block of at most LANES elements in
straight code. GlobalMaxPool's largest of a channel (store_float_max, and vector_key_max
over the order keys of 16-bit floats) goes the same way, but that a channel at least a
vector long ends in the vector that ends at its end (_fold_last), and that a float32 or
float64 channel of one to STRAIGHT_VECTORS vectors is read in straight code."""

import functools

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .vectors import (
    F32,
    I32,
    I64,
    declare,
    fits_before,
    left_lanes,
    load_within,
    masked_memory,
    splat,
    vector_loop,
    vectors_at,
)

WIDTH = 16  # float32 lanes in a vector of the block sums
_V32 = ir.VectorType(F32, WIDTH)
_VI32 = ir.VectorType(I32, WIDTH)


def _float32_vector(builder, loaded, storage):
    """The float32 values of vector ``loaded`` of elements stored as ``storage`` (codec.py:
    uint16 bits of float16, int16 bits of bfloat16)."""
    if storage == types.uint16:
        return builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(), WIDTH)), _V32)
    if storage == types.int16:
        wide = builder.shl(builder.zext(loaded, _VI32), ir.Constant(_VI32, [16] * WIDTH))
        return builder.bitcast(wide, _V32)
    return loaded


# numba's element type -> (the LLVM vector of WIDTH elements, its intrinsics' suffix)
_STORED = {
    types.float32: (_V32, f"v{WIDTH}f32"),
    types.uint16: (ir.VectorType(ir.IntType(16), WIDTH), f"v{WIDTH}i16"),
    types.int16: (ir.VectorType(ir.IntType(16), WIDTH), f"v{WIDTH}i16"),
}


def _scratch(array_type, element):
    return (
        isinstance(array_type, types.Array)
        and array_type.dtype == element
        and array_type.mutable
        and array_type.ndim == 1
        and array_type.layout == "C"
    )


def _vector_pointer(context, builder, array_type, array, at, vector):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())


# GlobalAveragePool's float32 block sums (docs/semantics.md): element j of a block goes to
# lane j % LANES, each lane adding in order from +0; then lane l + h is added to lane l for
# h = LANES / 2, ..., 1. LANES // WIDTH vectors side by side: their additions do not wait
# on each other.
LANES = 64


def _add_to_lanes(builder, data, start, count, end, storage, lanes, half_lines=False):
    """The LANES // WIDTH float32 vectors ``lanes`` after data[start:start + count] is added
    to them, element j to lane j % LANES; the elements past the last whole LANES with +0 in
    the lanes past them, which leaves a lane as it is (a lane is never -0: it starts at +0,
    and a sum is -0 only where both terms are), reading nothing at or past the array's
    ``end``. With ``half_lines`` (float32 elements), the whole runs of LANES are loaded
    half a vector at a time (_half_vector_loop)."""
    stored, suffix = _STORED[storage]
    vector_at = vectors_at(builder, data, start, stored)

    def add_vectors(i, values):
        return [
            builder.fadd(
                value,
                _float32_vector(
                    builder,
                    builder.load(vector_at(builder.add(i, ir.Constant(I64, k * WIDTH))), align=2),
                    storage,
                ),
            )
            for k, value in enumerate(values)
        ]

    if half_lines:
        values, whole = _half_vector_loop(builder, data, start, count, lanes)
    else:
        values, whole = vector_loop(builder, count, LANES, lanes, add_vectors)
    masked_load, _ = masked_memory(builder, stored, suffix)
    left = builder.trunc(builder.sub(count, whole), I32)
    below_left = splat(builder, left, WIDTH)
    zero = ir.Constant(stored, None)

    def inside(k):
        lane_numbers = ir.Constant(_VI32, list(range(k * WIDTH, (k + 1) * WIDTH)))
        return builder.icmp_unsigned("<", lane_numbers, below_left)

    def add_loaded(value, loaded):
        return builder.fadd(value, _float32_vector(builder, loaded, storage))

    # The elements past the last whole LANES. Where the LANES elements from them lie
    # inside the array (every channel but the last few), each vector that holds one of
    # them is a plain load, in a branch of its own taken the same way channel after
    # channel; near the array's end, masked loads. One check of the array's end for the
    # whole tail, not one per vector: over 7x7 channels, where the tail is each channel's
    # whole sum, 0.81 to 0.85 of the time.
    before = builder.block
    with builder.if_then(builder.icmp_unsigned("!=", left, ir.Constant(I32, 0))):
        with builder.if_else(fits_before(builder, start, whole, LANES, end)) as (inner, edge):
            with inner:
                straight = []
                for k, value in enumerate(values):
                    skipped = builder.block
                    with builder.if_then(
                        builder.icmp_unsigned(">", left, ir.Constant(I32, k * WIDTH))
                    ):
                        offset = builder.add(whole, ir.Constant(I64, k * WIDTH))
                        loaded = builder.load(vector_at(offset), align=2)
                        # the lanes past the elements selected away only in the vector the
                        # elements end in: over 7x7 channels 0.90 to 0.94 of the time of
                        # a select in every vector (which LLVM makes of a branch around
                        # the select alone)
                        ends_past = builder.icmp_unsigned(
                            ">=", left, ir.Constant(I32, (k + 1) * WIDTH)
                        )
                        with builder.if_else(ends_past) as (whole_vector, ending):
                            with whole_vector:
                                all_lanes = add_loaded(value, loaded)
                                all_block = builder.block
                            with ending:
                                some_lanes = add_loaded(
                                    value, builder.select(inside(k), loaded, zero)
                                )
                                some_block = builder.block
                        added = builder.phi(_V32)
                        added.add_incoming(all_lanes, all_block)
                        added.add_incoming(some_lanes, some_block)
                        taken = builder.block
                    phi = builder.phi(_V32)
                    phi.add_incoming(value, skipped)
                    phi.add_incoming(added, taken)
                    straight.append(phi)
                inner_block = builder.block
            with edge:
                # near the array's end: masked loads, which read no lane past the elements
                # left (a vector with none of them reads nothing)
                at_edge = [
                    add_loaded(
                        value,
                        builder.call(
                            masked_load,
                            [
                                vector_at(builder.add(whole, ir.Constant(I64, k * WIDTH))),
                                ir.Constant(I32, 2),
                                inside(k),
                                zero,
                            ],
                        ),
                    )
                    for k, value in enumerate(values)
                ]
                edge_block = builder.block
        tail_values = _joined(builder, (straight, inner_block), (at_edge, edge_block))
        with_tail = builder.block
    return _joined(builder, (values, before), (tail_values, with_tail))


# float32 lanes loaded at a time where a block's loads are half lines (_half_vector_loop)
_HALF_WIDTH = WIDTH // 2


def _half_vector_loop(builder, data, start, count, lanes):
    """vector_loop over the whole runs of LANES float32 elements from data[start], added
    to the float32 vectors ``lanes`` as _add_to_lanes adds them, but each vector of WIDTH
    lanes carried as two of _HALF_WIDTH, loaded half a vector (32 bytes) at a time: each
    lane adds the same elements in the same order. Returns (the vectors after it,
    ``whole``)."""
    vector_at = vectors_at(builder, data, start, ir.VectorType(F32, _HALF_WIDTH))
    halves = [
        ir.Constant(ir.VectorType(I32, _HALF_WIDTH), list(range(first, first + _HALF_WIDTH)))
        for first in (0, _HALF_WIDTH)
    ]
    split = [builder.shuffle_vector(value, value, half) for value in lanes for half in halves]

    def add_halves(i, values):
        return [
            builder.fadd(
                value,
                builder.load(vector_at(builder.add(i, ir.Constant(I64, k * _HALF_WIDTH))), align=2),
            )
            for k, value in enumerate(values)
        ]

    added, whole = vector_loop(builder, count, LANES, split, add_halves)
    both = ir.Constant(_VI32, list(range(WIDTH)))
    joined = [
        builder.shuffle_vector(added[2 * k], added[2 * k + 1], both) for k in range(len(lanes))
    ]
    return joined, whole


def _joined(builder, *incoming):
    """Where branches meet: a phi for each value, taking its value in each of the
    (values, block) pairs ``incoming`` from that block."""
    phis = []
    for values in zip(*(values for values, _ in incoming)):
        phi = builder.phi(values[0].type)
        for value, (_, block) in zip(values, incoming):
            phi.add_incoming(value, block)
        phis.append(phi)
    return phis


def _lane_tree(builder, vectors):
    """Lane 0 after lane l + h is added to lane l, for h = LANES / 2, ..., 1."""
    while len(vectors) > 1:  # h from LANES / 2 down to WIDTH: whole vectors
        half = len(vectors) // 2
        vectors = [builder.fadd(vectors[k], vectors[k + half]) for k in range(half)]
    return _halved(builder, vectors[0], builder.fadd)  # then within the vector


def _halved(builder, vector, combine):
    """Lane 0 of ``vector`` after lane l is combined with lane l + h (``combine(lane l,
    lane l + h)``, lane by lane), for h = lanes / 2, ..., 1: each step on the two halves
    of what the step before left."""
    width = vector.type.count
    while width > 1:
        width //= 2
        halves = [
            ir.Constant(ir.VectorType(I32, width), list(range(k, k + width))) for k in (0, width)
        ]
        vector = combine(*(builder.shuffle_vector(vector, vector, half) for half in halves))
    return builder.extract_element(vector, ir.Constant(I32, 0))


def _block_arguments(flat, start, count):
    return (
        isinstance(flat, types.Array)
        and flat.dtype in _STORED
        and isinstance(start, types.Integer)
        and isinstance(count, types.Integer)
    )


def _block_sum_codegen(half_lines):
    def codegen(context, builder, signature, args):
        flat = context.make_array(signature.args[0])(context, builder, args[0])
        start, count, storage = args[1], args[2], signature.args[0].dtype
        zeros = [ir.Constant(_V32, [0.0] * WIDTH)] * (LANES // WIDTH)
        one_run = builder.icmp_unsigned("<=", count, ir.Constant(I64, LANES))
        with builder.if_else(one_run) as (short, long):
            with short:
                lanes = _straight_lanes(builder, flat.data, start, count, flat.nitems, storage)
                # a lane added from +0 is never -0, and nor is a sum of such lanes; here
                # the lanes are the elements themselves, so a zero total may be -0
                short_total = builder.fadd(_lane_tree(builder, lanes), ir.Constant(F32, 0.0))
                short_block = builder.block
            with long:
                lanes = _add_to_lanes(
                    builder,
                    flat.data,
                    start,
                    count,
                    flat.nitems,
                    storage,
                    zeros,
                    half_lines and storage == types.float32,
                )
                long_total = _lane_tree(builder, lanes)
                long_block = builder.block
        (total,) = _joined(builder, ([short_total], short_block), ([long_total], long_block))
        return total

    return codegen


@intrinsic
def block_sum(typingctx, flat, start, count):
    """``(flat, start, count) -> float32``: the float32 block sum (LANES) of
    flat[start:start + count] (float32, or 16-bit floats stored as codec.py says): a block
    of at most LANES elements (a 7x7 channel) in straight code (_straight_lanes), a longer
    one through _add_to_lanes."""
    if not _block_arguments(flat, start, count):
        return None
    return types.float32(flat, types.uint64, types.uint64), _block_sum_codegen(False)


@intrinsic
def half_line_block_sum(typingctx, flat, start, count):
    """block_sum, but a float32 block longer than LANES loaded half a vector (32 bytes) at
    a time (_half_vector_loop): the same sum, bit for bit (16-bit floats are loaded half a
    line at a time either way). For channels that start on 32 bytes: where that pays,
    global_.half_line_sum_units says."""
    if not _block_arguments(flat, start, count):
        return None
    return types.float32(flat, types.uint64, types.uint64), _block_sum_codegen(True)


def _straight_lanes(builder, data, start, count, end, storage):
    """The LANES // WIDTH vectors of float32 lanes of a block of count <= LANES elements
    from data[start], element j in lane j, +0 in the lanes past them (each element once,
    not added to +0: block_sum's caller makes a -0 total +0), with no loop: plain loads
    and selects where the LANES elements from ``start`` lie before the array's ``end``,
    masked loads near it. GlobalAveragePool over 32x2048x7x7 float32 on one core took
    0.72 of the time of _add_to_lanes, whose branches over the elements past the last
    whole LANES cost more than the loads."""
    stored, suffix = _STORED[storage]
    vector_at = vectors_at(builder, data, start, stored)
    below = splat(builder, builder.trunc(count, I32), WIDTH)
    zero = ir.Constant(stored, None)
    inside = [
        builder.icmp_unsigned(
            "<", ir.Constant(_VI32, list(range(k * WIDTH, (k + 1) * WIDTH))), below
        )
        for k in range(LANES // WIDTH)
    ]
    offsets = [ir.Constant(I64, k * WIDTH) for k in range(LANES // WIDTH)]
    fits = fits_before(builder, start, ir.Constant(I64, 0), LANES, end)
    with builder.if_else(fits) as (inner, edge):
        with inner:
            plain = [
                _float32_vector(
                    builder,
                    builder.select(mask, builder.load(vector_at(offset), align=2), zero),
                    storage,
                )
                for mask, offset in zip(inside, offsets)
            ]
            inner_block = builder.block
        with edge:
            masked_load, _ = masked_memory(builder, stored, suffix)
            masked = [
                _float32_vector(
                    builder,
                    builder.call(masked_load, [vector_at(offset), ir.Constant(I32, 2), mask, zero]),
                    storage,
                )
                for mask, offset in zip(inside, offsets)
            ]
            edge_block = builder.block
    return _joined(builder, (plain, inner_block), (masked, edge_block))


@intrinsic
def add_to_lanes(typingctx, flat, start, count, lanes):
    """``(flat, start, count, lanes)``: flat[start:start + count] added to the LANES float32
    lanes[0:LANES], element j to lane j % LANES, as block_sum adds them: a block summed
    across slabs of its channel (numbapool.dask)."""
    if not (_block_arguments(flat, start, count) and _scratch(lanes, types.float32)):
        return None
    signature = types.none(flat, types.uint64, types.uint64, lanes)

    def codegen(context, builder, signature, args):
        flat = context.make_array(signature.args[0])(context, builder, args[0])
        pointers = [
            _vector_pointer(
                context, builder, signature.args[3], args[3], ir.Constant(I64, k * WIDTH), _V32
            )
            for k in range(LANES // WIDTH)
        ]
        added = _add_to_lanes(
            builder,
            flat.data,
            args[1],
            args[2],
            flat.nitems,
            signature.args[0].dtype,
            [builder.load(pointer, align=4) for pointer in pointers],
        )
        for value, pointer in zip(added, pointers):
            builder.store(value, pointer, align=4)
        return context.get_dummy_value()

    return signature, codegen


def _fold_last(builder, values, count, lanes, fold_ending_vector, fold_masked):
    """The values of a maximum's loop after the elements past its last whole vector:
    ``fold_ending_vector(values, offset)`` folds the vector at ``offset`` (count - lanes),
    the one that ends at the channel's end, where count >= lanes (it overlaps the vector
    before, which a maximum takes as once); ``fold_masked(values)`` folds a shorter
    channel's elements in one masked load."""
    one_vector = ir.Constant(I64, lanes)
    with builder.if_else(builder.icmp_unsigned(">=", count, one_vector)) as (long, short):
        with long:
            long_values = fold_ending_vector(values, builder.sub(count, one_vector))
            long_block = builder.block
        with short:
            short_values = fold_masked(values)
            short_block = builder.block
    merged = []
    for from_long, from_short in zip(long_values, short_values):
        phi = builder.phi(from_long.type)
        phi.add_incoming(from_long, long_block)
        phi.add_incoming(from_short, short_block)
        merged.append(phi)
    return merged


@intrinsic
def vector_key_max(typingctx, bits, start, count, magnitude_mask, sign_shift):
    """``(bits, start, count, magnitude_mask, sign_shift) -> (largest key, largest
    magnitude)`` over the signed integers bits[start:start + count] (a channel's float
    bit patterns, count >= 1): the largest of their order keys (global_.order_key: bits
    ^ ((bits >> sign_shift) & magnitude_mask)) and of their magnitudes (bits &
    magnitude_mask), each a 512-bit vector at a time, the last elements in one load
    (vectors.load_within) whose lanes past the end take no part."""
    if not (
        isinstance(bits, types.Array)
        and isinstance(bits.dtype, types.Integer)
        and bits.dtype.signed
        and bits.dtype.bitwidth in (16, 32, 64)
    ):
        return None
    element = bits.dtype
    signature = types.UniTuple(element, 2)(bits, types.uint64, types.uint64, element, element)
    lanes = 512 // element.bitwidth
    scalar = ir.IntType(element.bitwidth)
    vector = ir.VectorType(scalar, lanes)
    suffix = f"v{lanes}i{element.bitwidth}"

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        data, nitems = array.data, array.nitems
        start, count = args[1], args[2]
        mask, shift = splat(builder, args[3], lanes), splat(builder, args[4], lanes)
        smallest = ir.Constant(vector, [-(1 << (element.bitwidth - 1))] * lanes)
        vector_at = vectors_at(builder, data, start, vector)

        def keys_and_magnitudes(loaded):
            key = builder.xor(loaded, builder.and_(builder.ashr(loaded, shift), mask))
            return key, builder.and_(loaded, mask)

        def fold(best, new):
            return [builder.select(builder.icmp_signed(">", a, b), a, b) for a, b in zip(best, new)]

        best, whole = vector_loop(
            builder,
            count,
            lanes,
            [smallest, ir.Constant(vector, [0] * lanes)],
            lambda i, best: fold(best, keys_and_magnitudes(builder.load(vector_at(i), align=2))),
        )

        def fold_masked(best):
            inside = left_lanes(builder, count, whole, 0, lanes)
            masked_load, _ = masked_memory(builder, vector, suffix)
            loaded = load_within(
                builder,
                vector_at(whole),
                inside,
                ir.Constant(vector, None),
                fits_before(builder, start, whole, lanes, nitems),
                masked_load,
                2,
            )
            key, magnitude = keys_and_magnitudes(loaded)
            key = builder.select(inside, key, smallest)  # lanes past the end: no part
            magnitude = builder.select(inside, magnitude, ir.Constant(vector, [0] * lanes))
            return fold(best, (key, magnitude))

        best = _fold_last(
            builder,
            best,
            count,
            lanes,
            lambda best, offset: fold(
                best, keys_and_magnitudes(builder.load(vector_at(offset), align=2))
            ),
            fold_masked,
        )
        results = [
            builder.call(
                declare(builder, f"llvm.vector.reduce.smax.{suffix}", scalar, [vector]), [value]
            )
            for value in best
        ]
        return context.make_tuple(builder, signature.return_type, results)

    return signature, codegen


# Channels of one to this many vectors take store_float_max's straight way
STRAIGHT_VECTORS = 4


def _covering_loads(builder, vector_at, count, lanes, alignment):
    """STRAIGHT_VECTORS vectors that cover a channel of ``count`` elements, one to
    STRAIGHT_VECTORS vectors of ``lanes``, with no branch: the k-th from element
    min(k * lanes, count - lanes). A maximum takes an element read twice as once."""
    last = builder.sub(count, ir.Constant(I64, lanes))
    loaded = []
    for k in range(STRAIGHT_VECTORS):
        offset = ir.Constant(I64, k * lanes)
        at = builder.select(builder.icmp_unsigned("<", offset, last), offset, last)
        loaded.append(builder.load(vector_at(at), align=alignment))
    return loaded


def _pairwise(values, combine):
    """``values`` (a power of two of them) combined in pairs, then the pairs' results in
    pairs, down to one."""
    while len(values) > 1:
        values = [combine(a, b) for a, b in zip(values[0::2], values[1::2])]
    return values[0]


def _larger(builder, a, b):
    """Lane by lane the larger of a and b, b where either is NaN: one max instruction, with
    no value left undefined by a NaN (a maximum LLVM may assume free of them)."""
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)


def _straight_float_max(builder, vector_at, count, lanes, alignment):
    """(largest, any NaN) over a channel of one to STRAIGHT_VECTORS vectors, with no loop
    and no branch: the loads that cover it (_covering_loads), one NaN test for each pair
    of them (unordered where either lane is a NaN), the largest of the lanes by halving
    the vector, whose value, wherever a NaN was, the NaN flag discards."""
    loaded = _covering_loads(builder, vector_at, count, lanes, alignment)
    nan = _pairwise(
        [builder.fcmp_unordered("uno", a, b) for a, b in zip(loaded[0::2], loaded[1::2])],
        builder.or_,
    )
    larger = functools.partial(_larger, builder)
    bits = ir.IntType(lanes)
    return (
        _halved(builder, _pairwise(loaded, larger), larger),
        builder.icmp_unsigned("!=", builder.bitcast(nan, bits), ir.Constant(bits, 0)),
    )


@intrinsic
def store_float_max(typingctx, flat, start, count, y, out):
    """``(flat, start, count, y, out) -> stored``: store in y[out] the largest of the
    float32 or float64 elements flat[start:start + count] (count >= 1), and return True,
    unless one of them is NaN or the largest is a zero (+0 and -0 compare equal; the
    caller takes such a channel again in order). Otherwise equal floats have equal bits:
    the largest is the first largest. A maximum a 512-bit vector at a time, where order
    keys (vector_key_max) take five integer operations.

    A channel of one to STRAIGHT_VECTORS vectors in straight code
    (_straight_float_max): over 32x2048x7x7 float32 on one core, 0.75 of the time of the
    loop below, whose branches and reduction cost more than the loads. Otherwise a loop
    over the whole vectors, one compare for the NaNs of both halves of each (unordered
    is true where either lane is a NaN), then by _fold_last the vector that ends at the
    channel's end (a maximum and a NaN flag take an element twice as once), or a shorter
    channel's in one load (vectors.load_within) whose lanes past the end hold -inf: over
    4x256x56x56 float32, 0.79 of the time of a compare for each half and a masked last
    vector.
    """
    if not (
        isinstance(flat, types.Array)
        and flat.dtype in (types.float32, types.float64)
        and isinstance(start, types.Integer)
        and isinstance(count, types.Integer)
        and _scratch(y, flat.dtype)
        and isinstance(out, types.Integer)
    ):
        return None
    element = flat.dtype
    signature = types.boolean(flat, types.uint64, types.uint64, y, types.uint64)
    lanes = 512 // element.bitwidth
    half = lanes // 2
    scalar = F32 if element == types.float32 else ir.DoubleType()
    vector = ir.VectorType(scalar, lanes)
    # the NaN flags as lanes of all ones or zeros as wide as the elements, as a compare
    # leaves them in a register: as bits (i1 lanes) LLVM packed them to bytes at every
    # vector without AVX-512
    width = ir.IntType(element.bitwidth)
    flags = ir.VectorType(width, half)
    halves = [ir.Constant(ir.VectorType(I32, half), list(range(k, k + half))) for k in (0, half)]
    suffix = f"v{lanes}f{element.bitwidth}"

    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        data, nitems = array.data, array.nitems
        start, count = args[1], args[2]
        vector_at = vectors_at(builder, data, start, vector)
        lowest = ir.Constant(vector, [float("-inf")] * lanes)

        def looped():
            """(largest, any NaN) by the loop."""

            def fold(values, loaded):
                best, nan = values
                # a NaN compares false: the kept value stays
                best = builder.select(builder.fcmp_ordered(">", loaded, best), loaded, best)
                low, high = (builder.shuffle_vector(loaded, loaded, picked) for picked in halves)
                return best, builder.or_(
                    nan, builder.sext(builder.fcmp_unordered("uno", low, high), flags)
                )

            values, whole = vector_loop(
                builder,
                count,
                lanes,
                [lowest, ir.Constant(flags, [0] * half)],
                lambda i, values: fold(values, builder.load(vector_at(i), align=4)),
            )

            def fold_masked(values):
                masked_load, _ = masked_memory(builder, vector, suffix)
                loaded = load_within(
                    builder,
                    vector_at(whole),
                    left_lanes(builder, count, whole, 0, lanes),
                    lowest,
                    fits_before(builder, start, whole, lanes, nitems),
                    masked_load,
                    4,
                )
                return fold(values, loaded)

            best, nan = _fold_last(
                builder,
                values,
                count,
                lanes,
                lambda values, offset: fold(values, builder.load(vector_at(offset), align=4)),
                fold_masked,
            )
            # no NaN among the lanes kept, and a NaN anywhere rescans: maxnum's reduction
            largest = builder.call(
                declare(builder, f"llvm.vector.reduce.fmax.{suffix}", scalar, [vector]),
                [best],
                fastmath=("nnan",),
            )
            any_nan = builder.icmp_unsigned(
                "!=",
                builder.call(
                    declare(
                        builder, f"llvm.vector.reduce.or.v{half}i{element.bitwidth}", width, [flags]
                    ),
                    [nan],
                ),
                ir.Constant(width, 0),
            )
            return largest, any_nan

        straight = builder.and_(
            builder.icmp_unsigned(">=", count, ir.Constant(I64, lanes)),
            builder.icmp_unsigned("<=", count, ir.Constant(I64, STRAIGHT_VECTORS * lanes)),
        )
        with builder.if_else(straight) as (in_straight, in_loop):
            with in_straight:
                straight_results = _straight_float_max(builder, vector_at, count, lanes, 4)
                straight_block = builder.block
            with in_loop:
                loop_results = looped()
                loop_block = builder.block
        largest, any_nan = _joined(
            builder, (straight_results, straight_block), (loop_results, loop_block)
        )
        rescan = builder.or_(any_nan, builder.fcmp_ordered("==", largest, ir.Constant(scalar, 0.0)))
        before = builder.block
        with builder.if_then(builder.not_(rescan)):
            pointer = _vector_pointer(context, builder, signature.args[3], args[3], args[4], scalar)
            builder.store(largest, pointer)
            stored_block = builder.block
        # the store taken as almost always (llvm.expect's weights): LLVM keeps the branch,
        # where it could merge the test into a select of what to store (over 7x7 channels
        # 0.96 of the time of the looped way against 0.75)
        before.terminator.set_weights([2000, 1])
        stored = builder.phi(ir.IntType(1))
        stored.add_incoming(ir.Constant(ir.IntType(1), 1), stored_block)
        stored.add_incoming(ir.Constant(ir.IntType(1), 0), before)
        return stored

    return signature, codegen
