"""The kernel families (choice.FAMILIES): each serves the calls it declares, with the
kinds and argument types it declares, and gives the reference's values there; the
architecture document's table lists them in their order."""

import os
import re

import ml_dtypes
import numpy as np
import pytest
import reference
from hypothesis import given, settings
from hypothesis import strategies as st

import numbapool
from numbapool import _dispatch, _numba
from numbapool._kernels import choice

_WINDOWED = {
    "MaxPool": numbapool.max_pool,
    "AveragePool": numbapool.average_pool,
    "LpPool": numbapool.lp_pool,
}
_GLOBAL = {
    "GlobalMaxPool": numbapool.global_max_pool,
    "GlobalAveragePool": numbapool.global_average_pool,
    "GlobalLpPool": numbapool.global_lp_pool,
}
# the dtypes an example runs in: float32, and float64 where float32 takes another family
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_EXAMPLES = [
    pytest.param(family, example, id=f"{family.name}-{number}")
    for family in choice.FAMILIES
    for number, example in enumerate(family.examples)
]


def _chosen(op, x, attrs, indices, alone_ahead=False):
    """(kernel, kinds, argument values but the kinds, for each way the call may run) the
    dispatcher chose for the call: a global pool's with and without reading ahead, or
    with ``alone_ahead`` its entry point for a run on the calling thread alone that reads
    ahead, where it has one of its own."""
    if op in _GLOBAL:
        call = _dispatch._global_call(op, x.shape, x.dtype, float(attrs.get("p", 2.0)))
        if alone_ahead and call.alone_ahead_entry is not None:
            return call.alone_ahead_entry.kernel, call.alone_ahead_entry.kinds, [()]
        kinds = call.entry.kinds
        ways = [constants[: len(constants) - len(kinds)] for constants in call.constants]
        return call.entry.kernel, kinds, ways
    plan = numbapool.plan(op, x.shape, x.dtype, **attrs)
    threads = 1 if _dispatch._runs_serially(plan) else numbapool.get_num_threads()
    launch = _dispatch._launch(plan, threads)
    entry, arguments = launch.indices_arguments if indices else (launch.entry, launch.arguments)
    return entry.kernel, entry.kinds, [arguments[: len(arguments) - len(entry.kinds)]]


def _family_of(kernel):
    return next(family for family in choice.FAMILIES if family.entry is kernel)


def _check_declared(op, x, attrs, indices, alone_ahead=False):
    """The chosen family's kinds are among those it declares for the dtype, and its
    arguments have the types it declares (those warmup compiles)."""
    kernel, kinds, ways = _chosen(op, x, attrs, indices, alone_ahead)
    family = _family_of(kernel)
    assert kinds in family.kinds(op, x.dtype)
    declared = family.argument_types(op, x.dtype)[len(family.arrays) :]
    for values in ways:
        assert tuple(_numba.argument_type(kernel, value) for value in values) == declared
    return family


@pytest.mark.parametrize("family, example", _EXAMPLES)
def test_each_family_serves_its_examples(family, example):
    # on two threads, in the dtype the example is for: the family chosen, and the
    # reference's values (MaxPool's bit for bit, with its Indices)
    # (a global pool's entry point for a run on the calling thread alone that reads
    # ahead, where it has one of its own, called directly)
    op, shape, attrs = example
    served = []
    for dtype in _DTYPES:
        x = np.random.default_rng(len(served)).standard_normal(shape).astype(dtype)
        with numbapool.threads(2):
            alone_ahead = (
                op in _GLOBAL
                and _dispatch._global_call(op, x.shape, x.dtype, 2.0).alone_ahead_entry is not None
                and _check_declared(op, x, attrs, False, alone_ahead=True) is family
            )
            if not alone_ahead and _check_declared(op, x, attrs, family.indices) is not family:
                continue
            served.append(dtype)
            if alone_ahead:
                call = _dispatch._global_call(op, x.shape, x.dtype, 2.0)
                got = np.empty(call.rows[0], dtype)
                arrays = (x.reshape(call.rows), got)
                call.alone_ahead_entry.compile(arrays).function(0, call.rows[0], *arrays)
                expected = reference.global_pool(op, x).reshape(-1)
            elif op in _GLOBAL:
                got = _GLOBAL[op](x, **attrs)
                expected = reference.global_pool(op, x, *attrs.values())
            else:
                kwargs = {"return_indices": True} if family.indices else {}
                got = _WINDOWED[op](x, **attrs, **kwargs)
                expected = reference.pool(op, x, **attrs)
        if op != "MaxPool":
            # AveragePool of float32 adds in float32 (docs/semantics.md): a few units in the
            # last place of inputs of order 1
            tolerance = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
            continue
        y, expected_indices = expected
        if family.indices:
            got, got_indices = got
            assert np.array_equal(got_indices, expected_indices)
        assert got.tobytes() == y.tobytes()
    assert served, f"{family.name} serves none of {_DTYPES} in {example}"


