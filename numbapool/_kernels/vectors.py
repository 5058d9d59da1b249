"""Loops written as LLVM vector code, where numba's loops vectorize badly.

GlobalAveragePool's float32 block sums (block_sum, add_to_lanes): their order is the rule
of docs/semantics.md, lane by lane, which numba's loop would not keep; four vectors of
float32 lanes side by side, the elements past the last whole run of lanes in masked loads,
which read nothing past the channel. float32 elements, and float16 and bfloat16 ones as
codec.py stores them, decoded a vector at a time.
GlobalMaxPool's largest of a channel (vector_float_max, and vector_key_max over the order
keys of 16-bit floats) goes the same way, and
so does MaxPool's fold of input rows of 8- and 16-bit elements (row_fold_first,
row_fold_more), whose rows of a hundred elements or so numba's loop left mostly to its
scalar leftovers, its windows 3 wide at step 2 over 8-bit elements
(three_wide_step_two), and whether rows of elements (a unit's column maxima or input rows,
a plane) hold a -0 or a NaN (rows_hold_negative_zero_or_nan), before zero outputs are taken
again in row-major order."""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

WIDTH = 16  # float32 lanes in a vector of the block sums
_I1, _I32, _I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()
_V32 = ir.VectorType(_F32, WIDTH)
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


def _counted_loop(builder, end, step, initial, add):
    """Emit a loop over i in [0, end) by ``step`` (end a multiple of it), carrying the LLVM
    values ``initial``: each pass replaces them with ``add(i, values)``, which may emit
    blocks of its own. Returns the values after it, the builder placed after the loop."""
    entry = builder.block
    head = builder.append_basic_block("loop.head")
    body = builder.append_basic_block("loop.body")
    done = builder.append_basic_block("loop.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    i.add_incoming(ir.Constant(_I64, 0), entry)
    values = [builder.phi(value.type) for value in initial]
    for phi, value in zip(values, initial):
        phi.add_incoming(value, entry)
    builder.cbranch(builder.icmp_unsigned("<", i, end), body, done)
    builder.position_at_end(body)
    for phi, value in zip(values, add(i, values)):
        phi.add_incoming(value, builder.block)
    i.add_incoming(builder.add(i, ir.Constant(_I64, step)), builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return values


def _vector_loop(builder, count, step, initial, add):
    """_counted_loop over i in [0, whole) by ``step``, ``whole`` the multiple of ``step``
    (a power of two) at most ``count``. Returns (the values after it, ``whole``): the
    elements [whole, count) remain."""
    whole = builder.and_(count, ir.Constant(_I64, -step))
    return _counted_loop(builder, whole, step, initial, add), whole


def _left_lanes(builder, count, whole, first, lanes):
    """Which of the lanes [first, first + lanes) hold one of the count - whole elements
    left after _vector_loop: the mask of a masked load, made as the bits of its first
    lanes (at most 64). Made from compares of the lanes' numbers, 64 lanes wide, it made
    three_wide_step_two's masked path 1.4x slower than numba's loop."""
    zero = ir.Constant(_I64, 0)
    inside = builder.sub(builder.sub(count, whole), ir.Constant(_I64, first))
    inside = builder.select(builder.icmp_signed("<", inside, zero), zero, inside)
    below = builder.icmp_signed("<", inside, ir.Constant(_I64, lanes))
    bits = builder.sub(builder.shl(ir.Constant(_I64, 1), builder.select(below, inside, zero)),
                       ir.Constant(_I64, 1))
    bits = builder.select(below, bits, ir.Constant(_I64, -1))
    if lanes < 64:
        bits = builder.trunc(bits, ir.IntType(lanes))
    return builder.bitcast(bits, ir.VectorType(_I1, lanes))


def _last_vector(builder, count, whole, lanes, again, masked):
    """The elements left after ``whole`` (fewer than ``lanes``, maybe none): the last whole
    vector again, ending at ``count`` (``again(start)``, overlapping the one before: the
    same values written twice), or, where ``count`` is under one vector's length,
    ``masked()``, with masked loads and a masked store."""
    left = builder.icmp_unsigned("<", whole, count)
    long = builder.icmp_unsigned(">=", count, ir.Constant(_I64, lanes))
    with builder.if_then(left):
        with builder.if_else(long) as (overlapping, short):
            with overlapping:
                again(builder.sub(count, ir.Constant(_I64, lanes)))
            with short:
                masked()


def _masked_memory(builder, vector, suffix):
    """(llvm.masked.load, llvm.masked.store) of ``vector`` (``suffix`` its LLVM name)."""
    pointer = vector.as_pointer()
    mask_type = ir.VectorType(_I1, vector.count)
    return (_declare(builder, f"llvm.masked.load.{suffix}.p0", vector,
                     [pointer, _I32, mask_type, vector]),
            _declare(builder, f"llvm.masked.store.{suffix}.p0", ir.VoidType(),
                     [vector, pointer, _I32, mask_type]))


def _integer_compare(builder, compare, operator, a, b):
    """``a operator b`` for 8-bit elements, ``compare`` "signed" or "unsigned" (_FOLDED)."""
    if compare == "signed":
        return builder.icmp_signed(operator, a, b)
    return builder.icmp_unsigned(operator, a, b)


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
_STORED = {types.float32: (_V32, f"v{WIDTH}f32"),
           types.uint16: (ir.VectorType(ir.IntType(16), WIDTH), f"v{WIDTH}i16"),
           types.int16: (ir.VectorType(ir.IntType(16), WIDTH), f"v{WIDTH}i16")}


def _scratch(array_type, element):
    return (isinstance(array_type, types.Array) and array_type.dtype == element
            and array_type.mutable and array_type.ndim == 1 and array_type.layout == "C")


def _vectors_at(builder, data, start, vector):
    """offset -> a pointer to the ``vector`` of elements from data[start + offset]."""
    pointer = vector.as_pointer()
    return lambda offset: builder.bitcast(builder.gep(data, [builder.add(start, offset)]),
                                          pointer)


def _vector_pointer(context, builder, array_type, array, at, vector):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [at]), vector.as_pointer())


