"""Compiled graphs that no record of the other side stands for (a verdict pass's helper).

An inductor-compiled graph runs fused kernels: a dump records only its inputs and outputs, as
a call of ``compiled_graph_<n>``. Against an uncompiled run, a graph's outputs pair where an
op of both sides reads them; a graph whose outputs only another graph reads (a model's forward,
then its loss after a graph break) is not compared at all. When the later graph's output
differs, the difference may come from any graph of that chain: it is blamed on the first,
unless a weight that one of them reads already differs (a root).
"""

from __future__ import annotations

from typing import Any

from opscope.compare.align import INPUT_IO
from opscope.compare.state import PAIRED, Node, VerdictState
from opscope.compare.tolerance import epsilon, is_float

GRAPH_PREFIX = "compiled_graph_"


Chain = list[tuple[str, list[dict[str, Any]]]]


def has_graphs(state: VerdictState) -> bool:
    """Does any record of these partitions come from a compiled graph? (Else nothing here
    applies, and the per-call lookups are skipped.)"""
    if state.compiled is None:
        state.compiled = any(str(r.get("op") or "").startswith(GRAPH_PREFIX) for r in state.rows.values())
    return state.compiled


def graph_chain(state: VerdictState, node: Node) -> Chain:
    """(side, rows) of each uncompared compiled graph call whose outputs this call reads,
    directly or through another such graph, earliest first."""
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for side, rows in _call_rows(state, node):
        frontier = [rows]
        while frontier:
            for row in frontier.pop():
                made = _unpaired_graph_output(state, side, node, row)
                if made is not None and (side, made["cseq"]) not in found:
                    rows_of = state.calls[(side, node.rank, node.step, made["cseq"])]
                    found[(side, made["cseq"])] = rows_of
                    frontier.append(rows_of)
    return sorted(((side, rows) for (side, _), rows in found.items()),
                  key=lambda item: min(r["seq"] for r in item[1]))


def chain_tainted(state: VerdictState, node: Node, chain: Chain) -> bool:
    """Does a graph of the chain carry a divergence: an input (a weight that is a root, a
    value its maker passed on diverged) or an output compared and failed (a culprit there)?"""
    for side, rows in chain:
        for row in rows:
            keys = [row["id"]]
            if row.get("io") in INPUT_IO and row.get("producer") is not None:
                keys.append(row["producer"])  # what an input was made of, judged where it was made
            for key in keys:
                own = state.entry.get((side, node.rank, node.step, key))
                if own is not None and id(own) in state.tainted:
                    return True
    return False


def _call_rows(state: VerdictState, node: Node) -> list[tuple[str, list[dict[str, Any]]]]:
    """This call's rows on its own side, and its partner's on the other."""
    out = [(node.side, node.rows)]
    other = "reference" if node.side == "target" else "target"
    for pair in node.outputs:
        row = pair.r if other == "reference" else pair.t
        if row is not None and pair.kind in PAIRED:
            out.append((other, state.calls[(other, node.rank, node.step, row["cseq"])]))
            break
    return out


def _unpaired_graph_output(state: VerdictState, side: str, node: Node,
                           row: dict[str, Any]) -> dict[str, Any] | None:
    """The compiled graph's output row an unpaired input row reads, if no pair compared it."""
    if row.get("io") not in INPUT_IO or row.get("producer") is None:
        return None
    own = state.entry.get((side, node.rank, node.step, row["id"]))
    if own is not None and own.kind in PAIRED:
        return None
    made = state.rows.get((side, node.rank, node.step, row["producer"]))
    if made is None or not str(made.get("op") or "").startswith(GRAPH_PREFIX):
        return None
    entry = state.entry.get((side, node.rank, node.step, made["id"]))
    return None if entry is not None and entry.kind in PAIRED else made


def forward_tainted(state: VerdictState, node: Node, chain: Chain) -> bool:
    """A compiled graph's backward reads what its forward saved, which no record shows: did
    the forward of this call's graph, or of a graph of its chain (the same graph, this step),
    carry a divergence out, or read one?"""
    for side, call in _forwards(state, node, chain):
        for row in call:
            own = state.entry.get((side, node.rank, node.step, row["id"]))
            if own is not None and id(own) in state.tainted:
                return True
    return False


def _forwards(state: VerdictState, node: Node, chain: Chain) -> Chain:
    """(side, rows) of the forward calls of the compiled backward graphs of this call and its
    chain (the same graph name, this step); none, and nothing looked up, for other calls."""
    out: Chain = []
    for side, rows in [*_call_rows(state, node), *chain]:
        ops = {r.get("op") for r in rows if r.get("phase") == "backward"
               and str(r.get("op") or "").startswith(GRAPH_PREFIX)}
        if not ops:  # no compiled backward graph (the usual case)
            continue
        for (s, rank, step, _), call in state.calls.items():
            if (s, rank, step) == (side, node.rank, node.step) and call \
                    and call[0].get("phase") == "forward" and call[0].get("op") in ops:
                out.append((side, call))
    return out


def graph_floor(node: Node) -> float:
    """The smallest norm among a compiled graph call's own float inputs (0 for other calls);
    a backward graph's gradient in counts whatever its size (the loss's seed, 1.0).

    A graph's inputs rarely pair (what reads them on the other side is many ops), yet a
    gradient that cancels to nearly zero inside it (a key bias's, a batch norm's) must be
    judged against what it was summed from, as an op's output is against its inputs."""
    rows = node.rows
    if not rows or not str(rows[0].get("op") or "").startswith(GRAPH_PREFIX):
        return 0.0
    norms = [float(r["norm"]) for r in rows if r.get("io") in INPUT_IO
             and ((r.get("numel") or 0) > 1 or r.get("arg") == "grad_output")  # the loss's seed counts
             and str(r.get("dtype") or "").startswith(("float", "bfloat")) and r.get("norm")
             and 0 < float(r["norm"]) < float("inf")]
    return min(norms) if norms else 0.0


def graph_dtype(state: VerdictState, node: Node, chain: Chain) -> str | None:
    """The lowest float precision a compiled graph of this call (or of its chain) holds.

    A graph computes out of sight: under autocast its float32 outputs were made in bf16,
    which only the dtypes of what it saves for backward (its other outputs) still show."""
    calls = [*_call_rows(state, node), *chain]
    if not any(str(r.get("op") or "").startswith(GRAPH_PREFIX) for _, rows in calls for r in rows):
        return None
    calls += _forwards(state, node, chain)  # a backward graph computes in its forward's precision
    lowest: str | None = None
    for _, rows in calls:
        for row in rows:
            dtype = row.get("dtype")
            if is_float(dtype) and (lowest is None or epsilon(dtype) > epsilon(lowest)):
                lowest = str(dtype)
    return lowest
