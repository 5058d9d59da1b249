"""numbapool's pool of threads, which runs the parallel driver's runs on Linux.

The calling thread publishes a call (the trampoline's address, the runs, the block and the
call arrays' data: parallel.py) in a shared array of int64 slots, then claims runs from
the front of the call's runs while the workers claim from the back: with two threads each
runs a stretch of adjacent runs, as numba's TBB layer gives them. A claim takes the runs
left over the thread count, down to one run (guided scheduling, _claim_runs), and runs
them as one call of the kernel. A worker that has no core, or has not woken yet, claims
nothing, and the others do its share; the calling thread waits only for runs that workers
claimed, never for a run nobody claimed (docs/performance.md, Under load).

After a call a worker spins for a while (_SPINS pauses, some tens of microseconds, giving
its core to any thread that waits for one now and then), then sleeps on a futex (Linux's
wait on a word of memory) until the calling thread wakes it.
A calling thread that waits on a claimed run past _WAIT_SPINS pauses sleeps too, so that a
worker that lost its core can finish on the calling thread's. All of it is compiled code
that holds no GIL: a worker that slept on a Python lock needed the GIL to go on after its
wake, and waited for it up to Python's switch interval (5 ms).

numba's TBB layer makes a task arena for every parallel loop: on 2 threads a call of two
runs took 9.3 us through it and 2.9 us through the pool, and global averages over long
channels and big planes took 0.90 and 0.91 of their time (12.8 MB of float32). Where the
futex is not to be had (not Linux, or a CPU without a syscall number here), ``available``
is False and the driver is numba's (parallel.run_in_parallel).

The pool serves one call at a time; a call made from another Python thread meanwhile runs
its runs on its own thread (``run``). A forked child starts a pool of its own at its first
parallel call; the workers end at the process's exit (``Pool.stop``).
"""

import atexit
import ctypes
import os
import platform
import sys
import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _numba
from . import inlined, kernel
from .units import chunk_units

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)

# The slots of the pool's state, an int64 array; each group on a cache line of its own
# (the call's generation << 32) | (the run after the last left << 16) | the first run left:
# the calling thread claims runs from the front, the workers from the back
_TICKET = 0
_DONE = 8  # the runs done in this call; a futex word the calling thread may sleep on
_FAILED = 9  # whether a run raised
_CALLER_ASLEEP = 10  # whether the calling thread sleeps until the runs are done
_ADDRESS, _FIRST, _UNITS, _RUNS, _HELPERS, _BLOCK, _ARRAYS = 16, 17, 18, 19, 20, 21, 22
_STOP = 32  # set at exit: the workers return
_SLEEPERS = 40  # workers asleep or going to sleep
_WAKE = 48  # the futex word: its low 32 bits change with each wake
_STATE_SLOTS = 56
_LINE_SLOTS = 8  # slots to a cache line of 64 bytes
_RUN_MASK = (1 << 16) - 1
_WORD_MASK = (1 << 32) - 1
# Runs a call may have at most (the ticket's fields)
MOST_RUNS = _RUN_MASK

# Pauses a worker spins through after a call before it sleeps: some tens of microseconds
# (a pause is 65 cycles on Zen 3, 140 on Intel's cores since Skylake), longer than the
# gaps between the calls of a loop
_SPINS = 2000
# Pauses the calling thread spins through waiting on the runs workers claimed before it
# sleeps until they are done: a worker that lost its core to another process can then
# finish its run on the calling thread's core
_WAIT_SPINS = 2000
# Spinning, a thread gives its core to any other thread that waits for it (sched_yield)
# every this many pauses: with more threads than cores (a thread count past the cores a
# container or an affinity mask allows), a spinning worker took the core of the thread
# whose run the call waited on
_YIELD_EVERY = 64

