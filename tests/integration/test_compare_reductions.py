"""A sum over a batch with cancelling terms may magnify its input's error: not a culprit."""

from __future__ import annotations

import opscope
from opscope.compare import verdict
from opscope.demo.models import train_step, transformer_task


def _run(path, gelu: str) -> None:
    model, opt, batch = transformer_task()
    model.layers[1].act.approximate = gelu
    with opscope.dump(path, data="tensor", steps="0"):
        train_step(model, opt, *batch(0))


def test_bias_gradient_sum_inherits_and_only_the_changed_gelu_is_blamed(tmp_path, monkeypatch):
    _run(tmp_path / "ref", "none")
    _run(tmp_path / "bad", "tanh")
    result = opscope.compare(tmp_path / "bad", tmp_path / "ref")
    blamed = {(c.module, c.op, c.phase) for c in result.culprits}
    assert blamed == {("layers.1.act", "aten.gelu.default", "forward"),
                      ("layers.1.act", "aten.gelu_backward.default", "backward")}
    # without the cancellation rule the head's bias-gradient sum is (wrongly) a culprit
    monkeypatch.setattr(verdict, "condition", lambda rows, out, norm: 1.0)
    again = opscope.compare(tmp_path / "bad", tmp_path / "ref")
    assert ("head", "aten.sum.dim_IntList", "backward") in {(c.module, c.op, c.phase) for c in again.culprits}
