"""From a plan to a kernel call: storage views, output allocation and work splitting.

Numba compiles each kernel lazily, once per storage dtype, on its first call (and caches
it on disk), so importing numbapool compiles nothing.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from . import _threads
from ._kernels import choice, columns, global_, parallel, pool, prefetch, unpool
from ._kernels.entry import EntryPoint
from ._kernels.family import (
    SIGNED_BITS,
    STORAGE,
    GlobalRequest,
    Split,
    WindowRequest,
    p_kind,
)
from ._plan import (
    UNDECIDED,
    UnpoolPlan,
    WindowPlan,
    channels_merged_plan,
    freeze_ints,
    global_plan,
    resolve_window_plan,
    window_extents,
)

# Enough work units per thread that uneven units still balance, and enough runs of them
# per thread that the parallel loop's static schedule does too.
_UNITS_PER_THREAD = 4
_CHUNKS_PER_THREAD = 16
# Fewer runs per thread, but no fewer than this, where longer runs let MaxPool fold whole
# input planes (columns.folding_runs): the 3-d case's runs at 16 threads would be two
# output planes, which do not fold; on 2 threads such runs took 1.14 to 1.19 times the
# time of 16 runs per thread, runs of four planes that fold 1.01 to 1.02 times
_FOLDING_CHUNKS_PER_THREAD = 4
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


# Global pooling calls seen, keyed by (op, shape, dtype, p): see _global_call
_GLOBAL_CALLS: dict = {}
_MAX_GLOBAL_CALLS = 1024


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
    storage = STORAGE.get(dtype)
    return array if storage is None else array.view(storage)


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
    split = _work_split(plan, threads)
    request = WindowRequest(plan, split)
    entry, arguments = _kernel_call(request)
    # MaxPool's kernels with Indices: the ones without track no winning taps
    indices_arguments = _kernel_call(request, indices=True) if plan.op == "MaxPool" else None
    launch = plan.launches[threads] = Launch(
        split.units,
        split.chunks,
        entry,
        arguments,
        indices_arguments,
        {},
        STORAGE.get(plan.dtype),
    )
    return launch


def _kernel_call(request, indices: bool = False) -> tuple:
    """(entry point, its arguments after the call's arrays, its kinds last) of the family
    that serves ``request`` (choice.FAMILIES)."""
    family, kinds = choice.choose(request, indices)
    return family.entry_point(kinds), (*family.argument_values(request), *kinds)


def _work_split(plan: WindowPlan, threads: int) -> Split:
    """The Split: outputs per work unit along the last axis, how many
    units, how many contiguous runs of units the parallel loop deals out (0: run serially),
    and how many input rows each run caches.

    A unit is a whole output row unless there are too few rows to keep every thread busy
    (N*C = 1, 1-D inputs); runs are few enough that each allocates its scratch once, and
    MaxPool's over three axes or more long enough to fold whole input planes where that
    leaves four runs per thread. A call with little work runs on the calling thread: waking
    the others costs more than it saves.
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
    if chunks and plan.op == "MaxPool":
        folding = columns.folding_runs(plan.spatial_in, out[2:], block, units)
        if folding >= _FOLDING_CHUNKS_PER_THREAD * threads:
            chunks = min(chunks, folding)
    # Cached input rows per run of units: a power of two, twice the rows of one window, so
    # that the rows the next output row shares are still there. MaxPool caches nothing (0)
    # when consecutive output rows share no input row; the sums always take a row's sum
    # first (docs/semantics.md), through one slot at least.
    window_rows = len(plan.geometry["lead_rows"])
    slots = 1 if window_rows == 1 else min(_MAX_ROW_SLOTS, 1 << (2 * window_rows - 1).bit_length())
    if plan.op == "MaxPool" and not _rows_shared(plan):
        slots = 0
    return Split(block, units, chunks, slots)


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


class InputShape(NamedTuple):
    """An input by its shape (a tuple) and dtype alone: pool_window given one in place of
    an array returns the call's plan and runs nothing (window_plan)."""

    shape: tuple
    dtype: np.dtype


def window_plan(
    op: str,
    shape: tuple,
    dtype: np.dtype,
    kernel_shape,
    strides=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    count_include_pad=0,
    p=2,
    storage_order=0,
) -> WindowPlan:
    """The plan of a windowed pooling call over an input of ``shape`` (a tuple) and
    ``dtype``, validated and resolved, from the cache of pool_window's plans."""
    return pool_window(
        op,
        InputShape(shape, dtype),
        kernel_shape,
        strides,
        pads,
        auto_pad,
        ceil_mode,
        dilations,
        count_include_pad,
        p,
        storage_order,
    )


# pool_window's plans by their arguments; emptied when full
_WINDOW_PLANS: dict = {}
_WINDOW_PLANS_KEPT = 1024


def pool_window(
    op,
    x,
    kernel_shape,
    strides,
    pads,
    auto_pad,
    ceil_mode,
    dilations,
    count_include_pad=0,
    p=2,
    storage_order=0,
    return_indices=False,
):
    """A windowed pooling call from the public function's arguments, by the general path:
    its plan looked up (or resolved, which validates the arguments), then run (run_plan).
    The public functions' own lines (_calls.py) run a repeated call of an array without
    this function; every other call, and a first call, comes here.

    The plans are cached by the arguments, the sequences frozen (freeze_ints), in one flat
    key. The scalars' types join it, since True == 1 == 1.0 and a float flag must not find
    a valid call's plan."""
    if not isinstance(x, np.ndarray) and not isinstance(x, InputShape):
        x = np.asarray(x)
    key = (
        op,
        x.shape,
        x.dtype,
        freeze_ints(kernel_shape),
        freeze_ints(strides),
        freeze_ints(pads),
        auto_pad,
        ceil_mode,
        freeze_ints(dilations),
        count_include_pad,
        p,
        storage_order,
        type(ceil_mode),
        type(count_include_pad),
        type(p),
        type(storage_order),
    )
    try:
        plan = _WINDOW_PLANS[key]
    except KeyError:
        plan = resolve_window_plan(*key[:12])
        if len(_WINDOW_PLANS) >= _WINDOW_PLANS_KEPT:
            _WINDOW_PLANS.clear()
        _WINDOW_PLANS[key] = plan
    except TypeError as error:  # a sequence that holds more than ints: validation names it
        if "unhashable" not in str(error):
            raise
        plan = resolve_window_plan(*key[:12])
    if type(x) is InputShape:
        return plan
    return run_plan(plan, return_indices, x)


def run_plan(plan: WindowPlan, return_indices: bool, x: np.ndarray):
    """A call of ``plan`` on ``x``: by the call prepared at its first (_serial_call) where
    it runs on the calling thread alone, else run_window. Made only for an input of the
    plan's own dtype, which the callers' keys hold."""
    serial_call = plan.serial_calls.get(return_indices)
    if serial_call is None and _threads.get_num_threads() == 1:
        serial_call = plan.one_thread_calls.get(return_indices)
    if serial_call is not None:
        return serial_call(x)
    return run_window(plan, x, return_indices)


def prepared_call(plan: WindowPlan, return_indices: bool):
    """What runs a repeated call of ``plan`` in the public functions' own lines
    (_calls.py), made after its first call. Where that call prepared a call on the calling
    thread alone (plan.serial_calls) without a storage view or Indices:
    ``(function, units, out_shape, dtype, arguments)``, the compiled entry point and what
    it takes after the arrays, called in those lines; a call prepared otherwise: that call;
    anything else: run_plan for this plan, which asks for the thread count at each call."""
    serial_call = plan.serial_calls.get(return_indices)
    if serial_call is None:
        return functools.partial(run_plan, plan, return_indices)
    launch = plan.launches[1]  # a serial plan's, whatever the thread count (run_window)
    if return_indices or launch.storage is not None:
        return serial_call
    function = launch.compiled[False].function
    return (function, launch.units, plan.out_shape, plan.dtype, _python_scalars(launch.arguments))


def _python_scalars(arguments: tuple) -> tuple:
    """``arguments`` with NumPy scalars (the dtype's lowest) as Python's own: the compiled
    function converts its arguments through Python's numbers, and a NumPy scalar first
    becomes a new one on every call (the tiny call 0.98 to 0.99 of the time)."""
    return tuple(value.item() if isinstance(value, np.generic) else value for value in arguments)


def run_window(plan: WindowPlan, x: np.ndarray, return_indices: bool = False):
    """A windowed pooling call from its plan to the kernel.

    What does not depend on the arrays is looked up once (``plan.launches``), and the
    steps are few; the first call that runs on the calling thread alone prepares the call
    that pool_window runs from then on (_serial_call)."""
    # a small call runs on this thread: its split need not depend on the thread count
    threads = 1 if _runs_serially(plan) else _threads.get_num_threads()
    y = np.empty(plan.out_shape, dtype=plan.dtype)
    indices = np.empty(plan.out_shape, dtype=np.int64) if return_indices else None
    if y.size == 0:
        return (y, indices) if return_indices else y
    launch = _launch(plan, threads)
    # unpacked, not read by name: this runs on every call
    (units, chunks, entry, arguments, indices_arguments, compiled, storage) = launch
    # the arrays as one axis each (units.py): a view when x is C-ordered and native;
    # otherwise one copy, which leaves x as it was
    flat_in = np.ascontiguousarray(x, plan.dtype).ravel()
    flat_out = y.ravel()
    if storage is not None:
        flat_in, flat_out = flat_in.view(storage), flat_out.view(storage)
    if return_indices:  # the kernels without Indices track no winning taps
        entry, indices_rest = indices_arguments
        arguments = (indices.ravel(), *indices_rest)
    arguments = (flat_in, flat_out, *arguments)
    entry_point = compiled.get(return_indices) or compiled.setdefault(
        return_indices, entry.compile(arguments)
    )
    if not chunks or threads == 1:
        entry_point.function(0, units, *arguments)
        # made once: an input of another dtype takes this path on every call
        calls = plan.serial_calls if plan.choices.serial else plan.one_thread_calls
        if x.dtype is plan.dtype and return_indices not in calls:
            calls[return_indices] = _serial_call(plan, launch, return_indices, entry_point)
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
    entry_point,
    units,
    chunks,
    threads,
    arguments,
    call_arrays: int,
    compiled: dict,
    key,
    serial_arguments: tuple | None = None,
) -> None:
    """The parallel driver over ``entry_point`` (entry.Compiled), whose first
    ``call_arrays`` arguments are the call's own arrays, the rest the launch's; kept in
    ``compiled[key]`` with its way into the entry point (parallel.BlockCall) once the
    driver is compiled. While it compiles in the background (parallel.ready_driver), the
    entry point runs the units on this thread, a piece at a time; the driver, once ready,
    takes the units left. Once it is ready, a call runs on the calling thread alone
    instead where that has been the faster way for this launch and thread count
    (_threads.Pace: under load). A run on the calling thread alone takes
    ``serial_arguments`` where given (a global pool reads ahead by a thread's share of
    the input), else ``arguments``."""
    if serial_arguments is None:
        serial_arguments = arguments
    driver = compiled.get(key)
    done = 0
    if driver is None:
        piece = -(-units // _SERIAL_PIECES)
        while (ready := parallel.ready_driver()) is None:
            entry_point.function(done, min(units, done + piece), *serial_arguments)
            done += piece
            if done >= units:
                return
        compiled[key] = (ready, parallel.block_call(entry_point, arguments, call_arrays))
        _run_driver(compiled[key], done, units, chunks, threads, arguments, call_arrays)
        return
    pace = _pace(compiled, key, threads)
    serial = pace.serial_now()
    start = time.perf_counter()
    if serial:
        entry_point.function(0, units, *serial_arguments)
    else:
        _run_driver(driver, 0, units, chunks, threads, arguments, call_arrays)
    pace.record(serial, time.perf_counter() - start)


def _pace(compiled: dict, key, threads: int) -> _threads.Pace:
    """The pace of the driver ``compiled[key]`` on ``threads`` threads, made on first use."""
    pace_key = ("pace", key, threads)
    return compiled.get(pace_key) or compiled.setdefault(pace_key, _threads.Pace(threads))


def _run_driver(driver, done, units, chunks, threads, arguments, call_arrays) -> None:
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


class GlobalCall(NamedTuple):
    """What a valid global pooling call needs besides its arrays (_global_call)."""

    out_shape: tuple
    dtype: np.dtype
    rows: tuple  # the input as (N*C, spatial elements)
    entry: EntryPoint  # the serial entry point
    # its trailing arguments, indexed by whether its threads read ahead (_ahead_choice);
    # the one tuple twice for a family whose kernel takes no reads_ahead
    constants: tuple
    storage: np.dtype | None  # the storage dtype of 16-bit floats
    bits: np.dtype | None  # the dtype of the bits GlobalMaxPool compares
    # "entry": the entry point compiled; "alone ahead": alone_ahead_entry's, compiled once
    # the calling thread alone reads ahead; ("driver", reads ahead?): the parallel driver
    # compiled and its parallel.BlockCall; each once met; a thread count: the call on
    # numbapool's pool at that count, once its driver is ready (_pooled_global)
    compiled: dict
    # the entry point of a run on the calling thread alone that reads ahead, where a
    # family of its own serves that (global_.HALF_LINE_FAMILY); else None
    alone_ahead_entry: EntryPoint | None


def _global_call(op: str, shape: tuple, dtype: np.dtype, p: float) -> GlobalCall:
    """The GlobalCall of a global pooling call with these arguments. Validates, and keeps
    the answer for the next call."""
    plan = global_plan(op, shape, dtype)
    request = GlobalRequest(op, plan.dtype, p, channel=plan.rows[1])
    family, kinds = choice.choose(request)
    alone_family, alone_kinds = choice.choose(request._replace(reads_ahead=True, alone=True))
    # the maximum runs over the bits as signed integers (global_.global_max_units)
    bits = SIGNED_BITS[plan.dtype.itemsize] if "row_bits" in family.arrays else None
    plain = (*family.argument_values(request), *kinds)
    kernels = (
        family.entry_point(kinds),
        (
            plain,
            (*family.argument_values(request._replace(reads_ahead=True)), *kinds)
            if "reads_ahead" in family.arguments
            else plain,
        ),
        STORAGE.get(plan.dtype),
        bits,
    )
    if len(_GLOBAL_CALLS) >= _MAX_GLOBAL_CALLS:  # shapes that never repeat: stay bounded
        _GLOBAL_CALLS.clear()
    call = _GLOBAL_CALLS[op, shape, dtype, p] = GlobalCall(
        plan.out_shape,
        plan.dtype,
        plan.rows,
        *kernels,
        {},
        None if alone_family is family else alone_family.entry_point(alone_kinds),
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
    threads = _threads.get_num_threads() if x.size >= _SERIAL_GLOBAL else 1
    pooled = call.compiled.get(threads)
    if pooled is not None and x.flags.c_contiguous:
        return pooled(x)
    # unpacked at once: attribute by attribute would cost a tenth of a tiny call
    out_shape, dtype, rows, entry, constants, storage, bits, compiled, _ = call
    y = np.empty(out_shape, dtype)
    if not rows[0]:
        return y
    # a view when x is C-ordered and native; otherwise one copy, which leaves x as it was
    arrays = _global_arrays(
        np.ascontiguousarray(x, dtype).reshape(rows), y.reshape(rows[0]), storage, bits
    )
    entry_point = compiled.get("entry") or compiled.setdefault(
        "entry", entry.compile((*arrays, *constants[0]))
    )
    # whether a run reads ahead: on the calling thread alone, which reads the whole input,
    # and on the threads, each reading its share (_ahead_choice)
    alone = _ahead_choice(call, x.nbytes, 1)
    guarded = _threads.enter_parallel(threads)
    start = time.perf_counter()
    try:
        if guarded is None:
            choice = alone
            ahead = alone is not None and alone.now()
            entry_point.function(0, rows[0], *arrays, *constants[ahead])
            timed = True
        else:
            choice = _ahead_choice(call, x.nbytes, threads)
            ahead = choice is not None and choice.now()
            # a run on this thread alone (under load, or while the driver compiles) reads
            # as it chose on one thread; before that, as the threads chose, whether reading
            # ahead pays being the processor's, or as the size says where they had no
            # choice to make
            alone_ahead = alone is not None and (
                alone.chosen if alone.chosen is not None else choice is None or ahead
            )
            serial = (*arrays, *constants[alone_ahead])
            timed = ("driver", ahead) in compiled
            _drive(
                entry_point,
                rows[0],
                min(rows[0], _GLOBAL_RUNS_PER_THREAD * threads),
                threads,
                (*arrays, *constants[ahead]),
                len(arrays),
                compiled,
                ("driver", ahead),
                serial,
            )
    finally:
        if guarded:
            _threads.leave_parallel()
    if choice is not None and timed and choice.chosen is None:
        choice.record(ahead, time.perf_counter() - start)
    # made once, its threads' way of reading chosen (which this run's, the last of the
    # trials, may not be): a non-contiguous input takes this path on every call
    if (
        x.dtype == dtype
        and threads not in compiled
        and (choice is None or choice.chosen is not None)
    ):
        way = ahead if choice is None else choice.chosen
        if threads == 1:
            if way:
                _compile_alone_ahead(call, arrays)
            compiled[1] = _serial_global(call, way)
        elif guarded is False and pool.available and ("driver", way) in compiled:
            if alone_ahead:
                _compile_alone_ahead(call, arrays)
            compiled[threads] = _pooled_global(call, threads, way, alone_ahead)
    return y


def _serial_global(call: GlobalCall, ahead: bool) -> Callable:
    """A global pooling call on the calling thread alone, as run_global makes it, for a
    C-ordered input of the call's dtype, reading ahead or not as chosen: a repeated call
    runs only run_global's first lines and these. Against run_global's general lines, on
    one core: over 1x64x7x7 float32 0.74 to 0.80 of the time, over 1x256x112x112 0.985.
    Reading ahead, it runs the call's alone_ahead_entry where it has one (compiled by
    _compile_alone_ahead)."""
    out_shape, dtype, rows, _, constants, storage, bits, compiled, alone_ahead_entry = call
    units = rows[0]
    if ahead and alone_ahead_entry is not None:
        function, arguments = compiled["alone ahead"].function, ()
    else:
        function, arguments = compiled["entry"].function, constants[ahead]
    empty = np.empty

    def serial(x):
        y = empty(out_shape, dtype)
        function(
            0, units, *_global_arrays(x.reshape(rows), y.reshape(units), storage, bits), *arguments
        )
        return y

    serial.reads_ahead = ahead
    serial.alone_ahead = ahead and alone_ahead_entry is not None
    return serial


def _compile_alone_ahead(call: GlobalCall, arrays: tuple) -> None:
    """Compile (or load) the call's alone_ahead_entry for its ``arrays``, where it has one,
    before a run on the calling thread alone first reads ahead through it: not on a
    shape's first call, so that first calls compile only the entry point."""
    if call.alone_ahead_entry is not None and "alone ahead" not in call.compiled:
        call.compiled["alone ahead"] = call.alone_ahead_entry.compile(arrays)


def _ahead_choice(call: GlobalCall, input_bytes: int, threads: int) -> prefetch.AheadChoice | None:
    """Whether ``call``'s runs on ``threads`` threads read ahead, as chosen so far
    (prefetch.AheadChoice, kept in the call's ``compiled``), where its kernel can and each
    thread's share of ``input_bytes`` is large enough for it to matter
    (prefetch.reads_ahead); else None."""
    plain, ahead = call.constants
    if plain is ahead or not prefetch.reads_ahead(input_bytes, threads):
        return None
    key = ("ahead", threads)
    compiled = call.compiled
    return compiled.get(key) or compiled.setdefault(key, prefetch.AheadChoice())


def _global_arrays(rows_in, rows_out, storage, bits) -> tuple:
    """A global pool's arrays as its kernels take them: the input's rows and the output,
    viewed as the storage dtype of 16-bit floats, and for GlobalMaxPool also their bits as
    signed integers."""
    if storage is not None:
        rows_in, rows_out = rows_in.view(storage), rows_out.view(storage)
    if bits is None:
        return rows_in, rows_out
    return rows_in, rows_in.view(bits), rows_out, rows_out.view(bits)


def _pooled_global(call: GlobalCall, threads: int, ahead: bool, alone_ahead: bool) -> Callable:
    """A global pooling call on ``threads`` threads of numbapool's pool, as run_global
    makes it, for a C-ordered input of the call's dtype, once its driver is ready; where
    the pace says so, on the calling thread alone (_serial_global, reading ahead as
    ``alone_ahead``).

    A repeated call runs only run_global's first lines and these. Each line of Python is
    paid again after a call has streamed its input through the caches: over 12.8 MB of
    float32 on 2 threads, the Python of a call took a tenth to a fifth of its time, and
    the four global cases took 0.92 to 0.97 of the time through this function."""
    out_shape, dtype, rows, _, _, _, bits, compiled, _ = call
    units = rows[0]
    runs = min(units, _GLOBAL_RUNS_PER_THREAD * threads)
    key = ("driver", ahead)
    address, block = compiled[key][1]
    pace = _pace(compiled, key, threads)
    alone = _serial_global(call, alone_ahead)
    empty, frombuffer, u8, no_bytes = np.empty, np.frombuffer, np.uint8, parallel.NO_BYTES
    run_on_pool = pool.run
    clock = time.perf_counter

    def pooled(x):
        serially = pace.serial_now()
        start = clock()
        if serially:
            y = alone(x)
        else:
            y = empty(out_shape, dtype)
            x_bytes, y_bytes = frombuffer(x, u8), frombuffer(y, u8)
            if bits is None:
                run_on_pool(
                    address, 0, units, runs, threads, block, (x_bytes, y_bytes, no_bytes, no_bytes)
                )
            else:
                run_on_pool(
                    address, 0, units, runs, threads, block, (x_bytes, x_bytes, y_bytes, y_bytes)
                )
        pace.record(serially, clock() - start)
        return y

    pooled.reads_ahead = ahead
    return pooled


def _serial_call(plan: WindowPlan, launch: Launch, return_indices: bool, entry_point) -> Callable:
    """A call of ``plan`` on the calling thread alone, as run_window makes it, for an input
    of the plan's dtype: the output allocated, the arrays viewed as one axis (``ravel``,
    which copies an input that is not C-ordered), the compiled ``entry_point`` called. On
    a small call these lines and the plan's lookup are its whole time: the tiny case
    (MaxPool 2x2 over 1x3x8x8, one core) took 0.875 of the time through them that it took
    through run_window's general lines, and 0.89 of that again once the kernels took the
    arrays as one axis, viewed by ravel rather than reshape.

    The function is written out for this call (_SERIAL_CALL_LINES), each of its
    arguments a name of its own: against unpacking them from a tuple (``*arguments``) and
    branching on the storage and on Indices at each call, the tiny call takes 0.97 of the
    time. NumPy scalars become Python's own (_python_scalars)."""
    arguments = launch.indices_arguments[1] if return_indices else launch.arguments
    names = {f"argument{i}": value for i, value in enumerate(_python_scalars(arguments))}
    code = _serial_call_code(return_indices, launch.storage is not None, len(names))
    namespace = {
        "empty": np.empty,
        "int64": np.int64,
        "out_shape": plan.out_shape,
        "dtype": plan.dtype,
        "storage": launch.storage,
        "units": launch.units,
        "function": entry_point.function,
        **names,
    }
    exec(code, namespace)
    return namespace["call"]


@functools.cache
def _serial_call_code(return_indices: bool, viewed: bool, count: int):
    """_SERIAL_CALL_LINES compiled, for ``count`` arguments past the arrays, viewing the
    arrays as the storage dtype where ``viewed``: once per form, since compiling them
    for each new call shape took 0.1 ms, a third of a first call over a new shape."""
    view = ".view(storage)" if viewed else ""
    source = _SERIAL_CALL_LINES[return_indices].format(
        flat_in=f"x.ravel(){view}",
        flat_out=f"y.ravel(){view}",
        arguments=", ".join(f"argument{i}" for i in range(count)),
    )
    return compile(source, "<numbapool serial call>", "exec")


# _serial_call's function, by whether it returns Indices
_SERIAL_CALL_LINES = {
    False: """
def call(x):
    y = empty(out_shape, dtype)
    function(0, units, {flat_in}, {flat_out}, {arguments})
    return y
""",
    True: """
def call(x):
    y = empty(out_shape, dtype)
    indices = empty(out_shape, int64)
    function(0, units, {flat_in}, {flat_out}, indices.ravel(), {arguments})
    return y, indices
""",
}


def _float32_blocks(op: str, dtype: np.dtype) -> bool:
    """Whether the global sum takes float32 block sums (docs/semantics.md)."""
    return choice.choose(GlobalRequest(op, dtype))[0] is global_.BLOCK_SUM_FAMILY


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
            global_.global_sum_continue(rows, totals, float(p), p_kind(op, p))
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
        global_.global_sum_finish(totals, np.uint64(sums.done), out, float(p), p_kind(op, p))
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
