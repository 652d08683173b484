"""A verdict pass for activation checkpointing: a recomputation that remade its own forward
exactly inherits that forward's difference, it makes none of its own.

A recomputed call is judged against the other side's recomputation, or where the other side
did not checkpoint, against its forward of the same module
(:func:`opscope.compare.align._replay_pairs`). Where the forward already differs (a fault in
the block: the swapped activation), the recomputation differs the same way, with inputs that
agree as much as the forward's did: judged alone it is a second culprit for the same fault.
Where each side's recomputed output holds the very bytes its own forward call made (the same
content hash), the recomputations repeated their forwards faithfully: the call inherits. One
that did not (dropout drawn again from another generator state) stays the culprit it is.
"""

from __future__ import annotations

from opscope.compare.state import VerdictState, join
from opscope.model.recompute import Key, Row, forward_index, remakes


def repeats_its_forward(state: VerdictState) -> None:
    """Recomputed culprit calls whose outputs equal their own side's forward inherit."""
    forward: dict[str, dict[Key, Row]] | None = None  # per side, built at the first recomputed culprit
    for node in state.nodes:
        if node.verdict != "culprit" or not node.outputs or node.head.get("phase") != "recompute":
            continue
        if forward is None:
            forward = {side: forward_index(row for (s, *_), row in state.rows.items() if s == side)
                       for side in ("target", "reference")}
        measured = [pair.rows for pair in node.outputs if pair.metrics and pair.t is not None and pair.r is not None]
        if measured and all(_faithful(forward[side], row) for rows in measured
                            for side, row in zip(("target", "reference"), rows)):
            node.verdict = "inherits"
            for pair in node.outputs:
                if pair.verdict == "culprit":
                    pair.verdict = "inherits"
                    pair.note = join(pair.note, "recomputed exactly as its forward made it: the difference is "
                                                "that forward's")


def _faithful(forward: dict[Key, Row], row: Row) -> bool:
    """Does ``row`` hold what its side's forward call of the same op made (a forward row
    itself, the other side's of a recomputation on one side only, does)?"""
    return row.get("phase") != "recompute" or remakes(forward, row) is True
