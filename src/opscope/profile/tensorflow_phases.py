"""The TensorFlow training trace's marks as phase intervals: pure logic, no TensorFlow.

The marks are placed and read by :mod:`opscope.profile.tensorflow_marks`; one step's marks
come here as time-ordered ``(ns, slot)`` pairs and leave as the intervals that
:func:`opscope.profile.breakdown.breakdown` splits into exclusive phases.
"""

from __future__ import annotations

SLOTS = (
    "data_start",
    "data_end",
    "forward_start",
    "backward_start",
    "backward_end",
    "optimizer_start",
    "optimizer_end",
    "forward_end",
)
SLOT = {name: i for i, name in enumerate(SLOTS)}


def pair_marks(marks: list[tuple[int, int]], end: int) -> dict[str, list[tuple[int, int]]]:
    """Phase intervals from time-ordered ``(ns, slot)`` marks of one step.

    Forward runs from ``forward_start`` to ``backward_start`` (so it includes the loss), or
    to the last ``forward_end`` when there is no backward; the other phases run from their
    ``*_start`` to their ``*_end``. An end without a start is dropped.
    """
    out: dict[str, list[tuple[int, int]]] = {"data_wait": [], "forward": [], "backward": [], "optimizer": []}
    opened: dict[str, int] = {}
    forward_end: int | None = None
    for t, slot in marks:
        name = SLOTS[slot]
        if name == "forward_end":
            forward_end = t
            continue
        phase, edge = _PHASE_OF[name]
        if phase == "forward" and edge == "start":
            if "forward" in opened and forward_end is not None and forward_end > opened["forward"]:
                out["forward"].append((opened.pop("forward"), forward_end))
            opened.setdefault("forward", t)
            forward_end = None
            continue
        if name == "backward_start" and "forward" in opened:
            out["forward"].append((opened.pop("forward"), t))
        if edge == "start":
            opened[phase] = t
        elif phase in opened:
            out[phase].append((opened.pop(phase), t))
    if "forward" in opened:
        out["forward"].append(
            (opened["forward"], forward_end if forward_end is not None and forward_end > opened["forward"] else end)
        )
    return out


_PHASE_OF = {
    "data_start": ("data_wait", "start"),
    "data_end": ("data_wait", "end"),
    "forward_start": ("forward", "start"),
    "backward_start": ("backward", "start"),
    "backward_end": ("backward", "end"),
    "optimizer_start": ("optimizer", "start"),
    "optimizer_end": ("optimizer", "end"),
}
