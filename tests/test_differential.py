"""Differential property tests: numbapool against the naive reference, with hypothesis.

Every operator, every attribute, ranks 1 to 4, every dtype, ties, NaN and empty windows.
"""

from __future__ import annotations

import contextlib
import math
from unittest import mock

import ml_dtypes
import numpy as np
import pytest
import reference
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import numbapool
from numbapool import _plan
from numbapool._kernels import columns, indexed, max_planes, planes, prefetch, wide

FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
INTS = [np.int8, np.uint8]
# Few distinct values, so that windows hold ties; NaN and infinities now and then.
SPECIAL = [np.nan, np.inf, -np.inf]

# Per dtype: the relative tolerance of one rounding of the result, plus accumulation.
RTOL = {
    np.dtype(np.float16): 2e-3,
    np.dtype(ml_dtypes.bfloat16): 1.6e-2,
    np.dtype(np.float32): 2e-6,
    np.dtype(np.float64): 1e-12,
}

SETTINGS = settings(
    deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

# every test here runs both serially and through the parallel driver
pytestmark = pytest.mark.usefixtures("execution_path")


@st.composite
def inputs(draw, dtypes, allow_special=True):
    rank = draw(st.integers(1, 4))
    max_side = {1: 9, 2: 6, 3: 4, 4: 3}[rank]
    spatial = draw(st.lists(st.integers(1, max_side), min_size=rank, max_size=rank))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    return draw(array_of(dtype, (n, c, *spatial), allow_special))


@st.composite
def array_of(draw, dtype, shape, allow_special=True):
    size = math.prod(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = draw(
            st.lists(
                st.sampled_from([info.min, info.min + 1, 0, 1, 7, info.max]),
                min_size=size,
                max_size=size,
            )
        )
    else:
        pool = [-2.5, -1.0, 0.0, 0.5, 1.0, 3.0] + (SPECIAL if allow_special else [])
        values = draw(
            st.lists(
                st.sampled_from(pool) | st.floats(-8, 8, width=16), min_size=size, max_size=size
            )
        )
    return np.array(values, dtype=np.float64).astype(dtype).reshape(shape)


# Per float dtype, (L, s): powers of two where L + s loses s in the accumulator (float32
# for 16-bit and float32 inputs; 2 L + s for float16), so that a sum of +-L and +-s depends
# on its order; L small enough that a 6x6 window's LpPool p = 2 stays in the dtype's range
_ORDER_SENSITIVE = {
    np.dtype(np.float16): (2.0**13, 2.0**-11),
    np.dtype(ml_dtypes.bfloat16): (2.0**30, 1.0),
    np.dtype(np.float32): (2.0**30, 1.0),
    np.dtype(np.float64): (2.0**60, 1.0),
}


@st.composite
def order_sensitive_array(draw, dtype, shape):
    """array_of's values, or values whose sums round differently in another order."""
    if draw(st.booleans()):
        return draw(array_of(dtype, shape))
    large, small = _ORDER_SENSITIVE[dtype]
    pool = [large, -large, small, -small, 3 * small, 0.0, -0.0]
    values = draw(
        st.lists(st.sampled_from(pool), min_size=math.prod(shape), max_size=math.prod(shape))
    )
    return np.array(values, dtype=np.float64).astype(dtype).reshape(shape)


@st.composite
def window_attributes(draw, rank, with_dilations=True):
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    attrs = dict(kernel_shape=kernel)
    if draw(st.booleans()):
        attrs["strides"] = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    if with_dilations and draw(st.booleans()):
        attrs["dilations"] = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad != "NOTSET":
        attrs["auto_pad"] = auto_pad
    elif draw(st.booleans()):
        # pads may exceed the kernel: windows with no tap inside the input
        attrs["pads"] = draw(st.lists(st.integers(0, 4), min_size=2 * rank, max_size=2 * rank))
    attrs["ceil_mode"] = draw(st.integers(0, 1))
    return attrs


def _expected_or_same_error(op, function, x, attrs):
    """The reference result; or None, once numbapool is seen to raise as the reference did."""
    try:
        return reference.pool(op, x, **attrs)
    except ValueError:
        with pytest.raises(ValueError, match="no output position along spatial axis"):
            function(x, **attrs)
        return None


def _check_float(actual, expected, dtype, accumulation=0.0):
    assert actual.dtype == dtype
    assert actual.shape == expected.shape
    # the reference is exact in float64; numbapool rounds once to the dtype, and near zero
    # that rounding can move a result by up to one subnormal step (2**-25 in float16 is a
    # tie between 0 and 2**-24, and goes to 0); ``accumulation``: what the accumulator's
    # own rounding may add where terms cancel
    atol = float(ml_dtypes.finfo(dtype).smallest_subnormal) + accumulation
    close = np.isclose(
        actual.astype(np.float64), expected, rtol=RTOL[np.dtype(dtype)], atol=atol, equal_nan=True
    )
    assert close.all(), (
        f"{np.count_nonzero(~close)} of {close.size} differ: actual "
        f"{actual[~close]}, expected {expected[~close]}"
    )


@SETTINGS
@given(st.data())
def test_max_pool(data):
    x = data.draw(inputs(FLOATS + INTS))
    attrs = data.draw(window_attributes(x.ndim - 2))
    attrs["storage_order"] = data.draw(st.integers(0, 1))
    expected = _expected_or_same_error("MaxPool", numbapool.max_pool, x, attrs)
    if expected is None:
        return
    y, indices = numbapool.max_pool(x, return_indices=True, **attrs)
    y_ref, indices_ref = expected
    assert y.dtype == x.dtype and y.shape == y_ref.shape
    # MaxPool returns input elements: compare the bits, NaN included
    np.testing.assert_array_equal(y.view(np.uint8), y_ref.view(np.uint8))
    np.testing.assert_array_equal(indices, indices_ref)
    np.testing.assert_array_equal(numbapool.max_pool(x, **attrs).view(np.uint8), y.view(np.uint8))


@SETTINGS
@given(st.data())
def test_average_pool(data):
    x = data.draw(inputs(FLOATS))
    attrs = data.draw(window_attributes(x.ndim - 2))
    attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    expected = _expected_or_same_error("AveragePool", numbapool.average_pool, x, attrs)
    if expected is None:
        return
    _check_float(
        numbapool.average_pool(x, **attrs), expected, x.dtype, _average_accumulation(x, attrs)
    )


def _average_accumulation(x, attrs):
    """AveragePool adds in float32 (float64 for float64 input): where terms cancel, a sum of
    T terms may be off by (T - 1) units of the accumulator times the sum of magnitudes."""
    unit = 2.0**-53 if x.dtype == np.float64 else 2.0**-24
    with np.errstate(invalid="ignore"):
        magnitudes = reference.pool("AveragePool", np.abs(x.astype(np.float64)), **attrs)
    return math.prod(attrs["kernel_shape"]) * unit * np.nan_to_num(magnitudes)


def _assert_same_sums(got, generic):
    """The same bits, zeros' signs included, but NaN for NaN: which NaN an addition gives
    (a NaN operand's, or inf - inf's) depends on the order of its operands in the machine
    code, which LLVM may swap."""
    nan = np.isnan(got.astype(np.float64))
    np.testing.assert_array_equal(nan, np.isnan(generic.astype(np.float64)))
    assert got[~nan].tobytes() == generic[~nan].tobytes()


def _forget_launches(plan):
    """Drop the launches of ``plan`` and of the plan of fewer axes that runs it, which
    hold the kernels chosen."""
    merged = plan.choices.merged
    plan.forget_launches()
    if isinstance(merged, _plan.WindowPlan):
        merged.forget_launches()


@contextlib.contextmanager
def _families_turned_away(plan, *families):
    """The dispatcher choosing among choice.FAMILIES without ``families``, for ``plan``:
    its launches are made again inside the block, and after it."""
    from numbapool._kernels import choice

    kept = tuple(family for family in choice.FAMILIES if family not in families)
    _forget_launches(plan)
    try:
        with mock.patch.object(choice, "FAMILIES", kept):
            yield
    finally:
        _forget_launches(plan)


def _generic_result(function, x, attrs, plan, *families):
    """``function(x, **attrs)`` with ``families`` turned away (_families_turned_away): the
    call must then run the rank-generic summing kernel or MaxPool's columns."""
    with _families_turned_away(plan, *families):
        result = function(x, **attrs)
        launches = list(plan.launches.values())
        assert {launch.entry.kernel.__name__ for launch in launches} <= {
            "sum_pool_units",
            "column_units",
        }
    return result


@SETTINGS
@given(st.data())
def test_lp_pool(data):
    x = data.draw(inputs(FLOATS))
    attrs = data.draw(window_attributes(x.ndim - 2))
    attrs["p"] = data.draw(st.sampled_from([1, 2, 3, 0.5, 2.5]))
    expected = _expected_or_same_error("LpPool", numbapool.lp_pool, x, attrs)
    if expected is None:
        return
    _check_float(numbapool.lp_pool(x, **attrs), expected, x.dtype)


def first_maxima(x):
    """Each channel's first maximum, or first NaN, as an element of x: bit for bit, so that
    -0.0 before 0.0 stays -0.0."""
    channels = x.reshape(x.shape[0] * x.shape[1], -1)
    wide = channels.astype(np.float64)
    expected = np.empty(channels.shape[0], dtype=x.dtype)
    for channel, row in enumerate(wide):
        nan = np.flatnonzero(np.isnan(row))
        expected[channel] = channels[channel, nan[0] if nan.size else np.argmax(row)]
    return expected


@pytest.mark.parametrize("reads_ahead", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
def test_global_max_at_every_place(dtype, reads_ahead, monkeypatch):
    # GlobalMaxPool reads a channel 512 bits at a time, its last elements in one masked load
    # (global_vectors.vector_key_max) or, for float32 and float64 channels at least a vector
    # long, in the vector that ends at the channel's end (store_float_max): the largest
    # element, a NaN or a zero at each place of channels whose lengths lie around the vector
    # widths of every dtype; with reads_ahead, every call asks for memory ahead, as over a
    # large input (prefetch.reads_ahead), which changes no result
    if reads_ahead:
        monkeypatch.setattr(prefetch, "SHARE_AHEAD_BYTES", 0)
        monkeypatch.setattr(prefetch.AheadChoice, "now", lambda choice: True)
    for length in (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 49, 64, 65):
        negatives = -np.arange(1, length + 1, dtype=np.float64)
        channels = []
        for place in range(length):
            for value in (1.0, np.nan, 0.0, -0.0):
                channel = negatives.copy()
                channel[place] = value
                channels.append(channel)
        x = np.array(channels).astype(dtype).reshape(1, len(channels), length)
        assert numbapool.global_max_pool(x).tobytes() == first_maxima(x).tobytes(), length


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(2, 300, 7, 7), (2, 20, 50, 50)])
def test_global_average_reading_ahead_keeps_its_bits(dtype, shape, monkeypatch):
    # a thread that reads ahead (prefetch.reads_ahead, here on every call) sums the same
    # terms in the same order: the same bits as without, and the reference's value, over
    # short channels (the next channels asked for) and long ones (a line past each block)
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    expected = numbapool.global_average_pool(x)
    monkeypatch.setattr(prefetch, "SHARE_AHEAD_BYTES", 0)
    monkeypatch.setattr(prefetch.AheadChoice, "now", lambda choice: True)
    got = numbapool.global_average_pool(x)
    assert got.tobytes() == expected.tobytes()
    _check_float(
        got,
        reference.global_pool("GlobalAveragePool", x),
        x.dtype,
        _global_average_accumulation(x),
    )


def test_a_thread_reads_ahead_from_a_share_of_the_cache():
    # GlobalMaxPool's short channels ask for memory ahead where each thread reads at least
    # SHARE_AHEAD_BYTES of the input: the same input on more threads may not
    share = prefetch.SHARE_AHEAD_BYTES
    assert share > 0
    assert prefetch.reads_ahead(share, 1) and not prefetch.reads_ahead(share - 1, 1)
    assert prefetch.reads_ahead(2 * share, 2) and not prefetch.reads_ahead(2 * share - 1, 2)


def test_reading_ahead_is_chosen_by_the_time_each_way_took(monkeypatch):
    # the trials run in blocks of one way each (prefetch.AHEAD_BLOCKS); a block's first run
    # is not counted; then the way with the fastest counted run stays, whatever later runs
    # take. Cases: plain faster; reading ahead faster; plain's median the slower but its
    # fastest run the faster; every run faster than the one before (a process warming
    # up) while reading ahead costs 1.3 times as much, which blocks of alternate ways in
    # turn (plain, ahead, plain, ahead) would hide. No warm-up here (the next test)
    monkeypatch.setattr(prefetch, "AHEAD_WARMUP_SECONDS", 0.0)
    blocks, runs = prefetch.AHEAD_BLOCKS, prefetch.AHEAD_BLOCK_RUNS
    expected_ways = [way for way in blocks for _ in range(runs)]
    counted = 2 * (runs - 1)  # per way
    for plain_seconds, ahead_seconds, chosen in (
        ([1.0] * counted, [2.0] * counted, False),
        ([1.0] * counted, [0.5] * counted, True),
        ([1.0] * (counted - 1) + [0.3], [0.5] * counted, False),
        (None, None, False),
    ):
        choice = prefetch.AheadChoice()
        ways = []
        seconds = {False: list(plain_seconds or []), True: list(ahead_seconds or [])}
        for run in range(len(expected_ways)):
            ahead = choice.now()
            ways.append(ahead)
            if plain_seconds is None:
                taken = (20.0 - run) * (1.3 if ahead else 1.0)
            elif run % runs == 0:
                taken = 0.01  # a block's first run, which would win alone: not counted
            else:
                taken = seconds[ahead].pop(0)
            # a run of the other way, from a call that began before the block: not taken
            choice.record(not ahead, 1e-9)
            choice.record(ahead, taken)
        assert ways == expected_ways
        assert choice.chosen is chosen
        choice.record(not chosen, 1e-9)
        assert choice.now() is chosen


def _warming_choice(warmup: float) -> bool:
    """The way an AheadChoice with ``warmup`` seconds of warm-up chooses where a shape's
    first 9 runs take 4 ms and every later one 1 ms plain, 0.9 ms reading ahead."""
    choice = prefetch.AheadChoice()
    for run in range(200):
        if choice.chosen is not None:
            break
        ahead = choice.now()
        cold = run < 9
        choice.record(ahead, (4e-3 if cold else 1e-3) * (0.9 if ahead else 1.0))
    assert choice.chosen is not None
    assert choice.warmed >= warmup
    return choice.chosen


def test_reading_ahead_is_chosen_after_the_first_runs_have_warmed_up(monkeypatch):
    # the first runs of a shape are slow (here the first 9): they run plain, and the trials
    # start once those runs have taken AHEAD_WARMUP_SECONDS (here 20 ms, past 5 of them),
    # so that the blocks reading ahead are timed warm, as the last plain block is. With no
    # warm-up the blocks reading ahead are all cold and plain is chosen
    assert prefetch.AHEAD_WARMUP_SECONDS == 0.02
    assert _warming_choice(0.02) is True
    monkeypatch.setattr(prefetch, "AHEAD_WARMUP_SECONDS", 0.0)
    assert _warming_choice(0.0) is False


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", ["GlobalMaxPool", "GlobalAveragePool"])
def test_a_global_call_chooses_whether_to_read_ahead_and_keeps_its_bits(op, threads, monkeypatch):
    # where each thread's share is large enough (here every share), a global call's first
    # runs try both ways, timed, then keep one: every run gives the same bits, and the
    # call then runs through its prepared path with the way chosen, here the other way
    # than the last trial's
    from numbapool import _dispatch

    monkeypatch.setattr(prefetch, "SHARE_AHEAD_BYTES", 0)
    monkeypatch.setattr(prefetch, "AHEAD_WARMUP_SECONDS", 0.0)  # the trials from the first run
    ways = []
    record = prefetch.AheadChoice.record

    def recorded(choice, ahead, seconds):
        if choice.chosen is None:
            ways.append(ahead)
        record(choice, ahead, seconds)
        if choice.chosen is not None and len(ways) == prefetch.AHEAD_TRIAL_RUNS:
            choice.chosen = not ahead

    monkeypatch.setattr(prefetch.AheadChoice, "record", recorded)
    from numbapool._kernels import parallel

    x = np.random.default_rng(11).standard_normal((3, 257, 300)).astype(np.float32)
    key = (op, x.shape, x.dtype, 2.0)
    monkeypatch.delitem(_dispatch._GLOBAL_CALLS, key, raising=False)  # a call not yet met
    function = numbapool.global_max_pool if op == "GlobalMaxPool" else numbapool.global_average_pool
    with numbapool.threads(threads):
        function(x)
        parallel.wait_for_drivers()  # a run while the driver compiles is not timed
        results = {function(x).tobytes() for _ in range(2 * prefetch.AHEAD_TRIAL_RUNS)}
    assert len(results) == 1
    expected = reference.global_pool(op, x)
    if op == "GlobalMaxPool":
        assert results.pop() == expected.astype(np.float32).tobytes()
    else:
        _check_float(function(x), expected, x.dtype, _global_average_accumulation(x))
    compiled = _dispatch._GLOBAL_CALLS[key].compiled
    choice = compiled["ahead", threads]
    assert choice.chosen is (not ways[-1])
    assert ways == [way for way in prefetch.AHEAD_BLOCKS for _ in range(prefetch.AHEAD_BLOCK_RUNS)]
    # the prepared path, made once the way is chosen, reads as chosen
    assert compiled[threads].reads_ahead is choice.chosen


@SETTINGS
@given(st.data())
def test_global_pools(data):
    x = data.draw(inputs(FLOATS))
    p = data.draw(st.sampled_from([1, 2, 3, 0.5]))
    got = numbapool.global_max_pool(x)
    np.testing.assert_array_equal(got.astype(np.float64), reference.global_pool("GlobalMaxPool", x))
    assert got.tobytes() == first_maxima(x).tobytes()
    _check_float(
        numbapool.global_average_pool(x),
        reference.global_pool("GlobalAveragePool", x),
        x.dtype,
        _global_average_accumulation(x),
    )
    _check_float(
        numbapool.global_lp_pool(x, p=p), reference.global_pool("GlobalLpPool", x, p), x.dtype
    )


def _global_average_accumulation(x):
    """GlobalAveragePool narrower than float64 adds blocks of 1024 elements in float32
    (docs/semantics.md): each element goes through at most 15 additions in its lane and 6
    in the lanes' tree, so that a mean may be off by 21 units of float32 times the mean of
    the magnitudes where terms cancel."""
    if x.dtype == np.float64:
        return 0.0
    with np.errstate(invalid="ignore"):
        magnitudes = reference.global_pool("GlobalAveragePool", np.abs(x.astype(np.float64)))
    return 21 * 2.0**-24 * np.nan_to_num(magnitudes)


@SETTINGS
@given(st.data())
def test_max_unpool(data):
    x = data.draw(inputs(FLOATS, allow_special=False))
    rank = x.ndim - 2
    kernel = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    strides = data.draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    pads = data.draw(st.lists(st.integers(0, 1), min_size=2 * rank, max_size=2 * rank))
    default = [
        (n - 1) * s + k - b - e
        for n, s, k, b, e in zip(x.shape[2:], strides, kernel, pads[:rank], pads[rank:])
    ]
    assume(all(d >= 1 for d in default))
    output_shape = None
    if data.draw(st.booleans()):  # a shape MaxPool maps to x's: within a stride of the default
        output_shape = list(x.shape[:2]) + [
            max(1, d + data.draw(st.integers(1 - s, s - 1))) for d, s in zip(default, strides)
        ]
    limit = math.prod(output_shape or x.shape[:2] + tuple(default))
    indices = np.array(
        data.draw(st.lists(st.integers(0, limit - 1), min_size=x.size, max_size=x.size)),
        dtype=np.int64,
    ).reshape(x.shape)
    got = numbapool.max_unpool(
        x, indices, kernel, strides=strides, pads=pads, output_shape=output_shape
    )
    expected = reference.unpool(
        x, indices, kernel, strides=strides, pads=pads, output_shape=output_shape
    )
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float64), expected)


