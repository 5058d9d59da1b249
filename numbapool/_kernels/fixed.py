"""Fixed windows: MaxPool (without Indices), AveragePool and LpPool for a window whose size and
last-axis step are compile-time constants.

They serve the windows in FIXED_WINDOWS, where they measured faster than the generic
kernels; for LpPool 1.1 to 5 times (the more, the cheaper the root: p = 1 and 2 most, p other than
1, 2 and 3 least, its root a pow()).
An output's taps unroll into one loop over the outputs of a row, the running maximum or sum
stays in a register, and the loads vectorize. Outputs whose window leaves the input take
their taps one by one, in the generic kernels' order: the results are the same, bit for bit.
"""

import numpy as np
from numba import njit

from .._plan import AXIS_IN, AXIS_PAD_BEGIN, AXIS_STRIDE
from . import kernel
from .codec import as_accumulator, encode
from .family import Family, p_kind
from .maxima import border_max, fold_max
from .prefetch import PREFETCH_INPUT_BYTES, prefetch_ahead
from .scratch import release
from .sums import border_sum, leading_divisor, lp_root, mean_at, queue_roots, root_queue, term_at
from .units import (
    first_unit_row,
    input_plane,
    interior_outputs,
    interior_span,
    output_plane,
    unit_row,
)


@njit(inline="always")
def _fixed_layout(axes):
    """(last axis, input row length, input plane size for 3-D windows, last-axis pad)."""
    last = axes.shape[1] - 1
    row_length = axes[AXIS_IN, last]
    plane = row_length * axes[AXIS_IN, last - 1] if last > 1 else 0
    return last, row_length, plane, axes[AXIS_PAD_BEGIN, last]


@njit(inline="always")
def prefetch_window_rows(source, row_offset, row_length, plane, depth, height, rows):
    """Ask for the input rows the next output rows read: ``rows`` rows (the step between
    output rows) past the window's last input row (prefetch_ahead). Whatever the input's
    size: with the count 0 for inputs under PREFETCH_INPUT_BYTES, as the columns kernel
    does, vgg ran 1.2-1.4x slower (the same count for it: the compiled loops differ), where
    inputs in the caches lose 1-4% to it."""
    prefetch_ahead(
        source,
        np.uint64(row_offset + (depth - 1) * plane + (height - 1) * row_length),
        np.uint64(rows * row_length),
    )


# The window's size and step (and the sums' kind of p) arrive as literal arguments
# (entry.py), so that each window compiles loops of its own with them constant.
@kernel()
def fixed_max_units(
    unit_begin, unit_end, x, y, lowest, axes, taps, tap_offsets, block, depth, height, width, step
):
    """MaxPool over units [unit_begin, unit_end) for a depth x height x width window (depth 1:
    a 2-D window) with no dilation, at this last-axis step."""
    last, row_length, plane, pad = _fixed_layout(axes)
    interior = interior_outputs(axes, width)
    starts, positions, nc = first_unit_row(unit_begin, axes, block)
    in_plane, out_plane = input_plane(axes), output_plane(axes)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = unit_row(
            unit, unit_begin, nc, positions, starts, axes, block, in_plane, out_plane
        )
        lo = hi = end
        if row_inside:
            lo, hi = interior_span(first, end, interior)
            for o in range(lo, hi):
                at = np.uint64(row_offset + o * step - pad)
                # from the first tap, not from ``lowest``: folding any element into lowest
                # gives that element, bit for bit, and the unrolled taps fold one less
                best = x[at]
                for d in range(depth):
                    for r in range(height):
                        for w in range(width):
                            if d + r + w > 0:
                                best = fold_max(
                                    best, x[at + np.uint64(d * plane + r * row_length + w)]
                                )
                y[np.uint64(out_first + o)] = best
            prefetch_window_rows(
                x, row_offset, row_length, plane, depth, height, axes[AXIS_STRIDE, last - 1]
            )
        for o in range(first, lo):
            y[np.uint64(out_first + o)] = border_max(
                o, row_offset, row_inside, starts, lowest, x, axes, taps, tap_offsets
            )
        for o in range(hi, end):
            y[np.uint64(out_first + o)] = border_max(
                o, row_offset, row_inside, starts, lowest, x, axes, taps, tap_offsets
            )
    release(starts, positions)


@njit(inline="always")
def _interior_sums(
    source,
    out,
    out_first,
    lo,
    hi,
    row_offset,
    step,
    pad,
    row_length,
    plane,
    depth,
    height,
    width,
    zero,
    p,
    p_kind,
    leading,
    x,
    y,
    queue,
    queue_base,
):
    """Outputs [lo, hi) of a row whose windows lie inside the input: each window's input
    rows summed along the last axis, then the rows in order, as the generic kernel adds
    them; the mean (p_kind 0) or the root, rounded once. Cube roots (p_kind 3) wait in the
    queue (sums.root_queue), output o's total at queue[queue_base + o]."""
    # Every tap of these windows lies inside the input, so each counts all of its taps
    # (divisor_counts[last, o] is the width): one divisor for the row, converted once. Per
    # output, the int64 table's conversion kept the loop from vectorizing.
    divisor = as_accumulator(leading * width, x)
    for o in range(lo, hi):
        at = np.uint64(row_offset + o * step - pad)
        # LpPool's sums of powers (p_kind 2 to 4) start from their first term, not from
        # +0 + it: a product or pow() of |x| is +0 or more, or a quiet NaN, for which
        # +0 + term is the term, bit for bit (|x| itself, p = 1, keeps a signaling NaN of
        # float64 input, which that addition quiets). LpPool p = 3 2x2 s2 took 0.96 of the
        # time, p = 2 0.94.
        total = zero
        for d in range(depth):
            for r in range(height):
                row_sum = zero
                for w in range(width):
                    term = term_at(
                        source, at + np.uint64(d * plane + r * row_length + w), p, p_kind
                    )
                    row_sum = term if p_kind >= 2 and w == 0 else row_sum + term
                total = row_sum if p_kind >= 2 and d + r == 0 else total + row_sum
        if p_kind == 0:
            out[np.uint64(out_first + o)] = encode(total / divisor, y)
        elif p_kind == 3:
            queue[np.uint64(queue_base + o)] = total
        else:
            out[np.uint64(out_first + o)] = encode(lp_root(total, p, p_kind), y)


