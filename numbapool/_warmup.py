"""Compile (or load from the disk cache) the kernels of chosen operators and dtypes."""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import multiprocessing
import os
import sys

import numpy as np

from . import _cache, _plan

# Each operator with the dtypes ONNX allows it.
OPERATOR_DTYPES = {
    "MaxPool": _plan.MAX_POOL_DTYPES,
    "AveragePool": _plan.FLOAT_DTYPES,
    "LpPool": _plan.FLOAT_DTYPES,
    "GlobalMaxPool": _plan.FLOAT_DTYPES,
    "GlobalAveragePool": _plan.FLOAT_DTYPES,
    "GlobalLpPool": _plan.FLOAT_DTYPES,
    "MaxUnpool": _plan.FLOAT_DTYPES,
}
DTYPE_NAMES = {_plan.dtype_name(dtype): dtype for dtype in _plan.MAX_POOL_DTYPES}


def _choose(what: str, given, known: dict) -> list:
    if given is None:
        return list(known)
    if isinstance(given, str):
        given = [given]
    chosen = []
    for name in given:
        name = name if isinstance(name, str) else _plan.dtype_name(np.dtype(name))
        if name not in known:
            raise ValueError(f"warmup: unknown {what} {name!r}; choose from {', '.join(known)}")
        chosen.append(name)
    return chosen


def _windows():
    """(kernel_shape, strides, pads, LpPool's values of p, sides of the inputs) reaching
    every windowed kernel: the rank-generic ones (a padded 3x3 window; a window over one
    axis at a step of 3 for AveragePool's windows of another width, LpPool's p = 2 and
    MaxPool with Indices, which the row kernels take over two axes and, at steps of 1 and
    2, over one), AveragePool's and LpPool's (p = 2) 3x3 windows over small planes
    at strides 1 and 2 (planes.py: a plane of 64x64 is past the parallel threshold),
    MaxPool's stride-1 windows over small planes (max_planes.py: the padded 3x3 window over
    4x4 planes, a padded 5x5 one over 32x32 past the parallel threshold), each
    of fixed.FIXED_WINDOWS, and MaxPool's input-rows-first kernels (columns.column_units),
    one per kind of last-axis window (3-high windows: a 2x2 one would take a fixed window's
    kernel), over two axes and over three (which fold whole planes first), the windows over
    two axes also the wide windows (wide.py) at steps 1 and 2, and a window over
    one axis at a step of 4 for the wide windows' step of 4. MaxPool with
    Indices reaches the indexed kernel (indexed.py) through the 2-D windows at steps 1 and 2,
    and the generic one through the window over one axis. LpPool
    compiles per kind of p (|x|, x ** 2, |x| ** 3, any other p): each kind in the generic
    and the fixed windows."""
    from ._kernels import columns, fixed

    every_p = (1, 2, 3, 0.5)
    sides = (4, 128)
    yield [3, 3], [1, 1], [1, 1, 1, 1], every_p, sides
    yield [4], [3], None, (2,), sides
    yield [4], [4], None, (2,), sides
    yield [3, 3], [1, 1], [1, 1, 1, 1], (2,), (64,)
    yield [3, 3], [2, 2], [1, 1, 1, 1], (2,), (4, 64)
    yield [5, 5], [1, 1], [2, 2, 2, 2], (), (4, 32)
    for depth, height, width, step in fixed.FIXED_WINDOWS:
        kernel = [height, width] if depth == 1 else [depth, height, width]
        yield kernel, [1] * (len(kernel) - 1) + [step], None, every_p, sides
    for width, step in columns.COLUMN_KINDS:
        width, step = width or 4, step or 1  # (0, 0): a window outside COLUMN_WINDOWS
        yield [3, width], [1, step], None, (2,), sides
        yield [3, 3, width], [1, 1, step], None, (), sides


WINDOWED = ("MaxPool", "AveragePool", "LpPool")


