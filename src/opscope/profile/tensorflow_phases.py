"""The TensorFlow training trace's marks as phase intervals: pure logic, no TensorFlow.

The marks are placed and read by :mod:`opscope.profile.tensorflow_marks`; one step's marks
come here as time-ordered ``(ns, slot)`` pairs and leave as the intervals that
:func:`opscope.profile.breakdown.breakdown` splits into exclusive phases.
"""

from __future__ import annotations

import bisect

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


def phases_in(start: int, end: int, marks: list[tuple[int, int]]) -> dict[str, list[tuple[int, int]]]:
    """Phase intervals of the step ``[start, end]`` from marks ``(ns, slot)`` of any steps:
    those inside it (to the graph clock's microsecond) are paired."""
    inside = sorted((min(max(t, start), end), s) for t, s in marks if start - 2_000 <= t <= end + 2_000)
    return pair_marks(inside, end)


_PHASE_OF = {
    "data_start": ("data_wait", "start"),
    "data_end": ("data_wait", "end"),
    "forward_start": ("forward", "start"),
    "backward_start": ("backward", "start"),
    "backward_end": ("backward", "end"),
    "optimizer_start": ("optimizer", "start"),
    "optimizer_end": ("optimizer", "end"),
}


Intervals = dict[str, list[tuple[int, int]]]
Window = tuple[int, int, Intervals]  # start ns, end ns, phase intervals
StepWindow = tuple[int, int, int, Intervals]  # the same with its step number first


def split_batches(start: int, end: int, intervals: Intervals, per_batch: int = 1) -> list[Window]:
    """One call of a train function that ran several batches (Keras ``steps_per_execution``)
    as one window per batch: ``(start, end, intervals)``.

    A batch ends at the end of its last optimizer run (``per_batch`` runs a batch: two for a
    step that applies two optimizers); the first batch starts at the call's start, the last
    ends at its end. An interval goes to the batch its end falls in, cut to it; a data wait
    goes to the batch that consumed it (the first whose forward starts after the wait's
    end), cut to that batch's start: the loop fetches the next batch while the current one
    computes, and only what is left of that fetch once the current batch is done is a wait.
    With fewer than two batches the call is one window.
    """
    ends = sorted(hi for _, hi in intervals.get("optimizer", ()))
    cuts = ends[per_batch - 1 :: per_batch][:-1]
    if not cuts:
        return [(start, end, intervals)]
    edges = [start, *cuts, end]
    windows: list[Window] = [(lo, hi, {k: [] for k in intervals}) for lo, hi in zip(edges, edges[1:])]
    forward_starts = sorted(lo for lo, _ in intervals.get("forward", ()))
    for phase, spans in intervals.items():
        for lo, hi in spans:
            at = hi
            if phase == "data_wait":
                consumer = bisect.bisect_left(forward_starts, hi)
                at = forward_starts[consumer] if consumer < len(forward_starts) else end
            w0, w1, out = windows[bisect.bisect_left(cuts, at)]
            lo, hi = max(lo, w0), min(hi, w1)
            if hi > lo:
                out[phase].append((lo, hi))
    return windows


def per_batch_runs(runs: int, batches: int, known: int | None) -> int | None:
    """Optimizer runs per batch in a call of ``batches`` batches (at most: an epoch's last call
    runs fewer) that made ``runs`` optimizer runs; ``known``: the number found in an earlier
    call. None when neither fits."""
    if runs and runs % batches == 0:
        return runs // batches
    if known and runs % known == 0:
        return known
    return 1 if runs < batches else None
