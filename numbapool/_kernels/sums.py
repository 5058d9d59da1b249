"""AveragePool and LpPool over any window, any number of axes (the generic summing kernel).

It serves the AveragePool and LpPool windows that fixed.py, planes.py and
wide.py leave: over one axis at a step other than 2, over three axes and more, dilated, a
step past 2 along the rows, AveragePool's 3 taps wide along the rows but 3x3 over small
planes, and LpPool's with p other than 2. A window's sum is the sum over its input rows, in order, of each row's sum
along the last axis (docs/semantics.md); each input row's sums are computed once, cached,
and serve the next output rows. AveragePool sums accumulate in float32 (float64 for
float64 input), LpPool's in float64 (``|x| ** p`` leaves float32's range for moderate p).
AveragePool windows 3 taps wide (step 1 or 2, no dilation) take a row's taps in one loop
body, and three-row windows add and divide in one loop."""

import numpy as np
from numba import njit

from .._plan import AXIS_DILATION, AXIS_IN, AXIS_OUT, AXIS_PAD_BEGIN, AXIS_STRIDE
from . import inlined, kernel
from .codec import (
    accumulator_array,
    as_accumulator,
    decode,
    encode,
    float64_bits,
    float64_from_bits,
)
from .family import Family, p_kind
from .scratch import empty, full, release
from .units import (
    first_input_row,
    first_unit,
    input_plane,
    input_row_strides,
    interior_outputs,
    interior_span,
    next_unit,
    output_plane,
    place_row,
    row_slot,
    tap_is_inside,
    tap_run,
)


@njit(inline="always")
def lp_term(value, p, p_kind):
    """The summand: value itself (p_kind 0, AveragePool), |value| (1), value ** 2 (2),
    |value| ** 3 (3) or |value| ** p (4). The integer powers are products: for inputs of
    at most 24 significant bits, |value| ** 3 is then the cube rounded once to float64."""
    if p_kind == 0:
        return value
    magnitude = abs(value)
    if p_kind == 1:
        return magnitude
    if p_kind == 2:
        return magnitude * magnitude
    if p_kind == 3:
        return magnitude * magnitude * magnitude
    return magnitude**p


@njit(inline="always")
def lp_root(total, p, p_kind):
    if p_kind <= 1:
        return total
    if p_kind == 2:
        return np.sqrt(total)
    return total ** (1 / p)


@njit(inline="always")
def window_output(total, o, p, p_kind, row_divisors, y):
    """Output o of a row from its window's total: the mean (``p_kind`` 0, by
    row_divisors[o]) or the root, rounded once to the dtype of ``y``."""
    if p_kind == 0:
        return encode(total / row_divisors[o], y)
    return encode(lp_root(total, p, p_kind), y)


# cube_root's shortcut: totals in [CUBE_LOW, CUBE_HIGH], whose roots' cubes stay normal
CUBE_LOW = 2.0**-900
CUBE_HIGH = 2.0**900
# How far the approximate root's cube lies from the total at most, and the bracket's half
# width, relative: see _approximate_cube_root and cube_root
CUBE_SLACK = 2.0**-43
# t ** (-1/3) within 3.5%, by its bits: the exponent divided by -3
INVERSE_CUBE_ROOT_BITS = np.int64(0x553EF0FF289DD796)


