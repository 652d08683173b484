from __future__ import annotations

import random

from opscope.profile.diff import diff, headlines
from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.reader import ProfileData
from opscope.profile.summary import summarize


def fake_profile(name: str, seed: int, backward_ms: float = 5.0, mm_ms: float = 4.0, steps: int = 30) -> ProfileData:
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


def test_faster_is_reported_but_not_a_regression() -> None:
    result = diff(fake_profile("a", 1, backward_ms=6.0), fake_profile("b", 2))
    assert result and any(c.direction == "faster" for c in result.phases)
