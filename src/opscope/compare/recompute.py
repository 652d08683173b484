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

from typing import Any

from opscope.compare.state import VerdictState, join

Row = dict[str, Any]


def repeats_its_forward(state: VerdictState) -> None:
    """Recomputed culprit calls whose outputs equal their own side's forward inherit."""
    forward: dict[tuple[Any, ...], Row] | None = None  # built at the first recomputed culprit
    for node in state.nodes:
        if node.verdict != "culprit" or not node.outputs or node.head.get("phase") != "recompute":
            continue
        if forward is None:
            forward = {_key(side, row): row for (side, *_), row in state.rows.items() if row.get("phase") == "forward"}
        measured = [pair.rows for pair in node.outputs if pair.metrics and pair.t is not None and pair.r is not None]
        if measured and all(_faithful(forward, side, row) for rows in measured
                            for side, row in zip(("target", "reference"), rows)):
            node.verdict = "inherits"
            for pair in node.outputs:
                if pair.verdict == "culprit":
                    pair.verdict = "inherits"
                    pair.note = join(pair.note, "recomputed exactly as its forward made it: the difference is "
                                                "that forward's")


def _key(side: str, row: Row) -> tuple[Any, ...]:
    return (side, row["rank"], row["step"], row.get("module"), row.get("op"), row.get("call"), row.get("io"),
            row.get("slot"))


def _faithful(forward: dict[tuple[Any, ...], Row], side: str, row: Row) -> bool:
    """Does ``row`` hold what its side's forward call of the same op made (a forward row
    itself, the other side's of a recomputation on one side only, does)?"""
    if row.get("phase") != "recompute":
        return True
    made = forward.get(_key(side, row))
    return (made is not None and row.get("hash") is not None and made.get("hash") == row.get("hash")
            and made.get("numel") == row.get("numel") and made.get("dtype") == row.get("dtype"))
