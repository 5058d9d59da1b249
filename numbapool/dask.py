"""numbapool on dask arrays: the same functions and keywords, lazy, identical results.

Needs dask and distributed (``pip install -e ".[dask]"`` from a checkout); ``import numbapool``
alone never imports it.

Windowed pools (``max_pool``, ``average_pool``, ``lp_pool``): chunks along N and C map one
to one. Along each spatial axis the output chunks are regular (all of one length but the
last, the windows of the largest input chunk), and each output chunk's task reads the input
from its first window's first tap to its last window's last tap: about one input chunk
plus a halo of less than one window extent ``(kernel - 1) * dilation + 1``. Each task runs
the in-memory kernel on that region, with pads that put its windows where the whole call
puts them and the whole call's divisor counts, so every window meets the same taps in the
same order as in one call on the whole array, and the result is identical to the last bit.
MaxPool Indices are offsets into the whole input, as in memory.

Global pools: each channel's row-major sequence is cut into consecutive pieces no larger
than the largest input chunk. GlobalMaxPool takes each piece's first maximum and reduces
them in a tree, earlier pieces first. GlobalAveragePool and GlobalLpPool carry each
channel's running sums from piece to piece, in order (float64 totals, and the float32
lanes of the block a piece ends in where the sum takes float32 blocks): the same additions
as the in-memory call, which a tree of partial sums could not promise. docs/dask.md gives the
memory a task holds.

Threads: dask already runs the chunks' tasks in parallel, one per worker thread, so by
default each task runs numbapool on one thread (``threads=1``): a task on all the cores
would compete with the worker's other tasks and with the other workers. ``threads=N``
gives each task N threads; ``threads=None`` leaves the worker process's own setting
(``numbapool.set_num_threads``, else numba's, ``NUMBA_NUM_THREADS``).
"""

from __future__ import annotations

import itertools
import math

import dask
import dask.array as da
import numpy as np

import numbapool

from . import _dispatch, _plan, _threads
from ._kernels.family import lowest_value, storage_dtype

__all__ = [
    "average_pool",
    "global_average_pool",
    "global_lp_pool",
    "global_max_pool",
    "lp_pool",
    "max_pool",
]


def _as_dask(x) -> da.Array:
    return x if isinstance(x, da.Array) else da.asarray(x)


# --------------------------------------------------------------------------- windowed pools