@kernel()
def fixed_sum_units(
    unit_begin,
    unit_end,
    x,
    y,
    p,
    zero,
    axes,
    taps,
    tap_offsets,
    divisor_counts,
    block,
    depth,
    height,
    width,
    step,
    p_kind,
):
    """AveragePool (p_kind 0) or LpPool (p_kind 1 to 4, as sums.lp_term) over units
    [unit_begin, unit_end), accumulated in the type of ``zero``, as fixed_max_units."""
    last, row_length, plane, pad = _fixed_layout(axes)
    interior = interior_outputs(axes, width)
    p = as_accumulator(p, zero)
    queue = root_queue(p_kind, block)
    queued = 0
    prefetching = x.size * x.itemsize >= PREFETCH_INPUT_BYTES
    starts, positions, nc = first_unit_row(unit_begin, axes, block)
    in_plane, out_plane = input_plane(axes), output_plane(axes)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = unit_row(
            unit, unit_begin, nc, positions, starts, axes, block, in_plane, out_plane
        )
        leading = leading_divisor(divisor_counts, positions, last) if p_kind == 0 else 1
        queue_base = queued - first
        lo = hi = end
        if row_inside:
            lo, hi = interior_span(first, end, interior)
            _interior_sums(
                x,
                y,
                out_first,
                lo,
                hi,
                row_offset,
                step,
                pad,
                row_length,
                plane,
                depth,
                height,
                width,
                zero,
                p,
                p_kind,
                leading,
                x,
                y,
                queue,
                queue_base,
            )
            if prefetching:
                prefetch_window_rows(
                    x,
                    row_offset,
                    row_length,
                    plane,
                    depth,
                    height,
                    axes[AXIS_STRIDE, last - 1],
                )
        # the outputs before lo and from hi on, in one loop: one copy of its body, and no
        # pass over the interior's outputs to skip them
        before = lo - first
        for k in range(before + end - hi):
            o = first + k if k < before else hi + k - before
            total = border_sum(
                o,
                row_offset,
                row_inside,
                starts,
                zero,
                p,
                p_kind,
                x,
                axes,
                taps,
                tap_offsets,
                width,
            )
            if p_kind == 0:
                y[np.uint64(out_first + o)] = mean_at(total, leading, divisor_counts, o, zero, y)
            elif p_kind == 3:
                queue[np.uint64(queue_base + o)] = total
            else:
                y[np.uint64(out_first + o)] = encode(lp_root(total, p, p_kind), y)
        if p_kind == 3:
            queued = queue_roots(
                queue, queued + end - first, y, np.uint64(out_first + end), unit == unit_end - 1
            )
    release(queue, starts, positions)


# The windows served, as (depth, height, width, last-axis step): only where measured
# faster than the rank-generic kernels, the 2x2 stride-2 window, for every dtype, 2 to 4
# times. At 3x3 the generic kernels' reuse of input-row results wins for float64 and uint8
# and for stride 1, and 3x3x3 loses outright.
FIXED_WINDOWS = ((1, 2, 2, 2),)


def _window(request):
    """The window's (depth, height, width, step) if FIXED_WINDOWS has it (depth 1: a 2-D
    window), else None."""
    plan = request.plan
    rank = len(plan.kernel_shape)
    if rank not in (2, 3) or set(plan.dilations) != {1}:
        return None
    window = (1,) * (3 - rank) + plan.kernel_shape + (plan.strides[-1],)
    return window if window in FIXED_WINDOWS else None


def _sum_kinds(request):
    window = _window(request)
    return None if window is None else window + (p_kind(request.op, request.p),)


_EXAMPLE = ((2, 8, 10, 12), dict(kernel_shape=[2, 2], strides=[2, 2]))
MAX_FAMILY = Family(
    fixed_max_units,
    ops=("MaxPool",),
    serves=_window,
    kinds=lambda op, dtype: FIXED_WINDOWS,
    arguments=("lowest", "axes", "taps", "tap_offsets", "block"),
    examples=(("MaxPool", *_EXAMPLE),),
)
SUM_FAMILY = Family(
    fixed_sum_units,
    ops=("AveragePool", "LpPool"),
    serves=_sum_kinds,
    kinds=lambda op, dtype: tuple(
        window + (kind,)
        for window in FIXED_WINDOWS
        for kind in ((0,) if op == "AveragePool" else range(1, 5))
    ),
    arguments=("p", "zero", "axes", "taps", "tap_offsets", "divisor_counts", "block"),
    examples=(("AveragePool", *_EXAMPLE), ("LpPool", _EXAMPLE[0], dict(_EXAMPLE[1], p=3))),
)