_ALL_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_choice_is_a_declared_kind(data):
    # whatever the window, dtype and thread count, the dispatcher's choice is one of the
    # kinds its family declares, with the argument types it declares: warmup compiles
    # exactly those
    dtype = np.dtype(data.draw(st.sampled_from(_ALL_DTYPES)))
    ops = ["MaxPool"] if dtype.kind in "iu" else [*_WINDOWED, *_GLOBAL]
    op = data.draw(st.sampled_from(ops))
    rank = data.draw(st.integers(1, 3))
    shape = (
        data.draw(st.integers(1, 2)),
        data.draw(st.integers(1, 9)),
        *(data.draw(st.integers(1, 12)) for _ in range(rank)),
    )
    x = np.zeros(shape, dtype)
    attrs = {}
    if op in _WINDOWED:
        kernel_shape = [data.draw(st.integers(1, 4)) for _ in range(rank)]
        attrs = dict(
            kernel_shape=kernel_shape,
            strides=[data.draw(st.integers(1, 4)) for _ in range(rank)],
            dilations=[data.draw(st.sampled_from([1, 1, 2])) for _ in range(rank)],
            pads=[data.draw(st.integers(0, k - 1)) for k in kernel_shape * 2],
        )
        pads = attrs["pads"]
        if any(
            size + pads[axis] + pads[axis + rank] < (k - 1) * d + 1
            for axis, (size, k, d) in enumerate(zip(shape[2:], kernel_shape, attrs["dilations"]))
        ):
            return  # no output position
    if op in ("LpPool", "GlobalLpPool"):
        attrs["p"] = data.draw(st.sampled_from([1, 2, 3, 0.5]))
    indices = op == "MaxPool" and data.draw(st.booleans())
    with numbapool.threads(data.draw(st.integers(1, 2))):
        _check_declared(op, x, attrs, indices)


def _table_rows() -> list:
    """(module, kernel, operators) of each row of docs/architecture.md's families table."""
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "architecture.md")
    with open(path) as document:
        text = document.read()
    table = text.split("## Kernel families", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)\.(\w+)` \| ([^|]+) \|", table, re.MULTILINE)
    return [(module, kernel, operators.split(", ")) for module, kernel, operators in rows]


def test_the_architecture_table_lists_the_families_in_their_order():
    assert _table_rows() == [
        (family.module, family.entry.py_func.__name__, list(family.ops))
        for family in choice.FAMILIES
    ]


@pytest.mark.parametrize("threads", [1, 2, 4, 8, 16, 32, 64])
def test_max_pool_over_three_axes_keeps_folding_planes_as_threads_grow(threads):
    # the 3-d case: 16 runs per thread would be two output planes each from 16 threads on,
    # too short to fold whole planes; the split takes fewer, longer runs, down to 4 per
    # thread (at 64 threads that is not enough: 128 runs fold, 256 are needed)
    from numbapool._kernels import columns

    plan = numbapool.plan(
        "MaxPool",
        (2, 32, 16, 56, 56),
        np.float32,
        kernel_shape=[3, 3, 3],
        strides=[2] * 3,
        pads=[1] * 6,
    )
    launch = _dispatch._launch(plan, threads)
    plan_units = 28  # output rows of one output plane, each a unit
    assert launch.entry.kernel is columns.column_units
    folds = launch.entry.kinds[-1]
    if threads < 64:
        assert folds
        assert launch.chunks >= 4 * threads
        assert launch.units // launch.chunks >= 4 * plan_units
    else:
        assert not folds
        assert launch.chunks == 16 * threads
