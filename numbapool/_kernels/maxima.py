"""MaxPool with Indices over any window, any number of axes (the generic kernel).

It serves MaxPool with Indices where indexed.py does not serve (windows over
three axes and more, dilated ones, strides past 2 along the rows, output rows split into
several units); MaxPool without them takes fixed.py or columns.py. All give the same
results, bit for bit.

A window's first maximum in row-major order is the first maximum over its input rows of
each row's first maximum along the last axis. Each unit runs taps outer, outputs inner: for
every tap, the run of the row's outputs for which it lies inside the input
(``tap_outputs``, from the plan), walking the input at a fixed step, which vectorizes; an
input row's results are cached and serve the next output rows, whose windows share it.
Also here: the comparison every MaxPool kernel uses (``keeps``: ties keep the first, the
first NaN wins) and the tap-by-tap maximum of a border output (``border_max``).
"""

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from .._plan import AXIS_DILATION, AXIS_IN, AXIS_INDEX_STRIDE, AXIS_OUT, AXIS_PAD_BEGIN, AXIS_STRIDE
from . import INLINED, inlined, kernel
from .codec import decode
from .family import Family
from .scratch import empty, full, release
from .units import (
    first_input_row,
    first_unit,
    input_plane,
    input_row_strides,
    next_unit,
    output_plane,
    place_row,
    row_slot,
    tap_is_inside,
    tap_run,
    window_index,
)


