"""The public windowed functions' own lines (_calls.py): a repeated call runs without the
general path, gives the reference's values, and finds only the calls it may."""

import inspect
from unittest import mock

import ml_dtypes
import numpy as np
import pytest
import reference

import numbapool
from numbapool import _calls, _dispatch

# small integers: every sum exact, every mean and norm rounded once from an exact value
_X = np.random.default_rng(5).integers(-4, 5, (2, 3, 8, 10)).astype(np.float32)

_CALLS = [
    ("MaxPool", numbapool.max_pool, dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("MaxPool", numbapool.max_pool, dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1])),
    ("MaxPool", numbapool.max_pool, dict(kernel_shape=[2, 2], return_indices=True)),
    ("AveragePool", numbapool.average_pool, dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("AveragePool", numbapool.average_pool, dict(kernel_shape=[3, 3], count_include_pad=1)),
    ("LpPool", numbapool.lp_pool, dict(kernel_shape=[2, 3], p=1)),
    ("LpPool", numbapool.lp_pool, dict(kernel_shape=[2, 2], strides=[2, 1])),
]


def _expected(op, x, attrs):
    """The reference's outputs of ``op`` over ``x``, in the outputs' dtypes."""
    indices = attrs.get("return_indices", False)
    attrs = {name: value for name, value in attrs.items() if name != "return_indices"}
    result = reference.pool(op, x, **attrs)
    if op != "MaxPool":
        return (result.astype(x.dtype),)
    values, offsets = result
    return (values, offsets) if indices else (values,)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("op, function, attrs", _CALLS)
def test_repeated_calls_run_in_the_public_functions_lines(op, function, attrs, dtype):
    """The first call takes the general path; the repeated ones, C-ordered or a strided
    view of the same shape, do not, and each gives the reference's values (float16 and
    bfloat16 through a storage view, Indices through the prepared call)."""
    _calls.forget()
    x = _X.astype(dtype)
    strided = np.repeat(x, 2, axis=3)[..., ::2]  # the same values, not C-ordered
    expected = _expected(op, x, attrs)
    general = mock.Mock(wraps=_dispatch.pool_window)
    with mock.patch.object(_dispatch, "pool_window", general):
        for turn, array in enumerate([x, x, strided, x]):
            got = function(array, **attrs)
            got = got if isinstance(got, tuple) else (got,)
            assert len(got) == len(expected)
            for result, values in zip(got, expected, strict=True):
                assert result.dtype == values.dtype, turn
                assert result.tobytes() == values.tobytes(), turn
            if turn == 0:
                assert general.call_count > 0
                general.reset_mock()
    assert general.call_count == 0


def test_a_kept_call_asks_for_the_thread_count():
    """A call that runs on the calling thread only on one thread: kept, it runs in
    parallel once there are two."""
    x = np.random.default_rng(1).standard_normal((4, 16, 64, 64)).astype(np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, **attrs)
    plan.forget_launches()
    expected, _ = reference.pool("MaxPool", x, **attrs)
    with numbapool.threads(1):
        first = numbapool.max_pool(x, **attrs)
        again = numbapool.max_pool(x, **attrs)
    assert list(plan.launches) == [1]
    with numbapool.threads(2):
        parallel = numbapool.max_pool(x, **attrs)
    assert sorted(plan.launches) == [1, 2]
    for got in (first, again, parallel):
        assert got.tobytes() == expected.tobytes()
    plan.forget_launches()


def test_the_short_key_is_the_defaults_own_objects():
    """A call with every argument but the kernel and strides at its default is keyed by
    those alone; an equal value of another type or object takes the long key, where the
    general path judges it as it judges any call."""
    x = _X
    default = numbapool.max_pool(x, [2, 2])
    for name, value in [("ceil_mode", 0.0), ("storage_order", 0.0)]:
        with pytest.raises(ValueError, match=name):
            numbapool.max_pool(x, [2, 2], **{name: value})
    notset = "".join(["NOT", "SET"])  # equal to the default, not the same object
    assert numbapool.max_pool(x, [2, 2], auto_pad=notset).tobytes() == default.tobytes()
    assert numbapool.max_pool(x, [2, 2], ceil_mode=False).tobytes() == default.tobytes()
    numbapool.average_pool(x, [2, 2])
    with pytest.raises(ValueError, match="count_include_pad"):
        numbapool.average_pool(x, [2, 2], count_include_pad=0.0)
    two = numbapool.lp_pool(x, [2, 2])
    assert numbapool.lp_pool(x, [2, 2], p=2.0).tobytes() == two.tobytes()
    numbapool.lp_pool(x, [2, 2], p=1)
    with pytest.raises(TypeError, match="p"):
        numbapool.lp_pool(x, [2, 2], p=True)


def test_other_inputs_and_keywords_take_the_general_path():
    """A list, an unexpected keyword, an unhashable argument: the general path each time,
    with its values and its errors."""
    x = _X[:1, :1]
    expected = numbapool.max_pool(x, [2, 2], strides=[2, 2])
    for _ in range(2):
        assert numbapool.max_pool(x.tolist(), [2, 2], strides=[2, 2]).tobytes() == (
            expected.astype(np.float64).tobytes()
        )
        with pytest.raises(TypeError, match="stride= is strides="):
            numbapool.max_pool(x, [2, 2], stride=[2, 2])
        with pytest.raises(TypeError, match="pads"):
            numbapool.max_pool(x, [2, 2], pads=[0, 0, 0, [0]])


@pytest.mark.parametrize(
    "function", [numbapool.max_pool, numbapool.average_pool, numbapool.lp_pool]
)
def test_the_public_functions_keep_their_signature_and_docstring(function):
    written = function.__wrapped__
    assert inspect.signature(function) == inspect.signature(written)
    assert function.__name__ == written.__name__
    assert function.__doc__.startswith("ONNX ")
    assert "{window}" not in function.__doc__
    assert function.__annotations__ == written.__annotations__
