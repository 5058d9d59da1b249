"""numba kernels, one module per family (docs/architecture.md has the table of which serves
which call): units (shared work units), maxima, sums, fixed, columns (windowed pools),
global_, unpool; codec (16-bit float elements), threads, prefetch."""

from .._cache import CACHE_DIRECTORY

# Every kernel: cached on disk where numba can, and free of the GIL while it runs.
OPTIONS = dict(cache=CACHE_DIRECTORY is not None, nogil=True)
