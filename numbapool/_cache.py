"""Where numba keeps numbapool's compiled kernels on disk, and whether it can.

numba picks the first writable place among NUMBA_CACHE_DIR, ``__pycache__`` beside the
kernels and a per-user directory, and raises at import when none is writable. numbapool
decides once, before its kernels are defined: when ``NUMBA_CACHE_DIR`` is set only that
directory counts (falling back elsewhere would write where the user said not to), and
when no place is writable the kernels compile in every process, after one warning.
Processes sharing the directory save their compiled kernels in turns (_numba.locked_cache,
which holds ``exclusive`` around a save).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

import numba

from . import _numba

try:
    import fcntl
except ImportError:  # Windows: saves go unlocked, as numba's own do
    fcntl = None

KERNEL_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernels")


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
    # numba's own search, so that the answer is where numba will write
    directory = _numba.cache_directory_for(os.path.join(KERNEL_DIRECTORY, "maxima.py"))
    if directory is None:
        return None, f"no writable cache location for {KERNEL_DIRECTORY!r}"
    return directory, None


CACHE_DIRECTORY, CACHE_PROBLEM = _locate()
if CACHE_PROBLEM is not None:
    warnings.warn(
        f"numbapool: compiled kernels will not be cached on disk ({CACHE_PROBLEM}); "
        "every process compiles them again",
        RuntimeWarning,
        stacklevel=2,
    )


def kernel_modules() -> set[str]:
    """The modules of _kernels that hold cached kernels: each family's (choice.FAMILIES),
    the parallel driver's and MaxUnpool's."""
    from ._kernels import choice

    return {family.module for family in choice.FAMILIES} | {"parallel", "unpool"}


def cache_contents() -> dict[str, dict]:
    """Kernel name -> {"files": compiled objects on disk, "bytes": their size}. Objects of
    earlier numbapool or numba versions count until numba replaces them."""
    if CACHE_DIRECTORY is None or not os.path.isdir(CACHE_DIRECTORY):
        return {}
    contents: dict[str, dict] = {}
    modules = kernel_modules()
    for entry in os.scandir(CACHE_DIRECTORY):
        module, _, rest = entry.name.partition(".")
        if entry.name.endswith(".nbc") and module in modules:
            kernel = contents.setdefault(f"{module}.{rest.split('-')[0]}", {"files": 0, "bytes": 0})
            kernel["files"] += 1
            kernel["bytes"] += entry.stat().st_size
    return dict(sorted(contents.items()))


@contextlib.contextmanager
def exclusive(path: str):
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
