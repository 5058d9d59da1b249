"""Windowed pooling kernels (MaxPool, AveragePool, LpPool) for any number of spatial axes.

Layout: ``x`` is (N*C, prod(input spatial)) and ``y`` is (N*C, prod(output spatial)), both
C-ordered. ``axes`` is ``WindowPlan.geometry["axes"]``: one int64 row per AXIS_* name of _plan,
one column per spatial axis; ``taps`` and ``tap_offsets`` list the window's taps in row-major
order (the scan order that decides ties and the first NaN).

Work units are one (n, c), one position along every spatial axis but the last, and one block
of at most ``block`` outputs along the last axis, so that all threads are busy even when N*C
is 1; the units are dealt out in ``chunks`` contiguous runs, one scratch allocation per run.

Each unit runs taps outer, outputs inner: for every tap, the run of the row's outputs for
which that tap lies inside the input along the last axis (``tap_outputs``, from the plan),
walking the input with a fixed step, which vectorizes. So every output still meets its taps
in row-major order, skipping those outside the input, with no separate border path; along
the leading axes a tap is checked once per row, and only for rows near an edge.

Behind _dispatch, where measured faster, the same units run on specialized kernels: fixed
windows (``fixed_window_kernels``) and, for MaxPool without Indices over two or more axes,
input rows first (``columns_kernels``), each with the same results bit for bit.
"""

import functools

import numpy as np
from numba import njit, prange

from .._plan import (AXIS_DILATION, AXIS_EXTENT, AXIS_IN, AXIS_INDEX_STRIDE, AXIS_INPUT_STRIDE,
                     AXIS_OUT, AXIS_PAD_BEGIN, AXIS_STRIDE)
from .._cache import CACHE_DIRECTORY
from .codec import accumulator_array, as_accumulator, decode, encode
from .threads import use_threads

OPTIONS = dict(cache=CACHE_DIRECTORY is not None, nogil=True)


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
def first_unit(unit, axes, block, positions):
    """Decode a unit number into ``positions`` (output position along each leading axis,
    then the block number along the last axis); returns nc. Divisions happen here only:
    the following units come from ``next_unit``."""
    last = axes.shape[1] - 1
    blocks = (axes[AXIS_OUT, last] + block - 1) // block
    rest, positions[last] = divmod(unit, blocks)
    for axis in range(last - 1, -1, -1):
        rest, positions[axis] = divmod(rest, axes[AXIS_OUT, axis])
    return rest


@njit(inline="always")
def next_unit(positions, nc, axes, block):
    """Advance ``positions`` to the next unit, like an odometer; returns nc."""
    last = axes.shape[1] - 1
    positions[last] += 1
    if positions[last] * block < axes[AXIS_OUT, last]:
        return nc
    positions[last] = 0
    for axis in range(last - 1, -1, -1):
        positions[axis] += 1
        if positions[axis] < axes[AXIS_OUT, axis]:
            return nc
        positions[axis] = 0
    return nc + 1


@njit(inline="always")
def place_row(positions, axes, block, starts):
    """Where one unit's row lies: writes the window start of each leading axis into
    ``starts`` and returns (first output, end output, flat output offset of the row, input
    offset of the window's leading axes, whether those leading axes are inside the input)."""
    last = axes.shape[1] - 1
    first = positions[last] * block
    end = min(first + block, axes[AXIS_OUT, last])
    row = 0
    row_stride = axes[AXIS_OUT, last]
    offset = 0
    inside = True
    for axis in range(last - 1, -1, -1):
        start = positions[axis] * axes[AXIS_STRIDE, axis] - axes[AXIS_PAD_BEGIN, axis]
        starts[axis] = start
        offset += start * axes[AXIS_INPUT_STRIDE, axis]
        row += positions[axis] * row_stride
        row_stride *= axes[AXIS_OUT, axis]
        if start < 0 or start + axes[AXIS_EXTENT, axis] > axes[AXIS_IN, axis]:
            inside = False
    return first, end, row, offset, inside


@njit(inline="always")
def tap_is_inside(tap, taps, starts, axes, end_axis):
    """Whether the tap lies inside the input along the axes before ``end_axis``."""
    for axis in range(end_axis):
        position = starts[axis] + taps[tap, axis] * axes[AXIS_DILATION, axis]
        if position < 0 or position >= axes[AXIS_IN, axis]:
            return False
    return True


@njit(inline="always")
def tap_run(tap, first, end, tap_outputs, row_offset, axes, tap_offsets):
    """The outputs in [first, end) of the row for which last-axis tap number ``tap`` lies
    inside the input there, as (index of the first in the row part, how many, input offset
    of its tap, counted from the input row at ``row_offset``). Indices are unsigned so that
    numba skips the negative-index fix-up and the loops vectorize."""
    last = axes.shape[1] - 1
    lo = max(first, tap_outputs[tap, 0])
    hi = min(end, tap_outputs[tap, 1])
    offset = (row_offset + lo * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
              + tap_offsets[tap])
    return np.uint64(lo - first), max(0, hi - lo), np.uint64(max(0, offset))


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
def keeps(best, candidate):
    """Whether ``best`` stays against a later ``candidate`` in a row-major scan: it is at
    least as large (ties keep the first), or it is a NaN (the first NaN wins)."""
    return best >= candidate or best != best


