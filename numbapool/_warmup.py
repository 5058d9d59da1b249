"""Compile (or load from the disk cache) the kernels of chosen operators and dtypes."""

from __future__ import annotations

import functools

import numpy as np

from . import _plan

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
    """(kernel_shape, strides, pads, LpPool's values of p) reaching every windowed kernel:
    the rank-generic ones (a padded 3x3 window; MaxPool without Indices takes them over one
    axis), each of fixed.FIXED_WINDOWS (LpPool's compile per kind of p: |x|, x ** 2,
    |x| ** 3, any other p), and MaxPool's input-rows-first kernels
    (columns.column_units), one per kind of last-axis window, over two and three
    spatial axes (3-high windows: a 2x2 one would take a fixed window's kernel)."""
    from ._kernels import columns, fixed

    yield [3, 3], [1, 1], [1, 1, 1, 1], (2,)
    yield [3], [1], [1, 1], (2,)
    for depth, height, width, step in fixed.FIXED_WINDOWS:
        kernel = [height, width] if depth == 1 else [depth, height, width]
        yield kernel, [1] * (len(kernel) - 1) + [step], None, (1, 2, 3, 0.5)
    for width, step in columns.COLUMN_KINDS:
        # width 0: a window outside COLUMN_WINDOWS (4 wide); step 0: any other step (3)
        width, step = width or 4, step or 3
        for rank in (2, 3):
            yield [3] * (rank - 1) + [width], [1] * (rank - 1) + [step], None, (2,)


def _exercise(op: str, dtype: np.dtype) -> None:
    """Call ``op`` on a small input and on one big enough for the parallel kernel (more
    than 2**15 output-taps), which compiles both entry points of each kernel it reaches;
    the global pools also on one thread (their serial entry point), GlobalLpPool for each
    kind of p, and, for the sums, the kernels that numbapool.dask continues and finishes
    them with."""
    import numbapool

    from . import _dispatch

    for side in (4, 128):
        if op in ("MaxPool", "AveragePool", "LpPool"):
            for kernel, strides, pads, lp_ps in _windows():
                # one axis: as many elements as a plane, to reach the parallel driver too;
                # three: 32 a side is past its threshold already, and 128 a side (8 million
                # elements) made a warm warmup of every dtype take four times as long
                spatial = {1: (side * side,), 2: (side, side), 3: (min(side, 32),) * 3}[len(kernel)]
                x = np.zeros((1, 4) + spatial, dtype=dtype)
                if op == "MaxPool":
                    numbapool.max_pool(x, kernel, strides=strides, pads=pads)
                    numbapool.max_pool(x, kernel, strides=strides, pads=pads,
                                       return_indices=True)
                elif op == "AveragePool":
                    numbapool.average_pool(x, kernel, strides=strides, pads=pads)
                else:
                    for p in lp_ps:
                        numbapool.lp_pool(x, kernel, strides=strides, pads=pads, p=p)
            continue
        x = np.zeros((1, 4, side, side), dtype=dtype)
        if op == "MaxUnpool":
            y, indices = numbapool.max_pool(x, [2, 2], strides=[2, 2], return_indices=True)
            numbapool.max_unpool(y, indices, [2, 2], strides=[2, 2])
            continue
        # GlobalLpPool compiles per kind of p: |x| (p = 1), x ** 2 (2), |x| ** 3 (3), any other p
        calls = {"GlobalMaxPool": [numbapool.global_max_pool],
                 "GlobalAveragePool": [numbapool.global_average_pool],
                 "GlobalLpPool": [functools.partial(numbapool.global_lp_pool, p=p)
                                  for p in (1, 2, 3, 0.5)]}[op]
        for call in calls:
            call(x)
            with numbapool.threads(1):
                call(x)
        if op != "GlobalMaxPool":
            totals = _dispatch.continue_global_sums(op, x, dtype, np.zeros(4))
            _dispatch.finish_global_sums(op, totals, side * side, dtype, (1, 4, 1, 1))


def warmup(ops=None, dtypes=None, *, progress: bool | None = None) -> list[tuple[str, str]]:
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
        Show a progress bar (tqdm); by default only when stderr is a terminal.

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
    from tqdm import tqdm

    chosen_ops = _choose("operator", ops, OPERATOR_DTYPES)
    chosen_dtypes = _choose("dtype", dtypes, DTYPE_NAMES)
    pairs = [(op, name) for op in chosen_ops for name in chosen_dtypes
             if DTYPE_NAMES[name] in OPERATOR_DTYPES[op]]
    bar = tqdm(pairs, desc="numbapool warmup", unit="kernel",
               disable=None if progress is None else not progress)
    for op, name in bar:
        bar.set_postfix_str(f"{op} {name}")
        _exercise(op, DTYPE_NAMES[name])
    return pairs
