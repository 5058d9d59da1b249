"""Small planes: MaxPool's 2-D windows at stride 1, a run of a plane's rows at once.

It serves MaxPool without Indices over two axes at strides of 1 (any window,
dilation and pads) over small padded planes (plane_limit). The columns
kernel pays per output row: placing it, its input rows' starts, the fold of those rows and
the taps along the row, each a loop of one row's length; on planes of 64x64 and smaller
that was most of its time (the dilated case took 1.8 times onnxruntime's time on one
thread). Here the input rows that a run of output rows reads are copied once into a
scratch region with the pads around them (``lowest``, which never wins against an input
element of another value); the maxima over the window's rows are then taken over that
region as one long row (each row of the region i * dilation rows further on), and the
maxima over the taps along the row the same way, the positions past the end of each output
row taken too and dropped.

That scans a window column by column, as the columns kernel does: zeros and NaNs, where
that scan could pick another bit pattern than the row-major one, are taken again in
row-major order in planes that hold a -0 or a NaN, so every result is the one
docs/semantics.md states, bit for bit.
"""

import math

import numpy as np
from numba import njit

from .._plan import AXIS_DILATION, AXIS_EXTENT
from . import kernel
from .codec import decode
from .family import Family
from .max_vectors import rows_hold_negative_zero_or_nan
from .maxima import fold_max, fold_max_function, is_tie
from .scratch import empty, full, release
from .units import plane_axes

# The largest padded planes served, where it measured faster than the columns kernel on
# one thread: windows of at most 3x3 undilated taps over planes up to 32x32 (3x3 over
# 28x28: 0.70 of the time; from 40x40 on, slower); wider or dilated windows, which the
# columns kernel takes a tap at a time, up to 72x72 (5x5 over 64x64: 0.77; over 112x112,
# 1.4x slower)
SMALL_WINDOW_PLANE_ELEMENTS = 32 * 32
PLANE_ELEMENTS = 72 * 72


def plane_limit(kernel_shape, dilations):
    """The most elements a padded plane may hold for this module to serve the window."""
    if max(kernel_shape) <= 3 and max(dilations) == 1:
        return SMALL_WINDOW_PLANE_ELEMENTS
    return PLANE_ELEMENTS


@njit(inline="always")
def _copy_region(
    source, plane_start, region, region_top, rows, padded_width, height, width, top, left, lowest
):
    """region = ``rows`` rows of the padded plane from padded row ``region_top``, each
    ``padded_width`` wide: the input's elements where they lie, ``lowest`` elsewhere."""
    # the region's columns inside the input: [first, end)
    first = max(0, min(padded_width, left))
    end = max(first, min(padded_width, left + width))
    for row in range(rows):
        at = np.uint64(row * padded_width)
        input_row = region_top + row - top
        if input_row < 0 or input_row >= height:
            for i in range(padded_width):
                region[at + np.uint64(i)] = lowest
            continue
        for i in range(first):
            region[at + np.uint64(i)] = lowest
        start = np.uint64(plane_start + input_row * width - left)
        for i in range(first, end):
            region[at + np.uint64(i)] = source[start + np.uint64(i)]
        for i in range(end, padded_width):
            region[at + np.uint64(i)] = lowest


@njit(inline="always")
def _fold_taps(target, source, base, count, taps, spacing):
    """target[i] = the maximum of source[base + i + t * spacing] for t < ``taps``, for
    i < count: three taps to a pass over the run, the first pass taking 1 to 3 (a tap
    taken twice changes nothing), so that the rest go in threes. The shape of
    columns._fold_column_rows, written out with the taps' offsets computed: through that
    function, their offsets read from a table, these windows ran 1.03-1.10x slower."""
    take = (taps - 1) % 3 + 1
    second = np.uint64(base + min(1, take - 1) * spacing)
    third = np.uint64(base + (take - 1) * spacing)
    first = np.uint64(base)
    for i in range(np.uint64(count)):
        target[i] = fold_max_function(
            fold_max_function(source[first + i], source[second + i]), source[third + i]
        )
    for tap in range(take, taps, 3):
        first = np.uint64(base + tap * spacing)
        second = first + np.uint64(spacing)
        third = second + np.uint64(spacing)
        for i in range(np.uint64(count)):
            target[i] = fold_max_function(
                fold_max_function(
                    fold_max_function(target[i], source[first + i]), source[second + i]
                ),
                source[third + i],
            )


@njit(inline="always")
def _row_major_max(
    source,
    plane_start,
    row,
    column,
    height,
    width,
    top,
    left,
    window_rows,
    window_columns,
    row_dilation,
    column_dilation,
    lowest,
):
    """The output at (row, column) with its taps taken in row-major order, those in the
    pads skipped (from ``lowest``)."""
    best = lowest
    for i in range(window_rows):
        input_row = row - top + i * row_dilation
        if input_row < 0 or input_row >= height:
            continue
        for j in range(window_columns):
            input_column = column - left + j * column_dilation
            if 0 <= input_column < width:
                best = fold_max(
                    best, source[np.uint64(plane_start + input_row * width + input_column)]
                )
    return best


