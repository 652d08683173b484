"""Values a collective made (torch.distributed: an all-reduce's sum, an all-gather's shards):
what the other ranks sent, judged across ranks.

The capture records a collective's outputs unmeasured (what they hold arrives after its op
returns: model/records.py ``COLLECTIVE_NOTE``) and measures each at its next read, with the
collective's output row for its producer. Judged on one rank (:func:`judge_collective`), such a
read that differs while the collective's inputs on this rank are identical is no culprit of this
rank: it carries what the other ranks sent, and taints the step as an inherited divergence.
Across ranks (:func:`settle`, once every partition is judged), each such collective is explained
by a divergence any rank compared had before it (execution order: step, phase, call; ranks run
the same program, so the calls line up); where none had, and its inputs were identical on every
rank compared, the collective itself changed the values (its reduction, a communication hook,
the transport) and it is named as the culprit.
"""

from __future__ import annotations

import math
from typing import Any

from opscope.compare.align import INPUT_IO, Pair
from opscope.compare.blame import execution_order, finding_of
from opscope.compare.state import Node, VerdictState, join, made_with_note, raw_error
from opscope.model.records import COLLECTIVE_NOTE

COLLECTIVE_NAMESPACES = ("c10d.", "_c10d_functional.", "_c10d_functional_autograd.")


def is_collective(op: Any) -> bool:
    return str(op or "").startswith(COLLECTIVE_NAMESPACES)


def made_by(state: VerdictState, node: Node, row: dict[str, Any]) -> dict[str, Any] | None:
    """The collective output row that made input ``row`` (measured at this, its next read), or None."""
    return made_with_note(state, node, row, COLLECTIVE_NOTE)


def judge_collective(state: VerdictState, node: Node, own: Pair, made: dict[str, Any]) -> bool:
    """Judge a read of a collective's output (``made``, its row); True when it carries a divergence."""
    t, r = own.rows
    own.error = raw_error(own)
    own.tolerance = state.noise.tolerance(state.noise.lower_dtype(t.get("dtype"), r.get("dtype")))
    if own.metrics.get("bit_exact") or not own.error > own.tolerance:
        return False
    inputs = [state.entry.get((node.side, node.rank, node.step, x["id"]))
              for x in state.calls.get((node.side, node.rank, node.step, made["cseq"]), [])
              if x.get("io") in INPUT_IO]
    op = made.get("op")
    if any(p is not None and id(p) in state.tainted for p in inputs):
        own.status, own.verdict = "failed", "inherits"
        own.note = join(own.note, f"made by {op} from this rank's diverged input")
        state.tainted.add(id(own))
        return True
    if not all(p is not None and p.status == "identical" for p in inputs):
        # its inputs here differ within tolerance: the sum of the ranks' noise
        own.status = "passed"
        own.note = join(own.note, f"made by {op} from inputs within tolerance")
        return False
    own.status, own.verdict = "failed", "inherits"
    own.note = join(own.note, f"made by {op} from what the other ranks sent (its inputs on rank "
                              f"{node.rank} are identical)")
    state.tainted.add(id(own))
    score = own.error / own.tolerance if math.isfinite(own.error) and own.tolerance > 0 else math.inf
    state.collective_fed.append(finding_of("culprit", made, own, score))
    return True


def identical_inputs(pairs: list[Pair]) -> dict[tuple[int, int, int], bool]:
    """Per collective call (rank, step, seq): were all its input pairs identical?"""
    out: dict[tuple[int, int, int], bool] = {}
    for pair in pairs:
        home = pair.home
        if home.get("io") in INPUT_IO and is_collective(home.get("op")) and home.get("note") is None:
            key = (int(home["rank"]), int(home["step"]), int(home["seq"]))
            out[key] = out.get(key, True) and pair.status == "identical"
    return out


def settle(findings: list[Any], fed: list[Any], inputs: dict[tuple[int, int, int], bool],
           missing: set[int], ranks: set[int]) -> list[str]:
    """Add to ``findings`` the collectives that changed values themselves; the notes that say
    where each other rank first received a difference through a collective. ``ranks``: every
    rank of the run; ``missing``: those not compared (a collective is named only when none is)."""
    notes: list[str] = []
    named: set[tuple[int, int]] = set()
    seen: set[int] = set()
    first = min((g for g in findings if g.kind in ("culprit", "root")), key=_order, default=None)
    own: dict[int, Any] = {}  # each rank's first culprit or root of its own
    for g in findings:
        if g.kind in ("culprit", "root") and (g.rank not in own or _order(g) < own[g.rank]):
            own[g.rank] = _order(g)
    for f in sorted(fed, key=_order):
        if first is not None and _order(first) < _order(f):
            if f.rank not in seen and not (f.rank in own and own[f.rank] < _order(f)):
                seen.add(f.rank)
                notes.append(f"rank {f.rank} first differs at step {f.step} ({f.phase}) where {f.op} brought "
                             f"what the other ranks sent: rank {first.rank} diverged before, at {first.op} "
                             f"(step {first.step}, {first.phase})")
            continue
        key = (f.step, f.seq)
        if key in named:
            continue
        if not missing and all(inputs.get((rank, f.step, f.seq), False) for rank in ranks):
            named.add(key)
            f.note = (f"its result differs on rank {f.rank} while its inputs are identical on every rank "
                      f"compared ({_span(ranks)}): the collective itself changed the values (its reduction, "
                      "a communication hook, the transport)")
            findings.append(f)
            if first is None or _order(f) < _order(first):
                first = f
        elif f.rank not in seen:
            seen.add(f.rank)
            notes.append(f"rank {f.rank} first differs at step {f.step} ({f.phase}) where {f.op} brought what "
                         "the other ranks sent; no rank compared diverged before (compare every rank to see "
                         "where it came from)")
    return notes


def received_gradients(findings: list[Any]) -> list[str]:
    """Take out of ``findings`` the gradients a rank's optimizer read that differ with no producer
    recorded (a module-level or api-level dump does not see the gradient all-reduce), where that
    rank had no divergence before and another rank had one: what the all-reduce brought. One note
    per rank says so."""
    notes: list[str] = []
    for rank in sorted({f.rank for f in findings}):
        mine = sorted((f for f in findings if f.rank == rank), key=_order)
        first = mine[0]
        if not (first.kind == "root" and first.io == "grad"):
            continue
        before = [g for g in findings if g.rank != rank and _order(g) < _order(first)]
        if not before:
            continue
        source = min(before, key=_order)
        received = [f for f in mine if f.kind == "root" and f.io == "grad" and f.step == first.step]
        for f in received:
            findings.remove(f)
        names = ", ".join(str(f.param) for f in received[:3]) + (", ..." if len(received) > 3 else "")
        notes.append(f"rank {rank}'s gradients of {names} differ at step {first.step} where the optimizer reads "
                     "them, with no producer recorded (this level does not see the gradient all-reduce): what "
                     f"the other ranks sent: rank {source.rank} diverged before, at {source.op} (step "
                     f"{source.step}, {source.phase})")
    return notes


def _order(f: Any) -> tuple[Any, ...]:
    return execution_order(f)[:3]  # (ranks line up call by call: not ordered by rank)


def _span(ranks: set[int]) -> str:
    low, high = min(ranks), max(ranks)
    return f"rank {low}" if low == high else f"ranks {low}-{high}"