@njit(inline="always")
def _max_run(source, offset, step, best, begin, count):
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        kept = best[begin + np.uint64(j)]
        best[begin + np.uint64(j)] = kept if keeps(decode(kept), decode(value)) else value


@njit(inline="always")
def _max_run_with_taps(source, offset, step, best, best_taps, tap, begin, count):
    for j in range(count):
        value = source[offset + np.uint64(j) * step]
        kept = best[begin + np.uint64(j)]
        take = best_taps[begin + np.uint64(j)] < 0 or not keeps(decode(kept), decode(value))
        best[begin + np.uint64(j)] = value if take else kept
        best_taps[begin + np.uint64(j)] = tap if take else best_taps[begin + np.uint64(j)]


@njit(inline="always")
def max_run(source, offset, step, best, best_taps, tap, begin, count):
    """Fold one tap into ``count`` consecutive outputs from ``begin``, ``step`` elements
    apart in the input, tracking the winning taps unless ``best_taps`` is None.

    Steps 1 and 2 (most strides) get loops of their own with the step a constant, which the
    compiler vectorizes; the general loop does not.
    """
    if best_taps is None:
        if step == 1:
            _max_run(source, offset, np.uint64(1), best, begin, count)
        elif step == 2:
            _max_run(source, offset, np.uint64(2), best, begin, count)
        else:
            _max_run(source, offset, step, best, begin, count)
    else:
        if step == 1:
            _max_run_with_taps(source, offset, np.uint64(1), best, best_taps, tap, begin, count)
        elif step == 2:
            _max_run_with_taps(source, offset, np.uint64(2), best, best_taps, tap, begin, count)
        else:
            _max_run_with_taps(source, offset, step, best, best_taps, tap, begin, count)


@njit(inline="always")
def interior_outputs(axes, width):
    """(lo, hi): the outputs along the last axis whose ``width`` taps (dilation 1) all lie
    inside the input. Divisions: computed once per run of units, not per unit."""
    last = axes.shape[1] - 1
    step, pad, size = axes[AXIS_STRIDE, last], axes[AXIS_PAD_BEGIN, last], axes[AXIS_IN, last]
    return (pad + step - 1) // step, (size - width + pad) // step + 1


@njit(inline="always")
def input_row_strides(axes):
    """Per leading axis, how many input rows one step along it spans; with these a unit's
    first input row is found without a division (``first_input_row``)."""
    last = axes.shape[1] - 1
    strides = np.empty(max(last, 1), np.int64)
    for axis in range(last):
        strides[axis] = axes[AXIS_INPUT_STRIDE, axis] // axes[AXIS_IN, last]
    return strides


@njit(inline="always")
def first_input_row(nc, channel_rows, starts, row_strides):
    """The input row number (counted over all channels) where a unit's window starts."""
    row = nc * channel_rows
    for axis in range(starts.shape[0] - 1):
        row += starts[axis] * row_strides[axis]
    return row


@njit(inline="always")
def row_slot(row_index, first, keys, slots, out_last):
    """The cache slot of one input row's last-axis results for the outputs from ``first``,
    and whether they must be computed (not cached there yet)."""
    slot = row_index & (slots - 1)
    key = row_index * (out_last + 1) + first
    if keys[slot] == key:
        return slot, False
    keys[slot] = key
    return slot, True


# Not inlined: called from two places, it would be compiled twice, and the first call's
# compile time is what a notebook user waits for.
@njit(**OPTIONS)
def max_over_last_axis(source, row_start, first, end, step, target, target_taps, base, axes,
                       tap_outputs, tap_offsets, k_last, tap_base):
    """Fold the last-axis taps of one input row, numbered from ``tap_base``, into
    target[base + j] for output first + j."""
    for kw in range(k_last):
        begin, count, offset = tap_run(kw, first, end, tap_outputs, row_start, axes, tap_offsets)
        max_run(source, offset, step, target, target_taps, tap_base + kw, base + begin, count)


@njit(inline="always")
def start_maxima(target, target_taps, base, count, lowest):
    """Outputs with no tap yet: ``lowest``, tap -1."""
    for j in range(count):
        target[base + np.uint64(j)] = lowest
    if target_taps is not None:
        for j in range(count):
            target_taps[base + np.uint64(j)] = -1


@njit(parallel=True, **OPTIONS)
def max_pool(x, y, indices, lowest, axes, taps, tap_offsets, tap_outputs, lead_rows, block,
             slots, chunks, threads):
    """Max over each window; the first NaN wins, ties go to the first maximum in the scan.

    ``y`` receives the winning element itself (bit for bit), or ``lowest`` for a window
    with no tap inside the input; ``indices``, unless None, the winner's offset in the whole
    input, numbered with the index strides, or -1. Whether ``indices`` is None is known when
    numba compiles, so each case gets loops of its own.
    """
    units = unit_count(x.shape[0], axes, block)
    before = use_threads(threads)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units)
        if indices is None:
            max_pool_units(unit_begin, unit_end, x, y, None, None, None, lowest, axes, taps,
                           tap_offsets, tap_outputs, lead_rows, block, slots)
        else:
            max_pool_units(unit_begin, unit_end, x, y, indices, np.empty(block, np.int64),
                           np.empty(max(slots, 1) * block, np.int64), lowest, axes, taps,
                           tap_offsets, tap_outputs, lead_rows, block, slots)
    use_threads(before)


