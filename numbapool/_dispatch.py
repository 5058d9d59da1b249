"""From a plan to a kernel call: storage views, output allocation and work splitting.

Numba compiles each kernel lazily, once per storage dtype, on its first call (and caches
it on disk), so importing numbapool compiles nothing.
"""

from __future__ import annotations

import numba
import numpy as np

from ._kernels import global_, unpool, window
from ._plan import BFLOAT16, UnpoolPlan, WindowPlan

# 16-bit floats reach numba as their bit patterns; see _kernels/codec.py.
_STORAGE = {np.dtype(np.float16): np.dtype(np.uint16), BFLOAT16: np.dtype(np.int16)}

# Enough work items per thread that uneven items still balance.
_ITEMS_PER_THREAD = 4


def storage_dtype(dtype: np.dtype) -> np.dtype:
    return _STORAGE.get(dtype, dtype)


def channel_rows(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as a C-ordered (N*C, prod(spatial)) array of the storage dtype.

    A view when the input is already C-ordered and native; otherwise one copy, which
    leaves the caller's array untouched.
    """
    array = np.ascontiguousarray(array, dtype=dtype)
    rows = array.reshape(array.shape[0] * array.shape[1], -1)
    return rows.view(storage_dtype(dtype))


def lowest_value(dtype: np.dtype):
    """What MaxPool gives for a window with no tap inside the input, in storage form."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return np.array(-np.inf, dtype=dtype).view(storage_dtype(dtype))[()]


def _last_axis_block(plan: WindowPlan) -> int:
    """Outputs per work item along the last axis: whole rows unless there are too few rows
    to keep every thread busy (N*C = 1, 1-D inputs)."""
    out = plan.out_shape
    rows = int(np.prod(out[:-1]))
    wanted = _ITEMS_PER_THREAD * numba.get_num_threads()
    if rows >= wanted:
        return out[-1]
    blocks_per_row = -(-wanted // rows)
    return max(1, -(-out[-1] // blocks_per_row))


def _p_kind(p: float) -> int:
    return int(p) if p in (1.0, 2.0) else 0


def run_window(plan: WindowPlan, x: np.ndarray, return_indices: bool = False):
    y = np.empty(plan.out_shape, dtype=plan.dtype)
    indices = np.empty(plan.out_shape if return_indices else (1, 1), dtype=np.int64)
    if y.size == 0:
        return (y, indices) if return_indices else y
    rows_in = channel_rows(x, plan.dtype)
    rows_out = y.reshape(rows_in.shape[0], -1).view(storage_dtype(plan.dtype))
    g = plan.geometry
    block = _last_axis_block(plan)
    if plan.op == "MaxPool":
        window.max_pool(
            rows_in, rows_out, indices.reshape(indices.shape[0] * indices.shape[1], -1),
            return_indices, lowest_value(plan.dtype), g["in_spatial"], g["out_spatial"],
            g["strides"], g["dilations"], g["pads_begin"], g["pads_end"], g["input_strides"],
            g["index_strides"], g["taps"], g["tap_offsets"], block)
        return (y, indices) if return_indices else y
    if plan.op == "AveragePool":
        window.average_pool(
            rows_in, rows_out, plan.count_include_pad, g["in_spatial"], g["out_spatial"],
            g["strides"], g["dilations"], g["pads_begin"], g["pads_end"], g["input_strides"],
            g["taps"], g["tap_offsets"], block)
        return y
    window.lp_pool(
        rows_in, rows_out, plan.p, _p_kind(plan.p), g["in_spatial"], g["out_spatial"],
        g["strides"], g["dilations"], g["pads_begin"], g["pads_end"], g["input_strides"],
        g["taps"], g["tap_offsets"], block)
    return y


def run_global(op: str, x: np.ndarray, dtype: np.dtype, out_shape: tuple, p: float = 2.0):
    y = np.empty(out_shape, dtype=dtype)
    if y.size == 0:
        return y
    rows_in = channel_rows(x, dtype)
    rows_out = y.reshape(-1).view(storage_dtype(dtype))
    if op == "GlobalMaxPool":
        global_.global_max_pool(rows_in, rows_out)
    elif op == "GlobalAveragePool":
        global_.global_average_pool(rows_in, rows_out)
    else:
        global_.global_lp_pool(rows_in, rows_out, p, _p_kind(p))
    return y


def run_unpool(plan: UnpoolPlan, x: np.ndarray, indices: np.ndarray):
    y = np.zeros(plan.out_shape, dtype=plan.dtype)
    if x.size == 0:
        return y
    storage = storage_dtype(plan.dtype)
    flat_x = np.ascontiguousarray(x, dtype=plan.dtype).reshape(-1).view(storage)
    flat_indices = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
    rows_out = y.reshape(plan.out_shape[0] * plan.out_shape[1], -1).view(storage)
    g = plan.geometry
    unpool.max_unpool(flat_x, flat_indices, rows_out, g["default_spatial"], g["out_strides"])
    return y
