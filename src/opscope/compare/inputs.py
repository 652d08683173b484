"""How the pairs of an op's inputs get their status (a verdict pass's helpers).

- an input a producer made carries that producer's divergence (:func:`set_input_status`);
- a *leaf* (a parameter, buffer or model input: no producer recorded this step) differs at
  the start of a step: a root, explained by the previous step, or fine (:func:`judge_leaf`);
- a pair no call judged (:func:`settle`): unpaired, skipped, an input read by a call with no
  output to judge (it takes its producer's judgement), or a lone measured pair.
"""

from __future__ import annotations

import math
from typing import Any

from opscope.compare.align import INPUT_IO, Pair
from opscope.compare.carried import made_before
from opscope.compare.flow import CASTS, PASS_THROUGH, base_op
from opscope.compare.graphs import has_graphs, made_floor
from opscope.compare.internal import backward_known, module_gradient_error
from opscope.compare.loss_scale import explained_by_skip, one_sided_nonfinite, overflowed
from opscope.compare.param_moves import as_step_began
from opscope.compare.param_reads import written_in_place
from opscope.compare.state import Node, VerdictState, finite, join, producer_entry, raw_error
from opscope.compare.tolerance import cast_floor, epsilon, subnormal
from opscope.compare.unwritten import unwritten_read


def producer_entries(state: VerdictState, node: Node, row: dict[str, Any], own: Pair | None) -> list[Pair]:
    """The measured pairs of what made this input row, on its side and on the other."""
    out = []
    if row.get("producer") is not None:
        p = producer_entry(state, node.side, node.rank, node.step, row["producer"])
        if p is not None:
            out.append(p)
    if own is not None:
        other, other_side = (own.r, "reference") if node.side == "target" else (own.t, "target")
        if other is not None and other.get("producer") is not None:
            p = producer_entry(state, other_side, node.rank, node.step, other["producer"])
            if p is not None:
                out.append(p)
    return out


def is_leaf(state: VerdictState, node: Node, row: dict[str, Any], own: Pair) -> bool:
    """No record of this step made the row's tensor (a parameter, buffer or model input), and
    the other side does not read another parameter in its place (:func:`reads_another_param`)."""
    producer = row.get("producer")
    return (producer is None or (node.side, node.rank, node.step, producer) not in state.rows) \
        and not reads_another_param(state, node, own)


def judge_leaf(state: VerdictState, node: Node, row: dict[str, Any], own: Pair,
                info: dict[str, Any]) -> bool:
    """A parameter, buffer or model input: a root, explained by earlier steps, or fine."""
    error = raw_error(own)
    t, r = own.rows
    # what each side read, with the dtypes it was cast from here (one side may read a
    # parameter through a cast the other does not make)
    casts = [*_cast_chain(state, "target", node, t)[1], *_cast_chain(state, "reference", node, r)[1]]
    lower = state.noise.lower_dtype(t.get("dtype"), r.get("dtype"))
    for dtype in casts:
        lower = state.noise.lower_dtype(lower, dtype)
    tol = state.noise.tolerance(lower)
    if row.get("param") and info["first"] and (t.get("dtype") != r.get("dtype") or casts) \
            and params_cast_alike(state, node, info):
        tol = min(tol, CAST_ROUNDING * epsilon(lower))
    own.error, own.tolerance = error, tol
    if own.metrics.get("bit_exact") or not error > tol:
        return False
    if (t.get("dtype") != r.get("dtype") or casts) and _below_normal(own, lower, tol):
        return False
    name = row.get("param")
    # a value read again (a second op reading the weight; at the module level the model's
    # input, then its first submodule's) is what its first read found
    identity = name or (row.get("hash"), r.get("hash"), row.get("numel"))
    if identity in info["seen"]:
        return id(own) in state.tainted or info["tainted_before"] or info["seen"][identity]
    info["seen"][identity] = tainted = _first_read(state, node, row, own, info, error, tol)
    return tainted