# The loops live in a plain function that the parallel driver calls: inside numba's
# parallel region they optimize (and vectorize) far worse.
@njit(**OPTIONS)
def max_pool_units(unit_begin, unit_end, x, y, indices, best_taps, row_taps, lowest, axes, taps,
                   tap_offsets, tap_outputs, lead_rows, block, slots):
    """A window's first maximum in row-major order is the first maximum over its rows of
    each row's first maximum along the last axis: rows come first in that order. So each
    input row's last-axis maxima are computed once, cached, and folded row by row; the
    cache serves the next output rows, whose windows share input rows. With ``slots`` 0
    (no input row is shared) the taps fold straight into the outputs, in the same order."""
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    out_last = axes[AXIS_OUT, last]
    channel_size = x.shape[1]
    channel_rows = channel_size // axes[AXIS_IN, last]
    row_strides = input_row_strides(axes)
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    starts = np.empty(rank, np.int64)
    best = np.empty(block, x.dtype)
    rows = np.empty(max(slots, 1) * block, x.dtype)
    keys = np.full(max(slots, 1), -1, np.int64)
    # flat views, made once: a view per row costs reference counting in the hot loop
    source = x.reshape(x.size)
    out = y.reshape(y.size)
    positions = np.empty(rank, np.int64)
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
                max_over_last_axis(source, row_offset + tap_offsets[tap], first, end, step,
                                   best, best_taps, np.uint64(0), axes, tap_outputs,
                                   tap_offsets, k_last, tap)
                continue
            slot, missing = row_slot(first_row + lead_rows[lead], first, keys, slots, out_last)
            base = np.uint64(slot * block)
            if missing:
                start_maxima(rows, row_taps, base, end - first, lowest)
                # np.int64: a literal 0 would make numba compile a second specialization
                max_over_last_axis(source, row_offset + tap_offsets[tap], first, end, step,
                                   rows, row_taps, base, axes, tap_outputs, tap_offsets,
                                   k_last, np.int64(0))
            if best_taps is None:
                for j in range(end - first):
                    kept = best[j]
                    value = rows[base + np.uint64(j)]
                    best[j] = kept if keeps(decode(kept), decode(value)) else value
            else:
                for j in range(end - first):
                    value = rows[base + np.uint64(j)]
                    found = row_taps[base + np.uint64(j)]
                    take = found >= 0 and (
                        best_taps[j] < 0 or not keeps(decode(best[j]), decode(value)))
                    best[j] = value if take else best[j]
                    best_taps[j] = tap + found if take else best_taps[j]
        out_begin = np.uint64(nc * y.shape[1] + row + first)
        for j in range(end - first):
            out[out_begin + np.uint64(j)] = best[j]
        if indices is not None:
            for j in range(end - first):
                starts[last] = (first + j) * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
                tap = best_taps[j]
                indices[nc, row + first + j] = (
                    -1 if tap < 0 else input_index(nc, channel_size, tap, taps, starts, axes))


# --------------------------------------------------------------------------- sums


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
def _term(source, index, p, p_kind):
    """One element's summand, computed in the accumulator type (that of ``p``)."""
    return lp_term(as_accumulator(decode(source[index]), p), p, p_kind)


@njit(inline="always")
def _sum_run(source, offset, step, totals, begin, count, p, p_kind):
    # one loop per kind, the kind a constant in each: a branch inside the loop would keep it
    # from vectorizing
    if p_kind == 0:
        for j in range(count):
            totals[begin + np.uint64(j)] += _term(source, offset + np.uint64(j) * step, p, 0)
    elif p_kind == 1:
        for j in range(count):
            totals[begin + np.uint64(j)] += _term(source, offset + np.uint64(j) * step, p, 1)
    elif p_kind == 2:
        for j in range(count):
            totals[begin + np.uint64(j)] += _term(source, offset + np.uint64(j) * step, p, 2)
    else:
        for j in range(count):
            totals[begin + np.uint64(j)] += _term(source, offset + np.uint64(j) * step, p, 3)


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
def _border_row_sum(source, row_start, o, width, axes, zero):
    """AveragePool's row sum for output o, its taps checked one by one (dilation 1)."""
    last = axes.shape[1] - 1
    total = zero
    at = o * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last]
    for w in range(width):
        if 0 <= at + w < axes[AXIS_IN, last]:
            total += as_accumulator(decode(source[np.uint64(row_start + at + w)]), zero)
    return total


@njit(**OPTIONS)  # not inlined, as max_over_last_axis
def three_tap_row_sums(source, row_start, first, end, step, target, base, zero, axes,
                       interior):
    """``sum_over_last_axis`` for AveragePool's common windows, 3 taps wide along the last
    axis with no dilation and a step of 1 or 2: the interior outputs' taps in one loop body,
    the others one by one; each sum in the same order."""
    lo, hi = _interior(first, end, interior)
    if step == 1:
        _row_window_sums(source, row_start, target, base, first, lo, hi, 3, np.uint64(1), axes,
                         zero)
    else:
        _row_window_sums(source, row_start, target, base, first, lo, hi, 3, np.uint64(2), axes,
                         zero)
    for o in range(first, lo):
        target[base + np.uint64(o - first)] = _border_row_sum(source, row_start, o, 3, axes, zero)
    for o in range(hi, end):
        target[base + np.uint64(o - first)] = _border_row_sum(source, row_start, o, 3, axes, zero)