_FUTEX_WAIT_PRIVATE = 128
_FUTEX_WAKE_PRIVATE = 129
_WAKE_ALL = (1 << 31) - 1
# Linux's syscall numbers: futex, sched_yield
_SYSCALL_NUMBERS = {"x86_64": (202, 24), "aarch64": (98, 124)}


def _libc_syscall() -> int:
    """The address of libc's syscall function, or 0."""
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(function, ctypes.c_void_p).value or 0


_MACHINE = platform.machine().lower()
_SYSCALL_ADDRESS = _libc_syscall() if sys.platform.startswith("linux") else 0
_FUTEX, _SCHED_YIELD = _SYSCALL_NUMBERS.get(_MACHINE, (0, 0))
# Whether the pool can run here: Linux, a known syscall number and libc's syscall
available = bool(_SYSCALL_ADDRESS and _FUTEX) and sys.byteorder == "little"


def _element_pointer(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


def _is_state(state, slot, *values) -> bool:
    """Whether the types are an int64 state array, a slot and integer values."""
    return (
        isinstance(state, types.Array)
        and state.dtype == types.int64
        and all(isinstance(value, types.Integer) for value in (slot, *values))
    )


@intrinsic
def _load(typingctx, state, slot):
    """state[slot], read atomically (sequentially consistent)."""
    if not _is_state(state, slot):
        return None

    def codegen(context, builder, signature, args):
        pointer = _element_pointer(context, builder, signature.args[0], *args)
        return builder.load_atomic(pointer, "seq_cst", 8)

    return types.int64(state, slot), codegen


def _slot_and_value(context, builder, signature, args):
    """The pointer to state[slot] and the value as an int64, of (state, slot, value)."""
    pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
    return pointer, context.cast(builder, args[2], signature.args[2], types.int64)


@intrinsic
def _store(typingctx, state, slot, value):
    """state[slot] = value, atomically."""
    if not _is_state(state, slot, value):
        return None

    def codegen(context, builder, signature, args):
        pointer, value = _slot_and_value(context, builder, signature, args)
        builder.store_atomic(value, pointer, "seq_cst", 8)
        return context.get_dummy_value()

    return types.none(state, slot, value), codegen


@intrinsic
def _add(typingctx, state, slot, value):
    """state[slot] += value atomically; the value before."""
    if not _is_state(state, slot, value):
        return None

    def codegen(context, builder, signature, args):
        pointer, value = _slot_and_value(context, builder, signature, args)
        return builder.atomic_rmw("add", pointer, value, "seq_cst")

    return types.int64(state, slot, value), codegen


@intrinsic
def _swap_if(typingctx, state, slot, expected, new):
    """state[slot] = new if it holds expected, atomically; whether it did."""
    if not _is_state(state, slot, expected, new):
        return None

    def codegen(context, builder, signature, args):
        pointer = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(pointer, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(state, slot, types.int64, types.int64), codegen


@intrinsic
def _address_of(typingctx, array, index):
    """The address of array[index], as an int64."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        pointer = _element_pointer(context, builder, signature.args[0], *args)
        return builder.ptrtoint(pointer, _I64)

    return types.int64(array, index), codegen


@intrinsic
def _pause(typingctx):
    """A spin loop's pause: x86's pause, AArch64's yield, else nothing."""

    def codegen(context, builder, signature, args):
        if _MACHINE == "x86_64":
            hint = builder.module.declare_intrinsic(
                "llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), [])
            )
            builder.call(hint, [])
        elif _MACHINE == "aarch64":
            hint = builder.module.declare_intrinsic(
                "llvm.aarch64.hint", fnty=ir.FunctionType(ir.VoidType(), [_I32])
            )
            builder.call(hint, [ir.Constant(_I32, 1)])  # yield
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def _syscall(typingctx, address, number, first, second, third):
    """libc's ``syscall(number, first, second, third, 0, 0)`` through its ``address``."""
    arguments = (address, number, first, second, third)
    if not all(isinstance(a, types.Integer) for a in arguments):
        return None

    def codegen(context, builder, signature, args):
        values = [context.cast(builder, v, t, types.int64) for v, t in zip(args, signature.args)]
        function_type = ir.FunctionType(_I64, [_I64] * 6)
        callee = builder.inttoptr(values[0], function_type.as_pointer())
        zero = ir.Constant(_I64, 0)
        return builder.call(callee, values[1:] + [zero, zero])

    return types.int64(*arguments), codegen


@intrinsic
def _call_runs(typingctx, address, begin, end, block, first, second, third, fourth):
    """Call the trampoline at ``address`` on units [begin, end) with the block and the call
    arrays' data at the given addresses; whether it raised."""
    arguments = (address, begin, end, block, first, second, third, fourth)
    if not all(isinstance(a, types.Integer) for a in arguments):
        return None

    def codegen(context, builder, signature, args):
        address_value, begin_value, end_value, *pointers = args
        values = [begin_value, end_value] + [
            builder.inttoptr(pointer, cgutils.voidptr_t) for pointer in pointers
        ]
        from .parallel import _TRAMPOLINE_ARGUMENTS  # parallel.py imports this module first

        return _numba.call_at_address_failed(
            context, builder, address_value, _TRAMPOLINE_ARGUMENTS, values
        )

    return types.boolean(*arguments), codegen


@inlined()
def _spin(spins, syscall_address, sched_yield):
    """One turn of a spin loop: a pause, and every _YIELD_EVERY turns the core to any
    thread that waits for it."""
    _pause()
    if spins % _YIELD_EVERY == _YIELD_EVERY - 1:
        _syscall(syscall_address, sched_yield, 0, 0, 0)


@inlined()
def _claim_runs(state, generation, from_back, syscall_address, futex):
    """Claim and run this call's runs until none is left, from the front or ``from_back``;
    the thread that does the last run wakes the calling thread if it sleeps. From both
    ends, two threads each run a stretch of adjacent runs, as a split into halves would
    give them.

    A claim takes the runs left over the thread count, at least one, as one call of the
    kernel (guided scheduling): each call pays for its scratch arrays and its first rows,
    and the last claims are single runs, so that the threads end together. On 2 threads,
    with the runs and claims of a 16-thread call, claiming one run at a time took up to
    1.26 times as long (dilated), and claims of a half or a quarter of that size fell
    between."""
    runs = _load(state, _RUNS)
    threads = _load(state, _HELPERS) + 1
    while True:
        ticket = _load(state, _TICKET)
        front = ticket & _RUN_MASK
        back = (ticket >> 16) & _RUN_MASK
        if ticket >> 32 != generation or front >= back:
            return
        take = max(1, (back - front) // threads)
        if from_back:
            run, claimed = back - take, ticket - (take << 16)
        else:
            run, claimed = front, ticket + take
        if not _swap_if(state, _TICKET, ticket, claimed):
            continue
        first = _load(state, _FIRST)
        units = _load(state, _UNITS) - first
        begin = chunk_units(run, runs, units)[0]
        end = chunk_units(run + take - 1, runs, units)[1]
        failed = _call_runs(
            _load(state, _ADDRESS),
            first + begin,
            first + end,
            _load(state, _BLOCK),
            _load(state, _ARRAYS),
            _load(state, _ARRAYS + 1),
            _load(state, _ARRAYS + 2),
            _load(state, _ARRAYS + 3),
        )
        if failed:
            _store(state, _FAILED, 1)
        if _add(state, _DONE, take) + take == runs and _load(state, _CALLER_ASLEEP):
            _syscall(
                syscall_address, futex, _address_of(state, _DONE), _FUTEX_WAKE_PRIVATE, _WAKE_ALL
            )


@kernel()
def work(state, index, syscall_address, futex, sched_yield):
    """A worker's life: wait for a call, claim its runs if the call has a place for worker
    ``index``, and again, until the state's stop slot is set."""
    seen = _load(state, _TICKET) >> 32
    spins = 0
    while True:
        if _load(state, _STOP):
            return
        generation = _load(state, _TICKET) >> 32
        if generation != seen:
            seen = generation
            if index < _load(state, _HELPERS):
                _claim_runs(state, generation, True, syscall_address, futex)
                spins = 0
            else:  # a call on fewer threads: no spinning for it
                spins = _SPINS
            continue
        if spins < _SPINS:
            _spin(spins, syscall_address, sched_yield)
            spins += 1
            continue
        _add(state, _SLEEPERS, 1)
        word = _load(state, _WAKE) & _WORD_MASK
        # a call published since the check above has seen this worker among the sleepers,
        # or this check sees its generation; the wait returns at once if the word changed
        if _load(state, _TICKET) >> 32 == seen and not _load(state, _STOP):
            _syscall(syscall_address, futex, _address_of(state, _WAKE), _FUTEX_WAIT_PRIVATE, word)
        _add(state, _SLEEPERS, -1)
        spins = 0


@kernel()
def run_call(
    address,
    first,
    units,
    runs,
    threads,
    block,
    call_arrays,
    state,
    syscall_address,
    futex,
    sched_yield,
):
    """Units [first, units) of the trampoline at ``address`` (parallel.BlockCall) with the
    arguments in ``block`` and the data of ``call_arrays``, in ``runs`` runs that this
    thread and up to ``threads - 1`` workers claim; whether a run raised."""
    _store(state, _ADDRESS, address)
    _store(state, _FIRST, first)
    _store(state, _UNITS, units)
    _store(state, _RUNS, runs)
    _store(state, _HELPERS, threads - 1)
    _store(state, _BLOCK, _address_of(block, 0))
    _store(state, _ARRAYS, _address_of(call_arrays[0], 0))
    _store(state, _ARRAYS + 1, _address_of(call_arrays[1], 0))
    _store(state, _ARRAYS + 2, _address_of(call_arrays[2], 0))
    _store(state, _ARRAYS + 3, _address_of(call_arrays[3], 0))
    _store(state, _DONE, 0)
    _store(state, _FAILED, 0)
    generation = (_load(state, _TICKET) >> 32) + 1
    _store(state, _TICKET, (generation << 32) | (runs << 16))
    if _load(state, _SLEEPERS) > 0:
        _add(state, _WAKE, 1)
        _syscall(syscall_address, futex, _address_of(state, _WAKE), _FUTEX_WAKE_PRIVATE, _WAKE_ALL)
    _claim_runs(state, generation, False, syscall_address, futex)
    spins = 0
    while _load(state, _DONE) < runs:
        if spins < _WAIT_SPINS:
            _spin(spins, syscall_address, sched_yield)
            spins += 1
            continue
        _store(state, _CALLER_ASLEEP, 1)
        done = _load(state, _DONE)
        # the worker that finishes the last run after this load sees the flag and wakes
        # this thread; the wait returns at once if the count changed since the load
        if done < runs:
            _syscall(syscall_address, futex, _address_of(state, _DONE), _FUTEX_WAIT_PRIVATE, done)
    _store(state, _CALLER_ASLEEP, 0)
    return _load(state, _FAILED) != 0


def _signatures():
    from .parallel import _BYTES, CALL_ARRAYS

    state = types.Array(types.int64, 1, "C")
    run = (types.int64,) * 5 + (_BYTES, types.UniTuple(_BYTES, CALL_ARRAYS), state)
    return run + (types.int64,) * 3, (state,) + (types.int64,) * 4


def compiled_already() -> bool:
    """Whether the pool's kernels are compiled in this process."""
    run_signature, work_signature = _signatures()
    return run_signature in run_call.signatures and work_signature in work.signatures


def in_disk_cache() -> bool:
    """Whether the pool's kernels would load from the disk cache."""
    run_signature, work_signature = _signatures()
    return _numba.in_disk_cache(run_call, run_signature) and _numba.in_disk_cache(
        work, work_signature
    )


_run_compiled = None
_work_compiled = None


def compile_runner():
    """The pool's kernels compiled (or loaded from the disk cache); ``run``, which has the
    parallel driver's arguments."""
    global _run_compiled, _work_compiled
    run_signature, work_signature = _signatures()
    run_call.compile(run_signature)
    work.compile(work_signature)
    _work_compiled = _numba.compiled_overload(work, work_signature)[0]
    _run_compiled = _numba.compiled_overload(run_call, run_signature)[0]
    return run


def _new_state() -> np.ndarray:
    """A zeroed state whose first slot starts a cache line, so that each group of slots
    has a line of its own."""
    raw = np.zeros(_STATE_SLOTS + _LINE_SLOTS, np.int64)
    first = -(raw.ctypes.data // 8) % _LINE_SLOTS
    return raw[first : first + _STATE_SLOTS]


class Pool:
    """The state and the worker threads."""

    def __init__(self) -> None:
        self.state = _new_state()
        self.workers: list[threading.Thread] = []
        self.busy = threading.Lock()
        self.grow_lock = threading.Lock()

    def grow(self, workers: int) -> None:
        """Start workers until there are ``workers``; none once the interpreter shuts down,
        when no thread can start (the calling thread then runs every run)."""
        with self.grow_lock:
            while len(self.workers) < workers and not self.state[_STOP]:
                worker = threading.Thread(
                    target=_work_compiled,
                    args=(self.state, len(self.workers), _SYSCALL_ADDRESS, _FUTEX, _SCHED_YIELD),
                    name=f"numbapool-worker-{len(self.workers)}",
                    daemon=True,
                )
                try:
                    worker.start()
                except RuntimeError:  # the interpreter is shutting down
                    self.state[_STOP] = 1
                    return
                self.workers.append(worker)

    def stop(self) -> None:
        """End the workers (at exit): set the stop slot and wake the sleepers."""
        self.state[_STOP] = 1
        self.state[_WAKE] += 1
        ctypes.CDLL(None).syscall(
            ctypes.c_long(_FUTEX),
            ctypes.c_void_p(self.state.ctypes.data + 8 * _WAKE),
            ctypes.c_int(_FUTEX_WAKE_PRIVATE),
            ctypes.c_int(_WAKE_ALL),
        )
        for worker in self.workers:
            worker.join(timeout=1.0)


_pool: Pool | None = None
_pool_lock = threading.Lock()


def _new_pool() -> Pool:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = Pool()
        return _pool


def run(address, first, units, runs, threads, block, call_arrays) -> None:
    """Units [first, units) of the trampoline at ``address`` in ``runs`` runs on
    ``threads`` threads, the calling thread among them (the parallel driver's arguments);
    on the calling thread alone while another thread's call has the pool."""
    pool = _pool or _new_pool()
    runs = min(runs, MOST_RUNS)
    if len(pool.workers) < threads - 1:
        pool.grow(threads - 1)
    # the pool is this call's unless another thread's call has it: then this call's runs
    # go on this thread alone, with a state of its own
    has_pool = pool.busy.acquire(False)
    try:
        failed = _run_compiled(
            address,
            first,
            units,
            runs,
            threads if has_pool else 1,
            block,
            call_arrays,
            pool.state if has_pool else _new_state(),
            _SYSCALL_ADDRESS,
            _FUTEX,
            _SCHED_YIELD,
        )
    finally:
        if has_pool:
            pool.busy.release()
    if failed:
        raise RuntimeError("numbapool: a kernel raised on a pool thread")


def _stop_at_exit() -> None:
    if _pool is not None:
        _pool.stop()


def _forget_pool() -> None:
    # a forked child has none of the workers: it makes a pool of its own when it needs one
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


atexit.register(_stop_at_exit)
os.register_at_fork(after_in_child=_forget_pool)
