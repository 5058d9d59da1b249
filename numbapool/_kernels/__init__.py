"""numba kernels, one module per family (docs/architecture.md has the table of which serves
which call): units (shared work units), maxima, sums, fixed, columns, planes (windowed pools),
global_, unpool; codec (16-bit float elements), threads, prefetch, vectors (the tools of
explicit vector loops; global_vectors and max_vectors, the families' loops), scratch (scratch
arrays and flat views)."""

import contextlib
import gc
import threading

from numba import njit

from .. import _numba
from .._cache import CACHE_DIRECTORY

_compiles_running = 0
_collector_was_enabled = False
_compiles_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while a kernel compiles on the calling
    thread (EntryPoint.compile; a warmup's tasks), and enabled again when the last such
    compile running ends if it was enabled when the first began.

    A compile makes hundreds of thousands of objects that live until it ends, and the
    collector passed over them again and again, and over every object numba keeps in its
    collections of the oldest generation (docs/performance.md: a sixth of a warmup's
    time). Paused, the compile's garbage is collected after it, in one pass."""
    global _compiles_running, _collector_was_enabled
    with _compiles_lock:
        if _compiles_running == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _compiles_running += 1
    try:
        yield
    finally:
        with _compiles_lock:
            _compiles_running -= 1
            if _compiles_running == 0 and _collector_was_enabled:
                gc.enable()


# numba.njit's options for a helper compiled once per argument types for LLVM to inline
# into the kernels that call it (also the jit_options of such an overload): compiled as
# those kernels are, free of the GIL and of reference counting, and without the wrappers
# that would let Python call it (only kernels do), each a compile of its own
# (_numba.INLINED_OPTIONS).
INLINED = {"forceinline": True, "nogil": True, **_numba.INLINED_OPTIONS}


def inlined(**options):
    """``numba.njit`` with INLINED and ``options``."""
    return njit(**INLINED, **options)


def kernel(**options):
    """``numba.njit(**options)`` for a kernel: free of the GIL while it runs, compiling only
    the branches its literal kinds take (_numba.LiteralKindsCompiler), and cached on disk
    where numba can, with saves that take turns across processes (_numba.njit_cached).

    Compiled without numba's reference counting: a kernel frees its own scratch arrays
    (scratch.py); and without numba's C wrapper, a compile of its own: Python calls a
    kernel through its Python wrapper, the parallel driver and other kernels at its own
    address (_numba.KERNEL_OPTIONS)."""
    options = {
        "nogil": True,
        "pipeline_class": _numba.LiteralKindsCompiler,
        **_numba.KERNEL_OPTIONS,
        **options,
    }

    def decorate(function):
        if CACHE_DIRECTORY is None:
            return njit(**options)(function)
        return _numba.njit_cached(function, **options)

    return decorate
