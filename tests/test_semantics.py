"""One test per decision in docs/semantics.md, on the examples written there."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import numbapool
from numbapool import _dispatch
from numbapool._kernels import global_, prefetch

NAN = np.nan


def row(*values, dtype=np.float32):
    """A (1, 1, n) input."""
    return np.array(values, dtype=dtype).reshape(1, 1, -1)


def same(actual, expected):
    np.testing.assert_array_equal(
        actual, np.asarray(expected, dtype=actual.dtype).reshape(actual.shape)
    )


def test_1_explicit_pads_floor_and_ceil():
    x = row(1, 2, 3, 4, 5)
    same(numbapool.max_pool(x, [2], strides=[2]), [2, 4])
    same(numbapool.max_pool(x, [2], strides=[2], ceil_mode=1), [2, 4, 5])
    y = numbapool.max_pool(row(1, 2, 3, 4), [2], strides=[2], pads=[0, 1], ceil_mode=1)
    same(y, [2, 4])


def test_2_same_pads_count_dilations_and_ignore_ceil_mode():
    x = row(1, 2, 3, 4)
    same(numbapool.average_pool(x, [3], strides=[2], auto_pad="SAME_UPPER"), [2, 3.5])
    same(numbapool.average_pool(x, [3], strides=[2], auto_pad="SAME_LOWER"), [1.5, 3])
    same(numbapool.average_pool(x, [2], dilations=[2], auto_pad="SAME_UPPER"), [2, 2, 3, 3])
    same(
        numbapool.average_pool(x, [2], dilations=[2], auto_pad="SAME_UPPER", ceil_mode=1),
        [2, 2, 3, 3],
    )


def test_3_valid_applies_ceil_mode():
    x = row(1, 2, 3, 4, 5)
    same(numbapool.max_pool(x, [2], strides=[2], auto_pad="VALID", ceil_mode=1), [2, 4, 5])
    # all-zero pads beside auto_pad, as exported models write them, change nothing
    same(numbapool.max_pool(x, [2], strides=[2], auto_pad="VALID", pads=[0, 0]), [2, 4])
    same(
        numbapool.average_pool(
            row(1, 2, 3, 4), [3], strides=[2], auto_pad="SAME_UPPER", pads=[0, 0]
        ),
        [2, 3.5],
    )


def test_4_average_divisor():
    x = row(1, 2, 3, 4, 5, 6)
    attrs = dict(strides=[2], pads=[1, 1], ceil_mode=1)
    same(numbapool.average_pool(x, [3], count_include_pad=0, **attrs), [1.5, 3, 5, 6])
    same(numbapool.average_pool(x, [3], count_include_pad=1, **attrs), [1, 3, 5, 3])


def test_5_lp_pool():
    same(numbapool.lp_pool(row(3, -4, 1, 1), [2], strides=[2], p=1), [7, 2])
    same(numbapool.lp_pool(row(3, -4), [2], p=2), [5])
    same(numbapool.lp_pool(row(1, 1), [2], p=0.5), [4])


def test_6_window_with_no_tap_inside():
    x = row(1, 2, 3, 4, 5)
    y, indices = numbapool.max_pool(x, [1], pads=[2, 0], return_indices=True)
    same(y, [-np.inf, -np.inf, 1, 2, 3, 4, 5])
    same(indices, [-1, -1, 0, 1, 2, 3, 4])
    same(numbapool.max_pool(x.astype(np.int8), [1], pads=[1, 0]), [-128, 1, 2, 3, 4, 5])
    same(numbapool.max_pool(x.astype(np.uint8), [1], pads=[1, 0]), [0, 1, 2, 3, 4, 5])
    same(numbapool.average_pool(x, [1], pads=[1, 0]), [0, 1, 2, 3, 4, 5])
    same(numbapool.lp_pool(x, [1], pads=[1, 0]), [0, 1, 2, 3, 4, 5])


def test_7_nan():
    y, indices = numbapool.max_pool(row(1, NAN, 3, NAN), [4], return_indices=True)
    assert np.isnan(y).all()
    same(indices, [1])
    assert np.isnan(numbapool.average_pool(row(1, NAN), [2])).all()


def test_8_indices():
    channel = np.array([[0, 1, 5], [2, 3, 4]], dtype=np.float32)
    x = np.stack([channel, channel + 10])[None]
    _, row_major = numbapool.max_pool(x, [2, 3], return_indices=True)
    same(row_major, [2, 8])
    _, column_major = numbapool.max_pool(x, [2, 3], storage_order=1, return_indices=True)
    same(column_major, [4, 10])
    ties = np.array([[[2, 5, 5]], [[5, 1, 5]]], dtype=np.float32).reshape(1, 2, 3)
    _, indices = numbapool.max_pool(ties, [3], return_indices=True)
    same(indices, [1, 3])


def test_9_pads_larger_than_the_kernel():
    same(numbapool.average_pool(row(1, 2, 3, 4, 5), [2], strides=[3], pads=[4, 4]), [0, 1, 3.5, 0])


def test_10_ranks_and_empty_inputs():
    assert numbapool.max_pool(np.zeros((0, 3, 4, 4), np.float32), [2, 2]).shape == (0, 3, 3, 3)
    assert numbapool.average_pool(np.zeros((2, 0, 5), np.float32), [2]).shape == (2, 0, 4)
    y, i = numbapool.max_pool(np.zeros((1, 0, 4), np.float32), [2], return_indices=True)
    assert y.shape == i.shape == (1, 0, 3)
    with pytest.raises(ValueError, match="no output position along spatial axis 1"):
        numbapool.max_pool(np.zeros((1, 1, 4, 2)), [3, 3])
    x = np.arange(2 * 3 * 4 * 3 * 2, dtype=np.float64).reshape(1, 1, 2, 3, 4, 3, 2)
    assert numbapool.max_pool(x, [1, 2, 2, 2, 2]).shape == (1, 1, 2, 2, 3, 2, 1)


def test_11_max_unpool():
    x = np.array([[[[1, 2], [3, 4]]]], dtype=np.float32)
    indices = np.array([[[[5, 7], [13, 15]]]])
    same(
        numbapool.max_unpool(x, indices, [2, 2], strides=[2, 2]),
        [[0, 0, 0, 0], [0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 0, 4]],
    )
    # with output_shape, the indices name positions of output_shape, as MaxPool's Indices
    # name positions of its input
    y = numbapool.max_unpool(x, indices, [2, 2], strides=[2, 2], output_shape=(1, 1, 5, 5))
    same(y, [[0, 0, 0, 0, 0], [1, 0, 2, 0, 0], [0, 0, 0, 3, 0], [4, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    # MaxPool of a 5x5 image and back: each maximum where it was
    pooled = np.arange(25, dtype=np.float32).reshape(1, 1, 5, 5)
    top, where = numbapool.max_pool(pooled, [2, 2], strides=[2, 2], return_indices=True)
    same(
        numbapool.max_unpool(top, where, [2, 2], strides=[2, 2], output_shape=pooled.shape),
        [[0, 0, 0, 0, 0], [0, 6, 0, 8, 0], [0, 0, 0, 0, 0], [0, 16, 0, 18, 0], [0, 0, 0, 0, 0]],
    )
    with pytest.raises(ValueError, match="index 16 is outside"):
        numbapool.max_unpool(x, indices + 1, [2, 2], strides=[2, 2])
    with pytest.raises(ValueError, match="index 15 is outside .0, 9., the row-major positions"):
        numbapool.max_unpool(x, indices, [2, 2], strides=[2, 2], output_shape=(1, 1, 3, 3))
    with pytest.raises(ValueError, match="must have 3 to 5 elements"):
        numbapool.max_unpool(x, indices, [2, 2], strides=[2, 2], output_shape=(1, 1, 6, 6))
    # a repeated index keeps the later element
    same(numbapool.max_unpool(row(1, 2), np.array([[[0, 0]]]), [1]), [2, 0])


def test_lp_pool_accumulates_in_float64():
    # |x| ** 74 leaves float32's range for |x| > 3.3 and underflows for small |x|; the norm
    # itself fits: float32 accumulation would give inf and lose the small windows
    x = np.array([[[3.5, 0.004, -1.25]]], dtype=np.float32)
    expected = (np.abs(x.astype(np.float64)) ** 74) ** (1 / 74)
    np.testing.assert_allclose(
        numbapool.lp_pool(x, [1], p=74), expected.astype(np.float32), rtol=2e-7
    )
    # a p below float32's range is not rounded to 0 (1 / p would divide by zero)
    tiny = (np.abs(x.astype(np.float64)) ** 1e-140) ** 1e140
    np.testing.assert_array_equal(numbapool.lp_pool(x, [1], p=1e-140), tiny.astype(np.float32))


def _round_once(values, dtype):
    """float64 -> dtype, rounded once to nearest, ties to even (numpy's casts to bfloat16 go
    through float32, which rounds twice): the nearest of the cast's result and its
    neighbours, compared exactly."""
    dtype = np.dtype(dtype)
    if dtype != np.dtype(ml_dtypes.bfloat16):
        return values.astype(dtype)
    out = values.astype(dtype)
    bits = out.view(np.uint16)
    for i, value in enumerate(values):
        if not np.isfinite(value):
            continue
        candidates = [
            np.array([int(bits[i]) + step], np.uint16).view(dtype)[0]
            for step in (-1, 0, 1)
            if 0 <= int(bits[i]) + step <= 0xFFFF
        ]
        candidates = [c for c in candidates if np.isfinite(np.float64(c))]
        error = [abs(Fraction(float(c)) - Fraction(float(value))) for c in candidates]
        best = min(error)
        ties = [c for c, e in zip(candidates, error) if e == best]
        out[i] = min(ties, key=lambda c: int(np.array([c], dtype).view(np.uint16)[0]) & 1)
    return out


@pytest.mark.parametrize("length", [4, 49, 200, 2048, 2049])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_global_sums_equal_the_in_order_sum(dtype, length):
    # GlobalLpPool, and GlobalAveragePool of float64 (narrower dtypes take float32 blocks:
    # test_global_average_float32_blocks). Channels where the order of a float64 sum
    # changes the rounded result: 2**60 + 1 - 2**60 is 0 in order; large terms that cancel;
    # means within a few float64 steps of halfway between two results; zeros of both
    # signs; infinities and NaN. Zeros before the four values fill the channel's length,
    # so that they are the last elements.
    rng = np.random.default_rng(7)
    huge = 2.0**60 if dtype != np.float16 else 2.0**15
    channels = [
        [huge, 1.0, -huge, 2.0**-24],
        [1.0, -huge, huge, 2.0**-24],
        [-0.0, -0.0, -0.0, -0.0],
        [0.0, -0.0, 0.0, -0.0],
        [np.inf, 1.0, 2.0, 3.0],
        [np.inf, -np.inf, 1.0, 2.0],
        [np.nan, 1.0, 2.0, 3.0],
    ]
    for _ in range(300):
        scale = 2.0 ** rng.integers(-30, 30 if dtype != np.float16 else 4)
        channels.append(list(rng.choice([-1.0, 1.0], 4) * scale * rng.integers(1, 2**11, 4)))
        base = rng.standard_normal(3)
        channels.append([*base, -base.sum() + rng.choice([0.0, 2.0**-40, -(2.0**-50)])])
    padded = np.zeros((len(channels), length))
    padded[:, -4:] = channels
    x = padded.astype(dtype).reshape(1, len(channels), length)
    # The padding's terms are +0, which leave an in-order total as it is (it starts at +0,
    # so it is never -0): only the four values are added here.
    wide = x.astype(np.float64)[0, :, -4:]
    for op, term, finish in [
        ("average", lambda v: v, lambda total: total / length),
        ("p=1", abs, lambda total: total),
        ("p=2", lambda v: v * v, np.sqrt),
        ("p=3", lambda v: abs(v) * abs(v) * abs(v), lambda total: total ** (1 / 3)),
        ("p=2.5", lambda v: abs(v) ** 2.5, lambda total: total ** (1 / 2.5)),
    ]:
        expected = []
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, rounding past float16
            for values in wide:
                total = 0.0
                for value in values:  # in order, in float64
                    total += term(value)
                expected.append(finish(total))
            expected = _round_once(np.array(expected), dtype)
        if op == "average":
            if dtype != np.float64:
                continue
            got = numbapool.global_average_pool(x)
        else:
            got = numbapool.global_lp_pool(x, p=float(op[2:]))
        assert got.reshape(-1).tobytes() == expected.tobytes(), op


def _float32_block_mean(channel, dtype):
    """docs/semantics.md's GlobalAveragePool for dtypes narrower than float64: blocks of
    1024 elements from the channel's start; in a block, element j added in float32 to lane
    j % 64 (lanes from +0), then lane l + h added to lane l for h = 32, 16, ..., 1; the
    blocks' lane 0 added in order in float64 from +0, divided by the count, rounded once."""
    values = np.asarray(channel).astype(np.float32)
    total = 0.0
    for start in range(0, len(values), 1024):
        lanes = [np.float32(0.0)] * 64
        for j, value in enumerate(values[start : start + 1024]):
            lanes[j % 64] = np.float32(lanes[j % 64] + value)
        half = 32
        while half:
            lanes = [np.float32(lanes[lane] + lanes[lane + half]) for lane in range(half)]
            half //= 2
        total += float(lanes[0])
    return total / len(values)


