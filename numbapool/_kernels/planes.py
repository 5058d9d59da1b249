"""Small planes: AveragePool's and LpPool's (p = 2) 3x3 windows over a run of a plane's
rows at once.

It serves 2-D AveragePool and LpPool (p = 2) windows of 3x3 taps with
strides of 1 or 2, no dilation and pads of 0 or 1 (every window then holds a tap of the
input), over planes of at least 2x2 and at most PLANE_ELEMENTS elements. The generic
kernel (sums.py) pays per output row: placing it, its cache of input rows, the calls that
sum a new input row and divide; on planes of 56x56 and smaller that was most of its time,
and the wide windows' kernel (wide.py) still pays its loops' ends per row. Here the row
sums of every input row a run of output rows reads (RUN_BYTES of them at most) are made
first, in a loop per row, each element's term computed again for each tap that reads it
(at stride 1 with pads of 1, one loop over those rows as one array, each term computed
once), each row's border outputs again with their taps checked; each output row then
adds its window's row sums and divides or takes the root.
Each sum is the generic kernel's, in its order (the taps of a row added to +0 left to
right, then the rows added to +0 in order: docs/semantics.md), so the results are the
same, bit for bit.
"""

import math

import numpy as np
from numba import njit

from . import inlined, kernel
from .codec import accumulator_array
from .family import Family, p_kind
from .scratch import release
from .sums import border_row_sum, divisor_row, term_at, window_output
from .units import interior_outputs, plane_axes

# The largest plane served: past it the generic kernel's rows, cached in the nearest cache,
# measured as fast (3x3 over 112x112 planes) or faster (224x224: 1.3x)
PLANE_ELEMENTS = 96 * 96
# The most bytes of row sums a run of output rows makes before its outputs read them: half
# of a 32 KiB first-level data cache. A whole plane's (56x56 of float64, 25 KB) left the
# cache before its outputs read it: in runs of this size LpPool p = 2 over 8x64x56x56 of
# float64 took 0.85 of the time
RUN_BYTES = 16 << 10


# sums.term_at compiled once per dtype for LLVM to inline, its kind of p a constant there:
# inlined in numba's IR at its nine call sites, a first call of AveragePool 3x3 took 0.7 s
# longer
_element = inlined()(term_at.py_func)
# The same for the border outputs' row sums (two call sites): a first call of LpPool p = 2
# 3x3 over 2x16x96x96 took 1.86-1.93 s against 2.20-2.27 s, AveragePool's 2.12-2.21 s
# against 2.52-2.56 s (fresh processes in turn), the loops' time the same
_border_row_sum = inlined()(border_row_sum.py_func)


@njit(inline="always")
def _row_sums(source, row_start, sums, at, out_width, lo, hi, step, left, axes, zero, p, p_kind):
    """sums[at + o] = the sum of the taps inside the row of output o's window (3 taps from
    o * step - left), for o < out_width; [lo, hi) the outputs whose taps all lie inside
    (the others: sums.border_row_sum, _border_row_sum here)."""
    one = np.uint64(1)  # unsigned offsets: a signed index would be checked for wraparound
    for o in range(np.uint64(lo), np.uint64(hi)):
        tap = row_start + o * step - np.uint64(left)
        sums[at + o] = (
            (zero + _element(source, tap, p, p_kind)) + _element(source, tap + one, p, p_kind)
        ) + _element(source, tap + one + one, p, p_kind)
    for o in range(lo):
        sums[at + np.uint64(o)] = _border_row_sum(
            source, np.int64(row_start), o, 3, axes, zero, p, p_kind
        )
    for o in range(hi, out_width):
        sums[at + np.uint64(o)] = _border_row_sum(
            source, np.int64(row_start), o, 3, axes, zero, p, p_kind
        )


@njit(inline="always")
def _flat_row_sums(source, start, rows, width, sums, zero, p, p_kind):
    """_row_sums of ``rows`` rows from ``start`` at stride 1 with a pad of 1 on both sides
    (as many outputs as elements, output o centred on element o): every output in one
    loop over the rows as one array, as if each row went on into the next, then each row's
    first and last outputs made again from their two taps inside."""
    one = np.uint64(1)
    count = np.uint64(rows * width)
    # each element's term once, the two left of element i + 1 carried from the iterations
    # before, which LLVM vectorizes by shuffling in the previous vector's last lanes:
    # LpPool p = 2 over 8x64x56x56 took 0.91 of the time of three terms per output (in
    # _row_sums' loops, over shorter rows, the same made it 1.05 to 1.09x slower)
    kept = zero + _element(source, start, p, p_kind)
    middle = _element(source, start + one, p, p_kind)
    for i in range(one, count - one):
        right = _element(source, start + i + one, p, p_kind)
        sums[i] = (kept + middle) + right
        kept = zero + middle
        middle = right
    for row in range(rows):
        i = np.uint64(row * width)
        sums[i] = (zero + _element(source, start + i, p, p_kind)) + _element(
            source, start + i + one, p, p_kind
        )
        i += np.uint64(width) - one
        sums[i] = (zero + _element(source, start + i - one, p, p_kind)) + _element(
            source, start + i, p, p_kind
        )


