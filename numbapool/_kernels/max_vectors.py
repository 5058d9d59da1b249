"""MaxPool's loops written as LLVM vector code (vectors.py): the fold of input rows of 8-
and 16-bit elements (row_fold_first, row_fold_more), whose rows of a hundred elements or
so numba's loop left mostly to its scalar leftovers, its windows 3 wide at step 2 over
every dtype (three_wide_step_two), and whether rows of elements (a unit's column maxima
or input rows, a plane) hold a -0 or a NaN (rows_hold_negative_zero_or_nan), before zero
outputs are taken again in row-major order."""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .vectors import (
    F32,
    I1,
    I32,
    I64,
    counted_loop,
    declare,
    left_lanes,
    masked_memory,
    vector_loop,
    vectors_at,
)


def _last_vector(builder, count, whole, lanes, again, masked):
    """The elements left after ``whole`` (fewer than ``lanes``, maybe none): the last whole
    vector again, ending at ``count`` (``again(start)``, overlapping the one before: the
    same values written twice), or, where ``count`` is under one vector's length,
    ``masked()``, with masked loads and a masked store."""
    left = builder.icmp_unsigned("<", whole, count)
    long = builder.icmp_unsigned(">=", count, ir.Constant(I64, lanes))
    with builder.if_then(left):
        with builder.if_else(long) as (overlapping, short):
            with overlapping:
                again(builder.sub(count, ir.Constant(I64, lanes)))
            with short:
                masked()


def _integer_compare(builder, compare, operator, a, b):
    """``a operator b`` for 8-bit elements, ``compare`` "signed" or "unsigned" (_FOLDED)."""
    if compare == "signed":
        return builder.icmp_signed(operator, a, b)
    return builder.icmp_unsigned(operator, a, b)


# The bits of +inf per element type as the kernels store it (codec.py: uint16 holds
# float16, int16 bfloat16); a magnitude's bits past them are a NaN's
_INFINITY_BITS = {
    types.float32: 0x7F800000,
    types.float64: 0x7FF0000000000000,
    types.uint16: 0x7C00,
    types.int16: 0x7F80,
}


@intrinsic
def rows_hold_negative_zero_or_nan(typingctx, flat, row_starts, rows, count):
    """``(flat, row_starts, rows, count) -> whether any of the rows
    flat[row_starts[r]:row_starts[r] + count], r < rows, holds a -0 or a NaN``, over
    float32 or float64 elements or 16-bit float storage (codec.py). Each element's bits as
    an unsigned key, twice its magnitude less its sign bit: -0's is all ones, a NaN's
    above twice infinity's, and no other's (+0's is 0, infinity's twice infinity's or one
    less). The largest key of all the rows is kept 512 bits at a time, the last elements
    of each row in one masked load whose lanes past the end load 0, and compared once.

    numba's loop over the bits spent most of its time in scalar leftovers; a call per row
    costs as much for 16 elements as for 112; compare flags or-ed 512 bits at a time wait
    on each other (over a ReLU's outputs the resnet stem took 1.2x as long with them)."""
    if not (
        isinstance(flat, types.Array)
        and flat.ndim == 1
        and flat.layout == "C"
        and flat.dtype in _INFINITY_BITS
        and isinstance(row_starts, types.Array)
        and row_starts.ndim == 1
        and row_starts.dtype == types.int64
    ):
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
        masked_load, _ = masked_memory(builder, vector, suffix)

        def largest_key(largest, loaded):
            key = builder.sub(builder.shl(loaded, one), builder.lshr(loaded, sign_shift))
            return builder.select(builder.icmp_unsigned(">", key, largest), key, largest)

        def row_largest(row, largest):
            vector_at = vectors_at(builder, data, builder.load(builder.gep(starts, [row])), vector)
            (largest,), whole = vector_loop(
                builder,
                count,
                lanes,
                largest,
                lambda i, largest: [largest_key(largest[0], builder.load(vector_at(i), align=2))],
            )
            loaded = builder.call(
                masked_load,
                [
                    vector_at(whole),
                    ir.Constant(I32, 2),
                    left_lanes(builder, count, whole, 0, lanes),
                    ir.Constant(vector, [0] * lanes),
                ],
            )
            return [largest_key(largest, loaded)]

        (largest,) = counted_loop(builder, rows, 1, [ir.Constant(vector, [0] * lanes)], row_largest)
        largest = builder.call(
            declare(builder, f"llvm.vector.reduce.umax.{suffix}", element, [vector]), [largest]
        )
        return builder.icmp_unsigned(">", largest, ir.Constant(element, 2 * infinity))

    return types.boolean(flat, row_starts, types.uint64, types.uint64), codegen