def test_global_average_float32_blocks_examples():
    # docs/semantics.md's two examples: the lanes' tree meets 2**30 and -2**30 before 28
    # joins, or 2**30 and 16 first, which float32 rounds to 2**30
    x = np.array([2.0**30, 16, -(2.0**30), 12], np.float32).reshape(1, 1, 4)
    assert numbapool.global_average_pool(x).reshape(-1).tolist() == [7.0]
    x = np.zeros((1, 1, 34), np.float32)
    x[0, 0, [0, 1, 32, 33]] = [2.0**30, -(2.0**30), 16, 12]
    assert numbapool.global_average_pool(x).reshape(-1).tolist() == [0.0]


@pytest.mark.parametrize("length", [1, 49, 64, 200, 1024, 1100, 2500])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_global_average_float32_blocks(dtype, length):
    # Values whose float32 sum depends on the order of the additions: a large value and its
    # negation in one lane or in two, around small ones; zeros of both signs; infinities
    # and NaN; values near the dtype's largest, whose float32 lanes overflow; channels of -0
    # alone. Each channel's values sit at random positions, the rest zeros: lanes, blocks
    # and the masked loads of the elements past the last whole run of lanes all meet them.
    rng = np.random.default_rng(length)
    big = 2.0 ** (14 if dtype == np.float16 else 30)
    small = big * 2.0**-26  # lost in a float32 sum with big
    largest = float(ml_dtypes.finfo(dtype).max)
    patterns = [
        [big, small, -big, 0.75 * small],
        [big, -big, 1.5 * small, small * 2.0**-5],
        [-0.0, -0.0, -0.0, -0.0],
        [np.inf, 1.0, 2.0, 3.0],
        [np.inf, -np.inf, 1.0, 2.0],
        [np.nan, 1.0, 2.0, 3.0],
        [largest, largest, -largest, 1.0],
    ]
    for _ in range(60):
        patterns.append(list(rng.choice([-1.0, 1.0], 4) * big * 2.0 ** -rng.integers(0, 27, 4)))
        patterns.append(list(rng.standard_normal(4)))
    channels = np.zeros((len(patterns), length))
    for channel, pattern in zip(channels, patterns):
        count = min(length, 4)
        channel[rng.choice(length, count, replace=False)] = pattern[:count]
    if length >= 34:  # lanes 0 and 32 meet first: big + small, which float32 rounds to big
        channels[0] = 0.0
        channels[0, [0, 32, 1, 33]] = patterns[0]
    # two channels of -0 alone: every lane and every sum is +0 by the rule
    zeros = np.full((2, length), -0.0)
    channels = np.concatenate([channels, zeros, rng.standard_normal((21, length)) * big / 4])
    x = channels.astype(dtype).reshape(2, -1, length)
    with np.errstate(invalid="ignore", over="ignore"):
        means = np.array([_float32_block_mean(c, dtype) for c in x.reshape(len(channels), -1)])
        expected = _round_once(means, dtype)
        in_float64 = _round_once(x.astype(np.float64).mean(axis=2).reshape(-1), dtype)
    got = numbapool.global_average_pool(x)
    assert got.reshape(-1).tobytes() == expected.tobytes()
    if length > 1:  # the rule is visible in these values: not the float64 mean
        assert expected.tobytes() != in_float64.tobytes()


