"""Wide windows: AveragePool and LpPool (p = 2) over 2-D windows, input rows padded once.

It serves 2-D windows with no dilation and a step in COLUMN_STEPS along
the rows, but the fixed 2x2 ones, and for windows over one axis at a step of 2, or of 4
when they are at least 4 wide (as 2-D windows of height 1: WindowPlan.rows_geometry),
when the units are whole output rows:
AveragePool's but those 3 taps wide along the rows (the generic kernel's one loop body
for three taps is faster there), and LpPool's with p = 2, the common norm (each other
kind of p would be two more kernels to compile per dtype). The generic kernel (sums.py)
adds a row's taps one pass over the row's sums at a time, each tap's run clipped to the
input, computing each element's term again for every tap that reads it, and a window's
rows one pass at a time too. Here each input row's terms are first computed once into a
scratch row with zeros where the pads are, so that every output takes every tap from
there, up to five taps to a pass; the row sums of the last input rows stay in a ring of
slots, and each output row adds its window's rows three to a pass, the last pass dividing
(or taking the root) straight into the output. No pass stores zeros first: a sum's first
pass starts from zero itself.

Each sum is the generic kernel's, in its order (the taps of a row added to +0 left to
right, then the rows added to +0 in order: docs/semantics.md), so the results are the
same, bit for bit: a zero from the pads added to a sum that starts at +0 changes nothing
(such a sum is never -0, and x + 0 is x for every other x, NaNs and infinities included)."""

import numpy as np
from numba import njit

from .._plan import AXIS_EXTENT
from . import kernel
from .codec import accumulator_array, as_accumulator, decode
from .family import Family, p_kind, row_window
from .scratch import release
from .sums import divisor_row, lp_term, window_output
from .units import first_pass_or, plane_axes, ring_slot, ring_slots, window_rows

# The strides along the rows compiled as kinds of their own, each with its loads constant:
# at 4, LLVM loads four taps' elements as whole vectors and shuffles them apart, where the
# generic kernel's tap at a time loads element by element (a 1-D window k4 s4, 0.69 of its
# time; 4x4 s4, 0.30)
COLUMN_STEPS = (1, 2, 4)

# The most taps a pass over a row's sums adds: each pass loads and stores the sums again.
# At 5, not 4, AveragePool 5x5 (one pass, not two) took 0.92 of the time and 9x9 (two
# passes, not three) 0.96
TAPS_PER_PASS = 5


@njit(inline="always")
def _padded_row(source, row_start, padded, left, count, zero, p, p_kind):
    """padded[left + i] = the term (sums.lp_term) of input element i of the row from
    ``row_start``, in the accumulator type, for i < ``count``; the rest of ``padded`` keeps
    its zeros."""
    at = np.uint64(left)
    for i in range(np.uint64(count)):
        padded[at + i] = lp_term(as_accumulator(decode(source[row_start + i]), zero), p, p_kind)


@njit(inline="always")
def _add_taps(padded, tap, taps, sums, at, out_width, step, zero, first):
    """sums[at + o] += the ``taps`` (1 to TAPS_PER_PASS) elements from
    padded[o * step + tap], in order, for o < out_width; at the ``first`` pass, the sums
    start from ``zero``."""
    one = np.uint64(1)
    if taps == 5:
        for o in range(np.uint64(out_width)):
            i = o * step + tap
            sum_ = first_pass_or(first, zero, sums[at + o])
            sums[at + o] = (
                (((sum_ + padded[i]) + padded[i + one]) + padded[i + one + one])
                + padded[i + one + one + one]
            ) + padded[i + one + one + one + one]
    elif taps == 4:
        for o in range(np.uint64(out_width)):
            i = o * step + tap
            sum_ = first_pass_or(first, zero, sums[at + o])
            sums[at + o] = (
                ((sum_ + padded[i]) + padded[i + one])
                + padded[i + one + one]
                + padded[i + one + one + one]
            )
    elif taps == 3:
        for o in range(np.uint64(out_width)):
            i = o * step + tap
            sum_ = first_pass_or(first, zero, sums[at + o])
            sums[at + o] = ((sum_ + padded[i]) + padded[i + one]) + padded[i + one + one]
    elif taps == 2:
        for o in range(np.uint64(out_width)):
            i = o * step + tap
            sums[at + o] = (first_pass_or(first, zero, sums[at + o]) + padded[i]) + padded[i + one]
    else:
        for o in range(np.uint64(out_width)):
            sums[at + o] = first_pass_or(first, zero, sums[at + o]) + padded[o * step + tap]


@njit(inline="always")
def _add_rows(
    sums,
    first,
    rows,
    slots,
    totals,
    out_width,
    zero,
    start,
    last,
    out,
    out_at,
    p,
    p_kind,
    row_divisors,
    y,
):
    """totals[o] += the row sums of ``rows`` (0 to 3) input rows from ``first``, in order,
    each from its slot of the ring, for o < out_width; at the ``start``, the totals start
    from ``zero``; at the ``last`` rows, they go to out[out_at + o] (sums.window_output), not to
    ``totals``. Every slot is loaded, ``rows`` choosing the terms by selects: one loop, not
    one per count of rows."""
    width = np.uint64(out_width)
    a = ring_slot(first, slots, out_width)
    b = ring_slot(first + 1, slots, out_width)
    c = ring_slot(first + 2, slots, out_width)
    for o in range(width):
        total = first_pass_or(start, zero, totals[o])
        first_row, second, third = sums[a + o], sums[b + o], sums[c + o]
        total = total + first_row if rows >= 1 else total
        total = total + second if rows >= 2 else total
        total = total + third if rows == 3 else total
        if last:
            out[out_at + o] = window_output(total, o, p, p_kind, row_divisors, y)
        else:
            totals[o] = total


