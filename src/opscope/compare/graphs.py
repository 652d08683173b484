"""Compiled graphs that no record of the other side stands for (a verdict pass's helper).

An inductor-compiled graph runs fused kernels: a dump records only its inputs and outputs, as
a call of ``compiled_graph_<n>``. Against an uncompiled run, a graph's outputs pair where an
op of both sides reads them; a graph whose outputs only another graph reads (a model's forward,
then its loss after a graph break) is not compared at all. When the later graph's output
differs, the difference may come from any graph of that chain: it is blamed on the first,
unless a weight that one of them reads already differs (a root).
"""

from __future__ import annotations

import math
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
        state.compiled = any(_is_graph(r) for r in state.rows.values())
    return state.compiled


def graph_chain(state: VerdictState, node: Node, calls: Chain) -> Chain:
    """(side, rows) of each uncompared compiled graph call whose outputs this call (its
    ``calls``: :func:`call_rows`) reads, directly or through another such graph, earliest first."""
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for side, rows in calls:
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


def call_rows(state: VerdictState, node: Node) -> Chain:
    """This call's rows on its own side, and its partner's on the other."""
    out = [(node.side, node.rows)]
    other = "reference" if node.side == "target" else "target"
    for pair in node.outputs:
        row = pair.r if other == "reference" else pair.t
        if row is not None and pair.kind in PAIRED:
            out.append((other, state.calls[(other, node.rank, node.step, row["cseq"])]))
            break
    return out


def forwards(state: VerdictState, node: Node, calls: Chain) -> Chain:
    """(side, rows) of the forward calls of the compiled backward graphs among ``calls`` (the
    same graph name, this step): a backward graph reads what its forward saved, which no
    record shows. Nothing is looked up where no call is a backward graph (the usual case)."""
    out: Chain = []
    for side, rows in calls:
        ops = {r.get("op") for r in rows if r.get("phase") == "backward" and _is_graph(r)}
        if not ops:
            continue
        for (s, rank, step, _), call in state.calls.items():
            if (s, rank, step) == (side, node.rank, node.step) and call \
                    and call[0].get("phase") == "forward" and call[0].get("op") in ops:
                out.append((side, call))
    return out


def carries_divergence(state: VerdictState, node: Node, calls: Chain) -> bool:
    """Does one of these graph calls carry a divergence: a row judged failed (a weight that
    is a root, an output a culprit made) or an input whose maker passed one on?"""
    for side, rows in calls:
        for row in rows:
            keys = [row["id"]]
            if row.get("io") in INPUT_IO and row.get("producer") is not None:
                keys.append(row["producer"])  # what an input was made of, judged where it was made
            for key in keys:
                own = state.entry.get((side, node.rank, node.step, key))
                if own is not None and id(own) in state.tainted:
                    return True
    return False


def is_graph_call(node: Node) -> bool:
    """Is this call a compiled graph (``compiled_graph_<n>``)?"""
    return bool(node.rows) and _is_graph(node.rows[0])


def graph_floor(node: Node) -> float:
    """The smallest norm among a compiled graph call's own float inputs (0 for other calls);
    a backward graph's gradient in counts whatever its size (the loss's seed, 1.0).

    A graph's inputs rarely pair (what reads them on the other side is many ops), yet a
    gradient that cancels to nearly zero inside it (a key bias's, a batch norm's) must be
    judged against what it was summed from, as an op's output is against its inputs."""
    rows = node.rows
    if not rows or not _is_graph(rows[0]):
        return 0.0
    return _floor(rows)


def partner_graph_floor(calls: Chain) -> float:
    """:func:`graph_floor` of the other side's call (``calls[1:]``, :func:`call_rows`) where that
    is a compiled graph and this call is an op: the eager run as the target, the compiled one
    as the reference. A gradient that cancels to nearly zero (a key bias's) is judged against
    what the graph summed it from, whichever side the graph ran on."""
    return max((_floor(rows) for _, rows in calls[1:] if rows and _is_graph(rows[0])), default=0.0)


def made_floor(state: VerdictState, side: str, rank: int, step: int, row: dict[str, Any]) -> float:
    """The floor (:func:`graph_floor`) of the compiled graph of this step whose output holds
    this leaf row's bytes, 0 where none does: a gradient the optimizer reads that a backward
    graph made, which AccumulateGrad took without a link (module level under inductor,
    where no module's hook runs inside the graph). Judged against that floor, a gradient that
    is zero in truth (a key bias's) is the noise it is, as the graph's output would be."""
    key = (side, rank, step)
    index = state.indexes.get(("graph outputs", side, rank, step))
    if index is None:
        index = state.indexes[("graph outputs", side, rank, step)] = {}
        for r in state.ordered.get(key, []):
            if r.get("io") == "output" and _is_graph(r) and r.get("hash") is not None:
                calls = state.calls.get((side, rank, step, r["cseq"]), [])
                index[(r["hash"], r.get("numel"))] = _floor(calls)
    return index.get((row.get("hash"), row.get("numel")), 0.0)


