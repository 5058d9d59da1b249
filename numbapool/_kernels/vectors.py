"""Tools for loops written as LLVM vector code (an intrinsic's codegen), where numba's
loops vectorize badly: counted loops over whole vectors, the lanes left after them, masked
loads and stores. The global pools' vector loops are in global_vectors.py, MaxPool's in
max_vectors.py."""

from llvmlite import ir
from numba.core import cgutils

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()


def declare(builder, name, result, arguments):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, arguments), name)


def splat(builder, value, lanes):
    """A vector of ``lanes`` copies of ``value``."""
    vector = ir.VectorType(value.type, lanes)
    first = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(first, first, ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def counted_loop(builder, end, step, initial, add):
    """Emit a loop over i in [0, end) by ``step`` (end a multiple of it), carrying the LLVM
    values ``initial``: each pass replaces them with ``add(i, values)``, which may emit
    blocks of its own. Returns the values after it, the builder placed after the loop."""
    entry = builder.block
    head = builder.append_basic_block("loop.head")
    body = builder.append_basic_block("loop.body")
    done = builder.append_basic_block("loop.done")
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    values = [builder.phi(value.type) for value in initial]
    for phi, value in zip(values, initial):
        phi.add_incoming(value, entry)
    builder.cbranch(builder.icmp_unsigned("<", i, end), body, done)
    builder.position_at_end(body)
    for phi, value in zip(values, add(i, values)):
        phi.add_incoming(value, builder.block)
    i.add_incoming(builder.add(i, ir.Constant(I64, step)), builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return values


def vector_loop(builder, count, step, initial, add):
    """counted_loop over i in [0, whole) by ``step``, ``whole`` the multiple of ``step``
    (a power of two) at most ``count``. Returns (the values after it, ``whole``): the
    elements [whole, count) remain."""
    whole = builder.and_(count, ir.Constant(I64, -step))
    return counted_loop(builder, whole, step, initial, add), whole


def left_lanes(builder, count, whole, first, lanes):
    """Which of the lanes [first, first + lanes) hold one of the count - whole elements
    left after vector_loop: the mask of a masked load, made as the bits of its first
    lanes (at most 64). Made from compares of the lanes' numbers, 64 lanes wide, it made
    three_wide_step_two's masked path 1.4x slower than numba's loop."""
    zero = ir.Constant(I64, 0)
    inside = builder.sub(builder.sub(count, whole), ir.Constant(I64, first))
    inside = builder.select(builder.icmp_signed("<", inside, zero), zero, inside)
    below = builder.icmp_signed("<", inside, ir.Constant(I64, lanes))
    bits = builder.sub(
        builder.shl(ir.Constant(I64, 1), builder.select(below, inside, zero)), ir.Constant(I64, 1)
    )
    bits = builder.select(below, bits, ir.Constant(I64, -1))
    if lanes < 64:
        bits = builder.trunc(bits, ir.IntType(lanes))
    return builder.bitcast(bits, ir.VectorType(I1, lanes))


def masked_memory(builder, vector, suffix):
    """(llvm.masked.load, llvm.masked.store) of ``vector`` (``suffix`` its LLVM name)."""
    pointer = vector.as_pointer()
    mask_type = ir.VectorType(I1, vector.count)
    return (
        declare(
            builder, f"llvm.masked.load.{suffix}.p0", vector, [pointer, I32, mask_type, vector]
        ),
        declare(
            builder,
            f"llvm.masked.store.{suffix}.p0",
            ir.VoidType(),
            [vector, pointer, I32, mask_type],
        ),
    )


def load_within(builder, pointer, inside, fill, fits, masked_load, alignment):
    """The vector at ``pointer`` with ``fill`` in the lanes not ``inside``: where ``fits``
    (the whole vector lies inside its array) a plain load and a select, else
    ``masked_load`` (masked_memory's), which reads none of those lanes: GlobalAveragePool
    over 7x7 channels took twice as long with masked loads alone on a processor without
    AVX-512."""
    with builder.if_else(fits) as (whole, masked):
        with whole:
            selected = builder.select(inside, builder.load(pointer, align=alignment), fill)
            whole_block = builder.block
        with masked:
            loaded = builder.call(masked_load, [pointer, ir.Constant(I32, alignment), inside, fill])
            masked_block = builder.block
    result = builder.phi(fill.type)
    result.add_incoming(selected, whole_block)
    result.add_incoming(loaded, masked_block)
    return result


def fits_before(builder, start, offset, lanes, end):
    """Whether the ``lanes`` elements from start + offset end at or before ``end``."""
    last = builder.add(builder.add(start, offset), ir.Constant(I64, lanes))
    return builder.icmp_unsigned("<=", last, end)


def vectors_at(builder, data, start, vector):
    """offset -> a pointer to the ``vector`` of elements from data[start + offset]."""
    pointer = vector.as_pointer()
    return lambda offset: builder.bitcast(builder.gep(data, [builder.add(start, offset)]), pointer)
