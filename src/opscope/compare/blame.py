"""Findings: the culprits and roots the verdict passes found, described and ranked."""

from __future__ import annotations

import json
import math
from typing import Any

from opscope.compare.align import INPUT_IO, PHASE_ORDER, Pair
from opscope.compare.call_args import args_note
from opscope.compare.param_moves import settings_note
from opscope.compare.result import SUMMARY_METRICS, Finding
from opscope.compare.state import PAIRED, Node, VerdictState, join, raw_error
from opscope.compare.tolerance import is_float
from opscope.model.calls import draws

NEIGHBOURS = 12


def describe(state: VerdictState) -> None:
    """One :class:`Finding` per culprit call and per root tensor."""
    for node in state.nodes:
        if node.verdict == "culprit" and node.worst is not None:
            state.findings.append(_culprit(state, node))
    for pair, row, side in state.roots:
        state.findings.append(_root(state, pair, row, side))


def rank(state: VerdictState) -> None:
    """Put findings in execution order (roots at the start of their step, then calls in
    forward, backward, optimizer order), so that the first is the first divergence, and
    pick the first divergence of each rank. Ordered by score, a later op made worse by the
    cause would come before the cause."""
    state.findings.sort(key=execution_order)
    for f in state.findings:
        state.first_by_rank.setdefault(f.rank, f)


def execution_order(f: Finding) -> tuple[Any, ...]:
    """Step, then phase (a forward root, such as a parameter, before the step's first op), then call."""
    start = f.kind == "root" and f.phase == "forward"
    return (f.step, -1 if start else PHASE_ORDER.get(f.phase, 9), f.seq, f.rank)


def metrics_of(pair: Pair) -> dict[str, Any]:
    """The summary metrics of a pair, plus how it was measured."""
    m = pair.metrics or {}
    out: dict[str, Any] = {"error": pair.error, "tolerance": pair.tolerance}
    for name in SUMMARY_METRICS[2:]:
        if name in m:
            out[name] = m[name]
    for name, value in m.items():  # user-registered metrics
        if name not in out and name not in ("diff_norm", "ref_norm", "bit_exact") and isinstance(value, (int, float)):
            out[name] = value
    out["mode"] = pair.mode
    out["dtype_target"] = (pair.t or {}).get("dtype")
    out["dtype_reference"] = (pair.r or {}).get("dtype")
    return out


def _culprit(state: VerdictState, node: Node) -> Finding:
    out = node.worst
    assert out is not None
    home = out.home
    allowed = max(out.tolerance, state.noise.ratio * node.in_error, 1e-300)
    f = finding_of("culprit", home, out, out.error / allowed if math.isfinite(out.error) else math.inf)
    f.side = "both" if out.kind in PAIRED else node.side
    f.inputs = [_input(state, node, row) for row in node.rows if row.get("io") in INPUT_IO]
    f.outputs = [_tensor(p.home, p) for p in node.outputs]
    f.upstream = _upstream(state, node.side, node.rank, node.step, node.rows)
    f.downstream = _downstream(state, node.side, node.rank, node.step, [p.home for p in node.outputs])
    if out.kind == "identity":
        f.note = out.note
    elif out.side:  # a recomputation judged against the other side's forward (align._replay_pairs)
        f.note = recompute_note(home, out.side)
    elif draws(str(home.get("op") or "")):
        f.note = draw_note(out) or f.note
    elif home.get("phase") == "optimizer":  # the learning rate (or other setting) of one run differs
        f.note = settings_note(state, node) or f.note
    called = _called(state, node, out)
    if called:  # a bound, an epsilon, a rate: what each run called it (or what made its input) with
        f.note = join(f.note, called)
    if node.graph is not None:  # read from compiled graphs that nothing compared
        side, first = node.graph
        f.module, f.op = first.get("module") or "", first.get("op") or ""
        f.seq, f.call, f.side = int(first["seq"]), first.get("call"), side
        f.note = (f"{f.op} runs fused kernels and only compiled graphs read its outputs, so they "
                  f"were not compared; the difference shows at {home.get('op')} {home.get('io')} "
                  f"{home.get('slot')}, while the weights they read agree - dump with "
                  f"torch.compile(..., backend='aot_eager') to see the op")
    if node.owner is not None:  # a tensor made by a module's own code (module level)
        owner = node.owner
        f.module = owner.get("orig_module", owner.get("module")) or ""
        f.op, f.io, f.slot = owner.get("orig_op", owner.get("op")) or "", "its own code", None
        f.note = (f"{out.note}, differs while every gradient before it agrees" if node.kind == "gradient"
                  else f"made by its own code between its submodules: the tensor read as "
                       f"{home.get('io')} {home.get('slot')}{_arg(home)} of {home.get('module') or '(top level)'} "
                       f"differs, while what that code could read agrees")
        if node.kind == "gradient":
            f.phase, f.inputs = "backward", []
        elif out.side:  # its own code, recomputed
            f.note = f"{f.note}; {recompute_note(home, out.side)}"
        f.outputs = [_tensor(home, out)]
    return f


