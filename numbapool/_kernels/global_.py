"""Global pools: one value per (n, c) over all spatial elements, ``x`` as (N*C, S).

Sums accumulate in float64 whatever the dtype: a channel may hold millions of elements.
Sums run in four interleaved lanes, added in a fixed order.
"""

import numpy as np
from numba import njit, prange

from .codec import decode, encode
from .window import OPTIONS, keeps, lp_root, lp_term

# Contiguous runs of channels per parallel chunk: the loops live in plain functions, which
# numba optimizes better than code inside the parallel region.
CHUNKS = 64


@njit(parallel=True, **OPTIONS)
def global_max_pool(x, y):
    """The first largest element of each channel, bit for bit; a NaN gives the first NaN."""
    chunks = min(x.shape[0], CHUNKS)
    for chunk in prange(chunks):
        begin, end = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
        global_max_units(np.int64(begin), np.int64(end), x, y)


@njit(**OPTIONS)
def global_max_units(begin, end, x, y):
    flat = x.reshape(x.size)
    size = x.shape[1]
    for nc in range(begin, end):
        base = np.uint64(nc * size)
        best = flat[base]
        for i in range(1, size):
            value = flat[base + np.uint64(i)]
            best = best if keeps(decode(best), decode(value)) else value
        y[nc] = best


@njit(parallel=True, **OPTIONS)
def global_sum_pool(x, y, p, p_kind):
    """GlobalAveragePool (p_kind 0) and GlobalLpPool (p_kind 1, 2, 3)."""
    chunks = min(x.shape[0], CHUNKS)
    for chunk in prange(chunks):
        begin, end = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
        global_sum_units(np.int64(begin), np.int64(end), x, y, p, p_kind)


@njit(inline="always")
def channel_sum(flat, base, size, p, p_kind):
    """Four interleaved partial sums, added as (s0 + s1) + (s2 + s3), then the tail: a fixed
    order, whatever the machine."""
    full = size - size % 4
    s0, s1, s2, s3 = 0.0, 0.0, 0.0, 0.0
    for i in range(0, full, 4):
        at = base + np.uint64(i)
        s0 += lp_term(np.float64(decode(flat[at])), p, p_kind)
        s1 += lp_term(np.float64(decode(flat[at + np.uint64(1)])), p, p_kind)
        s2 += lp_term(np.float64(decode(flat[at + np.uint64(2)])), p, p_kind)
        s3 += lp_term(np.float64(decode(flat[at + np.uint64(3)])), p, p_kind)
    total = (s0 + s1) + (s2 + s3)
    for i in range(full, size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@njit(**OPTIONS)
def global_sum_units(begin, end, x, y, p, p_kind):
    flat = x.reshape(x.size)
    size = x.shape[1]
    for nc in range(begin, end):
        base = np.uint64(nc * size)
        # one loop per kind, the kind a constant in each: no branch inside the loop
        if p_kind == 0:
            y[nc] = encode(channel_sum(flat, base, size, p, 0) / size, y)
        elif p_kind == 1:
            y[nc] = encode(channel_sum(flat, base, size, p, 1), y)
        elif p_kind == 2:
            y[nc] = encode(np.sqrt(channel_sum(flat, base, size, p, 2)), y)
        else:
            y[nc] = encode(lp_root(channel_sum(flat, base, size, p, 3), p, 3), y)
