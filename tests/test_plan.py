"""The plan: normalized once per distinct call, and shown as a table in notebooks."""

import numpy as np

from numbapool import _plan


def test_repeated_calls_reuse_one_plan():
    args = ("MaxPool", (2, 3, 9, 9), np.dtype(np.float32), [3, 3])
    first = _plan.window_plan(*args, strides=[2, 2], pads=[1, 1, 1, 1])
    again = _plan.window_plan(*args, strides=(2, 2), pads=np.array([1, 1, 1, 1]))
    assert again is first
    assert first.out_shape == (2, 3, 5, 5)
    assert first.geometry is again.geometry


def test_plan_shows_as_a_table():
    plan = _plan.window_plan(
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
