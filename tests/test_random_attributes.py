"""Random, mostly wrong, attribute values thrown at every function: each call either gives
the reference's result or raises ValueError or TypeError, and never changes its input."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import numbapool

SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
ACCEPTED_ERRORS = (ValueError, TypeError)
X = np.random.default_rng(3).standard_normal((2, 3, 5, 6)).astype(np.float32)


def scalar():
    """One attribute entry: mostly small integers, sometimes anything else."""
    return st.one_of(
        st.integers(-2, 4),
        st.integers(-2, 4),
        st.integers(-2, 4),
        st.just(10**20),
        st.booleans(),
        st.floats(allow_nan=True),
        st.just("2"),
        st.none(),
        st.just(np.int64(2)),
        st.just(np.uint8(1)),
        st.just([1]),
    )


def mostly(valid, invalid):
    """``valid`` four times in five, so that a good share of calls has no bad attribute."""
    # (one_of would flatten nested one_of's and weigh every leaf alike)
    return st.sampled_from([True, True, True, True, False]).flatmap(
        lambda right: valid if right else invalid
    )


def sequence(rank, low=1, high=3, optional=True):
    """A per-axis attribute: mostly right; else a list of another length or of anything."""
    right = st.lists(st.integers(low, high), min_size=rank, max_size=rank)
    if optional:
        right = st.one_of(right, st.none())
    return mostly(
        right,
        st.one_of(
            st.lists(scalar(), min_size=0, max_size=2 * rank + 1),
            st.lists(st.integers(-1, 3), min_size=rank, max_size=rank).map(np.array),
            scalar(),
            st.just("22"),
            st.just({1: 2}),
        ),
    )


FLAG = mostly(st.sampled_from([0, 1]), st.one_of(scalar(), st.just("1")))
AUTO_PAD = mostly(
    st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]),
    st.sampled_from(["SAME", "valid", "", None, 1, b"VALID"]),
)
P = mostly(
    st.one_of(st.integers(1, 4), st.floats(0.25, 8)),
    st.one_of(
        st.integers(-1, 0),
        st.floats(allow_nan=True, allow_infinity=True),
        st.just("2"),
        st.none(),
        st.just(np.float32(2.5)),
        st.booleans(),
    ),
)


def clean(value):
    """An accepted per-axis attribute as plain ints, for the reference."""
    return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def check(call, reference_call):
    before = X.copy()
    try:
        got = call()
    except ACCEPTED_ERRORS as error:
        event(f"rejected: {type(error).__name__}")
        np.testing.assert_array_equal(X, before)
        return
    event("accepted")
    np.testing.assert_array_equal(X, before)
    expected = reference_call()
    for a, b in zip(
        got if isinstance(got, tuple) else (got,),
        expected if isinstance(expected, tuple) else (expected,),
    ):
        assert a.shape == b.shape
        # the reference, in float64, rounded once to the result's dtype (which may overflow)
        with np.errstate(over="ignore"):
            np.testing.assert_allclose(a, np.asarray(b).astype(a.dtype), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@SETTINGS
@given(data=st.data())
def test_windowed_functions(op, data):
    draw = data.draw
    attributes = dict(
        kernel_shape=draw(sequence(2, optional=False)),
        strides=draw(sequence(2)),
        pads=draw(sequence(4, low=0, high=2)),
        auto_pad=draw(AUTO_PAD),
        ceil_mode=draw(FLAG),
        dilations=draw(sequence(2)),
    )
    extra = {}
    if op == "MaxPool":
        extra = dict(storage_order=draw(FLAG), return_indices=draw(st.booleans()))
        call = lambda: numbapool.max_pool(X, **attributes, **extra)  # noqa: E731
    elif op == "AveragePool":
        extra = dict(count_include_pad=draw(FLAG))
        call = lambda: numbapool.average_pool(X, **attributes, **extra)  # noqa: E731
    else:
        extra = dict(p=draw(P))
        call = lambda: numbapool.lp_pool(X, **attributes, **extra)  # noqa: E731

    def reference_call():
        kwargs = {
            name: clean(attributes[name])
            for name in ("kernel_shape", "strides", "pads", "dilations")
        }
        kwargs.update(auto_pad=attributes["auto_pad"], ceil_mode=int(attributes["ceil_mode"]))
        if op == "MaxPool":
            y, indices = reference.pool(
                op, X.astype(np.float64), **kwargs, storage_order=int(extra["storage_order"])
            )
            return (y, indices) if extra["return_indices"] else y
        if op == "AveragePool":
            kwargs["count_include_pad"] = int(extra["count_include_pad"])
        else:
            kwargs["p"] = float(extra["p"])
        return reference.pool(op, X.astype(np.float64), **kwargs)

    check(call, reference_call)


@SETTINGS
@given(op=st.sampled_from(["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"]), p=P)
@example(op="GlobalLpPool", p=0.03125)  # a norm past float32's range: inf, like the reference
def test_global_functions(op, p):
    if op == "GlobalLpPool":
        call = lambda: numbapool.global_lp_pool(X, p=p)  # noqa: E731
    else:
        call = {
            "GlobalMaxPool": numbapool.global_max_pool,
            "GlobalAveragePool": numbapool.global_average_pool,
        }[op].__call__
        call = (lambda function: lambda: function(X))(call)
    check(
        call,
        lambda: reference.global_pool(
            op, X.astype(np.float64), p=float(p) if op == "GlobalLpPool" else 2.0
        ),
    )


INDICES = st.one_of(
    st.lists(st.integers(0, 12), min_size=12, max_size=12).map(
        lambda v: np.array(v, dtype=np.int64).reshape(1, 3, 2, 2)
    ),
    st.lists(st.integers(-3, 40), min_size=12, max_size=12).map(
        lambda v: np.array(v, dtype=np.int64).reshape(1, 3, 2, 2)
    ),
    st.lists(st.integers(0, 30), min_size=12, max_size=12).map(
        lambda v: np.array(v, dtype=np.int32).reshape(1, 3, 2, 2)
    ),
    st.just(np.zeros((1, 3, 2, 2), np.float32)),
    st.just(np.zeros((1, 3, 4), np.int64)),
    st.just(np.zeros((1, 3, 2, 2), np.uint64)),
    st.just([[[[0]]]]),
    st.none(),
)


@SETTINGS
@given(data=st.data())
def test_max_unpool(data):
    draw = data.draw
    x = X[:1, :, :2, :2].copy()
    indices = draw(INDICES)
    attributes = dict(
        kernel_shape=draw(sequence(2, optional=False)),
        strides=draw(sequence(2)),
        pads=draw(sequence(4, low=0, high=1)),
        output_shape=draw(
            st.one_of(st.none(), st.lists(st.integers(0, 6), min_size=3, max_size=5), sequence(4))
        ),
    )
    indices_before = None if indices is None else np.array(indices, copy=True)

    def call():
        return numbapool.max_unpool(x, indices, **attributes)

    def reference_call():
        shape = attributes["output_shape"]
        return reference.unpool(
            x.astype(np.float64),
            np.asarray(indices),
            clean(attributes["kernel_shape"]),
            clean(attributes["strides"]),
            clean(attributes["pads"]),
            None if shape is None else clean(shape),
        )

    check(call, reference_call)
    if indices_before is not None:
        np.testing.assert_array_equal(indices, indices_before)
