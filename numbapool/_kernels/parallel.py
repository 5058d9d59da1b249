"""The parallel driver: runs of work units on several threads, each run handed to a serial
entry point (entry.py) through the address of its machine code.

Called by name, numba would link the entry point's code into the driver and optimize and
compile it a second time. The driver instead calls a trampoline (``BlockCall``), a few
lines of LLVM made in this process for each entry point, at its address, with
the run of units, a block of memory that holds the entry point's arguments as numba passes
them (made once per launch), and the data of the call's own arrays; the trampoline loads
the arguments and calls the entry point at its address. The driver's own arguments then
have the same types whatever kernel it runs: it compiles once, and loads from the disk
cache in any later process (its code holds no address), and the kernel's loops compile
once. A trampoline is LLVM's work alone, some milliseconds; a driver is a second or
so of numba's compile.

On Linux the driver is numbapool's pool of threads (pool.py), which the calling thread
and the workers take runs from one at a time. Elsewhere it is ``run_in_parallel``, a
prange that hands numba's scheduler its runs one by one (numba's parallel chunk size 1):
under numba's TBB layer the runs are tasks that the running threads take, the calling
thread included. Either way a thread that lost its core to another process holds up a call
only by the runs it had taken, where numba's default, one equal share per thread, gives
each thread its whole share up front (docs/performance.md, Under load).

A driver (its kernels) that is neither compiled in this process nor in the disk cache
compiles on a thread of its own (``ready_driver``), while the call that needed it runs its
units on the calling thread, a piece at a time, until the driver is ready, which then runs
the units left: a first call then costs the kernel's compile, not the driver's as well
(0.3 to 0.5 s), whatever its size. The thread is not a daemon: a process waits for it at
exit, so that the driver reaches the disk cache.
"""

import os
import struct
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _numba
from . import kernel, pool
from .threads import use_chunk_size, use_threads
from .units import chunk_units

# The arrays of a call whose data a trampoline takes from the driver (the call's inputs
# and outputs: the rest of a block is the same on every call of a launch), at most
CALL_ARRAYS = 4
# An array of bytes as the driver takes the call's arrays (their data only: numba's types
# of read-only and writable arrays have one layout, and the driver reads no element), and
# the filler for the slots a call leaves empty
_BYTES = types.Array(types.uint8, 1, "C", readonly=True)
NO_BYTES = np.frombuffer(b"", np.uint8)
# The trampolines' type in numba's calling convention: (unit_begin, unit_end, the block,
# the call arrays' data)
_TRAMPOLINE_ARGUMENTS = (types.int64, types.int64) + (types.voidptr,) * (1 + CALL_ARRAYS)
_INT64 = ir.IntType(64)


@intrinsic
def _call_units(typingctx, address, unit_begin, unit_end, block, call_arrays):
    """Call the trampoline at ``address`` (BlockCall) on units [unit_begin, unit_end), with
    the arguments in ``block`` and the data of ``call_arrays``."""
    if not (
        isinstance(address, types.Integer)
        and isinstance(block, types.Array)
        and isinstance(call_arrays, types.UniTuple)
    ):
        return None

    def codegen(context, builder, signature, args):
        address_value, begin, end, block_value, arrays_value = args
        pointers = [block_value] + [
            builder.extract_value(arrays_value, i) for i in range(CALL_ARRAYS)
        ]
        pointer_types = [signature.args[3]] + [signature.args[4].dtype] * CALL_ARRAYS
        values = [
            context.cast(builder, begin, signature.args[1], types.int64),
            context.cast(builder, end, signature.args[2], types.int64),
        ]
        values += [
            builder.bitcast(
                context.make_array(array_type)(context, builder, value).data, cgutils.voidptr_t
            )
            for array_type, value in zip(pointer_types, pointers)
        ]
        _numba.call_at_address(context, builder, address_value, _TRAMPOLINE_ARGUMENTS, values)
        return context.get_dummy_value()

    return types.none(address, unit_begin, unit_end, block, call_arrays), codegen


@kernel(parallel=True)
def run_in_parallel(address, first_unit, units, chunks, threads, block, call_arrays):
    """Units [first_unit, units) of the serial entry point whose trampoline is at
    ``address`` (BlockCall), with the arguments in ``block`` and the data of
    ``call_arrays``, in ``chunks`` runs on ``threads`` threads."""
    before = use_threads(threads)
    chunk_size_before = use_chunk_size(1)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units - first_unit)
        _call_units(address, first_unit + unit_begin, first_unit + unit_end, block, call_arrays)
    use_chunk_size(chunk_size_before)
    use_threads(before)