def _called(state: VerdictState, node: Node, out: Pair) -> str | None:
    """The numbers the two runs called the culprit with, where they differ; else those of an op
    that made one of its inputs and passed within proportion (the float32 run as the target
    measures Adafactor's clamp at a bf16 epsilon as 0.95 off, and names the div_ it feeds)."""
    if out.t is not None and out.r is not None and out.kind in PAIRED:
        said = args_note(out.t, out.r)
        if said:
            return said
    for row in node.rows:
        if row.get("io") not in INPUT_IO or row.get("producer") is None:
            continue
        made = state.entry.get((node.side, node.rank, node.step, row["producer"]))
        if made is not None and made.t is not None and made.r is not None and made.kind in PAIRED:
            said = args_note(made.t, made.r)
            if said:
                return f"its input {row.get('slot')} was made by {made.t.get('op')}, and {said}"
    return None


def recompute_note(row: dict[str, Any], side: str) -> str:
    """Why a recomputed op (activation checkpointing) is a culprit: what it remakes differs
    from the forward it repeats, although what it read agrees."""
    other = "reference" if side == "target" else "target"
    why = ("a random op drawn again from another generator state: checkpoint(..., preserve_rng_state=False), "
           "or a generator advanced between the forward and the backward" if draws(str(row.get("op") or ""))
           else "a random op in it drawn again from another generator state, as with checkpoint(..., "
                "preserve_rng_state=False); a nondeterministic kernel; or state that changed between the forward "
                "and the backward")
    return (f"recomputed by activation checkpointing on the {side}: its output differs from the {other}'s "
            f"forward of this op while its inputs agree, so the {side}'s backward reads values its forward "
            f"did not make ({why})")


def draw_note(pair: Pair) -> str | None:
    """Why a random draw is a culprit, from the generator state each side recorded before it
    (the capture keeps it for replay); None where a side recorded none."""
    states = [_rng_state(row) for row in pair.rows]
    if None in states:
        return None
    if states[0] != states[1]:
        return ("a random draw from another generator state: the generator was seeded otherwise before it "
                "(another torch.manual_seed; a torch.seed(), as Reformer's attention calls in each forward unless "
                "its config sets hash_seed; or random draws one run made before it and the other did not)")
    return ("a random draw from the same generator state that differs: a nondeterministic kernel, or another "
            "device or library")


def _rng_state(row: dict[str, Any] | None) -> Any:
    try:
        return json.loads((row or {}).get("args") or "{}").get("rng")
    except (ValueError, AttributeError):
        return None


def _root(state: VerdictState, pair: Pair, row: dict[str, Any], side: str) -> Finding:
    # a value that must match exactly (allowed 0) is out of any proportion: inf, not error/1e-300
    score = pair.error / pair.tolerance if math.isfinite(pair.error) and pair.tolerance > 0 else math.inf
    f = finding_of("root", row, pair, score)
    arg = _arg(row)
    what = (f"parameter {row['param']}" if row.get("param")
            else f"{row.get('io')} {row.get('slot')}{arg} of {row.get('op')}")
    f.note = pair.metrics.get("written_by") or (
        f"{what} {pair.metrics.get('reads') or 'already differs at the start of step ' + str(row['step'])}")
    if not row.get("param") and not is_float(row.get("dtype")) and "." not in str(row.get("op") or ".") \
            and not _trains(state):
        f.note += (": where the step before chose it (the next token of a generation), the choice ran outside "
                   "any module, which a module-level dump does not record; dump at the api or aten level, "
                   "where compare tells a near tie of the logits from a fault")
    f.inputs = [_tensor(row, pair)]
    consumers = state.calls.get((side, row["rank"], row["step"], row["cseq"]), [])
    f.downstream = _summarise_calls(state, side, row["rank"], row["step"], {row["cseq"]}) if consumers else []
    return f


