"""The parallel driver: a prange over runs of work units, each run handed to a serial
entry point (entry.py) through the address of its machine code.

Called by name, numba would link the entry point's code into the driver and optimize and
compile it a second time. Called through its address (an argument, so the driver's code
holds no constant that differs between processes, and loads from the disk cache), the
driver compiles in well under a second per argument types, whatever kernel it runs, and
the kernel's loops compile once.

A driver that is neither compiled in this process nor in the disk cache compiles on a
thread of its own (``ready_driver``), while the call that needed it runs its units on the
calling thread, a piece at a time, until the driver is ready, which then runs the units
left: a first call then costs the kernel's compile, not the driver's as well (0.3 to
0.5 s), whatever its size. The thread is not a daemon: a
process waits for it at exit, so that the driver reaches the disk cache.
"""

import os
import threading
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures

from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel
from .threads import use_threads
from .units import chunk_units


@intrinsic
def _call_units(typingctx, address, unit_begin, unit_end, arguments):
    """Call the numba-compiled function at ``address``, compiled for (int64, int64, *the
    types of ``arguments``) and returning None, on units [unit_begin, unit_end)."""
    if not isinstance(address, types.Integer) or not isinstance(arguments, types.BaseTuple):
        return None
    callee_types = (types.int64, types.int64) + tuple(arguments.types)

    def codegen(context, builder, signature, args):
        address_value, begin, end, packed = args
        values = [context.cast(builder, begin, signature.args[1], types.int64),
                  context.cast(builder, end, signature.args[2], types.int64)]
        values += [builder.extract_value(packed, i) for i in range(len(arguments.types))]
        function_type = context.call_conv.get_function_type(types.none, callee_types)
        callee = builder.inttoptr(address_value, function_type.as_pointer())
        status, _ = context.call_conv.call_function(builder, callee, types.none, callee_types,
                                                    values)
        with cgutils.if_unlikely(builder, status.is_error):
            context.call_conv.return_status_propagate(builder, status)
        return context.get_dummy_value()

    return types.none(address, unit_begin, unit_end, arguments), codegen


@kernel(parallel=True)
def run_in_parallel(address, first_unit, units, chunks, threads, arguments):
    """Units [first_unit, units) of the serial entry point at ``address`` (compiled for
    (int64, int64, *the types of ``arguments``)), in ``chunks`` runs on ``threads``
    threads."""
    before = use_threads(threads)
    for chunk in prange(chunks):
        unit_begin, unit_end = chunk_units(chunk, chunks, units - first_unit)
        _call_units(address, first_unit + unit_begin, first_unit + unit_end, arguments)
    use_threads(before)


def _signature(arguments: tuple) -> tuple:
    return (types.int64,) * 5 + (run_in_parallel.typeof_pyval(arguments),)


def _compile(signature: tuple):
    """run_in_parallel compiled (or loaded from the disk cache) for ``signature``: the
    compiled function itself, which does not check its argument types."""
    # by signature rather than by a first call, which would first look up every numba
    # extension installed (20 ms of a first call in a fresh process)
    run_in_parallel.compile(signature)
    return run_in_parallel.overloads[signature].entry_point


# Whether ready_driver may compile on its own thread (the test suite compiles in place, so
# that every first call it makes runs through the parallel driver)
COMPILE_IN_BACKGROUND = True
_compiles = {}  # signature: the Future of its driver, compiled on a thread of its own
_compiles_lock = threading.Lock()


def _compile_into(future: Future, signature: tuple) -> None:
    try:
        future.set_result(_compile(signature))
    except BaseException as error:  # handed to the call that picks the driver up
        future.set_exception(error)


def ready_driver(arguments: tuple):
    """run_in_parallel for ``arguments`` (their inputs already read-only) and int64 address
    and counts, compiled (_compile), if it needs no compile (compiled already, or in the disk
    cache: loaded now); otherwise None, its compile started on a thread of its own (once
    per signature), and its result returned by a call once it is done.

    The thread is not a daemon, so that a process waits for it at exit (and the driver
    reaches the disk cache), and it ends with its compile: no thread stays behind, which
    a fork would warn about."""
    signature = _signature(arguments)
    with _compiles_lock:
        future = _compiles.get(signature)
        if future is None:
            cache = getattr(run_in_parallel, "_cache", None)
            if (not COMPILE_IN_BACKGROUND or signature in run_in_parallel.overloads
                    or (hasattr(cache, "holds") and cache.holds(signature,
                                                                run_in_parallel.targetctx))):
                return _compile(signature)
            future = Future()
            try:
                threading.Thread(target=_compile_into, args=(future, signature),
                                 name="numbapool-driver").start()
            except RuntimeError:  # the interpreter is shutting down: no new threads
                return _compile(signature)
            _compiles[signature] = future
    return future.result() if future.done() else None


def _started() -> list:
    with _compiles_lock:
        return list(_compiles.values())


def wait_for_drivers() -> None:
    """Wait until every driver compiling in the background is compiled (and saved); raise
    a compile's error."""
    for future in _started():
        future.result()


def _before_fork() -> None:
    # A fork copies numba's compiler lock as the compiling thread holds it, and nothing in
    # the child would ever release it: a fork waits for the compiles first (their errors
    # are for the calls that pick the drivers up)
    wait_for_futures(_started())


def _forget_compiles() -> None:
    # a forked child has no compile thread: its drivers compile anew (or load)
    global _compiles_lock
    _compiles.clear()
    _compiles_lock = threading.Lock()


os.register_at_fork(before=_before_fork, after_in_child=_forget_compiles)