@intrinsic
def keeps(typingctx, best, candidate):
    """Whether ``best`` stays against a later ``candidate`` in a row-major scan: it is at
    least as large (ties keep the first), or it is a NaN (the first NaN wins). Bitwise,
    not short-circuit, as are the tests around it: no branch per element in the loops.

    An intrinsic, emitted in place (as codec.decode): as a function numba inlines, its IR
    was copied and typed again at each of its many call sites, a fifth of the Python
    calls of a warmup of MaxPool and AveragePool in float32 and float16 (cProfile)."""
    common = typingctx.unify_types(types.unliteral(best), types.unliteral(candidate))
    if not isinstance(common, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        best, candidate = args
        if isinstance(common, types.Float):
            return builder.or_(
                builder.fcmp_ordered(">=", best, candidate),
                builder.fcmp_unordered("uno", best, best),
            )
        if common.signed:
            return builder.icmp_signed(">=", best, candidate)
        return builder.icmp_unsigned(">=", best, candidate)

    return types.boolean(common, common), codegen


@njit(inline="always")
def fold_max(kept, value):
    return kept if keeps(decode(kept), decode(value)) else value


@njit(inline="always")
def is_tie(value):
    """Whether a MaxPool result (decoded) may have other bits in another scan order than
    the row-major one: a zero (+0 and -0 compare equal) or a NaN (the first one wins)."""
    return (value == 0) | (value != value)


@njit(inline="always")
def any_tie(out, begin, count):
    """Whether any of out[begin:begin + count] is_tie: one pass with no branch, which
    vectorizes, before the rare retake."""
    suspect = False
    for j in range(count):
        suspect |= is_tie(decode(out[begin + np.uint64(j)]))
    return suspect


# The same fold compiled once per type, for LLVM to inline: numba inlines fold_max in its
# own IR at each call site, a sixth of column_units' compile. Not for the fixed windows:
# their 2x2 stride-2 MaxPool took 1.38x as long with it.
fold_max_function = inlined()(fold_max.py_func)


@intrinsic
def _float32_maximum(typingctx, a, b):
    """LLVM's maximum: NaN if either is NaN; with no signed zeros (nsz), either zero for
    +0 and -0. One compare fewer than ``keeps`` and its select in a vector."""
    if not (a == types.float32 and b == types.float32):
        return None

    def codegen(context, builder, signature, args):
        element = context.get_value_type(types.float32)
        maximum = builder.module.declare_intrinsic(
            "llvm.maximum", [element], fnty=ir.FunctionType(element, [element, element])
        )
        return builder.call(maximum, args, fastmath=("nsz",))

    return types.float32(a, b), codegen


def nan_max(kept, value):
    """A maximum for kernels that retake zeros and NaNs in row-major order (columns.py's
    check_ties): its value is the window's maximum, any NaN when one of them is, and
    either zero for +0 and -0; not which NaN or which zero. float32's is LLVM's maximum
    (the 3-d case 0.87, the resnet stem 0.91 of the time on one thread); the other dtypes
    fold as fold_max does (float64 through LLVM's maximum: 1.13x slower)."""


@overload(nan_max, jit_options=INLINED)
def _nan_max_overload(kept, value):
    if kept == types.float32:
        return lambda kept, value: _float32_maximum(kept, value)
    return lambda kept, value: fold_max_function(kept, value)


@njit(inline="always")
def fold_max_run(source, offset, step, best, begin, count):
    # fold_max written out: calling it here made the columns kernel's 5x5 float16 MaxPool
    # 1.2x slower
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        kept = best[begin + np.uint64(j)]
        best[begin + np.uint64(j)] = kept if keeps(decode(kept), decode(value)) else value


@njit(inline="always")
def _max_run_with_taps(source, offset, step, best, best_taps, tap, begin, count):
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        kept = best[begin + np.uint64(j)]
        take = (best_taps[begin + np.uint64(j)] < 0) | (not keeps(decode(kept), decode(value)))
        best[begin + np.uint64(j)] = value if take else kept
        best_taps[begin + np.uint64(j)] = tap if take else best_taps[begin + np.uint64(j)]


@njit(inline="always")
def max_run(source, offset, step, best, begin, count):
    """Fold one tap into ``count`` consecutive outputs from ``begin``, ``step`` elements
    apart in the input.

    Steps 1 and 2 (most strides) get loops of their own with the step a constant, which the
    compiler vectorizes; the general loop does not.
    """
    if step == 1:
        fold_max_run(source, offset, np.uint64(1), best, begin, count)
    elif step == 2:
        fold_max_run(source, offset, np.uint64(2), best, begin, count)
    else:
        fold_max_run(source, offset, step, best, begin, count)


@njit(inline="always")
def max_run_with_taps(source, offset, step, best, best_taps, tap, begin, count):
    """max_run, and in ``best_taps`` the winning taps."""
    if step == 1:
        _max_run_with_taps(source, offset, np.uint64(1), best, best_taps, tap, begin, count)
    elif step == 2:
        _max_run_with_taps(source, offset, np.uint64(2), best, best_taps, tap, begin, count)
    else:
        _max_run_with_taps(source, offset, step, best, best_taps, tap, begin, count)


@njit(inline="always")
def start_maxima(target, target_taps, base, count, lowest):
    """Outputs with no tap yet: ``lowest``, tap -1."""
    for j in range(count):
        target[base + np.uint64(j)] = lowest
    if target_taps is not None:
        for j in range(count):
            target_taps[base + np.uint64(j)] = -1


# Not inlined: called from two places, it would be compiled twice, and the first call's
# compile time is what a notebook user waits for.
@kernel()
def max_over_last_axis(
    source,
    row_start,
    first,
    end,
    step,
    target,
    target_taps,
    base,
    axes,
    tap_outputs,
    tap_offsets,
    k_last,
    tap_base,
):
    """Fold the last-axis taps of one input row, numbered from ``tap_base``, into
    target[base + j] for output first + j, and the winning taps into ``target_taps``."""
    for kw in range(k_last):
        begin, count, offset = tap_run(kw, first, end, tap_outputs, row_start, axes, tap_offsets)
        max_run_with_taps(
            source, offset, step, target, target_taps, tap_base + kw, base + begin, count
        )


# The loops live in plain functions that the parallel driver calls: inside numba's
# parallel region they optimize (and vectorize) far worse.
@kernel()
def max_pool_units_with_indices(
    unit_begin,
    unit_end,
    x,
    y,
    indices,
    index_offsets,
    lowest,
    axes,
    taps,
    tap_offsets,
    tap_outputs,
    lead_rows,
    block,
    slots,
):
    """Max over each window; the first NaN wins, ties go to the first maximum in the scan.
    ``y`` receives the winning element itself (bit for bit), or ``lowest`` for a window
    with no tap inside the input; ``indices`` the winner's offset in the whole input,
    numbered with the index strides, or -1: its window start's number plus its tap's entry
    in ``index_offsets`` (the plan's tap_index_offsets).

    A window's first maximum in row-major order is the first maximum over its rows of
    each row's first maximum along the last axis: rows come first in that order. So each
    input row's last-axis maxima are computed once, cached, and folded row by row; the
    cache serves the next output rows, whose windows share input rows. With ``slots`` 0
    (no input row is shared) the taps fold straight into the outputs, in the same order."""
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    out_last = axes[AXIS_OUT, last]
    channel_size = input_plane(axes)
    out_plane = output_plane(axes)
    channel_rows = channel_size // axes[AXIS_IN, last]
    row_strides = input_row_strides(axes)
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    starts = empty(rank, np.int64)
    best = empty(block, x.dtype)
    best_taps = empty(block, np.int64)
    rows = empty(max(slots, 1) * block, x.dtype)
    row_taps = empty(max(slots, 1) * block, np.int64)
    keys = full(max(slots, 1), -1, np.int64)
    positions = empty(rank, np.int64)
    nc = first_unit(unit_begin, axes, block, positions)
    for unit in range(unit_begin, unit_end):
        if unit > unit_begin:
            nc = next_unit(positions, nc, axes, block)
        first, end, row, row_offset, row_inside = place_row(positions, axes, block, starts)
        row_offset += nc * channel_size
        start_maxima(best, best_taps, np.uint64(0), end - first, lowest)
        first_row = first_input_row(nc, channel_rows, starts, row_strides) if slots else 0
        for lead in range(lead_count):
            tap = lead * k_last
            if not row_inside and not tap_is_inside(tap, taps, starts, axes, last):
                continue
            if slots == 0:  # no input row is shared by two output rows: fold taps directly
                max_over_last_axis(
                    x,
                    row_offset + tap_offsets[tap],
                    first,
                    end,
                    step,
                    best,
                    best_taps,
                    np.uint64(0),
                    axes,
                    tap_outputs,
                    tap_offsets,
                    k_last,
                    tap,
                )
                continue
            slot, missing = row_slot(first_row + lead_rows[lead], first, keys, slots, out_last)
            base = np.uint64(slot * block)
            if missing:
                start_maxima(rows, row_taps, base, end - first, lowest)
                # np.int64: a literal 0 would make numba compile a second specialization
                max_over_last_axis(
                    x,
                    row_offset + tap_offsets[tap],
                    first,
                    end,
                    step,
                    rows,
                    row_taps,
                    base,
                    axes,
                    tap_outputs,
                    tap_offsets,
                    k_last,
                    np.int64(0),
                )
            for j in range(end - first):
                value = rows[base + np.uint64(j)]
                found = row_taps[base + np.uint64(j)]
                take = (found >= 0) & (
                    (best_taps[j] < 0) | (not keeps(decode(best[j]), decode(value)))
                )
                best[j] = value if take else best[j]
                best_taps[j] = tap + found if take else best_taps[j]
        out_begin = np.uint64(nc * out_plane + row + first)
        for j in range(end - first):
            y[out_begin + np.uint64(j)] = best[j]
        starts[last] = first * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
        at = window_index(nc, channel_size, starts, axes)
        at_step = axes[AXIS_STRIDE, last] * axes[AXIS_INDEX_STRIDE, last]
        for j in range(end - first):
            tap = best_taps[j]
            indices[out_begin + np.uint64(j)] = (
                -1 if tap < 0 else at + j * at_step + index_offsets[tap]
            )
    release(row_strides, starts, best, best_taps, rows, row_taps, keys, positions)


@inlined()
def border_max(o, row_offset, row_inside, starts, lowest, source, axes, taps, tap_offsets):
    """MaxPool of output o of a row, its taps checked one by one."""
    last = axes.shape[1] - 1
    at = o * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
    best = lowest
    for tap in range(taps.shape[0]):
        position = at + taps[tap, last] * axes[AXIS_DILATION, last]
        if position < 0 or position >= axes[AXIS_IN, last]:
            continue
        if not row_inside and not tap_is_inside(tap, taps, starts, axes, last):
            continue
        best = fold_max(best, source[np.uint64(row_offset + at + tap_offsets[tap])])
    return best


FAMILY = Family(
    max_pool_units_with_indices,
    ops=("MaxPool",),
    serves=lambda request: (),
    kinds=lambda op, dtype: ((),),
    arguments=(
        "tap_index_offsets",
        "lowest",
        "axes",
        "taps",
        "tap_offsets",
        "tap_outputs",
        "lead_rows",
        "block",
        "slots",
    ),
    arrays=("x", "y", "indices"),
    examples=(
        ("MaxPool", (2, 8, 7, 9, 11), dict(kernel_shape=[3, 3, 3], pads=[1] * 6)),
        ("MaxPool", (2, 8, 20, 20), dict(kernel_shape=[3, 3], dilations=[2, 2])),
    ),
)