def _exercise(op: str, dtype: np.dtype, window: int | None = None) -> None:
    """Call ``op`` on a small input and on one big enough for the parallel kernel (more
    than 2**15 output-taps), which compiles both entry points of each kernel it reaches;
    the global pools also on one thread (their serial entry point), GlobalLpPool for each
    kind of p, and, for the sums, the kernels that numbapool.dask continues and finishes
    them with. A windowed ``op`` with every window of ``_windows()`` on its inputs, or its
    ``window``-th alone."""
    import numbapool

    from . import _dispatch

    if op in WINDOWED:
        for number, (kernel, strides, pads, lp_ps, sides) in enumerate(_windows()):
            if window is not None and number != window:
                continue
            for side in sides:
                # one axis: as many elements as a plane, to reach the parallel driver too;
                # three: 32 a side is past its threshold already, and 128 a side (8 million
                # elements) made a warm warmup of every dtype take four times as long
                spatial = {1: (side * side,), 2: (side, side), 3: (min(side, 32),) * 3}[len(kernel)]
                x = np.zeros((1, 4) + spatial, dtype=dtype)
                if op == "MaxPool":
                    numbapool.max_pool(x, kernel, strides=strides, pads=pads)
                    numbapool.max_pool(x, kernel, strides=strides, pads=pads, return_indices=True)
                elif op == "AveragePool":
                    numbapool.average_pool(x, kernel, strides=strides, pads=pads)
                else:
                    for p in lp_ps:
                        numbapool.lp_pool(x, kernel, strides=strides, pads=pads, p=p)
        return
    for side in (4, 128):
        x = np.zeros((1, 4, side, side), dtype=dtype)
        if op == "MaxUnpool":
            # each 2x2 window's first element, as MaxPool's Indices would give for zeros (not
            # computed by MaxPool: this task, the last, tells a warm cache from a cold one)
            indices = np.arange(x.size, dtype=np.int64).reshape(x.shape)[:, :, ::2, ::2]
            numbapool.max_unpool(x[:, :, ::2, ::2], indices, [2, 2], strides=[2, 2])
            continue
        # GlobalLpPool compiles per kind of p: |x| (p = 1), x ** 2 (2), |x| ** 3 (3), any other p
        calls = {
            "GlobalMaxPool": [numbapool.global_max_pool],
            "GlobalAveragePool": [numbapool.global_average_pool],
            "GlobalLpPool": [
                functools.partial(numbapool.global_lp_pool, p=p) for p in (1, 2, 3, 0.5)
            ],
        }[op]
        for call in calls:
            call(x)
            with numbapool.threads(1):
                call(x)
        if op != "GlobalMaxPool":
            sums = _dispatch.start_global_sums(op, 4, dtype)
            sums = _dispatch.continue_global_sums(op, x, dtype, sums)
            _dispatch.finish_global_sums(op, sums, dtype, (1, 4, 1, 1))


def _tasks(pairs: list) -> list:
    """(op, dtype name, window) for each pair: a windowed operator's windows one by one,
    so that workers share out one operator's kernels too. In turn across the dtypes, window
    by window: tasks that run at once are then of different dtypes where there are several,
    and do not compile at once the kernels one dtype's windows share (each window's
    MaxPool with Indices, say), which both workers would do on an empty cache."""
    windows = range(len(list(_windows())))
    tasks = []
    for op in dict.fromkeys(op for op, _ in pairs):
        names = [name for pair_op, name in pairs if pair_op == op]
        for window in windows if op in WINDOWED else [None]:
            tasks += [(op, name, window) for name in names]
    return tasks


def _exercise_task(op: str, name: str, window: int | None) -> None:
    """_exercise of a task, its dtype by name (picklable, for a worker process), and the
    parallel drivers it started compiling in the background, done."""
    from ._kernels import collector_paused, parallel

    with collector_paused():  # its drivers too, compiled in the background meanwhile
        _exercise(op, DTYPE_NAMES[name], window)
        parallel.wait_for_drivers()


# Default workers at most: each holds numba and LLVM, about 350 MB compiling MaxPool
MAX_DEFAULT_WORKERS = 8


def _worker_count(processes, tasks: int) -> int:
    if processes is None:
        try:
            processes = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            processes = os.cpu_count() or 1
        processes = min(processes, MAX_DEFAULT_WORKERS)
    elif (
        isinstance(processes, bool) or not isinstance(processes, (int, np.integer)) or processes < 1
    ):
        raise ValueError(f"warmup: processes must be a positive integer, not {processes!r}")
    if _cache.CACHE_DIRECTORY is None:  # no disk cache to hand the kernels over in
        return 1
    return min(processes, tasks)


def _compiled_here(task: tuple, bar) -> bool:
    """Run ``task`` in this process; whether a kernel compiled for it (not loaded)."""
    from numba.core import event

    bar.set_postfix_str("%s %s" % task[:2])
    with event.install_recorder("numba:compile") as compiles:
        _exercise_task(*task)
    bar.update()
    return any(
        event_.data["dispatcher"].py_func.__module__.startswith(__package__)
        for _, event_ in compiles.buffer
    )


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _worker_start() -> None:
    """A worker's initializer. At its exit, its last result sent and its kernels in the
    disk cache, it leaves without tearing its interpreter down: freeing the objects of its
    hundred compiles held the warmup of everything 3.6 s past its last task (0.04 s
    without). Registered after numba's and llvmlite's exit handlers, it runs before them:
    they only mark the interpreter as shutting down."""
    atexit.register(_exit_now)


