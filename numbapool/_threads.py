"""How many threads a call uses, and when it must not start a parallel region at all.

numba's own ``set_num_threads`` applies to the calling thread only; numbapool keeps a
program-wide count (``set_num_threads``) and a per-block one (``threads``, a context
variable, so each thread and each asyncio task has its own), and passes the one in force
to each parallel call.

On Linux numbapool's parallel calls run on a pool of its own (_kernels/pool.py), which
needs none of numba's threads. Elsewhere they run on numba's threading layer, which numba
chooses at its first parallel region, TBB first where it can load it; the parallel kernel
sets numba's thread count on entry and restores it on exit. TBB's scheduler, like the pool,
keeps a call from waiting on a thread that lost its core: the calling thread takes every
run of units no running thread has started, where OpenMP hands each thread its share up
front and waits for the last. The ``tbb`` wheel, a dependency on the platforms it is built
for, puts its library in the environment's ``lib/``, where the loader does not look;
``make_tbb_loadable`` loads it from there at import, so that numba's own choice can take it
(docs/performance.md, Under load).

Two of numba's threading layers cannot run every parallel region they are given:
- GNU OpenMP ("omp" from PyPI) kills a child forked from a process that already ran a
  parallel region; such a child runs the serial kernels instead. numba's TBB layer shuts
  its workers down before a fork and starts them again after, but only in a fork from the
  main thread (from another, numba warns that TBB may be broken in the child): a child
  forked from another thread runs the serial kernels too. A child of a process whose calls
  ran on the pool starts a pool of its own;
- "workqueue" aborts when two threads enter parallel regions at once; a call that finds
  another call inside one runs its serial kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import operator
import os
import site
import sys
import threading

import numba

from . import _numba
from ._kernels import pool

_program_threads: int | None = None
_block_threads: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "numbapool_threads", default=None
)
_serial_after_fork = False
_workqueue_busy = threading.Lock()
# see _find_whether_lock_is_taken; numbapool's pool, where it runs, takes no lock
_takes_lock: bool | None = False if pool.available else None

# The TBB library numba's tbb layer links to, by platform, as the tbb wheel installs it
# under the environment's (or the user base's) prefix
_TBB_LIBRARY = {
    "linux": ("lib", "libtbb.so.12"),
    "darwin": ("lib", "libtbb.12.dylib"),
    "win32": ("Library/bin", "tbb12.dll"),
}
# The requested layers (NUMBA_THREADING_LAYER) that TBB may serve
_TBB_MAY_SERVE = ("default", "tbb", "safe", "threadsafe")


def make_tbb_loadable() -> str | None:
    """Load the TBB library the ``tbb`` wheel installed, so that numba's threading layer,
    chosen at its first parallel region, can be TBB; the library's path, or None where
    there is none to load or numba's layer is chosen already or another is requested."""
    if _numba.layer_started():
        return None
    if str(numba.config.THREADING_LAYER).lower() not in _TBB_MAY_SERVE:
        return None
    where = _TBB_LIBRARY.get(sys.platform)
    if where is None:
        return None
    for prefix in (sys.prefix, site.getuserbase()):
        path = os.path.join(prefix, *where)
        if os.path.exists(path):
            try:
                if sys.platform == "win32":
                    os.add_dll_directory(os.path.dirname(path))
                ctypes.CDLL(path, mode=getattr(ctypes, "RTLD_GLOBAL", 0))
            except OSError:  # numba then chooses among the layers it can load
                return None
            return path
    return None


def _check_count(n) -> int:
    limit = numba.config.NUMBA_NUM_THREADS
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"thread count must be an int, got {n!r}") from None
    if not 1 <= n <= limit:
        raise ValueError(
            f"thread count must be between 1 and {limit} (NUMBA_NUM_THREADS, set "
            f"before the program starts, raises the limit), got {n}"
        )
    return n


