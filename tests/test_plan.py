"""The plan: normalized once per distinct call, and shown as a table in notebooks."""

import numpy as np

import numbapool
from numbapool import _calls, _dispatch


def test_repeated_calls_reuse_one_plan():
    args = ("MaxPool", (2, 3, 9, 9), np.dtype(np.float32), [3, 3])
    first = _dispatch.window_plan(*args, strides=[2, 2], pads=[1, 1, 1, 1])
    again = _dispatch.window_plan(*args, strides=(2, 2), pads=np.array([1, 1, 1, 1]))
    assert again is first
    assert first.out_shape == (2, 3, 5, 5)
    assert first.geometry is again.geometry


def test_the_public_plan_is_the_one_a_call_runs():
    _dispatch._WINDOW_PLANS.clear()  # no plan of an earlier test's call
    _calls.forget()
    x = np.zeros((1, 2, 6, 6), np.float32)
    plan = numbapool.plan("MaxPool", x.shape, x.dtype, [2, 2], strides=[2, 2])
    assert not plan.serial_calls
    numbapool.max_pool(x, [2, 2], strides=[2, 2])
    # the call found the same plan, and kept its prepared call there
    assert plan.serial_calls
    assert numbapool.plan("MaxPool", x.shape, x.dtype, (2, 2), strides=(2, 2)) is plan


def test_plan_shows_as_a_table():
    plan = _dispatch.window_plan(
        "AveragePool",
        (1, 1, 5),
        np.dtype(np.float32),
        [3],
        auto_pad="SAME_LOWER",
        strides=[2],
        count_include_pad=1,
    )
    html = plan._repr_html_()
    assert html.startswith("<table>")
    for expected in (
        "<th>output shape</th><td>(1, 1, 3)</td>",
        "<th>pads (begin)</th><td>(1,)</td>",
        "<th>count_include_pad</th><td>1</td>",
    ):
        assert expected in html
