"""numbapool inside onnx's Python runtime (needs the ``onnx`` package).

``NumbaReferenceEvaluator(model)`` is an ``onnx.reference.ReferenceEvaluator`` whose pooling
nodes run on numbapool; every other node stays with onnx.reference. ``ops`` is the list of
OpRun classes, for ``ReferenceEvaluator(model, new_ops=numbapool.onnx.ops)``.

Each node follows the operator version its model imports (opsets 1 to 22): its defaults,
its attributes and the dtypes it allows. An attribute, an attribute type or a dtype that
the version does not have raises a ValueError or TypeError naming it.
"""

from __future__ import annotations

import numpy as np

try:
    import onnx
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun
except ModuleNotFoundError as error:  # the onnx extra is not installed
    raise ImportError(
        f'numbapool.onnx needs the onnx package ({error}): pip install -e ".[onnx]" from a '
        'checkout, or pip install "onnx>=1.23"'
    ) from error

import numbapool

from . import _plan

__all__ = ["NumbaReferenceEvaluator", "ops"]

_TENSOR_TYPES = {
    np.dtype(np.float16): "tensor(float16)",
    _plan.BFLOAT16: "tensor(bfloat16)",
    np.dtype(np.float32): "tensor(float)",
    np.dtype(np.float64): "tensor(double)",
    np.dtype(np.int8): "tensor(int8)",
    np.dtype(np.uint8): "tensor(uint8)",
}


class _Pooling(OpRun):
    """A pooling node checked against the schema of the version its model imports."""

    op_domain = ""

    def __init__(self, onnx_node, run_params, schema=None):
        op = onnx_node.op_type
        opset = run_params["opsets"].get("", onnx.defs.onnx_opset_version())
        try:
            schema = onnx.defs.get_schema(op, opset, "")
        except onnx.defs.SchemaError:
            raise ValueError(f"{op} does not exist at opset {opset}") from None
        self.name_version = f"{op}-{schema.since_version}"
        for attribute in onnx_node.attribute:
            known = schema.attributes.get(attribute.name)
            if known is None:
                raise ValueError(
                    f"{self.name_version} (opset {opset}) has no attribute "
                    f"{attribute.name!r}; it has {sorted(schema.attributes)}"
                )
            if attribute.type != known.type:
                raise TypeError(
                    f"{self.name_version}: attribute {attribute.name!r} must be "
                    f"{onnx.AttributeProto.AttributeType.Name(known.type)}, got "
                    f"{onnx.AttributeProto.AttributeType.Name(attribute.type)}"
                )
        outputs = len(schema.outputs)
        if len(onnx_node.output) > outputs:
            raise ValueError(
                f"{self.name_version} has {outputs} output(s), the node asks for "
                f"{len(onnx_node.output)}"
            )
        super().__init__(onnx_node, run_params, schema=schema)
        self._allowed = {
            t
            for c in schema.type_constraints
            if c.type_param_str == schema.inputs[0].type_str
            for t in c.allowed_type_strs
        }

    def _input(self, x) -> np.ndarray:
        x = np.asarray(x)
        if _TENSOR_TYPES.get(x.dtype) not in self._allowed:
            raise TypeError(
                f"{self.name_version} does not take {x.dtype} input; it takes "
                f"{', '.join(sorted(self._allowed))}"
            )
        return x


def _window(attributes: dict) -> dict:
    """The windowed operators' shared attributes, absent ones left to numbapool's defaults."""
    keys = ("strides", "pads", "auto_pad", "ceil_mode", "dilations")
    return {key: attributes[key] for key in keys if attributes.get(key) is not None}


class MaxPool(_Pooling):
    def _run(self, X, kernel_shape=None, storage_order=0, **attributes):
        wants_indices = len(self.onnx_node.output) > 1 and self.onnx_node.output[1] != ""
        result = numbapool.max_pool(
            self._input(X),
            kernel_shape,
            storage_order=storage_order,
            return_indices=wants_indices,
            **_window(attributes),
        )
        return result if wants_indices else (result,)


class AveragePool(_Pooling):
    def _run(self, X, kernel_shape=None, count_include_pad=0, **attributes):
        return (
            numbapool.average_pool(
                self._input(X),
                kernel_shape,
                count_include_pad=count_include_pad,
                **_window(attributes),
            ),
        )


class LpPool(_Pooling):
    def _run(self, X, kernel_shape=None, p=2, **attributes):
        return (numbapool.lp_pool(self._input(X), kernel_shape, p=p, **_window(attributes)),)


class GlobalMaxPool(_Pooling):
    def _run(self, X):
        return (numbapool.global_max_pool(self._input(X)),)


class GlobalAveragePool(_Pooling):
    def _run(self, X):
        return (numbapool.global_average_pool(self._input(X)),)


class GlobalLpPool(_Pooling):
    def _run(self, X, p=2):
        return (numbapool.global_lp_pool(self._input(X), p=p),)


class MaxUnpool(_Pooling):
    def _run(self, X, I, output_shape=None, kernel_shape=None, strides=None, pads=None):
        if output_shape is not None:
            output_shape = [int(size) for size in np.asarray(output_shape).reshape(-1)]
        return (
            numbapool.max_unpool(
                self._input(X),
                I,
                kernel_shape,
                strides=strides,
                pads=pads,
                output_shape=output_shape,
            ),
        )


ops = [MaxPool, AveragePool, LpPool, GlobalMaxPool, GlobalAveragePool, GlobalLpPool, MaxUnpool]


class NumbaReferenceEvaluator(ReferenceEvaluator):
    """``onnx.reference.ReferenceEvaluator`` with the pooling nodes on numbapool.

    Takes the same arguments; operators given in ``new_ops`` take precedence over numbapool's.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> from numbapool.onnx import NumbaReferenceEvaluator
    >>> node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    >>> graph = helper.make_graph(
    ...     [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    >>> x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    >>> NumbaReferenceEvaluator(model).run(None, {"x": x})[0]
    array([[[[ 5.,  7.],
             [13., 15.]]]], dtype=float32)
    """

    def __init__(self, proto, *args, new_ops=None, **kwargs):
        super().__init__(proto, *args, new_ops=[*(new_ops or []), *ops], **kwargs)
