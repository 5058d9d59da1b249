"""MaxPool without Indices taken input rows first, per kind of last-axis window.

It serves MaxPool without Indices but the fixed windows, over any number of
spatial axes. A window's input rows are folded element by element into one row of column
maxima (contiguous loads, which vectorize), then the last-axis taps are taken once per output
row; with three or more axes, the outer axes' taps are first folded over whole input planes
where they fit (a kind of its own, ``fold_planes``). Over one axis the row is the input row,
copied. It took the resnet stem from 1.40x to 0.75x and the 3-d case from 3.33x to 0.87x of
onnxruntime's time. Zeros and NaNs, where a column-major scan could pick another bit pattern
than the row-major one, are taken again in row-major order where the column maxima (over
folded planes, the input rows) hold a -0 or a NaN: results are the same bit for bit.
Windows 3 wide at step 2 learn of a -0 from the fold of the rows and of a NaN from their
outputs, and scan the column maxima only where the fold saw a -0.

Two kernels take MaxPool this way: ``row_units``, over two axes a whole output row a unit,
which finds what a run's units share once per run, and ``column_units``, every other call
(units that split a row, one input row per window, one axis or three and more). Both take
an output row's windows, its tie check and its retake from the same helpers.
"""

import numpy as np
from numba import njit

from .._plan import (
    AXIS_DILATION,
    AXIS_EXTENT,
    AXIS_IN,
    AXIS_INPUT_STRIDE,
    AXIS_OUT,
    AXIS_PAD_BEGIN,
    AXIS_STRIDE,
)
from . import kernel
from .codec import are_negative_zero_bits, decode, signed_bits
from .family import Family
from .max_vectors import (
    row_fold_first,
    row_fold_more,
    rows_hold_negative_zero_or_nan,
    three_wide_step_two,
)
from .maxima import any_tie, border_max, fold_max_function, is_tie, max_run, nan_max, start_maxima
from .prefetch import LINE_BYTES, PREFETCH_INPUT_BYTES, prefetch_ahead
from .scratch import empty, full, release
from .units import first_unit_row, input_plane, output_plane, tap_is_inside, unit_row


@njit(inline="always")
def _row_max(kept, value, keep_first):
    # keep_first: fold_max, which keeps each column's first maximum and first NaN, as the
    # scan of the column maxima needs (rows of 224 float32 took 1.3x as long through LLVM's
    # maximum); else nan_max, for the kinds that fold planes (the 3-d case 0.92 of the time)
    return fold_max_function(kept, value) if keep_first else nan_max(kept, value)


