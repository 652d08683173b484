"""The fault cases of compare_faults, dumped at module level (statistics and tensors).

At module level only module calls are recorded: code a parent runs between its leaf
modules (an activation called as a function, an inserted scale, a residual add, a custom
autograd Function's backward) makes tensors no record produced. The innermost module
whose code made them must be named, never the next leaf's input as a "root".
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
import compare_faults  # noqa: E402

import opscope  # noqa: E402

MODES = ("statistics", "tensor")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("faults-module")


def _compare(name, root, data):
    target, reference = compare_faults.make_case(name, root / data, level="module", data=data)
    return opscope.compare(target, reference, workers=1)


@pytest.mark.parametrize("data", MODES)
@pytest.mark.parametrize("name, phase, module, op, note", [
    ("gelu_tanh", "forward", "blocks.1", "Block", "own code"),      # F.gelu in Block.forward
    ("insert_op", "forward", "blocks.1", "Block", "own code"),      # h * 1.01 in Block.forward
    ("ln_eps", "forward", "blocks.1.ln1", "LayerNorm", ""),         # the module itself
    ("overflow_nan", "forward", "", "MLP", "own code"),             # the fp16 gain in MLP.forward
    ("backward_grad", "backward", "", "MLP", "gradient at fc1"),    # a custom Function in MLP
])
def test_module_level_names_the_module_whose_code_made_the_fault(root, data, name, phase, module, op, note):
    result = _compare(name, root, data)
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.kind, first.phase, first.module, first.op, first.step) == ("culprit", phase, module, op, 0), \
        (first.kind, first.where, first.note)
    assert note in first.note
    assert not [c for c in result.culprits if c.kind == "root"]  # nothing differs "at the start"


@pytest.mark.parametrize("data", MODES)
def test_module_level_parameter_row_is_a_root(root, data):
    first = _compare("param_row", root, data).first_divergence
    assert (first.kind, first.param, first.step) == ("root", "blocks.0.fc1.weight", 0)


@pytest.mark.parametrize("data", MODES)
@pytest.mark.parametrize("name", ["same_twice", "fp64_reference", "fp64_reference_mlp", "threads",
                                  "bf16_autocast"])
def test_module_level_benign_difference_has_no_culprit(root, data, name):
    result = _compare(name, root, data)
    assert result.first_divergence is None, [(c.kind, c.where, c.note) for c in result.culprits]
    assert result.verdict in ("identical", "within_tolerance")
