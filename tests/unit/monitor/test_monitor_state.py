"""The optimizer state's statistics, taken on the batched kernel's thread after each optimizer
step and read back before the next one: they are the state after the step that took them."""

from __future__ import annotations

import pytest
import torch

import opscope
from opscope.monitor import stats


@pytest.mark.parametrize("user_steps, every", [(True, 1), (False, 1), (True, 2)])
def test_the_state_read_on_the_kernels_thread_is_the_state_after_its_step(tmp_path, user_steps, every):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    expected = {}
    with opscope.monitor(tmp_path / "m", targets=["grads", "optimizer"], every=every, report=False) as m:
        assert m._defer == stats.BATCHED  # the kernel's thread, where there is one
        for i in range(7):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            state = opt.state[model[0].weight]
            expected[i] = (state["exp_avg"].norm().item(), state["exp_avg_sq"].norm().item())
            opt.zero_grad()
            if user_steps:
                m.step()
    rank = m.result.ranks[0]
    kept = [i for i in range(7) if i % every == 0]
    for j, kind in enumerate(("exp_avg", "exp_avg_sq")):
        steps, values = rank.values[(kind, "0.weight", "norm")]
        assert steps == kept
        assert values == pytest.approx([expected[i][j] for i in kept], rel=1e-6)
    assert rank.values[("grad", "0.weight", "norm")][0] == kept