@kernel()
def max_plane_units(unit_begin, unit_end, x, y, lowest, axes, block, check_ties):
    """MaxPool over output rows [unit_begin, unit_end) (units: whole output rows, of
    ``block`` outputs) of the stride-1 windows this module serves; ``lowest`` in the pads.
    With ``check_ties`` (float dtypes; a literal, entry.py), zero and NaN outputs are taken
    again in row-major order where the plane holds a -0 or a NaN."""
    height, width, out_height, out_width, top, left, _ = plane_axes(axes)
    row_dilation, column_dilation = axes[AXIS_DILATION, 0], axes[AXIS_DILATION, 1]
    window_rows = (axes[AXIS_EXTENT, 0] - 1) // row_dilation + 1
    window_columns = (axes[AXIS_EXTENT, 1] - 1) // column_dilation + 1
    # at stride 1 an output row ends where the padded row's last window starts
    padded_width = out_width + axes[AXIS_EXTENT, 1] - 1
    padded_height = out_height + axes[AXIS_EXTENT, 0] - 1
    region = empty(padded_height * padded_width, x.dtype)
    row_maxima = empty(out_height * padded_width, x.dtype)
    maxima = empty(out_height * padded_width, x.dtype)
    plane_state = full(2, -1, np.int64)  # the plane last scanned for a -0 or a NaN, and
    # whether it holds one
    plane_starts = empty(1, np.int64)  # its start, as one row of the scan
    unit = unit_begin
    while unit < unit_end:
        plane = unit // out_height
        first = unit - plane * out_height
        end = min(out_height, first + unit_end - unit)  # output rows [first, end) here
        rows = end - first
        plane_start = plane * height * width
        # the window's rows, then its taps along the row, over the run as one long row;
        # the last output row's maxima end its window's taps short of the region's end.
        # Rows with no pads are read where they are; others from a padded copy.
        count = rows * padded_width
        region_rows = rows + axes[AXIS_EXTENT, 0] - 1  # the padded rows the run reads
        if padded_width == width and first >= top and first + region_rows <= top + height:
            _fold_taps(
                row_maxima,
                x,
                plane_start + (first - top) * width,
                count,
                window_rows,
                row_dilation * padded_width,
            )
        else:
            _copy_region(
                x,
                plane_start,
                region,
                first,
                region_rows,
                padded_width,
                height,
                width,
                top,
                left,
                lowest,
            )
            _fold_taps(row_maxima, region, 0, count, window_rows, row_dilation * padded_width)
        _fold_taps(
            maxima, row_maxima, 0, count - axes[AXIS_EXTENT, 1] + 1, window_columns, column_dilation
        )
        for row in range(rows):
            out_at = np.uint64((plane * out_height + first + row) * out_width)
            at = np.uint64(row * padded_width)
            suspect = False  # a zero or a NaN, checked as the row is stored
            for o in range(np.uint64(out_width)):
                value = maxima[at + o]
                y[out_at + o] = value
                suspect |= check_ties and is_tie(decode(value))
            if check_ties and suspect:  # on the literal: int8 and uint8 compile no retake
                # only where the plane holds a -0 or a NaN (columns.py's retake: why),
                # scanned once per plane and run
                if plane_state[0] != plane:
                    plane_state[0] = plane
                    plane_starts[0] = plane_start
                    plane_state[1] = rows_hold_negative_zero_or_nan(
                        x, plane_starts, np.uint64(1), np.uint64(height * width)
                    )
                for o in range(out_width if plane_state[1] else 0):
                    if is_tie(decode(y[out_at + np.uint64(o)])):
                        y[out_at + np.uint64(o)] = _row_major_max(
                            x,
                            plane_start,
                            first + row,
                            o,
                            height,
                            width,
                            top,
                            left,
                            window_rows,
                            window_columns,
                            row_dilation,
                            column_dilation,
                            lowest,
                        )
        unit += rows
    release(region, row_maxima, maxima, plane_state, plane_starts)


def _serves(request):
    """MaxPool over two axes at strides of 1, its padded plane within plane_limit:
    (check_ties: whether zeros and NaNs, which int dtypes lack, are taken again)."""
    plan = request.plan
    padded = [
        size + begin + end
        for size, begin, end in zip(plan.spatial_in, plan.pads_begin, plan.pads_end)
    ]
    if not (
        len(plan.kernel_shape) == 2
        and plan.strides == (1, 1)
        and math.prod(padded) <= plane_limit(plan.kernel_shape, plan.dilations)
    ):
        return None
    return (plan.dtype.kind not in "iu",)


FAMILY = Family(
    max_plane_units,
    ops=("MaxPool",),
    serves=_serves,
    kinds=lambda op, dtype: ((dtype.kind not in "iu",),),
    arguments=("lowest", "axes", "block"),
    whole_rows=True,
    examples=(
        ("MaxPool", (2, 8, 9, 11), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
        ("MaxPool", (2, 8, 20, 20), dict(kernel_shape=[3, 3], dilations=[2, 2])),
    ),
)