@njit(**OPTIONS)  # not inlined, as max_over_last_axis
def sum_over_last_axis(source, row_start, first, end, step, target, base, zero, axes,
                       tap_outputs, tap_offsets, k_last, p, p_kind):
    """target[base + j] = the sum of the terms of one input row's last-axis taps inside the
    input, for output first + j."""
    for j in range(end - first):
        target[base + np.uint64(j)] = zero
    for kw in range(k_last):
        begin, count, offset = tap_run(kw, first, end, tap_outputs, row_start, axes, tap_offsets)
        sum_run(source, offset, step, target, base + begin, count, p, p_kind)


@njit(inline="always")
def _leading_divisor(divisor_counts, positions, last):
    """The product of AveragePool's per-axis tap counts over the leading axes."""
    leading = 1
    for axis in range(last):
        leading *= divisor_counts[axis, positions[axis]]
    return leading


@njit(inline="always")
def _mean(total, divisor, zero, y):
    """An AveragePool output: the window sum over its divisor, 0 for a window with no tap
    inside, rounded once to y's type."""
    mean = total / as_accumulator(max(divisor, 1), zero)
    return encode(mean if divisor > 0 else zero, y)


@njit(inline="always")
def _three_row_means(rows, row_bases, out, out_begin, first, count, divisor_counts, positions,
                     zero, y):
    """AveragePool outputs of a window with three input rows: the cached row sums added in
    order to a zero, as the totals are, then divided."""
    last = divisor_counts.shape[0] - 1
    leading = _leading_divisor(divisor_counts, positions, last)
    row0, row1, row2 = (np.uint64(row_bases[0]), np.uint64(row_bases[1]),
                        np.uint64(row_bases[2]))
    for j in range(count):
        k = np.uint64(j)
        total = ((zero + rows[row0 + k]) + rows[row1 + k]) + rows[row2 + k]
        divisor = leading * divisor_counts[np.uint64(last), np.uint64(first + j)]
        out[out_begin + k] = _mean(total, divisor, zero, y)


@njit(parallel=True, **OPTIONS)
def sum_pool(x, y, p, p_kind, zero, axes, taps, tap_offsets, tap_outputs, lead_rows,
             divisor_counts, block, slots, chunks, threads):
    """AveragePool (p_kind 0) and LpPool (p_kind 1, 2, 3) over each window's taps inside the
    input, accumulated in the type of ``zero`` (float32 or float64). AveragePool divides by
    the product over axes of ``divisor_counts``; a divisor of 0 (a window with no tap
    inside) gives 0."""
    units = unit_count(x.shape[0], axes, block)
    before = use_threads(threads)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units)
        sum_pool_units(unit_begin, unit_end, x, y, p, p_kind, zero, axes, taps, tap_offsets,
                       tap_outputs, lead_rows, divisor_counts, block, slots)
    use_threads(before)