def _floor(rows: list[dict[str, Any]]) -> float:
    norms = [float(r["norm"]) for r in rows if r.get("io") in INPUT_IO
             and ((r.get("numel") or 0) > 1 or r.get("arg") == "grad_output")  # the loss's seed counts
             and is_float(r.get("dtype")) and r.get("norm") and 0 < float(r["norm"]) < math.inf]
    return min(norms) if norms else 0.0


def graph_dtype(calls: Chain) -> str | None:
    """The lowest float precision these calls hold, where one of them is a compiled graph.

    A graph computes out of sight: under autocast its float32 outputs were made in bf16,
    which only the dtypes of what it saves for backward (its other outputs) still show; a
    backward graph computes in its forward's precision (pass its forward among ``calls``)."""
    if not any(_is_graph(r) for _, rows in calls for r in rows):
        return None
    lowest: str | None = None
    for _, rows in calls:
        for row in rows:
            dtype = row.get("dtype")
            if is_float(dtype) and (lowest is None or epsilon(dtype) > epsilon(lowest)):
                lowest = str(dtype)
    return lowest


def _is_graph(row: dict[str, Any]) -> bool:
    return str(row.get("op") or "").startswith(GRAPH_PREFIX)


def _unpaired_graph_output(state: VerdictState, side: str, node: Node,
                           row: dict[str, Any]) -> dict[str, Any] | None:
    """The compiled graph's output row an unpaired input row reads, if no pair compared it."""
    if row.get("io") not in INPUT_IO or row.get("producer") is None:
        return None
    own = state.entry.get((side, node.rank, node.step, row["id"]))
    if own is not None and own.kind in PAIRED:
        return None
    made = state.rows.get((side, node.rank, node.step, row["producer"]))
    if made is None or not _is_graph(made):
        return None
    entry = state.entry.get((side, node.rank, node.step, made["id"]))
    return None if entry is not None and entry.kind in PAIRED else made


def explain_random_graphs(findings: list[Any], manifests: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """Say why a compiled graph named a culprit may differ by design: compiled graphs of one side
    draw random numbers (``randn``, ``dropout``) in kernels their backend generated, from that
    backend's own generator (inductor, unless ``torch._inductor.config.fallback_random``), where
    the other side draws from torch's. The graph named may be an earlier one of the chain whose
    outputs only graphs read. Reformer's LSH rotations under inductor: 33% apart, eager's within
    1 ulp with the fallback (session 28). ``manifests``: the target's and the reference's."""
    graphs = [{g.get("graph"): g for g in (m.get("compiled") or {}).get("graphs") or []} for m in manifests]
    drawing = [{name: g for name, g in side.items() if _own_generator(g)} for side in graphs]
    for mine, other in ((0, 1), (1, 0)):  # (the same graph drawing alike on both sides: the same draws)
        drawing[mine] = {n: g for n, g in drawing[mine].items() if not _alike(g, graphs[other].get(n))}
    if not (drawing[0] or drawing[1]):
        return
    side, found = ("target", drawing[0]) if drawing[0] else ("reference", drawing[1])
    listed = ", ".join(f"{n}: {', '.join(g['draws'])}" for n, g in list(found.items())[:4])
    backend = next(iter(found.values()))["backend"]
    why = (f"the {side}'s compiled graphs draw random numbers in kernels {backend} generated ({listed}), from "
           f"{backend}'s own generator, not torch's: they differ from the other side's draws by design - set "
           "torch._inductor.config.fallback_random = True to draw as eager PyTorch does")
    for f in findings:
        if str(f.op).startswith(GRAPH_PREFIX):
            f.note = f"{f.note}; {why}" if f.note else why


def _own_generator(info: dict[str, Any] | None) -> bool:
    return bool(info and info.get("draws") and info.get("inner_ops") == "not recorded"
                and not info.get("fallback_random"))


def _alike(info: dict[str, Any], other: dict[str, Any] | None) -> bool:
    return other is not None and _own_generator(other) and other.get("draws") == info.get("draws") \
        and other.get("backend") == info.get("backend")