def _below_normal(own: Pair, dtype: str | None, tol: float) -> bool:
    """Is a leaf one side reads cast to ``dtype`` as far from the other as that cast's rounding
    below the normal range allows (:func:`~opscope.compare.tolerance.cast_floor`)? Then it
    passes: a float16 copy of a bias of 2e-8 (BERT's query bias after an SGD step) is 0 or
    6e-8, and what reads it cannot see more."""
    diff, ref = own.metrics.get("diff_norm", math.inf), own.metrics.get("ref_norm", 0.0)
    floor = cast_floor(dtype, int(own.rows[0].get("numel") or 0))
    if not floor or own.metrics.get("nan_mismatch") or own.metrics.get("inf_mismatch") or diff > tol * ref + floor:
        return False
    own.tolerance = max(tol, own.error)
    own.note = join(own.note, f"within a {dtype} cast's rounding of values below its normal range "
                              f"(half a subnormal step, {0.5 * subnormal(dtype):.3g}, an element)")
    return True


def reads_another_param(state: VerdictState, node: Node, own: Pair) -> bool:
    """Does the other side read, through views and casts, a parameter of another name than
    this leaf? (Reformer keeps a float16 and a float32 mask value and reads the one of its
    compute dtype.) Then the two are not one leaf: the difference is this input's error, as
    it is with the sides the other way round, where no leaf is judged."""
    row, other = (own.t, own.r) if node.side == "target" else (own.r, own.t)
    if row is None or other is None or not row.get("param") or other.get("producer") is None:
        return False
    source = _cast_chain(state, "reference" if node.side == "target" else "target", node, other)[0]
    return source is not other and bool(source.get("param")) and source.get("param") != row.get("param")