@njit(**OPTIONS)
def sum_pool_units(unit_begin, unit_end, x, y, p, p_kind, zero, axes, taps, tap_offsets,
                   tap_outputs, lead_rows, divisor_counts, block, slots):
    """A window's sum is the sum over its rows, in order, of each row's sum along the last
    axis; each input row's sums are computed once, cached, and serve the next output rows,
    whose windows share input rows."""
    rank = axes.shape[1]
    last = rank - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    out_last = axes[AXIS_OUT, last]
    channel_rows = x.shape[1] // axes[AXIS_IN, last]
    row_strides = input_row_strides(axes)
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    interior = interior_outputs(axes, 3)
    three_taps = p_kind == 0 and k_last == 3 and step <= 2 and axes[AXIS_DILATION, last] == 1
    p_acc = as_accumulator(p, zero)
    # AveragePool windows of three input rows add them in _three_row_means, once all three
    # are cached: only when the rows cannot share a slot (they span fewer rows than slots)
    defer = p_kind == 0 and lead_count == 3 and lead_rows[2] - lead_rows[0] < slots
    starts = np.empty(rank, np.int64)
    totals = accumulator_array(block, zero)
    rows = accumulator_array(slots * block, zero)
    keys = np.full(slots, -1, np.int64)
    row_bases = np.empty(lead_count, np.int64)
    # flat views, made once: a view per row costs reference counting in the hot loop
    source = x.reshape(x.size)
    out = y.reshape(y.size)
    positions = np.empty(rank, np.int64)
    nc = first_unit(unit_begin, axes, block, positions)
    for unit in range(unit_begin, unit_end):
        if unit > unit_begin:
            nc = next_unit(positions, nc, axes, block)
        first, end, row, row_offset, row_inside = place_row(positions, axes, block, starts)
        row_offset += nc * x.shape[1]
        if lead_count == 1 and (row_inside or tap_is_inside(0, taps, starts, axes, last)):
            # one input row per window: no rows to add up
            sum_over_last_axis(source, row_offset, first, end, step, totals, np.uint64(0), zero,
                               axes, tap_outputs, tap_offsets, k_last, p_acc, p_kind)
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
                slot, missing = row_slot(first_row + lead_rows[lead], first, keys, slots,
                                         out_last)
                base = np.uint64(slot * block)
                row_bases[inside_rows] = slot * block
                inside_rows += 1
                if missing and three_taps:
                    three_tap_row_sums(source, row_offset + tap_offsets[tap], first, end, step,
                                       rows, base, zero, axes, interior)
                elif missing:
                    sum_over_last_axis(source, row_offset + tap_offsets[tap], first, end, step,
                                       rows, base, zero, axes, tap_outputs, tap_offsets, k_last,
                                       p_acc, p_kind)
                if not defer:
                    for j in range(end - first):
                        totals[j] += rows[base + np.uint64(j)]
            if defer and inside_rows == 3:
                _three_row_means(rows, row_bases, out, np.uint64(nc * y.shape[1] + row + first),
                                 first, end - first, divisor_counts, positions, zero, y)
                continue
            if defer:  # a window at the edge: fewer rows
                for j in range(end - first):
                    totals[j] = zero
                for r in range(inside_rows):
                    for j in range(end - first):
                        totals[j] += rows[np.uint64(row_bases[r]) + np.uint64(j)]
        out_begin = np.uint64(nc * y.shape[1] + row + first)
        if p_kind == 0:
            leading = _leading_divisor(divisor_counts, positions, last)
            for j in range(end - first):
                divisor = leading * divisor_counts[np.uint64(last), np.uint64(first + j)]
                out[out_begin + np.uint64(j)] = _mean(totals[j], divisor, zero, y)
        elif p_kind == 2:  # the common norm gets a loop with its kind a constant
            for j in range(end - first):
                out[out_begin + np.uint64(j)] = encode(lp_root(totals[j], p_acc, 2), y)
        else:
            for j in range(end - first):
                out[out_begin + np.uint64(j)] = encode(lp_root(totals[j], p_acc, p_kind), y)


# --------------------------------------------------------------------------- fixed windows
#
# Common windows with no dilation can get kernels of their own, in which the window's size
# and the last-axis step are compile-time constants: an output's taps then unroll into one
# loop over the outputs of a row, the running maximum or sum stays in a register, and the
# loads vectorize. Outputs whose window
# leaves the input (the borders) take their taps one by one, in the same order as the
# rank-generic kernels: the results are the same, bit for bit.


@njit(inline="always")
def _fold_max(kept, value):
    return kept if keeps(decode(kept), decode(value)) else value


@njit(inline="always")
def _border_max(o, row_offset, row_inside, starts, lowest, source, axes, taps, tap_offsets):
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
        best = _fold_max(best, source[np.uint64(row_offset + at + tap_offsets[tap])])
    return best


@njit(inline="always")
def _border_sum(o, row_offset, row_inside, starts, zero, source, axes, taps, tap_offsets,
                k_last):
    """The window sum of output o of a row: each input row's sum, then the rows in order."""
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
                row_sum += decode(source[np.uint64(row_offset + at + tap_offsets[tap])])
        total += row_sum
    return total


@njit(inline="always")
def _interior(first, end, interior):
    """[lo, hi): the outputs in [first, end) inside ``interior`` (from interior_outputs)."""
    lo = min(max(first, interior[0]), end)
    hi = max(lo, min(end, interior[1]))
    return lo, hi


@njit(inline="always")
def _fixed_layout(axes):
    """(last axis, input row length, input plane size for 3-D windows, last-axis pad)."""
    last = axes.shape[1] - 1
    row_length = axes[AXIS_IN, last]
    plane = row_length * axes[AXIS_IN, last - 1] if last > 1 else 0
    return last, row_length, plane, axes[AXIS_PAD_BEGIN, last]


@njit(inline="always")
def _first_unit_row(unit_begin, axes, block, x, y):
    """A run's scratch and first unit: (window starts, unit positions, flat input, flat
    output, nc of ``unit_begin``); ``_unit_row`` then steps from unit to unit."""
    starts = np.empty(axes.shape[1], np.int64)
    positions = np.empty(axes.shape[1], np.int64)
    nc = first_unit(unit_begin, axes, block, positions)
    return starts, positions, x.reshape(x.size), y.reshape(y.size), nc


@njit(inline="always")
def _unit_row(unit, unit_begin, nc, positions, starts, axes, block, x, y):
    """Step to ``unit`` and place its row: (nc, first, end, input offset of the window's
    leading start, whether the leading axes are inside, output offset of output 0 of the
    row, so that output o goes to that + o)."""
    if unit > unit_begin:
        nc = next_unit(positions, nc, axes, block)
    first, end, row, row_offset, row_inside = place_row(positions, axes, block, starts)
    return (nc, first, end, row_offset + nc * x.shape[1], row_inside,
            nc * y.shape[1] + row)