# The elements of MaxPool's vector loops: numba's type -> (LLVM's element, lanes in a
# vector, the intrinsics' suffix, how they compare). The row folds take 8- and 16-bit
# elements (columns.py keeps numba's loop for float32 and float64), three_wide_step_two
# all of them. 16-bit floats 16 to a vector, their values one 512-bit vector of float32
# (32 to a vector: MaxPool 3x3 s2 float16 1.1x slower)
_I8, _I16 = ir.IntType(8), ir.IntType(16)
_FOLDED = {
    types.uint16: (_I16, 16, "v16i16", "float16"),
    types.int16: (_I16, 16, "v16i16", "bfloat16"),
    types.int8: (_I8, 64, "v64i8", "signed"),
    types.uint8: (_I8, 64, "v64i8", "unsigned"),
    types.float32: (F32, 16, "v16f32", "float"),
    types.float64: (ir.DoubleType(), 8, "v8f64", "float"),
}
_ROW_FOLDED = tuple(t for t, (*_, compare) in _FOLDED.items() if compare != "float")


def _values(builder, loaded, compare):
    """The values of a vector of raw elements, as they compare (codec.py's decoding of
    16-bit floats, a vector at a time)."""
    lanes = loaded.type.count
    floats = ir.VectorType(F32, lanes)
    if compare == "float16":
        return builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(), lanes)), floats)
    if compare == "bfloat16":
        wide = builder.zext(loaded, ir.VectorType(I32, lanes))
        return builder.bitcast(builder.shl(wide, ir.Constant(wide.type, [16] * lanes)), floats)
    return loaded


