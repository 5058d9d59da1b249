"""MaxPool with Indices over 2-D windows, each input row copied once, split by parity.

It serves windows over one axis (as 2-D windows of height 1:
WindowPlan.rows_geometry) or two, with no dilation and a step of 1 or 2 along the rows,
when the units are whole output rows. The generic kernel (maxima.py) takes a tap's run of
elements at a step of 2 straight from the input, which LLVM gathers one element at a time,
and keeps the winning taps as int64. Here each input row is first copied into a scratch
row, at a step of 2 its even elements then its odd ones, so that every tap's run is a run
of consecutive elements; a row's winners are kept as int32 columns (16 to a 512-bit
vector beside float32 values); the row maxima of the last input rows stay in a ring of
slots, and each output row folds its window's rows in order.

The scan is the generic kernel's: a window's first maximum in row-major order is the first
maximum over its input rows, in order, of each row's first maximum along the row (ties keep
the first, the first NaN wins: maxima.keeps), so the results are the same, bit for bit."""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .._plan import AXIS_EXTENT, AXIS_INDEX_STRIDE
from . import kernel
from .codec import decode
from .family import Family, row_window
from .maxima import keeps
from .prefetch import AHEAD_BYTES, PREFETCH_INPUT_BYTES, prefetch_ahead
from .scratch import empty, release
from .units import first_pass_or, plane_axes, ring_slot, ring_slots, window_rows


