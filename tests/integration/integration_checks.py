"""What the Hugging Face Trainer and Lightning callback tests check alike: the sessions that
``OpscopeCallback`` drove through a run of ``steps`` optimizer steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import opscope


def driven_sessions(path: Path) -> tuple[Any, Any, Any]:
    """A dump of step 2, a profile of every step with task traces of steps 2-3, a monitor: for
    ``OpscopeCallback`` to drive, under ``path`` (``d``, ``p``, ``m``)."""
    return (opscope.dump(path / "d", level="module", data="statistics", steps="2"),
            opscope.profile(path / "p", steps="2-3", task_trace=True), opscope.monitor(path / "m", report=False))


def check_driven(dump_path: Path, dump: Any, profile: Any, monitor: Any, steps: int, losses: list[float],
                 rates: list[float], rel: float) -> None:
    """The callback started and stopped ``dump`` (steps="2") and ``profile`` (steps="2-3",
    task traces); the profile has every step, the monitor each step's loss and learning rate
    equal to ``losses`` and ``rates`` (relative tolerance ``rel``)."""
    assert dump.started is False and profile.state == "stopped"  # started and stopped by the callback
    assert opscope.load(dump_path).steps() == [2]
    rows = profile.result.steps
    assert [r.step for r in rows] == list(range(steps))
    assert [r.step for r in rows if r.task_trace] == [2, 3]
    rank = monitor.result.ranks[0]
    for kind, expected in (("loss", losses), ("lr", rates)):
        got_steps, values = rank.values[(kind, kind, "value")]
        assert got_steps == list(range(steps)), kind
        assert values == pytest.approx(expected, rel=rel), kind
