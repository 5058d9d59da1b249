"""Windowed pooling kernels (MaxPool, AveragePool, LpPool) for any number of spatial axes.

Layout: ``x`` is (N*C, prod(input spatial)) and ``y`` is (N*C, prod(output spatial)), both
C-ordered. ``axes`` is ``WindowPlan.geometry["axes"]``: one int64 row per AXIS_* name of _plan,
one column per spatial axis; ``taps`` and ``tap_offsets`` list the window's taps in row-major
order (the scan order that decides ties and the first NaN).

Work units are one (n, c), one position along every spatial axis but the last, and one block
of at most ``block`` outputs along the last axis, so that all threads are busy even when N*C
is 1; the units are dealt out in ``chunks`` contiguous runs, one scratch allocation per run.

Along the last axis each unit has a left border, an interior where every window lies inside
the input along that axis, and a right border. The interior runs taps outer, outputs inner,
so that the inner loop walks the input with a fixed step and vectorizes; the borders visit
one window at a time and check each tap. Both visit a window's taps in the same row-major
order, so the two paths give the same bits.
"""

import numpy as np
from numba import njit, prange

from .._plan import (AXIS_DILATION, AXIS_EXTENT, AXIS_IN, AXIS_INDEX_STRIDE, AXIS_INPUT_STRIDE,
                     AXIS_OUT, AXIS_PAD_BEGIN, AXIS_PAD_END, AXIS_STRIDE)
from .codec import accumulator_array, as_accumulator, decode, encode

OPTIONS = dict(cache=True, nogil=True)


# --------------------------------------------------------------------------- shared helpers