def _first_maximum(builder, compare, kept, new):
    """maxima.keeps, a vector at a time: ``kept`` where kept >= new or kept is a NaN, else
    ``new``; each a pair (raw elements, their values), so that the kept value is not
    decoded again."""
    (kept_raw, a), (new_raw, b) = kept, new
    if compare in ("signed", "unsigned"):
        keep = _integer_compare(builder, compare, ">=", a, b)
    else:
        keep = builder.or_(builder.fcmp_ordered(">=", a, b), builder.fcmp_unordered("uno", a, a))
    return builder.select(keep, kept_raw, new_raw), builder.select(keep, a, b)


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
        if not (
            isinstance(columns, types.Array)
            and isinstance(source, types.Array)
            and columns.dtype == source.dtype
            and columns.dtype in _ROW_FOLDED
            and all(isinstance(t, types.Integer) for t in (base, at0, at1, at2, count))
        ):
            return None
        signature = types.none(
            columns, types.uint64, source, types.uint64, types.uint64, types.uint64, types.uint64
        )
        element, lanes, suffix, compare = _FOLDED[columns.dtype]
        vector = ir.VectorType(element, lanes)

        def codegen(context, builder, sig, args):
            columns_data = context.make_array(sig.args[0])(context, builder, args[0]).data
            source_data = context.make_array(sig.args[2])(context, builder, args[2]).data
            base, at0, at1, at2, count = args[1], args[3], args[4], args[5], args[6]
            pointer = vector.as_pointer()

            def at(data, start, i):
                return builder.bitcast(builder.gep(data, [builder.add(start, i)]), pointer)

            def folded(load, i):
                rows = [load(at(source_data, start, i)) for start in (at0, at1, at2)]
                if with_columns:
                    rows.insert(0, load(at(columns_data, base, i)))
                result = (rows[0], _values(builder, rows[0], compare))
                for row in rows[1:]:
                    result = _first_maximum(
                        builder, compare, result, (row, _values(builder, row, compare))
                    )
                return result[0]

            def vectors(i, offset, n):
                for k in range(n):
                    j = builder.add(builder.add(i, offset), ir.Constant(I64, k * lanes))
                    result = folded(lambda p: builder.load(p, align=1), j)
                    builder.store(result, at(columns_data, base, j), align=1)
                return []

            # four vectors to a pass, then one, then the rest
            zero = ir.Constant(I64, 0)
            _, fours = vector_loop(
                builder, count, 4 * lanes, [], lambda i, values: vectors(i, zero, 4)
            )
            _, ones = vector_loop(
                builder,
                builder.sub(count, fours),
                lanes,
                [],
                lambda i, values: vectors(i, fours, 1),
            )
            whole = builder.add(fours, ones)

            def masked():
                masked_load, masked_store = masked_memory(builder, vector, suffix)
                inside = left_lanes(builder, count, whole, 0, lanes)
                alignment = ir.Constant(I32, 1)
                result = folded(
                    lambda p: builder.call(
                        masked_load, [p, alignment, inside, ir.Constant(vector, None)]
                    ),
                    whole,
                )
                builder.call(
                    masked_store, [result, at(columns_data, base, whole), alignment, inside]
                )

            _last_vector(
                builder, count, whole, lanes, lambda start: vectors(start, zero, 1), masked
            )
            return context.get_dummy_value()

        return signature, codegen

    return row_fold


row_fold_first = _row_fold(False)
row_fold_more = _row_fold(True)