# The window's size and step arrive as literal arguments (from the closures of
# fixed_window_kernels), so that each window compiles loops of its own with them constant.
@njit(**OPTIONS)
def fixed_max_units(unit_begin, unit_end, x, y, lowest, axes, taps, tap_offsets, block, depth,
                    height, width, step):
    """MaxPool over units [unit_begin, unit_end) for a depth x height x width window (depth 1:
    a 2-D window) with no dilation, at this last-axis step."""
    last, row_length, plane, pad = _fixed_layout(axes)
    interior = interior_outputs(axes, width)
    starts, positions, source, out, nc = _first_unit_row(unit_begin, axes, block, x, y)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = _unit_row(
            unit, unit_begin, nc, positions, starts, axes, block, x, y)
        lo = hi = end
        if row_inside:
            lo, hi = _interior(first, end, interior)
            for o in range(lo, hi):
                at = np.uint64(row_offset + o * step - pad)
                best = lowest
                for d in range(depth):
                    for r in range(height):
                        for w in range(width):
                            best = _fold_max(best, source[
                                at + np.uint64(d * plane + r * row_length + w)])
                out[np.uint64(out_first + o)] = best
        for o in range(first, lo):
            out[np.uint64(out_first + o)] = _border_max(
                o, row_offset, row_inside, starts, lowest, source, axes, taps, tap_offsets)
        for o in range(hi, end):
            out[np.uint64(out_first + o)] = _border_max(
                o, row_offset, row_inside, starts, lowest, source, axes, taps, tap_offsets)


@njit(**OPTIONS)
def fixed_sum_units(unit_begin, unit_end, x, y, axes, taps, tap_offsets, divisor_counts, block,
                    depth, height, width, step):
    """AveragePool over units [unit_begin, unit_end), as fixed_max_units."""
    last, row_length, plane, pad = _fixed_layout(axes)
    interior = interior_outputs(axes, width)
    zero = as_accumulator(0, x)
    starts, positions, source, out, nc = _first_unit_row(unit_begin, axes, block, x, y)
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = _unit_row(
            unit, unit_begin, nc, positions, starts, axes, block, x, y)
        leading = 1
        for axis in range(last):
            leading *= divisor_counts[axis, positions[axis]]
        lo = hi = end
        if row_inside:
            lo, hi = _interior(first, end, interior)
            for o in range(lo, hi):
                at = np.uint64(row_offset + o * step - pad)
                total = zero
                for d in range(depth):
                    for r in range(height):
                        row_sum = zero
                        for w in range(width):
                            row_sum += decode(source[
                                at + np.uint64(d * plane + r * row_length + w)])
                        total += row_sum
                divisor = leading * divisor_counts[last, o]
                out[np.uint64(out_first + o)] = encode(
                    total / as_accumulator(divisor, x), y)
        for o in range(first, end):
            if lo <= o < hi:
                continue
            total = _border_sum(o, row_offset, row_inside, starts, zero, source, axes, taps,
                                tap_offsets, width)
            divisor = leading * divisor_counts[last, o]
            mean = total / as_accumulator(max(divisor, 1), x)
            out[np.uint64(out_first + o)] = encode(mean if divisor > 0 else zero, y)


def fixed_window_kernels(depth, height, width, step):
    """(max units, max driver, sum units, sum driver) for a depth x height x width window
    (depth 1: a 2-D window) with no dilation, and this last-axis step. Closures over plain
    numbers only: numba keys a closure's disk-cache entry on its cells' pickled contents,
    which for a dispatcher differ in every process."""

    @njit(**OPTIONS)
    def max_units(unit_begin, unit_end, x, y, lowest, axes, taps, tap_offsets, block):
        fixed_max_units(unit_begin, unit_end, x, y, lowest, axes, taps, tap_offsets, block,
                        depth, height, width, step)

    @njit(parallel=True, **OPTIONS)
    def max_driver(x, y, lowest, axes, taps, tap_offsets, block, chunks, threads):
        units = unit_count(x.shape[0], axes, block)
        before = use_threads(threads)
        for chunk in prange(chunks):
            unit_begin, unit_end = chunk_units(chunk, chunks, units)
            fixed_max_units(unit_begin, unit_end, x, y, lowest, axes, taps, tap_offsets, block,
                            depth, height, width, step)
        use_threads(before)

    @njit(**OPTIONS)
    def sum_units(unit_begin, unit_end, x, y, axes, taps, tap_offsets, divisor_counts, block):
        fixed_sum_units(unit_begin, unit_end, x, y, axes, taps, tap_offsets, divisor_counts,
                        block, depth, height, width, step)

    @njit(parallel=True, **OPTIONS)
    def sum_driver(x, y, axes, taps, tap_offsets, divisor_counts, block, chunks, threads):
        units = unit_count(x.shape[0], axes, block)
        before = use_threads(threads)
        for chunk in prange(chunks):
            unit_begin, unit_end = chunk_units(chunk, chunks, units)
            fixed_sum_units(unit_begin, unit_end, x, y, axes, taps, tap_offsets, divisor_counts,
                            block, depth, height, width, step)
        use_threads(before)

    return max_units, max_driver, sum_units, sum_driver


