"""The work units every windowed kernel shares (maxima, sums, fixed, columns).

Layout: ``x`` and ``y`` are the C-ordered input and output as one axis each, (n, c) after
(n, c), a channel's plane of prod(input spatial) or prod(output spatial) elements
(``input_plane``, ``output_plane``). ``axes`` is ``WindowPlan.geometry["axes"]``: one int64 row per AXIS_* name of _plan,
one column per spatial axis; ``taps`` and ``tap_offsets`` list the window's taps in row-major
order (the scan order that decides ties and the first NaN).

A work unit is one (n, c), one position along every spatial axis but the last, and one block
of at most ``block`` outputs along the last axis, so that all threads are busy even when N*C
is 1. A parallel driver deals the units out in ``chunks`` contiguous runs; each run goes to a
plain function, which allocates its scratch once and which numba optimizes far better than
code inside the parallel region. Only the first unit of a run is found by division
(``first_unit``); the next ones step like an odometer (``next_unit``).

The helpers a kernel calls once per row or per tap, whose types do not depend on the dtype,
are compiled once per process for LLVM to inline (``inlined``): numba inlines a helper of
its own by copying and typing its IR again at each call site of each kernel. The unit
stepping (``first_unit``, ``next_unit``, ``place_row``, ``unit_row``) stays inlined by
numba: compiled once, densenet's AveragePool took 1.1x as long.
"""

import numpy as np
from numba import njit

from .._plan import (
    AXIS_DILATION,
    AXIS_EXTENT,
    AXIS_IN,
    AXIS_INDEX_STRIDE,
    AXIS_INPUT_STRIDE,
    AXIS_OUT,
    AXIS_OUTPUT_STRIDE,
    AXIS_PAD_BEGIN,
    AXIS_STRIDE,
)
from . import inlined
from .scratch import empty


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


@inlined()
def tap_is_inside(tap, taps, starts, axes, end_axis):
    """Whether the tap lies inside the input along the axes before ``end_axis``."""
    for axis in range(end_axis):
        position = starts[axis] + taps[tap, axis] * axes[AXIS_DILATION, axis]
        if position < 0 or position >= axes[AXIS_IN, axis]:
            return False
    return True


@inlined()
def tap_run(tap, first, end, tap_outputs, row_offset, axes, tap_offsets):
    """The outputs in [first, end) of the row for which last-axis tap number ``tap`` lies
    inside the input there, as (index of the first in the row part, how many, input offset
    of its tap, counted from the input row at ``row_offset``). Indices are unsigned so that
    numba skips the negative-index fix-up and the loops vectorize."""
    last = axes.shape[1] - 1
    lo = max(first, tap_outputs[tap, 0])
    hi = min(end, tap_outputs[tap, 1])
    offset = (
        row_offset + lo * axes[AXIS_STRIDE, last] - axes[AXIS_PAD_BEGIN, last] + tap_offsets[tap]
    )
    return np.uint64(lo - first), max(0, hi - lo), np.uint64(max(0, offset))


@inlined()
def window_index(nc, channel_size, starts, axes):
    """The Indices numbering of the window's start at ``starts``, in channel ``nc``."""
    index = nc * channel_size
    for axis in range(axes.shape[1]):
        index += starts[axis] * axes[AXIS_INDEX_STRIDE, axis]
    return index


@inlined()
def plane_axes(axes):
    """A 2-D geometry's (height, width, out_height, out_width, top pad, left pad, the first
    axis's stride)."""
    return (
        axes[AXIS_IN, 0],
        axes[AXIS_IN, 1],
        axes[AXIS_OUT, 0],
        axes[AXIS_OUT, 1],
        axes[AXIS_PAD_BEGIN, 0],
        axes[AXIS_PAD_BEGIN, 1],
        axes[AXIS_STRIDE, 0],
    )


@njit(inline="always")
def first_pass_or(first, start, before):
    """What a row kernel's pass starts from: ``start`` at the ``first`` pass, else
    ``before``, the result so far, which the caller loads either way: a select in the
    loop, where a branch around the load LLVM would unswitch, compiling the loop twice."""
    return start if first else before


@njit(inline="always")
def ring_slots(window_height):
    """How many input rows the row kernels (wide, indexed) keep the results of: a power of
    two, at least the window's height, so that a row's slot is its number masked."""
    slots = 1
    while slots < window_height:
        slots *= 2
    return slots