def set_num_threads(n: int | None) -> None:
    """Use ``n`` threads in every numbapool call of the program, from any thread.

    ``None`` goes back to numba's setting of the calling thread (``numba.set_num_threads``,
    by default ``NUMBA_NUM_THREADS``, the number of cores). A ``threads`` block overrides it.
    """
    global _program_threads
    _program_threads = None if n is None else _check_count(n)


@contextlib.contextmanager
def threads(n: int):
    """Use ``n`` threads for numbapool calls made inside this ``with`` block (this thread or
    asyncio task only).

    >>> import numbapool
    >>> with numbapool.threads(1):
    ...     numbapool.get_num_threads()
    1
    """
    token = _block_threads.set(_check_count(n))
    try:
        yield
    finally:
        _block_threads.reset(token)


def get_num_threads() -> int:
    """The number of threads a numbapool call made here would use."""
    if _serial_after_fork:
        return 1
    chosen = _block_threads.get()
    if chosen is None:
        chosen = _program_threads
    return _numba.layer_thread_count() if chosen is None else chosen


def threading_layer() -> str | None:
    """numba's threading layer in force, or None before the first parallel region."""
    try:
        return numba.threading_layer()
    except ValueError:
        return None


def parallel_path() -> str:
    """What runs numbapool's parallel calls here: "pool" (numbapool's own, _kernels/pool.py,
    on Linux) or numba's threading layer by name (None before its first parallel region)."""
    return "pool" if pool.available else f"numba's {threading_layer()} layer"


def enter_parallel(wanted: int) -> bool | None:
    """Whether a kernel call on ``wanted`` threads may start a parallel region: None when it
    must run serially instead, else whether it took the workqueue lock, which
    ``leave_parallel`` then gives back. The parallel kernel itself sets numba's thread count
    to ``wanted`` and restores the caller's (_kernels.threads)."""
    if _serial_after_fork or wanted == 1:
        return None
    guarded = _takes_lock if _takes_lock is not None else _find_whether_lock_is_taken()
    if guarded and not _workqueue_busy.acquire(blocking=False):
        return None
    return guarded


def leave_parallel() -> None:
    _workqueue_busy.release()


def _find_whether_lock_is_taken() -> bool:
    """Whether parallel regions take the workqueue lock; remembered once numba's threading
    layer is chosen, which it is for the life of the process."""
    global _takes_lock
    layer = threading_layer()
    if layer is None:  # not chosen yet: it may turn out to be workqueue
        return True
    _takes_lock = layer == "workqueue" or numba.config.THREADING_LAYER == "workqueue"
    return _takes_lock


