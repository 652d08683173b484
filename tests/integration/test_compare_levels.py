"""Compare at module and api level on real dumps: nesting and uncaptured producers."""

from __future__ import annotations

import pytest

import opscope
from opscope.demo.models import train_step, transformer_task


def _run(path, level: str, gelu: str) -> None:
    model, opt, batch = transformer_task(d=32, heads=2, layers=2, seq=8, batch=2)
    model.layers[1].act.approximate = gelu
    with opscope.dump(path, level=level, data="tensor", source=True) as d:
        for i in range(2):
            train_step(model, opt, *batch(i))
            d.step()


@pytest.mark.parametrize("level,op", [("module", "GELU"), ("api", "torch.nn.functional.gelu")])
def test_the_changed_activation_is_the_only_forward_culprit(tmp_path, level, op):
    _run(tmp_path / "ref", level, "none")
    _run(tmp_path / "bad", level, "tanh")
    result = opscope.compare(tmp_path / "bad", tmp_path / "ref")
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.kind, first.module, first.op, first.phase, first.step) == ("culprit", "layers.1.act", op,
                                                                             "forward", 0)
    # enclosing modules (layers.1, the model) and gradients without a captured producer inherit
    forward = [c for c in result.culprits if c.phase == "forward"]
    assert {c.module for c in forward} == {"layers.1.act"}
    assert not [c for c in result.culprits if c.kind == "root"]
    if level == "api":
        # the user's line: the bundled model lives in the opscope package, so the caller's line
        assert first.source and first.source.endswith("(_run)") and "test_compare_levels.py" in first.source


def test_same_module_level_run_twice_is_identical(tmp_path):
    _run(tmp_path / "a", "module", "none")
    _run(tmp_path / "b", "module", "none")
    assert opscope.compare(tmp_path / "a", tmp_path / "b").verdict == "identical"
