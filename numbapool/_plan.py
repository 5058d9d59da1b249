"""Attribute normalization: the one place where shapes, pads and windows are computed.

Pure Python and NumPy, no numba. A public call turns its ONNX attributes into a frozen,
hashable :class:`WindowPlan` (or :class:`UnpoolPlan`); plans are cached by their arguments
(_dispatch.pool_window), so a repeated call with the same shape, dtype and attributes
normalizes once. The kernels receive the plan's geometry as run-time integer arrays and
compute nothing but the pooling.

Per spatial axis, with the window extent ``k_eff = (k - 1) * d + 1`` (docs/semantics.md):

* explicit pads: ``out = floor((in + pb + pe - k_eff) / s) + 1``; with ``ceil_mode`` ceil
  instead of floor, and a last window that would start in the right padding is dropped;
* ``SAME_UPPER`` / ``SAME_LOWER``: ``out = ceil(in / s)``, total pad
  ``max(0, (out - 1) * s + k_eff - in)``, the odd cell at the end (UPPER) or the beginning
  (LOWER); ``ceil_mode`` changes nothing;
* ``VALID``: zero pads, then the explicit rule, ``ceil_mode`` included.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float16), BFLOAT16, np.dtype(np.float32), np.dtype(np.float64))
MAX_POOL_DTYPES = FLOAT_DTYPES + (np.dtype(np.int8), np.dtype(np.uint8))
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")

# Rows of WindowPlan.geometry["axes"], one column per spatial axis: what the kernels index.
AXIS_IN, AXIS_OUT, AXIS_STRIDE, AXIS_DILATION, AXIS_PAD_BEGIN, AXIS_PAD_END = range(6)
AXIS_INPUT_STRIDE, AXIS_INDEX_STRIDE, AXIS_EXTENT, AXIS_OUTPUT_STRIDE = 6, 7, 8, 9
AXIS_ROWS = 10


# --------------------------------------------------------------------------- validation


def dtype_name(dtype: np.dtype) -> str:
    return "bfloat16" if dtype == BFLOAT16 else dtype.name


def check_dtype(op: str, dtype: np.dtype, allowed=FLOAT_DTYPES) -> np.dtype:
    """Return ``dtype`` in native byte order, or raise TypeError if ``op`` does not take it."""
    native = dtype.newbyteorder("=") if dtype.byteorder not in "=|" else dtype
    if native not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise TypeError(f"{op} does not support dtype {dtype}; supported dtypes: {names}")
    return native


def check_rank(op: str, shape: tuple) -> int:
    """Number of spatial axes of an (N, C, D1, ..., Dn) input; at least one is needed."""
    if len(shape) < 3:
        raise ValueError(
            f"{op} needs an input of shape (N, C, D1, ..., Dn) with at least one spatial axis; "
            f"got an input of shape {shape}"
        )
    return len(shape) - 2


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


# The largest kernel size, stride, dilation or pad: products of two stay within int64,
# where the kernels do their index arithmetic.
MAX_ATTRIBUTE = 2**31 - 1


def int_tuple(name: str, value, length: int, minimum: int) -> tuple:
    """``value`` as a tuple of ``length`` Python ints, each in [minimum, MAX_ATTRIBUTE]."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence of {length} integers; got {value!r}")
    if isinstance(value, np.ndarray) and value.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional; got an array of shape {value.shape}")
    items = list(value)
    if not all(_is_int(v) for v in items):
        raise TypeError(f"{name} must contain integers; got {value!r}")
    if len(items) != length:
        raise ValueError(f"{name} must have {length} values; got {len(items)}: {value!r}")
    items = [int(v) for v in items]
    for axis, v in enumerate(items):
        if v < minimum:
            raise ValueError(f"{name}[{axis}] must be >= {minimum}; got {v} in {name}={value!r}")
        if v > MAX_ATTRIBUTE:
            raise ValueError(
                f"{name}[{axis}] must be <= {MAX_ATTRIBUTE}; got {v} in {name}={value!r}"
            )
    return tuple(items)


