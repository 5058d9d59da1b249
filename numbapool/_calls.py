"""The public windowed functions' own lines: a repeated call found and run in one frame.

numbapool/__init__.py writes max_pool, average_pool and lp_pool with their signatures,
docstrings and the general path (_dispatch.pool_window). ``fast_path`` puts in front of
each a function of the same parameters, compiled from _FAST_PATH_LINES, that keys the
call by its arguments in a dict of its own (``PREPARED_CALLS``). On a hit, the call runs
there: a call prepared on the calling thread without a storage view or Indices in those
lines (the output's allocation, the arrays' flat views, the kernel's entry point), any
other through what ``_dispatch.prepared_call`` kept for it. A first call finds or
resolves its plan in pool_window's cache (which validates it), runs it as pool_window
does, and keeps what a repeated one needs; an input that is not a NumPy array, an
unexpected keyword or an unhashable argument takes the general path each time.

Why: on a small call, Python's lines are its time. The tiny case (MaxPool 2x2 over
1x3x8x8, one core) ran three frames (the public function, pool_window and the prepared
call), its plan found by a key of sixteen parts; in one frame, by the short key below, it
takes 0.85 of that time: 0.92 of torch's quickest call, where it took 1.08.

The key: the input's shape and dtype, kernel_shape and strides frozen into tuples once
each element is checked to be an int (1.0 == 1 and True == 1 must not find a valid call's
plan), and return_indices. Where every other argument is the very object of its default
(the small ints and the interned "NOTSET" are one object each), that is the whole key;
else the rest joins it, the sequences frozen and the flags' and p's types beside them, as
pool_window keys them.
"""

from __future__ import annotations

import functools
import inspect
import linecache

import numpy as np

from . import _dispatch
from ._plan import freeze_ints

# pool_window's parameters after op, the input and kernel_shape, in its order; a public
# function that does not take one passes its default
_WINDOW_ARGUMENTS = list(inspect.signature(_dispatch.pool_window).parameters.values())[3:]
_SEQUENCES = ("pads", "dilations")
_TYPED = ("ceil_mode", "count_include_pad", "p", "storage_order")

# The calls found by each public function, by op; emptied when full, as pool_window's plans
PREPARED_CALLS: dict[str, dict] = {}
_PREPARED_CALLS_KEPT = 1024

_FAST_PATH_LINES = """\
def {name}({parameters}):
    if type(x) is ndarray and not unexpected:
        kernel, steps = kernel_shape, strides
        if type(kernel) is list and (steps is None or type(steps) is list):
            kernel = tuple(kernel)
            steps = None if steps is None else tuple(steps)
            for size in kernel if steps is None else kernel + steps:
                if type(size) is not int:
                    kernel, steps = freeze_ints(kernel_shape), freeze_ints(strides)
                    break
        else:
            kernel, steps = freeze_ints(kernel_shape), freeze_ints(strides)
        if {defaults}:
            key = (x.shape, x.dtype, kernel, steps{indices})
        else:
            key = (x.shape, x.dtype, kernel, steps{indices}, {rest})
        try:
            call = calls[key]
        except KeyError:
            return first_call(op, calls, key, x, kernel_shape, {arguments})
        except TypeError:  # a sequence that holds more than ints: the general path names it
            pass
        else:
            if type(call) is tuple:
                function, units, out_shape, dtype, trailing = call
                y = empty(out_shape, dtype)
                function(0, units, x.ravel(), y.ravel(), *trailing)
                return y
            return call(x)
    return general({forward})
"""


def fast_path(op: str):
    """Decorator: the public function of ``op`` (MaxPool, AveragePool, LpPool), whose body
    is the general path, with the lines of a repeated call in front of it (the module's
    docstring). The result keeps the decorated function's name, docstring, annotations and
    signature (inspect.signature follows ``__wrapped__``)."""

    def decorate(general):
        parameters = inspect.signature(general).parameters
        window = {argument.name: argument.default for argument in _WINDOW_ARGUMENTS}
        names = [name for name in parameters if name in window]
        expected = ["x", "kernel_shape", *names, "unexpected"]
        if (
            list(parameters) != expected
            or "strides" not in names
            or any(window[name] is inspect.Parameter.empty for name in window.keys() - names)
        ):
            raise TypeError(f"fast_path: {general.__name__} takes {list(parameters)}")
        others = [name for name in names if name not in ("strides", "return_indices")]
        source = _FAST_PATH_LINES.format(
            name=general.__name__,
            parameters=", ".join(
                [
                    "x",
                    "kernel_shape=default_kernel_shape",
                    "*",
                    *(f"{name}=default_{name}" for name in names),
                    "**unexpected",
                ]
            ),
            defaults=" and ".join(f"{name} is default_{name}" for name in others),
            indices=", return_indices" if "return_indices" in names else "",
            rest=", ".join(_key_part(name) for name in others),
            arguments=", ".join(
                name if name in parameters else repr(default) for name, default in window.items()
            ),
            forward=", ".join(
                ["x", "kernel_shape", *(f"{name}={name}" for name in names), "**unexpected"]
            ),
        )
        calls = PREPARED_CALLS.setdefault(op, {})
        namespace = {
            "ndarray": np.ndarray,
            "empty": np.empty,
            "freeze_ints": freeze_ints,
            "first_call": _first_call,
            "general": general,
            "op": op,
            "calls": calls,
            **{f"default_{name}": parameters[name].default for name in ["kernel_shape", *names]},
        }
        # the lines in linecache, so that a traceback through them shows them
        filename = f"<numbapool {general.__name__} fast path>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), namespace)
        return functools.update_wrapper(namespace[general.__name__], general)

    return decorate


def _key_part(name: str) -> str:
    """The long key's expression for the argument ``name``: a sequence frozen, a flag or p
    beside its type, auto_pad as it is."""
    if name in _SEQUENCES:
        return f"None if {name} is None else freeze_ints({name})"
    if name in _TYPED:
        return f"{name}, type({name})"
    return name


def _first_call(op, calls, key, x, kernel_shape, *arguments):
    """The first call of ``key``: its plan found (or resolved, which validates the call,
    raising if it is invalid) and run as the general path runs it; then what runs such a
    call again (_dispatch.prepared_call) kept in ``calls`` under ``key``."""
    *window, return_indices = arguments
    return_indices = bool(return_indices)
    shape = _dispatch.InputShape(x.shape, x.dtype)
    plan = _dispatch.pool_window(op, shape, kernel_shape, *window)
    result = _dispatch.run_plan(plan, return_indices, x)
    if len(calls) >= _PREPARED_CALLS_KEPT:
        calls.clear()
    calls[key] = _dispatch.prepared_call(plan, return_indices)
    return result


def forget() -> None:
    """Drop every call the public functions keep: the next call of each takes the general
    path again (after a plan's launches are dropped, or the dispatcher's thresholds changed)."""
    for calls in PREPARED_CALLS.values():
        calls.clear()