def _cast_chain(state: VerdictState, side: str, node: Node,
                row: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Up from ``row`` through this step's views and casts to a value no such op made: that
    value's row, and the dtypes the casts on the way read (a bf16 model's float32 copy of its
    bf16 buffer, Llama's rotary ``inv_freq.float()``, where the float32 run reads its buffer
    itself: bfloat16)."""
    found: list[str] = []
    for _ in range(16):
        producer = row.get("producer")
        made = state.rows.get((side, node.rank, node.step, producer)) if producer is not None else None
        if made is None or made.get("io") != "output" or base_op(made.get("op")) not in PASS_THROUGH:
            break
        inputs = [x for x in state.calls.get((side, node.rank, node.step, made["cseq"]), [])
                  if x.get("io") in INPUT_IO and x.get("numel") == made.get("numel")]
        if len(inputs) != 1:
            break
        row = inputs[0]
        if base_op(made.get("op")) in CASTS and row.get("dtype"):
            found.append(str(row["dtype"]))
    return row, found


def _first_read(state: VerdictState, node: Node, row: dict[str, Any], own: Pair, info: dict[str, Any],
                error: float, tol: float) -> bool:
    t, r = own.rows
    name = row.get("param")
    unwritten = unwritten_read(t, r)
    if unwritten:  # optimizer state that a skipped update left as empty_like made it
        own.note = join(own.note, unwritten)
        own.metrics["reads"] = unwritten
        return _root(state, node, row, own, info)
    # no root: the runs part here by design (a skipped update), or a gradient no record made
    # overflowed under the loss scale of a step the scaler skipped (a fused optimizer reads it
    # still, and leaves its parameter as it was); what reads it carries it
    skip = (explained_by_skip(t, r) if name else None) or overflowed(t, r)
    if skip:
        own.note = join(own.note, skip)
        return True
    explained = not info["first"] and (
        # (a step apart by a skipped update is no cause of a NaN: only a root, a culprit, or a
        # NaN or Inf that failed before, is)
        (info["tainted_before"] and (info["found"] or not one_sided_nonfinite(t, r)))
        or (name and error <= max(tol, state.noise.ratio * info["prev_param_error"].get(name, -1.0)))
        # a buffer the forward updates (batch norm's running statistics) carries the noise of
        # the previous step that computed it
        or (name and name not in info["prev_param_error"] and error <= state.noise.ratio * info["prev_noise"])
        or (not name and row.get("phase") == "optimizer"))
    if explained:
        own.verdict = "inherits" if info["tainted_before"] else ""
        own.note = join(own.note, f"differs at the start of step {node.step}, as left by step "
                                   f"{info.get('previous_step')}")
        return bool(info["tainted_before"])
    made = None if name else made_before(info, own)
    if made is not None:  # a token chosen, a cache appended to, in the step before: that value
        own.note = join(own.note, made)
        return False
    if info["tainted"] and (row.get("io") == "grad" or row.get("phase") in ("backward", "optimizer", "recompute")):
        # a gradient or optimizer state whose producer was not captured (module / api
        # levels), or a recomputed value made by code that no record brackets (a checkpointed
        # layer's own code, whose hooks do not run again), in a step that already diverged:
        # it carries that divergence
        own.status, own.verdict = "failed", "inherits"
        own.note = join(own.note, "no captured producer, in a step that had already diverged")
        state.tainted.add(id(own))
        return True
    if row.get("producer") is None and (row.get("io") == "grad" or (row.get("phase") in ("backward", "recompute")
                                                                     and not name)):
        # a gradient the backward pass made out of sight (module / api level, or a data-flow
        # link the capture missed), or a value it remade there by code no record brackets
        # (module level: Reformer's reversible layers rebuild each layer's input from its
        # outputs): in proportion to the gradients recorded in that backward pass, it is their
        # noise
        known, _ = backward_known(state, node.side, node.rank, node.step, row["seq"], own)
        # what made it also read the forward's tensors (a softmax's output), with the step's
        # rounding so far
        known = max(known, module_gradient_error(state, node, row, own), info["noise"], info["moves"].in_step)
        error = _floored(state, node, own, error)
        if not error > max(tol, state.noise.ratio * known):
            own.status = "passed"
            own.note = join(own.note, "in proportion to the error of the step's recorded gradients")
            return False
    return _root(state, node, row, own, info)


def _root(state: VerdictState, node: Node, row: dict[str, Any], own: Pair, info: dict[str, Any]) -> bool:
    own.status, own.verdict = "failed", "root"
    state.tainted.add(id(own))
    state.roots.append((own, row, node.side))
    info["tainted"] = info["found"] = True  # the step diverged here, also where what reads it stays within tolerance
    return True


def one_sided_writer(state: VerdictState, node: Node, own: Pair) -> tuple[str, dict[str, Any]] | None:
    """(side, row) of an in-place op only that side ran (no partner) that wrote the parameter
    this input reads, where the other side reads it as no op of the step made it (as the step
    began): a mask, an edit or a copy into a weight that one run makes and the other does not.
    (A cast or a copy of it one side makes is another tensor, judged as an identity.)"""
    if own.t is None or own.r is None or own.metrics.get("bit_exact") or not own.t.get("param") \
            or own.t.get("param") != own.r.get("param"):
        return None
    for side, row, other, other_side in (("target", own.t, own.r, "reference"), ("reference", own.r, own.t, "target")):
        producer = row.get("producer")
        made = state.rows.get((side, node.rank, node.step, producer)) if producer is not None else None
        if made is None or made.get("io") != "output" or (other_side, node.rank, node.step,
                                                            other.get("producer")) in state.rows:
            continue
        if not written_in_place(made):
            continue
        pair = state.entry.get((side, node.rank, node.step, made["id"]))
        if pair is None or pair.kind == "unpaired":
            return side, made
    return None


def judge_one_sided(state: VerdictState, node: Node, own: Pair, info: dict[str, Any]) -> bool | None:
    """A parameter one side's extra op wrote (:func:`one_sided_writer`; None where none did):
    fine within tolerance, else that op is where the runs part (a root at its row, said in the
    note); True when it carries a divergence."""
    read = _read_through_cast(state, node, own) or own
    writer = one_sided_writer(state, node, read)
    if writer is None:
        return None
    if not _written_root(state, node, read, writer):
        return False
    if read is not own:  # the cast of the written parameter carries its divergence
        own.status, own.verdict = "failed", "inherits"
        state.tainted.add(id(own))
    info["tainted"] = True
    return True


def _written_root(state: VerdictState, node: Node, read: Pair, writer: tuple[str, dict[str, Any]]) -> bool:
    """Is the written parameter ``read`` beyond tolerance? Then a root at the writer's row."""
    error = raw_error(read)
    t, r = read.rows
    tol = state.noise.tolerance(state.noise.lower_dtype(t.get("dtype"), r.get("dtype")))
    # as far apart as the parameter already was before the write (bf16 autocast's updates)
    tol = max(tol, state.noise.ratio * _began_apart(state, node).get(t["param"], 0.0))
    read.error, read.tolerance = error, tol
    if not error > tol:
        return False
    side, made = writer
    other = "reference" if side == "target" else "target"
    read.metrics["written_by"] = (
        f"{made.get('op')} ({made.get('module') or 'top level'}, call {made.get('call')}) ran only in the "
        f"{side} and wrote parameter {t['param']}, which the {other} reads as no op of step {node.step} made it "
        f"(its value there); an edit, a mask or a copy one run makes and the other does not")
    read.status, read.verdict = "failed", "root"
    state.tainted.add(id(read))
    state.roots.append((read, made, side))
    return True