# Every this many calls of a launch times the chosen way's lead, the way of running it
# that is not chosen runs once, so that the choice follows the machine's load
PROBE_EVERY = 256
# The last runs of each way whose median is its time
_SAMPLES = 5
# Launches whose first parallel runs, times the thread count, took longer than this always
# run in parallel. That product bounds a serial run, which the pace must take to compare
# the ways: past it, a serial run would be a delay a caller notices, and a thread that
# loses its core costs the call a smaller part of its time (beside a busy core, the
# canonical case past it on 2 threads, 1-d with indices at 24 ms, took 0.66 to 0.88 of
# its 1-thread time)
PACE_LIMIT = 20e-3
# A serial run counts at this part of its time: a parallel way is chosen only where it has
# been faster by a tenth, since under load its runs stall now and then (a thread that lost
# its core mid-run holds the call up), which its median does not show, and since it takes
# cores other work could use. Beside a busy core the global average over big planes ran
# parallel at a median a few percent under its serial one and took 1.14 to 1.17 of its
# 1-thread time.
_SERIAL_WEIGHT = 0.9
# The interval between runs of the way not chosen doubles with each such run that loses,
# up to this many times: beside a busy core a parallel run slows the serial calls of the
# next 20 ms by a few percent (the workers it woke), about 1 ms in all on the global
# average over long channels
_MOST_DOUBLINGS = 4
# After the choice changes to the calling thread, the threads run again after
# PROBE_EVERY / 2**this calls (times the lead), the interval doubling from there: a change
# that a passing load caused (a spinning thread of another library, a burst of other work,
# the first calls of a burst after idle time, caches and workers cold) is undone within 8
# calls, not 256. A change back to the threads probes the calling thread after the full
# interval. In bursts like the bench's (a streaming copy, then 40 ms of calls), against
# 32 calls and early probes after a change back: GlobalMaxPool over 32x2048x7x7 on 2
# threads 0.94 of the time, 632 calls of 6009 on the calling thread against 1924 of 5360
_EARLY_HALVINGS = 5
# Where the calling thread is chosen, the threads run at the latest once its runs since
# they last ran add up to this many seconds, however many calls that is: probing then
# costs about a hundredth of a launch's time beside a busy core (a parallel run there
# about 1 ms, above), and a launch that a passing load sent to the calling thread, whose
# probes lost while it lasted, gets its threads back within a tenth of a second of calls
# once it has passed. Counted in calls alone, the interval reached PROBE_EVERY * 16 calls
# times the lead: LpPool 3x3 on 2 threads, after 30 s beside a busy core, ran on the
# calling thread for another 2.3 s of calls, and in the bench's blocks of 40 ms for the
# rest of its rounds. (Where the threads are chosen, a load that comes shows at once in
# their drift; probing the calling thread as often cost a quiet machine 1.3% of the time.)
_PROBE_SECONDS = 0.1
# The way not chosen runs at once when the chosen way's time has risen by this factor,
# and past half its lead, since the other last ran: the load has changed
_DRIFT = 1.125