@njit(inline="always")
def _fold_column_rows(columns, lo, hi, source, row_starts, rows, vector_fold, keep_first, lowest):
    """columns[lo:hi] = the element-wise maximum of ``rows`` input rows (at least one),
    columns[lo] coming from source[row_starts[r]]. Three rows per pass over the columns:
    the first pass takes 1 to 3 rows (a row taken twice changes nothing), so that the
    rest go in threes. ``keep_first`` (a constant): each column keeps its first maximum
    and first NaN (_row_max); else any of them (the vector fold keeps the first either way).

    With ``vector_fold`` (a literal kind, for 8- and 16-bit dtypes) a pass is
    max_vectors.row_fold_first or row_fold_more: numba's loop vectorizes those dtypes 256
    bytes a pass and leaves a short row's elements to scalar leftovers (MaxPool 3x3 s2 over
    uint8 takes 0.8 of the time this way). float32 and float64 keep numba's loop, whose
    leftovers are few (through the vector helpers the dilated case was slower).

    Returns whether the column maxima may hold a -0: numba's loop with ``keep_first``
    keeps the smallest of their bits as signed integers (signed_bits) as it stores them,
    one compare a vector, a -0 folded over in a later pass counted too; the other folds
    return True. ``lowest``: the padding's value (-inf), of the elements' type."""
    base = np.uint64(lo)
    take = (rows - 1) % 3 + 1
    at0 = np.uint64(row_starts[0])
    at1 = np.uint64(row_starts[min(1, take - 1)])
    at2 = np.uint64(row_starts[take - 1])
    if vector_fold:
        count = np.uint64(hi - lo)
        row_fold_first(columns, base, source, at0, at1, at2, count)
        for r in range(take, rows, 3):
            row_fold_more(
                columns,
                base,
                source,
                np.uint64(row_starts[r]),
                np.uint64(row_starts[r + 1]),
                np.uint64(row_starts[r + 2]),
                count,
            )
        return True
    smallest_bits = signed_bits(lowest)  # -inf's: a start that is not -0's
    for i in range(hi - lo):
        k = np.uint64(i)
        kept = _row_max(
            _row_max(source[at0 + k], source[at1 + k], keep_first), source[at2 + k], keep_first
        )
        columns[base + k] = kept
        if keep_first:
            smallest_bits = min(smallest_bits, signed_bits(kept))
    for r in range(take, rows, 3):
        at0 = np.uint64(row_starts[r])
        at1 = np.uint64(row_starts[r + 1])
        at2 = np.uint64(row_starts[r + 2])
        for i in range(hi - lo):
            k = np.uint64(i)
            kept = _row_max(columns[base + k], source[at0 + k], keep_first)
            kept = _row_max(kept, source[at1 + k], keep_first)
            kept = _row_max(kept, source[at2 + k], keep_first)
            columns[base + k] = kept
            if keep_first:
                smallest_bits = min(smallest_bits, signed_bits(kept))
    return not keep_first or are_negative_zero_bits(smallest_bits)


@kernel()  # not inlined: a branch of its own in the inlined fold slowed the 2-D loops 1.2-1.6x
def copy_row(columns, lo, hi, source, start):
    """columns[lo:hi] = source[start:start + hi - lo]."""
    for i in range(hi - lo):
        columns[np.uint64(lo + i)] = source[np.uint64(start + i)]


# What numba's vectorized loop over float32 and float64 rows takes a pass: four vectors of
# 64 bytes (AVX-512; with AVX2, two passes of four of 32). A row's last elements short of a
# pass go through narrower vectors and scalars, and row_units' fold run on to whole passes
# past the row's end took the resnet stem's 113 columns of float32 in 0.85 of the time.
# Further past the end than a cache line it lost: float64's 113 columns (120 bytes more)
# took 1.1x as long over 25 MB, 13 columns of float32 (204 bytes) 1.08x.
FOLD_PASS_BYTES = 256

# The largest input plane (last two axes) column_units folds into scratch: 256 KiB of
# float32, within a core's L2 cache.
PLANE_ELEMENTS = 1 << 16


