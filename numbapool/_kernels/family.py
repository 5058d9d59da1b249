"""A kernel family: one serial kernel, the kinds it compiles for, the calls it serves and
the arguments it takes, declared once in the family's module (``FAMILY``, or ``FAMILIES``
where a module holds several kernels) and offered calls in the order of
choice.FAMILIES.

A family's arguments are named from one vocabulary (``ARGUMENTS``, built from the call's
plan and work split; ``ARRAYS``, the call's own arrays), so that the dispatcher builds
them the same way for every family and ``warmup`` finds their types without a call: the
types depend only on the operator and the dtype, never on the shapes.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numba
import numpy as np
from numba import types

from .. import _numba
from .._plan import BFLOAT16, WindowPlan, resolve_window_plan
from .entry import EntryPoint

# 16-bit floats reach numba as their bit patterns (codec.py)
STORAGE = {np.dtype(np.float16): np.dtype(np.uint16), BFLOAT16: np.dtype(np.int16)}
# GlobalMaxPool compares floats through their bit patterns as signed integers
SIGNED_BITS = {2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_INF_BITS = {
    np.dtype(np.float16): 0x7C00,
    BFLOAT16: 0x7F80,
    np.dtype(np.float32): 0x7F800000,
    np.dtype(np.float64): 0x7FF0000000000000,
}


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the kernels see an array of ``dtype`` as."""
    return STORAGE.get(dtype, dtype)


def lowest_value(dtype: np.dtype):
    """What MaxPool gives for a window with no tap inside the input, in storage form."""
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return np.array(-np.inf, dtype=dtype).view(storage_dtype(dtype))[()]


def p_kind(op: str, p: float) -> int:
    """The summing kernels' kind: 0 a mean (AveragePool, GlobalAveragePool), else how they
    raise to the power p: 1 abs, 2 a square, 3 a cube, 4 pow()."""
    if op in ("AveragePool", "GlobalAveragePool"):
        return 0
    return {1.0: 1, 2.0: 2, 3.0: 3}.get(p, 4)


def sum_zero(plan: WindowPlan):
    """The zero of the type a windowed sum accumulates in: float64 for float64 input and for
    every LpPool (|x| ** p leaves float32's range for moderate p), else float32."""
    if plan.op == "LpPool" or plan.dtype == np.dtype(np.float64):
        return np.float64(0)
    return np.float32(0)


class Split(NamedTuple):
    """How a windowed call's outputs are split into work units (_dispatch._work_split)."""

    block: int  # outputs per unit along the last axis
    units: int
    chunks: int  # runs of units the parallel driver deals out; 0: the call runs serially
    slots: int  # input rows each run caches


class WindowRequest(NamedTuple):
    """A windowed call as the families see it: its plan, and its split into units."""

    plan: WindowPlan
    split: Split

    @property
    def op(self) -> str:
        return self.plan.op

    @property
    def dtype(self) -> np.dtype:
        return self.plan.dtype

    @property
    def p(self) -> float:
        return self.plan.p

    def whole_rows(self) -> bool:
        """Whether each unit is a whole output row."""
        return self.split.block == self.plan.out_shape[-1]


class GlobalRequest(NamedTuple):
    """A global pooling call as the families see it."""

    op: str
    dtype: np.dtype
    p: float = 2.0
    # whether a thread's share of the input is large enough that short channels ask for
    # memory ahead (prefetch.reads_ahead)
    reads_ahead: bool = False
    # whether the call runs on the calling thread alone
    alone: bool = False
    # elements to a channel (0: any)
    channel: int = 0


def _signed_bits(dtype: np.dtype) -> np.dtype:
    return SIGNED_BITS[dtype.itemsize]


# Every argument a family may take after the call's arrays, built from the request. A
# family names its arguments in its kernel's order; the dispatcher builds them from here.
ARGUMENTS: dict[str, Callable] = {
    "lowest": lambda request: lowest_value(request.dtype),
    "p": lambda request: float(request.p),
    "zero": lambda request: sum_zero(request.plan),
    "p_as_zero": lambda request: sum_zero(request.plan).dtype.type(request.p),
    "block": lambda request: request.split.block,
    "slots": lambda request: request.split.slots,
    **{
        name: (lambda request, name=name: request.plan.geometry[name])
        for name in (
            "axes",
            "taps",
            "tap_offsets",
            "tap_index_offsets",
            "tap_outputs",
            "lead_rows",
            "divisor_counts",
        )
    },
    # the 2-D row kernels' geometry (WindowPlan.rows_geometry)
    **{
        f"row_{name}": (lambda request, name=name: request.plan.rows_geometry[name])
        for name in ("axes", "tap_outputs", "divisor_counts")
    },
    # GlobalMaxPool's constants over the bits as signed integers
    "magnitude_mask": lambda request: _signed_bits(request.dtype).type(
        np.iinfo(_signed_bits(request.dtype)).max
    ),
    "inf_bits": lambda request: _signed_bits(request.dtype).type(_INF_BITS[request.dtype]),
    "sign_shift": lambda request: _signed_bits(request.dtype).type(8 * request.dtype.itemsize - 1),
    "reads_ahead": lambda request: request.reads_ahead,
}


