"""Our ONNX bytes parse, in the `onnx` package, into the model its own helpers build."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from sgl_lite.backend.runner.weights import onnx_proto, ort_nbits

WEIGHT = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
SHAPE = np.array([0, -1], dtype=np.int64)
CODES = np.array([[1, 255], [7, 0]], dtype=np.uint8)
INDEX = np.array(2, dtype=np.int64)  # 0-d: a scalar index stays a scalar


def _ours() -> bytes:
    nodes = [
        onnx_proto.node("MatMul", ["x", "W"], ["y0"]),
        onnx_proto.node("Reshape", ["y0", "shape"], ["y1"]),
        onnx_proto.node("Softmax", ["y1"], ["y2"], axis=-1),
        onnx_proto.node("Transpose", ["y2"], ["y"], perm=[1, 0]),
        onnx_proto.node("LeakyRelu", ["y"], ["z"], alpha=0.25),
        onnx_proto.node("MatMulNBits", ["a", "b", "s"], ["q"], "com.microsoft", K=32, bits=4),
    ]
    inits = [
        onnx_proto.tensor("W", WEIGHT),
        onnx_proto.tensor("shape", SHAPE),
        onnx_proto.tensor("codes", CODES),
        onnx_proto.tensor("index", INDEX),
    ]
    inputs = [onnx_proto.value_info("x", onnx_proto.FLOAT, ["B", 4])]
    outputs = [onnx_proto.value_info("z", onnx_proto.FLOAT, [3, "B"])]
    return onnx_proto.model(nodes, inputs, outputs, inits, [("", 21), ("com.microsoft", 1)])


def _theirs() -> onnx.ModelProto:
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["y0"]),
        helper.make_node("Reshape", ["y0", "shape"], ["y1"]),
        helper.make_node("Softmax", ["y1"], ["y2"], axis=-1),
        helper.make_node("Transpose", ["y2"], ["y"], perm=[1, 0]),
        helper.make_node("LeakyRelu", ["y"], ["z"], alpha=0.25),
        helper.make_node(
            "MatMulNBits", ["a", "b", "s"], ["q"], domain="com.microsoft", K=32, bits=4
        ),
    ]
    inits = [
        numpy_helper.from_array(WEIGHT, "W"),
        numpy_helper.from_array(SHAPE, "shape"),
        numpy_helper.from_array(CODES, "codes"),
        numpy_helper.from_array(INDEX, "index"),
    ]
    graph = helper.make_graph(
        nodes,
        "graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, "B"])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=onnx_proto.IR_VERSION)


def test_our_bytes_parse_into_the_model_onnx_builds():
    ours = onnx.load_from_string(_ours())
    theirs = _theirs()
    theirs.ClearField("producer_name")  # the helper's signature; ours writes none
    assert ours == theirs
    assert numpy_helper.to_array(ours.graph.initializer[3]).shape == ()


def test_external_tensors_take_their_data_from_the_session_options():
    nodes = [onnx_proto.node("MatMul", ["x", "W"], ["y"])]
    model = onnx_proto.model(
        nodes,
        [onnx_proto.value_info("x", onnx_proto.FLOAT, [2, 4])],
        [onnx_proto.value_info("y", onnx_proto.FLOAT, [2, 3])],
        [onnx_proto.external_tensor("W", WEIGHT)],
        [("", 21)],
    )
    parsed = onnx.load_from_string(model).graph.initializer[0]
    assert parsed.data_location == TensorProto.EXTERNAL and list(parsed.dims) == [4, 3]
    options = ort_nbits.session_options(1)  # the process's shared pool, if an engine made one
    options.add_external_initializers(["W"], [ort.OrtValue.ortvalue_from_numpy(WEIGHT)])
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ WEIGHT, rtol=1e-6)
