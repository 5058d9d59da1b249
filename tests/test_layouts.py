"""Any numpy layout gives the right answer, and the input is never modified."""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest
import reference

import numbapool
from numbapool._kernels import parallel

RNG = np.random.default_rng(7)
BASE = RNG.standard_normal((3, 4, 9, 10))


def layouts(dtype):
    x = BASE.astype(dtype)
    yield "c-order", x
    yield "fortran", np.asfortranarray(x)
    yield "strided view", x[:, ::2, 1::2, ::3]
    yield "negative strides", x[::-1, :, ::-1, ::-2]
    yield "transposed", x.transpose(1, 0, 3, 2)
    readonly = x.copy()
    readonly.flags.writeable = False
    yield "read-only", readonly
    if np.dtype(dtype) != np.dtype(ml_dtypes.bfloat16) and np.dtype(dtype).itemsize > 1:
        yield "byte-swapped", x.astype(np.dtype(dtype).newbyteorder())


CALLS = {
    "max_pool": lambda x: numbapool.max_pool(
        x, [3, 2], strides=[2, 1], pads=[1, 0, 1, 1], return_indices=True
    )[1],
    "max_pool values": lambda x: numbapool.max_pool(x, [2, 2], dilations=[2, 1]),
    "average_pool": lambda x: numbapool.average_pool(
        x, [3, 3], pads=[1, 1, 1, 1], count_include_pad=1
    ),
    # stride 3 along the first axis: the generic summing kernel, not the planes' (planes.py)
    "average_pool strided": lambda x: numbapool.average_pool(
        x, [3, 3], strides=[3, 1], pads=[1, 1, 1, 1]
    ),
    "lp_pool": lambda x: numbapool.lp_pool(x, [2, 3], p=3, ceil_mode=1, strides=[2, 2]),
    "global_max_pool": numbapool.global_max_pool,
    "global_average_pool": numbapool.global_average_pool,
    "global_lp_pool": numbapool.global_lp_pool,
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("op", sorted(CALLS))
def test_any_layout_same_answer_input_untouched(op, dtype):
    for name, x in layouts(dtype):
        before = x.copy()
        got = CALLS[op](x)
        expected = CALLS[op](np.ascontiguousarray(x, dtype=np.dtype(dtype)))
        np.testing.assert_array_equal(got, expected, err_msg=name)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(x, before, err_msg=name)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_integer_max_pool_layouts(dtype):
    x8 = (BASE * 40).astype(dtype)
    for x in (x8, x8[:, :, ::-1], np.asfortranarray(x8)):
        before = x.copy()
        y, indices = numbapool.max_pool(x, [2, 3], pads=[1, 1, 0, 0], return_indices=True)
        y_ref, indices_ref = reference.pool(
            "MaxPool", np.ascontiguousarray(x), [2, 3], pads=[1, 1, 0, 0]
        )
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(indices, indices_ref)
        np.testing.assert_array_equal(x, before)


def test_array_likes_are_accepted():
    nested = BASE[:1, :1, :4, :4].tolist()
    y = numbapool.max_pool(nested, [2, 2])
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, numbapool.max_pool(np.array(nested), [2, 2]))


def test_results_are_fresh_arrays():
    x = BASE.astype(np.float32)
    y = numbapool.global_max_pool(x)
    assert not np.shares_memory(x, y)
    assert y.flags.c_contiguous and y.flags.writeable


def test_max_unpool_layouts():
    # 8 x 10 pools to 4 x 5, whose default unpooled shape is 8 x 10 again
    y, indices = numbapool.max_pool(
        BASE[:, :, :8].astype(np.float32), [2, 2], strides=[2, 2], return_indices=True
    )
    for values, idx in (
        (y, indices),
        (np.asfortranarray(y), np.asfortranarray(indices)),
        (y.astype(">f4"), indices.astype(">i8")),
    ):
        got = numbapool.max_unpool(values, idx, [2, 2], strides=[2, 2])
        expected = reference.unpool(y, indices, [2, 2], strides=[2, 2])
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", [(0, 3, 5, 5), (2, 0, 5, 5)])
def test_empty_batch_or_channels(shape):
    x = np.zeros(shape, np.float32)
    y, indices = numbapool.max_pool(x, [2, 2], return_indices=True)
    assert y.shape == indices.shape == shape[:2] + (4, 4)
    assert numbapool.average_pool(x, [3, 3], pads=[1, 1, 1, 1]).shape == shape
    assert numbapool.lp_pool(x, [5, 5]).shape == shape[:2] + (1, 1)
    for pool_ in (
        numbapool.global_max_pool,
        numbapool.global_average_pool,
        numbapool.global_lp_pool,
    ):
        assert pool_(x).shape == shape[:2] + (1, 1)
    assert numbapool.max_unpool(y, indices, [2, 2]).shape == shape


def _kernel_signatures() -> dict:
    """Every numbapool kernel and driver: the signatures it has compiled or loaded."""
    import numba

    from numbapool import _cache

    modules = [
        importlib.import_module(f"numbapool._kernels.{name}")
        for name in sorted(_cache.kernel_modules())
    ]
    return {
        (module.__name__, name): list(value.signatures)
        for module in modules
        for name, value in vars(module).items()
        if isinstance(value, numba.core.registry.CPUDispatcher)
    }


@pytest.mark.parametrize("side", [5, 96])  # the serial entry point; the parallel driver too
def test_read_only_inputs_share_the_compiled_kernels(side):
    """A read-only array is a numba type of its own; the kernels are compiled for read-only
    inputs whatever the flag, so a read-only input after a writable one (of another shape:
    a call of its own, on the same side of planes.PLANE_ELEMENTS) compiles (or loads)
    nothing, and the writable input stays writable."""
    x = RNG.standard_normal((2, 8, side, side)).astype(np.float32)
    other = RNG.standard_normal((2, 8, side - 1, side - 1)).astype(np.float32)
    read_only = other.copy()
    read_only.flags.writeable = False
    calls = [CALLS[op] for op in sorted(CALLS)] + [
        lambda x: numbapool.max_pool(x, [3, 3], strides=[2, 2]),
        lambda x: numbapool.average_pool(x, [2, 2], strides=[2, 2]),
    ]
    for call in calls:
        call(x)
        parallel.wait_for_drivers()  # the driver compiling in the background, if any
        assert x.flags.writeable
        before = _kernel_signatures()
        got = call(read_only)
        assert _kernel_signatures() == before
        np.testing.assert_array_equal(got, call(other))
