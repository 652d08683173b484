"""The machine side of ``opscope profile diff``: what A's and B's calibrations and run-queue
waits say (:func:`measure_machine`), the waits to take out of a phase (:func:`phase_waits`)
and the headline when the machine differed (:func:`machine_headline`). The rules are in
:mod:`opscope.profile.diff`'s docstring and docs/profile.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from opscope.profile.calibration import Speed, compatible, speed
from opscope.profile.model import StepRow
from opscope.profile.summary import MS

# Of a phase's own time on A, the share the machine may account for beyond the run-queue wait
# once the thread waited (it then runs slower too: diff._Judge, diff_ops.op_beyond_machine).
CONTENTION_SHARE = 0.35
# What the machine may add to any phase or op, whether it waited itself or not, once B's
# thread waited significantly more per step (a cold start after another's turn): this share
# of the added wait per step, at most COLD_SHARE of A's step.
COLD_PER_WAIT = 0.025
COLD_SHARE = 0.05


@dataclass
class Wait:
    """Run-queue wait per steady step (ms) of A and B: time lost, measured, not estimated."""

    a_mean: float
    b_mean: float
    a_median: float
    b_median: float
    significant: bool  # the mean differs by at least the absolute floor of the diff


@dataclass
class Machine:
    """The machine during B against A: calibration speed ratio and per-step run-queue wait."""

    speed: Speed | None = None
    wait: Wait | None = None  # None = not measured in both profiles
    why_not: str | None = None  # why the calibrations cannot be compared

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "speed": None if self.speed is None else asdict(self.speed),
            "sched_wait": None if self.wait is None else asdict(self.wait),
            "note": self.why_not,
        }


def measure_machine(a: Any, b: Any, rows_a: Sequence[StepRow], rows_b: Sequence[StepRow], floor: float) -> Machine:
    """What the calibrations of A and B say; an empty :class:`Machine` when they cannot."""
    blocks_a = list(getattr(a, "calibration", {}).values())
    blocks_b = list(getattr(b, "calibration", {}).values())
    why_not = compatible(blocks_a, blocks_b)
    if why_not is not None:
        return Machine(why_not=why_not)
    wait = None
    if all(block.get("sched_wait") for block in (*blocks_a, *blocks_b)) and rows_a and rows_b:
        wa, wb = _waits(rows_a), _waits(rows_b)
        means = statistics.fmean(wa), statistics.fmean(wb)
        medians = statistics.median(wa), statistics.median(wb)
        wait = Wait(round(means[0], 4), round(means[1], 4), round(medians[0], 4), round(medians[1], 4),
                    abs(means[1] - means[0]) >= floor)
    return Machine(speed(blocks_a, blocks_b), wait)


def contention_ms(machine: Machine | None, a_ms: float, step_ms: float, waited: bool, sign: int) -> float:
    """What sharing the CPU may add to a change of sign ``sign`` beyond the run-queue wait.

    A thread that waits for a CPU also runs slower once it has one: up to
    :data:`CONTENTION_SHARE` of A's time of the phase or op when that waited more
    (``waited``), and anywhere in a step that did, :data:`COLD_PER_WAIT` of the wait added
    per step, up to :data:`COLD_SHARE` of A's step (``step_ms``). The second is what a
    short phase loses to a cold start: an SGD step of 0.39 ms, never waiting itself, took
    0.49 / 0.60 / 0.77 ms under one, two and four busy loops on its CPU, 0.8-0.9% of the
    wait they added per step (the same calls back to back did not slow down)."""
    share = CONTENTION_SHARE * abs(a_ms) if waited else 0.0
    wait = machine.wait if machine is not None else None
    if wait is None or not wait.significant or (wait.b_mean - wait.a_mean) * sign <= 0:
        return share
    return share + min(COLD_PER_WAIT * abs(wait.b_mean - wait.a_mean), COLD_SHARE * abs(step_ms))


def _waits(rows: Sequence[StepRow]) -> list[float]:
    return [r.sched_wait_ns / MS for r in rows]


def phase_waits(rows_a: Sequence[StepRow], rows_b: Sequence[StepRow],
                 phase: str, split: bool) -> tuple[tuple[list[float], list[float]], bool]:
    """The waits to take out of a phase, and whether they are its own (exact) or the whole
    step's (a bound: the phase's wait is not known, only the step's)."""
    if phase == "step" or not split:
        return (_waits(rows_a), _waits(rows_b)), phase == "step"
    return ([_own_wait(r, phase) / MS for r in rows_a], [_own_wait(r, phase) / MS for r in rows_b]), True


def _own_wait(row: StepRow, phase: str) -> int:
    """A phase's own wait (ns); called only when every row has its waits split by phase."""
    if row.phase_waits is None:
        raise ValueError(f"step {row.step} of rank {row.rank} has no wait split by phase")
    return row.phase_waits[phase]


def machine_headline(machine: Machine | None) -> str | None:
    """The line "the machine was slower during B: ..." when the calibrations say so, else ``None``."""
    if machine is None:
        return None
    facts, signs = [], set()
    if machine.speed is not None and machine.speed.significant:
        ratio = machine.speed.ratio
        signs.add(1 if ratio > 1 else -1)
        facts.append(f"the calibration workload ran {abs(ratio - 1) * 100:.0f}% {'slower' if ratio > 1 else 'faster'} "
                     f"(±{200 * machine.speed.sigma:.0f}%)")
    wait = machine.wait
    if wait is not None and wait.significant:
        signs.add(1 if wait.b_mean > wait.a_mean else -1)
        facts.append(f"the training thread waited for a CPU {wait.b_mean:.3f} ms per step (mean; A "
                     f"{wait.a_mean:.3f} ms)")
    if not facts:
        return None
    state = "slower" if signs == {1} else "faster" if signs == {-1} else "different"
    return (f"the machine was {state} during B: {' and '.join(facts)}; changes within that are not "
            "attributed to the code")
