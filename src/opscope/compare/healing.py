"""One-sided ops whose difference the other side makes up for: no culprit.

An op that runs on one side only, where the other side's consumer reads the op's input
directly, is judged as an identity (:func:`opscope.compare.flow.inserted`): an inserted
``x * 0.5`` is then named. But the two sides may compute the same thing in another order.
PyTorch's math path of ``scaled_dot_product_attention`` (on CPU where the mask needs a
gradient: Swin's relative position bias) scales the query and the key by ``sqrt(scale)``
each, where the model's eager attention scales the product of the two. The scaling muls
run on one side only and change their input by design; the other side's extra mul after
the matmul makes the difference up, and the softmax reads the same scores on both sides.

This pass runs after :func:`opscope.compare.verdict.judge`: a culprit call whose culprit
outputs are all such identities is forgiven when every path from its outputs, followed
through the calls that read them on its side, reaches paired outputs that agree again (the
divergence it made is gone) within :data:`MAX_CALLS` calls. An inserted fault keeps its
divergence down to the loss and stays a culprit.
"""

from __future__ import annotations

from typing import Any

from opscope.compare.state import PAIRED, Node, VerdictState, join, raw_error

MAX_CALLS = 256  # calls followed from one culprit before it is kept as it is


def forgive_compensated(state: VerdictState) -> None:
    """Turn identity culprits whose divergence vanishes downstream into passed calls."""
    forgiven: set[int] = set()
    for node in state.nodes:
        if node.verdict != "culprit":
            continue
        culprits = [p for p in node.outputs if p.verdict == "culprit"]
        if not culprits or any(p.kind != "identity" for p in culprits):
            continue
        found = _healed_at(state, node)
        if found is None:
            continue
        where, carried = found
        node.verdict = ""
        for out in culprits:
            out.verdict, out.status = "", "passed"
            out.note = join(out.note, f"its difference is gone again at {where}: the other side "
                                      f"computes the same in another order")
        what = f"{node.head.get('op')} ({node.head.get('module') or 'top'})"
        for pair in carried:  # what only carried that difference on
            if pair.status == "failed" and pair.verdict != "culprit":
                pair.verdict, pair.status = "", "passed"
                pair.note = join(pair.note, f"carries the difference of {what}, made up at {where}")
        forgiven.add(node.rank)
    for rank in forgiven:
        _untaint(state, rank)


def _healed_at(state: VerdictState, node: Node) -> tuple[str, list[Any]] | None:
    """Where the divergence of ``node`` ends on every path (the first such call) and the
    pairs of the calls in between; None where it does not end."""
    side, rank, step = node.side, node.rank, node.step
    frontier = [p.home for p in node.outputs]
    seen: set[int] = set()
    first: str | None = None
    carried: list[Any] = []
    while frontier:
        row = frontier.pop()
        consumers = state.consumers.get((side, rank, step, row["id"]), [])
        if not consumers:
            return None  # the divergence reaches the end of the step on this path
        for consumer in consumers:
            seq = consumer["cseq"]
            if seq in seen:
                continue
            seen.add(seq)
            if len(seen) > MAX_CALLS:
                return None
            outputs = [r for r in state.calls.get((side, rank, step, seq), []) if r.get("io") == "output"]
            pairs = [state.entry.get((side, rank, step, r["id"])) for r in outputs]
            if outputs and all(_agrees(p) for p in pairs):
                first = first or f"{outputs[0].get('op')} ({outputs[0].get('module') or 'top'})"
                continue
            rows = state.calls.get((side, rank, step, seq), [])
            carried.extend(p for r in rows if (p := state.entry.get((side, rank, step, r["id"]))) is not None)
            frontier.extend(outputs)
    return None if first is None else (first, carried)


def _agrees(pair: Any) -> bool:
    """Paired, and the same values on both sides by the plain norm-wise error: not an output
    that passes only because the reference is near zero (a sum of a normalized tensor)."""
    if pair is None or pair.kind not in PAIRED or pair.status not in ("passed", "identical"):
        return False
    return pair.status == "identical" or raw_error(pair) <= pair.tolerance


def _untaint(state: VerdictState, rank: int) -> None:
    """The rank's step carries no divergence on when nothing in it is a culprit any more."""
    info = state.previous.get(rank)
    if info is None or info.get("tainted_before"):
        return
    if any(n.rank == rank and n.verdict == "culprit" for n in state.nodes) or \
            any(p.home.get("rank") == rank for p, _, _ in state.roots):
        return
    info["tainted"] = False
