"""``opscope profile diff A B``: per phase and per op, B against A, with noise bands.

For each phase (and the whole step) the values are the per-step times of the steady steps
of every rank; for each op, its self time per task-traced step in each phase. A change is
*flagged* only when the medians differ by more than the noise band, ``k`` standard errors
of the difference of the two medians (each 1.2533 x sigma / sqrt(n), sigma = 1.4826 x MAD
over steps), and by more than a relative floor (``min_change`` of A's median) and an
absolute floor (2% of A's median step time, at least 20 us). The band says the shift is
not chance; the floors say it matters.

Then the machine (:mod:`opscope.profile.calibration`, read by
:mod:`~opscope.profile.diff_machine`): a change that passes is judged a second time with
what the machine explains taken out, in the change's direction only, so the correction can
hide a change but never make one:

* the run-queue wait (time ready to run but without a CPU) is subtracted: from both runs'
  values where it is known for that value (the step; a phase, when it was split by phase,
  i.e. on the host clock), else from B's for a slowdown and from A's for a speed-up (a
  phase gets its whole step's wait: a bound); an op gets its phase's wait share of its
  own time (an estimate: the wait is not known per op);
* when the calibration workload ran significantly slower during B (faster, for a
  speed-up), B's times are divided by that ratio, and the band widens by its uncertainty.

A change flagged raw but not after this is *explained by the machine*. So is one the
calibration speed explains at least half of (after the wait), when no operator of that
phase (of any phase, for the step) changed beyond its noise: a machine that is slower for
the code than for the calibration workload. A phase explained so is flagged again when one
of its ops changed beyond noise after the same correction, by enough to flag the phase.
Profiles without a calibration (older opscope) are compared as before. What the ops say
(the cause named, a change no op shows) is in :mod:`~opscope.profile.diff_ops`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from opscope.profile.diff_machine import Machine, contention_ms, machine_headline, measure_machine, phase_waits
from opscope.profile.diff_ops import Change, causes, explained_note, no_op_moved, op_beyond_machine
from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.summary import MS, steady_steps

MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533  # standard error of a median, in sigma / sqrt(n), for normal noise
ABS_FLOOR_MS = 0.02
STEP_FLOOR = 0.02  # two runs of the same code drift by ~1% of the step on a shared machine

Shares = dict[tuple[int, int, str], float]


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
    machine: Machine | None = None

    @property
    def regressions(self) -> list[Change]:
        """Phases (and the whole step) that got slower beyond noise. Ops explain, they do not judge:
        a few task-traced steps are too few to call an op regression on their own."""
        return [c for c in self.phases if c.direction == "slower"]

    def __bool__(self) -> bool:
        return not self.regressions

    @property
    def findings(self) -> list[str]:
        """One sentence per finding: the machine, if it changed, then each flagged phase."""
        return headlines(self)

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "a": self.a,
            "b": self.b,
            "k": self.k,
            "min_change": self.min_change,
            "machine": None if self.machine is None else self.machine.to_json(),
            "phases": [_change_json(c) for c in self.phases],
            "ops": [_change_json(c) for c in self.ops],
            "causes": {p: c.name for p, c in self.causes.items()},
            "headlines": self.findings,
            "notes": self.notes,
        }


def _change_json(change: Change) -> dict[str, Any]:
    return asdict(change) | {"direction": change.direction, "machine_ms": change.machine_ms}


def compare_series(
    kind: str, name: str, phase: str, a: Sequence[float], b: Sequence[float], floor_ms: float, k: float,
    min_change: float, rel_sigma: float = 0.0
) -> Change:
    """Compare two series of per-step times (ms) with the noise rule of the module docstring;
    ``rel_sigma`` adds a relative uncertainty of B's median (the machine-speed ratio's)."""
    med_a = statistics.median(a) if a else 0.0
    med_b = statistics.median(b) if b else 0.0
    variance = (MEDIAN_SE**2 * (_sigma(a) ** 2 / max(len(a), 1) + _sigma(b) ** 2 / max(len(b), 1))
                + (med_b * rel_sigma) ** 2)
    noise = k * variance**0.5
    delta = med_b - med_a
    relative = delta / med_a if med_a > 0 else None
    beyond = abs(delta) > noise and abs(delta) >= floor_ms and (relative is None or abs(relative) >= min_change)
    flagged = bool(a) and bool(b) and beyond
    return Change(kind, name, phase, round(med_a, 4), round(med_b, 4), round(delta, 4),
                  None if relative is None else round(relative, 4), round(noise, 4), len(a), len(b), flagged)


def _sigma(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    median = statistics.median(values)
    return MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)


@dataclass
class _Judge:
    """Compares series raw, then with what the machine explains taken out."""

    machine: Machine | None
    floor: float
    step_ms: float  # A's median step
    k: float
    min_change: float

    def __call__(self, key: tuple[str, str, str], a: Sequence[float], b: Sequence[float],
                 waits: tuple[Sequence[float], Sequence[float]], exact: bool = False) -> Change:
        """``waits``: per step of A and of B, the run-queue wait to take out of that value."""
        raw = compare_series(*key, a, b, self.floor, self.k, self.min_change)
        machine = self.machine
        if not raw.flagged or machine is None or (machine.speed is None and machine.wait is None):
            return raw
        sign = 1 if raw.delta_ms > 0 else -1
        measured = machine.wait is not None
        a1 = _net(a, waits[0] if measured and (exact or sign < 0) else None)
        b1 = _net(b, waits[1] if measured and (exact or sign > 0) else None)
        factor = machine.speed.factor if machine.speed is not None else 1.0
        rescale = (factor - 1) * sign > 0  # only toward A: the machine can explain, not accuse
        b2 = [v / factor for v in b1] if rescale else b1
        after_wait = compare_series(*key, a1, b1, self.floor, self.k, self.min_change)
        after = compare_series(*key, a1, b2, self.floor, self.k, self.min_change,
                               machine.speed.sigma if rescale and machine.speed is not None else 0.0)
        raw.wait_ms = round(raw.delta_ms - after_wait.delta_ms, 4)
        raw.speed_ms = round(after_wait.delta_ms - after.delta_ms, 4)
        # A thread that waits for a CPU also runs slower once it has one (the other work
        # shares its caches and core, and it starts cold each time it is put back). Measured
        # under four busy loops on its CPU: 11-28% of a phase that waited, and 0.3-0.4 ms
        # of a 14 ms step in a 0.35 ms optimizer phase that did not (contention_ms).
        contention = contention_ms(machine, raw.a_ms, self.step_ms, raw.wait_ms * sign > 0, sign)
        if not (after.flagged and after.delta_ms * sign > contention):
            raw.flagged, raw.explained_by_machine = False, True
            if after.flagged:
                raw.contention_ms = round(sign * contention, 4)
        return raw


def _net(values: Sequence[float], waits: Sequence[float] | None) -> list[float]:
    if not waits:
        return list(values)
    return [max(0.0, v - w) for v, w in zip(values, waits, strict=True)]


def _phase_series(rows: Sequence[StepRow], phase: str) -> list[float]:
    if phase == "step":
        return [r.wall_ns / MS for r in rows]
    return [r.phases.get(phase, 0) / MS for r in rows]


def _op_series(ops: Iterable[OpRow]) -> tuple[dict[tuple[str, str], dict[tuple[int, int], float]],
                                              set[tuple[int, int]]]:
    """(phase, op) -> {(rank, step): self ms}, and every traced (rank, step)."""
    table: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    steps = set()
    for op in ops:
        key = (op.rank, op.step)
        steps.add(key)
        per_step = table.setdefault((op.phase, op.name), {})
        per_step[key] = per_step.get(key, 0.0) + op.self_us / 1000.0
    return table, steps


def diff(a: Any, b: Any, k: float = 3.0, min_change: float = 0.1, machine: bool = True) -> ProfileDiff:
    """Compare two loaded profiles (:class:`~opscope.profile.reader.ProfileData`);
    ``machine=False`` ignores their calibrations."""
    rows_a, rows_b = steady_steps(a.steps), steady_steps(b.steps)
    step_a = statistics.median([r.wall_ns / MS for r in rows_a]) if rows_a else 0.0
    floor = max(ABS_FLOOR_MS, STEP_FLOOR * step_a)
    notes = [f"{label} has {len(rows)} steady steps: too few to measure noise; record at least 5"
             for label, rows in (("A", rows_a), ("B", rows_b)) if len(rows) < 3]
    found = measure_machine(a, b, rows_a, rows_b, floor) if machine else None
    if found is not None and found.why_not:
        notes.append(f"{found.why_not}: a busier machine during one run is not told apart from slower code")
    judge = _Judge(found, floor, step_a, k, min_change)
    split = all(r.phase_waits is not None for r in (*rows_a, *rows_b))
    phases = [judge(("phase", p, p), _phase_series(rows_a, p), _phase_series(rows_b, p),
                    *phase_waits(rows_a, rows_b, p, split)) for p in ("step", *PHASES)]
    ops: list[Change] = []
    unmoved: list[Change] = []
    if a.ops and b.ops:
        ops = _diff_ops(a, b, judge)
        unmoved = no_op_moved(phases, ops, found, floor) if found is not None else []
        notes += op_beyond_machine(phases, ops, floor, min_change, found, step_a)
    else:
        missing = " and ".join(x for x, d in (("A", a), ("B", b)) if not d.ops)
        notes.append(f"{missing} has no task trace: op-level diff needs task_trace=True in both runs")
    notes += [explained_note(c, any(c is x for x in unmoved), ops, split) for c in phases
              if c.explained_by_machine]
    return ProfileDiff(a.path, b.path, phases, ops, causes(phases, ops, floor), notes, k, min_change, found)


def _diff_ops(a: Any, b: Any, judge: _Judge) -> list[Change]:
    table_a, steps_a = _op_series(a.ops)
    table_b, steps_b = _op_series(b.ops)
    order_a, order_b = sorted(steps_a), sorted(steps_b)
    share_a, share_b = _wait_share(a.steps), _wait_share(b.steps)
    changes = []
    for phase, name in sorted(set(table_a) | set(table_b)):
        series_a = [table_a.get((phase, name), {}).get(s, 0.0) for s in order_a]
        series_b = [table_b.get((phase, name), {}).get(s, 0.0) for s in order_b]
        waits = (_times(series_a, order_a, phase, share_a), _times(series_b, order_b, phase, share_b))
        change = judge(("op", name, phase), series_a, series_b, waits)
        change.only_in = _only_in(series_a, series_b)
        changes.append(change)
    changes.sort(key=lambda c: (not c.flagged, -abs(c.delta_ms)))
    return changes


def _only_in(a: Sequence[float], b: Sequence[float]) -> str:
    for label, here, there in (("A", a, b), ("B", b, a)):
        if here and there and all(v > 0 for v in here) and not any(there):
            return label
    return ""


def _wait_share(rows: Iterable[StepRow]) -> Shares:
    """Per task-traced (rank, step, phase): the share of its time spent waiting for a CPU
    (of the whole step's time where the wait is not split by phase).

    An op's part of that wait is estimated as the same share of its own time: the wait is
    not known per op, and taking the whole phase's wait out of every op would hide them all.
    """
    shares = {}
    for r in rows:
        if not r.task_trace or r.wall_ns <= 0:
            continue
        for phase in PHASES:
            if r.phase_waits is None:
                shares[(r.rank, r.step, phase)] = r.sched_wait_ns / r.wall_ns
            elif r.phases.get(phase, 0) > 0:
                shares[(r.rank, r.step, phase)] = r.phase_waits.get(phase, 0) / r.phases[phase]
    return shares


def _times(values: Sequence[float], steps: Sequence[tuple[int, int]], phase: str, share: Shares) -> list[float]:
    return [v * share.get((*s, phase), 0.0) for v, s in zip(values, steps, strict=True)]


def headlines(result: ProfileDiff) -> list[str]:
    """The machine, if it changed, then one sentence per flagged phase:
    "backward 18% slower (+3.2 ms, noise 0.4 ms), from aten::mm (+2.9 ms)"."""
    machine = machine_headline(result.machine)
    lines = [machine] if machine else []
    for change in (c for c in result.phases if c.flagged):
        pct = f"{abs(change.relative) * 100:.0f}% " if change.relative is not None else ""
        extra = (f"; up to {change.machine_ms:+.3f} ms of it is "
                 "the machine's") if machine and change.machine_ms * change.delta_ms > 0 else ""
        text = (f"{change.name} {pct}{change.direction} ({change.delta_ms:+.3f} ms, beyond noise of "
                f"{change.noise_ms:.3f} ms{extra})")
        cause = result.causes.get(change.name)
        if cause is not None:
            text += f", from {cause.name} in {cause.phase} ({cause.delta_ms:+.3f} ms)"
        lines.append(text)
    if len(lines) == (1 if machine else 0):
        explained = any(c.explained_by_machine for c in result.phases)
        lines.append("no phase changed beyond noise" + (" once the machine is taken into account" if explained else ""))
    return lines
