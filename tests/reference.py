"""A naive reference, written from the ONNX operator text and docs/semantics.md.

Plain Python loops over every output position and every window tap, in float64. It shares
no code with numbapool: the shape and padding arithmetic is derived here again on purpose.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def output_geometry(spatial, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations):
    """(output spatial shape, pads begin, pads end) per the rules in docs/semantics.md."""
    rank = len(spatial)
    strides = strides or [1] * rank
    dilations = dilations or [1] * rank
    extents = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out, begin, end = [], [], []
        for n, e, s in zip(spatial, extents, strides):
            o = math.ceil(n / s)
            total = max(0, (o - 1) * s + e - n)
            small, large = total // 2, total - total // 2
            out.append(o)
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        return out, begin, end
    pads = pads if (pads and auto_pad == "NOTSET") else [0] * (2 * rank)
    begin, end = list(pads[:rank]), list(pads[rank:])
    out = []
    for axis, (n, e, s, b, a) in enumerate(zip(spatial, extents, strides, begin, end)):
        if n + b + a < e:
            raise ValueError(f"no output position along axis {axis}")
        if ceil_mode:
            o = math.ceil((n + b + a - e) / s) + 1
            if (o - 1) * s >= n + b:
                o -= 1
        else:
            o = (n + b + a - e) // s + 1
        out.append(o)
    return out, begin, end


def _windows(x_shape, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations):
    """Yield (output position, [(tap spatial position or None if outside, in padded extent)])."""
    spatial = x_shape[2:]
    rank = len(spatial)
    strides = strides or [1] * rank
    dilations = dilations or [1] * rank
    out, begin, end = output_geometry(
        spatial, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations
    )
    for position in itertools.product(*[range(o) for o in out]):
        taps = []
        for tap in itertools.product(*[range(k) for k in kernel_shape]):  # row-major scan
            coords = [
                position[i] * strides[i] - begin[i] + tap[i] * dilations[i] for i in range(rank)
            ]
            inside = all(0 <= c < n for c, n in zip(coords, spatial))
            padded = all(-b <= c < n + a for c, n, b, a in zip(coords, spatial, begin, end))
            taps.append((tuple(coords) if inside else None, padded))
        yield position, taps


def _spatial_offset(coords, spatial, storage_order):
    order = range(len(spatial)) if storage_order == 0 else reversed(range(len(spatial)))
    offset = 0
    for axis in order:
        offset = offset * spatial[axis] + coords[axis]
    return offset


@np.errstate(all="ignore")  # inf - inf and NaN arithmetic are part of the tested inputs
def pool(
    op,
    x,
    kernel_shape,
    strides=None,
    pads=None,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    count_include_pad=0,
    p=2.0,
    storage_order=0,
):
    """Reference MaxPool / AveragePool / LpPool.

    Returns (values as float64, indices) for MaxPool, values as float64 otherwise. MaxPool
    values are returned as the winning input elements (x's dtype) so that they compare
    bit for bit.
    """
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out, _, _ = output_geometry(
        spatial, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations
    )
    wide = x.astype(np.float64)
    if op == "MaxPool":
        y = np.empty((n, c, *out), dtype=x.dtype)
        indices = np.empty((n, c, *out), dtype=np.int64)
    else:
        y = np.empty((n, c, *out), dtype=np.float64)
    windows = list(_windows(x.shape, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations))
    channel_size = int(np.prod(spatial))
    for b, ch in itertools.product(range(n), range(c)):
        for position, taps in windows:
            inside = [t for t, _ in taps if t is not None]
            if op == "MaxPool":
                best = None
                for coords in inside:
                    v = wide[(b, ch, *coords)]
                    if math.isnan(v):
                        best = coords
                        break
                    if best is None or v > wide[(b, ch, *best)]:
                        best = coords
                if best is None:
                    y[(b, ch, *position)] = (
                        np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
                    )
                    indices[(b, ch, *position)] = -1
                else:
                    y[(b, ch, *position)] = x[(b, ch, *best)]
                    indices[(b, ch, *position)] = (b * c + ch) * channel_size + _spatial_offset(
                        best, spatial, storage_order
                    )
            elif op == "AveragePool":
                total = sum(wide[(b, ch, *t)] for t in inside)
                count = sum(padded for _, padded in taps) if count_include_pad else len(inside)
                y[(b, ch, *position)] = total / count if count else 0.0
            else:
                total = sum(abs(wide[(b, ch, *t)]) ** p for t in inside)
                y[(b, ch, *position)] = total ** (1.0 / p)
    return (y, indices) if op == "MaxPool" else y


@np.errstate(all="ignore")
def global_pool(op, x, p=2.0):
    wide = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    if op == "GlobalMaxPool":
        return np.max(wide, axis=axes, keepdims=True)  # np.max propagates NaN
    if op == "GlobalAveragePool":
        return np.mean(wide, axis=axes, keepdims=True)
    return np.sum(np.abs(wide) ** p, axis=axes, keepdims=True) ** (1.0 / p)


def unpool(x, indices, kernel_shape, strides=None, pads=None, output_shape=None):
    """Reference MaxUnpool: an output of output_shape, or by default (in - 1) * s + k - pb - pe
    elements per spatial axis, zero but where an index names a row-major position of it (N
    and C included, as MaxPool's Indices name positions of its input); a later element wins."""
    rank = x.ndim - 2
    strides = strides or [1] * rank
    pads = pads or [0] * (2 * rank)
    default = [
        (x.shape[2 + i] - 1) * strides[i] + kernel_shape[i] - pads[i] - pads[rank + i]
        for i in range(rank)
    ]
    n, c = x.shape[:2]
    shape = tuple(output_shape) if output_shape is not None else (n, c, *default)
    y = np.zeros(shape, dtype=np.float64)
    flat = y.reshape(-1)
    for index, value in zip(indices.reshape(-1), x.astype(np.float64).reshape(-1)):
        flat[int(index)] = value
    return y
