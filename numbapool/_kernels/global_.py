"""Global pools: one value per (n, c) over all spatial elements, ``x`` as (N*C, S).

Sums accumulate in float64 whatever the dtype: a channel may hold millions of elements.
A channel's result is that of adding its terms in order. Where the result is rounded to a
narrower dtype, the terms are first added in whatever order vectorizes, with a bound on how
far that sum can lie from the in-order one; when every sum within the bound rounds to the
same result, that result is the in-order one. Of the other channels, a mean whose sum is
exact in float64 in every order (sum_is_exact) keeps it; the rest are summed again in order.
Otherwise channels are scanned GROUP at a time, element i of each in step, so that
the independent in-order scans vectorize.
"""

import math

import numpy as np
from numba import njit
from numba.extending import overload

from .codec import decode, encode, float32_bits
from .prefetch import PREFETCH_INPUT_BYTES, prefetch_ahead
from .scratch import empty
from . import kernel
from .entry import EntryPoint
from .maxima import fold_max
from .sums import lp_root, lp_term
from .vectors import (STORAGE, WIDTH, transposed_sums, vector_key_max, vector_lane_sums,
                      vector_sums)

# Runs of channels the parallel driver deals out, at most: the loops live in plain
# functions, which numba optimizes better than code inside the parallel region.
CHUNKS = 64
# Channels summed side by side; channels whose results are proven together.
GROUP = 16  # a multiple of vectors.WIDTH: group_sums stores WIDTH totals at a time
# Channels up to this many elements are short: their loops ask for memory ahead
SHORT_CHANNEL = 2048
# Channels under this many elements are summed by numba's loop, faster than vectors there
TINY_CHANNEL = 25
# Channels from this many elements on are summed in four vectors side by side
LONG_VECTOR_CHANNEL = 128
# Elements whose float32 magnitudes are added in one run: few enough that the sum lies
# within 2**-4 of the exact one whatever the order ((n - 1) 2**-24 at most)
MAGNITUDE_RUN = 1 << 20
# 2**-53, the unit roundoff of float64
EPSILON = np.finfo(np.float64).eps / 2
# A float32's bits less its sign
MAGNITUDE_BITS = np.uint32(0x7FFFFFFF)


@njit(inline="always")
def channel_max(flat, base, size):
    best = flat[base]
    for i in range(1, size):
        value = flat[base + np.uint64(i)]
        best = fold_max(best, value)
    return best


@njit(inline="always")
def order_key(bits, magnitude_mask, sign_shift):
    """A signed integer that orders like the float whose bits these are: negative floats
    have their magnitude bits flipped. NaNs get keys beyond the infinities. In the width of
    ``bits``: numpy's functions keep it, where Python's operators would widen to int64."""
    return np.bitwise_xor(bits, np.bitwise_and(np.right_shift(bits, sign_shift), magnitude_mask))


@kernel()
def global_max_units(begin, end, x, bits, y, y_bits, magnitude_mask, inf_bits, sign_shift):
    """The first largest element of each channel, bit for bit; a NaN gives the first NaN.

    Each channel's maximum as an integer maximum of order keys over ``bits`` (the
    elements' bit patterns as signed integers), in explicit vectors (vectors.py). Equal
    floats other than zeros and NaNs have equal bits, so that maximum is the first maximum;
    a channel whose maximum is a zero (+0 and -0 tie) or that holds a NaN is scanned again
    in order.
    ``magnitude_mask``, ``inf_bits`` and ``sign_shift`` have the type of ``bits``, so that
    the integer arithmetic stays in that width: as many elements per vector as the dtype
    allows."""
    flat, flat_bits = x.reshape(x.size), bits.reshape(bits.size)
    size = np.uint64(x.shape[1])
    # short channels of an input past a share of the caches: their loads wait on memory
    # (128x2048x7x7, 51 MB: 1.10x slower without), where inputs that stay in the caches
    # gain nothing from asking ahead (32x2048x7x7, 12.8 MB: 0.94 without)
    ahead = x.shape[1] <= SHORT_CHANNEL and x.size * x.itemsize >= PREFETCH_INPUT_BYTES
    for nc in range(begin, end):
        base = np.uint64(nc) * size
        if ahead:
            prefetch_ahead(flat_bits, base, size)
        best_key, largest_magnitude = vector_key_max(flat_bits, base, size, magnitude_mask,
                                                     sign_shift)
        best = order_key(best_key, magnitude_mask, sign_shift)  # the key's own inverse
        if largest_magnitude > inf_bits or best & magnitude_mask == 0:
            y[nc] = channel_max(flat, base, size)
        else:
            y_bits[nc] = best