MEDIUM_CASES = [
    # (shape, attributes): rows long enough to vectorize, windows that share input rows,
    # few channels (so rows split into blocks), and 3-d windows
    ((1, 1, 13, 37), dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ((1, 2, 14, 33), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    (
        (2, 1, 12, 29),
        dict(kernel_shape=[4, 3], strides=[1, 3], dilations=[2, 2], pads=[3, 2, 0, 4]),
    ),
    # 3 taps at step 1 along the last axis, 3 apart: MaxPool's windows in one loop body
    ((1, 2, 11, 41), dict(kernel_shape=[2, 3], dilations=[2, 3], pads=[1, 3, 0, 4])),
    ((1, 3, 6, 7, 19), dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 2])),
    ((1, 1, 40), dict(kernel_shape=[5], strides=[3], pads=[4, 4], ceil_mode=1)),
    # leading axes of one tap, stride 1, no pads: run as windows over fewer axes
    # (_plan.channels_merged_plan)
    ((2, 2, 3, 13, 14), dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])),
    ((1, 2, 2, 3, 8, 9), dict(kernel_shape=[1, 1, 2, 3], strides=[1, 1, 2, 1], ceil_mode=1)),
]


@pytest.mark.parametrize("shape, attrs", MEDIUM_CASES)
@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_medium_inputs(shape, attrs, dtype):
    rng = np.random.default_rng(sum(shape))
    values = rng.choice(
        np.array([-3.0, -1.0, 0.0, 1.0, 2.0, 4.0, np.nan]),
        size=shape,
        p=[0.2, 0.2, 0.2, 0.15, 0.15, 0.09, 0.01],
    )
    if np.dtype(dtype).kind in "iu":
        values = np.nan_to_num(values, nan=5.0) + (2 if np.dtype(dtype).kind == "u" else 0)
    x = values.astype(dtype)
    y, indices = numbapool.max_pool(x, return_indices=True, **attrs)
    y_ref, indices_ref = reference.pool("MaxPool", x, **attrs)
    np.testing.assert_array_equal(y.view(np.uint8), y_ref.view(np.uint8))
    np.testing.assert_array_equal(indices, indices_ref)
    if np.dtype(dtype).kind in "iu":
        return
    for cip in (0, 1):
        _check_float(
            numbapool.average_pool(x, count_include_pad=cip, **attrs),
            reference.pool("AveragePool", x, count_include_pad=cip, **attrs),
            x.dtype,
        )
    for p in (1, 2, 3):
        _check_float(
            numbapool.lp_pool(x, p=p, **attrs), reference.pool("LpPool", x, p=p, **attrs), x.dtype
        )