@njit(inline="always")
def unit_count(channels, axes, block):
    """(n, c) x outputs along the leading axes x blocks along the last axis."""
    rank = axes.shape[1]
    rows = 1
    for axis in range(rank - 1):
        rows *= axes[AXIS_OUT, axis]
    last = axes[AXIS_OUT, rank - 1]
    return channels * rows * ((last + block - 1) // block)


@njit(inline="always")
def chunk_units(chunk, chunks, units):
    """The run of units that one chunk of the parallel loop owns."""
    # prange hands out unsigned indices; mixing them with int64 would give floats
    chunk = np.int64(chunk)
    return units * chunk // chunks, units * (chunk + 1) // chunks


@njit(inline="always")
def locate_unit(unit, axes, block, starts):
    """Decode one work unit.

    Writes the window start of each leading axis into ``starts`` and returns
    (nc, first output, end output, flat output offset of the row, input offset of the
    window's leading axes, whether the leading axes of the window are inside the input).
    """
    last = axes.shape[1] - 1
    blocks = (axes[AXIS_OUT, last] + block - 1) // block
    rest, block_number = divmod(unit, blocks)
    first = block_number * block
    end = min(first + block, axes[AXIS_OUT, last])
    row = 0
    row_stride = axes[AXIS_OUT, last]
    offset = 0
    inside = True
    for axis in range(last - 1, -1, -1):
        rest, position = divmod(rest, axes[AXIS_OUT, axis])
        start = position * axes[AXIS_STRIDE, axis] - axes[AXIS_PAD_BEGIN, axis]
        starts[axis] = start
        offset += start * axes[AXIS_INPUT_STRIDE, axis]
        row += position * row_stride
        row_stride *= axes[AXIS_OUT, axis]
        if start < 0 or start + axes[AXIS_EXTENT, axis] > axes[AXIS_IN, axis]:
            inside = False
    return rest, first, end, row, offset, inside


@njit(inline="always")
def interior(first, end, axes):
    """(lo, hi): the outputs in [first, end) whose window lies inside the input along the
    last axis; first <= lo <= hi <= end."""
    last = axes.shape[1] - 1
    stride = axes[AXIS_STRIDE, last]
    pad = axes[AXIS_PAD_BEGIN, last]
    lo = min(end, max(first, (pad + stride - 1) // stride))
    hi = min(end, (axes[AXIS_IN, last] - axes[AXIS_EXTENT, last] + pad) // stride + 1)
    return lo, max(lo, hi)


@njit(inline="always")
def place_window(o, starts, axes, row_offset):
    """Set the last-axis start of output ``o``'s window; return its input offset."""
    last = axes.shape[1] - 1
    start = o * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
    starts[last] = start
    return row_offset + start


@njit(inline="always")
def tap_is_inside(tap, taps, starts, axes, first_axis, end_axis):
    """Whether the tap lies inside the input along axes [first_axis, end_axis)."""
    for axis in range(first_axis, end_axis):
        position = starts[axis] + taps[tap, axis] * axes[AXIS_DILATION, axis]
        if position < 0 or position >= axes[AXIS_IN, axis]:
            return False
    return True


@njit(inline="always")
def tap_is_in_padded_extent(tap, taps, starts, axes, first_axis, end_axis):
    """Inside [-pb, in + pe) along axes [first_axis, end_axis): the taps that
    count_include_pad=1 divides by."""
    for axis in range(first_axis, end_axis):
        position = starts[axis] + taps[tap, axis] * axes[AXIS_DILATION, axis]
        if (position < -axes[AXIS_PAD_BEGIN, axis]
                or position >= axes[AXIS_IN, axis] + axes[AXIS_PAD_END, axis]):
            return False
    return True


@njit(inline="always")
def input_index(nc, channel_size, tap, taps, starts, axes):
    """The tap's offset in the whole input, spatial part numbered with the index strides."""
    index = nc * channel_size
    for axis in range(axes.shape[1]):
        position = starts[axis] + taps[tap, axis] * axes[AXIS_DILATION, axis]
        index += position * axes[AXIS_INDEX_STRIDE, axis]
    return index


# --------------------------------------------------------------------------- MaxPool


@njit(inline="always")
def beats(candidate, best):
    """Whether ``candidate`` replaces ``best`` in a row-major scan: strictly larger, or the
    first NaN (a NaN is never replaced)."""
    return candidate > best or (candidate != candidate and best == best)


@njit(inline="always")
def border_output(k, first, lo, hi):
    """The k-th output outside the interior: [first, lo) then [hi, end)."""
    return first + k if first + k < lo else hi + (k - (lo - first))


@njit(inline="always")
def max_window(row, base, starts, axes, taps, tap_offsets, lowest, first_axis):
    """The winning tap of one border window, checking every tap along axes from
    ``first_axis`` on; -1 if none is inside."""
    best_tap = -1
    best = decode(lowest)
    for t in range(tap_offsets.shape[0]):
        if not tap_is_inside(t, taps, starts, axes, first_axis, axes.shape[1]):
            continue
        value = decode(row[base + tap_offsets[t]])
        if best_tap < 0 or beats(value, best):
            best = value
            best_tap = t
    return best_tap


@njit(inline="always")
def _max_run(source, offset, step, best, count):
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        best[j] = value if beats(decode(value), decode(best[j])) else best[j]


@njit(inline="always")
def _max_run_with_taps(source, offset, step, best, best_taps, tap, count):
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        take = best_taps[j] < 0 or beats(decode(value), decode(best[j]))
        best[j] = value if take else best[j]
        best_taps[j] = tap if take else best_taps[j]


@njit(inline="always")
def max_run(source, offset, step, best, best_taps, tap, count):
    """Fold one tap into a run of ``count`` interior outputs ``step`` elements apart,
    tracking the winning taps unless ``best_taps`` is None.

    Steps 1 and 2 (most strides) get loops of their own with the step a constant, which the
    compiler vectorizes; the general loop does not.
    """
    if best_taps is None:
        if step == 1:
            _max_run(source, offset, np.uint64(1), best, count)
        elif step == 2:
            _max_run(source, offset, np.uint64(2), best, count)
        else:
            _max_run(source, offset, step, best, count)
    else:
        if step == 1:
            _max_run_with_taps(source, offset, np.uint64(1), best, best_taps, tap, count)
        elif step == 2:
            _max_run_with_taps(source, offset, np.uint64(2), best, best_taps, tap, count)
        else:
            _max_run_with_taps(source, offset, step, best, best_taps, tap, count)


@njit(parallel=True, **OPTIONS)
def max_pool(x, y, indices, lowest, axes, taps, tap_offsets, block, chunks):
    """Max over each window; the first NaN wins, ties go to the first maximum in the scan.

    ``y`` receives the winning element itself (bit for bit), or ``lowest`` for a window
    with no tap inside the input; ``indices``, unless None, the winner's offset in the whole
    input, numbered with the index strides, or -1. Whether ``indices`` is None is known when
    numba compiles, so each case gets loops of its own.
    """
    units = unit_count(x.shape[0], axes, block)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units)
        if indices is None:
            max_pool_units(unit_begin, unit_end, x, y, None, None, lowest, axes, taps,
                           tap_offsets, block)
        else:
            max_pool_units(unit_begin, unit_end, x, y, indices, np.empty(block, np.int64),
                           lowest, axes, taps, tap_offsets, block)


# The loops live in a plain function that the parallel driver calls: inside numba's
# parallel region they optimize (and vectorize) far worse.
@njit(**OPTIONS)
def max_pool_units(unit_begin, unit_end, x, y, indices, best_taps, lowest, axes, taps,
                   tap_offsets, block):
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    channel_size = x.shape[1]
    starts = np.empty(rank, np.int64)
    best = np.empty(block, x.dtype)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row, row_offset, row_inside = locate_unit(unit, axes, block, starts)
        source = x[nc]
        lo, hi = interior(first, end, axes)
        # interior: taps outer, outputs inner
        count = hi - lo
        base = place_window(lo, starts, axes, row_offset)
        best[:count] = lowest
        if best_taps is not None:
            best_taps[:count] = -1
        for t in range(tap_offsets.shape[0]):
            if not row_inside and not tap_is_inside(t, taps, starts, axes, 0, last):
                continue
            # unsigned: numba then skips the negative-index fix-up and the loop vectorizes
            offset = np.uint64(base + tap_offsets[t])
            max_run(source, offset, step, best, best_taps, t, count)
        y[nc, row + lo:row + hi] = best[:count]
        if best_taps is not None:
            for j in range(count):
                place_window(lo + j, starts, axes, row_offset)
                tap = best_taps[j]
                indices[nc, row + lo + j] = (
                    -1 if tap < 0 else input_index(nc, channel_size, tap, taps, starts, axes))
        # borders: one window at a time; the leading axes need checks only outside the input
        border_axis = 0 if not row_inside else last
        for k in range((lo - first) + (end - hi)):
            o = border_output(k, first, lo, hi)
            base = place_window(o, starts, axes, row_offset)
            tap = max_window(source, base, starts, axes, taps, tap_offsets, lowest, border_axis)
            y[nc, row + o] = lowest if tap < 0 else source[base + tap_offsets[tap]]
            if indices is not None:
                indices[nc, row + o] = (
                    -1 if tap < 0 else input_index(nc, channel_size, tap, taps, starts, axes))


# --------------------------------------------------------------------------- sums


@njit(inline="always")
def window_sum(source, base, starts, axes, taps, tap_offsets, p, p_kind, first_axis):
    """(sum of term(x) over one border window's taps inside the input, how many there are,
    how many lie inside the padded extent)."""
    total = as_accumulator(0, source)
    inside = 0
    padded = 0
    rank = axes.shape[1]
    for t in range(tap_offsets.shape[0]):
        if tap_is_in_padded_extent(t, taps, starts, axes, first_axis, rank):
            padded += 1
        if tap_is_inside(t, taps, starts, axes, first_axis, rank):
            total += lp_term(decode(source[base + tap_offsets[t]]), p, p_kind)
            inside += 1
    return total, inside, padded


@njit(inline="always")
def lp_term(value, p, p_kind):
    """The summand: value itself (p_kind 0, AveragePool), |value| (1), value ** 2 (2) or
    |value| ** p (3)."""
    if p_kind == 0:
        return value
    magnitude = abs(value)
    if p_kind == 1:
        return magnitude
    if p_kind == 2:
        return magnitude * magnitude
    return magnitude ** p


@njit(inline="always")
def lp_root(total, p, p_kind):
    if p_kind <= 1:
        return total
    if p_kind == 2:
        return np.sqrt(total)
    return total ** (1 / p)


@njit(inline="always")
def finish(total, count, p, p_kind, x, y):
    """The stored result: a mean (p_kind 0, 0 for an empty window) or an Lp norm."""
    if p_kind == 0:
        if count == 0:
            return encode(as_accumulator(0, x), y)
        return encode(total / as_accumulator(count, x), y)
    return encode(lp_root(total, p, p_kind), y)


@njit(inline="always")
def _sum_run(source, offset, step, totals, count, p, p_kind):
    if p_kind == 0:
        for j in range(count):
            totals[j] += decode(source[offset + np.uint64(j) * step])
    elif p_kind == 2:
        for j in range(count):
            value = decode(source[offset + np.uint64(j) * step])
            totals[j] += value * value
    else:
        for j in range(count):
            totals[j] += lp_term(decode(source[offset + np.uint64(j) * step]), p, p_kind)


@njit(inline="always")
def sum_run(source, offset, step, totals, count, p, p_kind):
    """Add one tap's terms to a run of ``count`` interior outputs; constant steps 1 and 2 as
    in ``max_run``."""
    if step == 1:
        _sum_run(source, offset, np.uint64(1), totals, count, p, p_kind)
    elif step == 2:
        _sum_run(source, offset, np.uint64(2), totals, count, p, p_kind)
    else:
        _sum_run(source, offset, step, totals, count, p, p_kind)


@njit(parallel=True, **OPTIONS)
def sum_pool(x, y, p, p_kind, count_include_pad, axes, taps, tap_offsets, block, chunks):
    """AveragePool (p_kind 0) and LpPool (p_kind 1, 2, 3) over each window's taps inside the
    input. AveragePool divides by those taps, or with ``count_include_pad`` by the taps inside
    the padded extent; a window with no tap inside gives 0."""
    units = unit_count(x.shape[0], axes, block)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units)
        sum_pool_units(unit_begin, unit_end, x, y, p, p_kind, count_include_pad, axes, taps,
                       tap_offsets, block)


@njit(**OPTIONS)
def sum_pool_units(unit_begin, unit_end, x, y, p, p_kind, count_include_pad, axes, taps,
                   tap_offsets, block):
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    p_acc = as_accumulator(p, x)
    starts = np.empty(rank, np.int64)
    totals = accumulator_array(block, x)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row, row_offset, row_inside = locate_unit(unit, axes, block, starts)
        source = x[nc]
        lo, hi = interior(first, end, axes)
        # interior: taps outer, outputs inner; along the last axis every tap is inside
        count = hi - lo
        base = place_window(lo, starts, axes, row_offset)
        totals[:count] = 0
        inside = 0
        padded = 0
        for t in range(tap_offsets.shape[0]):
            if not row_inside:
                if tap_is_in_padded_extent(t, taps, starts, axes, 0, last):
                    padded += 1
                if not tap_is_inside(t, taps, starts, axes, 0, last):
                    continue
            inside += 1
            # unsigned: numba then skips the negative-index fix-up and the loop vectorizes
            offset = np.uint64(base + tap_offsets[t])
            sum_run(source, offset, step, totals, count, p_acc, p_kind)
        divisor = padded if count_include_pad and not row_inside else inside
        for j in range(count):
            y[nc, row + lo + j] = finish(totals[j], divisor, p_acc, p_kind, x, y)
        # borders: one window at a time; the leading axes need checks only outside the input
        border_axis = 0 if not row_inside else last
        for k in range((lo - first) + (end - hi)):
            o = border_output(k, first, lo, hi)
            base = place_window(o, starts, axes, row_offset)
            total, inside, padded = window_sum(source, base, starts, axes, taps,
                                               tap_offsets, p_acc, p_kind, border_axis)
            y[nc, row + o] = finish(total, padded if count_include_pad else inside,
                                    p_acc, p_kind, x, y)
