"""The canonical benchmark cases: one table that drives both asv and ``python -m numbapool bench``."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # ONNX operator name
    shape: tuple
    attrs: dict = field(default_factory=dict)  # ONNX attributes
    dtype: str = "float32"
    return_indices: bool = False
    data: str = "normal"  # make_input's kind of values


CASES = [
    Case(
        "resnet stem",
        "MaxPool",
        (8, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    ),
    Case(
        "resnet stem relu",
        "MaxPool",
        (8, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        data="relu",
    ),
    Case("vgg", "MaxPool", (8, 128, 112, 112), dict(kernel_shape=[2, 2], strides=[2, 2])),
    Case(
        "with indices",
        "MaxPool",
        (8, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        return_indices=True,
    ),
    Case(
        "inception",
        "AveragePool",
        (8, 64, 56, 56),
        dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], count_include_pad=0),
    ),
    Case("densenet", "AveragePool", (8, 128, 56, 56), dict(kernel_shape=[2, 2], strides=[2, 2])),
    Case(
        "lp",
        "LpPool",
        (8, 64, 56, 56),
        dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], p=2),
    ),
    Case("lp p=3", "LpPool", (8, 64, 56, 56), dict(kernel_shape=[2, 2], strides=[2, 2], p=3)),
    Case("global avg", "GlobalAveragePool", (32, 2048, 7, 7)),
    Case("global avg long", "GlobalAveragePool", (4, 256, 56, 56)),
    Case("global avg big planes", "GlobalAveragePool", (1, 256, 112, 112)),
    Case("global max", "GlobalMaxPool", (32, 2048, 7, 7)),
    Case(
        "3-d",
        "MaxPool",
        (2, 32, 16, 56, 56),
        dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6),
    ),
    Case("1-d", "AveragePool", (16, 64, 16000), dict(kernel_shape=[4], strides=[4])),
    Case(
        "1-d with indices",
        "MaxPool",
        (16, 64, 16000),
        dict(kernel_shape=[3], strides=[2]),
        return_indices=True,
    ),
    Case(
        "uint8",
        "MaxPool",
        (8, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2]),
        dtype="uint8",
    ),
    Case(
        "float64",
        "MaxPool",
        (4, 64, 112, 112),
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        dtype="float64",
    ),
    Case(
        "big kernel",
        "AveragePool",
        (4, 32, 128, 128),
        dict(kernel_shape=[9, 9], strides=[1, 1], pads=[4] * 4, count_include_pad=1),
    ),
    Case("dilated", "MaxPool", (4, 32, 64, 64), dict(kernel_shape=[3, 3], dilations=[2, 2])),
    Case("tiny", "MaxPool", (1, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
]
CASES_BY_NAME = {case.name: case for case in CASES}

# Cases for how numbapool itself scales: with threads (work on one channel; compute-heavy
# windows) and with the element count (the resnet stem at three batch sizes).
_STEM = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
SCALING_CASES = [
    Case("N*C = 1", "MaxPool", (1, 1, 2048, 2048), _STEM),
    Case(
        "lp p=3 3x3", "LpPool", (8, 64, 56, 56), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], p=3)
    ),
    CASES_BY_NAME["big kernel"],
    Case("resnet stem N=2", "MaxPool", (2, 64, 112, 112), _STEM),
    Case("resnet stem N=4", "MaxPool", (4, 64, 112, 112), _STEM),
    Case("resnet stem N=8", "MaxPool", (8, 64, 112, 112), _STEM),
]


@functools.lru_cache(maxsize=8)
def make_input(shape: tuple, dtype: str, data: str = "normal") -> np.ndarray:
    """A fixed input per (shape, dtype, data): seeded, so every run pools the same data.
    ``data`` "normal": independent standard normal values (uniform integers for int8 and
    uint8); "relu": a ReLU's outputs as a network's convolutions leave them, standard
    normal values smoothed along the last two axes (a mean of three neighbours, three
    times), then max(x, 0): regions of +0, about half of each plane, where many MaxPool
    windows hold only zeros."""
    rng = np.random.default_rng(20261122)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
        if data == "relu":
            for axis in range(max(0, x.ndim - 2), x.ndim):
                for _ in range(3):
                    x = (x + np.roll(x, 1, axis) + np.roll(x, -1, axis)) / 3
            x = np.maximum(x, np.float32(0))
        x = x.astype(dtype)
    x.flags.writeable = False
    return x


def runner(case: Case, x: np.ndarray):
    """The numbapool call for ``case`` on ``x`` with its arguments bound beforehand, as the
    peers' runners bind theirs, so that timing it times numbapool's own call alone: the
    call as a user writes it (_written_call), return_indices given only when True."""
    import numbapool

    attrs = dict(case.attrs)
    if case.op.startswith("Global"):
        function = {
            "GlobalAveragePool": numbapool.global_average_pool,
            "GlobalMaxPool": numbapool.global_max_pool,
            "GlobalLpPool": numbapool.global_lp_pool,
        }[case.op]
        return _written_call(function, (x,), attrs)
    kernel_shape = attrs.pop("kernel_shape")
    if case.op == "MaxPool":
        if case.return_indices:
            attrs["return_indices"] = True
        return _written_call(numbapool.max_pool, (x, kernel_shape), attrs)
    function = {"AveragePool": numbapool.average_pool, "LpPool": numbapool.lp_pool}[case.op]
    return _written_call(function, (x, kernel_shape), attrs)


def _written_call(function, positional: tuple, keywords: dict):
    """``lambda: function(*positional, **keywords)`` with the keywords written into the
    call, as a user writes them. A call through ``**keywords``, or functools.partial's
    keywords, builds a dict of them each time: 0.13 to 0.17 us of the tiny case's 2.2 us
    on one core, which a user's call does not pay."""
    names = [f"p{i}" for i in range(len(positional))]
    if not all(name.isidentifier() for name in keywords):
        raise ValueError(f"not a keyword: {list(keywords)!r}")
    bound = dict(zip(names, positional), **keywords, function=function)
    written = ", ".join([*names, *(f"{name}={name}" for name in keywords)])
    # every name a parameter whose default is its value: a local in the call
    parameters = ", ".join(f"{name}={name}" for name in bound)
    return eval(f"lambda {parameters}: function({written})", {}, bound)


def run(case: Case, x: np.ndarray) -> tuple:
    """One numbapool call for ``case``, its kernels compiled (or loaded) then (ready); the
    outputs as a tuple."""
    result = ready(runner(case, x))
    return result if isinstance(result, tuple) else (result,)


def ready(call):
    """Make ``call`` once, which compiles (or loads) its kernels, and wait for the parallel
    driver that a first call on an empty cache leaves compiling in the background: timing
    after this times the compiled call alone. Returns what the call returned."""
    from numbapool._kernels import parallel

    result = call()
    parallel.wait_for_drivers()
    return result
