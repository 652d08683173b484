"""A verdict pass for activation checkpointing: a recomputation that remade its own forward
exactly inherits that forward's difference, it makes none of its own.

A recomputed call on one side only is judged against the other side's forward of the same
module (:func:`opscope.compare.align._replay_pairs`). Where that forward already differs (a
fault in the block: the swapped activation), the recomputation differs the same way, with
inputs that agree as much as the forward's did: judged alone it is a second culprit for the
same fault. Where its outputs hold the very bytes its own side's forward made (the same
content hash), it repeated the forward faithfully: it inherits. One that did not (dropout
drawn again from another generator state) stays the culprit it is.
"""

from __future__ import annotations

from typing import Any

from opscope.compare.state import PAIRED, Node, VerdictState, join


def repeats_its_forward(state: VerdictState) -> None:
    """Recomputed culprit calls whose outputs equal their own side's forward inherit."""
    for node in state.nodes:
        if node.verdict != "culprit" or not node.outputs:
            continue
        if not all(p.kind in PAIRED and p.side for p in node.outputs):
            continue  # not a recomputation judged against the other side's forward
        if all(_same_as_forward(state, node, pair) for pair in node.outputs if pair.metrics):
            node.verdict = "inherits"
            for pair in node.outputs:
                if pair.verdict == "culprit":
                    pair.verdict = "inherits"
                    pair.note = join(pair.note, f"recomputed exactly as the {pair.side}'s forward made it: "
                                                f"the difference is that forward's")


def _same_as_forward(state: VerdictState, node: Node, pair: Any) -> bool:
    """Does the recomputed row of ``pair`` hold what its side's own forward call made?"""
    mine, theirs = (pair.t, pair.r) if pair.side == "target" else (pair.r, pair.t)
    other = "reference" if pair.side == "target" else "target"
    natural = state.entry.get((other, node.rank, node.step, theirs["id"]))  # the forward pair
    if natural is None or natural is pair or natural.kind not in PAIRED:
        return False
    forward = natural.t if pair.side == "target" else natural.r
    return (forward is not None and mine.get("hash") is not None and forward.get("hash") == mine.get("hash")
            and forward.get("numel") == mine.get("numel") and forward.get("dtype") == mine.get("dtype"))