def folding_runs(spatial_in, spatial_out, block, units) -> int:
    """The most runs into which ``units`` units (``block`` outputs each along the last
    axis) of a MaxPool over these spatial shapes may be split and still take column_units'
    kind that folds whole input planes first (``fold_planes``); 0 where none may. It folds
    over three axes or more, planes (the last two axes) of PLANE_ELEMENTS at most, and runs
    that cover four output planes or more: a plane is folded whole, even for a run that
    needs a few of its rows."""
    if len(spatial_in) < 3 or spatial_in[-2] * spatial_in[-1] > PLANE_ELEMENTS:
        return 0
    plane_units = spatial_out[-2] * -(-spatial_out[-1] // block)
    return units // (4 * plane_units)


def folds_planes(spatial_in, spatial_out, block, units, chunks) -> bool:
    """Whether ``units`` units in ``chunks`` runs (0: one, on the calling thread) take the
    kind that folds planes (folding_runs)."""
    return folding_runs(spatial_in, spatial_out, block, units) >= max(chunks, 1)


@njit(inline="always")
def _outer_plane_starts(plane_starts, row_offset, starts, axes, taps, tap_offsets, plane_taps):
    """plane_starts[:n] = where the input planes (the last two axes, whole) under a unit's
    window taps along the axes before them start, those inside the input; ``plane_taps``
    taps apart in the tap table. Returns n."""
    height = axes.shape[1] - 2
    # input offset of the window's start along the outer axes, height start taken out
    outer = row_offset - starts[height] * axes[AXIS_INPUT_STRIDE, height]
    count = 0
    for tap in range(0, taps.shape[0], plane_taps):
        if tap_is_inside(tap, taps, starts, axes, height):
            plane_starts[count] = outer + tap_offsets[tap]
            count += 1
    return count


@njit(inline="always")
def _column_windows(columns, target, base, count, width, step, spacing):
    """target[base + j] = the maximum of the ``width`` columns ``spacing`` apart from
    columns[j * step], for a common width and step, both constants: a window's taps in one
    loop body load as whole vectors (the taps-outer loops gather at step 2). The order of
    the taps differs from the row-major scan, which matters for zeros and NaNs only: those
    outputs are retaken anyway."""
    for j in range(count):
        at = np.uint64(j) * step
        value = columns[at]
        for tap in range(1, width):
            value = nan_max(value, columns[at + np.uint64(tap) * spacing])
        target[base + np.uint64(j)] = value


@njit(inline="always")
def _column_span(first, end, step, extent, pad, size):
    """Where the column maxima of outputs first to end - 1 of a row lie along the last
    axis (its ``step``, window ``extent``, leading ``pad`` and input ``size``): (span_start,
    span, lo, hi). columns[0] lies under output first's first tap, at input column
    span_start; columns[:span] reach the last output's last tap, and columns[lo:hi] of
    them lie inside the input, the rest in the padding. Its Python (``py_func``) serves
    _serves_rows."""
    span_start = first * step - pad
    span = (end - 1 - first) * step + extent
    lo = min(span, max(0, -span_start))
    hi = max(lo, min(span, size - span_start))
    return span_start, span, lo, hi


@njit(inline="always")
def _pad_columns(columns, lo, hi, span, lowest):
    """columns[:lo] and columns[hi:span], the column maxima in the padding (_column_span),
    set to the padding's ``lowest``."""
    for i in range(lo):
        columns[np.uint64(i)] = lowest
    for i in range(hi, span):
        columns[np.uint64(i)] = lowest


@njit(inline="always")
def _row_windows(
    columns,
    y,
    out_begin,
    count,
    window_width,
    window_step,
    step,
    dilation,
    k_last,
    check_ties,
    lowest,
):
    """y[out_begin:out_begin + count] = the maxima of an output row's windows, taken from
    its column maxima (columns[0] under the first window's first tap), by the kind of
    last-axis window (column_kind; its width and step arrive as literals, tested here
    themselves so that numba drops the branches a kind does not take; ``step``: the
    stride along the row, as uint64). Returns (whether
    an output is_tie, whether one is a NaN, whether the fold's -0 flag is all the scan for
    a -0 needs): windows 3 wide at step 2 tell zeros and NaNs apart
    (max_vectors.three_wide_step_two); the others, a NaN output not told apart from a
    zero, scan for both."""
    if window_width == 3 and window_step == 2:
        zeros, nans = three_wide_step_two(columns, y, out_begin, np.uint64(count))
        return zeros or nans, nans, True
    if window_width == 3 and window_step == 1 and dilation != 1:
        _column_windows(columns, y, out_begin, count, 3, np.uint64(1), np.uint64(dilation))
    elif window_width:
        _column_windows(
            columns, y, out_begin, count, window_width, np.uint64(window_step), np.uint64(1)
        )
    else:
        start_maxima(y, None, out_begin, count, lowest)
        for kw in range(k_last):
            max_run(columns, np.uint64(kw * dilation), step, y, out_begin, count)
    return check_ties and any_tie(y, out_begin, count), False, False


@njit(inline="always")
def _columns_hold_ties(columns, column_start, lo, hi, inside_rows, nans, negative_zero):
    """Whether an output row's zeros and NaNs are taken again, its column maxima
    columns[lo:hi] folded from ``inside_rows`` input rows by fold_max.

    The column maxima stand for the rows: the fold keeps each column's first maximum and
    first NaN (fold_max), and a window's row-major answer, when a zero or a NaN, is the
    first maximum of its column (nothing as large lies above it). A -0 or a NaN that decides
    a window is among them, a third of the elements at three rows (the resnet stem over a
    ReLU's outputs 0.88 to 0.91 of the time). A NaN among them is a NaN output, and where
    the fold saw no -0 and no output is a NaN they hold neither: the scan is skipped (over
    a ReLU's outputs, the stem took 0.87 of the time)."""
    column_start[0] = lo
    return nans or (
        negative_zero
        and rows_hold_negative_zero_or_nan(
            columns, column_start, np.uint64(min(inside_rows, 1)), np.uint64(hi - lo)
        )
    )


@njit(inline="always")
def _retake_ties(
    y, out_begin, count, first, row_offset, row_inside, starts, lowest, x, axes, taps, tap_offsets
):
    """The zeros and NaNs among y[out_begin:out_begin + count], outputs first to first +
    count - 1 of their row, taken again in row-major order (maxima.border_max)."""
    for j in range(count):
        if is_tie(decode(y[out_begin + np.uint64(j)])):
            y[out_begin + np.uint64(j)] = border_max(
                first + j, row_offset, row_inside, starts, lowest, x, axes, taps, tap_offsets
            )


# inlined by numba, not compiled once as units' helpers are: compiled once, the 5x5
# stride-1 MaxPool over int8 and uint8 took 1.2x as long
@njit(inline="always")
def _input_row_starts(
    row_starts, row_offset, row_inside, starts, axes, taps, tap_offsets, k_last, start
):
    """row_starts[:n] = where a unit's window rows inside the input start (a row's first
    tap every ``k_last`` in the tap table), ``start`` columns into each input row; returns
    n."""
    last = axes.shape[1] - 1
    inside_rows = 0
    for tap in range(0, taps.shape[0], k_last):
        if row_inside or tap_is_inside(tap, taps, starts, axes, last):
            row_starts[inside_rows] = row_offset + tap_offsets[tap] + start
            inside_rows += 1
    return inside_rows


# Last-axis windows (width, step) whose taps column_units takes in one loop body, undilated
# but for (3, 1), whose taps may lie any distance apart (the columns at step 1 still load as
# whole vectors); other windows (0, 0) take theirs one run at a time, in a loop of its own
# for steps 1 and 2, which vectorizes.
COLUMN_WINDOWS = ((3, 2), (3, 1), (2, 2))
DILATED_COLUMN_WINDOWS = ((3, 1),)


COLUMN_KINDS = COLUMN_WINDOWS + ((0, 0),)


def column_kind(width, step, dilation):
    """The kind in COLUMN_KINDS that serves a last-axis window of ``width`` taps
    ``dilation`` apart, at ``step``."""
    if (width, step) in (COLUMN_WINDOWS if dilation == 1 else DILATED_COLUMN_WINDOWS):
        return width, step
    return 0, 0


# The kind of window arrives as literal arguments (entry.py), so that each kind compiles
# loops of its own with them constant.
@kernel()
def column_units(
    unit_begin,
    unit_end,
    x,
    y,
    lowest,
    axes,
    taps,
    tap_offsets,
    block,
    window_width,
    window_step,
    check_ties,
    vector_fold,
    fold_planes,
):
    """MaxPool without Indices, input rows first: the window's input rows are folded
    element by element into one row of column maxima (contiguous loads, which vectorize),
    then the last-axis taps are taken once per output row from that row.

    That scans a window column by column instead of row by row. The maximum's value is
    the same either way, and so are its bits unless it is a zero (+0 and -0 compare equal)
    or a NaN (which NaN comes first depends on the order): with ``check_ties`` (float
    dtypes) those outputs are taken again in row-major order where the unit's column maxima
    (or, over folded planes, its input rows) hold a -0 or a NaN
    (max_vectors.rows_hold_negative_zero_or_nan), so every result is the one
    docs/semantics.md states. Positions in the padding hold ``lowest``, which never wins
    against an input element of another value. ``vector_fold`` (8- and 16-bit dtypes)
    folds the rows in explicit vectors (_fold_column_rows). ``fold_planes``: the window
    has three axes or more, and its taps along the axes before the last two fold whole
    input planes first, in every unit; the dispatcher chooses it where folds_planes holds.
    The other kinds take a window's input rows from the input itself, over any number of
    axes, and compile none of the planes' code (choosing at run time compiled 0.5 s
    longer).
    """
    last = axes.shape[1] - 1
    step = np.uint64(axes[AXIS_STRIDE, last])
    dilation = axes[AXIS_DILATION, last]
    pad = axes[AXIS_PAD_BEGIN, last]
    in_last = axes[AXIS_IN, last]
    k_last = taps[taps.shape[0] - 1, last] + 1
    lead_count = taps.shape[0] // k_last
    columns = empty((block - 1) * axes[AXIS_STRIDE, last] + axes[AXIS_EXTENT, last], x.dtype)
    row_starts = empty(lead_count, np.int64)
    column_start = empty(1, np.int64)  # where the scan for a -0 or a NaN starts in columns
    starts, positions, nc = first_unit_row(unit_begin, axes, block)
    # fold_planes: the window's taps along the axes before the last two are first folded
    # over whole input planes (one long loop per plane) when a unit's differ from the
    # last unit's; each output row then folds only its rows of that plane. Both folds go
    # through one call of _fold_column_rows: with the planes' fold a function of its own,
    # a first call compiled 0.3 to 0.5 s longer.
    height = last - 1
    k_height = taps[taps.shape[0] - 1, height] + 1
    plane = empty(axes[AXIS_IN, height] * in_last if fold_planes else 0, x.dtype)
    # the plane's key and whether it is empty, in memory: as values carried from unit to
    # unit, they made the loop over two axes up to 1.15x slower
    plane_state = full(2, -1, np.int64)
    plane_starts = empty(lead_count if fold_planes else 0, np.int64)
    prefetching = x.size * x.itemsize >= PREFETCH_INPUT_BYTES
    for unit in range(unit_begin, unit_end):
        nc, first, end, row_offset, row_inside, out_first = unit_row(
            unit,
            unit_begin,
            nc,
            positions,
            starts,
            axes,
            block,
            input_plane(axes),
            output_plane(axes),
        )
        span_start, span, lo, hi = _column_span(
            first, end, axes[AXIS_STRIDE, last], axes[AXIS_EXTENT, last], pad, in_last
        )
        inside_rows = 0
        # whether the column maxima may hold a -0 (unknown unless the fold tells)
        negative_zero = True
        key = new_planes = 0  # the unit's plane, and how many input planes fold into it anew
        # the kinds tested on the literals themselves, so that numba drops the branches a
        # kind does not take
        if fold_planes:
            key = nc
            for axis in range(height):
                key = key * axes[AXIS_OUT, axis] + positions[axis]
            if key != plane_state[0]:
                new_planes = _outer_plane_starts(
                    plane_starts, row_offset, starts, axes, taps, tap_offsets, k_height * k_last
                )
                plane_state[1] = new_planes > 0
                if new_planes == 0:  # none inside the input: nothing to fold
                    plane_state[0] = key
            for row in range(k_height):
                h = starts[height] + row * axes[AXIS_DILATION, height]
                if plane_state[1] and 0 <= h < axes[AXIS_IN, height]:
                    row_starts[inside_rows] = h * in_last + span_start + lo
                    inside_rows += 1
        else:
            inside_rows = _input_row_starts(
                row_starts,
                row_offset,
                row_inside,
                starts,
                axes,
                taps,
                tap_offsets,
                k_last,
                span_start + lo,
            )
        if inside_rows == 0:
            lo = hi = 0
        elif lead_count == 1 and not fold_planes:  # one input row per window
            copy_row(columns, lo, hi, x, row_starts[0])
        elif fold_planes:
            # the plane first where it is new (fold 0), then the unit's rows of it (fold 1)
            for fold in range(0 if new_planes else 1, 2):
                into_plane = fold == 0
                _fold_column_rows(
                    plane if into_plane else columns,
                    0 if into_plane else lo,
                    plane.size if into_plane else hi,
                    x if into_plane else plane,
                    plane_starts if into_plane else row_starts,
                    new_planes if into_plane else inside_rows,
                    vector_fold,
                    False,
                    lowest,
                )
            # no prefetch of the planes the next output plane steps over: asking for them
            # took the 3-d case 1.06x as long on one core, float64 1.15x, 205 MB 1.14x
            if new_planes:
                plane_state[0] = key
        else:
            negative_zero = _fold_column_rows(
                columns, lo, hi, x, row_starts, inside_rows, vector_fold, True, lowest
            )
            if prefetching:
                # the rows the next units read: as many as an output row steps over
                prefetch_ahead(
                    x,
                    np.uint64(row_starts[inside_rows - 1]),
                    np.uint64((hi - lo) * axes[AXIS_STRIDE, last - 1]),
                )
        _pad_columns(columns, lo, hi, span, lowest)
        count = end - first
        out_begin = np.uint64(out_first + first)
        suspect, nans, told = _row_windows(
            columns,
            y,
            out_begin,
            count,
            window_width,
            window_step,
            step,
            dilation,
            k_last,
            check_ties,
            lowest,
        )
        negative_zero = negative_zero or not told
        # zeros and NaNs taken again in row-major order, where the windows hold a -0 or
        # a NaN (on the literal first: int8 and uint8 compile no retake). Where they hold
        # neither, every zero of the unit's windows is +0 and the scan returns one of the
        # window's elements (float32's LLVM maximum too, whose x86 code returns an
        # operand), and there are no NaN outputs. A ReLU's outputs, whose zeros are +0,
        # have many windows of zeros: each retaken, the resnet stem's MaxPool over them
        # took 3 times onnxruntime's time.
        if check_ties and suspect:
            if fold_planes:  # row_starts held the folded plane's rows, folded by nan_max
                inside_rows = _input_row_starts(
                    row_starts,
                    row_offset,
                    row_inside,
                    starts,
                    axes,
                    taps,
                    tap_offsets,
                    k_last,
                    span_start + lo,
                )
                held = rows_hold_negative_zero_or_nan(
                    x, row_starts, np.uint64(inside_rows), np.uint64(hi - lo)
                )
            else:
                held = _columns_hold_ties(
                    columns, column_start, lo, hi, inside_rows, nans, negative_zero
                )
            if held:
                _retake_ties(
                    y,
                    out_begin,
                    count,
                    first,
                    row_offset,
                    row_inside,
                    starts,
                    lowest,
                    x,
                    axes,
                    taps,
                    tap_offsets,
                )
    release(
        columns,
        row_starts,
        column_start,
        starts,
        positions,
        plane,
        plane_state,
        plane_starts,
    )


@njit(inline="always")
def _past_end(lo, hi, span, itemsize, vector_fold):
    """How many columns past hi row_units' fold runs on, of a row's column maxima
    columns[lo:hi] of span (_column_span): numba's loop over float32 and float64 rows (not
    the vector fold) folds on to end on a whole pass (FOLD_PASS_BYTES) where that reads at
    most a cache line past the row and the row has no padding after it; else 0. The
    windows read no column past hi, and a -0 there only makes the scan look at
    columns[lo:hi] for one (_columns_hold_ties). Its Python (``py_func``) serves
    _serves_rows."""
    pass_elements = FOLD_PASS_BYTES // itemsize
    past_end = ((hi - lo + pass_elements - 1) & -pass_elements) - (hi - lo)
    if vector_fold or hi < span or past_end * itemsize > LINE_BYTES:
        past_end = 0
    return past_end


# The kind of window arrives as literal arguments, as column_units' does.
@kernel()
def row_units(
    unit_begin,
    unit_end,
    x,
    y,
    lowest,
    axes,
    taps,
    tap_offsets,
    window_width,
    window_step,
    check_ties,
    vector_fold,
    whole_passes,
):
    """MaxPool without Indices over two axes, a whole output row a unit, the way
    column_units takes it (the window's input rows folded into one row of column maxima,
    the taps along the row taken from those, zeros and NaNs taken again in row-major order
    where they may differ), with what a run's units share found once per run.

    A unit's plane and output row step as two counters, and its window's input rows are
    found from them; where the window's columns lie in the input and the padding around
    them are the same for every unit and are set once. column_units finds all of these
    again at each unit, in loops over any number of axes, and keeps them in registers its
    loops then lack: over the resnet stem's MaxPool (3x3 at stride 2 over 112x112 planes)
    on one core this kernel took 0.87 of its time. ``whole_passes`` (a kind, from
    _past_end): the fold of float32 and float64 rows runs on to whole passes of numba's
    loop past the row's end; the other kinds fold no further than the row, and compile no
    bound for the input's end in their loop (short rows and 8-bit ones took 1.04 to 1.08x
    as long with it)."""
    height = axes[AXIS_IN, 0]
    width = axes[AXIS_IN, 1]
    out_height = axes[AXIS_OUT, 0]
    out_width = axes[AXIS_OUT, 1]
    row_step = axes[AXIS_STRIDE, 0]
    row_dilation = axes[AXIS_DILATION, 0]
    top_pad = axes[AXIS_PAD_BEGIN, 0]
    row_extent = axes[AXIS_EXTENT, 0]
    k_height = taps[taps.shape[0] - 1, 0] + 1
    k_last = taps[taps.shape[0] - 1, 1] + 1
    step = np.uint64(axes[AXIS_STRIDE, 1])
    dilation = axes[AXIS_DILATION, 1]
    span_start, span, lo, hi = _column_span(
        0, out_width, axes[AXIS_STRIDE, 1], axes[AXIS_EXTENT, 1], axes[AXIS_PAD_BEGIN, 1], width
    )
    past_end = _past_end(lo, hi, span, x.itemsize, vector_fold)
    in_plane = height * width
    out_plane = out_height * out_width
    columns = empty(span + past_end, x.dtype)
    _pad_columns(columns, lo, hi, span, lowest)
    row_starts = empty(k_height, np.int64)
    column_start = empty(1, np.int64)
    starts = empty(2, np.int64)  # the window's first input row, for the retake
    prefetching = x.size * x.itemsize >= PREFETCH_INPUT_BYTES
    nc, row = divmod(unit_begin, out_height)
    for _ in range(unit_begin, unit_end):
        top = row * row_step - top_pad  # the window's first input row
        plane_start = nc * in_plane
        inside_rows = 0
        for window_row in range(k_height):
            input_row = top + window_row * row_dilation
            if 0 <= input_row < height:
                row_starts[inside_rows] = plane_start + input_row * width + span_start + lo
                inside_rows += 1
        out_begin = np.uint64(nc * out_plane + row * out_width)
        if inside_rows == 0 or lo == hi:  # no tap inside the input
            start_maxima(y, None, out_begin, out_width, lowest)
        else:
            fold_end = hi
            if whole_passes:  # no further than the input's end
                fold_end = min(hi + past_end, x.size - row_starts[inside_rows - 1] + lo)
            negative_zero = _fold_column_rows(
                columns, lo, fold_end, x, row_starts, inside_rows, vector_fold, True, lowest
            )
            if prefetching:
                # the rows the next units read: as many as an output row steps over
                prefetch_ahead(
                    x,
                    np.uint64(row_starts[inside_rows - 1]),
                    np.uint64((hi - lo) * row_step),
                )
            suspect, nans, told = _row_windows(
                columns,
                y,
                out_begin,
                out_width,
                window_width,
                window_step,
                step,
                dilation,
                k_last,
                check_ties,
                lowest,
            )
            # on the literal first: int8 and uint8 compile no retake
            if check_ties and suspect:
                if _columns_hold_ties(
                    columns, column_start, lo, hi, inside_rows, nans, negative_zero or not told
                ):
                    starts[0] = top
                    _retake_ties(
                        y,
                        out_begin,
                        out_width,
                        0,
                        plane_start + top * width,
                        top >= 0 and top + row_extent <= height,
                        starts,
                        lowest,
                        x,
                        axes,
                        taps,
                        tap_offsets,
                    )
        row += 1
        if row == out_height:
            row = 0
            nc += 1
    release(columns, row_starts, column_start, starts)


def _serves(request):
    """Every MaxPool without Indices: (width, step) of column_kind, check_ties (zeros and
    NaNs, which int8 and uint8 lack, are taken again), vector_fold (8- and 16-bit elements)
    and fold_planes (folds_planes, for this split's runs of units)."""
    plan, split = request
    return (
        *column_kind(plan.kernel_shape[-1], plan.strides[-1], plan.dilations[-1]),
        plan.dtype.kind not in "iu",
        plan.dtype.itemsize <= 2,
        folds_planes(plan.spatial_in, plan.out_shape[2:], split.block, split.units, split.chunks),
    )


FAMILY = Family(
    column_units,
    ops=("MaxPool",),
    serves=_serves,
    kinds=lambda op, dtype: tuple(
        (width, step, dtype.kind not in "iu", dtype.itemsize <= 2, fold_planes)
        for width, step in COLUMN_KINDS
        for fold_planes in (False, True)
    ),
    arguments=("lowest", "axes", "taps", "tap_offsets", "block"),
    examples=(
        # 2-D: output rows split into blocks (one channel, three output rows), and
        # windows one input row high; row_units takes the others
        ("MaxPool", (1, 1, 5, 61), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ("MaxPool", (2, 8, 9, 11), dict(kernel_shape=[1, 3], strides=[2, 2])),
        ("MaxPool", (2, 8, 7, 9, 11), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2])),
        ("MaxPool", (2, 8, 30), dict(kernel_shape=[4], strides=[1])),
    ),
)