@njit(inline="always")
def _split_row(source, row_start, split, width, step):
    """split = the row of ``width`` elements from ``row_start``; at a step of 2 its even
    elements first, then its odd ones (from (width + 1) // 2). Both parities in one loop:
    LLVM loads them as vectors and shuffles them apart."""
    if step == 1:
        for i in range(np.uint64(width)):
            split[i] = source[row_start + i]
    else:
        two = np.uint64(2)
        half = np.uint64((width + 1) // 2)
        for i in range(np.uint64(width // 2)):
            split[i] = source[row_start + two * i]
            split[half + i] = source[row_start + two * i + np.uint64(1)]
        # an odd row's last element; an even row's last even element again (unconditional:
        # no branch after the loop)
        split[half - np.uint64(1)] = source[row_start + two * (half - np.uint64(1))]


@njit(inline="always")
def _split_at(column, output, half, column_step):
    """Where input column ``column`` + ``output`` * step lies in the split row, ``column``
    being that of output 0's tap (negative in the left pad)."""
    at = column // column_step + output
    return at + half if column_step == 2 and column % 2 else at


@intrinsic
def _column_at(typingctx, column, j, step):
    """``column + j * step`` in 32-bit arithmetic (``column`` and ``step`` int32, ``j`` an
    integer index; a row's columns fit in int32): numba widens int32 arithmetic to int64,
    and LLVM's vector loop made 16 columns as two vectors of 8 int64 lanes, narrowed."""
    if not (column == types.int32 and step == types.int32 and isinstance(j, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        index = builder.trunc(args[1], ir.IntType(32))
        return builder.add(args[0], builder.mul(index, args[2]))

    return types.int32(column, j, step), codegen


@njit(inline="always")
def _fold_tap(split, start, maxima, columns, at, count, column, step, first):
    """Fold one tap into ``count`` consecutive outputs of a row's maxima, from maxima[at]:
    the j-th reads split[start + j], input column ``column`` + j * ``step`` (int32s, so
    that the columns' vectors are as wide as the values'). The ``first`` tap takes its
    elements as they are."""
    for j in range(np.uint64(count)):
        value = split[start + j]
        kept = maxima[at + j]
        take = first | (columns[at + j] < 0) | (not keeps(decode(kept), decode(value)))
        maxima[at + j] = value if take else kept
        # in 32 bits for 4- and 8-byte values (with indices 0.95 to 0.97 of the time, 2x2
        # s2 0.90 to 0.94); 8- and 16-bit values keep numba's int64 (uint8 1.04-1.09x slower)
        at_column = (
            _column_at(column, j, step) if split.itemsize >= 4 else column + np.int32(j) * step
        )
        columns[at + j] = at_column if take else columns[at + j]


@kernel()
def indexed_max_units(
    unit_begin, unit_end, x, y, indices, lowest, axes, tap_outputs, block, column_step
):
    """MaxPool with Indices over output rows [unit_begin, unit_end) (units: whole output
    rows, of ``block`` outputs) of the windows this module serves: ``y`` the winning
    element bit for bit, or ``lowest`` where no tap is inside; ``indices`` the winner's
    offset in the whole input, numbered with the index strides, or -1. ``tap_outputs[k]``
    is the plan's run of outputs for which tap k of a row is inside the input.
    ``column_step``, the stride along the rows (1 or 2), arrives as a literal (entry.py)."""
    height, width, out_height, out_width, top, left, row_step = plane_axes(axes)
    window_height, window_width = axes[AXIS_EXTENT, 0], axes[AXIS_EXTENT, 1]
    row_index_stride, column_index_stride = axes[AXIS_INDEX_STRIDE, 0], axes[AXIS_INDEX_STRIDE, 1]
    half = (width + 1) // 2
    split = empty(width, x.dtype)
    slots = ring_slots(window_height)
    maxima = empty(slots * out_width, x.dtype)
    columns = empty(slots * out_width, np.int32)  # -1: no tap inside yet
    best = empty(out_width, x.dtype)
    best_rows = empty(out_width, np.int32)
    best_columns = empty(out_width, np.int32)
    # rows longer than the distance ahead are long streams, which the hardware prefetchers
    # follow (MaxPool 1-D k3 s2 over rows of 16000 float32 ran 1.02-1.03x slower with it)
    prefetching = x.size * x.itemsize >= PREFETCH_INPUT_BYTES and width * x.itemsize < AHEAD_BYTES
    plane = -1
    next_row = 0  # the plane's next input row without its maxima in the ring
    for unit in range(unit_begin, unit_end):
        plane, _, inside_top, inside_end, next_row = window_rows(
            unit, plane, next_row, out_height, row_step, top, window_height, height
        )
        while next_row < inside_end:
            row_start = np.uint64((plane * height + next_row) * width)
            _split_row(x, row_start, split, width, column_step)
            if prefetching:
                prefetch_ahead(x, row_start, np.uint64(width))
            slot_at = ring_slot(next_row, slots, out_width)
            # no tap inside yet (-1) where the first tap is not inside
            first_run, end_run = tap_outputs[0, 0], tap_outputs[0, 1]
            for o in range(first_run):
                columns[slot_at + np.uint64(o)] = -1
            for o in range(max(first_run, end_run), out_width):
                columns[slot_at + np.uint64(o)] = -1
            for tap in range(window_width):
                first, end = tap_outputs[tap, 0], tap_outputs[tap, 1]
                if first < end:
                    _fold_tap(
                        split,
                        np.uint64(_split_at(tap - left, first, half, column_step)),
                        maxima,
                        columns,
                        slot_at + np.uint64(first),
                        end - first,
                        np.int32(tap - left + first * column_step),
                        np.int32(column_step),
                        tap == 0,
                    )
            next_row += 1
        out_at = np.uint64(unit * out_width)
        plane_index = plane * height * width
        # the window's rows in order, from (lowest, -1) at the first; the last one's
        # winners go to the output. A window with no row inside takes one pass of no row.
        for input_row in range(inside_top, max(inside_end, inside_top + 1)):
            first = input_row == inside_top
            inside = input_row < inside_end
            last = input_row + 1 >= inside_end
            slot_at = ring_slot(input_row, slots, out_width)
            for o in range(np.uint64(out_width)):
                value = maxima[slot_at + o]
                column = columns[slot_at + o]
                kept = first_pass_or(first, lowest, best[o])
                kept_column = first_pass_or(first, np.int32(-1), best_columns[o])
                kept_row = best_rows[o]
                take = (
                    inside
                    & (column >= 0)
                    & ((kept_column < 0) | (not keeps(decode(kept), decode(value))))
                )
                kept = value if take else kept
                kept_column = column if take else kept_column
                kept_row = np.int32(input_row) if take else kept_row
                if last:
                    y[out_at + o] = kept
                    indices[out_at + o] = (
                        -1
                        if kept_column < 0
                        else plane_index
                        + np.int64(kept_row) * row_index_stride
                        + np.int64(kept_column) * column_index_stride
                    )
                else:
                    best[o] = kept
                    best_columns[o] = kept_column
                    best_rows[o] = kept_row
    release(split, maxima, columns, best, best_rows, best_columns)


def _serves(request):
    """A row_window at a stride of 1 or 2 along the rows whose rows and columns int32s
    number: (row step,)."""
    plan = request.plan
    if not (row_window(plan, (1, 2)) and max(plan.spatial_in) < 2**31):
        return None
    return (plan.strides[-1],)


FAMILY = Family(
    indexed_max_units,
    ops=("MaxPool",),
    serves=_serves,
    kinds=lambda op, dtype: ((1,), (2,)),
    arguments=("lowest", "row_axes", "row_tap_outputs", "block"),
    arrays=("x", "y", "indices"),
    whole_rows=True,
    examples=(
        ("MaxPool", (2, 8, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ("MaxPool", (2, 8, 30), dict(kernel_shape=[3])),
    ),
)