# (depth, height, width, last-axis step) -> kernels; compiled on first use, like the rest.
# Only where measured faster than the rank-generic kernels (docs/performance.md): the 2x2
# stride-2 window, for every dtype, 2 to 4 times. At 3x3 the generic kernels' reuse of
# input-row results wins for float64 and uint8 and for stride 1, and 3x3x3 loses outright.
FIXED_WINDOWS = {key: fixed_window_kernels(*key) for key in [(1, 2, 2, 2)]}


# --------------------------------------------------------------------------- MaxPool, input rows first


@njit(inline="always")
def _fold_column_rows(columns, lo, hi, source, row_starts, rows):
    """columns[lo:hi] = the element-wise maximum of ``rows`` input rows (at least one),
    columns[lo] coming from source[row_starts[r]]. Three rows per pass over the columns:
    the first pass takes 1 to 3 rows (a row taken twice changes nothing), so that the
    rest go in threes."""
    base = np.uint64(lo)
    take = (rows - 1) % 3 + 1
    at0 = np.uint64(row_starts[0])
    at1 = np.uint64(row_starts[min(1, take - 1)])
    at2 = np.uint64(row_starts[take - 1])
    for i in range(hi - lo):
        k = np.uint64(i)
        columns[base + k] = _fold_max(_fold_max(source[at0 + k], source[at1 + k]),
                                      source[at2 + k])
    for r in range(take, rows, 3):
        at0 = np.uint64(row_starts[r])
        at1 = np.uint64(row_starts[r + 1])
        at2 = np.uint64(row_starts[r + 2])
        for i in range(hi - lo):
            k = np.uint64(i)
            columns[base + k] = _fold_max(_fold_max(_fold_max(
                columns[base + k], source[at0 + k]), source[at1 + k]), source[at2 + k])


# The largest input plane (last two axes) columns_kernels folds into scratch: 256 KiB of
# float32, within a core's L2 cache.
PLANE_ELEMENTS = 1 << 16


@njit(inline="always")
def _fold_outer_planes(plane, source, row_offset, starts, axes, taps, tap_offsets, plane_starts,
                       plane_taps):
    """plane = the element-wise maximum of the input planes (the last two axes, whole)
    under the window's taps along the axes before them; ``plane_taps`` taps apart in the
    tap table. Returns False when none of them lies inside the input."""
    height = axes.shape[1] - 2
    # input offset of the window's start along the outer axes, height start taken out
    outer = row_offset - starts[height] * axes[AXIS_INPUT_STRIDE, height]
    count = 0
    for tap in range(0, taps.shape[0], plane_taps):
        if tap_is_inside(tap, taps, starts, axes, height):
            plane_starts[count] = outer + tap_offsets[tap]
            count += 1
    if count > 0:
        _fold_column_rows(plane, 0, plane.size, source, plane_starts, count)
    return count > 0


@njit(inline="always")
def _column_windows(columns, target, base, count, width, step):
    """target[base + j] = the maximum of columns[j * step:j * step + width], for a common
    width and step, both constants: a window's taps in one loop body load as whole vectors
    (the taps-outer loops gather at step 2). The order of the taps differs from the row-major
    scan, which matters for zeros and NaNs only: those outputs are retaken anyway."""
    for j in range(count):
        at = np.uint64(j) * step
        value = columns[at]
        for tap in range(1, width):
            value = _fold_max(value, columns[at + np.uint64(tap)])
        target[base + np.uint64(j)] = value


# Last-axis windows (width, step), undilated, whose taps columns_kernels takes in one loop
# body; other windows take theirs one run at a time, at a constant step where it is 1 or 2
# (width 0), else at any step (0, 0).
COLUMN_WINDOWS = ((3, 2), (3, 1), (2, 2))
COLUMN_KINDS = COLUMN_WINDOWS + ((0, 1), (0, 2), (0, 0))


def column_kind(width, step, dilation):
    """The kind in COLUMN_KINDS that serves a last-axis window of ``width`` taps
    ``dilation`` apart, at ``step``."""
    if dilation == 1 and (width, step) in COLUMN_WINDOWS:
        return width, step
    return 0, step if step in (1, 2) else 0


