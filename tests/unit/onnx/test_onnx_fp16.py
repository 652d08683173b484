"""The float16 converter: types, casts at the edges, names kept, overflow reproduced."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from opscope.capture.onnxruntime.fp16 import convert_to_float16  # noqa: E402


def _model(scale: float):
    w = numpy_helper.from_array(np.full((4, 4), scale, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_converted_model_keeps_io_types_and_node_names():
    original = _model(0.5)
    half = convert_to_float16(original)
    assert original.graph.initializer[0].data_type == TensorProto.FLOAT  # the original is untouched
    assert half.graph.initializer[0].data_type == TensorProto.FLOAT16
    assert half.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {"mm", "relu"} <= {n.name for n in half.graph.node}
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    y32, y16 = _run(original, x), _run(half, x)
    assert y16.dtype == np.float32 and np.allclose(y16, y32, rtol=1e-3, atol=1e-3)


def test_overflow_beyond_float16_range_becomes_inf():
    x = np.full((2, 4), 100.0, np.float32)
    assert np.isfinite(_run(_model(400.0), x)).all()          # 160000 fits float32
    half = convert_to_float16(_model(400.0))
    # ONNX Runtime's CPU provider has no float16 MatMul: it runs it in float32 and may skip the
    # rounding to float16 between such ops; a value stored as float16 (as a captured one is) overflows.
    half.graph.output.append(onnx.ValueInfoProto(name="h"))
    session = ort.InferenceSession(half.SerializeToString(), providers=["CPUExecutionProvider"])
    h = session.run(["h"], {"x": x})[0]
    assert h.dtype == np.float16 and np.isinf(h).all()
    weights = numpy_helper.to_array(convert_to_float16(_model(1e5)).graph.initializer[0])
    assert np.isinf(weights).all()


def test_keep_fp32_wraps_the_node_in_casts():
    half = convert_to_float16(_model(0.5), keep_fp32={"MatMul"})
    assert half.graph.initializer[0].data_type == TensorProto.FLOAT
    x = np.ones((2, 4), np.float32)
    assert np.allclose(_run(half, x), _run(_model(0.5), x))
