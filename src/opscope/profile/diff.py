"""``opscope profile diff A B``: per phase and per op, B against A, with noise bands.

For each phase (and the whole step) the values are the per-step times of the steady steps
of every rank; for each op, its self time per task-traced step in each phase. A change is
*flagged* only when the medians differ by more than the noise band, ``k`` standard errors
of the difference of the two medians (each 1.2533 x sigma / sqrt(n), sigma = 1.4826 x MAD
over steps), and by more than a relative floor (``min_change`` of A's median) and an
absolute floor (2% of A's median step time, at least 20 us). The band says the shift is
not chance; the floors say it matters and absorb the few percent two runs of the same code
drift apart on a shared machine.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.summary import MS, steady_steps

MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533  # standard error of a median, in sigma / sqrt(n), for normal noise
ABS_FLOOR_MS = 0.02
STEP_FLOOR = 0.02  # two runs of the same code drift by ~1% of the step on a shared machine


@dataclass
class Change:
    """One phase or op, A against B (times in ms)."""

    kind: str
    name: str
    phase: str
    a_ms: float
    b_ms: float
    delta_ms: float
    relative: float | None
    noise_ms: float
    a_n: int
    b_n: int
    flagged: bool

    @property
    def direction(self) -> str:
        """``slower``, ``faster`` or ``same`` (same = not beyond noise)."""
        if not self.flagged:
            return "same"
        return "slower" if self.delta_ms > 0 else "faster"


@dataclass
class ProfileDiff:
    """Result of :func:`diff`. Truthy when nothing got slower beyond noise."""

    a: str
    b: str
    phases: list[Change]
    ops: list[Change]
    causes: dict[str, Change] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    k: float = 3.0
    min_change: float = 0.1

    @property
    def regressions(self) -> list[Change]:
        """Phases (and the whole step) that got slower beyond noise. Ops explain, they do not judge:
        a few task-traced steps are too few to call an op regression on their own."""
        return [c for c in self.phases if c.direction == "slower"]

    def __bool__(self) -> bool:
        return not self.regressions

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "a": self.a,
            "b": self.b,
            "k": self.k,
            "min_change": self.min_change,
            "phases": [asdict(c) | {"direction": c.direction} for c in self.phases],
            "ops": [asdict(c) | {"direction": c.direction} for c in self.ops],
            "causes": {p: c.name for p, c in self.causes.items()},
            "headlines": headlines(self),
            "notes": self.notes,
        }


def compare_series(kind: str, name: str, phase: str, a: Sequence[float], b: Sequence[float], floor_ms: float, k: float, min_change: float) -> Change:
    """Compare two series of per-step times (ms) with the noise rule of the module docstring."""
    med_a = statistics.median(a) if a else 0.0
    med_b = statistics.median(b) if b else 0.0
    noise = k * MEDIAN_SE * ((_sigma(a) ** 2 / max(len(a), 1) + _sigma(b) ** 2 / max(len(b), 1)) ** 0.5)
    delta = med_b - med_a
    relative = delta / med_a if med_a > 0 else None
    beyond = abs(delta) > noise and abs(delta) >= floor_ms and (relative is None or abs(relative) >= min_change)
    flagged = bool(a) and bool(b) and beyond
    return Change(kind, name, phase, round(med_a, 4), round(med_b, 4), round(delta, 4), None if relative is None else round(relative, 4), round(noise, 4), len(a), len(b), flagged)


def _sigma(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    median = statistics.median(values)
    return MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)


def _phase_series(rows: Sequence[StepRow], phase: str) -> list[float]:
    if phase == "step":
        return [r.wall_ns / MS for r in rows]
    return [r.phases.get(phase, 0) / MS for r in rows]


def _op_series(ops: Iterable[OpRow]) -> tuple[dict[tuple[str, str], dict[tuple[int, int], float]], set[tuple[int, int]]]:
    """(phase, op) -> {(rank, step): self ms}, and every traced (rank, step)."""
    table: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    steps = set()
    for op in ops:
        key = (op.rank, op.step)
        steps.add(key)
        per_step = table.setdefault((op.phase, op.name), {})
        per_step[key] = per_step.get(key, 0.0) + op.self_us / 1000.0
    return table, steps


def diff(a: Any, b: Any, k: float = 3.0, min_change: float = 0.1) -> ProfileDiff:
    """Compare two loaded profiles (:class:`~opscope.profile.reader.ProfileData`)."""
    rows_a, rows_b = steady_steps(a.steps), steady_steps(b.steps)
    step_a = statistics.median([r.wall_ns / MS for r in rows_a]) if rows_a else 0.0
    floor = max(ABS_FLOOR_MS, STEP_FLOOR * step_a)
    notes = []
    for label, rows in (("A", rows_a), ("B", rows_b)):
        if len(rows) < 3:
            notes.append(f"{label} has {len(rows)} steady steps: too few to measure noise; record at least 5")
    phases = [compare_series("phase", p, p, _phase_series(rows_a, p), _phase_series(rows_b, p), floor, k, min_change) for p in ("step", *PHASES)]
    ops: list[Change] = []
    if a.ops and b.ops:
        ops = _diff_ops(a.ops, b.ops, floor, k, min_change)
    else:
        missing = " and ".join(x for x, d in (("A", a), ("B", b)) if not d.ops)
        notes.append(f"{missing} has no task trace: op-level diff needs task_trace=True in both runs")
    causes = {}
    for change in phases:
        if change.flagged and change.kind == "phase":
            same_way = [o for o in ops if (o.phase == change.phase or change.phase == "step") and o.delta_ms * change.delta_ms > 0]
            if same_way:
                causes[change.name] = max(same_way, key=lambda o: abs(o.delta_ms))
    return ProfileDiff(a.path, b.path, phases, ops, causes, notes, k, min_change)


def _diff_ops(ops_a: Sequence[OpRow], ops_b: Sequence[OpRow], floor: float, k: float, min_change: float) -> list[Change]:
    table_a, steps_a = _op_series(ops_a)
    table_b, steps_b = _op_series(ops_b)
    changes = []
    for phase, name in sorted(set(table_a) | set(table_b)):
        series_a = [table_a.get((phase, name), {}).get(s, 0.0) for s in sorted(steps_a)]
        series_b = [table_b.get((phase, name), {}).get(s, 0.0) for s in sorted(steps_b)]
        changes.append(compare_series("op", name, phase, series_a, series_b, floor, k, min_change))
    changes.sort(key=lambda c: (not c.flagged, -abs(c.delta_ms)))
    return changes


def headlines(result: ProfileDiff) -> list[str]:
    """One sentence per flagged phase: "backward 18% slower (+3.2 ms, noise 0.4 ms), from aten::mm (+2.9 ms)"."""
    lines = []
    for change in result.phases:
        if not change.flagged:
            continue
        pct = f"{abs(change.relative) * 100:.0f}% " if change.relative is not None else ""
        text = f"{change.name} {pct}{change.direction} ({change.delta_ms:+.3f} ms, beyond noise of {change.noise_ms:.3f} ms)"
        cause = result.causes.get(change.name)
        if cause is not None:
            text += f", from {cause.name} in {cause.phase} ({cause.delta_ms:+.3f} ms)"
        lines.append(text)
    if not lines:
        lines.append("no phase changed beyond noise")
    return lines
