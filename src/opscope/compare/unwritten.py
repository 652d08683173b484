"""Optimizer state that a step the scaler skipped left holding no data.

An optimizer that makes its state with ``torch.empty_like`` relies on its first update to fill
it. ``SGD(fused=True)`` does so for its momentum buffers (torch 2.13): the fused kernel copies
the first gradients into them. When GradScaler skips that first step (Inf/NaN gradients under
float16's loss scale), the kernel runs with ``found_inf`` set and writes nothing, and the next
step's update reads the buffers as ``empty_like`` left them: bytes no op wrote, which may hold
anything (1e28, NaN). The run trains to a NaN loss a step or two later.

The capture records such state, as the optimizer op begins, as memory that holds no data
(model/records.py ``UNINITIALIZED_NOTE``). :class:`Unwritten` follows one side's optimizer ops
through the steps: an input of an optimizer op that held no data in a step the scaler skipped
still holds none when the same op (by name, call and argument slot) reads it in a later step.
The first later step the scaler does not skip updates from it: its read gets ``unwritten``
(the skipped step), and the verdict names it a root (:func:`unwritten_read`): no run can agree
with memory nobody wrote. (A step skipped again reads it too, as the capture sees it, but the
kernel returns before using it.)
"""

from __future__ import annotations

from typing import Any

from opscope.compare.pair import INPUT_IO
from opscope.model.records import UNINITIALIZED_NOTE

Row = dict[str, Any]
Slot = tuple[Any, Any, Any]  # (op, call, slot)


def _slot(row: Row) -> Slot:
    return row.get("op"), row.get("call"), row.get("slot")


def _optimizer_inputs(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.get("phase") == "optimizer" and r.get("io") in INPUT_IO]


class Unwritten:
    """One comparison's optimizer state left unwritten by skipped steps, per (side, rank)."""

    def __init__(self) -> None:
        self.marks: dict[tuple[str, int], dict[Slot, int]] = {}  # -> {(op, call, slot): skipped step}
        self.last: dict[tuple[str, int], int] = {}  # the step whose marks these are

    def read(self, side: str, rank: int, rows: list[Row], step: int, skipped: bool) -> None:
        """Mark the reads of ``rows`` (one side's (rank, step), in step order) that find memory a
        skipped step left holding no data; ``skipped``: the scaler skipped this step too. Only
        the next step's: a step the dump left out may have filled it."""
        marks = self.marks.pop((side, rank), {}) if self.last.get((side, rank)) == step - 1 else {}
        self.last[(side, rank)] = step
        inputs = _optimizer_inputs(rows)
        if not skipped:  # the update ran, on what it read, and has written it
            for row in inputs if marks else ():
                made = marks.get(_slot(row))
                if made is not None and row.get("producer") is None and row.get("note") != UNINITIALIZED_NOTE:
                    row["unwritten"] = made
            return
        for row in inputs:
            if row.get("note") == UNINITIALIZED_NOTE:
                marks.setdefault(_slot(row), step)
        if marks:
            self.marks[(side, rank)] = marks


def unwritten_read(t: Row, r: Row) -> str | None:
    """Why a first read of optimizer state is a root: on one side (or both) it reads memory no
    op wrote (:class:`Unwritten`); None otherwise."""
    sides = [(side, row) for side, row in (("target", t), ("reference", r)) if row.get("unwritten") is not None]
    if not sides:
        return None
    who = " and the ".join(side for side, _ in sides)
    step = sides[0][1]["unwritten"]
    return (f"is, in the {who}, memory no op wrote: it held no data (torch.empty_like) when the "
            f"update of step {step} began, GradScaler skipped that update (Inf/NaN gradients) and "
            "nothing filled it since, so the optimizer read uninitialized bytes (an optimizer whose "
            "first update fills its state: SGD(fused=True)'s momentum buffers). Give GradScaler a "
            "lower init_scale, or use an optimizer that is not fused")
