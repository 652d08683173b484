"""Module-level dumps nest: a module's call brackets the calls of its submodules.

A module whose output differs because one of its submodules is a culprit (or carries a
divergence from an earlier step, such as parameters updated differently) is not itself the
cause: this pass turns such enclosing culprits into ``inherits``, naming the call they
contain. At aten and api level calls do not nest, and nothing changes.
"""

from __future__ import annotations

from opscope.compare.state import Node, VerdictState


def _inside(inner: str, outer: str) -> bool:
    return outer == "" and inner != "" or inner.startswith(outer + ".")


def _start(node: Node) -> int:
    return min((row.get("seq", node.seq) for row in node.rows), default=node.seq)


def demote_enclosing(state: VerdictState) -> None:
    """Culprit calls that contain a diverged call of a submodule inherit."""
    culprits = [n for n in state.nodes if n.verdict == "culprit"]
    diverged = [n for n in state.nodes if n.verdict in ("culprit", "inherits")]
    for outer in culprits:
        begin, module = _start(outer), outer.head.get("module") or ""
        phase = outer.head.get("phase")
        inner = next((n for n in diverged if n is not outer and n.side == outer.side and n.rank == outer.rank
                      and n.step == outer.step and n.head.get("phase") == phase
                      and begin < n.seq < outer.seq and _inside(n.head.get("module") or "", module)), None)
        if inner is None:
            continue
        outer.verdict = "inherits"
        what = f"contains {inner.verdict} call {inner.head.get('module')} / {inner.head.get('op')}"
        for out in outer.outputs:
            if out.verdict == "culprit":
                out.verdict = "inherits"
                out.note = f"{out.note}; {what}" if out.note else what