# The kind of window arrives as literal arguments (from the closures of columns_kernels),
# so that each kind compiles loops of its own with them constant.
@njit(**OPTIONS)
def column_units(unit_begin, unit_end, x, y, lowest, check_ties, axes, taps, tap_offsets, block,
                 window_width, window_step, outer_axes):
    """MaxPool without Indices, input rows first: the window's input rows are folded
    element by element into one row of column maxima (contiguous loads, which vectorize),
    then the last-axis taps are taken once per output row from that row.

    That scans a window column by column instead of row by row. The maximum's value is
    the same either way, and so are its bits unless it is a zero (+0 and -0 compare equal)
    or a NaN (which NaN comes first depends on the order): with ``check_ties`` (float
    dtypes) those outputs are taken again in row-major order, so every result is the one
    docs/semantics.md states. Positions in the padding hold ``lowest``, which never wins
    against an input element of another value.
    """
    last = axes.shape[1] - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    dilation = axes[AXIS_DILATION, last]
    pad = axes[AXIS_PAD_BEGIN, last]
    in_last = axes[AXIS_IN, last]
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    columns = np.empty((block - 1) * axes[AXIS_STRIDE, last] + axes[AXIS_EXTENT, last], x.dtype)
    row_starts = np.empty(lead_count, np.int64)
    starts, positions, source, out, nc = _first_unit_row(unit_begin, axes, block, x, y)
    # Three or more axes: the window's taps along the axes before the last two are first
    # folded over whole input planes (one long loop per plane), once per run of units that
    # share them; each output row then folds only its rows of that plane. Only for planes
    # that fit the scratch limit, and runs that cover several output planes (a plane is
    # folded whole, even for a run that needs a few of its rows).
    height = last - 1
    k_height = taps[taps.shape[0] - 1, height] + 1
    plane_size = axes[AXIS_IN, height] * in_last
    plane_units = axes[AXIS_OUT, height] * ((axes[AXIS_OUT, last] + block - 1) // block)
    planes = plane_size <= PLANE_ELEMENTS and unit_end - unit_begin >= 4 * plane_units
    planes = outer_axes and planes
    plane = np.empty(plane_size if planes else 0, x.dtype)
    plane_key = -1
    plane_empty = False
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = _unit_row(
            unit, unit_begin, nc, positions, starts, axes, block, x, y)
        span_start = first * axes[AXIS_STRIDE, last] - pad  # input position of columns[0]
        span = (end - 1 - first) * axes[AXIS_STRIDE, last] + axes[AXIS_EXTENT, last]
        lo = min(span, max(0, -span_start))  # columns[lo:hi] lie inside the input
        hi = max(lo, min(span, in_last - span_start))
        inside_rows = 0
        # outer_axes first: a constant, so that numba drops the branch before inlining
        if outer_axes and planes:
            key = nc
            for axis in range(height):
                key = key * axes[AXIS_OUT, axis] + positions[axis]
            if key != plane_key:
                plane_key = key
                plane_empty = not _fold_outer_planes(plane, source, row_offset, starts, axes,
                                                     taps, tap_offsets, row_starts,
                                                     k_height * k_last)
            for row in range(k_height):
                h = starts[height] + row * axes[AXIS_DILATION, height]
                if not plane_empty and 0 <= h < axes[AXIS_IN, height]:
                    row_starts[inside_rows] = h * in_last + span_start + lo
                    inside_rows += 1
        else:
            for lead in range(lead_count):
                tap = lead * k_last
                if row_inside or tap_is_inside(tap, taps, starts, axes, last):
                    row_starts[inside_rows] = row_offset + tap_offsets[tap] + span_start + lo
                    inside_rows += 1
        if inside_rows == 0:
            lo = hi = 0
        else:
            _fold_column_rows(columns, lo, hi, plane if planes else source, row_starts,
                              inside_rows)
        for i in range(lo):
            columns[np.uint64(i)] = lowest
        for i in range(hi, span):
            columns[np.uint64(i)] = lowest
        count = end - first
        out_begin = np.uint64(out_first + first)
        if window_width:
            _column_windows(columns, out, out_begin, count, window_width,
                            np.uint64(window_step))
        else:
            start_maxima(out, None, out_begin, count, lowest)
            for kw in range(k_last):
                # the step a constant where the kind has one: a loop that vectorizes
                if window_step:
                    _max_run(columns, np.uint64(kw * dilation), np.uint64(window_step),
                             out, out_begin, count)
                else:
                    _max_run(columns, np.uint64(kw * dilation), step, out, out_begin,
                             count)
        if check_ties:
            suspect = False
            for j in range(count):
                value = decode(out[out_begin + np.uint64(j)])
                suspect |= (value == 0) | (value != value)
            if suspect:
                for j in range(count):
                    value = decode(out[out_begin + np.uint64(j)])
                    if value == 0 or value != value:
                        out[out_begin + np.uint64(j)] = _border_max(
                            first + j, row_offset, row_inside, starts, lowest, source, axes,
                            taps, tap_offsets)


@functools.lru_cache(maxsize=None)
def columns_kernels(window_width, window_step, outer_axes):
    """(units, driver) of MaxPool without Indices taken input rows first (column_units), for
    one kind of window: ``window_width`` taps at ``window_step`` along the last axis (a pair of
    COLUMN_KINDS: width 0 for any window outside COLUMN_WINDOWS, step 0 for any step), and
    ``outer_axes`` whether there are three or more spatial axes. Each kind compiles only
    its own loops, so that a first call compiles one of them, not all. Closures over plain
    numbers only, as fixed_window_kernels."""

    @njit(**OPTIONS)
    def units_of_kind(unit_begin, unit_end, x, y, lowest, check_ties, axes, taps, tap_offsets,
                      block):
        column_units(unit_begin, unit_end, x, y, lowest, check_ties, axes, taps, tap_offsets,
                     block, window_width, window_step, outer_axes)

    @njit(parallel=True, **OPTIONS)
    def driver(x, y, lowest, check_ties, axes, taps, tap_offsets, block, chunks, threads):
        units = unit_count(x.shape[0], axes, block)
        before = use_threads(threads)
        for chunk in prange(chunks):
            unit_begin, unit_end = chunk_units(chunk, chunks, units)
            column_units(unit_begin, unit_end, x, y, lowest, check_ties, axes, taps,
                         tap_offsets, block, window_width, window_step, outer_axes)
        use_threads(before)

    return units_of_kind, driver