def _read_through_cast(state: VerdictState, node: Node, own: Pair) -> Pair | None:
    """Where one side reads a parameter only through views and casts of its own (autocast's
    cast of a weight, which pairs with nothing) and the other reads it itself: the pair of
    that parameter's read by name (:mod:`opscope.compare.param_reads`), if any."""
    for side, row, other in (("target", own.t, own.r), ("reference", own.r, own.t)):
        if row is None or other is None or row.get("param") or not other.get("param") \
                or row.get("producer") is None:
            continue
        source = _cast_chain(state, side, node, row)[0]
        if source is row or source.get("param") != other.get("param"):
            continue
        pair = state.entry.get((side, node.rank, node.step, source["id"]))
        if pair is not None and pair is not own and pair.kind == "flow" and not pair.status and pair.metrics:
            return pair
    return None


def _began_apart(state: VerdictState, node: Node) -> dict[str, float]:
    """Per parameter, the largest error of a pair that reads it as the step began on both
    sides (no op of the step wrote it), for this rank and step (built once)."""
    key = ("began apart", node.rank, node.step)
    found = state.indexes.get(key)
    if found is None:
        found = state.indexes[key] = {}
        for pair in state.pairs:
            t, r = pair.t, pair.r
            if t is None or r is None or not pair.metrics or t.get("io") != "param" or r.get("io") != "param" \
                    or t.get("param") != r.get("param") or (t.get("rank"), t.get("step")) != (node.rank, node.step):
                continue
            if as_step_began(state, "target", node, t) and as_step_began(state, "reference", node, r):
                found[t["param"]] = max(found.get(t["param"], 0.0), finite(raw_error(pair)))
    return found


def _floored(state: VerdictState, node: Node, own: Pair, error: float) -> float:
    """A gradient's error against the floor of the compiled graph that made it, on either
    side (:func:`~opscope.compare.graphs.made_floor`), where that exceeds its own norm."""
    m = own.metrics
    if not has_graphs(state) or m.get("nan_mismatch") or m.get("inf_mismatch"):
        return error
    floor = max(made_floor(state, side, node.rank, node.step, row)
                for side, row in (("target", own.t), ("reference", own.r)) if row is not None)
    return min(error, m.get("diff_norm", 0.0) / floor) if floor > 0 else error