# Its products and sums may fuse (fastmath "contract"). Fused and in two steps of fourth
# order, not four of Newton's, the roots' loop took 0.66 of the time (scratch measurement,
# runs of 512).
@inlined(fastmath={"contract"})
def _approximate_cube_root(t):
    """About t ** (1/3), for t in [CUBE_LOW, CUBE_HIGH], whose cube lies within t 2**-48 of
    t: t y ** 2, y about t ** (-1/3), from a guess by its bits and two steps of the series
    below.

    The guess lies within 3.42% of t ** (-1/3) (every mantissa of three consecutive
    exponents, by steps of 2**-21; the guess depends on the exponent modulo 3 alone), so
    e = 1 - t y ** 3 lies in [-0.107, 0.100]. A step takes e to 1 - (1 - e) (1 + e/3 +
    2e²/9 + 14e³/81) ** 3, a polynomial of e from e ** 4 on, under 6.8e-5 for |e| <= 0.11
    and under 2**-56.5 after the second step. The roundings of the last step and of
    t y ** 2 (each product and fused sum within 2**-53) put y within 3 and the root within
    8 units of 2**-53 of exact, its cube within 24: 2**-48.4 (tests/test_semantics.py
    checks the bound in exact arithmetic)."""
    inverse = float64_from_bits(
        INVERSE_CUBE_ROOT_BITS - np.int64(np.float64(float64_bits(t)) * (1.0 / 3.0))
    )
    for _ in range(2):
        # t y**3 = 1 - e: t ** (-1/3) = y (1 - e) ** (-1/3) = y (1 + e/3 + 2e²/9 + 14e³/81 + ...)
        e = 1.0 - t * (inverse * inverse * inverse)
        inverse = inverse + inverse * (e * ((1.0 / 3.0) + e * ((2.0 / 9.0) + e * (14.0 / 81.0))))
    return t * inverse * inverse


@njit(inline="always")
def cube_root(total, y):
    """(pow(total, 1 / 3) rounded to the dtype of ``y``, which is narrower than float64;
    whether that result is in doubt), without calling pow(), so that a loop of it
    vectorizes.

    For t in [CUBE_LOW, CUBE_HIGH], pow(t, 1 / 3 in float64) lies within 2**-46.2 of the
    exact root r, relative: the exponent's rounding moves it by at most |ln t| 2**-54 / 3
    < 2**-46.3, and pow's own error is under an ulp. The approximation a's exact cube lies
    within t 2**-48 of t (_approximate_cube_root), within t s (s = CUBE_SLACK), so r lies
    within 2**-44.5 of a, and pow's result within 2**-44 of a. low = a (1 - s) and high =
    a (1 + s), even rounded, lie further from a than that, so pow's result lies between
    them, and if both round to one result, pow's rounds to it too: rounding never
    reverses an order. Otherwise the result is in doubt: about 2**-18.5 of float32
    results, and every total outside that range. (Checking a's cube against t as well
    made LpPool p = 3 about 1.1x slower.)"""
    t = min(max(total, CUBE_LOW), CUBE_HIGH)
    root = _approximate_cube_root(t)
    low = root * (1.0 - CUBE_SLACK)
    high = root * (1.0 + CUBE_SLACK)
    result = encode(low, y)
    # bitwise, not short-circuit: no branch in a loop of them
    doubt = (result != encode(high, y)) | (total != t)
    return result, doubt


@njit(inline="always")
def store_cube_roots(totals, count, out, out_begin):
    """out[out_begin + j] = pow(totals[j], 1 / 3) rounded to out's dtype, for j < count
    (LpPool p = 3). Narrower than float64, through cube_root, in a loop that vectorizes;
    a run with one in doubt is done again with pow()."""
    if out.itemsize < 8:
        doubt = False
        for j in range(count):
            out[out_begin + np.uint64(j)], unsure = cube_root(totals[j], out)
            doubt |= unsure
        if not doubt:
            return
    for j in range(count):
        out[out_begin + np.uint64(j)] = encode(lp_root(totals[j], 3.0, 3), out)


# LpPool p = 3's totals wait in a queue for their cube roots until a run of ROOT_RUN is
# ready: LLVM vectorizes store_cube_roots's loop 32 roots to a pass and takes the rest 4 or
# 1 at a time, so that a row of 28 roots took 3 times as long per root as a run of 512
ROOT_RUN = 512


@njit(inline="always")
def root_queue(p_kind, block):
    """The queue of float64 totals waiting for their cube roots (LpPool p = 3, ``p_kind``
    3): room for a run of ROOT_RUN and a unit's ``block`` outputs; empty for other kinds. A
    scratch array, which the kernel releases (scratch.py)."""
    return empty(ROOT_RUN + block if p_kind == 3 else 0, np.float64)


