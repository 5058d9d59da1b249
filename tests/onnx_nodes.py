"""Run one ONNX pooling node through numbapool's public functions (test helper)."""

from __future__ import annotations

import onnx.helper

import numbapool

WINDOW_OPS = {
    "MaxPool": numbapool.max_pool,
    "AveragePool": numbapool.average_pool,
    "LpPool": numbapool.lp_pool,
}
GLOBAL_OPS = {
    "GlobalMaxPool": numbapool.global_max_pool,
    "GlobalAveragePool": numbapool.global_average_pool,
    "GlobalLpPool": numbapool.global_lp_pool,
}
POOLING_OPS = set(WINDOW_OPS) | set(GLOBAL_OPS) | {"MaxUnpool"}


def attributes(node) -> dict:
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if isinstance(values.get("auto_pad"), bytes):
        values["auto_pad"] = values["auto_pad"].decode()
    return values


def run_node(node, inputs: list) -> list:
    attrs = attributes(node)
    if node.op_type in WINDOW_OPS:
        kernel_shape = attrs.pop("kernel_shape")
        if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
            return list(numbapool.max_pool(inputs[0], kernel_shape, return_indices=True, **attrs))
        return [WINDOW_OPS[node.op_type](inputs[0], kernel_shape, **attrs)]
    if node.op_type in GLOBAL_OPS:
        return [GLOBAL_OPS[node.op_type](inputs[0], **attrs)]
    if node.op_type == "MaxUnpool":
        kernel_shape = attrs.pop("kernel_shape")
        output_shape = inputs[2] if len(inputs) > 2 else None
        return [
            numbapool.max_unpool(
                inputs[0], inputs[1], kernel_shape, output_shape=output_shape, **attrs
            )
        ]
    raise NotImplementedError(node.op_type)