@njit(inline="always")
def ring_slot(input_row, slots, out_width):
    """Where input row ``input_row``'s results start in a ring of ``slots`` rows of
    ``out_width``."""
    return (np.uint64(input_row) & np.uint64(slots - 1)) * np.uint64(out_width)


@njit(inline="always")
def window_rows(unit, plane, next_row, out_height, row_step, top, window_height, height):
    """A 2-D row kernel's unit (a whole output row), from the last one's ``plane`` and
    ``next_row`` (the plane's first input row without its results in the ring): (plane,
    output row in it, the window's first input row inside the input and its end, the
    plane's next input row to compute)."""
    if unit // out_height != plane:
        plane = unit // out_height
        next_row = 0
    row = unit - plane * out_height
    window_top = row * row_step - top
    inside_top = max(window_top, 0)
    inside_end = min(window_top + window_height, height)
    return plane, row, inside_top, inside_end, max(next_row, inside_top)


@inlined()
def interior_outputs(axes, width):
    """(lo, hi): the outputs along the last axis whose ``width`` taps (dilation 1) all lie
    inside the input. Divisions: computed once per run of units, not per unit."""
    last = axes.shape[1] - 1
    step, pad, size = axes[AXIS_STRIDE, last], axes[AXIS_PAD_BEGIN, last], axes[AXIS_IN, last]
    return (pad + step - 1) // step, (size - width + pad) // step + 1


@njit(inline="always")
def input_row_strides(axes):
    """Per leading axis, how many input rows one step along it spans; with these a unit's
    first input row is found without a division (``first_input_row``). A scratch array,
    which the kernel releases (scratch.py)."""
    last = axes.shape[1] - 1
    strides = empty(max(last, 1), np.int64)
    for axis in range(last):
        strides[axis] = axes[AXIS_INPUT_STRIDE, axis] // axes[AXIS_IN, last]
    return strides


@inlined()
def first_input_row(nc, channel_rows, starts, row_strides):
    """The input row number (counted over all channels) where a unit's window starts."""
    row = nc * channel_rows
    for axis in range(starts.shape[0] - 1):
        row += starts[axis] * row_strides[axis]
    return row


@inlined()
def row_slot(row_index, first, keys, slots, out_last):
    """The cache slot of one input row's last-axis results for the outputs from ``first``,
    and whether they must be computed (not cached there yet)."""
    slot = row_index & (slots - 1)
    key = row_index * (out_last + 1) + first
    if keys[slot] == key:
        return slot, False
    keys[slot] = key
    return slot, True


@inlined()
def interior_span(first, end, interior):
    """[lo, hi): the outputs in [first, end) inside ``interior`` (from interior_outputs)."""
    lo = min(max(first, interior[0]), end)
    hi = max(lo, min(end, interior[1]))
    return lo, hi


@njit(inline="always")
def input_plane(axes):
    """A channel's input elements: prod(input spatial)."""
    return axes[AXIS_INPUT_STRIDE, 0] * axes[AXIS_IN, 0]


@njit(inline="always")
def output_plane(axes):
    """A channel's output elements: prod(output spatial)."""
    return axes[AXIS_OUTPUT_STRIDE, 0] * axes[AXIS_OUT, 0]


@njit(inline="always")
def first_unit_row(unit_begin, axes, block):
    """A run's scratch and first unit: (window starts, unit positions, nc of
    ``unit_begin``); ``unit_row`` then steps from unit to unit. The starts and positions
    are scratch arrays, which the kernel releases (scratch.py)."""
    starts = empty(axes.shape[1], np.int64)
    positions = empty(axes.shape[1], np.int64)
    return starts, positions, first_unit(unit_begin, axes, block, positions)


@njit(inline="always")
def unit_row(unit, unit_begin, nc, positions, starts, axes, block, in_plane, out_plane):
    """Step to ``unit`` and place its row: (nc, first, end, input offset of the window's
    leading start, whether the leading axes are inside, output offset of output 0 of the
    row, so that output o goes to that + o). ``in_plane`` and ``out_plane``: a channel's
    elements (input_plane, output_plane), which the fixed windows' kernels keep through
    the run and the columns kernel reads again at each unit: kept, they took registers
    from its loops (the resnet stem took 1.03x as long)."""
    if unit > unit_begin:
        nc = next_unit(positions, nc, axes, block)
    first, end, row, row_offset, row_inside = place_row(positions, axes, block, starts)
    return (nc, first, end, row_offset + nc * in_plane, row_inside, nc * out_plane + row)