def flag(name: str, value) -> int:
    """An ONNX 0/1 integer attribute (Python bools are accepted too)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if not _is_int(value) or int(value) not in (0, 1):
        raise ValueError(f"{name} must be 0 or 1; got {value!r}")
    return int(value)


def check_p(value) -> float:
    """LpPool's order: any real number > 0 (LpPool-1 has a float p)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"p must be a real number > 0; got {value!r}")
    p = float(value)
    if not (p > 0 and math.isfinite(p)):
        raise ValueError(f"p must be a finite number > 0; got {value!r}")
    return p


# --------------------------------------------------------------------------- the window plan


# a DispatchChoices field not decided yet
UNDECIDED = object()


@dataclass
class DispatchChoices:
    """What _dispatch decides once per plan, whatever the thread count (WindowPlan.choices);
    UNDECIDED until then."""

    merged: object = UNDECIDED  # the plan of fewer axes that runs this one, or None
    serial: object = UNDECIDED  # whether a call is too small to wake the threads


@dataclass(frozen=True)
class WindowPlan:
    """A windowed pooling call, fully resolved: what the kernels need and nothing more.

    All per-axis tuples have one entry per spatial axis.
    """

    op: str  # "MaxPool", "AveragePool" or "LpPool"
    in_shape: tuple
    dtype: np.dtype
    kernel_shape: tuple
    strides: tuple
    dilations: tuple
    pads_begin: tuple
    pads_end: tuple
    out_shape: tuple
    ceil_mode: int = 0
    count_include_pad: int = 0
    p: float = 2.0
    storage_order: int = 0
    # the divisor counts of a plan that gives part of another plan's outputs (region_plan,
    # channels_merged_plan): that plan's, which the geometry takes; None: its own
    given_divisor_counts: np.ndarray | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    @property
    def spatial_in(self) -> tuple:
        return self.in_shape[2:]

    @property
    def spatial_out(self) -> tuple:
        return self.out_shape[2:]

    @functools.cached_property
    def geometry(self) -> dict:
        """The window geometry as int64 arrays, as the kernels take them
        (``window_geometry``)."""
        return self.window_geometry(self.given_divisor_counts)

    @functools.cached_property
    def rows_geometry(self) -> dict:
        """The geometry a 2-D row kernel takes (wide.py, indexed.py): a 1-D window's as the
        2-D window of height 1 over the same elements, whose outputs and Indices are the
        same, in the same order (an axis of length 1 changes no flat index, in either
        storage order), its divisor counts along the row the plan's own (a region's are the
        whole call's: region_plan)."""
        if len(self.kernel_shape) == 2:
            return self.geometry
        rows = resolve_window_plan(
            self.op,
            (*self.in_shape[:2], 1, *self.in_shape[2:]),
            self.dtype,
            (1, *self.kernel_shape),
            (1, *self.strides),
            (0, *self.pads_begin, 0, *self.pads_end),
            "NOTSET",
            self.ceil_mode,
            None,
            self.count_include_pad,
            self.p,
            self.storage_order,
        )
        return rows.window_geometry(
            np.concatenate([rows.geometry["divisor_counts"][:1], self.geometry["divisor_counts"]])
        )

    def window_geometry(self, divisor_counts: np.ndarray | None = None) -> dict:
        """The window geometry as int64 arrays, as the kernels take them; the divisor counts
        given, or this plan's own.

        ``axes`` has one row per quantity (the AXIS_* rows above) and one
        column per spatial axis. ``taps`` lists every tap of the window as per-axis tap
        numbers, in row-major order (the scan order that decides ties and the first NaN);
        ``tap_offsets`` is each tap's element offset from the window's first tap in a
        C-ordered input, ``tap_index_offsets`` the same numbered as Indices number the
        input (the index strides); ``tap_outputs[k]`` the [first, end) run of outputs along
        the last axis for which tap number k of that axis lies inside the input there.
        ``divisor_counts`` is AveragePool's (``divisor_counts()``). ``lead_rows`` lists the window's input rows (one per
        tap of the leading axes) as offsets counted in rows of the last axis.
        """
        rank = len(self.kernel_shape)
        row_major = _row_major_strides(self.spatial_in)
        # storage_order=1 numbers the spatial offset column-major: first axis fastest.
        if self.storage_order:
            index_strides = _row_major_strides(self.spatial_in[::-1])[::-1]
        else:
            index_strides = row_major
        axes = np.empty((AXIS_ROWS, rank), dtype=np.int64)
        axes[AXIS_IN] = self.spatial_in
        axes[AXIS_OUT] = self.spatial_out
        axes[AXIS_STRIDE] = self.strides
        axes[AXIS_DILATION] = self.dilations
        axes[AXIS_PAD_BEGIN] = self.pads_begin
        axes[AXIS_PAD_END] = self.pads_end
        axes[AXIS_INPUT_STRIDE] = row_major
        axes[AXIS_INDEX_STRIDE] = index_strides
        axes[AXIS_EXTENT] = window_extents(self.kernel_shape, self.dilations)
        axes[AXIS_OUTPUT_STRIDE] = _row_major_strides(self.spatial_out)
        taps = np.indices(self.kernel_shape, dtype=np.int64).reshape(rank, -1).T.copy()
        dilations = np.array(self.dilations, dtype=np.int64)
        tap_offsets = taps @ (dilations * row_major)
        tap_index_offsets = taps @ (dilations * index_strides)
        if divisor_counts is None:
            divisor_counts = self.divisor_counts((0,) * rank, max(self.spatial_out))
        # Along the last axis each tap number k is inside for one run [first, end) of outputs:
        # first * stride - pad + k * dilation >= 0, and < the input's length before end.
        stride, pad, dilation = self.strides[-1], self.pads_begin[-1], self.dilations[-1]
        lags = pad - np.arange(self.kernel_shape[-1], dtype=np.int64) * dilation
        firsts = np.clip(-(-lags // stride), 0, self.spatial_out[-1])
        ends = np.clip(-(-(self.spatial_in[-1] + lags) // stride), 0, self.spatial_out[-1])
        runs = np.where((firsts < ends)[:, None], np.stack([firsts, ends], axis=1), 0)
        # The window's input rows (one per tap of the leading axes), as offsets in rows.
        lead_rows = tap_offsets[:: self.kernel_shape[-1]] // self.spatial_in[-1]
        return dict(
            axes=axes,
            taps=taps,
            tap_offsets=np.ascontiguousarray(tap_offsets),
            tap_index_offsets=np.ascontiguousarray(tap_index_offsets),
            tap_outputs=np.ascontiguousarray(runs),
            lead_rows=np.ascontiguousarray(lead_rows),
            divisor_counts=divisor_counts,
        )

    def divisor_counts(self, first_outputs: tuple, width: int) -> np.ndarray:
        """(rank, width) int64: [axis, j] is how many of the axis's taps AveragePool counts
        at output position first_outputs[axis] + j (0 past the axis's last output): the taps
        inside the input, or inside the padded extent [-pad begin, in + pad end) with
        count_include_pad. A window's divisor is the product over its axes. Arithmetic per
        output position, not per tap: a long axis costs no table of taps. (rank, 0) for
        MaxPool and LpPool, which divide by nothing."""
        if self.op != "AveragePool":
            width = 0
        counts = np.zeros((len(self.kernel_shape), width), dtype=np.int64)
        for axis, first in enumerate(first_outputs):
            low, high = 0, self.spatial_in[axis]
            if self.count_include_pad:
                low, high = -self.pads_begin[axis], high + self.pads_end[axis]
            row = counts[axis, : max(0, min(width, self.spatial_out[axis] - first))]
            _taps_within(
                row,
                first * self.strides[axis] - self.pads_begin[axis],
                self.strides[axis],
                low,
                high,
                self.kernel_shape[axis],
                self.dilations[axis],
            )
        return counts

    def __reduce__(self):
        # a plan travels (numbapool.dask's tasks) as its fields only: its geometry and
        # launches are rebuilt where it lands, not shipped
        return (type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    @functools.cached_property
    def launches(self) -> dict:
        """How a call of this plan is launched (_dispatch.Launch) per thread count; filled by
        _dispatch, kept here so that a repeated call finds it without hashing the plan."""
        return {}

    @functools.cached_property
    def serial_calls(self) -> dict:
        """The call of this plan on the calling thread alone, prepared once
        (_dispatch._serial_call), per Indices?, where the plan runs serially at any thread
        count: pool_window runs it with no other test."""
        return {}

    @functools.cached_property
    def one_thread_calls(self) -> dict:
        """The same, where the plan runs serially only on one thread."""
        return {}

    @functools.cached_property
    def choices(self) -> DispatchChoices:
        """What _dispatch decided for this plan whatever the thread count, decided once."""
        return DispatchChoices()

    def forget_launches(self) -> None:
        """Drop the launches and choices made so far, and the calls the public functions
        keep (_calls.forget): the next call decides again."""
        from . import _calls  # imported here: _calls imports this module

        _calls.forget()
        self.launches.clear()
        self.serial_calls.clear()
        self.one_thread_calls.clear()
        choices = self.choices
        choices.merged = choices.serial = UNDECIDED

    def _repr_html_(self) -> str:
        rows = [
            ("op", self.op),
            ("dtype", dtype_name(self.dtype)),
            ("input shape", self.in_shape),
            ("output shape", self.out_shape),
            ("kernel_shape", self.kernel_shape),
            ("strides", self.strides),
            ("dilations", self.dilations),
            ("pads (begin)", self.pads_begin),
            ("pads (end)", self.pads_end),
            ("ceil_mode", self.ceil_mode),
        ]
        if self.op == "AveragePool":
            rows.append(("count_include_pad", self.count_include_pad))
        if self.op == "LpPool":
            rows.append(("p", self.p))
        if self.op == "MaxPool":
            rows.append(("storage_order", self.storage_order))
        body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
        return f"<table>{body}</table>"


def _taps_within(
    row: np.ndarray, start: int, stride: int, low: int, high: int, kernel: int, dilation: int
) -> None:
    """row[j] = how many taps k in [0, kernel) of the window starting at start + j * stride
    lie in [low, high): low <= its start + k * dilation < high for k from
    ceil((low - start) / dilation) to below ceil((high - start) / dilation). Every tap of
    the windows between the edges: only the edges are computed, so that a long row costs
    no temporaries."""
    count = row.shape[0]
    # inner windows: start + j * stride >= low and start + j * stride + extent - 1 < high
    inner_lo = min(count, max(0, -((start - low) // stride)))
    inner_hi = min(count, max(inner_lo, -((start + (kernel - 1) * dilation - high) // stride)))
    row[inner_lo:inner_hi] = kernel
    for edge in (slice(0, inner_lo), slice(inner_hi, count)):
        starts = start + np.arange(edge.start, edge.stop, dtype=np.int64) * stride
        first = np.maximum(0, -((starts - low) // dilation))
        end = np.minimum(kernel, -((starts - high) // dilation))
        row[edge] = np.maximum(0, end - first)


def _row_major_strides(shape) -> np.ndarray:
    strides = np.ones(len(shape), dtype=np.int64)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return strides


def window_extents(kernel_shape, dilations) -> tuple:
    """``k_eff = (k - 1) * d + 1`` per axis: the span a dilated window covers."""
    return tuple((k - 1) * d + 1 for k, d in zip(kernel_shape, dilations))


def output_length(
    op: str,
    axis: int,
    size: int,
    k_eff: int,
    stride: int,
    pad_begin: int,
    pad_end: int,
    ceil_mode: int,
) -> int:
    """Output positions along one axis, explicit pads (docs/semantics.md, decision 1)."""
    span = size + pad_begin + pad_end - k_eff
    if span < 0:
        raise ValueError(
            f"{op}: no output position along spatial axis {axis}: the window extent {k_eff} "
            f"is larger than the padded input ({size} + {pad_begin} + {pad_end} = "
            f"{size + pad_begin + pad_end})"
        )
    if not ceil_mode:
        return span // stride + 1
    count = -(-span // stride) + 1
    if (count - 1) * stride >= size + pad_begin:  # the last window would start in the end pad
        count -= 1
    return count


def same_pads(size: int, k_eff: int, stride: int, auto_pad: str) -> tuple:
    """(begin, end) pads of SAME_UPPER / SAME_LOWER (docs/semantics.md, decision 2)."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + k_eff - size)
    small, large = total // 2, total - total // 2
    return (small, large) if auto_pad == "SAME_UPPER" else (large, small)


def freeze_ints(value):
    """Integer sequences as tuples, so that they can key the plan cache.

    Anything else stays as it is: a list that still holds non-integers is unhashable and
    takes the uncached path, whose validation names the bad value (1.0 == 1 must not hit
    the cache entry of a valid call).
    """
    if value is None:
        return value
    kind = type(value)
    if kind is tuple or kind is list:  # the common case first: a loop is cheaper than all()
        for v in value:
            if type(v) is not int:
                break
        else:
            return tuple(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if all(_is_int(v) for v in value):
            return tuple(value)
        return list(value)
    return value


def check_kernel_rank(op: str, shape: tuple, kernel_shape, rank: int) -> None:
    """A kernel_shape of another length than X's spatial axes: an error that says X's rank
    and the layout, the usual cause being an image without its N axis."""
    if (
        hasattr(kernel_shape, "__len__")
        and not isinstance(kernel_shape, (str, bytes))
        and len(kernel_shape) != rank
        and len(kernel_shape) > 0
    ):
        raise ValueError(
            f"{op}: kernel_shape {tuple(kernel_shape)!r} has {len(kernel_shape)} "
            f"value{'s' if len(kernel_shape) > 1 else ''}, but X of shape {tuple(shape)} "
            f"(rank {len(shape)}) has {rank} spatial ax{'es' if rank > 1 else 'is'}: numbapool "
            f"takes the (N, C, D1, ..., Dn) layout, so a {len(kernel_shape)}-D window needs "
            f"an input of rank {len(kernel_shape) + 2} (x[np.newaxis] adds N to one image)"
        )


def resolve_window_plan(
    op,
    shape,
    dtype,
    kernel_shape,
    strides,
    pads,
    auto_pad,
    ceil_mode,
    dilations,
    count_include_pad,
    p,
    storage_order,
) -> WindowPlan:
    """Validate and resolve one windowed pooling call, every argument given; uncached
    (_dispatch.window_plan keeps the plans of the calls made)."""
    allowed = MAX_POOL_DTYPES if op == "MaxPool" else FLOAT_DTYPES
    dtype = check_dtype(op, np.dtype(dtype), allowed)
    rank = check_rank(op, shape)
    if kernel_shape is None:
        raise ValueError(f"{op} needs kernel_shape")
    check_kernel_rank(op, shape, kernel_shape, rank)
    kernel = int_tuple("kernel_shape", kernel_shape, rank, 1)
    strides = (1,) * rank if strides is None else int_tuple("strides", strides, rank, 1)
    dilations = (1,) * rank if dilations is None else int_tuple("dilations", dilations, rank, 1)
    ceil_mode = flag("ceil_mode", ceil_mode)
    count_include_pad = flag("count_include_pad", count_include_pad)
    storage_order = flag("storage_order", storage_order)
    p = check_p(p)
    if not isinstance(auto_pad, str) or auto_pad not in AUTO_PADS:
        raise ValueError(f"auto_pad must be one of {', '.join(AUTO_PADS)}; got {auto_pad!r}")
    if pads is not None and auto_pad != "NOTSET":
        # exported models often write the default pads, all zero, beside auto_pad: they say
        # nothing against it (ONNX's checker, onnx.reference and onnxruntime accept them)
        if any(int_tuple("pads", pads, 2 * rank, 0)):
            raise ValueError(
                f"pads cannot be used together with auto_pad={auto_pad!r}; "
                f"got pads={pads!r} (only all-zero pads may stand beside it)"
            )
        pads = None

    spatial = shape[2:]
    k_eff = window_extents(kernel, dilations)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pairs = [same_pads(n, e, s, auto_pad) for n, e, s in zip(spatial, k_eff, strides)]
        begin, end = tuple(b for b, _ in pairs), tuple(e for _, e in pairs)
        rounding = 0  # out = ceil(in / s) whatever ceil_mode says
    else:
        flat = (0,) * (2 * rank) if pads is None else int_tuple("pads", pads, 2 * rank, 0)
        begin, end = flat[:rank], flat[rank:]
        rounding = ceil_mode
    out = tuple(
        output_length(op, axis, n, e, s, b, a, rounding)
        for axis, (n, e, s, b, a) in enumerate(zip(spatial, k_eff, strides, begin, end))
    )
    return WindowPlan(
        op,
        tuple(shape),
        dtype,
        kernel,
        strides,
        dilations,
        begin,
        end,
        tuple(shape[:2]) + out,
        ceil_mode,
        count_include_pad,
        p,
        storage_order,
    )


def region_plan(
    plan: WindowPlan, region_shape: tuple, pads: tuple, first_outputs: tuple
) -> WindowPlan:
    """The plan of a call on a region of ``plan``'s input that gives ``plan``'s outputs from
    ``first_outputs`` on (numbapool.dask): ``pads`` reach the region's first and last window
    ends, and the divisor counts are ``plan``'s, so that padding added at a region's edge
    never counts where the whole call's padding would not."""
    region = resolve_window_plan(
        plan.op,
        tuple(region_shape),
        plan.dtype,
        plan.kernel_shape,
        plan.strides,
        pads,
        "NOTSET",
        0,
        plan.dilations,
        plan.count_include_pad,
        plan.p,
        plan.storage_order,
    )
    width = max(region.spatial_out)
    return dataclasses.replace(
        region, given_divisor_counts=plan.divisor_counts(first_outputs, width)
    )


def channels_merged_plan(plan: WindowPlan) -> WindowPlan:
    """The plan of the same call with the window's leading spatial axes merged into the
    channels, where each takes one tap at a stride of 1 with no pads (a window of 1x3x3
    over (N, C, D, H, W) is a window of 3x3 over (N, C*D, H, W)), down to two axes; else
    ``plan`` itself. The same outputs in the same order, and the same Indices (flat input
    offsets), but for storage_order 1, which numbers the spatial offsets column-major:
    ``plan`` itself then. The divisor counts are ``plan``'s own (a region's are the whole
    call's: region_plan)."""
    rank, merged = len(plan.kernel_shape), 0
    while (
        rank - merged > 2
        and plan.kernel_shape[merged] == 1
        and plan.strides[merged] == 1
        and plan.pads_begin[merged] == 0
        and plan.pads_end[merged] == 0
    ):
        merged += 1
    if merged == 0 or plan.storage_order:
        return plan
    shape = (
        plan.in_shape[0],
        math.prod(plan.in_shape[1 : 2 + merged]),
        *plan.in_shape[2 + merged :],
    )
    pads = (*plan.pads_begin[merged:], *plan.pads_end[merged:])
    inner = resolve_window_plan(
        plan.op,
        shape,
        plan.dtype,
        plan.kernel_shape[merged:],
        plan.strides[merged:],
        pads,
        "NOTSET",
        plan.ceil_mode,
        plan.dilations[merged:],
        plan.count_include_pad,
        plan.p,
        0,
    )
    return dataclasses.replace(inner, given_divisor_counts=plan.geometry["divisor_counts"][merged:])


# --------------------------------------------------------------------------- global pools


@dataclass(frozen=True)
class GlobalPlan:
    """A global pooling call, validated: one output per channel."""

    dtype: np.dtype  # in native byte order
    out_shape: tuple  # (N, C, 1, ..., 1)
    rows: tuple  # (N*C, elements per channel): the input as the kernels see it


def global_plan(op: str, shape: tuple, dtype: np.dtype) -> GlobalPlan:
    """Validate a global pooling call (_dispatch keeps what a valid one needs per call)."""
    native = check_dtype(op, dtype)
    rank = check_rank(op, shape)
    for axis, size in enumerate(shape[2:]):
        if size == 0:
            raise ValueError(f"{op}: spatial axis {axis} is empty (input shape {shape})")
    return GlobalPlan(
        native, tuple(shape[:2]) + (1,) * rank, (shape[0] * shape[1], math.prod(shape[2:]))
    )


# --------------------------------------------------------------------------- MaxUnpool


@dataclass(frozen=True)
class UnpoolPlan:
    """MaxUnpool resolved: the result has ``out_shape``, ``output_shape`` when given
    (``shape_given``) else the default, and each index is a row-major position in it, N and
    C included, as MaxPool's Indices are positions in its input."""

    in_shape: tuple
    dtype: np.dtype
    default_shape: tuple
    out_shape: tuple
    shape_given: bool


def unpool_plan(
    shape: tuple, dtype: np.dtype, kernel_shape, strides=None, pads=None, output_shape=None
) -> UnpoolPlan:
    """Per axis the default output is ``(in - 1) * s + k - pb - pe`` (MaxUnpool's inverse).
    ``output_shape`` is the shape of the input MaxPool pooled into X: along each axis one
    that MaxPool with these attributes (floor or ceil mode) maps to X's size, within a
    stride of the default."""
    op = "MaxUnpool"
    dtype = check_dtype(op, np.dtype(dtype))
    rank = check_rank(op, shape)
    if kernel_shape is None:
        raise ValueError(f"{op} needs kernel_shape")
    check_kernel_rank(op, shape, kernel_shape, rank)
    kernel = int_tuple("kernel_shape", kernel_shape, rank, 1)
    strides = (1,) * rank if strides is None else int_tuple("strides", strides, rank, 1)
    flat = (0,) * (2 * rank) if pads is None else int_tuple("pads", pads, 2 * rank, 0)
    default = []
    for axis, (n, k, s, b, e) in enumerate(
        zip(shape[2:], kernel, strides, flat[:rank], flat[rank:])
    ):
        size = (n - 1) * s + k - b - e
        if size < 1:
            raise ValueError(
                f"{op}: spatial axis {axis} would have {size} elements: "
                f"({n} - 1) * {s} + {k} - {b} - {e}"
            )
        default.append(size)
    default_shape = tuple(shape[:2]) + tuple(default)
    if output_shape is None:
        return UnpoolPlan(tuple(shape), dtype, default_shape, default_shape, False)
    out_shape = int_tuple("output_shape", output_shape, rank + 2, 0)
    if out_shape[:2] != default_shape[:2]:
        raise ValueError(
            f"output_shape must keep N and C of the input {default_shape[:2]}; got {out_shape}"
        )
    for axis, (size, d, s) in enumerate(zip(out_shape[2:], default, strides)):
        if not d - s < size < d + s:
            raise ValueError(
                f"{op}: output_shape {out_shape} is not a shape MaxPool with these kernel_shape, "
                f"strides and pads pools into X's {tuple(shape)}: spatial axis {axis} must "
                f"have {d - s + 1} to {d + s - 1} elements (the default output "
                f"{default_shape}); output_shape is the shape of MaxPool's input, whose "
                "positions the indices name"
            )
    return UnpoolPlan(tuple(shape), dtype, default_shape, out_shape, True)


def check_unpool_indices(plan: UnpoolPlan, indices: np.ndarray) -> None:
    """Indices must match X's shape and name positions of the output."""
    if indices.dtype.kind not in "iu":
        raise TypeError(f"MaxUnpool indices must be integers; got dtype {indices.dtype}")
    if indices.shape != plan.in_shape:
        raise ValueError(
            f"MaxUnpool indices must have the shape of X {plan.in_shape}; got {indices.shape}"
        )
    if indices.size == 0:
        return
    limit = math.prod(plan.out_shape)
    low, high = int(indices.min()), int(indices.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        if plan.shape_given:
            which = (
                f"output_shape {plan.out_shape} (the shape of MaxPool's input, whose "
                "positions MaxPool's Indices name)"
            )
        else:
            which = (
                f"the default output {plan.out_shape}; where MaxPool's input was larger, "
                "pass its shape as output_shape"
            )
        raise ValueError(
            f"MaxUnpool index {bad} is outside [0, {limit}), the row-major positions of {which}"
        )
