"""Row planning: io kinds, parameter names, data flow and filters (no onnx needed)."""

from __future__ import annotations

from opscope.capture.onnxruntime.graph import GraphNode
from opscope.capture.onnxruntime.plan import is_parameter_name, plan_rows
from opscope.capture.onnxruntime.scopes import NodeScope
from opscope.config import Filter


def _graph():
    nodes = [
        GraphNode(0, "Identity_0", "Identity", "", ["l.weight"], ["m.weight"]),   # exporter's shared weight
        GraphNode(1, "/l/Gemm", "Gemm", "", ["x", "l.weight", "l.bias"], ["h"]),
        GraphNode(2, "/m/MatMul", "MatMul", "", ["h", "onnx::MatMul_7"], ["h2"]),
        GraphNode(3, "/m/Mul", "Mul", "", ["h2", "m.weight"], ["y"]),
        GraphNode(4, "/m/Mul_1", "Mul", "", ["y", ""], ["z"]),                   # an absent optional input
    ]
    scopes = [NodeScope("m", "inferred"), NodeScope("l", "name"), NodeScope("m", "name"),
              NodeScope("m", "name"), NodeScope("m", "name")]
    return nodes, scopes, {"l.weight", "l.bias", "onnx::MatMul_7"}, {"x"}


def test_rows_io_kinds_params_and_flow():
    nodes, scopes, inits, feeds = _graph()
    plan = plan_rows(nodes, scopes, inits, feeds)
    rows = {(r.node, r.io, r.slot): r for r in plan.rows}
    assert rows[("/l/Gemm", "param", 1)].param == "l.weight"
    derived = rows[("/m/MatMul", "param", 1)]
    assert derived.param is None and "derived initializer" in derived.note
    shared = rows[("/m/Mul", "param", 1)]
    assert shared.param == "m.weight" and shared.producer == rows[("Identity_0", "output", 0)].local
    gemm_out = rows[("/l/Gemm", "output", 0)]
    matmul_in = rows[("/m/MatMul", "input", 0)]
    assert matmul_in.producer == gemm_out.local and matmul_in.owner == gemm_out.local
    assert [r.call for r in plan.rows if r.node in ("/m/Mul", "/m/Mul_1") and r.io == "output"] == [0, 1]
    assert ("/m/Mul_1", "input", 1) not in rows
    assert plan.feeds == ["x"] and plan.params == ["l.bias", "l.weight", "onnx::MatMul_7"]
    assert plan.fetch == ["m.weight", "h", "h2", "y", "z"]


def test_filters_keep_call_indices_and_drop_dangling_producers():
    nodes, scopes, inits, feeds = _graph()
    plan = plan_rows(nodes, scopes, inits, feeds, mode="input", ops=Filter.parse("ops", ["onnx::Mul"]))
    assert {r.op for r in plan.rows} == {"onnx::Mul"} and {r.io for r in plan.rows} <= {"input", "param"}
    assert all(r.producer is None for r in plan.rows)
    assert [r.call for r in plan.rows if r.slot == 0] == [0, 1]
    assert any("producer not captured" in (r.note or "") for r in plan.rows)


def test_parameter_name_heuristic():
    assert is_parameter_name("layers.0.mlp.0.weight") and is_parameter_name("embed.weight")
    for name in ("onnx::MatMul_124", "val_3", "/layers.0/Constant_output_0", ""):
        assert not is_parameter_name(name)