@njit(inline="always")
def queue_roots(queue, queued, out, out_end, last_unit):
    """The queue holds the totals of the ``queued`` outputs just before out[out_end]
    (consecutive units' outputs follow on from each other in y). At ROOT_RUN or more, or
    after a kernel's last unit, their roots are stored. Returns how many stay queued."""
    if queued >= ROOT_RUN or last_unit:
        store_cube_roots(queue, queued, out, out_end - np.uint64(queued))
        return 0
    return queued


@njit(inline="always")
def term_at(source, index, p, p_kind):
    """One element's summand, computed in the accumulator type (that of ``p``)."""
    return lp_term(as_accumulator(decode(source[index]), p), p, p_kind)


@inlined()
def _kind_run(source, offset, step, totals, begin, count, p, p_kind):
    # compiled once per kind (a literal), its loop free of branches, and inlined by LLVM
    for j in range(count):
        totals[begin + np.uint64(j)] += term_at(source, offset + np.uint64(j) * step, p, p_kind)


@njit(inline="always")
def _sum_run(source, offset, step, totals, begin, count, p, p_kind):
    if p_kind == 0:
        _kind_run(source, offset, step, totals, begin, count, p, 0)
    elif p_kind == 1:
        _kind_run(source, offset, step, totals, begin, count, p, 1)
    elif p_kind == 2:
        _kind_run(source, offset, step, totals, begin, count, p, 2)
    elif p_kind == 3:
        _kind_run(source, offset, step, totals, begin, count, p, 3)
    else:
        _kind_run(source, offset, step, totals, begin, count, p, 4)


@njit(inline="always")
def sum_run(source, offset, step, totals, begin, count, p, p_kind):
    """Add one tap's terms to ``count`` consecutive outputs from ``begin``; constant steps
    1 and 2 as in ``max_run``."""
    if step == 1:
        _sum_run(source, offset, np.uint64(1), totals, begin, count, p, p_kind)
    elif step == 2:
        _sum_run(source, offset, np.uint64(2), totals, begin, count, p, p_kind)
    else:
        _sum_run(source, offset, step, totals, begin, count, p, p_kind)


@njit(inline="always")
def _row_window_sums(source, row_start, target, base, first, lo, hi, width, step, axes, zero):
    """AveragePool's row sums target[base + o - first] for the outputs o in [lo, hi), whose
    taps all lie inside the input, with the width and step constants: the taps of an
    output in one loop body, added in order to ``zero`` as in ``sum_run``."""
    last = axes.shape[1] - 1
    at = np.uint64(row_start + lo * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last])
    begin = base + np.uint64(lo - first)
    for j in range(hi - lo):
        tap = at + np.uint64(j) * step
        total = zero + as_accumulator(decode(source[tap]), zero)
        for w in range(1, width):
            total += as_accumulator(decode(source[tap + np.uint64(w)]), zero)
        target[begin + np.uint64(j)] = total


@njit(inline="always")
def border_row_sum(source, row_start, o, width, axes, zero, p, p_kind):
    """The row sum of output o's terms (term_at; ``p`` of the accumulator type of
    ``zero``), its taps checked one by one (dilation 1)."""
    last = axes.shape[1] - 1
    total = zero
    at = o * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
    for w in range(width):
        if 0 <= at + w < axes[AXIS_IN, last]:
            total += term_at(source, np.uint64(row_start + at + w), p, p_kind)
    return total


@kernel()  # not inlined, as max_over_last_axis
def three_tap_row_sums(source, row_start, first, end, step, target, base, zero, axes, interior):
    """``sum_over_last_axis`` for AveragePool's common windows, 3 taps wide along the last
    axis with no dilation and a step of 1 or 2: the interior outputs' taps in one loop body,
    the others one by one; each sum in the same order."""
    lo, hi = interior_span(first, end, interior)
    if step == 1:
        _row_window_sums(
            source, row_start, target, base, first, lo, hi, 3, np.uint64(1), axes, zero
        )
    else:
        _row_window_sums(
            source, row_start, target, base, first, lo, hi, 3, np.uint64(2), axes, zero
        )
    for o in range(first, lo):
        target[base + np.uint64(o - first)] = border_row_sum(
            source, row_start, o, 3, axes, zero, zero, 0
        )
    for o in range(hi, end):
        target[base + np.uint64(o - first)] = border_row_sum(
            source, row_start, o, 3, axes, zero, zero, 0
        )


