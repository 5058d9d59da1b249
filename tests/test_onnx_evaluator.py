"""numbapool.onnx: pooling nodes of real models, at each operator version."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from reference import global_pool

import numbapool
from numbapool.onnx import NumbaReferenceEvaluator, ops

RNG = np.random.default_rng(11)


def small_cnn(opset: int) -> onnx.ModelProto:
    """Conv-Relu, then every pooling operator the opset has, MaxPool with Indices.

    Small integer weights keep the convolution exact in float32, whatever order a runtime
    sums in, so that both runtimes pool the same values (and ties, for the Indices)."""
    weights = numpy_helper.from_array(RNG.integers(-2, 3, (8, 3, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(RNG.integers(-2, 3, 8).astype(np.float32), "b")
    lp_p = {"p": 3} if opset >= 2 else {"p": 3.0}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node(
            "MaxPool",
            ["relu"],
            ["max", "indices"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node(
            "AveragePool",
            ["max"],
            ["avg"],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
            count_include_pad=0,
            ceil_mode=1,
            strides=[2, 2],
        ),
        helper.make_node("LpPool", ["relu"], ["lp"], kernel_shape=[2, 3], strides=[2, 1], **lp_p),
        helper.make_node("GlobalAveragePool", ["relu"], ["gavg"]),
        helper.make_node("GlobalMaxPool", ["avg"], ["gmax"]),
    ]
    outputs = ["max", "indices", "avg", "lp", "gavg", "gmax"]
    if opset >= 18:  # dilations and ceil_mode on LpPool, dilations on AveragePool
        nodes.append(
            helper.make_node(
                "LpPool",
                ["relu"],
                ["lp_dilated"],
                kernel_shape=[3, 3],
                dilations=[2, 2],
                ceil_mode=1,
                strides=[2, 2],
                p=2,
            )
        )
        outputs.append("lp_dilated")
    if opset >= 19:
        nodes.append(
            helper.make_node(
                "AveragePool", ["relu"], ["avg_dilated"], kernel_shape=[2, 2], dilations=[2, 1]
            )
        )
        outputs.append("avg_dilated")
    types = {"indices": TensorProto.INT64}
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 17, 19])],
        [
            helper.make_tensor_value_info(name, types.get(name, TensorProto.FLOAT), None)
            for name in outputs
        ],
        initializer=[weights, bias],
    )
    # an IR version that the installed onnxruntime reads
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("opset", [11, 18, 22])
def test_small_cnn_matches_onnxruntime(opset):
    import onnxruntime

    model = small_cnn(opset)
    x = RNG.integers(-3, 4, (2, 3, 17, 19)).astype(np.float32)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, {"x": x})
    got = NumbaReferenceEvaluator(model).run(None, {"x": x})
    names = [output.name for output in model.graph.output]
    assert len(got) == len(expected) == len(names)
    for name, a, b in zip(names, got, expected):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if name in ("max", "indices", "gmax"):
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6, err_msg=name)


def test_pooling_nodes_run_on_numbapool(monkeypatch):
    calls = []
    original = numbapool.max_pool
    monkeypatch.setattr(numbapool, "max_pool", lambda *a, **k: calls.append(1) or original(*a, **k))
    NumbaReferenceEvaluator(small_cnn(22)).run(None, {"x": np.ones((2, 3, 17, 19), np.float32)})
    assert calls == [1]


def single_node(op, opset, inputs=("x",), outputs=("y",), dtype=TensorProto.FLOAT, **attributes):
    node = helper.make_node(op, list(inputs), list(outputs), **attributes)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(name, dtype, None) for name in inputs],
        [helper.make_tensor_value_info(name, dtype, None) for name in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [2, 22])
def test_global_lp_pool_runs(opset):
    x = RNG.standard_normal((2, 5, 6, 7)).astype(np.float32)
    (got,) = NumbaReferenceEvaluator(single_node("GlobalLpPool", opset, p=3)).run(None, {"x": x})
    np.testing.assert_allclose(
        got, global_pool("GlobalLpPool", x.astype(np.float64), p=3), rtol=1e-6
    )


def test_lp_pool_1_takes_a_float_p():
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    model = single_node("LpPool", 1, kernel_shape=[2, 2], p=1.5)
    (got,) = NumbaReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(got, numbapool.lp_pool(x, [2, 2], p=1.5))


def _pool_and_unpool_model(kernel, strides, pads):
    """MaxPool of x, then MaxUnpool of its values and indices into x's shape."""
    nodes = [
        helper.make_node(
            "MaxPool", ["x"], ["y", "i"], kernel_shape=kernel, strides=strides, pads=pads
        ),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node(
            "MaxUnpool", ["y", "i", "shape"], ["z"], kernel_shape=kernel, strides=strides, pads=pads
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pool_and_unpool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


@pytest.mark.parametrize(
    "shape, kernel, strides, pads",
    [
        ((1, 2, 5, 5), [2, 2], [2, 2], [0, 0, 0, 0]),
        ((1, 2, 7, 9), [3, 3], [2, 2], [1, 1, 1, 1]),
        ((2, 1, 9, 4), [3, 2], [3, 1], [1, 0, 0, 1]),
        ((1, 3, 11), [4], [3], [2, 1]),
    ],
)
def test_max_unpool_with_output_shape_inverts_max_pool_as_onnxruntime_does(
    shape, kernel, strides, pads
):
    import onnxruntime

    x = RNG.permutation(math.prod(shape)).astype(np.float32).reshape(shape)
    model = _pool_and_unpool_model(kernel, strides, pads)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (expected,) = session.run(None, {"x": x})
    y, indices = numbapool.max_pool(x, kernel, strides=strides, pads=pads, return_indices=True)
    z = numbapool.max_unpool(y, indices, kernel, strides=strides, pads=pads, output_shape=x.shape)
    np.testing.assert_array_equal(z, expected)
    # every maximum back where it was in x, zeros elsewhere
    assert ((z == x) | (z == 0)).all() and set(z[z != 0]) == set(y.ravel()) - {0}
    (got,) = NumbaReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    "op, opset, attributes, message",
    [
        (
            "MaxPool",
            8,
            dict(kernel_shape=[2], dilations=[2]),
            "MaxPool-8 .* no attribute 'dilations'",
        ),
        ("MaxPool", 8, dict(kernel_shape=[2], ceil_mode=1), "no attribute 'ceil_mode'"),
        ("AveragePool", 11, dict(kernel_shape=[2], dilations=[1]), "AveragePool-11 .*'dilations'"),
        ("AveragePool", 1, dict(kernel_shape=[2], count_include_pad=1), "'count_include_pad'"),
        ("LpPool", 11, dict(kernel_shape=[2], ceil_mode=1), "LpPool-11 .*'ceil_mode'"),
        ("GlobalMaxPool", 22, dict(p=2), "GlobalMaxPool-22 .*'p'"),
    ],
)
def test_attribute_the_version_lacks_is_an_error(op, opset, attributes, message):
    with pytest.raises(ValueError, match=message):
        NumbaReferenceEvaluator(single_node(op, opset, **attributes))


def messages(error: BaseException) -> str:
    """An error's message and those of its causes: onnx.reference wraps a TypeError
    raised by an operator in its own, the operator's as the cause."""
    text = []
    while error is not None:
        text.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(text)


def test_attribute_of_the_wrong_type_is_an_error():
    with pytest.raises(TypeError) as error:
        NumbaReferenceEvaluator(single_node("LpPool", 18, kernel_shape=[2], p=2.0))
    assert "LpPool-18: attribute 'p' must be INT, got FLOAT" in messages(error.value)


def test_indices_output_needs_maxpool_8():
    with pytest.raises(ValueError, match=r"MaxPool-1 has 1 output\(s\)"):
        NumbaReferenceEvaluator(single_node("MaxPool", 7, outputs=("y", "i"), kernel_shape=[2]))


@pytest.mark.parametrize(
    "opset, dtype, allowed",
    [(11, np.uint8, False), (12, np.uint8, True), (21, np.float16, True), (11, np.float64, True)],
)
def test_dtypes_follow_the_version(opset, dtype, allowed):
    x = (np.arange(8).reshape(1, 1, 8) % 5).astype(dtype)
    type_ = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    evaluator = NumbaReferenceEvaluator(
        single_node("MaxPool", opset, dtype=type_, kernel_shape=[2])
    )
    if allowed:
        np.testing.assert_array_equal(evaluator.run(None, {"x": x})[0], numbapool.max_pool(x, [2]))
    else:
        with pytest.raises(TypeError) as error:
            evaluator.run(None, {"x": x})
        assert "MaxPool-11 does not take uint8" in messages(error.value)


def test_ops_plug_into_the_plain_evaluator():
    from onnx.reference import ReferenceEvaluator

    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    model = single_node("AveragePool", 19, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    (got,) = ReferenceEvaluator(model, new_ops=ops).run(None, {"x": x})
    np.testing.assert_array_equal(got, numbapool.average_pool(x, [3, 3], pads=[1, 1, 1, 1]))
