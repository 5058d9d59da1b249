"""numbapool: the ONNX pooling operators on the CPU, compiled with Numba.

Every function takes an (N, C, D1, ..., Dn) array with n >= 1 spatial axes and the ONNX
attributes as keywords, with the ONNX defaults, and returns an array of the input's dtype.
Nothing is compiled at import; each kernel compiles on first use and is cached on disk.
See docs/semantics.md for the exact rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import _calls, _dispatch, _plan
from ._threads import get_num_threads, set_num_threads, threads
from ._warmup import warmup

__all__ = [
    "average_pool",
    "get_num_threads",
    "global_average_pool",
    "global_lp_pool",
    "global_max_pool",
    "lp_pool",
    "max_pool",
    "max_unpool",
    "plan",
    "set_num_threads",
    "threads",
    "warmup",
]

__version__ = "0.1.0"

if TYPE_CHECKING:  # for editors and type checkers only (py.typed): nothing imported at run time
    from collections.abc import Sequence

    from numpy.typing import ArrayLike

    Ints = Sequence[int]


def __dir__() -> list[str]:
    """The public names (``dir(numbapool)``), not the module's imports."""
    return sorted([*__all__, "__version__"])


_WINDOW_PARAMETERS = """\
    x : array_like
        Input of shape (N, C, D1, ..., Dn), n >= 1. Any layout; it is never modified.
    kernel_shape : sequence of int
        Window size along each spatial axis.
    strides : sequence of int, optional
        Step along each spatial axis; default 1.
    pads : sequence of int, optional
        ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``, each >= 0; default 0. Cannot be
        combined with an ``auto_pad`` other than "NOTSET".
    auto_pad : {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"}
        "SAME_*" pads so that each output axis has ``ceil(in / stride)`` positions, the odd
        cell at the end (UPPER) or the beginning (LOWER); "VALID" pads nothing.
    ceil_mode : {0, 1}
        Round the output length up instead of down; a last window that would start in
        the end padding is dropped. Ignored under "SAME_*".
    dilations : sequence of int, optional
        Spacing between window taps along each spatial axis; default 1."""

_RAISES = """\
    Raises
    ------
    TypeError
        If the dtype is not supported or an attribute has the wrong type.
    ValueError
        If an attribute has a bad value or length, the input has no spatial axis, or an
        axis would have no output position."""


# PyTorch's names of ONNX's attributes: a call that uses one gets a TypeError naming the
# ONNX keyword, where Python's own error names only the keyword it did not expect
_PYTORCH_NAMES = {
    "kernel_size": "kernel_shape",
    "stride": "strides",
    "padding": "pads",
    "dilation": "dilations",
    "norm_type": "p",
    "output_size": "output_shape",
}


def _refuse_keywords(function: str, keywords: dict) -> None:
    """Raise the TypeError of a call of ``function`` with keywords it does not take."""
    hints = [f"{name}= is {_PYTORCH_NAMES[name]}=" for name in keywords if name in _PYTORCH_NAMES]
    message = (
        f"{function}() got unexpected keyword argument"
        f"{'s' if len(keywords) > 1 else ''} {', '.join(map(repr, keywords))}"
    )
    if hints:
        message += "; numbapool takes ONNX's attribute names (docs/semantics.md): " + ", ".join(
            hints
        )
    raise TypeError(message)


