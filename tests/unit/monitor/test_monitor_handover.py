"""Finished steps go to the judge's thread, in groups, as a backward begins (the autograd engine
then runs without the GIL, so the thread's Python makes the training thread wait for nothing);
the step-end hand-over stays for loops whose backward is not from a scalar."""

from __future__ import annotations

import torch

import opscope
from opscope.monitor.session import _BACKWARD_GROUP


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def test_finished_steps_go_to_the_judge_in_groups_as_a_backward_begins(tmp_path):
    model, opt = _model()
    with opscope.monitor(tmp_path / "m", model=model, optimizer=opt, targets=["grads"], report=False) as m:
        assert m.judge is not None
        for i in range(9):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            held = len(m.judge._held)
            assert held == (i - 1) % _BACKWARD_GROUP + 1 if i else held == 0  # the steps since the last group
            loss.backward()
            assert len(m.judge._held) == (0 if held == _BACKWARD_GROUP else held)  # a group goes as the engine starts
            opt.step()
            opt.zero_grad()
            m.step()
    assert m.result.ranks[0].values[("grad", "0.weight", "norm")][0] == list(range(9))


def test_without_a_scalar_backward_steps_are_still_handed_over_at_the_step_end(tmp_path):
    model, opt = _model()
    with opscope.monitor(tmp_path / "m", model=model, optimizer=opt, targets=["grads"], report=False) as m:
        for _ in range(20):
            out = model(torch.randn(4, 8))
            out.backward(torch.ones_like(out))  # not a loss: no hand-over at backward
            opt.step()
            opt.zero_grad()
            m.step()
        assert m.judge is not None and len(m.judge._held) < 16  # the usual groups of 16
    assert m.result.ranks[0].values[("grad", "0.weight", "norm")][0] == list(range(20))