@pytest.mark.parametrize("width", [3, 8, 31, 33, 35, 63, 65, 112, 129, 130, 257, 301])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_bytes_three_wide_at_step_two(width, dtype):
    """8-bit windows 3 wide at step 2 along the rows take 64 outputs a vector
    (max_vectors.three_wide_step_two): rows of 32 to 63 outputs in two overlapping vectors
    of 32, of 16 to 31 in two of 16, of fewer in masked loads, of 64 exactly, of more with
    the last vector overlapping, and rows split into parts (one channel: units of part of
    a row), with and without pads, against the reference."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(width)
    for shape in [(2, 3, 7, width), (1, 1, 5, width)]:
        x = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
        for pads in ([0, 0, 0, 0], [1, 1, 1, 1]):
            expected, _ = reference.pool(
                "MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=pads
            )
            assert np.array_equal(
                numbapool.max_pool(x, [3, 3], strides=[2, 2], pads=pads), expected
            )


def test_leading_single_tap_axes_take_the_kernels_of_fewer_axes():
    """A window of one tap at a stride of 1 with no pads along its leading axes runs as the
    window over the rest, with those axes merged into the channels: the same kernel, and no
    kernel of its own to compile. Not with storage_order 1, whose Indices number the
    spatial offsets column-major."""
    from numbapool import _dispatch, _plan

    def plan(shape, kernel, strides, pads, storage_order=0):
        return _dispatch.window_plan(
            "MaxPool",
            shape,
            np.dtype(np.float32),
            kernel,
            strides,
            pads,
            "NOTSET",
            0,
            None,
            0,
            2.0,
            storage_order,
        )

    flat = plan((2, 12, 9, 10), [3, 3], [2, 2], [1, 1, 1, 1])
    deep = plan((2, 3, 4, 9, 10), [1, 3, 3], [1, 2, 2], [0, 1, 1, 0, 1, 1])
    merged = _plan.channels_merged_plan(deep)
    assert (merged.in_shape, merged.kernel_shape, merged.out_shape) == (
        flat.in_shape,
        flat.kernel_shape,
        flat.out_shape,
    )
    assert _dispatch._launch(deep, 1).entry == _dispatch._launch(flat, 1).entry
    for kept in (
        plan((2, 3, 4, 9, 10), [1, 3, 3], [2, 2, 2], [0, 1, 1, 0, 1, 1]),
        plan((2, 3, 4, 9, 10), [1, 3, 3], [1, 2, 2], [1, 1, 1, 0, 1, 1]),
        plan((2, 3, 4, 9, 10), [1, 3, 3], [1, 2, 2], [0, 1, 1, 0, 1, 1], 1),
    ):
        assert _plan.channels_merged_plan(kept) is kept


def test_prefetch_is_only_a_hint():
    # the global pools ask for memory 4 KiB past each short channel, past the array's end
    # too: a hint that reads nothing, faults nowhere and changes no value
    from numba import njit

    from numbapool._kernels.prefetch import prefetch_ahead

    @njit
    def total_after_prefetch(a):
        prefetch_ahead(a, np.uint64(0), np.uint64(a.size))
        return a.sum()

    a = np.array([1.0, 2.0, 3.0])
    assert total_after_prefetch(a) == 6.0
    assert a.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_global_pools_over_many_channels(dtype):
    # 21 channels: a group of channels scanned side by side, and a remainder
    rng = np.random.default_rng(21)
    values = rng.choice(
        np.array([-2.0, -0.0, 0.0, 1.5, 3.0, np.nan, np.inf]),
        size=(3, 7, 5, 4),
        p=[0.3, 0.15, 0.15, 0.2, 0.15, 0.03, 0.02],
    )
    x = values.astype(dtype)
    got = numbapool.global_max_pool(x)
    assert got.tobytes() == first_maxima(x).tobytes()
    _check_float(
        numbapool.global_average_pool(x),
        reference.global_pool("GlobalAveragePool", x),
        x.dtype,
        _global_average_accumulation(x),
    )
    for p in (1, 2, 3):
        _check_float(
            numbapool.global_lp_pool(x, p=p), reference.global_pool("GlobalLpPool", x, p), x.dtype
        )


@SETTINGS
@given(st.data())
def test_fixed_window_kernels(data):
    """2x2 windows at stride 2 run on kernels of their own (fixed.FIXED_WINDOWS), for
    MaxPool, AveragePool and every kind of LpPool's p: the reference's values, and the bits
    of the rank-generic kernels (MaxPool's: the columns kernel)."""
    from numbapool import _dispatch
    from numbapool._kernels import fixed, wide

    x = data.draw(inputs(FLOATS + INTS))
    assume(x.ndim in (4, 5))
    rank = x.ndim - 2
    attrs = dict(
        kernel_shape=[1] * (rank - 2) + [2, 2],
        strides=[data.draw(st.integers(1, 2)) for _ in range(rank - 1)] + [2],
        pads=data.draw(st.lists(st.integers(0, 1), min_size=2 * rank, max_size=2 * rank)),
        ceil_mode=data.draw(st.integers(0, 1)),
    )
    op = data.draw(
        st.sampled_from(
            ["MaxPool", "AveragePool", "LpPool"] if x.dtype.kind == "f" else ["MaxPool"]
        )
    )
    if op == "AveragePool":
        attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    if op == "LpPool":
        attrs["p"] = data.draw(st.sampled_from([1, 2, 3, 2.5]))  # every kind of p
    function = {
        "MaxPool": numbapool.max_pool,
        "AveragePool": numbapool.average_pool,
        "LpPool": numbapool.lp_pool,
    }[op]
    expected = _expected_or_same_error(op, function, x, attrs)
    if expected is None:
        return
    got = function(x, **attrs)
    plan = numbapool.plan(op, x.shape, x.dtype, **attrs)
    assert _dispatch._launch(plan, 1).entry.kernel in (fixed.fixed_max_units, fixed.fixed_sum_units)
    generic = _generic_result(
        function,
        x,
        attrs,
        plan,
        fixed.MAX_FAMILY,
        fixed.SUM_FAMILY,
        wide.FAMILY,
        columns.ROW_FAMILY,
    )
    if op == "MaxPool":  # the winning element itself
        assert got.tobytes() == generic.tobytes()
    else:
        _assert_same_sums(got, generic)
    if op != "MaxPool":
        _check_float(got, expected, x.dtype)
    else:
        np.testing.assert_array_equal(got.view(np.uint8), expected[0].view(np.uint8))


def _on_two_threads(plan, call):
    """(``call()`` on two threads, the Launch it made of ``plan``)."""
    from numbapool import _dispatch, _threads

    with numbapool.threads(2):
        result = call()
        threads = 1 if _dispatch._runs_serially(plan) else _threads.get_num_threads()
        return result, _dispatch._launch(plan, threads)


def _check_row_kernel(op, x, attrs, family, *away):
    """AveragePool or LpPool on two threads through ``family``'s kernel (whose units are
    whole output rows): the reference's values, and the bits of the generic kernel, run
    with the families ``away`` turned away."""

    function = {"AveragePool": numbapool.average_pool, "LpPool": numbapool.lp_pool}[op]
    expected = _expected_or_same_error(op, function, x, attrs)
    if expected is None:
        return
    plan = numbapool.plan(op, x.shape, x.dtype, **attrs)
    got, launch = _on_two_threads(plan, lambda: function(x, **attrs))
    assert launch.entry.kernel is family.entry
    with numbapool.threads(2):
        generic = _generic_result(function, x, attrs, plan, *away)
    _assert_same_sums(got, generic)
    # LpPool adds in float64: its reference's tolerance alone
    accumulation = _average_accumulation(x, attrs) if op == "AveragePool" else 0.0
    _check_float(got, expected, x.dtype, accumulation)


@SETTINGS
@given(st.data())
def test_plane_kernel(data):
    """AveragePool's and LpPool's (p = 2) 3x3 windows at strides of 1 and 2 over small
    planes run a plane's rows at once (planes.plane_sum_units): the reference's values,
    and the bits of the generic kernel, zeros' signs included."""
    dtype = np.dtype(data.draw(st.sampled_from(FLOATS)))
    op = data.draw(st.sampled_from(["AveragePool", "LpPool"]))
    # channels enough that the output rows are whole units on two threads (_work_split)
    shape = (
        data.draw(st.integers(1, 2)),
        8,
        data.draw(st.integers(2, 8)),
        data.draw(st.integers(2, 8)),
    )
    x = data.draw(array_of(dtype, shape))
    attrs = dict(
        kernel_shape=[3, 3],
        strides=data.draw(st.lists(st.integers(1, 2), min_size=2, max_size=2)),
        pads=data.draw(st.lists(st.integers(0, 1), min_size=4, max_size=4)),
        ceil_mode=data.draw(st.integers(0, 1)),
    )
    if op == "AveragePool":
        attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    else:
        attrs["p"] = 2
    _check_row_kernel(op, x, attrs, planes.FAMILY, planes.FAMILY, wide.FAMILY)


@pytest.mark.parametrize("op", ["AveragePool", "LpPool"])
@pytest.mark.parametrize("step", [1, 2])
def test_plane_kernel_runs(op, step):
    """Planes whose row sums outgrow planes.RUN_BYTES (96 float64 a row: 21 rows at step 1)
    take their output rows in runs, each making its own input rows' sums: the same values
    as in one run."""
    from numbapool._kernels import planes

    x = np.random.default_rng(7).standard_normal((1, 8, 90, 96))
    assert 90 * 96 * 8 > planes.RUN_BYTES
    attrs = dict(kernel_shape=[3, 3], strides=[step, step], pads=[1, 0, 0, 1])
    if op == "LpPool":
        attrs["p"] = 2
    _check_row_kernel(op, x, attrs, planes.FAMILY, planes.FAMILY, wide.FAMILY)


@SETTINGS
@given(st.data())
def test_wide_window_kernel(data):
    """AveragePool's 2-D windows (at steps of 1 and 2 along the rows other than 3 taps
    wide) and LpPool's with p = 2, at steps of 1, 2 and 4 along the rows, and those over
    one axis at a step of 2, or of 4 at least 4 wide (as 2-D windows of height 1), take each
    input row's terms padded with zeros (wide.wide_sum_units): the reference's values,
    and the bits of the generic kernel, zeros' signs included, whatever the pads."""
    dtype = np.dtype(data.draw(st.sampled_from(FLOATS)))
    op = data.draw(st.sampled_from(["AveragePool", "LpPool"]))
    rank = data.draw(st.integers(1, 2))
    # channels enough that the output rows are whole units on two threads (_work_split)
    shape = (data.draw(st.integers(1, 2)), 8, *(data.draw(st.integers(1, 9)) for _ in range(rank)))
    x = data.draw(order_sensitive_array(dtype, shape))
    step = data.draw(st.sampled_from([2, 4] if rank == 1 else [1, 2, 4]))
    widths = [1, 2, 3, 4, 5, 6]
    if op == "AveragePool" and step < 4:
        widths.remove(3)
    if rank == 1:
        widths = [width for width in widths if width >= step]
    kernel_shape = [data.draw(st.integers(1, 6)) for _ in range(rank - 1)]
    kernel_shape.append(data.draw(st.sampled_from(widths)))
    strides = [data.draw(st.integers(1, 3)) for _ in range(rank - 1)] + [step]
    # pads up to the window's extent and past it: rows of windows with no row inside
    attrs = dict(
        kernel_shape=kernel_shape,
        strides=strides,
        pads=[data.draw(st.integers(0, k + 1)) for k in kernel_shape * 2],
        ceil_mode=data.draw(st.integers(0, 1)),
    )
    if op == "AveragePool":
        attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    else:
        attrs["p"] = 2
    assume(kernel_shape != [2, 2] or strides[1] == 1)  # 2x2 at step 2: fixed.py
    # LpPool's 3x3 windows at strides of 1 and 2 with pads of 0 or 1: planes.py
    assume(
        op == "AveragePool" or kernel_shape != [3, 3] or max(strides) > 2 or max(attrs["pads"]) > 1
    )
    _check_row_kernel(op, x, attrs, wide.FAMILY, wide.FAMILY)


# Bit patterns per float dtype: +0, -0, two different NaNs, -1, 1, -inf. Which zero and which
# NaN a window gives depends on the order its taps are scanned in.
_TIE_BITS = {
    np.dtype(np.float16): (np.uint16, [0, 0x8000, 0x7E00, 0xFE01, 0xBC00, 0x3C00, 0xFC00]),
    np.dtype(ml_dtypes.bfloat16): (np.uint16, [0, 0x8000, 0x7FC0, 0xFFC1, 0xBF80, 0x3F80, 0xFF80]),
    np.dtype(np.float32): (
        np.uint32,
        [0, 0x80000000, 0x7FC00000, 0xFFC00001, 0xBF800000, 0x3F800000, 0xFF800000],
    ),
    np.dtype(np.float64): (
        np.uint64,
        [
            0,
            1 << 63,
            0x7FF8000000000000,
            0xFFF8000000000001,
            0xBFF0000000000000,
            0x3FF0000000000000,
            0xFFF0000000000000,
        ],
    ),
}


@st.composite
def tie_array(draw, dtype, shape):
    """An array of ``shape`` whose elements are _TIE_BITS' patterns of the float ``dtype``."""
    bits_type, patterns = _TIE_BITS[dtype]
    codes = draw(
        st.lists(
            st.integers(0, len(patterns) - 1), min_size=math.prod(shape), max_size=math.prod(shape)
        )
    )
    return np.array(patterns, dtype=bits_type)[codes].view(dtype).reshape(shape)


@SETTINGS
@given(st.data())
def test_indexed_kernel(data):
    """MaxPool with Indices over 1-D windows (as 2-D windows of height 1) and 2-D ones at
    steps of 1 and 2 along the rows takes each input row split into its even and odd
    elements (indexed.indexed_max_units): the reference's elements bit for bit and its
    Indices, whatever the pads and the storage order, over ties of zeros of both signs and
    NaNs of two kinds."""

    dtype = np.dtype(data.draw(st.sampled_from(FLOATS + INTS)))
    rank = data.draw(st.integers(1, 2))
    # channels enough that the output rows are whole units on two threads (_work_split)
    shape = (data.draw(st.integers(1, 2)), 8, *(data.draw(st.integers(1, 9)) for _ in range(rank)))
    x = data.draw(tie_array(dtype, shape) if dtype in _TIE_BITS else array_of(dtype, shape))
    kernel_shape = [data.draw(st.integers(1, 5)) for _ in range(rank)]
    attrs = dict(
        kernel_shape=kernel_shape,
        strides=[
            *(data.draw(st.integers(1, 3)) for _ in range(rank - 1)),
            data.draw(st.integers(1, 2)),
        ],
        # pads past the window's extent too: windows with no row or no tap inside
        pads=[data.draw(st.integers(0, k + 1)) for k in kernel_shape * 2],
        ceil_mode=data.draw(st.integers(0, 1)),
        storage_order=data.draw(st.integers(0, 1)),
    )
    expected = _expected_or_same_error("MaxPool", numbapool.max_pool, x, attrs)
    if expected is None:
        return
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    (y, indices), launch = _on_two_threads(
        plan, lambda: numbapool.max_pool(x, return_indices=True, **attrs)
    )
    assert launch.indices_arguments[0].kernel is indexed.indexed_max_units
    assert y.tobytes() == expected[0].tobytes()
    np.testing.assert_array_equal(indices, expected[1])


@SETTINGS
@given(st.data())
def test_max_plane_kernel(data):
    """MaxPool without Indices over 2-D windows at strides of 1 on small planes takes a run
    of a plane's rows at once (max_planes.max_plane_units), a column-major scan of each
    window: the reference's elements bit for bit, over ties of zeros of both signs and
    NaNs of two kinds, whatever the dilations and pads, on two threads."""

    dtype = np.dtype(data.draw(st.sampled_from(FLOATS + INTS)))
    # channels enough that the output rows are whole units on two threads (_work_split)
    shape = (
        data.draw(st.integers(1, 2)),
        8,
        data.draw(st.integers(1, 12)),
        data.draw(st.integers(1, 12)),
    )
    x = data.draw(tie_array(dtype, shape) if dtype in _TIE_BITS else array_of(dtype, shape))
    kernel_shape = [data.draw(st.integers(1, 5)) for _ in range(2)]
    attrs = dict(
        kernel_shape=kernel_shape,
        strides=[1, 1],
        dilations=[data.draw(st.integers(1, 3)) for _ in range(2)],
        # pads past the window's extent too: windows with no tap inside
        pads=[data.draw(st.integers(0, k + 1)) for k in kernel_shape * 2],
        ceil_mode=data.draw(st.integers(0, 1)),
    )
    expected = _expected_or_same_error("MaxPool", numbapool.max_pool, x, attrs)
    if expected is None:
        return
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    got, launch = _on_two_threads(plan, lambda x=x: numbapool.max_pool(x, **attrs))
    assert launch.entry.kernel is max_planes.max_plane_units
    assert got.tobytes() == expected[0].tobytes()


@SETTINGS
@given(st.data())
def test_max_pool_columns_kernel(data):
    """MaxPool without Indices over two or more spatial axes runs input rows first
    (columns.column_units, or over two axes and whole output rows columns.row_units), a
    column-major scan of each window; where that scan's zero or NaN differs from the
    row-major one, the row-major one must be what comes out, bit for bit. 2-D windows at
    strides of 1, which small planes take to max_planes.py, are turned away from it here,
    and row_units, drawn, too: column_units then takes the calls row_units would."""
    from numbapool import _dispatch

    dtype = np.dtype(data.draw(st.sampled_from(FLOATS)))
    rank = data.draw(st.integers(2, 4))
    max_side = {2: 7, 3: 5, 4: 3}[rank]
    shape = (
        data.draw(st.integers(1, 2)),
        data.draw(st.integers(1, 2)),
        *data.draw(st.lists(st.integers(1, max_side), min_size=rank, max_size=rank)),
    )
    x = data.draw(tie_array(dtype, shape))
    attrs = data.draw(window_attributes(rank))
    expected = _expected_or_same_error("MaxPool", numbapool.max_pool, x, attrs)
    if expected is None:
        return
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    away = (
        (max_planes.FAMILY,)
        if data.draw(st.booleans())
        else (max_planes.FAMILY, columns.ROW_FAMILY)
    )
    kernels = {columns.column_units, columns.row_units}
    with _families_turned_away(plan, *away):
        # a columns kernel's MaxPool, for the plan the call runs: its window's leading
        # single taps merged into the channels (1x1x2x2 at strides 1, 1, 1, 2 runs as 2x2
        # at strides 1, 2: the fixed kernel's)
        assume(_dispatch._launch(plan, 1).entry.kernel in kernels)
        got = numbapool.max_pool(x, **attrs)
        assert {launch.entry.kernel for launch in plan.launches.values()} <= kernels
    assert got.tobytes() == expected[0].tobytes()


@pytest.mark.parametrize(
    "shape, attrs, kernel",
    [
        ((2, 8, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), "row_units"),
        # float32 rows folded on past their end to whole passes (columns.FOLD_PASS_BYTES),
        # the last ones no further than the input's end
        ((2, 8, 9, 60), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), "row_units"),
        # one channel's three output rows, split in blocks
        ((1, 1, 5, 61), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4), "column_units"),
        ((2, 8, 9, 11), dict(kernel_shape=[3, 3], pads=[1] * 4), "max_plane_units"),
        (
            (2, 8, 7, 9, 11),
            dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6),
            "column_units",
        ),
        ((2, 8, 40), dict(kernel_shape=[3], pads=[1, 1]), "column_units"),
    ],
)
@pytest.mark.parametrize("zeros", [[0.0], [-0.0], [0.0, -0.0]])
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool_windows_of_zeros(shape, attrs, kernel, zeros, dtype):
    """Windows whose maximum is a zero, many of them, as after a ReLU: the kernels that scan
    a window column by column take a zero output again in row-major order only where a -0
    or a NaN is found (max_vectors.rows_hold_negative_zero_or_nan) in its column maxima (the
    columns kernels; over folded planes, its input rows) or its plane (small planes). With
    zeros of one sign, of the other, or of both, on two threads: the reference's bits."""

    rng = np.random.default_rng(len(zeros) * 10 + len(shape))
    values = np.array(zeros + [-1.0, -np.inf, 2.5])
    chances = [0.6 / len(zeros)] * len(zeros) + [0.25, 0.1, 0.05]
    x = rng.choice(values, size=shape, p=chances).astype(dtype)
    expected, _ = reference.pool("MaxPool", x, **attrs)
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    got, launch = _on_two_threads(plan, lambda x=x: numbapool.max_pool(x, **attrs))
    assert launch.entry.kernel.__name__ == kernel
    assert (expected == 0).sum() > expected.size // 4  # many windows of zeros
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    "attrs",
    [
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
        dict(kernel_shape=[4, 4], strides=[2, 2], pads=[1] * 4),
        # 5 rows: folded in two passes, the -0 in either
        dict(kernel_shape=[5, 3], strides=[2, 2], pads=[2, 1, 2, 1]),
    ],
)
@pytest.mark.parametrize("kernel", ["row_units", "column_units"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool_columns_scan_every_column(attrs, dtype, kernel):
    """The columns kernels retake a unit's zero and NaN outputs where its column maxima hold
    a -0 or a NaN: a window's row-major answer is the first maximum of its column (whole
    output rows take row_units, and column_units where row_units is turned away). Each
    channel of -1s holds one -0 (or one NaN) and, a row below, in another column, one +0
    (another NaN), so that a window's columns hold both and its row-major answer is the
    first: at every place, the first and last columns of a unit's span included. Windows 3
    wide at step 2 tell a -0 by the fold of the rows and a NaN by the outputs
    (_fold_column_rows, max_vectors.three_wide_step_two), the others by a scan."""
    from numbapool._kernels import columns

    height, width = 5, 9
    places = [
        (row, first, second)
        for row in range(height - 1)
        for first in range(width)
        for second in range(width)
        if second != first
    ]
    storage = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    bits = _EDGE_BITS[np.dtype(dtype)][1]  # 0, the sign bit alone (-0), ..., quiet NaNs
    quiet_nans = [bits[6], bits[7]]  # all ones but the sign bit, all ones
    for early, late in [(bits[1], bits[0]), (quiet_nans[0], quiet_nans[1])]:
        x = np.full((1, len(places), height, width), -1.0, dtype)
        raw = x.view(storage)
        for channel, (row, first, second) in enumerate(places):
            raw[0, channel, row, first] = early
            raw[0, channel, row + 1, second] = late
        expected, _ = reference.pool("MaxPool", x, **attrs)
        plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
        away = () if kernel == "row_units" else (columns.ROW_FAMILY,)
        with _families_turned_away(plan, *away):
            got, launch = _on_two_threads(plan, lambda x=x: numbapool.max_pool(x, **attrs))
            assert launch.entry.kernel.__name__ == kernel
        assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 4, 7, 9, 11), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6)),
        ((2, 4, 6, 8, 10), dict(kernel_shape=[2, 3, 4], strides=[1, 2, 3], pads=[1, 0, 2] * 2)),
        ((1, 3, 4, 5, 6, 7), dict(kernel_shape=[2, 2, 3, 3], dilations=[1, 2, 1, 2])),
    ],
)
@pytest.mark.parametrize("fold_planes", [False, True])
# float32 folds in numba's loop, the others in vectors; uint8 retakes no zeros or NaNs
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint8])
def test_max_pool_columns_kinds_over_three_axes(shape, attrs, fold_planes, dtype):
    """Over three axes and more the columns kernel folds whole input planes first where
    columns.folds_planes holds, and input rows otherwise: either kind, chosen here whatever
    the shapes, gives the reference's bits (zeros of both signs, NaNs of two payloads)."""
    from numbapool._kernels import columns

    rng = np.random.default_rng(len(shape))
    if np.dtype(dtype).kind == "f":
        bits_type, patterns = _TIE_BITS[np.dtype(dtype)]
        x = np.array(patterns, bits_type)[rng.integers(0, len(patterns), shape)].view(dtype)
    else:
        x = rng.integers(-3, 4, shape).astype(dtype)
    expected, _ = reference.pool("MaxPool", x, **attrs)
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    plan.forget_launches()
    try:
        with (
            mock.patch.object(columns, "folds_planes", lambda *shapes: fold_planes),
            numbapool.threads(2),
        ):
            got = numbapool.max_pool(x, **attrs)
        launches = list(plan.launches.values())
        assert [launch.entry.kinds[-1] for launch in launches] == [fold_planes]
        assert launches[0].entry.kernel is columns.column_units
    finally:
        plan.forget_launches()
    assert got.tobytes() == expected.tobytes()


