"""Every bad argument raises ValueError or TypeError naming the attribute and the value."""

from __future__ import annotations

import numpy as np
import pytest

import numbapool

X = np.zeros((1, 1, 4, 4), dtype=np.float32)
I = np.zeros((1, 1, 4, 4), dtype=np.int64)

CASES = [
    # (call, exception, words the message must contain)
    (
        lambda: numbapool.max_pool(X, kernel_size=2, stride=2),
        TypeError,
        ["'kernel_size'", "kernel_size= is kernel_shape=", "stride= is strides="],
    ),
    (lambda: numbapool.average_pool(X, [2, 2], padding=1), TypeError, ["padding= is pads="]),
    (
        lambda: numbapool.lp_pool(X, [2, 2], norm_type=3, dilation=2),
        TypeError,
        ["norm_type= is p=", "dilation= is dilations="],
    ),
    (
        lambda: numbapool.max_unpool(X, I, [2, 2], output_size=(1, 1, 5, 5)),
        TypeError,
        ["output_size= is output_shape="],
    ),
    (lambda: numbapool.global_lp_pool(X, q=2), TypeError, ["unexpected keyword", "'q'"]),
    (
        lambda: numbapool.max_pool(X, [2]),
        ValueError,
        ["kernel_shape (2,)", "rank 4", "2 spatial axes", "(N, C, D1, ..., Dn)"],
    ),
    (
        lambda: numbapool.max_pool(np.zeros((3, 8, 8)), [2, 2]),
        ValueError,
        ["kernel_shape (2, 2)", "(3, 8, 8) (rank 3)", "1 spatial axis", "x[np.newaxis]"],
    ),
    (lambda: numbapool.max_unpool(X, I, [2]), ValueError, ["MaxUnpool", "rank 4"]),
    (lambda: numbapool.max_pool(X, [2, 0]), ValueError, ["kernel_shape[1]", ">= 1", "got 0"]),
    (lambda: numbapool.max_pool(X, [2, 2.0]), TypeError, ["kernel_shape", "integers", "2.0"]),
    (lambda: numbapool.max_pool(X, [True, 2]), TypeError, ["kernel_shape", "True"]),
    (lambda: numbapool.max_pool(X, "22"), TypeError, ["kernel_shape", "'22'"]),
    (lambda: numbapool.max_pool(X, 2), TypeError, ["kernel_shape", "got 2"]),
    (lambda: numbapool.max_pool(X, None), ValueError, ["kernel_shape"]),
    (lambda: numbapool.max_pool(X, [[2], [2]]), TypeError, ["kernel_shape", "[[2], [2]]"]),
    (lambda: numbapool.max_pool(X, [2, 2], strides=[0, 1]), ValueError, ["strides[0]", "got 0"]),
    (lambda: numbapool.max_pool(X, [2, 2], strides=[1, 1, 1]), ValueError, ["strides", "3"]),
    (
        lambda: numbapool.average_pool(X, [1, 1], strides=[10**20, 1]),
        ValueError,
        ["strides[0]", "<= 2147483647", str(10**20)],
    ),
    (
        lambda: numbapool.max_pool(X, [2, 2], pads=[0, 0, 2**40, 0]),
        ValueError,
        ["pads[2]", str(2**40)],
    ),
    (lambda: numbapool.max_pool(X, [2, 2], pads=[1, 1, 1]), ValueError, ["pads", "4 values"]),
    (lambda: numbapool.max_pool(X, [2, 2], pads=[-1, 0, 0, 0]), ValueError, ["pads[0]", "-1"]),
    (lambda: numbapool.max_pool(X, [2, 2], dilations=[1, -2]), ValueError, ["dilations[1]", "-2"]),
    (lambda: numbapool.max_pool(X, [2, 2], auto_pad="SAME"), ValueError, ["auto_pad", "'SAME'"]),
    (lambda: numbapool.max_pool(X, [2, 2], auto_pad=None), ValueError, ["auto_pad", "None"]),
    (
        lambda: numbapool.max_pool(X, [2, 2], auto_pad="VALID", pads=[0, 1, 0, 0]),
        ValueError,
        ["pads", "auto_pad", "VALID", "all-zero"],
    ),
    (lambda: numbapool.max_pool(X, [2, 2], ceil_mode=2), ValueError, ["ceil_mode", "2"]),
    (lambda: numbapool.max_pool(X, [2, 2], storage_order=-1), ValueError, ["storage_order", "-1"]),
    (
        lambda: numbapool.average_pool(X, [2, 2], count_include_pad="yes"),
        ValueError,
        ["count_include_pad", "'yes'"],
    ),
    (lambda: numbapool.lp_pool(X, [2, 2], p=0), ValueError, ["p must", "0"]),
    (lambda: numbapool.lp_pool(X, [2, 2], p="2"), TypeError, ["p must", "'2'"]),
    (lambda: numbapool.lp_pool(X, [2, 2], p=float("nan")), ValueError, ["p must", "nan"]),
    (lambda: numbapool.global_lp_pool(X, p=-1), ValueError, ["p must", "-1"]),
    (lambda: numbapool.max_pool(np.zeros((1, 4)), [2]), ValueError, ["spatial axis", "(1, 4)"]),
    (lambda: numbapool.global_max_pool(np.zeros(3)), ValueError, ["spatial axis", "(3,)"]),
    (
        lambda: numbapool.max_pool(np.zeros((1, 1, 4), np.int32), [2]),
        TypeError,
        ["MaxPool", "int32"],
    ),
    (
        lambda: numbapool.average_pool(np.zeros((1, 1, 4), np.int8), [2]),
        TypeError,
        ["AveragePool", "int8"],
    ),
    (lambda: numbapool.lp_pool(np.zeros((1, 1, 4), np.uint8), [2]), TypeError, ["LpPool", "uint8"]),
    (
        lambda: numbapool.global_max_pool(np.zeros((1, 1, 4), np.complex64)),
        TypeError,
        ["GlobalMaxPool", "complex64"],
    ),
    (lambda: numbapool.max_pool(np.array([[["a"]]]), [1]), TypeError, ["MaxPool", "<U1"]),
    (
        lambda: numbapool.global_average_pool(np.zeros((1, 1, 0))),
        ValueError,
        ["spatial axis 0", "empty"],
    ),
    (
        lambda: numbapool.max_pool(np.zeros((1, 1, 4, 2)), [3, 3]),
        ValueError,
        ["spatial axis 1", "extent 3"],
    ),
    (
        lambda: numbapool.max_pool(np.zeros((1, 1, 2)), [2], dilations=[2]),
        ValueError,
        ["spatial axis 0", "extent 3"],
    ),
    (lambda: numbapool.max_unpool(X, X, [2, 2]), TypeError, ["indices", "float32"]),
    (lambda: numbapool.max_unpool(X, I[..., 0], [2, 2]), ValueError, ["indices", "(1, 1, 4)"]),
    (lambda: numbapool.max_unpool(X, I - 1, [2, 2]), ValueError, ["index -1", "[0, 25)"]),
    (lambda: numbapool.max_unpool(X, I + 25, [2, 2]), ValueError, ["index 25", "[0, 25)"]),
    (
        lambda: numbapool.max_unpool(X, I, [2, 2], output_shape=[1, 2, 5, 5]),
        ValueError,
        ["output_shape", "(1, 2, 5, 5)"],
    ),
    (
        lambda: numbapool.max_unpool(X, I, [2, 2], output_shape=[1, 1, 5]),
        ValueError,
        ["output_shape", "4 values"],
    ),
    (
        lambda: numbapool.max_unpool(X, I, [2, 2], strides=[2, 2], output_shape=[1, 1, 12, 12]),
        ValueError,
        [
            "output_shape (1, 1, 12, 12)",
            "7 to 9 elements",
            "(1, 1, 8, 8)",
            "shape of MaxPool's input",
        ],
    ),
    (
        lambda: numbapool.max_unpool(X, I + 81, [2, 2], strides=[2, 2], output_shape=[1, 1, 9, 9]),
        ValueError,
        ["index 81", "[0, 81)", "output_shape (1, 1, 9, 9)"],
    ),
    (
        lambda: numbapool.max_unpool(X, I + 64, [2, 2], strides=[2, 2]),
        ValueError,
        ["index 64", "default output (1, 1, 8, 8)", "pass its shape as output_shape"],
    ),
    (
        lambda: numbapool.max_unpool(X, I, [1, 1], pads=[2, 2, 2, 2]),
        ValueError,
        ["axis 0", "0 elements"],
    ),
    (lambda: numbapool.max_unpool(X, I, [2, 2], strides=[2]), ValueError, ["strides", "2 values"]),
]


