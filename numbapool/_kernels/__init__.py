"""numba kernels, one module per family (docs/architecture.md has the table of which serves
which call): units (shared work units), maxima, sums, fixed, columns, planes (windowed pools),
global_, unpool; codec (16-bit float elements), threads, prefetch, vectors (explicit vector
loops), scratch (scratch arrays)."""

from numba import njit

from .._cache import CACHE_DIRECTORY, locked_cache
from .literal_kinds import LiteralKindsCompiler


def kernel(**options):
    """``numba.njit(**options)`` for a kernel: free of the GIL while it runs, compiling only
    the branches its literal kinds take (literal_kinds.py), and cached on disk where numba
    can, with saves that take turns across processes (_cache.locked_cache)."""
    def decorate(function):
        dispatcher = njit(nogil=True, pipeline_class=LiteralKindsCompiler, **options)(function)
        if CACHE_DIRECTORY is not None:
            dispatcher._cache = locked_cache(function)
        return dispatcher
    return decorate
