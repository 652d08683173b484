"""The figures a profile report explains: outlier steps behind a mean, machine load, and a
task-trace cost below 1x (never printed without its reason)."""

from __future__ import annotations

import time
import warnings

import pytest

from opscope.profile.model import PHASES, StepRow
from opscope.profile.summary import machine_load, outlier_steps, task_trace_overhead


def row(step: int, wall_ms: float, wait_ms: float = 0.0, traced: bool = False, optimizer_ms: float = 0.0) -> StepRow:
    phases = dict.fromkeys(PHASES, 0)
    phases["optimizer"] = int(optimizer_ms * 1e6)
    phases["forward"] = int(wall_ms * 1e6) - phases["optimizer"]
    waits = dict.fromkeys(PHASES, 0)
    waits["forward"] = int(wait_ms * 1e6)
    return StepRow(0, step, 0, int(wall_ms * 1e6), phases, task_trace=traced, sched_wait_ns=int(wait_ms * 1e6),
                   phase_waits=waits)


def test_outliers_name_the_step_and_the_phase_that_grew() -> None:
    rows = [row(i, 10 + 0.1 * (i % 3), optimizer_ms=1.5) for i in range(1, 12)]
    rows.append(row(12, 190, optimizer_ms=181))
    found = outlier_steps(rows)
    assert [(o["step"], o["phase"]) for o in found["steps"]] == [(12, "optimizer")]
    assert outlier_steps(rows[:-1])["steps"] == []


def test_load_is_said_only_above_five_percent_with_the_phase_that_waited() -> None:
    quiet = machine_load([row(i, 10, wait_ms=0.2) for i in range(8)])
    busy = machine_load([row(i, 10, wait_ms=3) for i in range(8)])
    assert not quiet["loaded"] and quiet["note"] is None
    assert busy["loaded"] and busy["phase"] == "forward" and "30% of step time" in busy["note"]


def test_a_cost_below_one_says_the_unprofiled_steps_waited_more() -> None:
    rows = [row(i, 20, wait_ms=9) for i in range(1, 9)] + [row(9, 12, wait_ms=0.5, traced=True)]
    cost = task_trace_overhead(rows)
    assert cost["ratio"] < 1 and "busier during them" in cost["why"]
    assert cost["ratio_without_wait"] == pytest.approx((12 - 0.5) / (20 - 9), rel=1e-3)


def test_a_cost_below_one_without_a_wait_is_called_noise() -> None:
    rows = [row(i, 20 + i) for i in range(1, 9)] + [row(9, 19.5, traced=True)]
    cost = task_trace_overhead(rows)
    assert cost["ratio"] < 1 and "spread of the unprofiled steps" in cost["why"]
    assert "why" not in task_trace_overhead([row(i, 20) for i in range(1, 9)] + [row(9, 25, traced=True)])


def test_show_names_an_injected_slow_optimizer_step(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    import opscope
    from opscope.profile.reader import load
    from opscope.report import render

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    slow = [7]
    opt.register_step_pre_hook(lambda o, a, k: time.sleep(0.2) if p.steps.step in slow else None)  # the fault
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p") as p:
            for _ in range(12):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
                p.step()
    text = render(load(tmp_path / "p"), "text")
    line = next(line for line in text.splitlines() if line.startswith("outlier steps"))
    assert "step 7 " in line and "(optimizer " in line and "step 6 " not in line