# Bit patterns at the edges of the scan's keys (max_vectors.rows_hold_negative_zero_or_nan):
# zeros, infinities, the NaNs nearest them and the largest, the largest finite values
_EDGE_BITS = {
    np.dtype(np.float16): (
        np.uint16,
        [0, 0x8000, 0x7C00, 0xFC00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF, 0x7BFF, 0xFBFF, 1, 0x8001],
    ),
    np.dtype(ml_dtypes.bfloat16): (
        np.uint16,
        [0, 0x8000, 0x7F80, 0xFF80, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7F7F, 0xFF7F, 1, 0x8001],
    ),
    np.dtype(np.float32): (
        np.uint32,
        [
            0,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7F800001,
            0xFF800001,
            0x7FFFFFFF,
            0xFFFFFFFF,
            0x7F7FFFFF,
            0xFF7FFFFF,
            1,
            0x80000001,
        ],
    ),
    np.dtype(np.float64): (
        np.uint64,
        [
            0,
            1 << 63,
            0x7FF << 52,
            0xFFF << 52,
            (0x7FF << 52) + 1,
            (0xFFF << 52) + 1,
            (1 << 63) - 1,
            (1 << 64) - 1,
            (0x7FF << 52) - 1,
            (0xFFF << 52) - 1,
            1,
            (1 << 63) + 1,
        ],
    ),
}


