"""numbapool on dask arrays: the same functions and keywords, lazy, identical results.

Needs dask (``pip install "numbapool[dask]"``); ``import numbapool`` alone never imports it.

Windowed pools (``max_pool``, ``average_pool``, ``lp_pool``): chunks along N and C map one
to one. Along each spatial axis, output chunk k holds the outputs whose windows start in
input chunk k (so output chunks follow the input's, and the output is never rechunked), and
its task reads the input from its first window's first tap to its last window's last tap:
the chunk plus a halo of less than one window extent ``(kernel - 1) * dilation + 1`` on the
high side. Each task runs the in-memory kernel on that region, with pads that put its
windows where the whole call puts them and the whole call's divisor counts, so every window
meets the same taps in the same order as in one call on the whole array, and the result is
identical to the last bit. MaxPool Indices are offsets into the
whole input, as in memory.

Global pools: the inner spatial axes are rechunked whole (slabs along the first spatial
axis), so that slab order is the row-major order of each channel. GlobalMaxPool takes each
slab's first maximum and reduces them in a tree, earlier slabs first. GlobalAveragePool and
GlobalLpPool carry each channel's float64 running sum from slab to slab, in order: the same
additions as the in-memory call, which a tree of partial sums could not promise.
"""

from __future__ import annotations

import itertools
import math

import dask
import dask.array as da
import numpy as np

import numbapool

from . import _dispatch, _plan

__all__ = ["average_pool", "global_average_pool", "global_lp_pool", "global_max_pool",
           "lp_pool", "max_pool"]


def _as_dask(x) -> da.Array:
    return x if isinstance(x, da.Array) else da.asarray(x)


# --------------------------------------------------------------------------- windowed pools