@kernel()  # not inlined, as max_over_last_axis
def sum_over_last_axis(
    source,
    row_start,
    first,
    end,
    step,
    target,
    base,
    zero,
    axes,
    tap_outputs,
    tap_offsets,
    k_last,
    p,
    p_kind,
):
    """target[base + j] = the sum of the terms of one input row's last-axis taps inside the
    input, for output first + j."""
    for j in range(end - first):
        target[base + np.uint64(j)] = zero
    for kw in range(k_last):
        begin, count, offset = tap_run(kw, first, end, tap_outputs, row_start, axes, tap_offsets)
        sum_run(source, offset, step, target, base + begin, count, p, p_kind)


@njit(inline="always")
def border_sum(
    o, row_offset, row_inside, starts, zero, p, p_kind, source, axes, taps, tap_offsets, k_last
):
    """The window sum of output o of a row (its terms as lp_term's, ``p`` in the type of
    ``zero``): each input row's sum, then the rows in order."""
    last = axes.shape[1] - 1
    at = o * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
    total = zero
    for lead in range(taps.shape[0] // k_last):
        if not row_inside and not tap_is_inside(lead * k_last, taps, starts, axes, last):
            continue
        row_sum = zero
        for tap in range(lead * k_last, (lead + 1) * k_last):
            position = at + taps[tap, last] * axes[AXIS_DILATION, last]
            if 0 <= position < axes[AXIS_IN, last]:
                row_sum += term_at(source, np.uint64(row_offset + at + tap_offsets[tap]), p, p_kind)
        total += row_sum
    return total


@inlined()
def leading_divisor(divisor_counts, positions, last):
    """The product of AveragePool's per-axis tap counts over the leading axes."""
    # an int64 from the start: a literal 1 would have numba compile the callees it is
    # passed to for Literal[int](1) too, before its type settles
    leading = np.int64(1)
    for axis in range(last):
        leading *= divisor_counts[axis, positions[axis]]
    return leading


@njit(inline="always")
def divisor_at(leading, divisor_counts, o, zero):
    """(AveragePool's divisor of output o of a row, ``leading`` (leading_divisor) times the
    last axis's tap count, 0 for a window with no tap inside; that divisor but at least 1,
    in the accumulator type of ``zero``)."""
    divisor = leading * divisor_counts[np.uint64(divisor_counts.shape[0] - 1), np.uint64(o)]
    return divisor, as_accumulator(max(divisor, 1), zero)


@njit(inline="always")
def mean_at(total, leading, divisor_counts, o, zero, y):
    """AveragePool's output o of a row (its index along the last axis) from its window sum:
    the sum over its divisor (divisor_at); 0 for a window with no tap inside; rounded once
    to y's type."""
    divisor, as_float = divisor_at(leading, divisor_counts, o, zero)
    return encode(total / as_float if divisor > 0 else zero, y)


@inlined()
def divisor_row(row_divisors, leading, divisor_counts, zero):
    """row_divisors[o] = the divisor of output o along the last axis (divisor_at, at least
    1) in a row whose leading axes' tap counts multiply to ``leading``."""
    for o in range(row_divisors.shape[0]):
        row_divisors[o] = divisor_at(leading, divisor_counts, o, zero)[1]


# The two loops below divide by row_divisors (divisor_row), not by the int64 table's product
# converted per output (mean_at), with which the three-row loop ran 8 floats wide, not 16.
# An output with no tap inside sums to zero and its divisor is 1: it gives 0, as in mean_at.
# numba's "numpy" error model: the divisors are at least 1, and its check for a division by
# zero kept the loop scalar. _three_row_means is compiled once per kernel for LLVM to inline.
@inlined(error_model="numpy")
def _three_row_means(rows, row_bases, out, out_begin, first, count, row_divisors, zero, y):
    """AveragePool outputs of a window with three input rows: the cached row sums added in
    order to a zero, as the totals are, then divided."""
    row0, row1, row2 = (np.uint64(row_bases[0]), np.uint64(row_bases[1]), np.uint64(row_bases[2]))
    for j in range(count):
        k = np.uint64(j)
        total = ((zero + rows[row0 + k]) + rows[row1 + k]) + rows[row2 + k]
        out[out_begin + k] = encode(total / row_divisors[np.uint64(first + j)], y)


@kernel(error_model="numpy")  # not inlined: in sum_pool_units, once its kind's branches
# alone were left, this loop made a generic AveragePool 4x4 1.1x slower
def store_means(totals, out, out_begin, count, first, row_divisors, y):
    """out[out_begin + j] = AveragePool's output first + j of a row from its window sum
    totals[j]."""
    for j in range(count):
        out[out_begin + np.uint64(j)] = encode(totals[j] / row_divisors[np.uint64(first + j)], y)


# The kinds arrive as literal arguments (entry.py): each compiles its own branches only
# (_numba.LiteralKindsCompiler), AveragePool none of LpPool's roots and the reverse, a window 3 taps
# wide none of the generic row sums and the reverse.
@kernel()
def sum_pool_units(
    unit_begin,
    unit_end,
    x,
    y,
    p,
    zero,
    axes,
    taps,
    tap_offsets,
    tap_outputs,
    lead_rows,
    divisor_counts,
    block,
    slots,
    p_kind,
    three_taps,
):
    """AveragePool (p_kind 0) and LpPool (p_kind 1 to 4) over each window's taps inside the
    input, accumulated in the type of ``zero`` (float32 or float64). AveragePool divides by
    the product over axes of ``divisor_counts``; a divisor of 0 (a window with no tap
    inside) gives 0. ``three_taps``: an AveragePool window 3 taps wide along the last axis,
    with no dilation and a step of 1 or 2, whose input rows three_tap_row_sums sums.

    A window's sum is the sum over its rows, in order, of each row's sum along the last
    axis; each input row's sums are computed once, cached, and serve the next output rows,
    whose windows share input rows."""
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    out_last = axes[AXIS_OUT, last]
    in_plane, out_plane = input_plane(axes), output_plane(axes)
    channel_rows = in_plane // axes[AXIS_IN, last]
    row_strides = input_row_strides(axes)
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    interior = interior_outputs(axes, 3)
    p_acc = as_accumulator(p, zero)
    # AveragePool windows of three input rows add them in _three_row_means, once all three
    # are cached: only when the rows cannot share a slot (they span fewer rows than slots)
    defer = p_kind == 0 and lead_count == 3 and lead_rows[2] - lead_rows[0] < slots
    # AveragePool's divisors along the last axis, for the leading axes' product of counts
    # they were made for: remade where that product changes (the edges of the leading axes)
    row_divisors = accumulator_array(out_last if p_kind == 0 else 0, zero)
    divisors_leading = -1
    starts = empty(rank, np.int64)
    totals = accumulator_array(block, zero)
    rows = accumulator_array(slots * block, zero)
    queue = root_queue(p_kind, block)
    queued = 0
    keys = full(slots, -1, np.int64)
    row_bases = empty(lead_count, np.int64)
    positions = empty(rank, np.int64)
    nc = first_unit(unit_begin, axes, block, positions)
    for unit in range(unit_begin, unit_end):
        if unit > unit_begin:
            nc = next_unit(positions, nc, axes, block)
        first, end, row, row_offset, row_inside = place_row(positions, axes, block, starts)
        row_offset += nc * in_plane
        all_rows = False  # a window of three cached input rows, all inside: added when divided
        if (
            lead_count == 1
            and not three_taps
            and (row_inside or tap_is_inside(0, taps, starts, axes, last))
        ):
            # one input row per window: no rows to add up (three-tap rows take the path
            # below: a second call of three_tap_row_sums made the 2-D windows 5-8% slower)
            sum_over_last_axis(
                x,
                row_offset,
                first,
                end,
                step,
                totals,
                np.uint64(0),
                zero,
                axes,
                tap_outputs,
                tap_offsets,
                k_last,
                p_acc,
                p_kind,
            )
        else:
            first_row = first_input_row(nc, channel_rows, starts, row_strides)
            if not defer:
                for j in range(end - first):
                    totals[j] = zero
            inside_rows = 0
            for lead in range(lead_count):
                tap = lead * k_last
                if not row_inside and not tap_is_inside(tap, taps, starts, axes, last):
                    continue
                slot, missing = row_slot(first_row + lead_rows[lead], first, keys, slots, out_last)
                base = np.uint64(slot * block)
                row_bases[inside_rows] = slot * block
                inside_rows += 1
                # the kind tested on its own, so that its compile drops the other call
                if missing:
                    if three_taps:
                        three_tap_row_sums(
                            x,
                            row_offset + tap_offsets[tap],
                            first,
                            end,
                            step,
                            rows,
                            base,
                            zero,
                            axes,
                            interior,
                        )
                    else:
                        sum_over_last_axis(
                            x,
                            row_offset + tap_offsets[tap],
                            first,
                            end,
                            step,
                            rows,
                            base,
                            zero,
                            axes,
                            tap_outputs,
                            tap_offsets,
                            k_last,
                            p_acc,
                            p_kind,
                        )
                if not defer:
                    for j in range(end - first):
                        totals[j] += rows[base + np.uint64(j)]
            all_rows = defer and inside_rows == 3
            if defer and not all_rows:  # a window at the edge: fewer rows
                for j in range(end - first):
                    totals[j] = zero
                for r in range(inside_rows):
                    for j in range(end - first):
                        totals[j] += rows[np.uint64(row_bases[r]) + np.uint64(j)]
        out_begin = np.uint64(nc * out_plane + row + first)
        if p_kind == 0:
            leading = leading_divisor(divisor_counts, positions, last)
            if leading != divisors_leading:
                divisor_row(row_divisors, leading, divisor_counts, zero)
                divisors_leading = leading
            if all_rows:
                _three_row_means(
                    rows, row_bases, y, out_begin, first, end - first, row_divisors, zero, y
                )
            else:
                store_means(totals, y, out_begin, end - first, first, row_divisors, y)
        elif p_kind == 3:
            for j in range(end - first):
                queue[np.uint64(queued + j)] = totals[j]
            queued = queue_roots(
                queue,
                queued + end - first,
                y,
                out_begin + np.uint64(end - first),
                unit == unit_end - 1,
            )
        else:
            for j in range(end - first):
                y[out_begin + np.uint64(j)] = encode(lp_root(totals[j], p_acc, p_kind), y)
    release(row_strides, row_divisors, starts, totals, rows, queue, keys, row_bases, positions)


def _serves(request):
    """Every AveragePool and LpPool window: (kind of p, three_taps), three_taps for
    AveragePool's windows 3 taps wide along the last axis, undilated there, at a step of 1
    or 2 (three_tap_row_sums)."""
    plan = request.plan
    kind = p_kind(plan.op, plan.p)
    three_taps = plan.kernel_shape[-1] == 3 and plan.strides[-1] <= 2 and plan.dilations[-1] == 1
    return kind, kind == 0 and three_taps


FAMILY = Family(
    sum_pool_units,
    ops=("AveragePool", "LpPool"),
    serves=_serves,
    kinds=lambda op, dtype: (
        ((0, False), (0, True)) if op == "AveragePool" else tuple((k, False) for k in range(1, 5))
    ),
    arguments=(
        "p",
        "zero",
        "axes",
        "taps",
        "tap_offsets",
        "tap_outputs",
        "lead_rows",
        "divisor_counts",
        "block",
        "slots",
    ),
    examples=(
        ("AveragePool", (2, 8, 7, 9, 11), dict(kernel_shape=[3, 3, 3], pads=[1] * 6)),
        ("AveragePool", (2, 8, 30), dict(kernel_shape=[3])),
        ("LpPool", (2, 8, 30), dict(kernel_shape=[3], p=3)),
        ("LpPool", (2, 8, 20, 20), dict(kernel_shape=[3, 3], dilations=[2, 2], p=1)),
    ),
)