def _compile_in_workers(tasks: list, workers: int, bar, load: bool) -> None:
    """_exercise_task each task in one of ``workers`` processes, which compile into the
    disk cache (their saves take turns: _numba.locked_cache); if ``load``, this process
    loads each task's kernels as soon as its worker is done, while the workers go on
    (loaded after them, a warmup of everything's kernels took its last 4 s on one core)."""
    # spawned, not forked: a fork of a process that ran numba's threads may hang
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_start
    ) as pool:
        running = {pool.submit(_exercise_task, *task): task for task in tasks}
        try:
            for done in concurrent.futures.as_completed(running):
                done.result()
                if load:
                    _exercise_task(*running[done])
                bar.set_postfix_str("%s %s" % running[done][:2])
                bar.update()
        except BaseException:  # an error or an interrupt: the tasks not started are dropped
            pool.shutdown(cancel_futures=True)
            raise


def _in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (its stderr is no terminal, yet a person
    watches the cell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _progress_bar_class():
    """tqdm's notebook bar in a Jupyter kernel that has ipywidgets, else its text bar."""
    if _in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm's notebook bar draws with it)
            from tqdm.auto import tqdm

            return tqdm
        except ImportError:
            pass
    from tqdm import tqdm

    return tqdm


def warmup(
    ops: str | list[str] | None = None,
    dtypes=None,
    *,
    progress: bool | None = None,
    processes: int | None = None,
    load: bool = True,
) -> list[tuple[str, str]]:
    """Compile the kernels of ``ops`` x ``dtypes`` now, or load them from the disk cache.

    Worth it in an image or a CI job before timing anything, or at the top of a notebook:
    the first call of each kernel otherwise pays for its compilation (seconds).

    Parameters
    ----------
    ops : str or sequence of str, optional
        ONNX operator names ("MaxPool", "AveragePool", "LpPool", "GlobalMaxPool",
        "GlobalAveragePool", "GlobalLpPool", "MaxUnpool"); default all.
    dtypes : str, dtype or sequence of them, optional
        Default every dtype each operator allows; a dtype an operator does not allow is
        skipped for that operator.
    progress : bool, optional
        Show a progress bar (tqdm); by default when stderr is a terminal or in a Jupyter
        notebook (tqdm's notebook bar where ipywidgets is installed), not in a log.
    processes : int, optional
        How many worker processes compile at once on an empty cache, sharing out the
        operators, dtypes and windows, into the disk cache, from which this process
        loads each task's kernels as its worker finishes it (unless ``load`` is False);
        by default one per CPU this process may run on, at most 8 (each takes about
        350 MB). 1 compiles in this process alone, as does any count when there is no
        disk cache.
    load : bool, default True
        Whether this process loads the kernels that workers compiled. False leaves them in
        the disk cache alone, for a process that exits next (``python -m numbapool
        warmup`` does so). The tasks this process runs itself are in it either way: on an
        empty cache the one that tells it from a warm one, on a warm cache or with no
        workers every task.

    Returns
    -------
    list of (op, dtype name)
        What was compiled or loaded.

    Examples
    --------
    >>> import numbapool
    >>> numbapool.warmup(["MaxPool"], ["float32"], progress=False)
    [('MaxPool', 'float32')]
    """
    chosen_ops = _choose("operator", ops, OPERATOR_DTYPES)
    chosen_dtypes = _choose("dtype", dtypes, DTYPE_NAMES)
    pairs = [
        (op, name)
        for op in chosen_ops
        for name in chosen_dtypes
        if DTYPE_NAMES[name] in OPERATOR_DTYPES[op]
    ]
    tasks = _tasks(pairs)
    workers = _worker_count(processes, len(tasks))
    if progress is None:
        progress = _in_notebook() or bool(sys.stderr and sys.stderr.isatty())
    bar = _progress_bar_class()(
        total=len(tasks), desc="numbapool warmup", unit="task", disable=not progress
    )
    with bar:
        # The last task here first (the cheapest: MaxUnpool, the global pools and the last
        # windows come last): if no kernel compiled for it, the cache is warm, and workers
        # would only add their own start (a second or more each).
        if tasks and _compiled_here(tasks[-1], bar) and workers > 1:
            _compile_in_workers(tasks[:-1], workers, bar, load)
        else:
            for task in tasks[:-1]:
                _compiled_here(task, bar)
    return pairs