@kernel(error_model="numpy")  # the divisors are at least 1: no check for zero in the loop
def wide_sum_units(
    unit_begin, unit_end, x, y, zero, p, axes, divisor_counts, block, p_kind, column_step
):
    """AveragePool (``p_kind`` 0) or LpPool with p = 2 (``p_kind`` 2) over output rows
    [unit_begin, unit_end) (units: whole output rows, of ``block`` outputs) of the windows
    this module serves, accumulated in the type of ``zero``; AveragePool divides by the
    product of ``divisor_counts`` over the two axes. The kinds arrive as literals
    (entry.py): ``column_step``, the stride along the rows (COLUMN_STEPS), makes the
    loads of each kind's loops constant."""
    height, width, out_height, out_width, top, left, row_step = plane_axes(axes)
    window_height, window_width = axes[AXIS_EXTENT, 0], axes[AXIS_EXTENT, 1]
    step = np.uint64(column_step)
    # the padded row: every tap of every output; the input elements that some tap reads
    padded_width = (out_width - 1) * column_step + window_width
    copied = max(0, min(width, padded_width - left))
    padded = accumulator_array(padded_width, zero)
    for i in range(padded_width):
        padded[i] = zero
    # a row's taps in as few passes as take TAPS_PER_PASS at most, as even as can be
    passes = (window_width + TAPS_PER_PASS - 1) // TAPS_PER_PASS
    slots = ring_slots(window_height)
    sums = accumulator_array(slots * out_width, zero)
    totals = accumulator_array(out_width, zero)
    row_divisors = accumulator_array(out_width if p_kind == 0 else 0, zero)
    divisors_leading = -1
    plane = -1
    next_row = 0  # the plane's next input row without its row sums in the ring
    for unit in range(unit_begin, unit_end):
        plane, row, inside_top, inside_end, next_row = window_rows(
            unit, plane, next_row, out_height, row_step, top, window_height, height
        )
        while next_row < inside_end:
            _padded_row(
                x,
                np.uint64((plane * height + next_row) * width),
                padded,
                left,
                copied,
                zero,
                p,
                p_kind,
            )
            at = ring_slot(next_row, slots, out_width)
            for tap_pass in range(passes):
                tap = tap_pass * window_width // passes
                _add_taps(
                    padded,
                    np.uint64(tap),
                    (tap_pass + 1) * window_width // passes - tap,
                    sums,
                    at,
                    out_width,
                    step,
                    zero,
                    tap_pass == 0,
                )
            next_row += 1
        out_at = np.uint64(unit * out_width)
        if p_kind == 0:
            leading = divisor_counts[0, row]
            if leading != divisors_leading:
                divisor_row(row_divisors, leading, divisor_counts, zero)
                divisors_leading = leading
        # a window with no row inside takes one group of no rows
        for first in range(inside_top, max(inside_end, inside_top + 1), 3):
            _add_rows(
                sums,
                first,
                min(3, inside_end - first),
                slots,
                totals,
                out_width,
                zero,
                first == inside_top,
                first + 3 >= inside_end,
                y,
                out_at,
                p,
                p_kind,
                row_divisors,
                y,
            )
    release(padded, sums, totals, row_divisors)


def _serves(request):
    """A row_window at a stride along the rows in COLUMN_STEPS: (kind of p, row step).
    Over one axis not at a stride of 1 (there the generic kernel's passes over runs of
    consecutive elements were faster) and, at a stride of 4, at least 4 taps wide
    (narrower ones read less than the padded row copies); for AveragePool not 3 taps wide
    at strides of 1 and 2 (the generic kernel's three_tap_row_sums takes those rows in one
    loop body, with no padded copy: measured faster); for LpPool p = 2 only."""
    plan = request.plan
    step, width = plan.strides[-1], plan.kernel_shape[-1]
    if not row_window(plan, COLUMN_STEPS):
        return None
    if len(plan.kernel_shape) == 1 and (step == 1 or width < step):
        return None
    if plan.op == "AveragePool" and width == 3 and step <= 2:
        return None
    if plan.op == "LpPool" and plan.p != 2.0:
        return None
    return p_kind(plan.op, plan.p), step


FAMILY = Family(
    wide_sum_units,
    ops=("AveragePool", "LpPool"),
    serves=_serves,
    kinds=lambda op, dtype: tuple((p_kind(op, 2.0), step) for step in COLUMN_STEPS),
    arguments=("zero", "p_as_zero", "row_axes", "row_divisor_counts", "block"),
    whole_rows=True,
    examples=(
        ("AveragePool", (2, 8, 9, 11), dict(kernel_shape=[5, 5])),
        ("LpPool", (2, 8, 9, 11), dict(kernel_shape=[4, 4], strides=[2, 2], p=2)),
        ("AveragePool", (2, 8, 40), dict(kernel_shape=[4], strides=[4])),
    ),
)