def _serves_rows(request):
    """MaxPool without Indices over two axes, windows more than one input row high (one
    row is a copy, which column_units makes), whole output rows: (width, step) of
    column_kind, check_ties and vector_fold, as column_units takes them, and whole_passes
    (_past_end is not 0)."""
    plan = request.plan
    if len(plan.kernel_shape) != 2 or plan.kernel_shape[0] == 1:
        return None
    vector_fold = plan.dtype.itemsize <= 2
    axes = plan.geometry["axes"]
    _, span, lo, hi = _column_span.py_func(
        0,
        axes[AXIS_OUT, 1],
        axes[AXIS_STRIDE, 1],
        axes[AXIS_EXTENT, 1],
        axes[AXIS_PAD_BEGIN, 1],
        axes[AXIS_IN, 1],
    )
    past_end = _past_end.py_func(lo, hi, span, plan.dtype.itemsize, vector_fold)
    return (
        *column_kind(plan.kernel_shape[-1], plan.strides[-1], plan.dilations[-1]),
        plan.dtype.kind not in "iu",
        vector_fold,
        bool(past_end > 0),
    )


ROW_FAMILY = Family(
    row_units,
    ops=("MaxPool",),
    serves=_serves_rows,
    kinds=lambda op, dtype: tuple(
        (width, step, dtype.kind not in "iu", dtype.itemsize <= 2, whole_passes)
        for width, step in COLUMN_KINDS
        for whole_passes in ((False,) if dtype.itemsize <= 2 else (False, True))
    ),
    arguments=("lowest", "axes", "taps", "tap_offsets"),
    whole_rows=True,
    examples=(
        ("MaxPool", (2, 8, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        # rows folded on past their end to whole passes (whole_passes)
        ("MaxPool", (2, 8, 9, 60), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        (
            "MaxPool",
            (2, 8, 12, 13),
            dict(kernel_shape=[3, 3], strides=[2, 1], dilations=[2, 2], pads=[2] * 4),
        ),
        ("MaxPool", (2, 8, 9, 12), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
        ("MaxPool", (2, 8, 20, 21), dict(kernel_shape=[5, 4], strides=[3, 3], pads=[2] * 4)),
    ),
)