def _output_ranges(plan: _plan.WindowPlan, axis: int, input_chunks: tuple) -> list:
    """[first, end) output positions of each output chunk along one spatial axis: all of
    one length but the last (a result goes to zarr as it is), the windows of about the
    largest input chunk (its length over the stride), so that a task reads about one input
    chunk plus a halo."""
    count = plan.spatial_out[axis]
    length = max(1, min(count, -(-max(input_chunks) // plan.strides[axis])))
    return [(first, min(first + length, count)) for first in range(0, count, length)]


def _input_range(plan: _plan.WindowPlan, axis: int, first: int, end: int) -> tuple:
    """[lo, hi): the input elements that the windows of outputs [first, end) can touch."""
    stride, begin = plan.strides[axis], plan.pads_begin[axis]
    size = plan.spatial_in[axis]
    extent = _plan.window_extents(plan.kernel_shape, plan.dilations)[axis]
    start = first * stride - begin
    stop = (end - 1) * stride - begin + extent
    return min(max(0, start), size), max(0, min(size, stop))


def _region_attributes(plan: _plan.WindowPlan, axis: int, first: int, end: int) -> tuple:
    """(lo, hi, pad_begin, pad_end): the call on input [lo, hi) with these pads gives
    outputs [first, end) of the whole call, each window over the same taps."""
    stride, begin = plan.strides[axis], plan.pads_begin[axis]
    extent = _plan.window_extents(plan.kernel_shape, plan.dilations)[axis]
    lo, hi = _input_range(plan, axis, first, end)
    start = first * stride - begin
    stop = (end - 1) * stride - begin + extent
    return lo, hi, lo - start, stop - hi


def _on_threads(threads: int | None, function, *args):
    """``function(*args)``, its numbapool calls on ``threads`` threads (None: the process's
    setting): what each task runs."""
    if threads is None:
        return function(*args)
    with numbapool.threads(threads):
        return function(*args)


def _checked_threads(threads: int | None) -> int | None:
    return None if threads is None else _threads._check_count(threads)


def _pool_region(region, plan, pads, first_outputs, return_indices, index_origin):
    region = np.asarray(region)
    result = _dispatch.run_window(
        _plan.region_plan(plan, region.shape, pads, first_outputs), region, return_indices
    )
    if return_indices:
        return result[0], _whole_input_indices(
            result[1], region.shape, *index_origin, plan.storage_order
        )
    return result


def _whole_input_indices(local, region_shape, first_n, first_c, lows, whole_shape, storage_order):
    """Indices into a region, as offsets into the whole input; -1 stays -1."""
    order = "C" if storage_order == 0 else "F"
    region_spatial, whole_spatial = region_shape[2:], whole_shape[2:]
    channel, offset = np.divmod(np.maximum(local, 0), math.prod(region_spatial))
    coordinates = np.unravel_index(offset, region_spatial, order=order)
    coordinates = [c + lo for c, lo in zip(coordinates, lows)]
    n, c = np.divmod(channel, region_shape[1])
    whole_channel = (n + first_n) * whole_shape[1] + (c + first_c)
    whole = whole_channel * math.prod(whole_spatial) + np.ravel_multi_index(
        coordinates, whole_spatial, order=order
    )
    return np.where(local < 0, -1, whole)


def _empty_window_value(plan: _plan.WindowPlan):
    """What a window with no tap inside the input gives (docs/semantics.md)."""
    if plan.op != "MaxPool":
        return np.zeros((), plan.dtype)
    storage = storage_dtype(plan.dtype)
    return np.array(lowest_value(plan.dtype), dtype=storage).view(plan.dtype)


def _windowed(
    op: str,
    x,
    kernel_shape,
    strides,
    pads,
    auto_pad,
    ceil_mode,
    dilations,
    threads,
    return_indices=False,
    **extra,
):
    x = _as_dask(x)
    threads = _checked_threads(threads)
    plan = _dispatch.window_plan(
        op, x.shape, x.dtype, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, **extra
    )
    rank = len(plan.kernel_shape)
    ranges = [_output_ranges(plan, axis, x.chunks[2 + axis]) for axis in range(rank)]
    n_bounds = [0, *itertools.accumulate(x.chunks[0])]
    c_bounds = [0, *itertools.accumulate(x.chunks[1])]
    task = dask.delayed(_on_threads, pure=True, nout=2 if return_indices else None)
    values = np.empty((len(x.chunks[0]), len(x.chunks[1]), *map(len, ranges)), dtype=object)
    indices = np.empty_like(values)
    for block in np.ndindex(values.shape):
        n0, n1 = n_bounds[block[0]], n_bounds[block[0] + 1]
        c0, c1 = c_bounds[block[1]], c_bounds[block[1] + 1]
        out_ranges = [ranges[axis][block[2 + axis]] for axis in range(rank)]
        regions = [_region_attributes(plan, axis, *out_ranges[axis]) for axis in range(rank)]
        shape = (n1 - n0, c1 - c0, *(end - first for first, end in out_ranges))
        if any(lo >= hi for lo, hi, *_ in regions):  # no window along an axis meets the input
            values[block] = da.full(shape, _empty_window_value(plan), dtype=plan.dtype)
            indices[block] = da.full(shape, -1, dtype=np.int64)
            continue
        region = x[(slice(n0, n1), slice(c0, c1), *(slice(lo, hi) for lo, hi, *_ in regions))]
        region = region.rechunk(region.shape).to_delayed().reshape(-1)[0]
        pads_ = tuple(r[2] for r in regions) + tuple(r[3] for r in regions)
        result = task(
            threads,
            _pool_region,
            region,
            plan,
            pads_,
            tuple(first for first, _ in out_ranges),
            return_indices,
            (n0, c0, [r[0] for r in regions], x.shape),
        )
        if return_indices:
            values[block] = da.from_delayed(result[0], shape, dtype=plan.dtype)
            indices[block] = da.from_delayed(result[1], shape, dtype=np.int64)
        else:
            values[block] = da.from_delayed(result, shape, dtype=plan.dtype)
    y = da.block(values.tolist())
    return (y, da.block(indices.tolist())) if return_indices else y


def max_pool(
    x,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    storage_order=0,
    return_indices=False,
    threads: int | None = 1,
):
    """numbapool.max_pool on a dask array: lazy, chunk by chunk, the same result.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    return _windowed(
        "MaxPool",
        x,
        kernel_shape,
        strides,
        pads,
        auto_pad,
        ceil_mode,
        dilations,
        threads,
        return_indices=bool(return_indices),
        storage_order=storage_order,
    )


def average_pool(
    x,
    kernel_shape,
    *,
    strides=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    count_include_pad=0,
    threads: int | None = 1,
):
    """numbapool.average_pool on a dask array: lazy, chunk by chunk, the same result.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    return _windowed(
        "AveragePool",
        x,
        kernel_shape,
        strides,
        pads,
        auto_pad,
        ceil_mode,
        dilations,
        threads,
        count_include_pad=count_include_pad,
    )


def lp_pool(
    x,
    kernel_shape,
    *,
    p=2,
    strides=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    threads: int | None = 1,
):
    """numbapool.lp_pool on a dask array: lazy, chunk by chunk, the same result.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    return _windowed(
        "LpPool", x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, threads, p=p
    )


# --------------------------------------------------------------------------- global pools


def _pieces(op: str, x) -> da.Array:
    """``x`` checked and rechunked so that its blocks, in row-major order of block index,
    are consecutive row-major pieces of each channel, each about the size of the largest
    input chunk at most: whole rows of the innermost axes that fit, a run along the next
    axis, and one element along the axes before it. A row too long to fit is cut too."""
    x = _as_dask(x)
    _plan.global_plan(op, x.shape, x.dtype)
    spatial = x.shape[2:]
    budget = math.prod(max(c, default=1) for c in x.chunks)  # elements of the largest chunk
    channels = max(x.chunks[0], default=1) * max(x.chunks[1], default=1)
    per_channel = max(1, budget // max(channels, 1))
    axis = 0  # the first spatial axis whose inner rows fit
    while math.prod(spatial[axis + 1 :]) > per_channel:
        axis += 1
    run = max(1, min(spatial[axis], per_channel // math.prod(spatial[axis + 1 :])))
    chunks = {2 + a: 1 for a in range(axis)}
    chunks[2 + axis] = run
    chunks.update({2 + a: -1 for a in range(axis + 1, len(spatial))})
    # "tasks": each piece gathered in one task from the chunks it overlaps, nothing larger
    return x.rechunk(chunks, method="tasks", block_size_limit=budget * x.dtype.itemsize)


def _in_order(parts: list, combine, fan_in: int = 8):
    """A tree of ``combine`` over ``parts``, each call on consecutive parts in order."""
    while len(parts) > 1:
        parts = [combine(*parts[i : i + fan_in]) for i in range(0, len(parts), fan_in)]
    return parts[0]


def _first_maximum(threads, *maxima):
    """The first maximum of consecutive pieces' first maxima, earlier pieces first."""
    return _on_threads(threads, numbapool.global_max_pool, np.concatenate(maxima, axis=2))


def _by_channel_block(op: str, x, reduce) -> da.Array:
    """The global pool of ``x``: ``reduce(pieces, n, c)`` gives, as a delayed value, the
    (n, c, 1, ...) result of one block of channels from its pieces in row-major order."""
    x = _pieces(op, x)
    pieces = x.to_delayed()  # (N blocks, C blocks, spatial blocks...)
    blocks = np.empty(pieces.shape[:2], dtype=object)
    for n_block, c_block in np.ndindex(blocks.shape):
        n, c = x.chunks[0][n_block], x.chunks[1][c_block]
        out_shape = (n, c) + (1,) * (x.ndim - 2)
        pieces_in_order = list(pieces[n_block, c_block].reshape(-1))
        result = reduce(pieces_in_order, n, c)
        blocks[n_block, c_block] = da.from_delayed(result, out_shape, dtype=x.dtype)
    return da.block(blocks.reshape(blocks.shape + (1,) * (x.ndim - 2)).tolist())


def global_max_pool(x, *, threads: int | None = 1):
    """numbapool.global_max_pool on a dask array: each piece's first maximum,
    then a tree of first maxima over consecutive pieces, earlier pieces first.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    threads = _checked_threads(threads)
    task = dask.delayed(_on_threads, pure=True)
    combine = dask.delayed(_first_maximum, pure=True)
    return _by_channel_block(
        "GlobalMaxPool",
        x,
        lambda pieces, n, c: _in_order(
            [task(threads, numbapool.global_max_pool, p) for p in pieces],
            lambda *maxima: combine(threads, *maxima),
        ),
    )


def _global_sums(op: str, x, threads: int | None, p: float = 2.0) -> da.Array:
    """Each channel's running sums carried from piece to piece, in order
    (_dispatch.RunningSums), then the mean or the root: the same additions as the in-memory
    call."""
    x = _as_dask(x)
    threads = _checked_threads(threads)
    carry = dask.delayed(_on_threads, pure=True)
    finish = dask.delayed(_dispatch.finish_global_sums, pure=True)

    def reduce(pieces, n, c):
        sums = _dispatch.start_global_sums(op, n * c, x.dtype)
        for piece in pieces:
            sums = carry(threads, _dispatch.continue_global_sums, op, piece, x.dtype, sums, p)
        return finish(op, sums, x.dtype, (n, c) + (1,) * (x.ndim - 2), p)

    return _by_channel_block(op, x, reduce)


def global_average_pool(x, *, threads: int | None = 1):
    """numbapool.global_average_pool on a dask array: the running sums carried
    from slab to slab, the same result.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    return _global_sums("GlobalAveragePool", x, threads)


def global_lp_pool(x, *, p=2, threads: int | None = 1):
    """numbapool.global_lp_pool on a dask array: the in-order float64 sum
    carried from slab to slab, the same result.

    ``threads``: numbapool's threads in each task, 1 by default (dask runs the tasks in
    parallel already); None leaves the worker process's setting."""
    return _global_sums("GlobalLpPool", x, threads, _plan.check_p(p))