# GlobalAveragePool's float32 block sums (docs/semantics.md): element j of a block goes to
# lane j % LANES, each lane adding in order from +0; then lane l + h is added to lane l for
# h = LANES / 2, ..., 1. LANES // WIDTH vectors side by side: their additions do not wait
# on each other.
LANES = 64


def _add_to_lanes(builder, data, start, count, storage, lanes):
    """The LANES // WIDTH float32 vectors ``lanes`` after data[start:start + count] is added
    to them, element j to lane j % LANES; the elements past the last whole LANES in masked
    loads whose lanes past the end load +0, which leaves a lane as it is (a lane is never
    -0: it starts at +0, and a sum is -0 only where both terms are)."""
    stored, suffix = _STORED[storage]
    vector_at = _vectors_at(builder, data, start, stored)

    def add_vectors(i, values):
        return [builder.fadd(value, _float32_vector(builder, builder.load(
            vector_at(builder.add(i, ir.Constant(_I64, k * WIDTH))), align=2), storage))
            for k, value in enumerate(values)]

    values, whole = _vector_loop(builder, count, LANES, lanes, add_vectors)
    masked_load, _ = _masked_memory(builder, stored, suffix)
    # each vector that holds one of the elements left: a branch of its own, taken the same
    # way channel after channel, and the masks compared in 32 bits
    left = builder.trunc(builder.sub(count, whole), _I32)
    below_left = _splat(builder, left, WIDTH)
    results = []
    for k, value in enumerate(values):
        before = builder.block
        with builder.if_then(builder.icmp_unsigned(">", left, ir.Constant(_I32, k * WIDTH))):
            lane_numbers = ir.Constant(_VI32, list(range(k * WIDTH, (k + 1) * WIDTH)))
            inside = builder.icmp_unsigned("<", lane_numbers, below_left)
            loaded = builder.call(masked_load, [
                vector_at(builder.add(whole, ir.Constant(_I64, k * WIDTH))), ir.Constant(_I32, 2),
                inside, ir.Constant(stored, None)])
            added = builder.fadd(value, _float32_vector(builder, loaded, storage))
            tail = builder.block
        phi = builder.phi(_V32)
        phi.add_incoming(value, before)
        phi.add_incoming(added, tail)
        results.append(phi)
    return results