@pytest.mark.parametrize("call, error, words", CASES)
def test_error_names_the_attribute_and_the_value(call, error, words):
    before = X.copy()
    with pytest.raises(error) as raised:
        call()
    message = str(raised.value)
    for word in words:
        assert word in message, (word, message)
    np.testing.assert_array_equal(X, before)


def test_invalid_values_are_rejected_even_after_a_valid_call_is_cached():
    # 2.0 == 2 and True == 1 hash alike: the plan cache must not accept them
    numbapool.max_pool(X, [2, 2], ceil_mode=1)
    with pytest.raises(TypeError, match="kernel_shape"):
        numbapool.max_pool(X, (2.0, 2.0), ceil_mode=1)
    with pytest.raises(TypeError, match="kernel_shape"):
        numbapool.max_pool(X, [2.0, 2], ceil_mode=1)
    with pytest.raises(ValueError, match="ceil_mode"):
        numbapool.max_pool(X, [2, 2], ceil_mode=1.0)
    with pytest.raises(ValueError, match="ceil_mode"):
        numbapool.max_pool(X, [2, 2], ceil_mode=np.float64(1.0))
    # every flag: a float never finds the plan of the valid call cached before it
    numbapool.max_pool(X, [2, 2], storage_order=1)
    with pytest.raises(ValueError, match="storage_order"):
        numbapool.max_pool(X, [2, 2], storage_order=1.0)
    numbapool.average_pool(X, [2, 2], count_include_pad=1)
    with pytest.raises(ValueError, match="count_include_pad"):
        numbapool.average_pool(X, [2, 2], count_include_pad=1.0)
    # bools are flags too: the cached plan of 1 serves True
    assert numbapool.max_pool(X, [2, 2], ceil_mode=True).tobytes() == (
        numbapool.max_pool(X, [2, 2], ceil_mode=1).tobytes()
    )
    # the lists of the common call, kernel shape and strides, are checked in one loop
    numbapool.max_pool(X, [2, 2], strides=[1, 1])
    with pytest.raises(TypeError, match="strides"):
        numbapool.max_pool(X, [2, 2], strides=[1, 1.0])
    with pytest.raises(TypeError, match="strides"):
        numbapool.max_pool(X, [2, 2], strides=[True, 1])
    with pytest.raises(TypeError, match="kernel_shape"):
        numbapool.max_pool(X, [2, True], strides=[1, 1])