@pytest.mark.parametrize("dtype", FLOATS)
def test_rows_hold_negative_zero_or_nan(dtype):
    """The scan that decides whether a unit's zeros are taken again: over rows of lengths
    around its 512-bit vectors (whole vectors, a masked rest, both, none), each bit pattern
    at the edges of its keys (inf is not a NaN, the smallest NaN is, +0 is not a -0) placed
    alone among ordinary values: first, inside or last in a row, or just outside it. Against
    numpy's own isnan and sign bit of the float values."""
    from numba import njit

    from numbapool._kernels.family import storage_dtype
    from numbapool._kernels.max_vectors import rows_hold_negative_zero_or_nan

    @njit
    def scan(flat, row_starts, count):
        return rows_hold_negative_zero_or_nan(
            flat, row_starts, np.uint64(row_starts.size), np.uint64(count)
        )

    dtype = np.dtype(dtype)
    bits_type, patterns = _EDGE_BITS[dtype]
    lanes = 64 // dtype.itemsize
    ordinary = np.array([-2.5, -1.0, 0.5, 3.0], dtype=dtype)
    found = 0
    for count in (0, 1, lanes - 1, lanes, lanes + 1, 3 * lanes + 5):
        for row_starts in ([3], [3, 2 * count + 9], [2 * count + 9, 3]):
            row_starts = np.array(row_starts, dtype=np.int64)
            last = row_starts[-1]
            for at in {last - 1, last, last + count // 2, last + count - 1, last + count}:
                for pattern in patterns:
                    values = np.resize(ordinary, 4 * count + 20)
                    values.view(bits_type)[at] = pattern
                    with np.errstate(invalid="ignore"):  # bfloat16's NaNs in numpy's ufuncs
                        expected = any(
                            bool((np.isnan(row) | ((row == 0) & np.signbit(row))).any())
                            for row in (values[start : start + count] for start in row_starts)
                        )
                    got = scan(values.view(storage_dtype(dtype)), row_starts, count)
                    assert got == expected, (hex(pattern), count, list(row_starts), at)
                    found += expected
    assert found > 0


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((2, 3, 6, 7, 9), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6)),
        (
            (2, 3, 6, 7, 9),
            dict(kernel_shape=[2, 3, 2], dilations=[2, 1, 1], pads=[1, 0, 1, 1, 2, 0]),
        ),
        ((1, 2, 4, 3, 5, 6), dict(kernel_shape=[2, 2, 2, 3], strides=[1, 2, 1, 2], ceil_mode=1)),
    ],
)
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_pool_columns_over_planes(shape, attrs, dtype):
    """Three or more spatial axes: the input-rows-first kernel folds the outer axes over
    whole planes first; zeros of both signs and NaNs of two kinds, bit for bit against the
    reference."""
    bits_type, patterns = _TIE_BITS[np.dtype(dtype)]
    codes = np.random.default_rng(5).integers(0, len(patterns), size=shape)
    x = np.array(patterns, dtype=bits_type)[codes].view(dtype)
    expected, _ = reference.pool("MaxPool", x, **attrs)
    assert numbapool.max_pool(x, **attrs).tobytes() == expected.tobytes()


