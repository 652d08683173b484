"""Values one step makes and the next one reads, and the choices that make runs part.

Inference has no optimizer to carry a step into the next: what carries it is data. A text
generator's step ends by choosing the next token from the logits (``argmax``, ``topk``,
sampling) and the next step reads that token as its model input, with the KV cache the step
before appended to. Such a tensor has no producer in the step that reads it, a leaf: where
it differs, it looked like a value that differed at the start of the step (a root).

:func:`remember` keeps each output of a step that differs beyond its tolerance, keyed by its
bytes on both sides (content hash, element count, dtype); :func:`made_before` finds a leaf of
the next step among them: that leaf is the same tensor, and takes that output's judgement.

:func:`decision` spots the op that made the runs part without being at fault: an integer
output (an index, a mask, a count) that differs while only float inputs carrying rounding
do (a near tie: the top two logits of a token are closer than the two runs' rounding). It
passes as in proportion (docs/compare.md, Verdict rules, "Integer inputs"); the first ones
of a comparison are said in its notes, since what follows reads different data from there.
"""

from __future__ import annotations

from typing import Any

from opscope.compare.pair import INPUT_IO, Pair
from opscope.compare.state import Node, VerdictState, input_error
from opscope.compare.tolerance import is_float

Key = tuple[Any, Any, Any]


def _key(row: dict[str, Any] | None) -> Key | None:
    # (a constant is kept: a single prompt's next token is one element. Both sides must match
    # a pair that differs, which a chance equality of zeros or ones on one side does not make)
    if row is None or row.get("hash") is None:
        return None
    return row.get("hash"), row.get("numel"), row.get("dtype")


def remember(info: dict[str, Any], out: Pair) -> None:
    """Keep a judged output that differs beyond its tolerance for the next step's leaves; and
    whether the rank has a divergence that can explain a NaN a later step reads (``found``: a
    culprit, or a NaN or Inf on one side that failed; a root: inputs._root)."""
    info["found"] = info["found"] or out.verdict == "culprit" or (out.status == "failed" and bool(
        out.metrics.get("nan_mismatch") or out.metrics.get("inf_mismatch")))
    if out.status == "failed" or not out.error > out.tolerance:
        return  # a divergence carries on anyway (tainted_before); within tolerance needs nothing
    kt, kr = _key(out.t), _key(out.r)
    if kt is not None and kr is not None:
        home = out.home
        info["made"][(kt, kr)] = (int(home["step"]), home.get("op") or "", home.get("module") or "")


def made_before(info: dict[str, Any], own: Pair) -> str | None:
    """Where the previous step made the tensor this leaf pair holds on both sides, or None."""
    made = info.get("prev_made")
    if not made:
        return None
    kt, kr = _key(own.t), _key(own.r)
    found = made.get((kt, kr)) if kt is not None and kr is not None else None
    if found is None:
        return None
    step, op, module = found
    return f"made by {op} ({module or 'top level'}) in step {step}, which passed there"


def decision(state: VerdictState, node: Node, out: Pair) -> dict[str, Any] | None:
    """A choice that came out differently from inputs that differ only by rounding."""
    t, r = out.rows
    if out.status != "passed" or is_float(t.get("dtype")) or is_float(r.get("dtype")) \
            or not out.error > 0:
        return None
    worst, scores = 0.0, None
    for row in node.rows:
        if row.get("io") not in INPUT_IO:
            continue
        own = state.entry.get((node.side, node.rank, node.step, row["id"]))
        if own is None or not own.metrics or own.metrics.get("bit_exact"):
            continue
        error = input_error(state, own)  # (from statistics: at least their resolution, the hashes differing)
        if not is_float(row.get("dtype")) and error != 0:
            return None  # it read other indices: a consequence, not the choice
        if is_float(row.get("dtype")) and not error <= worst:
            worst, scores = error, own
    if not worst > 0 or scores is None:
        return None
    home = out.home
    return {"rank": node.rank, "step": node.step, "seq": node.seq, "phase": home.get("phase") or "",
            "module": home.get("module") or "", "op": home.get("op") or "", "call": home.get("call"),
            "slot": home.get("slot"), "dtype": home.get("dtype"), "error": out.error, "input_error": worst,
            "rows": (scores.t, scores.r, t, r)}  # what it chose from, and its choices, on each side


def count_decision(state: VerdictState, node: Node, out: Pair, decisions: dict[str, Any]) -> None:
    """Keep a rank's first decision; count the later ones (after the first, the runs read
    different data, and the next ones are mostly its consequences)."""
    if decisions["first"] is not None:
        if decision(state, node, out) is not None:
            decisions["more"] += 1
        return
    decisions["first"] = decision(state, node, out)


def notes(previous: dict[int, dict[str, Any]], dumps: tuple[Any, Any] | None = None) -> list[str]:
    """Each rank's first decision, said for the result's notes; with ``dumps`` (target,
    reference) holding its full tensors, how near the tie was (:func:`~opscope.compare.near_tie.margin`)."""
    from opscope.compare.near_tie import margin

    out = []
    for _, info in sorted(previous.items()):
        decisions = info.get("decisions", {})
        if decisions.get("first") is not None:
            tie = margin(decisions["first"], *dumps) if dumps is not None else None
            out.append(note(decisions) + (f". {tie}" if tie else ""))
    return out


def note(decisions: dict[str, Any]) -> str:
    """A rank's first decision in words, and how many came after it."""
    d = decisions["first"]
    size = (f"by {d['input_error']:.3g} (relative)" if d["input_error"] != float("inf")
            else "by an amount statistics cannot size (a tensor holding Inf: logits masked with -inf)")
    more = decisions["more"]
    after = f"; {more} more such choice{'s' if more > 1 else ''} later" if more else ""
    return (f"rank {d['rank']} step {d['step']}: {d['op']} ({d['module'] or 'top level'}, {d['phase']}, "
            f"call {d['call']}) chose differently on the two sides: its {d['dtype']} output {d['slot']} "
            f"differs while its float inputs differ only {size}, in proportion to the rounding before "
            f"it. A near tie, no op's fault: what reads the choice (the next token of a generation, a "
            f"routed expert) may differ from there on{after}")
