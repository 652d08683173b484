"""Optimizer state a skipped step left holding no data (opscope.compare.unwritten), on rows as
compare reads them: the read that finds it is the next step's, where that step's update ran."""

from __future__ import annotations

from typing import Any

from opscope.compare.unwritten import Unwritten, unwritten_read
from opscope.model.records import UNINITIALIZED_NOTE


def _rows(made_empty: bool) -> list[dict[str, Any]]:
    """One fused SGD call: a parameter, its gradient, its momentum buffer (slot 2)."""
    buffer = {"note": UNINITIALIZED_NOTE} if made_empty else {}
    return [{"phase": "optimizer", "op": "aten._fused_sgd_.default", "call": 0, "io": io, "slot": slot,
             "producer": None, **(buffer if slot == 2 else {})}
            for io, slot in (("param", 0), ("input", 1), ("input", 2))]


def _marked(rows: list[dict[str, Any]]) -> list[Any]:
    return [row.get("unwritten") for row in rows]


def test_the_first_update_that_runs_after_a_skip_reads_it() -> None:
    seen = Unwritten()
    first = _rows(made_empty=True)
    seen.read("target", 0, first, 0, skipped=True)
    assert _marked(first) == [None, None, None]  # (its own read is recorded as holding no data)
    again, ran, later = _rows(False), _rows(False), _rows(False)
    seen.read("target", 0, again, 1, skipped=True)  # the kernel returned before reading it
    seen.read("target", 0, ran, 2, skipped=False)
    seen.read("target", 0, later, 3, skipped=False)  # the update of step 2 wrote it
    assert (_marked(again), _marked(ran), _marked(later)) == ([None] * 3, [None, None, 0], [None] * 3)


def test_a_step_the_dump_left_out_may_have_filled_it() -> None:
    seen = Unwritten()
    seen.read("target", 0, _rows(made_empty=True), 0, skipped=True)
    after_gap = _rows(False)
    seen.read("target", 0, after_gap, 5, skipped=False)
    assert _marked(after_gap) == [None] * 3


def test_an_update_that_ran_fills_it_and_sides_and_ranks_are_apart() -> None:
    seen = Unwritten()
    seen.read("target", 0, _rows(made_empty=True), 0, skipped=False)  # the reference run's first step
    seen.read("target", 1, _rows(made_empty=True), 0, skipped=True)
    own, other_rank, other_side = _rows(False), _rows(False), _rows(False)
    seen.read("target", 0, own, 1, skipped=False)
    seen.read("target", 1, other_rank, 1, skipped=False)
    seen.read("reference", 1, other_side, 1, skipped=False)
    assert (_marked(own), _marked(other_rank), _marked(other_side)) == ([None] * 3, [None, None, 0], [None] * 3)


def test_the_reason_names_the_side_and_the_skipped_step() -> None:
    read = {"unwritten": 3}
    assert unwritten_read({}, {}) is None
    assert unwritten_read(read, {}).startswith("is, in the target, memory no op wrote")
    assert "in the target and the reference" in unwritten_read(read, read)
    assert "update of step 3 began" in unwritten_read({}, read)