class Pace:
    """Whether a call that may go parallel runs on its threads or on the calling thread
    alone, chosen by the time each way took on earlier calls of the same launch.

    A thread that loses its core to another process holds up a parallel call until it
    runs again, which costs the most when the call is short: beside a busy core, parallel
    calls of 0.2 ms took 1.15 to 1.3 times their serial time. A way's time is the median
    of its last _SAMPLES runs, so that one slow run (a thread pool starting, a page fault)
    does not decide. The first run after a change of way, but a way's first, is not
    counted and the way runs again: it pays for the change (a parallel run after a stretch
    of serial ones wakes the workers, and took 1.9 times a parallel run after parallel ones
    on the global average over long channels, slower than a serial run).

    A launch's first _SAMPLES calls run in parallel; if those, times the thread count,
    took less than PACE_LIMIT, the next runs on the calling thread, and then each call
    takes the faster way, a serial run counting at _SERIAL_WEIGHT of its time. The other
    way runs once every PROBE_EVERY calls times the chosen way's lead (the other way's
    time over its own, less one), so that probing costs about 1/PROBE_EVERY of the
    launch's time however wide the lead; the interval doubles with each such run that
    loses (_MOST_DOUBLINGS), starting from a thirty-second of it after the choice changes
    to the calling thread (_EARLY_HALVINGS), and there ends at the latest when the calling
    thread's runs have taken _PROBE_SECONDS. It also runs at once when the chosen way has
    slowed (_DRIFT). A run of the other way faster than the chosen way's time is followed
    by another, so that a change of load moves the choice within a few calls. The results
    are the same either way, bit for bit."""

    __slots__ = (
        "threads",
        "times",
        "medians",
        "calls",
        "long",
        "due",
        "mark",
        "misses",
        "last",
        "again",
        "spent",
    )

    def __init__(self, threads: int) -> None:
        self.threads = threads
        # the last counted runs' seconds, parallel and serial (times _SERIAL_WEIGHT), and
        # their medians
        self.times = ([], [])
        self.medians = [0.0, 0.0]
        self.calls = 0
        self.long = False  # whether the first parallel runs were past PACE_LIMIT
        self.due = 0  # the call on which the other way runs next, once both have run
        self.mark = 0.0  # the chosen way's time when the other way last ran
        # the runs of the other way that lost since the choice last changed, less
        # _EARLY_HALVINGS after a change
        self.misses = 0
        self.last = False  # the way of the last run: serial or not
        self.again = None  # the way the next call runs, after an uncounted run
        self.spent = 0.0  # seconds of the chosen way's runs since the other way last ran

    def serial_now(self) -> bool:
        """Whether this call runs on the calling thread alone."""
        if self.long:
            return False
        self.calls = calls = self.calls + 1
        parallel, serial = self.medians
        if calls <= _SAMPLES:
            return False
        if calls == _SAMPLES + 1:
            self.long = parallel * self.threads >= PACE_LIMIT
            return not self.long
        again = self.again
        if again is not None:
            self.again = None
            return again
        if serial < parallel:  # the calling thread chosen
            return calls < self.due and self.spent < _PROBE_SECONDS
        return calls >= self.due

    def record(self, serial: bool, seconds: float) -> None:
        """Take a run's time, ``serial`` or parallel, into that way's, and set when the
        way not chosen runs next."""
        medians = self.medians
        if serial == (medians[1] < medians[0]):
            self.spent += seconds
        else:
            self.spent = 0.0
        if serial != self.last:  # the first run after a change of way
            self.last = serial
            if self.times[serial]:  # not the first of its way: not counted
                self.again = serial
                return
        if serial:
            seconds *= _SERIAL_WEIGHT
        serial_chosen = medians[1] < medians[0]
        chosen = medians[serial_chosen]
        times = self.times[serial]
        times.append(seconds)
        if len(times) > _SAMPLES:
            del times[0]
        # one copy: calls from several threads may change the list meanwhile
        ordered = sorted(times)
        medians[serial] = ordered[len(ordered) // 2]
        calls = self.calls
        if not self.times[True]:  # the first parallel runs
            return
        if serial and len(self.times[True]) == 1:  # the first serial run: the choice starts
            self.mark = min(medians)
            # the first parallel runs may have paid for starting up (page faults, workers
            # starting): where the serial run beat them, parallel runs again at once
            self.due = calls + 1 if medians[1] < medians[0] else self._probe_after(calls)
        elif (medians[1] < medians[0]) != serial_chosen:  # this run changed the choice
            self.mark = min(medians)
            # back to the threads: the calling thread has just lost, and a load that
            # comes back shows in the threads' drift (below)
            self.misses = 0 if serial_chosen else -_EARLY_HALVINGS
            self.due = self._probe_after(calls)
            self.spent = 0.0
        elif serial == serial_chosen:
            if medians[serial] > max(_DRIFT * self.mark, (self.mark + medians[not serial]) / 2):
                self.due = calls + 1
        else:  # the other way ran: once more next call if it beat the chosen way
            self.mark = chosen
            if seconds < chosen:
                self.due = calls + 1
            else:
                self.misses += 1
                self.due = self._probe_after(calls)

    def _probe_after(self, calls: int) -> int:
        """The call on which the way not chosen runs next, counting from ``calls``."""
        fast, slow = sorted(self.medians)
        lead = slow / fast - 1 if fast > 0 else 1
        doublings = min(self.misses, _MOST_DOUBLINGS)
        return calls + max(1, int(PROBE_EVERY * max(1.0, lead) * 2.0**doublings))


_forking_from_main_thread = True


def _before_fork() -> None:
    global _forking_from_main_thread
    _forking_from_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    global _serial_after_fork, _workqueue_busy
    _workqueue_busy = threading.Lock()
    if pool.available:  # the child's calls start a pool of their own
        return
    layer = threading_layer()
    if layer == "omp" or (layer == "tbb" and not _forking_from_main_thread):
        _serial_after_fork = True


make_tbb_loadable()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
