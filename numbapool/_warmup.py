"""Compile (or load from the disk cache) the kernels of chosen operators and dtypes."""

from __future__ import annotations

import atexit
import concurrent.futures
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


def _compilations(op: str, dtype: np.dtype) -> list:
    """(family, kinds) of every kernel the dispatcher can choose for ``op`` and ``dtype``:
    each family of choice.FAMILIES that serves ``op``, for each of its kinds."""
    from ._kernels import choice

    return [
        (family, kinds)
        for family in choice.FAMILIES
        if op in family.ops
        for kinds in family.kinds(op, dtype)
    ]


def _other_kernels(op: str, dtype: np.dtype) -> None:
    """The kernels of ``op`` that no family holds: the parallel driver (one for every
    kernel), the global sums' kernels that numbapool.dask continues and finishes them
    with, and MaxUnpool's; each called on a small input or compiled by its signature."""
    import numbapool

    from . import _dispatch
    from ._kernels import parallel

    if parallel.ready_driver() is None:  # compiling on a thread of its own
        parallel.wait_for_drivers()
    if op in ("GlobalAveragePool", "GlobalLpPool"):
        x = np.zeros((1, 4, 2, 2), dtype=dtype)
        for p in (1, 2, 3, 0.5) if op == "GlobalLpPool" else (2,):
            sums = _dispatch.start_global_sums(op, 4, dtype)
            sums = _dispatch.continue_global_sums(op, x, dtype, sums, p)
            _dispatch.finish_global_sums(op, sums, dtype, (1, 4, 1, 1), p)
    if op == "MaxUnpool":
        # each 2x2 window's first element, as MaxPool's Indices would give
        x = np.zeros((1, 1, 2, 2), dtype=dtype)
        indices = np.array([0, 2, 8, 10], dtype=np.int64).reshape(x.shape)
        numbapool.max_unpool(x, indices, [2, 2], strides=[2, 2])


def _tasks(pairs: list) -> list:
    """(op, dtype name, number) for each pair: number None for the op's kernels no family
    holds (_other_kernels), then each of _compilations' in turn. In turn across the dtypes,
    kernel by kernel: tasks that run at once are then of different dtypes where there are
    several, and do not compile the same kernel at once."""
    tasks = []
    for op in dict.fromkeys(op for op, _ in pairs):
        names = [name for pair_op, name in pairs if pair_op == op]
        counts = {name: len(_compilations(op, DTYPE_NAMES[name])) for name in names}
        tasks += [(op, name, None) for name in names]
        for number in range(max(counts.values())):
            tasks += [(op, name, number) for name in names if number < counts[name]]
    return tasks


def _exercise_task(op: str, name: str, number: int | None) -> None:
    """Compile (or load) a task's kernel, its dtype by name (picklable, for a worker
    process): the number-th of _compilations by its signature, or _other_kernels."""
    from ._kernels import collector_paused

    dtype = DTYPE_NAMES[name]
    with collector_paused():
        if number is None:
            _other_kernels(op, dtype)
        else:
            family, kinds = _compilations(op, dtype)[number]
            family.entry_point(kinds).compile_types(family.argument_types(op, dtype))


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
        # The last task here first (one kernel; MaxUnpool's alone where it is chosen): if
        # no kernel compiled for it, the cache is warm, and workers would only add their
        # own start (a second or more each).
        if tasks and _compiled_here(tasks[-1], bar) and workers > 1:
            _compile_in_workers(tasks[:-1], workers, bar, load)
        else:
            for task in tasks[:-1]:
                _compiled_here(task, bar)
    return pairs
