"""The MindSpore IR reader (data flow through MindSpore's bookkeeping nodes), the matching of
dump files to ops, and the op vocabulary that lets compare's per-op rules read MindSpore ops."""

from __future__ import annotations

from pathlib import Path

import pytest

from opscope.compare import opnames
from opscope.compare.conditioning import condition
from opscope.compare.flow import PASS_THROUGH, base_op
from opscope.storage.peers.mindspore_ir import Source, read_graph, split_args
from opscope.storage.peers.mindspore_match import match_files

# A hand-written kernel graph in MindSpore 2.10's text IR syntax (its bookkeeping nodes, a
# weight, a tuple output, a monad, a float16 graph type over a float32 device type).
IR = Path(__file__).resolve().parents[2] / "data" / "mindspore" / "sample_graph.ir"


def test_split_args_keeps_nested_calls_whole() -> None:
    assert split_args("%1, Tensor(shape=[1], dtype=Int32, value=[1]), (I64(1), I64(0))) {attrs}") == [
        "%1", "Tensor(shape=[1], dtype=Int32, value=[1])", "(I64(1), I64(0))"]


def test_data_flow_through_bookkeeping_nodes() -> None:
    g = read_graph(IR)
    assert set(g.ops) == {"Default/net-Net/fc-Dense/MatMul-op0", "Default/net-Net/norm-LayerNorm/LayerNorm-op0",
                          "Default/optimizer-SGD/SGD-op0"}  # Load, UpdateState, TupleGetItem, Depend: not kernels
    assert g.inputs["Default/net-Net/fc-Dense/MatMul-op0"] == [
        Source("input", "inputs0"), Source("param", "w"), Source("const", "Bool(0)"), Source("const", "Bool(1)")]
    # SGD: the weight, then Depend -> TupleGetItem(.., 2) -> the norm's output 2; the monad is no input
    sgd = g.inputs["Default/optimizer-SGD/SGD-op0"]
    assert sgd[:2] == [Source("param", "w"), Source("kernel", "Default/net-Net/norm-LayerNorm/LayerNorm-op0", 2)]
    assert len(sgd) == 3
    assert g.sources == {"Default/net-Net/fc-Dense/MatMul-op0": "/home/me/train.py:30"}  # the user's innermost line
    assert g.consumers["Default/net-Net/fc-Dense/MatMul-op0"] == ["Default/net-Net/norm-LayerNorm/LayerNorm-op0"]
    # inferred Float16, device Float32: what the reader checks dump files against
    assert g.device_dtypes["Default/net-Net/fc-Dense/MatMul-op0"] == (["float32", "float32", "bool", "bool"],
                                                                      ["float32"])
    assert g.shapes["Default/net-Net/fc-Dense/MatMul-op0"] == ([[4, 8], [16, 8], None, None], [[4, 16]])


def test_files_match_ops_only_where_numbered_alike() -> None:
    order = ["A/x/Cast-op1", "A/x/Cast-op2", "A/y/Add-op0", "B/AddN-op1", "C/Mul-op0", "C/Mul-op1"]
    written = {"A_x_Cast-op1": 10, "A_x_Cast-op2": 20, "A_y_Add-op0": 30, "B_AddN-op0": 40,
               "C_Mul-op0": 50, "C_Mul-op5": 60}
    matched, renumbered = match_files(order, written)
    assert matched == {"A/x/Cast-op1": "A_x_Cast-op1", "A/x/Cast-op2": "A_x_Cast-op2", "A/y/Add-op0": "A_y_Add-op0",
                       "B/AddN-op1": "B_AddN-op0"}  # AddN: one offset (-1) for the whole scope and type
    assert renumbered == {"C/Mul-op0", "C/Mul-op1"}  # offsets 0 and 4: no one renumbering
    # the same names written in another order than they run: each file is another op's
    matched, renumbered = match_files(order, {**written, "A_x_Cast-op1": 25})
    assert "A/x/Cast-op1" not in matched and renumbered == {"A/x/Cast-op1", "A/x/Cast-op2", "C/Mul-op0", "C/Mul-op1"}


def test_vocabulary_gives_mindspore_ops_torch_rules() -> None:
    assert base_op("mindspore.MatMul") == "mm"
    assert base_op("mindspore.Reshape") in PASS_THROUGH and base_op("mindspore.Cast") in PASS_THROUGH
    assert base_op("mindspore.SomethingNew") == "SomethingNew"
    assert base_op("aten.mm.default") == "mm" and base_op("Tensor.add") == "add"
    # a LayerNorm's saved mean (slot 1) is a reduction: its error may be magnified by ||x||·sqrt(r)/||mean||
    x = {"io": "input", "numel": 64, "norm": 8.0, "std": 0.1}
    mean = {"io": "output", "slot": 1, "numel": 4, "op": "mindspore.LayerNorm"}
    assert condition([x, mean], mean, 0.5) == pytest.approx(8.0 * 4 / 0.5)
    assert condition([x, {**mean, "op": "mindspore.Gather"}], {**mean, "op": "mindspore.Gather"}, 0.5) == 1.0
    with pytest.raises(ValueError, match="already registered"):
        opnames.register_vocabulary("mindspore", {})


def test_ops_of_a_reused_cell_are_placed_in_their_instance() -> None:
    from opscope.storage.peers.mindspore_ir import KernelGraph
    from opscope.storage.peers.mindspore_places import places

    net = "Default/network-WithLossCell/_backbone-Net/blocks-CellList"
    order = (f"{net}/5-Block/fc1-Dense/MatMul-op0", f"{net}/0-Block/act-GELU/GeLU-op1",   # MindSpore's scope
             f"{net}/5-Block/fc2-Dense/MatMul-op0", f"{net}/0-Block/norm-LayerNorm/LayerNorm-op1",
             f"{net}/6-Block/fc1-Dense/MatMul-op0", f"{net}/0-Block/Add-op7")
    graph = KernelGraph()
    for full, weight in ((order[0], "blocks.5.fc1.weight"), (order[2], "blocks.5.fc2.weight"),
                         (order[3], "blocks.5.norm.gamma"), (order[4], "blocks.6.fc1.weight")):
        graph.inputs[full] = [Source("param", weight)]
    found = places(order, graph)
    assert found[order[1]] == ("forward", "blocks.5.act")  # between two ops of blocks.5
    assert found[order[3]] == ("forward", "blocks.5.norm")  # its weights are blocks.5's
    assert order[5] not in found  # after blocks.6.fc1 with nothing after it: its scope stands
    assert order[0] not in found and order[4] not in found
