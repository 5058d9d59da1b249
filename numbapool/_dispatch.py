"""From a plan to a kernel call: storage views, output allocation and work splitting.

Numba compiles each kernel lazily, once per storage dtype, on its first call (and caches
it on disk), so importing numbapool compiles nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import _threads
from ._kernels import (
    columns,
    fixed,
    global_,
    indexed,
    max_planes,
    maxima,
    parallel,
    planes,
    sums,
    unpool,
    wide,
)
from ._kernels.entry import EntryPoint
from ._plan import (
    BFLOAT16,
    UNDECIDED,
    UnpoolPlan,
    WindowPlan,
    channels_merged_plan,
    global_plan,
    window_extents,
    window_plan,
)

# 16-bit floats reach numba as their bit patterns; see _kernels/codec.py.
_STORAGE = {np.dtype(np.float16): np.dtype(np.uint16), BFLOAT16: np.dtype(np.int16)}

# Enough work units per thread that uneven units still balance, and enough runs of them
# per thread that the parallel loop's static schedule does too.
_UNITS_PER_THREAD = 4
_CHUNKS_PER_THREAD = 16
# Below this many output-taps a call runs on the calling thread.
_SERIAL_WORK = 1 << 15
_MAX_ROW_SLOTS = 64
# Below this many input elements a global pool runs on the calling thread: on 2 threads
# a parallel region took 1.1 to 2.6 times the serial time up to 2**16 elements (7x7 and
# 56x56 channels, each global pool)
_SERIAL_GLOBAL = 1 << 16
# Runs of channels a global pool's parallel loop deals out per thread: each run is a call
# of the kernel, about 50 ns; under numba's TBB layer the running threads take the runs one
# by one, so that a thread without a core holds up a call by the runs it took (against 2
# per thread, the three global cases took 0.90 to 1.07 of the time on a quiet machine, 0.94
# to 1.10 beside a busy core; against 32, 2 took 0.93 of the time over 4x256x56x56, 0.69
# over 1x256x16x16)
_GLOBAL_RUNS_PER_THREAD = 8


# GlobalMaxPool compares floats through their bit patterns as signed integers.
_SIGNED_BITS = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_INF_BITS = {
    np.dtype(np.float16): 0x7C00,
    BFLOAT16: 0x7F80,
    np.dtype(np.float32): 0x7F800000,
    np.dtype(np.float64): 0x7FF0000000000000,
}

# The rank-generic kernels' entry points (the specialized ones: _specialized)
_MAX_POOL_WITH_INDICES = EntryPoint(maxima.max_pool_units_with_indices)
# the summing kernel per kind of p (_p_kind), AveragePool's also for windows 3 taps wide
_SUM_POOLS = {
    (p_kind, three_taps): EntryPoint(sums.sum_pool_units, (p_kind, three_taps))
    for p_kind in range(5)
    for three_taps in ((False, True) if p_kind == 0 else (False,))
}
# MaxPool with Indices over 1-D and 2-D windows, per stride along the rows (1 or 2)
_INDEXED_MAX = {step: EntryPoint(indexed.indexed_max_units, (step,)) for step in (1, 2)}
_GLOBAL_MAX = EntryPoint(global_.global_max_units, inputs=2)  # x and its bits
_BLOCK_SUMS = EntryPoint(global_.block_sum_units)  # GlobalAveragePool narrower than float64
# AveragePool's and LpPool's (p = 2) 3x3 windows over small planes, per (kind of p:
# AveragePool's 0, LpPool's 2, stride along the rows: 1 or 2)
_PLANE_SUMS = {
    (p_kind, step): EntryPoint(planes.plane_sum_units, (p_kind, step))
    for p_kind in (0, 2)
    for step in (1, 2)
}
# the wide windows' kernel per (kind of p: AveragePool's 0, LpPool's 2, stride along
# the rows: wide.COLUMN_STEPS)
_WIDE_SUMS = {
    (p_kind, step): EntryPoint(wide.wide_sum_units, (p_kind, step))
    for p_kind in (0, 2)
    for step in wide.COLUMN_STEPS
}
# the kernels whose units must be whole output rows
# MaxPool's stride-1 2-D windows over small planes, with and without the retake of ties
_MAX_PLANES = {check: EntryPoint(max_planes.max_plane_units, (check,)) for check in (False, True)}
_ROW_KERNELS = (*_PLANE_SUMS.values(), *_WIDE_SUMS.values(), *_MAX_PLANES.values())

# Global pooling calls seen, keyed by (op, shape, dtype, p): see _global_call
_GLOBAL_CALLS: dict = {}
_MAX_GLOBAL_CALLS = 1024


def storage_dtype(dtype: np.dtype) -> np.dtype:
    return _STORAGE.get(dtype, dtype)


def channel_rows(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as a C-ordered (N*C, prod(spatial)) array of the storage dtype.

    A view when the input is already C-ordered and native; otherwise one copy, which
    leaves the caller's array untouched.
    """
    # ascontiguousarray returns the array itself when it is already C-ordered and of dtype
    rows = np.ascontiguousarray(array, dtype=dtype).reshape(array.shape[0] * array.shape[1], -1)
    return as_storage(rows, dtype)