@pytest.mark.parametrize("length", [1024, 2500])
def test_global_average_float32_blocks_at_every_place_in_a_line(length, monkeypatch):
    # Reading ahead (here chosen at once, as over a large input), the same sums wherever
    # the input starts in its cache lines: where the vector loads fall in the lines sets
    # their speed (docs/performance.md, the one-core table), never which lane an element
    # joins, nor which loads are masked near the input's end. A channel longer than a
    # block then runs half_line_sum_units, whose loads are half lines where a channel
    # starts on 32 bytes
    class ChosenAhead(prefetch.AheadChoice):
        def __init__(self):
            super().__init__()
            self.chosen = True

    monkeypatch.setattr(prefetch, "SHARE_AHEAD_BYTES", 0)
    monkeypatch.setattr(prefetch, "AheadChoice", ChosenAhead)
    rng = np.random.default_rng(length)
    scales = 2.0 ** rng.integers(0, 27, (6, length))
    values = (rng.standard_normal((6, length)) * scales).astype(np.float32)
    values[0, [0, 32, 1, 33]] = [2.0**30, 16.0, -(2.0**30), 12.0]  # lanes 0 and 32 meet first
    expected = _round_once(
        np.array([_float32_block_mean(c, np.float32) for c in values]), np.float32
    )
    storage = np.empty(values.nbytes + 128, np.uint8)
    line_start = -storage.ctypes.data % 64
    key = ("GlobalAveragePool", (1, 6, length), values.dtype, 2.0)
    _dispatch._GLOBAL_CALLS.pop(key, None)  # made afresh, under the choice above
    with numbapool.threads(1):
        numbapool.global_average_pool(values.reshape(1, 6, length))  # the serial call made
        assert _dispatch._GLOBAL_CALLS[key].compiled[1].alone_ahead == (length > global_.BLOCK)
    for offset in range(0, 64, 4):
        start = line_start + offset
        x = storage[start : start + values.nbytes].view(np.float32).reshape(1, 6, length)
        x[...] = values
        with numbapool.threads(1):
            got = numbapool.global_average_pool(x)
        assert got.reshape(-1).tobytes() == expected.tobytes(), offset


