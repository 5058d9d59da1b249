"""Small planes: AveragePool's 3x3 window at stride 1 over a run of a plane's rows at once.

_dispatch chooses it for 2-D AveragePool windows of 3x3 taps with stride 1, no dilation
and pads of 0 or 1 (every window then holds its centre), over planes of at least 2x2 and
at most PLANE_ELEMENTS elements. The generic kernel (sums.py) pays per output row: placing
it, its cache of input rows, the calls that sum a new input row and divide; on planes of
56x56 and smaller that was most of its time. Here the row sums of every input row a run of
output rows reads come from one loop over those rows as one array, the outputs at each
row's two ends made again with their taps inside the row; each output row then adds its
window's row sums and divides. Each sum is the generic kernel's, in its order (the taps
of a row added to +0 left to right, then the rows added to +0 in order: docs/semantics.md),
so the results are the same, bit for bit.
"""

import numpy as np
from numba import njit

from .._plan import AXIS_IN, AXIS_OUT, AXIS_PAD_BEGIN
from . import kernel
from .codec import accumulator_array, as_accumulator, decode, encode
from .sums import divisor_row

# The largest plane served: past it the generic kernel's rows, cached in the nearest cache,
# measured as fast (3x3 over 112x112 planes) or faster (224x224: 1.3x)
PLANE_ELEMENTS = 96 * 96


@njit(inline="always")
def _element(source, index, zero):
    return as_accumulator(decode(source[index]), zero)


@njit(inline="always")
def _row_sums(source, start, rows, row_length, sums, zero):
    """sums[i] = the sum of the taps inside the row of the 3 centred on source[start + i],
    for the ``rows`` rows of ``row_length`` (at least 2) elements from ``start``."""
    one = np.uint64(1)
    count = np.uint64(rows * row_length)
    # every element as if its row went on: right but at each row's two ends
    for i in range(one, count - one):
        sums[i] = (((zero + _element(source, start + i - one, zero))
                    + _element(source, start + i, zero)) + _element(source, start + i + one, zero))
    for row in range(rows):
        i = np.uint64(row * row_length)
        sums[i] = (zero + _element(source, start + i, zero)) + _element(source, start + i + one,
                                                                         zero)
        i += np.uint64(row_length) - one
        sums[i] = (zero + _element(source, start + i - one, zero)) + _element(source, start + i,
                                                                              zero)


@kernel(error_model="numpy")  # the divisors are at least 1: no check for zero in the loops
def plane_mean_units(unit_begin, unit_end, x, y, zero, axes, divisor_counts, block):
    """AveragePool over output rows [unit_begin, unit_end) (units: whole output rows, of
    ``block`` outputs) of the 3x3 stride-1 windows this module serves, accumulated in the
    type of ``zero``, divided by the product of ``divisor_counts`` over the two axes."""
    height, width = axes[AXIS_IN, 0], axes[AXIS_IN, 1]
    out_height, out_width = axes[AXIS_OUT, 0], axes[AXIS_OUT, 1]
    top, left = axes[AXIS_PAD_BEGIN, 0], axes[AXIS_PAD_BEGIN, 1]
    sums = accumulator_array(height * width, zero)
    row_divisors = accumulator_array(out_width, zero)
    divisors_leading = -1
    source = x.reshape(x.size)
    out = y.reshape(y.size)
    stride = np.uint64(width)
    unit = unit_begin
    while unit < unit_end:
        plane = unit // out_height
        first = unit - plane * out_height
        end = min(out_height, first + unit_end - unit)  # output rows [first, end) here
        # the input rows they read: each output row's centre row and the rows beside it
        row_lo = max(0, first - top)
        row_hi = min(height, end - top + 2)
        _row_sums(source, np.uint64((plane * height + row_lo) * width), row_hi - row_lo, width,
                  sums, zero)
        for row in range(first, end):
            leading = divisor_counts[0, row]
            if leading != divisors_leading:
                divisor_row(row_divisors, leading, divisor_counts, zero)
                divisors_leading = leading
            centre = row - top + 1
            # the centre row's sum of output 0 in ``sums``, and output 0 in ``out``
            middle = np.uint64(centre - row_lo) * stride + np.uint64(1 - left)
            at = np.uint64((plane * out_height + row) * out_width)
            count = np.uint64(out_width)
            if 0 < centre < height - 1:
                for o in range(count):
                    total = ((zero + sums[middle - stride + o]) + sums[middle + o]) \
                        + sums[middle + stride + o]
                    out[at + o] = encode(total / row_divisors[o], y)
            elif centre == 0:  # the row above lies in the pad
                for o in range(count):
                    total = (zero + sums[middle + o]) + sums[middle + stride + o]
                    out[at + o] = encode(total / row_divisors[o], y)
            else:  # the row below lies in the pad
                for o in range(count):
                    total = (zero + sums[middle - stride + o]) + sums[middle + o]
                    out[at + o] = encode(total / row_divisors[o], y)
        unit += end - first
