"""Module paths from both torch.onnx exporters' node names and metadata (no onnx needed)."""

from __future__ import annotations

import pytest

from opscope.capture.onnxruntime.scopes import (
    ScopedNode,
    module_from_metadata,
    module_from_scope_name,
    resolve_modules,
    source_from_metadata,
    torch_op_from_metadata,
)


@pytest.mark.parametrize(("name", "op_type", "module"), [
    ("/layers.0/mlp/mlp.0/MatMul", "MatMul", "layers.0.mlp.0"),
    ("/layers.0/norm1/ReduceMean_1", "ReduceMean", "layers.0.norm1"),
    ("/layers.0/Mul_2", "Mul", "layers.0"),
    ("/seq/seq.0/seq.0.0/Gemm", "Gemm", "seq.0.0"),
    ("/fc1/Gemm", "Gemm", "fc1"),
    ("/Add", "Add", ""),
    # fused by ONNX Runtime: the op type no longer matches; the first op-like component ends the scope
    ("/layers.0/norm1/Mul/LayerNormFusion/", "LayerNormalization", "layers.0.norm1"),
])
def test_torchscript_scope_names(name, op_type, module):
    assert module_from_scope_name(name, op_type) == module


def test_unscoped_names_have_no_module():
    assert module_from_scope_name("Identity_3", "Identity") is None
    assert module_from_scope_name("node_linear", "Gemm") is None


def test_known_module_names_settle_an_ambiguous_join():
    # "mlp.0" under "a.mlp" is a.mlp.0 — unless the model really has a.mlp.mlp.0
    assert module_from_scope_name("/a/mlp/mlp.0/Gemm", "Gemm") == "a.mlp.0"
    known = {"", "a", "a.mlp", "a.mlp.mlp", "a.mlp.mlp.0"}
    assert module_from_scope_name("/a/mlp/mlp.0/Gemm", "Gemm", known) == "a.mlp.mlp.0"


DYNAMO = {
    "namespace": ": __main__.Net/layers.0: __main__.Block/layers.0.mlp: torch.nn.modules.container.Sequential/"
                 "layers.0.mlp.0: torch.nn.modules.linear.Linear/linear_2: aten.linear.default",
    "pkg.torch.onnx.name_scopes": "['', 'layers.0', 'layers.0.mlp', 'layers.0.mlp.0', 'linear_2']",
    "pkg.torch.onnx.fx_node": "%linear_2 : [num_users=1] = call_function[target=torch.ops.aten.linear.default]"
                              "(args = (%x, %w, %b), kwargs = {})",
    "pkg.torch.onnx.stack_trace": 'File "/src/model.py", line 12, in forward\n    x = self.mlp(x)\n'
                                  'File "/torch/nn/modules/linear.py", line 134, in forward',
}


def test_dynamo_metadata():
    assert module_from_metadata(DYNAMO) == "layers.0.mlp.0"
    assert module_from_metadata({"pkg.torch.onnx.name_scopes": "['', 'add']"}) == ""
    assert module_from_metadata({}) is None
    assert torch_op_from_metadata(DYNAMO) == "aten.linear.default"
    assert torch_op_from_metadata({"namespace": DYNAMO["namespace"]}) == "aten.linear.default"
    assert source_from_metadata(DYNAMO) == "/src/model.py:12"


def test_fused_nodes_take_the_scope_of_the_original_node_they_start_with():
    original = [ScopedNode("node_MatMul_1", "MatMul", ["h"], ["m"],
                           {"pkg.torch.onnx.name_scopes": "['', 'qkv', 'linear']"}),
                ScopedNode("node_linear", "Add", ["m"], ["y"], {"pkg.torch.onnx.name_scopes": "['', 'qkv', 'linear']"})]
    optimized = [ScopedNode("gemm_input_reshape", "Reshape", ["h"], ["h2"]),
                 ScopedNode("node_MatMul_1/MatMulAddFusion", "Gemm", ["h2"], ["y2"]),
                 ScopedNode("gemm_output_reshape", "Reshape", ["y2"], ["y"])]
    scopes = resolve_modules(optimized, original=original)
    assert [(s.module, s.how) for s in scopes] == [("qkv", "inferred"), ("qkv", "original"), ("qkv", "inferred")]


def test_unscoped_nodes_take_the_deepest_common_module_of_their_neighbours():
    nodes = [ScopedNode("/layers.0/qkv/Add", "Add", ["a"], ["qkv"]),
             ScopedNode("split", "Split", ["qkv"], ["q", "k"]),
             ScopedNode("/layers.0/MatMul", "MatMul", ["q", "k"], ["s"]),
             ScopedNode("lonely", "Constant", [], ["c"])]
    scopes = resolve_modules(nodes)
    assert scopes[1].module == "layers.0" and scopes[1].how == "inferred"
    assert (scopes[3].module, scopes[3].how) == ("", "none")
