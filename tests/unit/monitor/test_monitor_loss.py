"""The loss without m.step(loss=...): the scalar each backward starts from, averaged over a step's
backward passes; an explicit loss wins; backward is put back when the monitor stops."""

from __future__ import annotations

import pytest
import torch

import opscope


def test_the_loss_is_what_backward_starts_from_and_backward_is_restored(tmp_path):
    original = torch.autograd.backward
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    with opscope.monitor(tmp_path / "m", targets=["loss", "grads"], report=False) as m:
        assert torch.autograd.backward is not original
        for i in range(6):
            losses = [model(torch.randn(8, 4)).pow(2).mean() for _ in range(2)]  # two micro-batches
            for loss in losses:
                loss.backward()
            model(torch.randn(8, 4)).backward(torch.ones(8, 1))  # a gradient given: not a loss
            opt.step()
            opt.zero_grad()
            seen.append(sum(float(v.detach()) for v in losses) / 2)
            m.step(loss=123.0 if i == 5 else None)
    assert torch.autograd.backward is original
    steps, values = m.result.ranks[0].values[("loss", "loss", "value")]
    assert steps == list(range(6))
    assert values[:5] == pytest.approx(seen[:5], rel=1e-6) and values[5] == 123.0
