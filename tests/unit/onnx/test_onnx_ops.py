"""The ONNX -> torch op correspondence table compare pairs with."""

from __future__ import annotations

import pytest

from opscope.capture.onnxruntime.ops import (
    corresponds,
    is_decomposition,
    is_internal,
    onnx_op_name,
    split_onnx_op,
    torch_key,
)


def test_op_names_round_trip():
    assert onnx_op_name("", "Gemm") == "onnx::Gemm"
    assert onnx_op_name("ai.onnx", "Gemm") == "onnx::Gemm"
    assert onnx_op_name("com.microsoft", "FusedMatMul") == "com.microsoft::FusedMatMul"
    assert split_onnx_op("onnx::Gemm") == ("", "Gemm")
    assert split_onnx_op("com.microsoft::FusedMatMul") == ("com.microsoft", "FusedMatMul")


@pytest.mark.parametrize("spelling", ["aten.addmm.default", "aten::addmm", "aten.addmm", "torch.ops.aten.addmm.default"])
def test_torch_spellings_reduce_to_one_key(spelling):
    assert torch_key(spelling) == "aten.addmm"


@pytest.mark.parametrize(("onnx_op", "torch_op"), [
    ("onnx::Gemm", "aten.addmm.default"), ("onnx::Gemm", "aten::linear"), ("Gemm", "torch.nn.functional.linear"),
    ("onnx::MatMul", "aten.bmm.default"), ("onnx::MatMul", "aten.mm"), ("onnx::Relu", "aten.relu.default"),
    ("onnx::Gelu", "aten.gelu.default"), ("onnx::LayerNormalization", "aten.native_layer_norm.default"),
    ("onnx::Softmax", "aten._softmax.default"), ("onnx::Conv", "aten.convolution.default"),
    ("onnx::Conv", "aten._native_batch_norm_legit_no_training.default"),  # BatchNorm folded into Conv
    ("com.microsoft::FusedMatMul", "aten.matmul"), ("onnx::Add", "aten.add.Tensor"),
])
def test_pairs_that_correspond(onnx_op, torch_op):
    assert corresponds(onnx_op, torch_op)


@pytest.mark.parametrize(("onnx_op", "torch_op"), [
    ("onnx::Erf", "aten.gelu"), ("onnx::Add", "aten.mul.Tensor"), ("onnx::Gemm", "aten.relu"),
    ("onnx::Relu", "aten.gelu"), ("onnx::Constant", "aten.add"), ("onnx::Softmax", "aten.layer_norm"),
])
def test_pairs_that_do_not(onnx_op, torch_op):
    assert not corresponds(onnx_op, torch_op)


def test_decompositions():
    gelu = ["onnx::Div", "onnx::Erf", "onnx::Add", "onnx::Mul", "onnx::Mul"]
    layer_norm = ["onnx::ReduceMean", "onnx::Sub", "onnx::Constant", "onnx::Pow", "onnx::ReduceMean",
                  "onnx::Add", "onnx::Sqrt", "onnx::Div", "onnx::Mul", "onnx::Add"]
    assert is_decomposition("aten.gelu.default", gelu)
    assert is_decomposition("aten.layer_norm.default", layer_norm)
    assert not is_decomposition("aten.gelu.default", layer_norm)  # ReduceMean is no part of a GELU
    assert not is_decomposition("aten.gelu.default", ["onnx::Erf"])  # one node is not a decomposition
    assert not is_decomposition("aten.relu.default", gelu)
    assert is_internal("onnx::Constant") and is_internal("onnx::Shape") and not is_internal("onnx::Add")