# Its one signature
_SIGNATURE = (types.int64,) * 5 + (_BYTES, types.UniTuple(_BYTES, CALL_ARRAYS))


def driver_kernels() -> tuple:
    """The kernels that make the parallel driver here: numbapool's pool (pool.py) where it
    runs, else run_in_parallel."""
    return (pool.run_call, pool.work) if pool.available else (run_in_parallel,)


def call_bytes(arrays: tuple) -> tuple:
    """The driver's call_arrays for ``arrays`` (C-contiguous, at most CALL_ARRAYS): views
    of their bytes."""
    return tuple(
        [np.frombuffer(array, np.uint8) for array in arrays]
        + [NO_BYTES] * (CALL_ARRAYS - len(arrays))
    )


# Each argument the entry point takes in numba's calling convention (an array as its
# fields, a tuple as its members) has a slot of SLOT bytes in the block, its value at the
# slot's start
SLOT = 8
_SLOT_FORMATS = {
    types.int8: "b",
    types.uint8: "B",
    types.int16: "h",
    types.uint16: "H",
    types.int32: "i",
    types.uint32: "I",
    types.int64: "q",
    types.uint64: "Q",
    types.float32: "f",
    types.float64: "d",
    types.boolean: "?",
}
# an array's fields by name (numba's data model orders them: _numba.array_fields): meminfo
# and parent are null (the kernels count no references), then each field's values
_ARRAY_FIELD_VALUES = {
    "meminfo": lambda array: [0],
    "parent": lambda array: [0],
    "nitems": lambda array: [array.size],
    "itemsize": lambda array: [array.itemsize],
    "data": lambda array: [array.ctypes.data],
    "shape": lambda array: list(array.shape),
    "strides": lambda array: list(array.strides),
}


def _slot(code: str) -> str:
    return code + "x" * (SLOT - struct.calcsize("@" + code))


def _flattened(context, numba_type, value) -> list:
    """(slot format, value, field name) of each slot of an argument of ``numba_type``
    (the field name of an array's slots, else None)."""
    if isinstance(numba_type, types.Array):
        fields = _numba.array_fields(context, numba_type)
        values = {name: iter(_ARRAY_FIELD_VALUES[name](value)) for name, _ in fields}
        return [(_slot(code), next(values[name]), name) for name, code in fields]
    if isinstance(numba_type, types.BaseTuple):
        return [
            slot
            for member_type, member in zip(numba_type.types, value)
            for slot in _flattened(context, member_type, member)
        ]
    kind = getattr(numba_type, "literal_type", numba_type)  # a literal as its value's type
    return [(_slot(_SLOT_FORMATS[kind]), value, None)]


class BlockCall(NamedTuple):
    """The driver's way into one compiled entry point for one launch: its trampoline, and
    the block it loads the entry point's arguments from."""

    address: int  # the trampoline, in numba's convention (_TRAMPOLINE_ARGUMENTS)
    block: np.ndarray  # the arguments' slots, read-only bytes


def block_call(compiled, arguments: tuple, call_arrays: int) -> BlockCall:
    """The BlockCall of ``compiled`` (entry.Compiled) for ``arguments`` (after the unit
    range), whose first ``call_arrays`` are arrays that each call of the launch passes
    anew: their data comes with each call (call_bytes), the rest of their fields (shape and
    strides: the same on every call of a launch) and every other argument from the block."""
    flat_types = _numba.flat_argument_types(compiled.context, compiled.argument_types)
    slots = [
        _flattened(compiled.context, numba_type, argument)
        for numba_type, argument in zip(compiled.argument_types, arguments)
    ]
    # the slot of each call array's data (the trampoline takes it from the call; the block
    # keeps this call's there, unread)
    data_slots = tuple(
        sum(map(len, slots[:i])) + [name for _, _, name in slots[i]].index("data")
        for i in range(call_arrays)
    )
    slots = [slot for argument_slots in slots for slot in argument_slots]
    if len(slots) != len(flat_types):  # a type this packing does not know
        raise TypeError(f"numbapool: cannot pass arguments of types {compiled.argument_types}")
    layout = struct.Struct("@" + "".join(code for code, _, _ in slots))
    block = np.frombuffer(layout.pack(*(value for _, value, _ in slots)), np.uint8)
    return BlockCall(_trampoline(compiled, flat_types, data_slots), block)


