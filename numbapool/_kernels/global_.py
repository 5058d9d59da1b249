"""Global pools: one value per (n, c) over all spatial elements, ``x`` as (N*C, S).

Sums accumulate in float64 whatever the dtype: a channel may hold millions of elements.
"""

import numpy as np
from numba import njit, prange

from .codec import decode, encode
from .window import OPTIONS, lp_root, lp_term


@njit(parallel=True, **OPTIONS)
def global_max_pool(x, y):
    """The largest element of each channel, bit for bit; a NaN anywhere gives the first NaN."""
    for nc in prange(x.shape[0]):
        best = decode(x[nc, 0])
        best_at = 0
        for i in range(x.shape[1]):
            value = decode(x[nc, i])
            if value != value:
                best_at = i
                break
            if value > best:
                best = value
                best_at = i
        y[nc] = x[nc, best_at]


@njit(parallel=True, **OPTIONS)
def global_average_pool(x, y):
    for nc in prange(x.shape[0]):
        total = 0.0
        for i in range(x.shape[1]):
            total += np.float64(decode(x[nc, i]))
        y[nc] = encode(total / x.shape[1], y)


@njit(parallel=True, **OPTIONS)
def global_lp_pool(x, y, p, p_kind):
    for nc in prange(x.shape[0]):
        total = 0.0
        for i in range(x.shape[1]):
            total += lp_term(np.float64(decode(x[nc, i])), p, p_kind)
        y[nc] = encode(lp_root(total, p, p_kind), y)