@intrinsic
def three_wide_step_two(typingctx, columns, target, base, count):
    """target[base + j] = the maximum of columns[2j], columns[2j + 1] and columns[2j + 2]
    for j < count (MaxPool's windows 3 wide at step 2 along the rows); ``columns`` holds
    2 * count + 1 elements at least. Returns (whether any of them is a zero, whether any
    is a NaN): the outputs that maxima.is_tie (never, for 8-bit integers).

    The maximum is the row folds' (_first_maximum): the windows' largest value, a NaN
    where one of them is; which zero and which NaN it keeps does not matter, since the
    outputs that is_tie are taken again in row-major order where the columns hold a -0 or
    a NaN (columns.py).

    A vector of outputs at a time: the even and odd elements of twice as many columns and
    the odd ones of those one further, each shuffled out of two vectors. The last outputs
    are the last whole vector again, ending at ``count`` (overlapping the one before: the
    same values written twice), or, under one vector's length, in narrower vectors and
    masked loads and a masked store. numba's loop left a row's last outputs to scalar
    leftovers (MaxPool 3x3 s2 over uint8 takes 0.77 of its time this way), and float32's
    to vectors of half the width, its 56 outputs a row at the resnet stem."""
    if not (
        isinstance(columns, types.Array)
        and isinstance(target, types.Array)
        and columns.dtype == target.dtype
        and columns.dtype in _FOLDED
        and isinstance(base, types.Integer)
        and isinstance(count, types.Integer)
    ):
        return None
    signature = types.UniTuple(types.boolean, 2)(columns, target, types.uint64, types.uint64)
    element, lanes, suffix, compare = _FOLDED[columns.dtype]
    vector = ir.VectorType(element, lanes)
    integers = compare in ("signed", "unsigned")

    def codegen(context, builder, sig, args):
        columns_data = context.make_array(sig.args[0])(context, builder, args[0]).data
        target_data = context.make_array(sig.args[1])(context, builder, args[1]).data
        base, count = args[2], args[3]
        # whether an output is a zero, whether one is a NaN
        ties = [cgutils.alloca_once_value(builder, ir.Constant(I1, 0)) for _ in range(2)]

        def at(data, start, width):
            return builder.bitcast(
                builder.gep(data, [start]), ir.VectorType(element, width).as_pointer()
            )

        def windows(load, j, width):
            evens = ir.Constant(ir.VectorType(I32, width), list(range(0, 2 * width, 2)))
            odds = ir.Constant(ir.VectorType(I32, width), list(range(1, 2 * width, 2)))
            start = builder.shl(j, ir.Constant(I64, 1))  # column of output j's first tap
            first, second = load(start, 0), load(start, width)
            shifted, shifted_second = load(start, 1), load(start, width + 1)

            def taps(raw):
                return raw, _values(builder, raw, compare)

            pair = _first_maximum(
                builder,
                compare,
                taps(builder.shuffle_vector(first, second, evens)),
                taps(builder.shuffle_vector(first, second, odds)),
            )
            return _first_maximum(
                builder, compare, pair, taps(builder.shuffle_vector(shifted, shifted_second, odds))
            )

        def note_ties(value, inside=None):
            """ties |= whether any lane of ``value`` (``inside`` only) is a zero, a NaN."""
            if integers:
                return
            zero = ir.Constant(value.type, None)
            found = (
                builder.fcmp_ordered("==", value, zero),
                builder.fcmp_unordered("uno", value, zero),
            )
            for flag, lanes_found in zip(ties, found):
                if inside is not None:
                    lanes_found = builder.and_(lanes_found, inside)
                vector_type = lanes_found.type
                any_found = builder.call(
                    declare(
                        builder, f"llvm.vector.reduce.or.v{vector_type.count}i1", I1, [vector_type]
                    ),
                    [lanes_found],
                )
                builder.store(builder.or_(builder.load(flag), any_found), flag)

        def store(j, width=lanes):
            def whole_vector(start, offset):
                return builder.load(
                    at(columns_data, builder.add(start, ir.Constant(I64, offset)), width), align=1
                )

            raw, value = windows(whole_vector, j, width)
            builder.store(raw, at(target_data, builder.add(base, j), width), align=1)
            note_ties(value)
            return []

        _, whole = vector_loop(builder, count, lanes, [], lambda j, values: store(j))

        def masked():  # count < lanes: every column read lies below 2 * count + 1
            masked_load, masked_store = masked_memory(builder, vector, suffix)
            alignment = ir.Constant(I32, 1)
            columns_count = builder.add(
                builder.shl(count, ir.Constant(I64, 1)), ir.Constant(I64, 1)
            )
            zero = ir.Constant(I64, 0)

            def masked_vector(start, offset):
                inside = left_lanes(builder, columns_count, zero, offset, lanes)
                return builder.call(
                    masked_load,
                    [
                        at(columns_data, builder.add(start, ir.Constant(I64, offset)), lanes),
                        alignment,
                        inside,
                        ir.Constant(vector, None),
                    ],
                )

            raw, value = windows(masked_vector, zero, lanes)
            inside = left_lanes(builder, count, zero, 0, lanes)
            builder.call(masked_store, [raw, at(target_data, base, lanes), alignment, inside])
            note_ties(value, inside)

        def short(widths=(lanes // 2, lanes // 4)):
            """count < lanes: two overlapping vectors of the widest of ``widths`` that
            count reaches, masked ones only under the narrowest: a processor without
            AVX-512 takes masked byte loads and stores apart lane by lane (uint8 3x3 s2
            over rows of 112 bytes, 55 outputs, took 6 times as long)."""
            if not widths:
                masked()
                return
            width = ir.Constant(I64, widths[0])
            with builder.if_else(builder.icmp_unsigned(">=", count, width)) as (enough, fewer):
                with enough:
                    store(ir.Constant(I64, 0), widths[0])
                    store(builder.sub(count, width), widths[0])
                with fewer:
                    short(widths[1:])

        _last_vector(builder, count, whole, lanes, store, short)
        return context.make_tuple(builder, sig.return_type, [builder.load(flag) for flag in ties])

    return signature, codegen