def _output_ranges(plan: _plan.WindowPlan, axis: int, input_chunks: tuple) -> list:
    """[first, end) output positions of each output chunk along one spatial axis: the
    outputs whose window starts in each input chunk. A range whose windows all miss the
    input joins its neighbour, so that every task reads at least one element."""
    stride, begin = plan.strides[axis], plan.pads_begin[axis]
    count = plan.spatial_out[axis]
    bounds = {0, count}
    for boundary in itertools.accumulate(input_chunks[:-1]):
        # first output whose window starts at or after this input boundary
        bounds.add(min(count, max(0, -(-(boundary + begin) // stride))))
    bounds = sorted(bounds)
    merged, pending = [], None
    for first, end in zip(bounds, bounds[1:]):
        lo, hi = _input_range(plan, axis, first, end)
        if lo >= hi and merged:  # every window of the range misses the input
            merged[-1] = (merged[-1][0], end)
        elif lo >= hi:
            pending = first if pending is None else pending
        else:
            merged.append((first if pending is None else pending, end))
            pending = None
    return merged or [(0, count)]


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


def _pool_region(region, plan, pads, first_outputs, return_indices, index_origin):
    region = np.asarray(region)
    result = _dispatch.run_window(_plan.region_plan(plan, region.shape, pads, first_outputs),
                                  region, return_indices)
    if return_indices:
        return result[0], _whole_input_indices(result[1], region.shape, *index_origin,
                                               plan.storage_order)
    return result


def _whole_input_indices(local, region_shape, first_n, first_c, lows, whole_shape,
                         storage_order):
    """Indices into a region, as offsets into the whole input; -1 stays -1."""
    order = "C" if storage_order == 0 else "F"
    region_spatial, whole_spatial = region_shape[2:], whole_shape[2:]
    channel, offset = np.divmod(np.maximum(local, 0), math.prod(region_spatial))
    coordinates = np.unravel_index(offset, region_spatial, order=order)
    coordinates = [c + lo for c, lo in zip(coordinates, lows)]
    n, c = np.divmod(channel, region_shape[1])
    whole_channel = (n + first_n) * whole_shape[1] + (c + first_c)
    whole = whole_channel * math.prod(whole_spatial) + np.ravel_multi_index(
        coordinates, whole_spatial, order=order)
    return np.where(local < 0, -1, whole)


def _empty_window_value(plan: _plan.WindowPlan):
    """What a window with no tap inside the input gives (docs/semantics.md)."""
    if plan.op != "MaxPool":
        return np.zeros((), plan.dtype)
    storage = _dispatch.storage_dtype(plan.dtype)
    return np.array(_dispatch.lowest_value(plan.dtype), dtype=storage).view(plan.dtype)


def _windowed(op: str, x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations,
              return_indices=False, **extra):
    x = _as_dask(x)
    plan = _plan.window_plan(op, x.shape, x.dtype, kernel_shape, strides, pads, auto_pad,
                             ceil_mode, dilations, **extra)
    rank = len(plan.kernel_shape)
    ranges = [_output_ranges(plan, axis, x.chunks[2 + axis]) for axis in range(rank)]
    n_bounds = [0, *itertools.accumulate(x.chunks[0])]
    c_bounds = [0, *itertools.accumulate(x.chunks[1])]
    task = dask.delayed(_pool_region, pure=True, nout=2 if return_indices else None)
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
        region = x[(slice(n0, n1), slice(c0, c1),
                    *(slice(lo, hi) for lo, hi, *_ in regions))]
        region = region.rechunk(region.shape).to_delayed().reshape(-1)[0]
        pads_ = tuple(r[2] for r in regions) + tuple(r[3] for r in regions)
        result = task(region, plan, pads_, tuple(first for first, _ in out_ranges),
                      return_indices, (n0, c0, [r[0] for r in regions], x.shape))
        if return_indices:
            values[block] = da.from_delayed(result[0], shape, dtype=plan.dtype)
            indices[block] = da.from_delayed(result[1], shape, dtype=np.int64)
        else:
            values[block] = da.from_delayed(result, shape, dtype=plan.dtype)
    y = da.block(values.tolist())
    return (y, da.block(indices.tolist())) if return_indices else y


def max_pool(x, kernel_shape, *, strides=None, pads=None, auto_pad="NOTSET", ceil_mode=0,
             dilations=None, storage_order=0, return_indices=False):
    """numbapool.max_pool on a dask array: lazy, chunk by chunk, the same result."""
    return _windowed("MaxPool", x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations,
                     return_indices=bool(return_indices), storage_order=storage_order)


def average_pool(x, kernel_shape, *, strides=None, pads=None, auto_pad="NOTSET", ceil_mode=0,
                 dilations=None, count_include_pad=0):
    """numbapool.average_pool on a dask array: lazy, chunk by chunk, the same result."""
    return _windowed("AveragePool", x, kernel_shape, strides, pads, auto_pad, ceil_mode,
                     dilations, count_include_pad=count_include_pad)


def lp_pool(x, kernel_shape, *, p=2, strides=None, pads=None, auto_pad="NOTSET", ceil_mode=0,
            dilations=None):
    """numbapool.lp_pool on a dask array: lazy, chunk by chunk, the same result."""
    return _windowed("LpPool", x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations,
                     p=p)


# --------------------------------------------------------------------------- global pools


def _slabs(op: str, x) -> da.Array:
    """``x`` checked, with its inner spatial axes in one chunk each."""
    x = _as_dask(x)
    _plan.global_plan(op, x.shape, x.dtype)
    return x.rechunk({axis: -1 for axis in range(3, x.ndim)})


def _first_maximum(block, axis=None, keepdims=True):
    # the blocks of a reduction step arrive concatenated in slab order along axis 2
    return numbapool.global_max_pool(block)


def global_max_pool(x):
    """numbapool.global_max_pool on a dask array: a tree of per-slab first maxima."""
    x = _slabs("GlobalMaxPool", x)
    spatial = tuple(range(2, x.ndim))
    return da.reduction(x, _first_maximum, _first_maximum, combine=_first_maximum,
                        axis=spatial, keepdims=True, dtype=x.dtype, concatenate=True,
                        meta=np.empty((0,) * x.ndim, dtype=x.dtype))


def _global_sums(op: str, x, p: float = 2.0) -> da.Array:
    x = _slabs(op, x)
    out_shape_of = lambda n, c: (n, c) + (1,) * (x.ndim - 2)  # noqa: E731
    size = math.prod(x.shape[2:])
    carry = dask.delayed(_dispatch.continue_global_sums, pure=True)
    finish = dask.delayed(_dispatch.finish_global_sums, pure=True)
    slabs = x.to_delayed()  # (N chunks, C chunks, slab chunks, 1, ...)
    blocks = np.empty(slabs.shape[:2], dtype=object)
    for n_block, c_block in np.ndindex(blocks.shape):
        n, c = x.chunks[0][n_block], x.chunks[1][c_block]
        totals = np.zeros(n * c, dtype=np.float64)
        for slab in slabs[n_block, c_block].reshape(-1):
            totals = carry(op, slab, x.dtype, totals, p)
        blocks[n_block, c_block] = da.from_delayed(
            finish(op, totals, size, x.dtype, out_shape_of(n, c), p), out_shape_of(n, c),
            dtype=x.dtype)
    return da.block(blocks.reshape(blocks.shape + (1,) * (x.ndim - 2)).tolist())


def global_average_pool(x):
    """numbapool.global_average_pool on a dask array: the in-order float64 sum carried
    from slab to slab, the same result."""
    return _global_sums("GlobalAveragePool", x)


def global_lp_pool(x, *, p=2):
    """numbapool.global_lp_pool on a dask array: the in-order float64 sum carried from
    slab to slab, the same result."""
    return _global_sums("GlobalLpPool", x, _plan.check_p(p))
