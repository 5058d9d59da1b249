"""Windowed pooling kernels (MaxPool, AveragePool, LpPool) for any number of spatial axes.

Layout: ``x`` is (N*C, prod(input spatial)) and ``y`` is (N*C, prod(output spatial)), both
C-ordered. The geometry comes from ``WindowPlan.geometry`` as int64 arrays.

Work is split into items of one (n, c), one run of outputs along every axis but the last,
and one block of ``block`` outputs along the last axis, so that all threads are busy even
when N*C is 1. Each window visits its taps in row-major order through the ``tap_offsets``
table; a window that lies wholly inside the input skips all bounds checks.
"""

import numpy as np
from numba import njit, prange

from .codec import as_accumulator, decode, encode

OPTIONS = dict(cache=True, nogil=True)


@njit(inline="always")
def item_count(channels, out_spatial, block):
    """Work items: (n, c) x outputs along the leading axes x blocks along the last axis."""
    last = out_spatial[out_spatial.shape[0] - 1]
    rows = 1
    for axis in range(out_spatial.shape[0] - 1):
        rows *= out_spatial[axis]
    return channels * rows * ((last + block - 1) // block)


@njit(inline="always")
def locate_item(item, out_spatial, block, strides, pads_begin, kernel_extent, in_spatial,
                input_strides, starts):
    """Decode one work item.

    Writes the window start of each leading axis into ``starts`` and returns
    (nc, first output, end output, flat output offset of the run, input offset of the
    window's leading axes, whether the leading axes of the window are inside the input).
    """
    rank = out_spatial.shape[0]
    last = rank - 1
    blocks = (out_spatial[last] + block - 1) // block
    # prange hands out unsigned indices; mixing them with int64 would give floats
    rest, block_number = divmod(np.int64(item), blocks)
    first = block_number * block
    end = min(first + block, out_spatial[last])
    run = 0
    run_stride = out_spatial[last]
    offset = 0
    inside = True
    for axis in range(last - 1, -1, -1):
        rest, position = divmod(rest, out_spatial[axis])
        start = position * strides[axis] - pads_begin[axis]
        starts[axis] = start
        offset += start * input_strides[axis]
        run += position * run_stride
        run_stride *= out_spatial[axis]
        if start < 0 or start + kernel_extent[axis] > in_spatial[axis]:
            inside = False
    return rest, first, end, run, offset, inside


@njit(inline="always")
def locate_window(o, starts, strides, pads_begin, kernel_extent, in_spatial, row_inside,
                  row_offset):
    """Place the window of output ``o`` along the last axis: sets its start in ``starts``
    and returns (whether the whole window is inside the input, its input offset)."""
    last = starts.shape[0] - 1
    start = o * strides[last] - pads_begin[last]
    starts[last] = start
    inside = row_inside and start >= 0 and start + kernel_extent[last] <= in_spatial[last]
    return inside, row_offset + start


@njit(inline="always")
def tap_is_inside(tap, taps, starts, dilations, in_spatial):
    for axis in range(starts.shape[0]):
        position = starts[axis] + taps[tap, axis] * dilations[axis]
        if position < 0 or position >= in_spatial[axis]:
            return False
    return True


@njit(inline="always")
def tap_is_in_padding_extent(tap, taps, starts, dilations, in_spatial, pads_begin, pads_end):
    """Inside [-pb, in + pe) on every axis: the taps count_include_pad=1 divides by."""
    for axis in range(starts.shape[0]):
        position = starts[axis] + taps[tap, axis] * dilations[axis]
        if position < -pads_begin[axis] or position >= in_spatial[axis] + pads_end[axis]:
            return False
    return True


@njit(inline="always")
def kernel_extents(taps, dilations):
    """(k - 1) * d + 1 per axis; the last tap holds k - 1 on every axis."""
    last_tap = taps.shape[0] - 1
    return taps[last_tap] * dilations + 1


@njit(parallel=True, **OPTIONS)
def max_pool(x, y, indices, want_indices, lowest, in_spatial, out_spatial, strides, dilations,
             pads_begin, pads_end, input_strides, index_strides, taps, tap_offsets, block):
    """Max over each window; the first NaN wins, ties go to the first maximum in the scan.

    ``y`` receives the winning element itself (bit for bit), or ``lowest`` for a window
    with no tap inside the input; ``indices`` (when ``want_indices``) the winner's offset in
    the whole input, numbered with ``index_strides``, or -1.
    """
    rank = in_spatial.shape[0]
    tap_count = tap_offsets.shape[0]
    input_size = x.shape[1]
    extent = kernel_extents(taps, dilations)
    for item in prange(item_count(x.shape[0], out_spatial, block)):
        starts = np.empty(rank, np.int64)
        nc, first, end, run, row_offset, row_inside = locate_item(
            item, out_spatial, block, strides, pads_begin, extent, in_spatial, input_strides,
            starts)
        for o in range(first, end):
            inside, base = locate_window(o, starts, strides, pads_begin, extent, in_spatial,
                                         row_inside, row_offset)
            best = decode(lowest)
            best_tap = -1
            for t in range(tap_count):
                if not inside and not tap_is_inside(t, taps, starts, dilations, in_spatial):
                    continue
                value = decode(x[nc, base + tap_offsets[t]])
                if value != value:
                    best_tap = t
                    break
                if best_tap < 0 or value > best:
                    best = value
                    best_tap = t
            if best_tap < 0:
                y[nc, run + o] = lowest
                if want_indices:
                    indices[nc, run + o] = -1
                continue
            y[nc, run + o] = x[nc, base + tap_offsets[best_tap]]
            if want_indices:
                index = nc * input_size
                for axis in range(rank):
                    position = starts[axis] + taps[best_tap, axis] * dilations[axis]
                    index += position * index_strides[axis]
                indices[nc, run + o] = index


@njit(parallel=True, **OPTIONS)
def average_pool(x, y, count_include_pad, in_spatial, out_spatial, strides, dilations,
                 pads_begin, pads_end, input_strides, taps, tap_offsets, block):
    """Mean over each window's taps inside the input; with ``count_include_pad`` the
    divisor counts the taps inside the padded extent instead. No tap inside gives 0."""
    rank = in_spatial.shape[0]
    tap_count = tap_offsets.shape[0]
    extent = kernel_extents(taps, dilations)
    for item in prange(item_count(x.shape[0], out_spatial, block)):
        starts = np.empty(rank, np.int64)
        nc, first, end, run, row_offset, row_inside = locate_item(
            item, out_spatial, block, strides, pads_begin, extent, in_spatial, input_strides,
            starts)
        for o in range(first, end):
            inside, base = locate_window(o, starts, strides, pads_begin, extent, in_spatial,
                                         row_inside, row_offset)
            total = as_accumulator(0, x)
            count = 0
            divisor = 0
            for t in range(tap_count):
                if not inside:
                    if count_include_pad and tap_is_in_padding_extent(
                            t, taps, starts, dilations, in_spatial, pads_begin, pads_end):
                        divisor += 1
                    if not tap_is_inside(t, taps, starts, dilations, in_spatial):
                        continue
                total += decode(x[nc, base + tap_offsets[t]])
                count += 1
            if inside or not count_include_pad:
                divisor = count
            if divisor == 0:
                y[nc, run + o] = encode(as_accumulator(0, x), y)
            else:
                y[nc, run + o] = encode(total / as_accumulator(divisor, x), y)


@njit(inline="always")
def lp_term(value, p, p_kind):
    """|value| ** p; p_kind 1 and 2 avoid pow()."""
    magnitude = abs(value)
    if p_kind == 1:
        return magnitude
    if p_kind == 2:
        return magnitude * magnitude
    return magnitude ** p


@njit(inline="always")
def lp_root(total, p, p_kind):
    if p_kind == 1:
        return total
    if p_kind == 2:
        return np.sqrt(total)
    return total ** (1 / p)


@njit(parallel=True, **OPTIONS)
def lp_pool(x, y, p, p_kind, in_spatial, out_spatial, strides, dilations, pads_begin, pads_end,
            input_strides, taps, tap_offsets, block):
    """(sum of |x| ** p over each window's taps inside the input) ** (1 / p)."""
    rank = in_spatial.shape[0]
    tap_count = tap_offsets.shape[0]
    extent = kernel_extents(taps, dilations)
    p_acc = as_accumulator(p, x)
    for item in prange(item_count(x.shape[0], out_spatial, block)):
        starts = np.empty(rank, np.int64)
        nc, first, end, run, row_offset, row_inside = locate_item(
            item, out_spatial, block, strides, pads_begin, extent, in_spatial, input_strides,
            starts)
        for o in range(first, end):
            inside, base = locate_window(o, starts, strides, pads_begin, extent, in_spatial,
                                         row_inside, row_offset)
            total = as_accumulator(0, x)
            for t in range(tap_count):
                if not inside and not tap_is_inside(t, taps, starts, dilations, in_spatial):
                    continue
                total += lp_term(decode(x[nc, base + tap_offsets[t]]), p_acc, p_kind)
            y[nc, run + o] = encode(lp_root(total, p_acc, p_kind), y)