def global_sum_entry(p_kind, narrow):
    """The serial entry point of GlobalAveragePool (p_kind 0) or GlobalLpPool (p_kind 1 to
    4: |x|, x ** 2, |x| ** 3, |x| ** p), compiled for its own kind (entry.py): for results
    ``narrow``er than float64 and p_kind up to 2, reordered_units; else global_sum_units
    (float64 results would need the exact sum, no gain; p_kind 3's root is not monotonic).
    Chosen here, not by a branch in the kernel, which compiled the other kernel's loops
    too."""
    return EntryPoint(reordered_units if narrow and p_kind <= 2 else global_sum_units,
                      (p_kind,))


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
@kernel(fastmath={"reassoc"})
def reordered_sum(flat, base, size, p, p_kind):
    """The sum of a channel's terms, added in whatever order the compiler picks, which
    vectorizes."""
    total = 0.0
    for i in range(size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@kernel(fastmath={"reassoc"})
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


def channel_sums(flat, base, size):
    """(the sum of a channel's elements in float64, added in an order of its own; at least
    the sum of their magnitudes). Long channels (LONG_VECTOR_CHANNEL elements and more) in
    explicit vectors (vectors.py), with twice the float32 sum of the magnitudes as the
    bound; the others in reordered_sums. Short channels go through group_sums first."""


@overload(channel_sums, inline="always")
def _channel_sums_overload(flat, base, size):
    if flat.dtype not in STORAGE:
        return lambda flat, base, size: reordered_sums(flat, base, size)

    def impl(flat, base, size):
        if size < LONG_VECTOR_CHANNEL:
            return reordered_sums(flat, base, size)
        total = bound = 0.0
        start = np.uint64(0)
        while start < size:
            run = min(np.uint64(MAGNITUDE_RUN), size - start)
            run_total, magnitudes = vector_sums(flat, base + start, run)
            total += run_total
            bound += 2.0 * magnitudes
            start += run
        return total, bound

    return impl


def group_sums(flat, first, channels, size, totals, bounds, lanes):
    """Sum the ``channels`` channels from ``first`` into totals[k] and bounds[k] (as
    channel_sums) where it is faster WIDTH channels at a time: float32 and 16-bit channels
    from TINY_CHANNEL elements up to LONG_VECTOR_CHANNEL, each in one vector
    (vectors.vector_lane_sums), their horizontal sums WIDTH at a time
    (vectors.transposed_sums). ``lanes`` is the (float64, float32) scratch of WIDTH vectors
    each. Returns how many it summed: 0 or ``channels``."""


@overload(group_sums, inline="always")
def _group_sums_overload(flat, first, channels, size, totals, bounds, lanes):
    if flat.dtype not in STORAGE:
        return lambda flat, first, channels, size, totals, bounds, lanes: 0

    def impl(flat, first, channels, size, totals, bounds, lanes):
        if size < TINY_CHANNEL or size >= LONG_VECTOR_CHANNEL:
            return 0
        lane_totals, lane_magnitudes = lanes
        for k in range(channels):
            slot = k % WIDTH
            vector_lane_sums(flat, np.uint64(first + k) * size, size, lane_totals,
                             lane_magnitudes, np.uint64(slot))
            # a last group of fewer channels adds up lanes left by the group before too:
            # their sums land past the channels, unread
            if slot == WIDTH - 1 or k == channels - 1:
                transposed_sums(lane_totals, lane_magnitudes, totals, bounds,
                                np.uint64(k - slot))
        return channels

    return impl


@njit(inline="always")
def in_order_sum(flat, base, size, p, p_kind):
    total = 0.0
    for i in range(size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@njit(inline="always")
def result_at(total, inverse, p, p_kind, y):
    """The rounded result a sum of ``total`` gives: a mean as a product with 1 / n, which
    vectorizes where a division does not (the proof's slack covers its rounding)."""
    if p_kind == 0:
        return encode(total * inverse, y)
    return encode(lp_root(total, p, p_kind), y)


@njit(inline="always")
def proven_result(total, bound, count, inverse, p, p_kind, y):
    """(channel's result from ``total``, its terms' sum in another order; whether that is
    provably the in-order result), with ``bound`` at least the sum of the terms' magnitudes.

    Two float64 sums of the same n terms in different orders differ by at most
    2 (n - 1) 2**-53 ``bound``, and the mean (or root) and the rounding to y's dtype never
    reverse an order: if both ends of that interval give one result, the in-order sum
    gives it too. The slack is twice that, plus 8 2**-53 ``bound`` for the rounding of the
    ends and of their product with the rounded 1 / n."""
    slack = 4.0 * (count + 1.0) * EPSILON * bound
    low = result_at(total - slack, inverse, p, p_kind, y)
    high = result_at(total + slack, inverse, p, p_kind, y)
    # Left to the in-order scan: a zero result (it compares equal to the other zero) unless
    # every term is zero, and a bound that is not finite (16-bit results compare as bits,
    # where NaN equals NaN). Bitwise, not short-circuit: the block's loop of checks has no
    # branch, and vectorizes.
    return low, (low == high) & ((low != 0) | (bound == 0)) & (bound < np.inf)


@kernel()
def sum_is_exact(flat, base, size, bound):
    """Whether every float64 sum of the channel's terms, in any order, is exact, and so
    equal to the in-order one; ``bound`` is at least the sum of their magnitudes.

    Every element is a multiple of the float32 spacing at the smallest nonzero magnitude
    (float16 and bfloat16 elements are float32 values too): if ``bound`` is at most 2**53
    of those spacings, so is every partial sum, which float64 then holds exactly. The
    smallest magnitude is an integer minimum over the float32 bits less one (zero wraps to
    the largest), which vectorizes: cheap next to an in-order sum, whose additions wait
    on each other. True of most channels whose mean lies halfway between two results."""
    smallest = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(size):
        bits = float32_bits(np.float32(decode(flat[base + np.uint64(i)])))
        smallest = min(smallest, np.uint64(bits & MAGNITUDE_BITS) - np.uint64(1))
    exponent = np.int64((smallest + np.uint64(1)) >> np.uint64(23))
    # the spacing at a float32 of biased exponent e is 2**(max(e, 1) - 150)
    return bound <= math.ldexp(1.0, max(exponent, 1) - 150 + 53)


@kernel()
def reordered_units(begin, end, x, y, p, p_kind):
    """Channels [begin, end) from reordered sums where they give the in-order result,
    else from in-order sums. Called with ``p_kind`` a literal: a loop of its own per kind.

    Channels go GROUP at a time: each is summed, then the group's proofs are checked in
    one loop, which vectorizes. Averages need a bound on the sum of the terms' magnitudes
    for the proof (channel_sums); LpPool's terms |x| ** p are never negative: their sum is
    its own bound."""
    flat = x.reshape(x.size)
    size = np.uint64(x.shape[1])
    count = np.float64(x.shape[1])  # the divisor, converted once
    inverse = 1.0 / count
    totals = empty(GROUP, np.float64)
    bounds = empty(GROUP, np.float64)
    lanes = (empty(WIDTH * WIDTH, np.float64), empty(WIDTH * WIDTH, np.float32))
    for first in range(begin, end, GROUP):
        channels = min(GROUP, end - first)
        summed = (group_sums(flat, first, channels, size, totals, bounds, lanes)
                  if p_kind == 0 else 0)
        for k in range(summed, channels):
            base = np.uint64(first + k) * size
            if p_kind == 0:
                totals[k], bounds[k] = channel_sums(flat, base, size)
            else:
                totals[k] = bounds[k] = reordered_sum(flat, base, size, p, p_kind)
        # unsigned indices: no wraparound of negative ones to check, so the loop vectorizes
        out = np.uint64(first)
        unproven = False
        for k in range(channels):
            y[out + np.uint64(k)], proven = proven_result(totals[k], bounds[k], count, inverse,
                                                          p, p_kind, y)
            unproven |= not proven
        if not unproven:
            continue
        # Rare: the channels the proof leaves. Their proofs are checked again rather than
        # kept from the loop above: keeping them measured slower.
        for k in range(channels):
            bound = bounds[k]
            if proven_result(totals[k], bound, count, inverse, p, p_kind, y)[1]:
                continue
            base = np.uint64(first + k) * size
            if p_kind == 0 and bound < np.inf and sum_is_exact(flat, base, size, bound):
                total = totals[k]
            else:
                total = in_order_sum(flat, base, size, p, p_kind)
            y[first + k] = _finish(total, count, p, p_kind, y)


@kernel()
def global_sum_units(begin, end, x, y, p, p_kind):
    """Each channel's terms added in order, channels GROUP at a time, element i of each in
    step (see the module's docstring). ``p_kind`` arrives as a literal (global_sum_entry):
    each call below is compiled for that one kind, and its tests of the kind fold away."""
    flat = x.reshape(x.size)
    size = np.uint64(x.shape[1])
    totals = empty(GROUP, np.float64)
    for first in range(begin, end, GROUP):
        count = min(GROUP, end - first)
        base = np.uint64(first) * size
        for c in range(GROUP):
            totals[c] = 0.0
        if count == GROUP:
            _group_sums(flat, base, size, totals, p, p_kind)  # the kind a constant: vectorizes
        else:
            for c in range(count):
                totals[c] = in_order_sum(flat, base + np.uint64(c) * size, size, p, p_kind)
        for c in range(count):
            y[first + c] = _finish(totals[c], size, p, p_kind, y)


@kernel()
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


@kernel()
def global_sum_finish(totals, size, y, p, p_kind):
    """The mean or the root of each total, rounded once, as global_sum_units ends."""
    for nc in range(totals.shape[0]):
        y[nc] = _finish(totals[nc], size, p, p_kind, y)