# Calls small enough to run on the calling thread at any thread count (_SERIAL_WORK)
_SMALL_CALLS = {
    "MaxPool": dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1]),
    "AveragePool": dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "LpPool": dict(kernel_shape=[2, 3], p=3, strides=[2, 2]),
}


_FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@pytest.mark.parametrize(
    "op, indices, dtype",
    [
        ("MaxPool", indices, dtype)
        for indices in (False, True)
        for dtype in _FLOATS + [np.int8, np.uint8]
    ]
    + [(op, False, dtype) for op in ("AveragePool", "LpPool") for dtype in _FLOATS],
)
def test_repeated_small_calls_through_the_prepared_call(op, indices, dtype, execution_path):
    """A small call's first run prepares its call on the calling thread
    (_dispatch._serial_call); the repeated C-ordered calls run it, and a strided view in
    between takes the general path: every one gives the reference's values. Through the
    parallel driver (2 threads) nothing is prepared."""
    rng = np.random.default_rng(11)
    # small integers: sums exact in every accumulator, a result rounded once
    x = rng.integers(-4 if np.dtype(dtype).kind != "u" else 0, 5, (2, 3, 7, 9)).astype(dtype)
    attrs = _SMALL_CALLS[op]
    function = {
        "MaxPool": numbapool.max_pool,
        "AveragePool": numbapool.average_pool,
        "LpPool": numbapool.lp_pool,
    }[op]
    if indices:
        attrs = dict(attrs, return_indices=True)
    plan = numbapool.plan(op, x.shape, x.dtype, **_SMALL_CALLS[op])
    plan.forget_launches()
    expected = reference.pool(op, x, **_SMALL_CALLS[op])
    strided = np.repeat(x, 2, axis=3)[..., ::2]  # the same values, not C-ordered
    sizes = [x.itemsize * math.prod(plan.out_shape), 8 * math.prod(plan.out_shape)]
    for call, array in enumerate([x, x, strided, x]):
        # numpy hands freed small buffers out again: those of the outputs' sizes hold
        # 0xFF bytes (NaN, -1, 255), so that an output element left unwritten shows
        for size in sizes:
            held = [np.full(size, 0xFF, np.uint8) for _ in range(8)]
            del held
        with numbapool.threads(2):
            got = function(array, **attrs)
        if op == "MaxPool":
            values, expected_indices = expected
            got_values, got_indices = got if indices else (got, None)
            assert got_values.tobytes() == values.astype(dtype).tobytes(), call
            if indices:
                np.testing.assert_array_equal(got_indices, expected_indices, err_msg=str(call))
        else:
            _check_float(got, expected, np.dtype(dtype))
        assert list(plan.serial_calls) == ([indices] if execution_path == "serial" else [])
