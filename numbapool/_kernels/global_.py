"""Global pools: one value per (n, c) over all spatial elements, ``x`` as (N*C, S).

GlobalMaxPool: a channel's largest in explicit vectors, taken again in order where a zero
or a NaN makes the order matter (store_first_max). GlobalAveragePool of dtypes narrower
than float64: float32 block sums in the order docs/semantics.md states (block_sum_units).
GlobalLpPool, and GlobalAveragePool of float64, accumulate in float64, a channel's result
that of adding its terms in order: where the result is rounded to a narrower dtype, the
terms are first added in whatever order vectorizes, and when every sum within a bound of
the in-order one rounds to the same result, that result is the in-order one; the rest are
summed again in order (reordered_units). Otherwise channels are scanned GROUP at a time,
element i of each in step, so that the independent in-order scans vectorize.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from . import kernel
from .codec import decode, encode
from .family import Family, p_kind
from .global_vectors import (
    LANES,
    add_to_lanes,
    block_sum,
    half_line_block_sum,
    store_float_max,
    vector_key_max,
)
from .maxima import fold_max
from .prefetch import AHEAD_BYTES, LINE_BYTES, prefetch
from .scratch import empty, flat_view, release
from .sums import lp_root, lp_term

# GlobalAveragePool's float32 sums: elements of a channel to a block (docs/semantics.md)
BLOCK = 1024  # a multiple of global_vectors.LANES
# Channels whose means block_sum_units divides in one loop, which vectorizes: 7x7 channels
# in 0.90 of the time that 16 at a time take
BLOCK_GROUP = 64
# Channels summed side by side; channels whose results are proven together.
GROUP = 16
# Channels up to this many elements are short: their loops ask for memory ahead where a
# thread's share of the input is large (prefetch.reads_ahead)
SHORT_CHANNEL = 2048
# 2**-53, the unit roundoff of float64
EPSILON = np.finfo(np.float64).eps / 2


@njit(inline="always")
def smaller(a, b):
    """The smaller of a and b: numba's min() is a function of its own, compiled for each
    pair of types (two of them took 35 ms of GlobalAveragePool's first call)."""
    return a if a < b else b


@njit(inline="always")
def ask_ahead(flat, base, count, ahead, line):
    """Ask for the cache lines of flat[base + ahead:base + ahead + count], ``line``
    elements a line, in a loop of the calling kernel's own: through prefetch_ahead (a
    function compiled for each dtype) a first call on an empty cache took 0.05 to 0.23 s
    longer."""
    at = base + ahead  # a range with a step would divide for its count
    while at < base + ahead + count:
        prefetch(flat, at)
        at += line


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


def store_first_max(
    flat, flat_bits, base, size, y, y_bits, nc, magnitude_mask, inf_bits, sign_shift
):
    """Store channel nc's first largest element in y[nc] (its bits in y_bits[nc]) and
    return True, unless the channel holds a NaN or its largest is a zero (+0 and -0 tie),
    which the caller takes again in order. Equal floats other than zeros and NaNs have
    equal bits, so any largest is the first. float32 and float64 through
    global_vectors.store_float_max, 16-bit floats as the largest of their order keys
    (global_vectors.vector_key_max)."""


@overload(store_first_max, inline="always")
def _store_first_max_overload(
    flat, flat_bits, base, size, y, y_bits, nc, magnitude_mask, inf_bits, sign_shift
):
    if flat.dtype in (types.float32, types.float64):

        def floats(
            flat, flat_bits, base, size, y, y_bits, nc, magnitude_mask, inf_bits, sign_shift
        ):
            return store_float_max(flat, base, size, y, nc)

        return floats

    def keys(flat, flat_bits, base, size, y, y_bits, nc, magnitude_mask, inf_bits, sign_shift):
        best_key, largest_magnitude = vector_key_max(
            flat_bits, base, size, magnitude_mask, sign_shift
        )
        best = order_key(best_key, magnitude_mask, sign_shift)  # the key's own inverse
        if largest_magnitude > inf_bits or best & magnitude_mask == 0:
            return False
        y_bits[nc] = best
        return True

    return keys


@kernel()
def global_max_units(
    begin, end, x, bits, y, y_bits, magnitude_mask, inf_bits, sign_shift, reads_ahead
):
    """The first largest element of each channel, bit for bit; a NaN gives the first NaN.

    Each channel's largest in explicit vectors (store_first_max); a channel whose largest
    is a zero or that holds a NaN is scanned again in order. ``bits`` are the elements' bit
    patterns as signed integers; ``magnitude_mask``, ``inf_bits`` and ``sign_shift`` have
    their type, so that the integer arithmetic stays in that width: as many elements per
    vector as the dtype allows. ``reads_ahead`` (prefetch.reads_ahead): short channels ask
    for memory ahead, their loads waiting on memory otherwise."""
    flat, flat_bits = flat_view(x), flat_view(bits)
    size = np.uint64(x.shape[1])
    line = np.uint64(LINE_BYTES // x.itemsize)
    ahead = np.uint64(AHEAD_BYTES // x.itemsize)
    asks = reads_ahead and x.shape[1] <= SHORT_CHANNEL
    for channel in range(begin, end):
        nc = np.uint64(channel)  # unsigned: its stores need no wraparound
        base = nc * size
        if asks:
            ask_ahead(flat, base, size, ahead, line)
        if not store_first_max(
            flat, flat_bits, base, size, y, y_bits, nc, magnitude_mask, inf_bits, sign_shift
        ):
            y[nc] = channel_max(flat, base, size)


@njit(inline="always")
def _group_sums(flat, base, size, totals, p, p_kind):
    for i in range(size):
        for c in range(GROUP):
            totals[c] += lp_term(
                np.float64(decode(flat[base + np.uint64(c) * size + np.uint64(i)])), p, p_kind
            )


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


@njit(inline="always")
def in_order_sum(flat, base, size, p, p_kind):
    total = 0.0
    for i in range(size):
        total += lp_term(np.float64(decode(flat[base + np.uint64(i)])), p, p_kind)
    return total


@njit(inline="always")
def proven_result(total, count, p, p_kind, y):
    """(channel's result from ``total``, its terms' sum in another order; whether that is
    provably the in-order result). The terms |x| ** p are never negative: their sum is the
    sum of their magnitudes.

    Two float64 sums of the same n terms in different orders differ by at most
    2 (n - 1) 2**-53 ``total``, and the root and the rounding to y's dtype never reverse an
    order: if both ends of that interval give one result, the in-order sum gives it too.
    The slack is twice that, plus 8 2**-53 ``total`` for the rounding of the ends."""
    slack = 4.0 * (count + 1.0) * EPSILON * total
    low = encode(lp_root(total - slack, p, p_kind), y)
    high = encode(lp_root(total + slack, p, p_kind), y)
    # Left to the in-order scan: a zero result (it compares equal to the other zero) unless
    # every term is zero, and a sum that is not finite (16-bit results compare as bits,
    # where NaN equals NaN). Bitwise, not short-circuit: the block's loop of checks has no
    # branch, and vectorizes.
    return low, (low == high) & ((low != 0) | (total == 0)) & (total < np.inf)


@kernel()
def reordered_units(begin, end, x, y, p, p_kind):
    """GlobalLpPool's channels [begin, end) from reordered sums where they give the
    in-order result, else from in-order sums. Called with ``p_kind`` a literal: a loop of
    its own per kind. Channels go GROUP at a time: each is summed, then the group's proofs
    are checked in one loop, which vectorizes."""
    flat = flat_view(x)
    size = np.uint64(x.shape[1])
    count = np.float64(x.shape[1])
    totals = empty(GROUP, np.float64)
    for first in range(begin, end, GROUP):
        channels = smaller(GROUP, end - first)
        for k in range(channels):
            totals[k] = reordered_sum(flat, np.uint64(first + k) * size, size, p, p_kind)
        # unsigned indices: no wraparound of negative ones to check, so the loop vectorizes
        out = np.uint64(first)
        unproven = False
        for k in range(channels):
            y[out + np.uint64(k)], proven = proven_result(totals[k], count, p, p_kind, y)
            unproven |= not proven
        if not unproven:
            continue
        # Rare: the channels the proof leaves. Their proofs are checked again rather than
        # kept from the loop above: keeping them measured slower.
        for k in range(channels):
            if proven_result(totals[k], count, p, p_kind, y)[1]:
                continue
            total = in_order_sum(flat, np.uint64(first + k) * size, size, p, p_kind)
            y[first + k] = _finish(total, count, p, p_kind, y)
    release(totals)


@kernel()
def global_sum_units(begin, end, x, y, p, p_kind):
    """Each channel's terms added in order, channels GROUP at a time, element i of each in
    step (see the module's docstring). ``p_kind`` arrives as a literal (IN_ORDER_FAMILY):
    each call below is compiled for that one kind, and its tests of the kind fold away."""
    flat = flat_view(x)
    size = np.uint64(x.shape[1])
    totals = empty(GROUP, np.float64)
    for first in range(begin, end, GROUP):
        count = smaller(GROUP, end - first)
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
    release(totals)


def _channel_sums(block_sum):
    """A channel's float32 block sums, each ``block_sum(flat, start, count)``
    (global_vectors.block_sum, or a way of loading the same sums), added in order in
    float64; before each block, a request for the line ``ahead`` elements past its start.
    An ``ahead`` of 0 asks for the block's own first line, which it reads next, so that
    the loop is one either way: a loop over a count of lines, 0 where it did not read
    ahead, took 1.04x to 1.11x as long over long channels on one core, either way."""

    @njit(inline="always")
    def channel_sums(flat, base, size, ahead):
        total = 0.0
        start = np.uint64(0)
        while start < size:
            run = smaller(np.uint64(BLOCK), size - start)
            prefetch(flat, base + start + ahead)
            total += np.float64(block_sum(flat, base + start, run))
            start += run
        return total

    return channel_sums


channel_block_sums = _channel_sums(block_sum)
half_line_channel_sums = _channel_sums(half_line_block_sum)


@kernel()
def block_sum_units(begin, end, x, y, reads_ahead):
    """GlobalAveragePool's channels [begin, end) for results narrower than float64: each
    the sum of its float32 block sums in float64, over the channel's size. The means of
    BLOCK_GROUP channels at a time, in a loop that vectorizes the divisions.
    ``reads_ahead`` (prefetch.reads_ahead, chosen by prefetch.AheadChoice): channels of
    one block ask for memory ahead (32x2048x7x7 on one core: 0.74 of the time), and a
    longer channel asks, before each block, for the line a page and a line past the
    block's start, since the hardware prefetchers stop at a page's end. On the Zen 4 one
    core then read 12.8 MB of long channels in 0.93 to 0.95 of the time and of big planes
    in 0.93 to 1.00; asking for four lines took 1.05x as long, and at 2 threads, each
    reading half, where reads_ahead does not offer it, the one line took 1.03x to 1.05x."""
    flat = flat_view(x)
    size = np.uint64(x.shape[1])
    count = np.float64(x.shape[1])  # the divisor, converted once
    totals = empty(BLOCK_GROUP, np.float64)
    # asking ahead with no branch around it (ask_ahead), which runs no pass where it does
    # not read ahead: under a branch, which LLVM takes out of the loop, copying the loop, a
    # first call on an empty cache took 0.15 to 0.23 s longer
    line = np.uint64(LINE_BYTES // x.itemsize)
    ahead = np.uint64(AHEAD_BYTES // x.itemsize)
    asked = size if reads_ahead else np.uint64(0)
    past_page = ahead + line if reads_ahead else np.uint64(0)
    for first in range(begin, end, BLOCK_GROUP):
        channels = smaller(BLOCK_GROUP, end - first)
        if size <= BLOCK:  # a block a channel, with no loop over blocks: 0.8 of the time
            for k in range(channels):
                base = np.uint64(first + k) * size
                ask_ahead(flat, base, asked, ahead, line)
                totals[k] = np.float64(block_sum(flat, base, size))
        else:
            for k in range(channels):
                totals[k] = channel_block_sums(flat, np.uint64(first + k) * size, size, past_page)
        out = np.uint64(first)  # unsigned: no wraparound to check, the loop vectorizes
        for k in range(channels):
            y[out + np.uint64(k)] = encode(totals[k] / count, y)
    release(totals)


# Where a channel that half_line_sum_units reads starts for its blocks to be loaded
# half a line at a time: on half a cache line (32 bytes)
HALF_LINE_BYTES = LINE_BYTES // 2


@kernel()
def half_line_sum_units(begin, end, x, y):
    """block_sum_units's channels [begin, end), longer than a block, read ahead on the
    calling thread alone: the same sums, bit for bit, with the blocks of a float32 channel
    that starts on HALF_LINE_BYTES loaded half a line at a time
    (global_vectors.half_line_block_sum), those of other channels in whole lines, each
    block asking for the line a page past it. Whole lines from a line's start or half way
    wait longest on the L3: on the Zen 4 one core summed 12.8 MB of long channels or big
    planes starting there in 0.96 to 0.98 of the time in half lines asking a page ahead,
    and in half lines that ask for nothing ahead (the loop's own first line) 0.97 to 0.98
    of that again (16 or 48 bytes past a line's start, whole lines across two lines ask
    for the second early: faster than half lines, 1.05x to 1.09x). A kernel of its own,
    compiled once a call shape reads ahead on one thread: beside block_sum_units's loop in
    that kernel, the half lines made the loop two threads run 1.01x to 1.035x slower."""
    flat = flat_view(x)
    size = np.uint64(x.shape[1])
    count = np.float64(x.shape[1])
    past_page = np.uint64((AHEAD_BYTES + LINE_BYTES) // x.itemsize)
    half_line = np.uint64(HALF_LINE_BYTES)
    for channel in range(begin, end):
        base = np.uint64(channel) * size
        if (flat.ctypes.data + base * np.uint64(x.itemsize)) % half_line == 0:
            total = half_line_channel_sums(flat, base, size, np.uint64(0))
        else:
            total = channel_block_sums(flat, base, size, past_page)
        y[channel] = encode(total / count, y)


@njit(inline="always")
def _lane_tree(lanes):
    """global_vectors._lane_tree over the lanes in memory, which it empties: lane 0 after lane
    l + h is added to lane l for h = LANES / 2, ..., 1."""
    half = LANES // 2
    while half:
        for lane in range(half):
            lanes[lane] += lanes[lane + half]
        half //= 2
    total = lanes[0]
    for lane in range(LANES):
        lanes[lane] = 0.0
    return total


@kernel()
def block_sum_continue(x, totals, lanes, start):
    """Carry block_sum_units' sums across consecutive slabs of the channels, ``start``
    elements of each before this slab: totals[nc] holds the float64 sum of the channel's
    whole blocks so far, lanes[nc] the lanes of the block it is in."""
    flat = flat_view(x)
    size = np.uint64(x.shape[1])
    block = np.uint64(BLOCK)
    width = np.uint64(LANES)
    for nc in range(x.shape[0]):
        base = np.uint64(nc) * size
        row = lanes[nc]
        done = np.uint64(0)
        while done < size:
            at = (np.uint64(start) + done) % block  # where in its block the run starts
            run = smaller(block - at, size - done)
            # elements up to a lane 0 one by one, then whole runs of lanes in vectors
            head = smaller(run, (width - at % width) % width)
            for i in range(head):
                element = flat[base + done + np.uint64(i)]
                row[(at + np.uint64(i)) % width] += np.float32(decode(element))
            add_to_lanes(flat, base + done + head, run - head, row)
            done += run
            if at + run == block:
                totals[nc] += np.float64(_lane_tree(row))


@kernel()
def block_sum_finish(totals, lanes, size, y):
    """The mean of each channel from block_sum_continue's sums: a last block shorter than
    BLOCK, still in its lanes, added before the division."""
    for nc in range(totals.shape[0]):
        total = totals[nc]
        if size % BLOCK:
            total += np.float64(_lane_tree(lanes[nc]))
        y[nc] = encode(total / np.float64(size), y)


@kernel()
def global_sum_continue(x, totals, p, p_kind):
    """Add each channel's terms, in order, to its running float64 total: the sum that
    global_sum_units makes, continued across consecutive slabs of the channels."""
    flat = flat_view(x)
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


def _narrow(dtype) -> bool:
    """Whether results are rounded to a dtype narrower than float64."""
    return dtype.itemsize < 8


# GlobalLpPool's kinds of p whose results narrower than float64 reordered_units takes
# (its proof is the roots'; p_kind 3's root is not monotonic, p_kind 4's a pow())
_REORDERED_P_KINDS = (1, 2)
_EXAMPLE = (2, 8, 5, 5)
MAX_FAMILY = Family(
    global_max_units,
    ops=("GlobalMaxPool",),
    serves=lambda request: (),
    kinds=lambda op, dtype: ((),),
    arguments=("magnitude_mask", "inf_bits", "sign_shift", "reads_ahead"),
    arrays=("rows", "row_bits", "channels_out", "channels_out_bits"),
    examples=(("GlobalMaxPool", _EXAMPLE, {}),),
)
# GlobalAveragePool narrower than float64: the float32 block sums of docs/semantics.md
BLOCK_SUM_FAMILY = Family(
    block_sum_units,
    ops=("GlobalAveragePool",),
    serves=lambda request: () if _narrow(request.dtype) else None,
    kinds=lambda op, dtype: ((),) if _narrow(dtype) else (),
    arguments=("reads_ahead",),
    arrays=("rows", "channels_out"),
    examples=(("GlobalAveragePool", _EXAMPLE, {}),),
)
# GlobalAveragePool's float32 channels longer than a block, read ahead on the calling
# thread alone (half_line_sum_units)
HALF_LINE_FAMILY = Family(
    half_line_sum_units,
    ops=("GlobalAveragePool",),
    serves=lambda request: (
        ()
        if request.dtype == np.float32
        and request.reads_ahead
        and request.alone
        and request.channel > BLOCK
        else None
    ),
    kinds=lambda op, dtype: ((),) if dtype == np.float32 else (),
    arguments=(),
    arrays=("rows", "channels_out"),
    examples=(("GlobalAveragePool", (1, 3, 40, 40), {}),),
)
REORDERED_FAMILY = Family(
    reordered_units,
    ops=("GlobalLpPool",),
    serves=lambda request: (
        (p_kind(request.op, request.p),)
        if _narrow(request.dtype) and p_kind(request.op, request.p) in _REORDERED_P_KINDS
        else None
    ),
    kinds=lambda op, dtype: tuple((k,) for k in _REORDERED_P_KINDS) if _narrow(dtype) else (),
    arguments=("p",),
    arrays=("rows", "channels_out"),
    examples=(("GlobalLpPool", _EXAMPLE, dict(p=2)), ("GlobalLpPool", _EXAMPLE, dict(p=1))),
)
# every other global sum, in order: GlobalAveragePool of float64 (the exact sum would gain
# nothing over the in-order one), GlobalLpPool's other kinds of p and float64
IN_ORDER_FAMILY = Family(
    global_sum_units,
    ops=("GlobalAveragePool", "GlobalLpPool"),
    serves=lambda request: (p_kind(request.op, request.p),),
    kinds=lambda op, dtype: tuple(
        (k,)
        for k in ((0,) if op == "GlobalAveragePool" else range(1, 5))
        if not _narrow(dtype) or (op == "GlobalLpPool" and k not in _REORDERED_P_KINDS)
    ),
    arguments=("p",),
    arrays=("rows", "channels_out"),
    examples=(
        ("GlobalAveragePool", _EXAMPLE, {}),
        ("GlobalLpPool", _EXAMPLE, dict(p=3)),
        ("GlobalLpPool", _EXAMPLE, dict(p=0.5)),
    ),
)
