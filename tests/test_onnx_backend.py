"""The ONNX backend node tests and pytorch-converted models of every pooling operator."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import reference
from onnx_nodes import POOLING_OPS, attributes, run_node


def _node_cases():
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unrelated operators' cases warn while being built
        cases = collect_testcases(None)
    return [
        c
        for c in cases
        if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in POOLING_OPS
    ]


NODE_CASES = _node_cases()
CONVERTED_DIR = os.path.join(
    os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted"
)
CONVERTED = sorted(d for d in os.listdir(CONVERTED_DIR) if "Pool" in d)


def test_every_pooling_operator_has_node_cases():
    ops = {c.model.graph.node[0].op_type for c in NODE_CASES}
    assert ops == POOLING_OPS - {"GlobalLpPool"}, ops  # onnx ships no GlobalLpPool node test
    assert len(NODE_CASES) >= 50


def _compare(actual, expected, rtol, atol):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# Backend cases whose expected output numbapool deliberately differs from, and why
# (docs/semantics.md): their outputs are checked against the reference instead.
EXPECTED_TO_DIFFER = {
    # onnx.reference scatters the indices in the default output and puts it at the origin
    # of output_shape; numbapool reads them as positions of output_shape, as onnxruntime
    # and PyTorch do and as MaxPool's Indices name positions of its input
    "test_maxunpool_export_with_output_shape": lambda node, inputs: [
        reference.unpool(inputs[0], inputs[1], **attributes(node), output_shape=inputs[2])
    ],
}


@pytest.mark.parametrize("case", NODE_CASES, ids=lambda c: c.name)
def test_node(case):
    node = case.model.graph.node[0]
    assert case.data_sets, case.name
    for inputs, outputs in case.data_sets:
        results = run_node(node, list(inputs))
        assert len(results) == len(outputs)
        if case.name in EXPECTED_TO_DIFFER:
            assert not all(np.array_equal(a, e) for a, e in zip(results, outputs))
            outputs = [
                np.asarray(e, dtype=a.dtype)
                for a, e in zip(results, EXPECTED_TO_DIFFER[case.name](node, list(inputs)))
            ]
        for actual, expected in zip(results, outputs):
            _compare(actual, expected, case.rtol, case.atol)


def test_every_case_expected_to_differ_is_a_backend_case():
    assert set(EXPECTED_TO_DIFFER) <= {case.name for case in NODE_CASES}


@pytest.mark.parametrize("name", CONVERTED)
def test_pytorch_converted(name):
    folder = os.path.join(CONVERTED_DIR, name)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    assert sum(n.op_type in POOLING_OPS for n in model.graph.node) == 1
    data_sets = sorted(d for d in os.listdir(folder) if d.startswith("test_data_set"))
    assert data_sets
    for data_set in data_sets:
        path = os.path.join(folder, data_set)

        def load(prefix, path=path):
            files = sorted(f for f in os.listdir(path) if f.startswith(prefix))
            return [
                onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(path, f))) for f in files
            ]

        results = _run_graph(model.graph, load("input_"))
        for actual, expected in zip(results, load("output_"), strict=True):
            _compare(actual, expected, 1e-3, 1e-7)


def _run_graph(graph, inputs):
    """The converted 1-d models wrap the pool in Unsqueeze/Squeeze (opset 6, axes attribute)."""
    values = dict(zip([i.name for i in graph.input], inputs))
    for node in graph.node:
        args = [values[name] for name in node.input]
        if node.op_type in POOLING_OPS:
            results = run_node(node, args)
        elif node.op_type == "Unsqueeze":
            results = [np.expand_dims(args[0], tuple(attributes(node)["axes"]))]
        elif node.op_type == "Squeeze":
            results = [np.squeeze(args[0], tuple(attributes(node)["axes"]))]
        else:
            raise NotImplementedError(node.op_type)
        values.update(zip(node.output, results))
    return [values[o.name] for o in graph.output]
