from __future__ import annotations

import random

from opscope.profile.diff import diff, headlines
from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.reader import ProfileData
from opscope.profile.summary import summarize


def fake_profile(name: str, seed: int, backward_ms: float = 5.0, mm_ms: float = 4.0, steps: int = 30,
                 beside_ms: float = 0.0) -> ProfileData:
    rng = random.Random(seed)
    rows, ops = [], []
    for step in range(steps):
        phases = dict.fromkeys(PHASES, 0)
        phases["forward"] = int(rng.gauss(3.0, 0.1) * 1e6)
        phases["backward"] = int(rng.gauss(backward_ms, 0.1) * 1e6)
        phases["optimizer"] = int(rng.gauss(1.0, 0.05) * 1e6)
        phases["other"] = 100_000
        traced = 10 <= step < 16
        rows.append(StepRow(0, step, 0, sum(phases.values()), phases, task_trace=traced))
        if traced:
            ops.append(OpRow(0, step, "backward", "aten::mm", "", 4, 0.0, rng.gauss(mm_ms, 0.05) * 1000))
            ops.append(OpRow(0, step, "forward", "aten::addmm", "", 4, 0.0, rng.gauss(2.0, 0.05) * 1000))
            if beside_ms:  # a thread beside the step (tf.data's producer): its time is no step's phase
                beside = rng.gauss(beside_ms, 0.05) * 1000
                ops.append(OpRow(0, step, "data_wait", "PrefetchProduce", "", 1, 0.0, beside))
    return ProfileData(name, rows, ops, summarize(rows, ops), {0: "complete"})


def test_same_code_twice_is_not_flagged() -> None:
    result = diff(fake_profile("a", 1), fake_profile("b", 2))
    assert result and not [c for c in result.phases if c.flagged]
    assert headlines(result) == ["no phase changed beyond noise"]


def test_slower_backward_is_flagged_with_its_op() -> None:
    result = diff(fake_profile("a", 1), fake_profile("b", 2, backward_ms=6.0, mm_ms=5.0))
    assert not result
    flagged = {c.name: c for c in result.phases if c.flagged}
    assert set(flagged) == {"step", "backward"}
    assert flagged["backward"].direction == "slower" and abs(flagged["backward"].relative - 0.2) < 0.05
    assert result.causes["backward"].name == "aten::mm"
    assert headlines(result)[-1].startswith("backward 20% slower") and "from aten::mm" in headlines(result)[-1]


def test_the_step_is_blamed_on_an_op_of_a_phase_that_moved() -> None:
    """tf.data's producer thread runs beside the step: a slower step keeps it waiting longer, so
    its op's time grows more than the backward's MatMul did. The step's cause is an op of a
    phase that moved (backward), not the largest mover of a phase that did not (data_wait)."""
    result = diff(fake_profile("a", 1, beside_ms=5.0), fake_profile("b", 2, backward_ms=6.0, mm_ms=5.0, beside_ms=8.0))
    flagged = {c.name for c in result.phases if c.flagged}
    assert flagged == {"step", "backward"}, flagged
    assert result.causes["step"].name == result.causes["backward"].name == "aten::mm"


def test_faster_is_reported_but_not_a_regression() -> None:
    result = diff(fake_profile("a", 1, backward_ms=6.0), fake_profile("b", 2))
    assert result and any(c.direction == "faster" for c in result.phases)
