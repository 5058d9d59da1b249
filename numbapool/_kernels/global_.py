"""Global pools: one value per (n, c) over all spatial elements, ``x`` as (N*C, S).

Sums accumulate in float64 whatever the dtype: a channel may hold millions of elements.
A channel's result is that of adding its terms in order. Where the result is rounded to a
narrower dtype, the terms are first added in whatever order vectorizes, with a bound on how
far that sum can lie from the in-order one; when every sum within the bound rounds to the
same result, that result is the in-order one, and only the other channels are summed again
in order. Otherwise channels are scanned GROUP at a time, element i of each in step, so that
the independent in-order scans vectorize.
"""

import numpy as np
from numba import njit, prange

from .codec import decode, encode
from .prefetch import prefetch_ahead
from .threads import use_threads
from .window import OPTIONS, keeps, lp_root, lp_term

# Contiguous runs of channels per parallel chunk: the loops live in plain functions, which
# numba optimizes better than code inside the parallel region.
CHUNKS = 64
# Channels summed side by side; channels whose magnitudes are bounded together.
GROUP = 16
# Elements of a block of short channels, which stays in the nearest cache between its
# magnitudes' pass and its sums; few enough too that a float32 sum of their magnitudes
# stays within 1% (2**-24 per addition).
PIECE = 4096
# Channels up to this many elements are short: their loops ask for memory ahead
SHORT_CHANNEL = PIECE // 2
# 2**-53, the unit roundoff of float64
EPSILON = np.finfo(np.float64).eps / 2


@njit(parallel=True, **OPTIONS)
def global_max_pool(x, bits, y, y_bits, magnitude_mask, inf_bits, sign_shift, threads):
    """The first largest element of each channel, bit for bit; a NaN gives the first NaN."""
    chunks = min(x.shape[0], CHUNKS)
    before = use_threads(threads)
    for chunk in prange(chunks):
        begin, end = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
        global_max_units(np.int64(begin), np.int64(end), x, bits, y, y_bits, magnitude_mask,
                         inf_bits, sign_shift)
    use_threads(before)


@njit(inline="always")
def channel_max(flat, base, size):
    best = flat[base]
    for i in range(1, size):
        value = flat[base + np.uint64(i)]
        best = best if keeps(decode(best), decode(value)) else value
    return best


@njit(inline="always")
def order_key(bits, magnitude_mask, sign_shift):
    """A signed integer that orders like the float whose bits these are: negative floats
    have their magnitude bits flipped. NaNs get keys beyond the infinities. In the width of
    ``bits``: numpy's functions keep it, where Python's operators would widen to int64."""
    return np.bitwise_xor(bits, np.bitwise_and(np.right_shift(bits, sign_shift), magnitude_mask))


@njit(**OPTIONS)
def global_max_units(begin, end, x, bits, y, y_bits, magnitude_mask, inf_bits, sign_shift):
    """Each channel's maximum as an integer maximum of order keys over ``bits`` (the
    elements' bit patterns as signed integers), which vectorizes. Equal floats other than
    zeros and NaNs have equal bits, so that maximum is the first maximum; a channel whose
    maximum is a zero (+0 and -0 tie) or that holds a NaN is scanned again in order.
    ``magnitude_mask``, ``inf_bits`` and ``sign_shift`` have the type of ``bits``, so that
    the integer arithmetic stays in that width: as many elements per vector as the dtype
    allows."""
    flat, flat_bits = x.reshape(x.size), bits.reshape(bits.size)
    size = np.uint64(x.shape[1])
    short = x.shape[1] <= SHORT_CHANNEL
    for nc in range(begin, end):
        base = np.uint64(nc) * size
        if short:
            prefetch_ahead(flat_bits, base, size)
        best_key = order_key(flat_bits[base], magnitude_mask, sign_shift)
        largest_magnitude = np.bitwise_and(flat_bits[base], magnitude_mask)
        for i in range(size):
            element = flat_bits[base + np.uint64(i)]
            best_key = max(best_key, order_key(element, magnitude_mask, sign_shift))
            largest_magnitude = max(largest_magnitude, np.bitwise_and(element, magnitude_mask))
        best = order_key(best_key, magnitude_mask, sign_shift)  # the key's own inverse
        if largest_magnitude > inf_bits or best & magnitude_mask == 0:
            y[nc] = channel_max(flat, base, size)
        else:
            y_bits[nc] = best