def _as_array(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else np.asarray(x)


@_calls.fast_path("MaxPool")
def max_pool(
    x: ArrayLike,
    kernel_shape: Ints | None = None,
    *,
    strides: Ints | None = None,
    pads: Ints | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Ints | None = None,
    storage_order: int = 0,
    return_indices: bool = False,
    **unexpected,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """ONNX MaxPool: the largest element of each window.

        Parameters
        ----------
    {window}
        storage_order : {{0, 1}}
            How Indices number the spatial offset: 0 row-major, 1 column-major (first spatial
            axis fastest).
        return_indices : bool
            Also return the Indices output.

        Returns
        -------
        Y : ndarray
            Same dtype as ``x`` (float16, bfloat16, float32, float64, int8 or uint8). A window
            with no element inside the input gives -inf (the dtype's minimum for integers).
        Indices : ndarray of int64, only if ``return_indices``
            Offset of each maximum in the whole input, ``(n * C + c) * prod(D) + spatial
            offset``; -1 for an empty window. Ties go to the first maximum in the window's
            row-major scan; a window holding NaN gives NaN and the first NaN's offset.

    {raises}

        Examples
        --------
        >>> import numpy as np, numbapool
        >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
        >>> numbapool.max_pool(x, [2, 2], strides=[2, 2])
        array([[[[ 5.,  7.],
                 [13., 15.]]]], dtype=float32)
    """
    if unexpected:
        _refuse_keywords("max_pool", unexpected)
    return _dispatch.pool_window(
        "MaxPool",
        x,
        kernel_shape,
        strides,
        pads,
        auto_pad,
        ceil_mode,
        dilations,
        0,
        2,
        storage_order,
        bool(return_indices),
    )


@_calls.fast_path("AveragePool")
def average_pool(
    x: ArrayLike,
    kernel_shape: Ints | None = None,
    *,
    strides: Ints | None = None,
    pads: Ints | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Ints | None = None,
    count_include_pad: int = 0,
    **unexpected,
) -> np.ndarray:
    """ONNX AveragePool: the mean of each window.

        Parameters
        ----------
    {window}
        count_include_pad : {{0, 1}}
            0 divides by the taps inside the input; 1 by the taps inside the padded input
            (taps past the end padding, which ``ceil_mode`` can create, never count).

        Returns
        -------
        Y : ndarray
            Same dtype as ``x`` (float16, bfloat16, float32 or float64); sums accumulate in
            float32 (float64 for float64) and are rounded once. An empty window gives 0.

    {raises}

        Examples
        --------
        >>> import numpy as np, numbapool
        >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
        >>> numbapool.average_pool(x, [2, 2], strides=[2, 2])
        array([[[[ 2.5,  4.5],
                 [10.5, 12.5]]]], dtype=float32)
    """
    if unexpected:
        _refuse_keywords("average_pool", unexpected)
    return _dispatch.pool_window(
        "AveragePool",
        x,
        kernel_shape,
        strides,
        pads,
        auto_pad,
        ceil_mode,
        dilations,
        count_include_pad,
    )


@_calls.fast_path("LpPool")
def lp_pool(
    x: ArrayLike,
    kernel_shape: Ints | None = None,
    *,
    p: float = 2,
    strides: Ints | None = None,
    pads: Ints | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: Ints | None = None,
    **unexpected,
) -> np.ndarray:
    """ONNX LpPool: ``(sum |x| ** p) ** (1 / p)`` over each window.

        Parameters
        ----------
    {window}
        p : float
            Order of the norm, any real number > 0 (LpPool-1 has a float ``p``).

        Returns
        -------
        Y : ndarray
            Same dtype as ``x`` (float16, bfloat16, float32 or float64); the sum accumulates in
            float64 and is rounded once. Only taps inside the input count; an empty window
            gives 0.

    {raises}

        Examples
        --------
        >>> import numpy as np, numbapool
        >>> x = np.array([[[3.0, 4.0, 0.0, 5.0]]])
        >>> numbapool.lp_pool(x, [2], strides=[2])
        array([[[5., 5.]]])
    """
    if unexpected:
        _refuse_keywords("lp_pool", unexpected)
    return _dispatch.pool_window(
        "LpPool", x, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations, 0, p
    )


def plan(
    op: str, shape: Ints, dtype: np.dtype | str | type, kernel_shape: Ints, **attributes
) -> _plan.WindowPlan:
    """How a MaxPool, AveragePool or LpPool call on an input of ``shape`` and ``dtype``
    resolves: output shape, pads per side, strides, dilations. A notebook shows it as a table.

    ``attributes`` are the keywords of the function (``strides``, ``pads``, ``auto_pad``, ...).
    The same plan, cached, serves every call with these arguments.

    Examples
    --------
    >>> import numbapool
    >>> p = numbapool.plan("MaxPool", (1, 3, 224, 224), "float32", [3, 3], strides=[2, 2],
    ...                    auto_pad="SAME_UPPER")
    >>> p.out_shape, p.pads_begin, p.pads_end
    ((1, 3, 112, 112), (0, 0), (1, 1))
    """
    if op not in ("MaxPool", "AveragePool", "LpPool"):
        raise ValueError(f"plan: op must be 'MaxPool', 'AveragePool' or 'LpPool', got {op!r}")
    return _dispatch.window_plan(op, tuple(shape), np.dtype(dtype), kernel_shape, **attributes)


_GLOBAL_DOC = """ONNX {op}: the {what} of each channel over all spatial axes.

    Parameters
    ----------
    x : array_like
        Input of shape (N, C, D1, ..., Dn), n >= 1, of dtype float16, bfloat16, float32 or
        float64. Any layout; it is never modified.{extra}

    Returns
    -------
    Y : ndarray
        Shape (N, C, 1, ..., 1), the dtype of ``x``.{note}

{raises}
    """


def global_max_pool(x: ArrayLike) -> np.ndarray:
    return _dispatch.run_global("GlobalMaxPool", x)


def global_average_pool(x: ArrayLike) -> np.ndarray:
    return _dispatch.run_global("GlobalAveragePool", x)


def global_lp_pool(x: ArrayLike, *, p: float = 2, **unexpected) -> np.ndarray:
    if unexpected:
        _refuse_keywords("global_lp_pool", unexpected)
    return _dispatch.run_global("GlobalLpPool", x, _plan.check_p(p))


global_max_pool.__doc__ = _GLOBAL_DOC.format(
    op="GlobalMaxPool",
    what="largest element",
    extra="",
    raises=_RAISES,
    note=" A channel holding NaN gives NaN.",
)
global_average_pool.__doc__ = _GLOBAL_DOC.format(
    op="GlobalAveragePool",
    what="mean",
    extra="",
    raises=_RAISES,
    note=(
        "\n        float64 input sums in float64, in order; narrower dtypes sum blocks of 1024"
        "\n        elements in float32, in a fixed order of 64 lanes, and add the blocks'"
        "\n        sums in float64 (docs/semantics.md). The mean is rounded once."
    ),
)
global_lp_pool.__doc__ = _GLOBAL_DOC.format(
    op="GlobalLpPool",
    what="Lp norm",
    raises=_RAISES,
    extra="\n    p : float\n        Order of the norm, any real number > 0.",
    note=" The sum accumulates in float64 and is rounded once.",
)
for _function in (max_pool, average_pool, lp_pool):
    _function.__doc__ = _function.__doc__.format(window=_WINDOW_PARAMETERS, raises=_RAISES)


def max_unpool(
    x: ArrayLike,
    indices: ArrayLike,
    kernel_shape: Ints | None = None,
    *,
    strides: Ints | None = None,
    pads: Ints | None = None,
    output_shape: Ints | None = None,
    **unexpected,
) -> np.ndarray:
    """ONNX MaxUnpool: put each element of ``x`` back where ``indices`` says, zeros elsewhere.

        Parameters
        ----------
        x : array_like
            Pooled values, shape (N, C, D1, ..., Dn), float16, bfloat16, float32 or float64.
        indices : array_like of int
            Same shape as ``x``: offsets such as MaxPool's Indices output, addressing the default
            output shape, whose spatial axes are ``(D - 1) * stride + kernel - pad_begin -
            pad_end``.
        kernel_shape, strides, pads : sequence of int
            The attributes of the MaxPool being inverted.
        output_shape : sequence of int, optional
            Full output shape (N, C, ...). The indices still address the default shape, and
            the result is placed at the origin of this output.

        Returns
        -------
        Y : ndarray
            The dtype of ``x``. Where two indices coincide, the later element (row-major) wins.

    {raises}
            Also if ``indices`` has another shape than ``x``, or holds an offset outside the
            default output or a position outside ``output_shape``.

        Examples
        --------
        >>> import numpy as np, numbapool
        >>> x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=np.float32)
        >>> i = np.array([[[[5, 7], [13, 15]]]])
        >>> numbapool.max_unpool(x, i, [2, 2], strides=[2, 2])[0, 0]
        array([[0., 0., 0., 0.],
               [0., 1., 0., 2.],
               [0., 0., 0., 0.],
               [0., 3., 0., 4.]], dtype=float32)
    """
    x = _as_array(x)
    indices = _as_array(indices)
    if unexpected:
        _refuse_keywords("max_unpool", unexpected)
    plan = _plan.unpool_plan(x.shape, x.dtype, kernel_shape, strides, pads, output_shape)
    _plan.check_unpool_indices(plan, indices)
    return _dispatch.run_unpool(plan, x, indices)


max_unpool.__doc__ = max_unpool.__doc__.format(raises=_RAISES)
