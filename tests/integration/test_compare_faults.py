"""Faults injected for real into small real models (PyTorch, opscope.dump), then compared.

Each case trains a tiny transformer or MLP for two AdamW steps on both sides; the fault
is in the target only. The verdict must name the op that made the fault, and name
nothing for benign differences.
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
import compare_faults  # noqa: E402

import opscope  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


def _first(name, root):
    target, reference = compare_faults.make_case(name, root)
    result = opscope.compare(target, reference, workers=1)
    return result, result.first_divergence


@pytest.mark.parametrize("name, phase, module, op", [
    ("gelu_tanh", "forward", "blocks.1", "aten.gelu.default"),
    ("ln_eps", "forward", "blocks.1.ln1", "aten.native_layer_norm.default"),
    ("insert_op", "forward", "blocks.1", "aten.mul.Tensor"),
    ("backward_grad", "backward", None, "aten.mul.Tensor"),
    ("overflow_nan", "forward", None, "aten.mul.Tensor"),
])
def test_fault_is_named(root, name, phase, module, op):
    result, first = _first(name, root)
    assert result.verdict == "diverged"
    assert (first.kind, first.phase, first.op, first.step) == ("culprit", phase, op, 0), first.where
    if module is not None:
        assert first.module == module
    assert result.culprits[0].op == op  # ranked first, too


def test_inserted_op_is_target_only_and_later_ops_stay_paired(root):
    result, first = _first("insert_op", root)
    assert first.side == "target" and "target only" in first.note
    table = result.pairs_table.to_pylist()
    fc2 = [r for r in table if r["module"] == "blocks.1.fc2" and r["step"] == 0 and r["io"] == "output"
           and r["phase"] == "forward" and r["op"] == "aten.addmm.default"]
    assert fc2 and all(r["op"] == r["op_reference"] for r in fc2) and all(r["status"] == "failed" for r in fc2)


def test_overflow_nan_blames_the_overflow_not_the_norm(root):
    result, first = _first("overflow_nan", root)
    assert first.metrics["inf_mismatch"] > 0 and first.dtype == "float16"
    assert all(c.op != "aten.native_layer_norm.default" for c in result.culprits)


def test_optimizer_hyperparameter(root):
    result, first = _first("optimizer_lr", root)
    assert (first.kind, first.phase, first.step) == ("culprit", "optimizer", 0)
    assert first.metrics["input_error"] == 0


def test_changed_parameter_row_is_the_root(root):
    result, first = _first("param_row", root)
    assert (first.kind, first.param, first.step) == ("root", "blocks.0.fc1.weight", 0)
    assert result.culprits[0].param == "blocks.0.fc1.weight"


@pytest.mark.parametrize("name, verdict", [
    ("same_twice", "identical"),
    ("fp64_reference", "within_tolerance"),
    ("fp64_reference_mlp", "within_tolerance"),
    ("threads", None),
    ("bf16_autocast", "within_tolerance"),
])
def test_benign_difference_has_no_culprit(root, name, verdict):
    result, first = _first(name, root)
    assert first is None, [c.where for c in result.culprits]
    assert result.verdict != "diverged"
    if verdict:
        assert result.verdict == verdict