# (entry point's address, its call arrays' data slots): its trampoline's address, and the
# trampoline's compiled code, kept as long as the process lives, as numba keeps the kernels
_TRAMPOLINES = {}


def _trampoline(compiled, flat_types: tuple, data_slots: tuple) -> int:
    """The address of the trampoline into ``compiled`` (entry.Compiled) that loads its
    arguments, of ``flat_types``, from the block's slots, but those at ``data_slots``,
    which the call arrays' data gives; made and compiled by LLVM once per entry point in
    this process (it holds the entry point's address)."""
    key = compiled.address, data_slots

    def entry_arguments(builder, arguments):
        begin, end, block_pointer, *data = arguments
        values = [
            builder.load(
                builder.bitcast(
                    builder.gep(block_pointer, [_INT64(SLOT * i)]), flat_type.as_pointer()
                )
            )
            for i, flat_type in enumerate(flat_types)
        ]
        for slot, pointer in zip(data_slots, data):
            values[slot] = builder.bitcast(pointer, flat_types[slot])
        return [begin, end] + values

    with _numba.compiler_lock:
        if key not in _TRAMPOLINES:
            _TRAMPOLINES[key] = _numba.compile_trampoline(
                compiled.context,
                f"numbapool_trampoline_{len(_TRAMPOLINES)}",
                _TRAMPOLINE_ARGUMENTS,
                entry_arguments,
                compiled.address,
                (types.int64, types.int64) + tuple(compiled.argument_types),
            )
        return _TRAMPOLINES[key][0]


def _compile():
    """run_in_parallel compiled (or loaded from the disk cache): the compiled function
    itself, which does not check its argument types; where numbapool's pool runs, the
    pool's runner (pool.py) instead."""
    if pool.available:
        return pool.compile_runner()
    # by signature rather than by a first call, which would first look up every numba
    # extension installed (20 ms of a first call in a fresh process)
    run_in_parallel.compile(_SIGNATURE)
    return _numba.compiled_overload(run_in_parallel, _SIGNATURE)[0]


# Whether ready_driver may compile on its own thread (the test suite compiles in place, so
# that every first call it makes runs through the parallel driver)
COMPILE_IN_BACKGROUND = True
_compiling = None  # the Future of the driver compiling on a thread of its own, once started
_compiling_lock = threading.Lock()


def _compile_into(future: Future) -> None:
    try:
        future.set_result(_compile())
    except BaseException as error:  # handed to the call that picks the driver up
        future.set_exception(error)


def _compiled_or_cached() -> bool:
    if pool.available:
        return pool.compiled_already() or pool.in_disk_cache()
    return _SIGNATURE in run_in_parallel.signatures or _numba.in_disk_cache(
        run_in_parallel, _SIGNATURE
    )


def ready_driver():
    """The driver compiled (_compile), if it needs no compile (compiled already, or in
    the disk cache: loaded now); otherwise None, its compile started on a thread of its own
    (once), and its result returned by a call once it is done.

    The thread is not a daemon, so that a process waits for it at exit (and the driver
    reaches the disk cache), and it ends with its compile: no thread stays behind, which
    a fork would warn about."""
    global _compiling
    if not pool.available:  # the pool needs none of numba's threads
        _numba.check_threading_layer()
    with _compiling_lock:
        future = _compiling
        if future is None:
            if not COMPILE_IN_BACKGROUND or _compiled_or_cached():
                return _compile()
            future = Future()
            try:
                threading.Thread(
                    target=_compile_into, args=(future,), name="numbapool-driver"
                ).start()
            except RuntimeError:  # the interpreter is shutting down: no new threads
                return _compile()
            _compiling = future
    return future.result() if future.done() else None


def _started() -> list:
    with _compiling_lock:
        return [] if _compiling is None else [_compiling]


def wait_for_drivers() -> None:
    """Wait until the driver, if it is compiling in the background, is compiled (and
    saved); raise its compile's error."""
    for future in _started():
        future.result()


def _before_fork() -> None:
    # A fork copies numba's compiler lock as the compiling thread holds it, and nothing in
    # the child would ever release it: a fork waits for the compiles first (their errors
    # are for the calls that pick the drivers up)
    wait_for_futures(_started())


def _forget_compiles() -> None:
    # a forked child has no compile thread: its driver compiles anew (or loads)
    global _compiling, _compiling_lock
    _compiling = None
    _compiling_lock = threading.Lock()


os.register_at_fork(before=_before_fork, after_in_child=_forget_compiles)