# A cast rounds to nearest: each element moves by at most half an epsilon of its size, so a
# parameter cast from the other side's is within eps/2 norm-wise (float64 arithmetic's slack).
CAST_ROUNDING = 0.5 * (1 + 1e-9)


def params_cast_alike(state: VerdictState, node: Node, info: dict[str, Any]) -> bool:
    """Are this step's parameters, where the two sides' dtypes differ, one cast apart?

    A bf16 model against its float32 run starts from the same weights rounded once: each is
    within a rounding (‖t − r‖ ≤ eps/2 · ‖r‖), so one beyond that was changed, even by less
    than an op may differ (0.1 in bf16). Counted over the forward's parameter reads: at least
    three and three quarters of them within eps. Mid-training both sides' weights have moved
    apart, none is within a rounding, and an op's tolerance stays."""
    if "cast_alike" not in info:
        worst: dict[str, float] = {}
        for pair in state.pairs:
            t, r = pair.t, pair.r
            if t is None or r is None or not pair.metrics or t.get("io") != "param" \
                    or t.get("phase") != "forward" or t.get("dtype") == r.get("dtype") \
                    or (t.get("rank"), t.get("step")) != (node.rank, node.step):
                continue
            eps = epsilon(state.noise.lower_dtype(t.get("dtype"), r.get("dtype")))
            if eps:
                name = str(t.get("param"))
                worst[name] = max(worst.get(name, 0.0), raw_error(pair) / eps)
        within = sum(units <= 1 for units in worst.values())
        info["cast_alike"] = len(worst) >= 3 and within >= 0.75 * len(worst)
    return bool(info["cast_alike"])


def set_input_status(state: VerdictState, own: Pair, tainted: bool) -> None:
    error = raw_error(own)
    if not math.isfinite(own.error):
        t, r = own.rows
        own.error, own.tolerance = error, state.noise.tolerance(state.noise.lower_dtype(t.get("dtype"), r.get("dtype")))
    if own.metrics.get("bit_exact"):
        own.status = "identical"
    elif tainted and error > own.tolerance:
        own.status, own.verdict = "failed", own.verdict or "inherits"
        state.tainted.add(id(own))
    else:
        own.status = "passed"


def settle(state: VerdictState, pair: Pair) -> None:
    """Status of pairs no call judged: unpaired, skipped, or a lone measured pair."""
    if pair.kind == "unpaired":
        pair.status = "unpaired"
    elif pair.mode == "skipped" or not pair.metrics:
        pair.status = "skipped"
    elif pair.metrics.get("bit_exact"):
        pair.status = "identical"
    else:
        t, r = pair.rows
        producers = _lone_input_producers(state, pair)
        if producers:
            # read by a call with no judged output (an assign, an optimizer's update): the
            # value its producer made, judged there, as any op's input is
            set_input_status(state, pair, any(id(p) in state.tainted for p in producers))
            return
        lower = state.noise.lower_dtype(t.get("dtype"), r.get("dtype"))
        pair.error, pair.tolerance = raw_error(pair), state.noise.tolerance(lower)
        pair.status = "passed" if not pair.error > pair.tolerance else "failed"
        if pair.status == "failed":
            pair.note = join(pair.note, "differs, but no paired producer explains where from")


def _lone_input_producers(state: VerdictState, pair: Pair) -> list[Pair]:
    """The judged pairs of what both sides' rows of an input pair read (empty unless both
    have one: a value one side made out of sight is not explained)."""
    found = []
    for side, row in (("target", pair.t), ("reference", pair.r)):
        if row is None or row.get("io") not in INPUT_IO or row.get("producer") is None:
            return []
        producer = producer_entry(state, side, row["rank"], row["step"], row["producer"])
        if producer is None or producer is pair or not producer.status:
            return []
        found.append(producer)
    return found
