"""Where numba keeps numbapool's compiled kernels on disk, and whether it can.

numba picks the first writable place among NUMBA_CACHE_DIR, ``__pycache__`` beside the
kernels and a per-user directory, and raises at import when none is writable. numbapool
decides once, before its kernels are defined: when ``NUMBA_CACHE_DIR`` is set only that
directory counts (falling back elsewhere would write where the user said not to), and
when no place is writable the kernels compile in every process, after one warning.
Processes sharing the directory save their compiled kernels in turns (locked_cache).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import warnings

import numba
from numba.core import caching
from numba.core.runtime import rtsys

try:
    import fcntl
except ImportError:  # Windows: saves go unlocked, as numba's own do
    fcntl = None

KERNEL_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernels")
_KERNEL_MODULES = ("maxima", "indexed", "sums", "fixed", "columns", "planes", "max_planes",
                   "wide", "global_", "unpool", "parallel")


def _writable(path: str) -> str | None:
    """None if ``path`` can hold cache files (created if missing), else why not."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    return None


def _locate() -> tuple[str | None, str | None]:
    """(directory numba will cache the kernels in, why there is none)."""
    if numba.config.CACHE_DIR:
        problem = _writable(numba.config.CACHE_DIR)
        if problem:
            return None, f"NUMBA_CACHE_DIR={numba.config.CACHE_DIR!r}: {problem}"
    try:  # numba's own search, so that the answer is where numba will write
        implementation = getattr(caching, "CacheImpl", None) or caching._CacheImpl
        locator_classes = implementation._locator_classes
    except (ImportError, AttributeError):  # another numba: let it decide
        return "(chosen by numba)", None
    source = os.path.join(KERNEL_DIRECTORY, "maxima.py")
    for locator_class in locator_classes:
        try:
            locator = locator_class.from_function(_locate, source)
        except Exception:  # a locator that does not apply to a plain module
            locator = None
        if locator is not None:
            return locator.get_cache_path(), None
    return None, f"no writable cache location for {KERNEL_DIRECTORY!r}"


CACHE_DIRECTORY, CACHE_PROBLEM = _locate()
if CACHE_PROBLEM is not None:
    warnings.warn(f"numbapool: compiled kernels will not be cached on disk ({CACHE_PROBLEM}); "
                  "every process compiles them again", RuntimeWarning)


def cache_contents() -> dict[str, dict]:
    """Kernel name -> {"files": compiled objects on disk, "bytes": their size}. Objects of
    earlier numbapool or numba versions count until numba replaces them."""
    if CACHE_DIRECTORY is None or not os.path.isdir(CACHE_DIRECTORY):
        return {}
    contents: dict[str, dict] = {}
    for entry in os.scandir(CACHE_DIRECTORY):
        module, _, rest = entry.name.partition(".")
        if entry.name.endswith(".nbc") and module in _KERNEL_MODULES:
            kernel = contents.setdefault(f"{module}.{rest.split('-')[0]}", {"files": 0, "bytes": 0})
            kernel["files"] += 1
            kernel["bytes"] += entry.stat().st_size
    return dict(sorted(contents.items()))


@contextlib.contextmanager
def _exclusive(path: str):
    """Hold an exclusive advisory lock on the file at ``path`` (created if missing)."""
    if fcntl is None:
        yield
        return
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:  # a file system without locks (some network ones): as numba does
            pass
        yield  # closing the file releases the lock


class _LockedIndex(caching.IndexDataCacheFile):
    """numba's index and data files of one function, saved in turns (locked_cache)."""

    def save(self, key, data):
        with _exclusive(self._index_path + ".lock"):
            entries = self._load_index()
            name = entries.get(key)
            if name is None:
                taken = set(entries.values())
                name = next(name for name in map(self._data_name, itertools.count(1))
                            if name not in taken)
            self._save_data(name, data)
            if entries.get(key) != name:
                entries[key] = name
                self._save_index(entries)


class _KernelCache(caching.FunctionCache):
    """numba's disk cache of one kernel: saves take turns across processes (_LockedIndex),
    and a load sets up only what loading compiled code needs."""

    def __init__(self, function):
        super().__init__(function)
        index = self._cache_file
        self._cache_file = _LockedIndex(index._cache_path, self._impl.filename_base,
                                        index._source_stamp)

    def holds(self, sig, target_context) -> bool:
        """Whether the cache has an entry for ``sig``, without loading it."""
        return self._enabled and (self._index_key(sig, target_context.codegen())
                                  in self._cache_file._load_index())

    def load_overload(self, sig, target_context):
        # numba refreshes the whole target context before a load: it imports and installs
        # every registry of its typing and lowering (and, through numba.np.linalg, scipy's
        # linalg where scipy is installed), 0.2 to 0.5 s of a warm first call. Compiled
        # code needs only numba's runtime, which is what numba's refresh starts with; a
        # compile, on a miss, refreshes the context itself (numba's CompilerBase).
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


def locked_cache(function) -> caching.FunctionCache:
    """numba's disk cache of ``function``, whose saves take turns across processes.

    numba saves a compiled specialization by reading the function's index of entries,
    numbering a data file after the entries it found, and writing the index back whole.
    Two processes saving entries of one function at once (two specializations, or the same
    one twice) could each write an index without the other's entry, or number their data
    files alike and leave an entry naming the other's data: a later process would load
    code compiled for other argument types. Here a save holds a lock on a file beside the
    index from reading the index to writing it back, and writes the data file before the
    index names it, so a process loading meanwhile finds either no entry or a whole one."""
    return _KernelCache(function)