def as_storage(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An array of ``dtype`` as numba receives it: a view of its bits for 16-bit floats."""
    storage = _STORAGE.get(dtype)
    return array if storage is None else array.view(storage)


def lowest_value(dtype: np.dtype):
    """What MaxPool gives for a window with no tap inside the input, in storage form."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return np.array(-np.inf, dtype=dtype).view(storage_dtype(dtype))[()]


class Launch(NamedTuple):
    """What a windowed call on a plan and a thread count passes to its kernels; kept on the
    plan (``_launch``), so a repeated call does no work to build it."""

    units: int  # work units (docs/architecture.md)
    chunks: int  # runs of units the parallel driver deals out; 0: run serially
    entry: EntryPoint  # the serial entry point: (unit_begin, unit_end, x, y, *arguments)
    arguments: tuple  # its trailing arguments, its kinds last
    indices_arguments: tuple  # MaxPool's: (entry point with Indices, its arguments after them)
    compiled: dict  # per Indices?, as met: the entry point, and ("driver", Indices?) the
    # driver with its parallel.BlockCall
    rows_shape: tuple  # (N*C, prod(spatial in)): the input as the kernels take it
    storage: np.dtype | None  # the dtype the kernels see the arrays as, if not the plan's


def _launch(plan: WindowPlan, threads: int) -> Launch:
    """The Launch of this plan on ``threads`` threads."""
    try:
        return plan.launches[threads]
    except KeyError:
        pass
    # the plan of fewer axes that runs this one (None: none), made once for every thread
    # count, so that its own launches serve them all
    choices = plan.choices
    if choices.merged is UNDECIDED:
        merged = channels_merged_plan(plan)
        choices.merged = None if merged is plan else merged
    inner = choices.merged
    if inner is not None:  # the kernels of fewer axes: the same outputs, in the same order
        launch = plan.launches[threads] = _launch(inner, threads)
        return launch
    block, units, chunks, slots = _work_split(plan, threads)
    g = plan.geometry
    whole_rows = block == plan.out_shape[-1]  # the row kernels' units: not parts of rows
    indices_arguments = None
    if plan.op == "MaxPool":
        if _indexed_window(plan) and whole_rows:
            indexed_entry = _INDEXED_MAX[plan.strides[-1]]
            rows = _rows_geometry(plan)
            indices_arguments = (
                indexed_entry,
                (
                    lowest_value(plan.dtype),
                    rows["axes"],
                    rows["tap_outputs"],
                    block,
                    *indexed_entry.kinds,
                ),
            )
        else:
            indices_arguments = (
                _MAX_POOL_WITH_INDICES,
                (
                    g["tap_index_offsets"],
                    lowest_value(plan.dtype),
                    g["axes"],
                    g["taps"],
                    g["tap_offsets"],
                    g["tap_outputs"],
                    g["lead_rows"],
                    block,
                    slots,
                ),
            )
        entry = arguments = None  # without Indices: a specialized kernel (_specialized)
    else:  # AveragePool is the p_kind 0 of the summing kernel
        p_kind = _p_kind(plan.op, plan.p)
        entry = _SUM_POOLS[p_kind, p_kind == 0 and _three_taps(plan)]
        arguments = (
            plan.p,
            _sum_zero(plan),
            g["axes"],
            g["taps"],
            g["tap_offsets"],
            g["tap_outputs"],
            g["lead_rows"],
            g["divisor_counts"],
            block,
            slots,
            *entry.kinds,
        )
    special = _specialized(plan)
    if special is not None and special[0] in _ROW_KERNELS and not whole_rows:
        special = None  # the row kernels take whole output rows: parts of rows go the general way
    if special is None and plan.op == "MaxPool":
        # every MaxPool without Indices that no other kernel serves; its shortest run of
        # units decides whether it folds planes
        special = _columns_special(plan, block, units // chunks if chunks else units)
    if special is not None:
        entry, arguments = special[0], (*special[1], block, *special[0].kinds)
    rows_shape = (plan.in_shape[0] * plan.in_shape[1], math.prod(plan.spatial_in))
    launch = plan.launches[threads] = Launch(
        units, chunks, entry, arguments, indices_arguments, {}, rows_shape, _STORAGE.get(plan.dtype)
    )
    return launch


def _sum_zero(plan: WindowPlan):
    """The zero of the type a windowed sum accumulates in: float64 for float64 input and for
    every LpPool (|x| ** p leaves float32's range for moderate p), else float32."""
    if plan.op == "LpPool" or plan.dtype == np.dtype(np.float64):
        return np.float64(0)
    return np.float32(0)


def _work_split(plan: WindowPlan, threads: int) -> tuple:
    """(block, units, chunks, slots): outputs per work unit along the last axis, how many
    units, how many contiguous runs of units the parallel loop deals out (0: run serially),
    and how many input rows each run caches.

    A unit is a whole output row unless there are too few rows to keep every thread busy
    (N*C = 1, 1-D inputs); runs are few enough that each allocates its scratch once. A call
    with little work runs on the calling thread: waking the others costs more than it saves.
    """
    out = plan.out_shape
    rows = math.prod(out[:-1])
    wanted = _UNITS_PER_THREAD * threads
    if rows >= wanted:
        block = out[-1]
    else:
        block = max(1, -(-out[-1] // -(-wanted // rows)))
    units = rows * -(-out[-1] // block)
    chunks = 0 if _runs_serially(plan) else min(units, _CHUNKS_PER_THREAD * threads)
    # Cached input rows per run of units: a power of two, twice the rows of one window, so
    # that the rows the next output row shares are still there. MaxPool caches nothing (0)
    # when consecutive output rows share no input row; the sums always take a row's sum
    # first (docs/semantics.md), through one slot at least.
    window_rows = len(plan.geometry["lead_rows"])
    slots = 1 if window_rows == 1 else min(_MAX_ROW_SLOTS, 1 << (2 * window_rows - 1).bit_length())
    if plan.op == "MaxPool" and not _rows_shared(plan):
        slots = 0
    return block, units, chunks, slots


def _runs_serially(plan: WindowPlan) -> bool:
    """Whether a call is too small to be worth waking the thread pool (kept on the plan)."""
    choices = plan.choices
    if choices.serial is UNDECIDED:
        work = math.prod(plan.out_shape) * len(plan.geometry["tap_offsets"])
        choices.serial = work < _SERIAL_WORK
    return choices.serial


def _rows_shared(plan: WindowPlan) -> bool:
    """Whether consecutive output rows along the second-to-last axis share input rows."""
    if len(plan.kernel_shape) < 2:
        return False
    return plan.strides[-2] < window_extents(plan.kernel_shape, plan.dilations)[-2]


def _three_taps(plan: WindowPlan) -> bool:
    """Whether the window is 3 taps wide along the last axis, with no dilation and a step
    of 1 or 2 there: AveragePool then sums input rows with sums.three_tap_row_sums."""
    return plan.kernel_shape[-1] == 3 and plan.strides[-1] <= 2 and plan.dilations[-1] == 1


def _plane_window(plan: WindowPlan) -> bool:
    """Whether planes.plane_sum_units serves the window: AveragePool's or LpPool's with
    p = 2, 3x3 taps, strides of 1 or 2, no dilation, pads of 0 or 1, over planes of 2x2 to
    planes.PLANE_ELEMENTS elements."""
    return (
        (plan.op == "AveragePool" or (plan.op == "LpPool" and plan.p == 2.0))
        and plan.kernel_shape == (3, 3)
        and max(plan.strides) <= 2
        and plan.dilations == (1, 1)
        and max(plan.pads_begin + plan.pads_end) <= 1
        and min(plan.spatial_in) >= 2
        and math.prod(plan.spatial_in) <= planes.PLANE_ELEMENTS
    )


def _max_plane_window(plan: WindowPlan) -> bool:
    """Whether max_planes.max_plane_units serves a MaxPool without Indices: 2-D, strides of
    1, a padded plane within max_planes.plane_limit."""
    padded = [
        size + begin + end
        for size, begin, end in zip(plan.spatial_in, plan.pads_begin, plan.pads_end)
    ]
    return (
        len(plan.kernel_shape) == 2
        and plan.strides == (1, 1)
        and math.prod(padded) <= max_planes.plane_limit(plan.kernel_shape, plan.dilations)
    )


def _row_window(plan: WindowPlan, steps) -> bool:
    """Whether a 2-D row kernel (wide.py, indexed.py) can serve the window: 1-D (as the
    2-D window of height 1, _rows_geometry) or 2-D, no dilation, a stride along the rows
    among ``steps``."""
    return len(plan.kernel_shape) <= 2 and set(plan.dilations) == {1} and plan.strides[-1] in steps


def _rows_geometry(plan: WindowPlan) -> dict:
    """The geometry a 2-D row kernel takes: a 1-D window's as the 2-D window of height 1
    over the same elements, whose outputs and Indices are the same, in the same order (an
    axis of length 1 changes no flat index, in either storage order), its divisor counts
    along the row the plan's own (a region's are the whole call's: _plan.region_plan)."""
    if len(plan.kernel_shape) == 2:
        return plan.geometry
    rows = window_plan(
        plan.op,
        (*plan.in_shape[:2], 1, *plan.in_shape[2:]),
        plan.dtype,
        (1, *plan.kernel_shape),
        strides=(1, *plan.strides),
        pads=(0, *plan.pads_begin, 0, *plan.pads_end),
        ceil_mode=plan.ceil_mode,
        count_include_pad=plan.count_include_pad,
        p=plan.p,
        storage_order=plan.storage_order,
    )
    return rows.window_geometry(
        np.concatenate([rows.geometry["divisor_counts"][:1], plan.geometry["divisor_counts"]])
    )


def _wide_window(plan: WindowPlan) -> bool:
    """Whether wide.wide_sum_units serves an AveragePool or LpPool window: a _row_window at
    a stride along the rows in wide.COLUMN_STEPS; over one axis not at a stride of 1 (there
    the generic kernel's passes over runs of consecutive elements were faster) and, at a
    stride of 4, at least 4 taps wide (narrower ones read less than the padded row copies);
    for AveragePool not 3 taps wide at strides of 1 and 2 (the generic kernel's
    three_tap_row_sums takes those rows in one loop body, with no padded copy: measured
    faster); for LpPool p = 2 only."""
    step, width = plan.strides[-1], plan.kernel_shape[-1]
    if not _row_window(plan, wide.COLUMN_STEPS):
        return False
    if len(plan.kernel_shape) == 1 and (step == 1 or width < step):
        return False
    if plan.op == "AveragePool":
        return width != 3 or step > 2
    return plan.p == 2.0


def _indexed_window(plan: WindowPlan) -> bool:
    """Whether indexed.indexed_max_units serves a MaxPool with Indices: a _row_window whose
    rows and columns int32s number."""
    return _row_window(plan, _INDEXED_MAX) and max(plan.spatial_in) < 2**31


def _p_kind(op: str, p: float) -> int:
    """The summing kernels' kind: 0 a mean (AveragePool, GlobalAveragePool), else how they
    raise to the power p: 1 abs, 2 a square, 3 a cube, 4 pow()."""
    if op in ("AveragePool", "GlobalAveragePool"):
        return 0
    return {1.0: 1, 2.0: 2, 3.0: 3}.get(p, 4)


def run_window(plan: WindowPlan, x: np.ndarray, return_indices: bool = False):
    """A windowed pooling call from its plan to the kernel.

    A repeated call runs only these lines, a few microseconds in all, which is the whole
    time of a small call: what does not depend on the arrays is looked up once
    (``plan.launches``), and the steps are few."""
    y = np.empty(plan.out_shape, dtype=plan.dtype)
    indices = np.empty(plan.out_shape, dtype=np.int64) if return_indices else None
    if y.size == 0:
        return (y, indices) if return_indices else y
    # a small call runs on this thread: its split need not depend on the thread count
    threads = 1 if _runs_serially(plan) else _threads.get_num_threads()
    # unpacked, not read by name: this runs on every call
    (units, chunks, entry, arguments, indices_arguments, compiled, rows_shape, storage) = _launch(
        plan, threads
    )
    # a view when x is C-ordered and native; otherwise one copy, which leaves x as it was
    rows_in = np.ascontiguousarray(x, plan.dtype).reshape(rows_shape)
    rows_out = y.reshape(rows_shape[0], -1)
    if storage is not None:
        rows_in, rows_out = rows_in.view(storage), rows_out.view(storage)
    if return_indices:  # the kernels without Indices track no winning taps
        entry, indices_rest = indices_arguments
        arguments = (indices.reshape(rows_shape[0], -1), *indices_rest)
    arguments = (rows_in, rows_out, *arguments)
    entry_point = compiled.get(return_indices) or compiled.setdefault(
        return_indices, entry.compile(arguments)
    )
    if not chunks:
        entry_point.function(0, units, *arguments)
        return (y, indices) if return_indices else y
    guarded = _threads.enter_parallel(threads)
    try:
        if guarded is None:
            entry_point.function(0, units, *arguments)
        else:
            _drive(
                entry_point,
                units,
                chunks,
                threads,
                arguments,
                2 + return_indices,
                compiled,
                ("driver", return_indices),
            )
    finally:
        if guarded:
            _threads.leave_parallel()
    return (y, indices) if return_indices else y


# A first call whose parallel driver compiles in the background runs its units on the
# calling thread in this many pieces at most, asking after each whether the driver is ready
_SERIAL_PIECES = 64


def _drive(
    entry_point, units, chunks, threads, arguments, call_arrays: int, compiled: dict, key
) -> None:
    """The parallel driver over ``entry_point`` (entry.Compiled), whose first
    ``call_arrays`` arguments are the call's own arrays, the rest the launch's; kept in
    ``compiled[key]`` with its way into the entry point (parallel.BlockCall) once the
    driver is compiled. While it compiles in the background (parallel.ready_driver), the
    entry point runs the units on this thread, a piece at a time; the driver, once ready,
    takes the units left."""
    driver = compiled.get(key)
    done = 0
    if driver is None:
        piece = -(-units // _SERIAL_PIECES)
        while (ready := parallel.ready_driver()) is None:
            entry_point.function(done, min(units, done + piece), *arguments)
            done += piece
            if done >= units:
                return
        driver = compiled[key] = (ready, parallel.block_call(entry_point, arguments, call_arrays))
    run, block_call = driver
    run(
        block_call.address,
        done,
        units,
        chunks,
        threads,
        block_call.block,
        parallel.call_bytes(arguments[:call_arrays]),
    )


def _specialized(plan: WindowPlan):
    """(serial entry point, its arguments but the block and its kinds) for a call without Indices
    that a specialized kernel serves, else None; kept on the plan, so that a repeated call
    does no work here. Measured faster than the rank-generic kernels (docs/performance.md):
    a window in fixed.FIXED_WINDOWS (MaxPool, AveragePool, LpPool), AveragePool's and
    LpPool's (p = 2) 3x3 windows at strides of 1 or 2 over small planes
    (planes.plane_sum_units), AveragePool's other
    2-D windows and LpPool's with p = 2 at the steps along the rows of _wide_window, and
    their 1-D ones at steps 2 and 4 (wide.wide_sum_units); every other MaxPool takes the
    input-rows-first columns.column_units for its kind (_columns_special, in _launch)."""
    if plan.choices.special is not UNDECIDED:
        return plan.choices.special
    rank = len(plan.kernel_shape)
    g = plan.geometry
    kernels = None
    if rank in (2, 3) and set(plan.dilations) == {1}:
        key = (1,) * (3 - rank) + plan.kernel_shape + (plan.strides[-1],)
        kernels = fixed.FIXED_WINDOWS.get(key)
    special = None
    if kernels is not None:
        max_units, sum_units = kernels
        if plan.op == "MaxPool":
            special = (
                max_units,
                (lowest_value(plan.dtype), g["axes"], g["taps"], g["tap_offsets"]),
            )
        else:
            special = (
                sum_units[_p_kind(plan.op, plan.p)],
                (
                    float(plan.p),
                    _sum_zero(plan),
                    g["axes"],
                    g["taps"],
                    g["tap_offsets"],
                    g["divisor_counts"],
                ),
            )
    elif _plane_window(plan):
        zero = _sum_zero(plan)
        special = (
            _PLANE_SUMS[_p_kind(plan.op, plan.p), plan.strides[-1]],
            (zero, zero.dtype.type(plan.p), g["axes"], g["divisor_counts"]),
        )
    elif plan.op != "MaxPool" and _wide_window(plan):
        zero = _sum_zero(plan)
        rows = _rows_geometry(plan)
        special = (
            _WIDE_SUMS[_p_kind(plan.op, plan.p), plan.strides[-1]],
            (zero, zero.dtype.type(plan.p), rows["axes"], rows["divisor_counts"]),
        )
    elif plan.op == "MaxPool" and _max_plane_window(plan):
        special = (_MAX_PLANES[plan.dtype.kind not in "iu"], (lowest_value(plan.dtype), g["axes"]))
    plan.choices.special = special
    return special


def _columns_special(plan: WindowPlan, block: int, run_units: int) -> tuple:
    """(entry point, arguments but the block and kinds) of columns.column_units for a
    MaxPool without Indices, its kind chosen for this split into runs of at least
    ``run_units`` units of ``block`` outputs."""
    g = plan.geometry
    # zeros and NaNs are checked for ties only where they exist: not in int8 / uint8
    check_ties = plan.dtype.kind not in "iu"
    vector_fold = plan.dtype.itemsize <= 2  # 8- and 16-bit elements
    kind = columns.column_kind(plan.kernel_shape[-1], plan.strides[-1], plan.dilations[-1])
    fold_planes = columns.folds_planes(plan.spatial_in, plan.out_shape[2:], block, run_units)
    return (
        EntryPoint(columns.column_units, (*kind, check_ties, vector_fold, fold_planes)),
        (lowest_value(plan.dtype), g["axes"], g["taps"], g["tap_offsets"]),
    )


class GlobalCall(NamedTuple):
    """What a valid global pooling call needs besides its arrays (_global_call)."""

    out_shape: tuple
    dtype: np.dtype
    rows: tuple  # the input as (N*C, spatial elements)
    entry: EntryPoint  # the serial entry point
    constants: tuple  # its trailing arguments
    storage: np.dtype | None  # the storage dtype of 16-bit floats
    bits: np.dtype | None  # the dtype of the bits GlobalMaxPool compares
    # "entry": the entry point compiled; "driver": the parallel driver compiled and its
    # parallel.BlockCall; each once met
    compiled: dict


def _global_call(op: str, shape: tuple, dtype: np.dtype, p: float) -> GlobalCall:
    """The GlobalCall of a global pooling call with these arguments. Validates, and keeps
    the answer for the next call."""
    plan = global_plan(op, shape, dtype)
    storage = _STORAGE.get(plan.dtype)
    if op == "GlobalMaxPool":
        bits = _SIGNED_BITS[plan.dtype.itemsize]
        kernels = (
            _GLOBAL_MAX,
            (
                bits.type(np.iinfo(bits).max),
                bits.type(_INF_BITS[plan.dtype]),
                bits.type(8 * bits.itemsize - 1),
            ),
            storage,
            bits,
        )
    elif _float32_blocks(op, plan.dtype):
        kernels = (_BLOCK_SUMS, (), storage, None)
    else:
        p_kind = _p_kind(op, p)
        kernels = (
            global_.global_sum_entry(p_kind, plan.dtype.itemsize < 8),
            (float(p), p_kind),
            storage,
            None,
        )
    if len(_GLOBAL_CALLS) >= _MAX_GLOBAL_CALLS:  # shapes that never repeat: stay bounded
        _GLOBAL_CALLS.clear()
    call = _GLOBAL_CALLS[op, shape, dtype, p] = GlobalCall(
        plan.out_shape, plan.dtype, plan.rows, *kernels, {}
    )
    return call


def run_global(op: str, x, p: float = 2.0) -> np.ndarray:
    """A global pooling call from the public function to the kernel.

    A repeated call runs only this function's lines: each step is paid again per call, and
    after a large call has streamed through the caches each one runs on cold caches, so
    the steps are few: one lookup finds all that does not depend on the arrays."""
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    call = _GLOBAL_CALLS.get((op, x.shape, x.dtype, p)) or _global_call(op, x.shape, x.dtype, p)
    # unpacked at once: attribute by attribute would cost a tenth of a tiny call
    out_shape, dtype, rows, entry, constants, storage, bits, compiled = call
    y = np.empty(out_shape, dtype)
    if not rows[0]:
        return y
    # a view when x is C-ordered and native; otherwise one copy, which leaves x as it was
    rows_in = np.ascontiguousarray(x, dtype).reshape(rows)
    rows_out = y.reshape(rows[0])
    if storage is not None:
        rows_in, rows_out = rows_in.view(storage), rows_out.view(storage)
    if bits is None:
        arrays = (rows_in, rows_out)
    else:  # the maximum runs over the bits as signed integers (global_.global_max_units)
        arrays = (rows_in, rows_in.view(bits), rows_out, rows_out.view(bits))
    arguments = (*arrays, *constants)
    entry_point = compiled.get("entry") or compiled.setdefault("entry", entry.compile(arguments))
    threads = _threads.get_num_threads() if x.size >= _SERIAL_GLOBAL else 1
    guarded = _threads.enter_parallel(threads)
    try:
        if guarded is None:
            entry_point.function(0, rows[0], *arguments)
        else:
            _drive(
                entry_point,
                rows[0],
                min(rows[0], _GLOBAL_RUNS_PER_THREAD * threads),
                threads,
                arguments,
                len(arrays),
                compiled,
                "driver",
            )
    finally:
        if guarded:
            _threads.leave_parallel()
    return y


def _float32_blocks(op: str, dtype: np.dtype) -> bool:
    """Whether the global sum takes float32 block sums (docs/semantics.md)."""
    return op == "GlobalAveragePool" and dtype.itemsize < 8


class RunningSums(NamedTuple):
    """A global sum carried across consecutive slabs of its channels (numbapool.dask)."""

    totals: np.ndarray  # float64, one per channel
    lanes: np.ndarray | None  # float32 block sums: the lanes of each channel's open block
    done: int  # elements of each channel added so far


def start_global_sums(op: str, channels: int, dtype: np.dtype) -> RunningSums:
    lanes = np.zeros((channels, global_.LANES), np.float32) if _float32_blocks(op, dtype) else None
    return RunningSums(np.zeros(channels), lanes, 0)


def continue_global_sums(
    op: str, x: np.ndarray, dtype: np.dtype, sums: RunningSums, p: float = 2.0
) -> RunningSums:
    """``sums`` with the slab ``x`` added, as the in-memory call adds it: a global sum
    split over consecutive slabs, bit for bit. New arrays: the caller's stay as they were."""
    totals = np.array(sums.totals, dtype=np.float64)
    lanes = None if sums.lanes is None else np.array(sums.lanes, dtype=np.float32)
    if x.size:
        rows = channel_rows(x, dtype)
        if lanes is None:
            global_.global_sum_continue(rows, totals, float(p), _p_kind(op, p))
        else:
            global_.block_sum_continue(rows, totals, lanes, np.uint64(sums.done))
    return RunningSums(totals, lanes, sums.done + math.prod(x.shape[2:]))


def finish_global_sums(
    op: str, sums: RunningSums, dtype: np.dtype, out_shape: tuple, p: float = 2.0
) -> np.ndarray:
    """The result of a global sum from its running sums over whole channels."""
    y = np.empty(out_shape, dtype=dtype)
    out = as_storage(y.reshape(-1), dtype)
    totals = np.ascontiguousarray(sums.totals, dtype=np.float64)  # only read
    if sums.lanes is None:
        global_.global_sum_finish(totals, np.uint64(sums.done), out, float(p), _p_kind(op, p))
    else:  # a copy of the lanes: the last block's tree empties them
        global_.block_sum_finish(
            totals, np.array(sums.lanes, dtype=np.float32), np.uint64(sums.done), out
        )
    return y


def run_unpool(plan: UnpoolPlan, x: np.ndarray, indices: np.ndarray):
    y = np.zeros(plan.out_shape, dtype=plan.dtype)
    if x.size == 0:
        return y
    flat_x = as_storage(np.ascontiguousarray(x, dtype=plan.dtype).reshape(-1), plan.dtype)
    flat_indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    unpool.max_unpool(flat_x, flat_indices, as_storage(y.reshape(-1), plan.dtype))
    return y