def _array(dtype: np.dtype, ndim: int, readonly: bool = False) -> types.Array:
    """numba's type of a C-ordered array of ``dtype`` and ``ndim``."""
    array = numba.typeof(np.empty((0,) * ndim, dtype))
    return array.copy(readonly=True) if readonly else array


# The call's own arrays a family may take, first, as numba types for a dtype: a windowed
# pool's input, output and MaxPool's Indices as one axis each (units.py: the Python that
# views a C-ordered array so, ravel, is the cheapest of numpy's views), a global pool's
# input as rows of each channel (N*C, elements) and its output (N*C,); ``*_bits`` are
# GlobalMaxPool's views of them as signed integers.
ARRAYS: dict[str, Callable[[np.dtype], types.Array]] = {
    "x": lambda dtype: _array(storage_dtype(dtype), 1, readonly=True),
    "y": lambda dtype: _array(storage_dtype(dtype), 1),
    "indices": lambda dtype: _array(np.dtype(np.int64), 1),
    "rows": lambda dtype: _array(storage_dtype(dtype), 2, readonly=True),
    "row_bits": lambda dtype: _array(_signed_bits(dtype), 2, readonly=True),
    "channels_out": lambda dtype: _array(storage_dtype(dtype), 1),
    "channels_out_bits": lambda dtype: _array(_signed_bits(dtype), 1),
}
# the arrays a kernel only reads
_INPUTS = ("x", "rows", "row_bits")


class Family(NamedTuple):
    """One kernel and what it serves.

    ``serves(request)`` returns the kinds the kernel compiles for this call, or None when
    it does not serve it; it is asked only for the operators in ``ops`` (and only for
    MaxPool calls with Indices when ``arrays`` has "indices", only without otherwise), and
    for a family whose units must be whole output rows, only when they are. ``kinds(op,
    dtype)`` lists every kinds tuple ``serves`` can return for that operator and dtype.
    """

    entry: object  # the serial kernel (numba dispatcher): (begin, end, *arrays, *arguments, *kinds)
    ops: tuple  # the ONNX operators it serves
    serves: Callable  # (request) -> its kinds, or None
    kinds: Callable  # (op, dtype) -> every kinds tuple serves can return
    arguments: tuple  # names in ARGUMENTS, in the kernel's order after the arrays
    arrays: tuple = ("x", "y")  # names in ARRAYS, in the kernel's order
    whole_rows: bool = False  # whether its units must be whole output rows
    examples: tuple = ()  # (op, shape, attributes) of calls it serves, for the tests

    @property
    def name(self) -> str:
        """``module.kernel``."""
        return f"{self.module}.{self.entry.py_func.__name__}"

    @property
    def module(self) -> str:
        return self.entry.py_func.__module__.rpartition(".")[2]

    @property
    def indices(self) -> bool:
        """Whether it writes MaxPool's Indices."""
        return "indices" in self.arrays

    def entry_point(self, kinds: tuple) -> EntryPoint:
        return EntryPoint(self.entry, kinds, sum(name in _INPUTS for name in self.arrays))

    def argument_values(self, request) -> tuple:
        """Its arguments after the arrays, but the kinds, for ``request``."""
        return tuple(ARGUMENTS[name](request) for name in self.arguments)

    def argument_types(self, op: str, dtype: np.dtype) -> tuple:
        """numba's types of its arrays and arguments, but the kinds, for ``op`` and
        ``dtype``: those of a call on the smallest input (the types do not depend on the
        shapes)."""
        if op.startswith("Global"):
            request = GlobalRequest(op, dtype)
        else:
            plan = resolve_window_plan(
                op, (1, 1, 1, 1), dtype, (1, 1), None, None, "NOTSET", 0, None, 0, 2, 0
            )
            request = WindowRequest(plan, Split(1, 1, 0, 1))
        return tuple(ARRAYS[name](dtype) for name in self.arrays) + tuple(
            _numba.argument_type(self.entry, value) for value in self.argument_values(request)
        )


def row_window(plan: WindowPlan, steps) -> bool:
    """Whether a 2-D row kernel (wide.py, indexed.py) can serve the window: 1-D (as the
    2-D window of height 1, WindowPlan.rows_geometry) or 2-D, no dilation, a stride along the rows
    among ``steps``."""
    return len(plan.kernel_shape) <= 2 and set(plan.dilations) == {1} and plan.strides[-1] in steps