@njit(parallel=True, **OPTIONS)
def global_sum_pool(x, y, p, p_kind, threads):
    """GlobalAveragePool (p_kind 0) and GlobalLpPool (p_kind 1, 2, 3)."""
    chunks = min(x.shape[0], CHUNKS)
    before = use_threads(threads)
    for chunk in prange(chunks):
        begin, end = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
        global_sum_units(np.int64(begin), np.int64(end), x, y, p, p_kind)
    use_threads(before)


@njit(inline="always")
def _group_sums(flat, base, size, totals, p, p_kind):
    for i in range(size):
        for c in range(GROUP):
            totals[c] += lp_term(np.float64(decode(flat[base + np.uint64(c) * size + np.uint64(i)])),
                                 p, p_kind)


@njit(inline="always")
def _finish(total, size, p, p_kind, y):
    if p_kind == 0:
        return encode(total / size, y)
    return encode(lp_root(total, p, p_kind), y)


# Not inlined: numba would compile the inlined loop with its caller's strict float flags.
@njit(fastmath={"reassoc"}, **OPTIONS)
def reordered_sum(flat, base, size, p, p_kind):
    """The sum of a channel's terms, added in whatever order the compiler picks, which
    vectorizes."""
    total = 0.0
    for i in range(size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@njit(fastmath={"reassoc"}, **OPTIONS)
def reordered_sums(flat, base, size):
    """(the sum of a channel's elements, the sum of their magnitudes), each added in
    whatever order the compiler picks."""
    total = 0.0
    magnitudes = 0.0
    for i in range(size):
        term = np.float64(decode(flat[base + np.uint64(i)]))
        total += term
        magnitudes += abs(term)
    return total, magnitudes


@njit(fastmath={"reassoc"}, **OPTIONS)
def magnitudes_bound(flat, start, count):
    """At least the sum of |x| over flat[start:start + count], count <= PIECE: their float32
    sum, within 1% of the exact one whatever the order, doubled."""
    magnitudes = np.float32(0)
    for i in range(start, start + count):
        magnitudes += abs(np.float32(decode(flat[i])))
    return 2.0 * np.float64(magnitudes)


@njit(inline="always")
def in_order_sum(flat, base, size, p, p_kind):
    total = 0.0
    for i in range(size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@njit(inline="always")
def proven_result(total, magnitudes, count, p, p_kind, y):
    """(channel's result from ``total``, its terms' sum in another order; whether that is
    provably the in-order result). Two float64 sums of the same n terms in different orders
    differ by at most 2 (n - 1) 2**-53 times the sum of the terms' magnitudes (of which
    ``magnitudes`` is an upper bound), and the division (or root) and the rounding to y's
    dtype never reverse an order. So if both ends of that interval give one result, the
    in-order sum gives it too."""
    # 4 n 2**-53: twice the bound, so that rounding in the ends themselves is covered
    slack = 4.0 * count * EPSILON * magnitudes
    low = _finish(total - slack, count, p, p_kind, y)
    high = _finish(total + slack, count, p, p_kind, y)
    # Left to the in-order scan: a zero result (it compares equal to the other zero), and
    # a bound that is not finite (16-bit results compare as bits, where NaN equals NaN).
    # Bitwise, not short-circuit: no branch per condition in a block's loop of checks.
    return low, (low == high) & ((low != 0) | (magnitudes == 0)) & (magnitudes < np.inf)


@njit(**OPTIONS)
def reordered_units(begin, end, x, y, p, p_kind):
    """Channels [begin, end) from reordered sums where they give the in-order result,
    else from in-order sums. Called with ``p_kind`` a literal: a loop of its own per kind.

    Averages need the sum of the terms' magnitudes for the proof. Short channels go in
    blocks of up to PIECE elements, which stay in the nearest cache: the block's
    magnitudes are bounded in one cheap pass, then each channel is summed, its loop first
    asking for the memory ahead (prefetch_ahead), and then the block's proofs are checked
    in one loop; a long channel adds its magnitudes in its summing loop. LpPool's terms
    |x| ** p are never negative: their sum is its own bound."""
    flat = x.reshape(x.size)
    size = np.uint64(x.shape[1])
    count = np.float64(x.shape[1])  # the divisor, converted once
    short = x.shape[1] <= SHORT_CHANNEL
    per_block = min(GROUP, PIECE // x.shape[1]) if short else 1
    totals = np.empty(per_block, np.float64)
    magnitudes = 0.0
    for first in range(begin, end, per_block):
        channels = min(per_block, end - first)
        if p_kind == 0 and short:
            magnitudes = magnitudes_bound(flat, np.uint64(first) * size,
                                          np.uint64(channels) * size)
        for k in range(channels):
            base = np.uint64(first + k) * size
            if short:
                prefetch_ahead(flat, base, size)
                totals[k] = reordered_sum(flat, base, size, p, p_kind)
            elif p_kind == 0:
                totals[k], magnitudes = reordered_sums(flat, base, size)
            else:
                totals[k] = reordered_sum(flat, base, size, p, p_kind)
        unproven = 0
        for k in range(channels):
            bound = magnitudes if p_kind == 0 else totals[k]
            y[first + k], proven = proven_result(totals[k], bound, count, p, p_kind, y)
            unproven += 0 if proven else 1
        if unproven == 0:
            continue
        # Rare: the channels the proof leaves, summed in order. Their proofs are checked
        # again rather than kept from the loop above: keeping them measured slower.
        for k in range(channels):
            bound = magnitudes if p_kind == 0 else totals[k]
            if not proven_result(totals[k], bound, count, p, p_kind, y)[1]:
                total = in_order_sum(flat, np.uint64(first + k) * size, size, p, p_kind)
                y[first + k] = _finish(total, count, p, p_kind, y)


@njit(**OPTIONS)
def global_sum_units(begin, end, x, y, p, p_kind):
    """Each channel's terms added in order, or a result proved equal to that (see the
    module's docstring); otherwise channels go GROUP at a time, element i of each in step."""
    if y.itemsize < 8:  # float64 results would need the exact sum: no gain
        if p_kind == 0:
            return reordered_units(begin, end, x, y, p, 0)
        if p_kind == 1:
            return reordered_units(begin, end, x, y, p, 1)
        if p_kind == 2:
            return reordered_units(begin, end, x, y, p, 2)
    flat = x.reshape(x.size)
    size = np.uint64(x.shape[1])
    totals = np.empty(GROUP, np.float64)
    for first in range(begin, end, GROUP):
        count = min(GROUP, end - first)
        base = np.uint64(first) * size
        for c in range(GROUP):
            totals[c] = 0.0
        if count == GROUP:
            # one loop per kind, the kind a constant in each, so that it vectorizes
            if p_kind == 0:
                _group_sums(flat, base, size, totals, p, 0)
            elif p_kind == 1:
                _group_sums(flat, base, size, totals, p, 1)
            elif p_kind == 2:
                _group_sums(flat, base, size, totals, p, 2)
            else:
                _group_sums(flat, base, size, totals, p, 3)
        else:
            for c in range(count):
                totals[c] = in_order_sum(flat, base + np.uint64(c) * size, size, p, p_kind)
        for c in range(count):
            y[first + c] = _finish(totals[c], size, p, p_kind, y)


@njit(**OPTIONS)
def global_sum_continue(x, totals, p, p_kind):
    """Add each channel's terms, in order, to its running float64 total: the sum that
    global_sum_units makes, continued across consecutive slabs of the channels."""
    flat = x.reshape(x.size)
    size = np.uint64(x.shape[1])
    for nc in range(x.shape[0]):
        base = np.uint64(nc) * size
        total = totals[nc]
        for i in range(size):
            total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
        totals[nc] = total


@njit(**OPTIONS)
def global_sum_finish(totals, size, y, p, p_kind):
    """The mean or the root of each total, rounded once, as global_sum_units ends."""
    for nc in range(totals.shape[0]):
        y[nc] = _finish(totals[nc], size, p, p_kind, y)