def test_lp_pool_cubes_by_products():
    # p = 3 takes |x| * |x| * |x|, not pow(): in float64 the two differ in the last bit for
    # some inputs, and the windows add their terms in order
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 2, 400)) * 2.0 ** rng.integers(-20, 20, (1, 2, 400))
    wide = x[0]
    products, powers = np.empty((2, 397)), np.empty((2, 397))
    for c in range(2):
        for i in range(397):
            by_products = by_pow = 0.0
            for v in wide[c, i : i + 4]:
                by_products += abs(v) * abs(v) * abs(v)
                by_pow += abs(v) ** 3.0
            products[c, i], powers[c, i] = by_products ** (1 / 3), by_pow ** (1 / 3)
    assert products.tobytes() != powers.tobytes()  # the rule is visible in these values
    got = numbapool.lp_pool(x, [4], p=3)
    assert got[0].tobytes() == products.tobytes()
    assert (
        numbapool.global_lp_pool(x[:, :, :4], p=3).reshape(-1).tobytes() == products[:, 0].tobytes()
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_lp_pool_cube_roots_are_pows_rounded(dtype):
    # A cube root rounded to a dtype narrower than float64 skips pow() where it can prove
    # pow's rounded result (sums.cube_root); the result is still pow's. 1 + 6**3 + 8**3 =
    # 9**3: scaled by an odd k, a window [k, 6k, 8k, 0] has the total (9k)**3, and 9k, one
    # significant bit wider than the dtype, lies halfway between two of its values. pow's
    # result lands a few float64 steps below it for large totals and above it for small ones
    # (1 / 3 rounds down in float64), and the output rounds that, not the exact root (which
    # would round to even). Then windows of zeros, subnormals, infinities and NaN.
    bits = {np.float32: 24, np.float16: 11, ml_dtypes.bfloat16: 8}[dtype]
    ks = np.arange(2**bits // 9 + 1, 2 ** (bits + 1) // 9 + 1)
    ks = ks[ks % 2 == 1][:3000]
    # roots 9k and 9k 2**-22 (float16's smallest steps hold it) or 9k 2**-40
    scales = [1.0, 2.0**-22 if dtype == np.float16 else 2.0**-40]
    windows = [
        [k * scale, 6 * k * scale, 8 * k * scale, 0] for scale in scales for k in ks.tolist()
    ]
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    windows += [
        [0, 0, 0, 0],
        [tiny, 0, -tiny, 0],
        [np.inf, 1, 0, 0],
        [np.nan, 1, 0, 0],
        [-0.0, 0, 0, 0],
        [float(ml_dtypes.finfo(dtype).max), 1, 0, 0],
    ]
    x = np.array(windows, np.float64).astype(dtype)  # every value here is exact in dtype
    expected = []
    with np.errstate(over="ignore", invalid="ignore"):
        for window in x.astype(np.float64):
            total = 0.0
            for value in window:  # in order, in float64
                total += abs(value) * abs(value) * abs(value)
            expected.append(total ** (1 / 3))
    expected = _round_once(np.array(expected), dtype)
    # pow's result is visible here: it rounds down from some ties and up from others
    midpoints = np.concatenate([9.0 * ks * scale for scale in scales])
    exact_roots = _round_once(midpoints, dtype).astype(np.float64)  # ties to even
    found = expected[: len(midpoints)].astype(np.float64)
    assert (found < exact_roots).any() and (found > exact_roots).any()
    # 2x2 windows (the fixed-window kernel) and windows of 4 along one axis (the generic one)
    square = x.reshape(-1, 2, 2).transpose(1, 0, 2).reshape(1, 1, 2, -1)
    got = numbapool.lp_pool(square, [2, 2], strides=[2, 2], p=3)
    assert got.reshape(-1).tobytes() == expected.tobytes()
    # the same windows in rows of 7 outputs, many rows to a run of roots (sums.root_queue)
    whole = len(x) // 7 * 7
    rows = x[:whole].reshape(-1, 7, 2, 2).transpose(0, 2, 1, 3).reshape(1, -1, 2, 14)
    got = numbapool.lp_pool(rows, [2, 2], strides=[2, 2], p=3)
    assert got.reshape(-1).tobytes() == expected[:whole].tobytes()
    got = numbapool.lp_pool(x.reshape(1, 1, -1), [4], strides=[4], p=3)
    assert got.reshape(-1).tobytes() == expected.tobytes()


@pytest.mark.parametrize("strides", [[1, 1], [2, 2], [1, 2, 1]])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_window_sums_in_the_stated_order(strides, count_include_pad):
    # float32 AveragePool, 3-wide windows, values whose float32 sum depends on the order
    # (2**24 + 1 - 2**24 is 0 in order) and zeros of both signs: each input row's taps are
    # added left to right to +0, then the rows in order to +0, then divided, all in float32.
    rank = len(strides)
    kernel = [3] * rank
    rng = np.random.default_rng(11)
    shape = (2, 3) + ((7, 9) if rank == 2 else (4, 5, 6))
    pool = np.array([2.0**24, -(2.0**24), 1.0, -1.0, 0.5, 0.0, -0.0, 3.0], np.float32)
    x = rng.choice(pool, size=shape)
    pads = [1] * (2 * rank)
    got = numbapool.average_pool(
        x, kernel, strides=strides, pads=pads, count_include_pad=count_include_pad
    )
    spatial = shape[2:]
    expected = np.empty_like(got)
    for n in range(shape[0]):
        for c in range(shape[1]):
            for position in np.ndindex(*got.shape[2:]):
                starts = [p * s - 1 for p, s in zip(position, strides)]
                total, taps_inside, taps_padded = np.float32(0), 0, 0
                for lead in np.ndindex(*kernel[:-1]):
                    coords = [s + t for s, t in zip(starts, lead)]
                    row_inside = all(0 <= q < size for q, size in zip(coords, spatial))
                    row_padded = all(-1 <= q <= size for q, size in zip(coords, spatial))
                    row_sum = np.float32(0)
                    for t in range(kernel[-1]):
                        q = starts[-1] + t
                        inside = row_inside and 0 <= q < spatial[-1]
                        taps_inside += inside
                        taps_padded += row_padded and -1 <= q <= spatial[-1]
                        if inside:
                            row_sum = np.float32(row_sum + x[(n, c, *coords, q)])
                    if row_inside:
                        total = np.float32(total + row_sum)
                divisor = taps_padded if count_include_pad else taps_inside
                expected[(n, c, *position)] = np.float32(total / np.float32(divisor))
    assert got.tobytes() == expected.tobytes()


def test_approximate_cube_roots_cube_to_within_their_bound():
    # sums.cube_root takes pow()'s rounded result from a bracket around an approximate
    # root without checking that root: its cube must lie within CUBE_SLACK of the total
    # (sums._approximate_cube_root's bound, 2**-48). In exact arithmetic, over mantissas
    # of every exponent modulo 3 (the guess by bits depends on it), at both ends of the
    # range and in between, in a loop like the kernels' (which may fuse its operations).
    from fractions import Fraction

    from numba import njit

    from numbapool._kernels import sums

    @njit
    def roots(totals, out):
        for i in range(totals.size):
            out[i] = sums._approximate_cube_root(totals[i])

    rng = np.random.default_rng(7)
    mantissas = np.concatenate([np.linspace(1.0, 2.0, 4097)[:-1], 1.0 + rng.random(2048)])
    exponents = [-900, -899, -898, -2, -1, 0, 1, 2, 897, 898, 899]
    totals = np.concatenate(
        [np.ldexp(mantissas, e) for e in exponents]
        + [
            np.ldexp(1.0 + rng.random(4096), rng.integers(-900, 900, 4096)),
            [sums.CUBE_LOW, sums.CUBE_HIGH],
        ]
    )
    out = np.empty_like(totals)
    roots(totals, out)
    worst = max(
        abs(Fraction(a) ** 3 - Fraction(t)) / Fraction(t)
        for a, t in zip(out.tolist(), totals.tolist())
    )
    assert worst <= Fraction(1, 2**48) < Fraction(sums.CUBE_SLACK)