@njit(inline="always")
def _outputs(sums, rows, at, stride, out, out_at, count, p, p_kind, row_divisors, zero, y):
    """out[out_at + o] = the output (sums.window_output) of the window sum of output o, its
    ``rows`` (1 to 3) row sums from sums[at + o] on, ``stride`` apart, added in order to a
    zero; o < count."""
    if rows == 3:
        for o in range(count):
            total = ((zero + sums[at + o]) + sums[at + stride + o]) + sums[at + stride + stride + o]
            out[out_at + o] = window_output(total, o, p, p_kind, row_divisors, y)
    elif rows == 2:
        for o in range(count):
            total = (zero + sums[at + o]) + sums[at + stride + o]
            out[out_at + o] = window_output(total, o, p, p_kind, row_divisors, y)
    else:
        for o in range(count):
            out[out_at + o] = window_output(zero + sums[at + o], o, p, p_kind, row_divisors, y)


@kernel(error_model="numpy")  # the divisors are at least 1: no check for zero in the loops
def plane_sum_units(
    unit_begin, unit_end, x, y, zero, p, axes, divisor_counts, block, p_kind, column_step
):
    """AveragePool (``p_kind`` 0) or LpPool with p = 2 (``p_kind`` 2) over output rows
    [unit_begin, unit_end) (units: whole output rows, of ``block`` outputs) of the 3x3
    windows this module serves, accumulated in the type of ``zero``; AveragePool divides by
    the product of ``divisor_counts`` over the two axes. The kinds arrive as literals
    (entry.py); ``column_step``, the stride along the rows (1 or 2), makes the loads of each
    kind's loops constant."""
    height, width, out_height, out_width, top, left, row_step = plane_axes(axes)
    lo, hi = interior_outputs(axes, 3)
    hi = max(lo, hi)
    sums = accumulator_array(height * out_width, zero)
    run_rows = max(1, RUN_BYTES // (out_width * sums.itemsize * row_step))
    row_divisors = accumulator_array(out_width if p_kind == 0 else 0, zero)
    divisors_leading = -1
    stride = np.uint64(out_width)
    unit = unit_begin
    while unit < unit_end:
        plane = unit // out_height
        first = unit - plane * out_height
        # output rows [first, end) here
        end = min(out_height, first + unit_end - unit, first + run_rows)
        # the input rows their windows read, each row's sums made once
        row_lo = max(0, first * row_step - top)
        row_hi = min(height, (end - 1) * row_step - top + 3)
        if column_step == 1 and out_width == width:
            _flat_row_sums(
                x,
                np.uint64((plane * height + row_lo) * width),
                row_hi - row_lo,
                width,
                sums,
                zero,
                p,
                p_kind,
            )
        else:
            for row in range(row_lo, row_hi):
                _row_sums(
                    x,
                    np.uint64((plane * height + row) * width),
                    sums,
                    np.uint64(row - row_lo) * stride,
                    out_width,
                    lo,
                    hi,
                    np.uint64(column_step),
                    left,
                    axes,
                    zero,
                    p,
                    p_kind,
                )
        for row in range(first, end):
            if p_kind == 0:
                leading = divisor_counts[0, row]
                if leading != divisors_leading:
                    divisor_row(row_divisors, leading, divisor_counts, zero)
                    divisors_leading = leading
            # the window's rows inside the input: one at least (pads of at most 1)
            window_top = row * row_step - top
            inside_top = max(window_top, 0)
            rows = min(window_top + 3, height) - inside_top
            _outputs(
                sums,
                rows,
                np.uint64(inside_top - row_lo) * stride,
                stride,
                y,
                np.uint64((plane * out_height + row) * out_width),
                np.uint64(out_width),
                p,
                p_kind,
                row_divisors,
                zero,
                y,
            )
        unit += end - first
    release(sums, row_divisors)


def _serves(request):
    """AveragePool's or LpPool's (p = 2) 3x3 window, strides of 1 or 2, no dilation, pads
    of 0 or 1, over planes of 2x2 to PLANE_ELEMENTS elements: (kind of p, row step)."""
    plan = request.plan
    if not (
        (plan.op == "AveragePool" or (plan.op == "LpPool" and plan.p == 2.0))
        and plan.kernel_shape == (3, 3)
        and max(plan.strides) <= 2
        and plan.dilations == (1, 1)
        and max(plan.pads_begin + plan.pads_end) <= 1
        and min(plan.spatial_in) >= 2
        and math.prod(plan.spatial_in) <= PLANE_ELEMENTS
    ):
        return None
    return p_kind(plan.op, plan.p), plan.strides[-1]


FAMILY = Family(
    plane_sum_units,
    ops=("AveragePool", "LpPool"),
    serves=_serves,
    kinds=lambda op, dtype: tuple((p_kind(op, 2.0), step) for step in (1, 2)),
    arguments=("zero", "p_as_zero", "axes", "divisor_counts", "block"),
    whole_rows=True,
    examples=(
        ("AveragePool", (2, 8, 9, 11), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
        ("LpPool", (2, 8, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], p=2)),
    ),
)