def _lane_tree(builder, vectors):
    """Lane 0 after lane l + h is added to lane l, for h = LANES / 2, ..., 1."""
    while len(vectors) > 1:  # h from LANES / 2 down to WIDTH: whole vectors
        half = len(vectors) // 2
        vectors = [builder.fadd(vectors[k], vectors[k + half]) for k in range(half)]
    vector = vectors[0]
    half = WIDTH // 2
    while half:  # then within the vector
        upper = ir.Constant(_VI32, [(lane + half) % WIDTH for lane in range(WIDTH)])
        vector = builder.fadd(vector, builder.shuffle_vector(vector, vector, upper))
        half //= 2
    return builder.extract_element(vector, ir.Constant(_I32, 0))


def _block_arguments(flat, start, count):
    return (isinstance(flat, types.Array) and flat.dtype in _STORED
            and isinstance(start, types.Integer) and isinstance(count, types.Integer))


@intrinsic
def block_sum(typingctx, flat, start, count):
    """``(flat, start, count) -> float32``: the float32 block sum (LANES) of
    flat[start:start + count] (float32, or 16-bit floats stored as codec.py says)."""
    if not _block_arguments(flat, start, count):
        return None
    signature = types.float32(flat, types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        zeros = [ir.Constant(_V32, [0.0] * WIDTH)] * (LANES // WIDTH)
        return _lane_tree(builder, _add_to_lanes(builder, data, args[1], args[2],
                                                 signature.args[0].dtype, zeros))

    return signature, codegen


@intrinsic
def add_to_lanes(typingctx, flat, start, count, lanes):
    """``(flat, start, count, lanes)``: flat[start:start + count] added to the LANES float32
    lanes[0:LANES], element j to lane j % LANES, as block_sum adds them: a block summed
    across slabs of its channel (numbapool.dask)."""
    if not (_block_arguments(flat, start, count) and _scratch(lanes, types.float32)):
        return None
    signature = types.none(flat, types.uint64, types.uint64, lanes)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        pointers = [_vector_pointer(context, builder, signature.args[3], args[3],
                                    ir.Constant(_I64, k * WIDTH), _V32)
                    for k in range(LANES // WIDTH)]
        added = _add_to_lanes(builder, data, args[1], args[2], signature.args[0].dtype,
                              [builder.load(pointer, align=4) for pointer in pointers])
        for value, pointer in zip(added, pointers):
            builder.store(value, pointer, align=4)
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
        vector_at = _vectors_at(builder, data, start, vector)

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
        masked_load, _ = _masked_memory(builder, vector, suffix)
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


# The bits of +inf per element type as the kernels store it (codec.py: uint16 holds
# float16, int16 bfloat16); a magnitude's bits past them are a NaN's
_INFINITY_BITS = {types.float32: 0x7F800000, types.float64: 0x7FF0000000000000,
                  types.uint16: 0x7C00, types.int16: 0x7F80}


@intrinsic
def rows_hold_negative_zero_or_nan(typingctx, flat, row_starts, rows, count):
    """``(flat, row_starts, rows, count) -> whether any of the rows
    flat[row_starts[r]:row_starts[r] + count], r < rows, holds a -0 or a NaN``, over
    float32 or float64 elements or 16-bit float storage (codec.py). Each element's bits as
    an unsigned key, twice its magnitude less its sign bit: -0's is all ones, a NaN's
    above twice infinity's, and no other's (+0's is 0, infinity's twice infinity's or one
    less). The largest key of all the rows is kept 512 bits at a time, the last elements
    of each row in one masked load whose lanes past the end load 0, and compared once.

    numba's loop over the bits took 0.08 ns an element on rows of 112, most of it in its
    scalar leftovers. A call per row cost as much for 16 elements as for 112, and compare
    flags or-ed 512 bits at a time wait on each other: over a ReLU's outputs the resnet
    stem took 1.32x as long with a call per row, 1.21x with the flags (1 thread)."""
    if not (isinstance(flat, types.Array) and flat.ndim == 1 and flat.layout == "C"
            and flat.dtype in _INFINITY_BITS and isinstance(row_starts, types.Array)
            and row_starts.ndim == 1 and row_starts.dtype == types.int64):
        return None
    width = flat.dtype.bitwidth
    lanes = 512 // width
    element = ir.IntType(width)
    vector = ir.VectorType(element, lanes)
    suffix = f"v{lanes}i{width}"
    infinity = _INFINITY_BITS[flat.dtype]

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        starts = context.make_array(signature.args[1])(context, builder, args[1]).data
        rows, count = args[2], args[3]
        one = ir.Constant(vector, [1] * lanes)
        sign_shift = ir.Constant(vector, [width - 1] * lanes)
        masked_load, _ = _masked_memory(builder, vector, suffix)

        def largest_key(largest, loaded):
            key = builder.sub(builder.shl(loaded, one), builder.lshr(loaded, sign_shift))
            return builder.select(builder.icmp_unsigned(">", key, largest), key, largest)

        def row_largest(row, largest):
            vector_at = _vectors_at(builder, data, builder.load(builder.gep(starts, [row])),
                                    vector)
            (largest,), whole = _vector_loop(
                builder, count, lanes, largest,
                lambda i, largest: [largest_key(largest[0],
                                                builder.load(vector_at(i), align=2))])
            loaded = builder.call(masked_load, [vector_at(whole), ir.Constant(_I32, 2),
                                                _left_lanes(builder, count, whole, 0, lanes),
                                                ir.Constant(vector, [0] * lanes)])
            return [largest_key(largest, loaded)]

        (largest,) = _counted_loop(builder, rows, 1, [ir.Constant(vector, [0] * lanes)],
                                   row_largest)
        largest = builder.call(_declare(builder, f"llvm.vector.reduce.umax.{suffix}", element,
                                        [vector]), [largest])
        return builder.icmp_unsigned(">", largest, ir.Constant(element, 2 * infinity))

    return types.boolean(flat, row_starts, types.uint64, types.uint64), codegen


@intrinsic
def vector_float_max(typingctx, flat, start, count):
    """``(flat, start, count) -> (largest, any NaN)`` over the float32 or float64 elements
    flat[start:start + count] (count >= 1): the largest of those that are not NaN (-inf if
    none), whose bits are those of the first of them unless it is a zero (+0 and -0
    compare equal), and whether any is NaN: a compare and a maximum a 512-bit vector at a
    time, where order keys (vector_key_max) take five integer operations; the last
    elements in one masked load whose lanes past the end load -inf."""
    if not (isinstance(flat, types.Array) and flat.dtype in (types.float32, types.float64)
            and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None
    element = flat.dtype
    signature = types.Tuple((element, types.boolean))(flat, types.uint64, types.uint64)
    lanes = 512 // element.bitwidth
    scalar = _F32 if element == types.float32 else ir.DoubleType()
    vector = ir.VectorType(scalar, lanes)
    flags = ir.VectorType(_I1, lanes)
    suffix = f"v{lanes}f{element.bitwidth}"

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        start, count = args[1], args[2]
        vector_at = _vectors_at(builder, data, start, vector)
        lowest = ir.Constant(vector, [float("-inf")] * lanes)

        def fold(values, loaded):
            best, nan = values
            # a NaN compares false: the kept value stays
            best = builder.select(builder.fcmp_ordered(">", loaded, best), loaded, best)
            return best, builder.or_(nan, builder.fcmp_unordered("uno", loaded, loaded))

        values, whole = _vector_loop(
            builder, count, lanes, [lowest, ir.Constant(flags, [0] * lanes)],
            lambda i, values: fold(values, builder.load(vector_at(i), align=4)))
        masked_load, _ = _masked_memory(builder, vector, suffix)
        loaded = builder.call(masked_load, [vector_at(whole), ir.Constant(_I32, 4),
                                            _left_lanes(builder, count, whole, 0, lanes),
                                            lowest])
        best, nan = fold(values, loaded)
        # no NaN among the lanes kept, and a NaN anywhere rescans: maxnum's reduction
        largest = builder.call(_declare(builder, f"llvm.vector.reduce.fmax.{suffix}", scalar,
                                        [vector]), [best], fastmath=("nnan",))
        any_nan = builder.call(_declare(builder, f"llvm.vector.reduce.or.v{lanes}i1", _I1,
                                        [flags]), [nan])
        return context.make_tuple(builder, signature.return_type, [largest, any_nan])

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
                if compare in ("signed", "unsigned"):
                    keep = _integer_compare(builder, compare, ">=", a, b)
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

            def masked():
                masked_load, masked_store = _masked_memory(builder, vector, suffix)
                inside = _left_lanes(builder, count, whole, 0, lanes)
                alignment = ir.Constant(_I32, 1)
                result = folded(lambda p: builder.call(
                    masked_load, [p, alignment, inside, ir.Constant(vector, None)]), whole)
                builder.call(masked_store, [result, at(columns_data, base, whole), alignment,
                                            inside])

            _last_vector(builder, count, whole, lanes, lambda start: vectors(start, zero, 1),
                         masked)
            return context.get_dummy_value()

        return signature, codegen

    return row_fold


row_fold_first = _row_fold(False)
row_fold_more = _row_fold(True)


@intrinsic
def three_wide_step_two(typingctx, columns, target, base, count):
    """target[base + j] = the maximum of columns[2j], columns[2j + 1] and columns[2j + 2]
    for j < count, 8-bit integers (MaxPool's windows 3 wide at step 2 along the rows);
    ``columns`` holds 2 * count + 1 elements at least.

    64 outputs a vector: the even and odd elements of 128 columns and the odd ones of the
    128 from the next, each shuffled out of two vectors. The last outputs are the last whole
    vector again, ending at ``count`` (overlapping the one before: the same values written
    twice), or, under one vector's length, in masked loads and a masked store. numba's
    loop took 16 outputs a pass and left the rest (7 of the 55 a row of 112 bytes makes)
    to scalar leftovers (MaxPool 3x3 s2 uint8 0.77 of the time, rows of 56 bytes 0.67)."""
    if not (isinstance(columns, types.Array) and isinstance(target, types.Array)
            and columns.dtype == target.dtype and columns.dtype in _FOLDED
            and _FOLDED[columns.dtype][0] == _I8
            and isinstance(base, types.Integer) and isinstance(count, types.Integer)):
        return None
    signature = types.none(columns, target, types.uint64, types.uint64)
    element, lanes, suffix, compare = _FOLDED[columns.dtype]
    vector = ir.VectorType(element, lanes)
    evens = ir.Constant(ir.VectorType(_I32, lanes), list(range(0, 2 * lanes, 2)))
    odds = ir.Constant(ir.VectorType(_I32, lanes), list(range(1, 2 * lanes, 2)))

    def codegen(context, builder, sig, args):
        columns_data = context.make_array(sig.args[0])(context, builder, args[0]).data
        target_data = context.make_array(sig.args[1])(context, builder, args[1]).data
        base, count = args[2], args[3]
        pointer = vector.as_pointer()

        def at(data, start):
            return builder.bitcast(builder.gep(data, [start]), pointer)

        def maximum(a, b):
            return builder.select(_integer_compare(builder, compare, ">", a, b), a, b)

        def windows(load, j):
            start = builder.shl(j, ir.Constant(_I64, 1))  # column of output j's first tap
            first, second = load(start, 0), load(start, lanes)
            shifted, shifted_second = load(start, 1), load(start, lanes + 1)
            pair = maximum(builder.shuffle_vector(first, second, evens),
                           builder.shuffle_vector(first, second, odds))
            return maximum(pair, builder.shuffle_vector(shifted, shifted_second, odds))

        def whole_vector(start, offset):
            return builder.load(at(columns_data, builder.add(start, ir.Constant(_I64, offset))),
                                align=1)

        def store(j):
            builder.store(windows(whole_vector, j), at(target_data, builder.add(base, j)),
                          align=1)
            return []

        _, whole = _vector_loop(builder, count, lanes, [], lambda j, values: store(j))

        def masked():  # count < lanes: every column read lies below 2 * count + 1
            masked_load, masked_store = _masked_memory(builder, vector, suffix)
            alignment = ir.Constant(_I32, 1)
            columns_count = builder.add(builder.shl(count, ir.Constant(_I64, 1)),
                                        ir.Constant(_I64, 1))
            zero = ir.Constant(_I64, 0)

            def masked_vector(start, offset):
                inside = _left_lanes(builder, columns_count, zero, offset, lanes)
                return builder.call(masked_load, [
                    at(columns_data, builder.add(start, ir.Constant(_I64, offset))),
                    alignment, inside, ir.Constant(vector, None)])

            builder.call(masked_store, [windows(masked_vector, zero), at(target_data, base),
                                        alignment, _left_lanes(builder, count, zero, 0, lanes)])

        _last_vector(builder, count, whole, lanes, store, masked)
        return context.get_dummy_value()

    return signature, codegen
