"""The ONNX -> torch op table cross-framework compare pairs with."""

from __future__ import annotations

import pytest

from opscope.capture.onnxruntime.plan import onnx_op_name
from opscope.compare.crossframework.tables import OpTable, register_table, table_for
from opscope.compare.crossframework.tables.onnx import ONNX, split_onnx_op
from opscope.compare.crossframework.torchnames import torch_key

corresponds, is_decomposition, is_internal = ONNX.corresponds, ONNX.is_decomposition, ONNX.is_internal


def test_op_names_round_trip():
    assert onnx_op_name("", "Gemm") == "onnx::Gemm"
    assert onnx_op_name("ai.onnx", "Gemm") == "onnx::Gemm"
    assert onnx_op_name("com.microsoft", "FusedMatMul") == "com.microsoft::FusedMatMul"
    assert split_onnx_op("onnx::Gemm") == ("", "Gemm")
    assert split_onnx_op("com.microsoft::FusedMatMul") == ("com.microsoft", "FusedMatMul")


@pytest.mark.parametrize("spelling",
                         ["aten.addmm.default", "aten::addmm", "aten.addmm", "torch.ops.aten.addmm.default"])
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


def _toy_table() -> OpTable:
    return OpTable(framework="toy", to_torch={"MatMul": frozenset({"aten.mm"})}, decompositions={}, fusions={},
                   folded={}, internal=frozenset({"Const"}), order_preserving=frozenset(), movement=frozenset(),
                   key=lambda op: op.removeprefix("toy::"), op_type=lambda op: op.removeprefix("toy::"))


def _rows(op: str, *, node: str | None = None) -> list[dict]:
    common = dict(rank=0, step=0, phase="forward", module="lin", op=op, call=0, seq=0, numel=4, dtype="float32",
                  shape=[2, 2], node=node)
    x = dict(common, id=0, io="input", slot=0, producer=None, arg="x", norm=1.0, mean=0.5, min=0.0, max=1.0)
    y = dict(common, id=1, io="output", slot=0, producer=None, norm=2.0, mean=1.0, min=0.0, max=2.0)
    return [x, y]


def test_a_new_framework_is_a_new_table(monkeypatch):
    """A table registered for a capture level is all the aligner needs to pair that framework's ops."""
    from opscope.compare.crossframework import align_partition, is_cross, tables

    monkeypatch.setattr(tables, "_TABLES", dict(tables._TABLES))
    assert not is_cross("toy", "aten")
    toy = register_table(_toy_table())
    assert table_for("toy") is toy and is_cross("toy", "aten") and is_cross("aten", "onnx")
    with pytest.raises(ValueError, match="already registered"):
        register_table(_toy_table())
    pairs = align_partition(_rows("toy::MatMul", node="mm0"), _rows("aten.mm.default"), "toy", "aten")
    kinds = sorted((p.kind, p.t["io"], p.note) for p in pairs if p.t is not None and p.r is not None)
    assert kinds == [("aligned", "input", "model input"), ("aligned", "output", "")]
    unrelated = align_partition(_rows("toy::Conv"), _rows("aten.mm.default"), "toy", "aten")
    assert all(p.kind == "unpaired" for p in unrelated if p.t is None or p.r is None)
    assert not any(p.t is not None and p.r is not None and p.t["io"] == "output" for p in unrelated)