def _arg(row: dict[str, Any]) -> str:
    """" (attention_mask)": the argument's name where the row has one."""
    return f" ({row['arg']})" if row.get("arg") else ""


def _trains(state: VerdictState) -> bool:
    """Does the step train (a backward or an optimizer phase)? Inference then, if not."""
    return any(n.rows and n.rows[0].get("phase") in ("backward", "optimizer") for n in state.nodes)


def finding_of(kind: str, home: dict[str, Any], pair: Pair, score: float) -> Finding:
    return Finding(
        kind=kind, rank=int(home["rank"]), step=int(home["step"]), phase=home.get("phase") or "",
        module=home.get("orig_module", home.get("module")) or "", op=home.get("orig_op", home.get("op")) or "",
        call=home.get("call"), io=home.get("io") or "", slot=home.get("slot"), seq=int(home["seq"]),
        metrics=metrics_of(pair), score=score, param=home.get("param"), source=home.get("source"),
        dtype=home.get("dtype") or "")


def _tensor(row: dict[str, Any], pair: Pair | None) -> dict[str, Any]:
    return {
        "io": row.get("io"), "slot": row.get("slot"), "arg": row.get("arg"), "param": row.get("param"),
        "dtype": row.get("dtype"), "shape": list(row.get("shape") or []),
        "error": pair.error if pair is not None and math.isfinite(pair.error) else raw_error(pair),
        "rel_l2": (pair.metrics or {}).get("rel_l2") if pair is not None else None,
        "cosine": (pair.metrics or {}).get("cosine") if pair is not None else None,
        "status": pair.status if pair is not None else "unpaired",
    }


def _input(state: VerdictState, node: Node, row: dict[str, Any]) -> dict[str, Any]:
    key = (node.side, node.rank, node.step, row["id"])
    pair = state.entry.get(key)
    if (pair is None or not pair.metrics) and row.get("producer") is not None:
        pair = state.entry.get((node.side, node.rank, node.step, row["producer"]))
    info = _tensor(row, pair)
    producer_id = row.get("producer")
    producer = state.rows.get((node.side, node.rank, node.step, producer_id)) if producer_id is not None else None
    info["producer_op"] = producer.get("op") if producer else None
    return info


def _upstream(state: VerdictState, side: str, rank: int, step: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seqs = set()
    for row in rows:
        if row.get("io") in INPUT_IO and row.get("producer") is not None:
            producer = state.rows.get((side, rank, step, row["producer"]))
            if producer is not None:
                seqs.add(producer["cseq"])
    return _summarise_calls(state, side, rank, step, seqs)


def _downstream(state: VerdictState, side: str, rank: int, step: int,
                outputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seqs = {c["cseq"] for o in outputs for c in state.consumers.get((side, rank, step, o["id"]), [])}
    return _summarise_calls(state, side, rank, step, seqs)


def _summarise_calls(state: VerdictState, side: str, rank: int, step: int, seqs: set[int]) -> list[dict[str, Any]]:
    out = []
    for seq in sorted(seqs)[:NEIGHBOURS]:
        rows = state.calls.get((side, rank, step, seq), [])
        if not rows:
            continue
        found = [state.entry.get((side, rank, step, r["id"])) for r in rows if r.get("io") == "output"]
        pairs = [p for p in found if p is not None]
        worst = max(pairs, key=lambda p: _finite(p.error), default=None)
        head = rows[0]
        out.append({"seq": seq, "op": head.get("orig_op", head.get("op")),
                    "module": head.get("orig_module", head.get("module")),
                    "phase": head.get("phase"), "status": worst.status if worst else "unpaired",
                    "verdict": worst.verdict if worst else "", "error": worst.error if worst else None})
    return out


def _finite(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) else (1e300 if x is not None and not math.isnan(x) else 0.0)
