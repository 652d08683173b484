"""The operators' side of ``opscope profile diff`` and its record of one phase or op, A
against B (:class:`Change`): the op a flagged phase is blamed on (:func:`causes`), and what
the ops say about a change the machine could explain: none moved, so the machine's
(:func:`no_op_moved`), or one moved beyond it, so the code's (:func:`op_beyond_machine`;
else its ops that the phase's wait could hold are the machine's too),
and the note that says which (:func:`explained_note`). The rules are in
:mod:`opscope.profile.diff`'s docstring and docs/profile.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opscope.profile.diff_machine import Machine, contention_ms


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
    wait_ms: float = 0.0  # part of delta_ms that was waiting for a CPU (judged changes only)
    speed_ms: float = 0.0  # part of delta_ms the calibration speed ratio accounts for
    contention_ms: float = 0.0  # what was left after both, within what sharing a CPU costs (explained only)
    explained_by_machine: bool = False  # beyond noise raw, not once the machine is taken out
    only_in: str = ""  # ops: "A" or "B" when it ran in every traced step of that run and none of the other

    @property
    def machine_ms(self) -> float:
        """Part of ``delta_ms`` the machine accounts for."""
        return round(self.wait_ms + self.speed_ms, 4)

    @property
    def direction(self) -> str:
        """``slower``, ``faster`` or ``same`` (same = not beyond noise)."""
        if not self.flagged:
            return "same"
        return "slower" if self.delta_ms > 0 else "faster"


def causes(phases: list[Change], ops: list[Change], floor: float) -> dict[str, Change]:
    """Per flagged phase, the op that moved the same way the most. The step's is taken among
    the ops of the phases that moved with it (when one did): an op beside the step, such as
    tf.data's producer thread waiting longer for a slower step, grew without being the cause."""
    flagged = [c for c in phases if c.flagged and c.kind == "phase"]
    named = {}
    for change in flagged:
        along = {change.phase}
        if change.phase == "step":
            along = {c.phase for c in flagged if c.phase != "step" and c.delta_ms * change.delta_ms > 0}
        same_way = [o for o in ops if (o.phase in along or not along) and o.delta_ms * change.delta_ms > 0]
        if same_way:  # an op that moved first: one the machine explains is no cause
            sign = 1 if change.delta_ms > 0 else -1
            named[change.name] = max(same_way, key=lambda o: (moved(o, sign, floor), abs(o.delta_ms)))
    return named


def no_op_moved(phases: Sequence[Change], ops: Sequence[Change], machine: Machine, floor: float) -> list[Change]:
    """Unflag a phase when the calibration speed ratio explains at least half of what is left
    of its change after the run-queue wait, and no operator of it moved: none changed beyond
    noise, and none above the floor ran in one run only (a machine makes ops slower, it does
    not add them; a few traced steps on a loaded machine can hide a new op in the noise)."""
    if machine.speed is None or not machine.speed.significant:
        return []
    unflagged = []
    for change in phases:
        sign = 1 if change.delta_ms > 0 else -1
        if not change.flagged or (machine.speed.ratio - 1) * sign <= 0:
            continue
        scope = [o for o in ops if change.phase == "step" or o.phase == change.phase]
        if not scope or any(moved(o, sign, floor) for o in scope):
            continue
        if change.speed_ms * sign >= (change.delta_ms - change.machine_ms) * sign:
            change.flagged, change.explained_by_machine = False, True
            unflagged.append(change)
    return unflagged


def op_beyond_machine(phases: Sequence[Change], ops: Sequence[Change], floor: float,
                       min_change: float, machine: Machine | None = None, step_ms: float = 0.0) -> list[str]:
    """Flag again a phase the machine explained when one of its ops changed the same way
    beyond its noise *after* the machine's correction, by enough to flag the phase alone.

    The phase's correction scales all of its time (a sleep, a wait on a device too) by the
    calibration ratio and widens its band by that ratio's uncertainty; an op's self time is
    the work the ratio is about, so an op that the machine does not explain is the code."""
    notes = []
    for change in phases:
        if not change.explained_by_machine or change.kind != "phase":
            continue
        sign = 1 if change.delta_ms > 0 else -1
        waited = change.wait_ms * sign > floor  # an op's wait is an estimate: the phase's whole wait bounds it
        enough = max(floor, min_change * abs(change.a_ms), contention_ms(machine, change.a_ms, step_ms, waited, sign))
        beyond = [((o.delta_ms - o.machine_ms - change.wait_ms) * sign, o) for o in ops
                  if o.flagged and (change.phase == "step" or o.phase == change.phase)]
        excess, op = max(beyond, key=lambda pair: pair[0], default=(0.0, None))
        if op is not None and excess >= enough:
            change.flagged, change.explained_by_machine = True, False
            notes.append(f"{change.name}: the machine explains up to {change.machine_ms:+.3f} ms by phase, but "
                         f"{op.name} in {op.phase} changed {sign * excess:+.3f} ms beyond what the "
                         "machine explains: attributed to the code")
        elif change.phase != "step":
            _held_by_the_wait(beyond, sign)
    return notes


def _held_by_the_wait(beyond: Sequence[tuple[float, Change]], sign: int) -> None:
    """Unflag the ops of a phase the machine explains whose change its measured wait could
    hold whole (``beyond``: each op with what it changed beyond the machine and the phase's
    wait). An op's own wait is an estimate (its share of the phase's), and one preemption
    lands in one op: under four busy loops a 3.6 ms aten::mm "took" 20.7 ms, the table called
    it slower while the headline said no phase changed."""
    for excess, op in beyond:
        if op.delta_ms * sign > 0 and excess <= op.noise_ms:
            op.flagged, op.explained_by_machine = False, True


def moved(op: Change, sign: int, floor: float) -> bool:
    if op.delta_ms * sign <= 0:
        return False
    return op.flagged or (op.only_in == ("B" if sign > 0 else "A") and abs(op.delta_ms) >= floor)


def explained_note(change: Change, none_moved: bool, ops: Sequence[Change], split: bool) -> str:
    word = "slower" if change.delta_ms > 0 else "faster"
    pct = f"{abs(change.relative) * 100:.0f}% " if change.relative is not None else ""
    text = f"{change.name} {pct}{word} ({change.delta_ms:+.3f} ms)"
    if none_moved:
        scope = "any phase" if change.name == "step" else change.name
        return (f"{text}: the machine speed explains at least half ({change.speed_ms:+.3f} ms) and no operator of "
                f"{scope} changed beyond noise: not attributed to the code")
    where = "" if change.name == "step" or split else " anywhere in the step"
    parts = [f"{label} {ms:+.3f} ms"
             for label, ms in ((f"waiting for a CPU{where}", change.wait_ms), ("machine speed", change.speed_ms),
                               ("running on a shared CPU up to", change.contention_ms)) if ms]
    text += f" is within what the machine explains ({', '.join(parts)}): not attributed to the code"
    moved = [o for o in ops if o.flagged and o.phase == change.name and o.delta_ms * change.delta_ms > 0]
    if moved and change.name != "step" and not split:
        text += (f" by phase, but its operator {moved[0].name} changed beyond noise ({moved[0].delta_ms:+.3f} ms); the "
                 "step's comparison is exact")
    return text
