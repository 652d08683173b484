"""The TensorFlow profile's step table: finished calls of a train step wait here for the next
read of the graph marks (:data:`~opscope.profile.tensorflow_marks.READ_EVERY` steps), then
become rows, one per batch of a call that ran several (Keras ``steps_per_execution``), and
the trace spans of the chosen steps.

Steps are numbered as batches: a call's rows take the numbers after the rows before it, so
the step clock's count (one per call) is shifted by :attr:`StepTable.extra`, the batches
that calls split before the pending ones added (less the pieces that were no step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opscope.config.values import StepSelection
from opscope.profile.breakdown import breakdown
from opscope.profile.chrome_trace import TID_PHASES, TID_STEPS, span
from opscope.profile.model import PRIORITY, StepRow
from opscope.profile.session import MAX_SPAN_STEPS
from opscope.profile.tensorflow_marks import SPE_NO_MARKS, SPE_NOTE
from opscope.profile.tensorflow_phases import Intervals, StepWindow, per_batch_runs, phases_in, split_batches


@dataclass
class Pending:
    """A finished step (one call of the train function) waiting for the next read of the marks."""

    step: int  # the step clock's count
    start: int
    end: int
    host: list[tuple[int, int]]  # eager marks (ns, slot)
    traced: bool
    complete: bool
    wait: int
    spe: int = 1  # batches the call ran, at most (Keras steps_per_execution)


class StepTable:
    """Rows and spans of one rank's profile.

    Args:
        rank: this process's rank.
        steps: the steps whose spans go to the trace (``config.steps``).
        split: whether calls of several batches are split (needs the training trace).
        note: says a warning once (a call whose batches could not be told apart).
    """

    def __init__(self, rank: int, steps: StepSelection, split: bool, note: Callable[[str], None]) -> None:
        self.rank, self.steps, self.split, self.note = rank, steps, split, note
        self.origin = 0  # host ns of the session's start (set when it starts)
        self.rows: list[StepRow] = []
        self.pending: list[Pending] = []
        self.spans: list[tuple[int, bool, int, int, Intervals]] = []
        self.extra = 0
        self.per_batch: int | None = None  # optimizer runs per batch, once seen
        self.marked = False  # some forward, backward or optimizer time was seen

    def first_batch(self, step: int) -> int:
        """The step number the call ``step`` (of the step clock) gives its first batch."""
        return step + self.extra + sum(p.spe - 1 for p in self.pending)

    def skip(self) -> None:
        """The piece that just ended was no step (fit's validation): its number goes to the next
        batch. Call after :meth:`resolve`, with nothing pending."""
        self.extra -= 1

    def resolve(self, marks: list[tuple[int, int]]) -> list[StepWindow]:
        """Every pending call as its rows, from the graph marks ``(host ns, slot)`` of one read;
        returns the last call's ``(step, start, end, intervals)``."""
        windows: list[StepWindow] = []
        for p in self.pending:
            intervals = phases_in(p.start, p.end, marks + p.host)
            self.marked = self.marked or any(intervals[k] for k in ("forward", "backward", "optimizer"))
            parts = self._batches(p, intervals)
            windows = [(p.step + self.extra + i, lo, hi, phases) for i, (lo, hi, phases) in enumerate(parts)]
            self.extra += len(parts) - 1
            for window in windows:
                self._add_row(p, *window)
        self.pending.clear()
        return windows

    def _batches(self, p: Pending, intervals: Intervals) -> list[tuple[int, int, Intervals]]:
        """A call of fit's train function that ran several batches: one window per batch."""
        if p.spe < 2 or not self.split:
            return [(p.start, p.end, intervals)]
        per_batch = per_batch_runs(len(intervals["optimizer"]), p.spe, self.per_batch)
        if per_batch is None or not intervals["optimizer"]:
            self.note(SPE_NOTE.format(spe=p.spe, why=SPE_NO_MARKS))
            return [(p.start, p.end, intervals)]
        self.per_batch = per_batch
        return split_batches(p.start, p.end, intervals, per_batch)

    def _add_row(self, p: Pending, step: int, start: int, end: int, intervals: Intervals) -> None:
        phases, _, _ = breakdown(start, end, intervals)
        wait = p.wait * (end - start) // max(1, p.end - p.start)  # a call's wait, shared by its batches
        self.rows.append(
            StepRow(self.rank, step, start - self.origin, end - start, phases, 0, 0, p.traced, p.complete, wait)
        )
        if (p.traced or step in self.steps) and len(self.spans) < MAX_SPAN_STEPS:
            self.spans.append((step, p.complete, start, end, intervals))

    def write_spans(self, trace: Any) -> None:
        """The buffered steps and their phase intervals as spans of ``trace`` (a TraceWriter)."""
        origin, rank = self.origin, self.rank
        for step, complete, start, end, phases in self.spans:
            label = f"step {step}" + ("" if complete else " (raised)")
            trace.event(span(label, rank, TID_STEPS, (start - origin) / 1000, (end - start) / 1000, {"step": step}))
            for phase in PRIORITY:
                for lo, hi in phases.get(phase, ()):
                    trace.event(span(phase, rank, TID_PHASES, (lo - origin) / 1000, (hi - lo) / 1000, {"step": step}))
        self.spans.clear()
