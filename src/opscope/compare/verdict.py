"""Verdicts: which operator made the two sides diverge.

Passes over the measured pairs, applied in order (:data:`VERDICT_PASSES`; the replay
feature plugs in before ranking with :func:`register_pass`):

1. :func:`index` — op calls, their rows and the pair holding each row, per side.
2. :func:`judge` — in execution order, per rank and step: an op whose output error is out of
   proportion to its inputs' error (``> max(tolerance, ratio * input error)``) is a
   *culprit*; one whose inputs already carry a divergence *inherits*; a parameter or model
   input that differs at the start of a step is a *root*.
3. :func:`opscope.compare.blame.describe` and :func:`opscope.compare.blame.rank` — findings
   with their inputs, outputs and neighbours; ranked; first divergence per rank.

Errors are norm-wise: ‖t − r‖ / ‖r‖. An op's output error is measured against
max(‖r_out‖, smallest ‖r_in‖), so that cancellation (a gradient that is zero in truth) is
not blamed on the op that suffered it; an input's error is the plain ratio, so such a
near-zero tensor explains whatever an ill-conditioned op downstream makes of it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opscope.compare.align import INPUT_IO, Pair
from opscope.compare.conditioning import condition
from opscope.compare.flow import PASS_THROUGH, base_op
from opscope.compare.nesting import demote_enclosing
from opscope.compare.tolerance import NoiseModel, is_float

PAIRED = ("exact", "aligned", "mapped", "flow")
RowKey = tuple[str, int, int, int]  # side, rank, step, id or seq


@dataclass
class Node:
    """One op call to judge: rows of its home side, and the pairs of its outputs."""

    side: str
    rank: int
    step: int
    seq: int
    order: float
    rows: list[dict[str, Any]]
    outputs: list[Pair]
    verdict: str = ""
    in_error: float = 0.0
    worst: Pair | None = None

    @property
    def head(self) -> dict[str, Any]:
        return self.outputs[0].home if self.outputs else self.rows[0]


@dataclass
class VerdictState:
    """Everything the passes share."""

    pairs: list[Pair]
    noise: NoiseModel
    entry: dict[RowKey, Pair] = field(default_factory=dict)
    rows: dict[RowKey, dict[str, Any]] = field(default_factory=dict)
    calls: dict[RowKey, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    consumers: dict[RowKey, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    nodes: list[Node] = field(default_factory=list)
    tainted: set[int] = field(default_factory=set)
    roots: list[tuple[Pair, dict[str, Any], str]] = field(default_factory=list)
    findings: list[Any] = field(default_factory=list)
    first_by_rank: dict[int, Any] = field(default_factory=dict)


def raw_error(pair: Pair | None) -> float:
    """‖t − r‖ / ‖r‖ of a measured pair (inf for NaN/Inf mismatches), nan when unmeasured."""
    m = pair.metrics if pair is not None else None
    if not m:
        return math.nan
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        return math.inf
    diff, ref = m.get("diff_norm", 0.0), m.get("ref_norm", 0.0)
    if diff == 0:
        return 0.0
    return diff / ref if ref > 0 else math.inf


def index(state: VerdictState) -> None:
    """Build row, call, entry and consumer indexes, and the nodes in execution order."""
    for pair in state.pairs:
        for side, row in (("target", pair.t), ("reference", pair.r)):
            if row is None:
                continue
            key = (side, row["rank"], row["step"], row["id"])
            if pair.kind != "identity":
                state.entry.setdefault(key, pair)
            elif row is pair.home:
                state.entry[key] = pair
            if key not in state.rows:
                state.rows[key] = row
                state.calls[(side, row["rank"], row["step"], row["cseq"])].append(row)
                if row.get("producer") is not None:
                    state.consumers[(side, row["rank"], row["step"], row["producer"])].append(row)
    by_call: dict[RowKey, list[Pair]] = defaultdict(list)
    for pair in state.pairs:
        home = pair.home
        if pair.kind in (*PAIRED, "identity") and home.get("io") == "output":
            side = pair.side if pair.kind == "identity" else "target"
            by_call[(side, home["rank"], home["step"], home["cseq"])].append(pair)
    for (side, rank, step, seq), outs in by_call.items():
        node = Node(side, rank, step, seq, float(seq), state.calls[(side, rank, step, seq)], outs)
        if side == "reference":
            node.order = _target_order(state, node)
        state.nodes.append(node)
    state.nodes.sort(key=lambda n: (n.rank, n.step, n.order))


def _target_order(state: VerdictState, node: Node) -> float:
    """Place a reference-only call after the target calls that produced its inputs."""
    best = -1.0
    for row in node.rows:
        if row.get("io") in INPUT_IO and row.get("producer") is not None:
            pair = state.entry.get(("reference", node.rank, node.step, row["producer"]))
            if pair is not None and pair.t is not None:
                best = max(best, float(pair.t["cseq"]))
    return best + 0.5 if best >= 0 else float(node.seq)


def judge(state: VerdictState) -> None:
    """Give every output pair a status and every call a verdict, in execution order."""
    prev: dict[int, dict[str, Any]] = {}
    for node in state.nodes:
        info = prev.get(node.rank)
        if info is None or info["step"] != node.step:
            prev[node.rank] = info = _new_step(node, info)
        in_error, in_taint, floor = _judge_inputs(state, node, info)
        node.in_error = in_error
        for out in node.outputs:
            through = _passed_through(state, node, out)  # a module's output is its last op's
            error = max(in_error, _finite_or_inf(raw_error(through))) if through else in_error
            taint = in_taint or (through is not None and id(through) in state.tainted)
            _judge_output(state, node, out, error, taint, floor)
            if id(out) in state.tainted:
                info["tainted"] = True
            param = out.home.get("param")
            if param:
                info["param_error"][param] = max(info["param_error"].get(param, 0.0), _finite(raw_error(out)))
    for pair in state.pairs:
        if not pair.status:
            _settle(state, pair)
        elif pair.kind == "identity" and pair.status in ("passed", "identical"):
            pair.status = "unpaired"  # judged harmless as an identity, but never "passed"
            pair.note = _join(pair.note, "no partner: its output matches its input's partner")


def _new_step(node: Node, last: dict[str, Any] | None) -> dict[str, Any]:
    """Per-rank memory across steps: was anything tainted before, and parameter errors."""
    info = {"step": node.step, "tainted": False, "param_error": {}, "seen": set(),
            "first": last is None, "tainted_before": False, "prev_param_error": {}}
    if last is not None:
        info["tainted_before"] = last["tainted"] or last["tainted_before"]
        info["prev_param_error"] = last["param_error"]
        info["previous_step"] = last["step"]
    return info


def _judge_inputs(state: VerdictState, node: Node, info: dict[str, Any]) -> tuple[float, bool, float]:
    """Largest input error, whether any input carries a divergence, smallest input norm."""
    in_error, taint, floor = 0.0, False, math.inf
    for row in node.rows:
        if row.get("io") not in INPUT_IO:
            continue
        key = (node.side, node.rank, node.step, row["id"])
        own = state.entry.get(key)
        own = own if own is not None and own.kind in PAIRED else None
        producers = _producer_entries(state, node, row, own)
        measured = own if own is not None and own.metrics else next((p for p in producers if p.metrics), None)
        if measured is None:
            continue
        tainted = any(id(p) in state.tainted for p in [measured, *producers])
        if own is not None and _is_leaf(state, node, row):
            tainted = _judge_leaf(state, node, row, own, info) or tainted
        error = _input_error(state, measured, elementwise=node.rows[0].get("phase") == "optimizer")
        if is_float(row.get("dtype")) or error > 0:
            in_error = max(in_error, _finite_or_inf(error))
        ref_norm = measured.metrics.get("ref_norm", 0.0)
        if (row.get("numel") or 0) > 1 and is_float(row.get("dtype")) and ref_norm > 0:
            floor = min(floor, ref_norm)
        taint = taint or tainted
        if own is not None and not own.status:
            _set_input_status(state, own, tainted)
    return in_error, taint, (floor if math.isfinite(floor) else 0.0)


def _input_error(state: VerdictState, measured: Pair, *, elementwise: bool = False) -> float:
    """An input's relative error, taken at the most it plausibly is.

    From statistics, the error is a lower bound: noise spread over n elements moves the
    norm, mean and spread by about 1/sqrt(n) of its size, so a differing input may carry
    sqrt(n) times the bound (at most ``(||t|| + ||r||) / ||r||``), and at least the rounding
    noise of its precision. An output is judged on what is proven (its bound) against what
    its inputs may carry, so rounding noise is never blamed on the op that received it.

    ``elementwise``: the op divides element by element (Adam-like updates), so an element
    that is noise on both sides (a gradient that is zero in truth) legitimately becomes a
    full-size update: the input's error counts as its ``elem_rel_rms`` (tensors), or as the
    most it may be (statistics, which cannot see elements).
    """
    error = raw_error(measured)
    if elementwise and measured.mode != "statistics":
        error = max(error, measured.metrics.get("elem_rel_rms") or 0.0)
    if measured.mode != "statistics" or measured.metrics.get("bit_exact") or not error > 0:
        return error
    t, r = measured.t or {}, measured.r or {}
    lower = state.noise.lower_dtype(t.get("dtype"), r.get("dtype"))
    n = max(int(r.get("numel") or t.get("numel") or 1), 1)
    ref_norm = measured.metrics.get("ref_norm") or 0.0
    t_norm = t.get("norm")
    t_norm = float(t_norm) if t_norm is not None and math.isfinite(t_norm) else ref_norm
    cap = (t_norm + ref_norm) / ref_norm if ref_norm > 0 else math.inf
    if elementwise:
        return max(error, cap)
    return max(error, min(error * math.sqrt(n), cap), state.noise.tolerance(lower))


def _passed_through(state: VerdictState, node: Node, out: Pair) -> Pair | None:
    """The pair of the record an output aliases (module outputs, views), if measured."""
    producer = out.home.get("producer")
    if producer is None:
        return None
    pair = state.entry.get((node.side, node.rank, node.step, producer))
    return pair if pair is not None and pair is not out and pair.metrics else None


def _producer_entries(state: VerdictState, node: Node, row: dict[str, Any], own: Pair | None) -> list[Pair]:
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


def producer_entry(state: VerdictState, side: str, rank: int, step: int, producer: int) -> Pair | None:
    """The measured pair of a producer; through one-sided views, layout ops and casts that
    nothing paired (they carry their input's error on), up to the tensor they read."""
    key = (side, rank, step, producer)
    first = state.entry.get(key)
    for _ in range(16):
        pair = state.entry.get(key)
        if pair is not None and pair.metrics:
            return pair
        row = state.rows.get(key)
        if row is None or row.get("io") != "output" or base_op(row.get("op")) not in PASS_THROUGH:
            break
        inputs = [r for r in state.calls.get((side, rank, step, row["cseq"]), [])
                  if r.get("io") in INPUT_IO and r.get("producer") is not None
                  and (r.get("numel") or 0) > 0]
        if len(inputs) != 1:
            break
        own = state.entry.get((side, rank, step, inputs[0]["id"]))
        if own is not None and own.kind in PAIRED and own.metrics:
            return own
        key = (side, rank, step, inputs[0]["producer"])
    return first


def _is_leaf(state: VerdictState, node: Node, row: dict[str, Any]) -> bool:
    producer = row.get("producer")
    return producer is None or (node.side, node.rank, node.step, producer) not in state.rows


def _judge_leaf(state: VerdictState, node: Node, row: dict[str, Any], own: Pair,
                info: dict[str, Any]) -> bool:
    """A parameter, buffer or model input: a root, explained by earlier steps, or fine."""
    error = raw_error(own)
    lower = state.noise.lower_dtype(own.t.get("dtype"), own.r.get("dtype"))  # type: ignore[union-attr]
    tol = state.noise.tolerance(lower)
    own.error, own.tolerance = error, tol
    if own.metrics.get("bit_exact") or not error > tol:
        return False
    name = row.get("param")
    identity = name or (row.get("hash"), own.r.get("hash"), row.get("numel"), row.get("arg"))  # type: ignore[union-attr]
    if identity in info["seen"]:
        return id(own) in state.tainted or info["tainted_before"]
    info["seen"].add(identity)
    explained = not info["first"] and (
        info["tainted_before"]
        or (name and error <= max(tol, state.noise.ratio * info["prev_param_error"].get(name, -1.0)))
        or (not name and row.get("phase") == "optimizer"))
    if explained:
        own.verdict = "inherits" if info["tainted_before"] else ""
        own.note = _join(own.note, f"differs at the start of step {node.step}, as left by step "
                                   f"{info.get('previous_step')}")
        return bool(info["tainted_before"])
    if info["tainted"] and (row.get("io") == "grad" or row.get("phase") in ("backward", "optimizer")):
        # a gradient or optimizer state whose producer was not captured (module / api
        # levels), in a step that already diverged: it carries that divergence
        own.status, own.verdict = "failed", "inherits"
        own.note = _join(own.note, "no captured producer, in a step that had already diverged")
        state.tainted.add(id(own))
        return True
    own.status, own.verdict = "failed", "root"
    state.tainted.add(id(own))
    state.roots.append((own, row, node.side))
    return True


def _set_input_status(state: VerdictState, own: Pair, tainted: bool) -> None:
    error = raw_error(own)
    if not math.isfinite(own.error):
        lower = state.noise.lower_dtype(own.t.get("dtype"), own.r.get("dtype"))  # type: ignore[union-attr]
        own.error, own.tolerance = error, state.noise.tolerance(lower)
    if own.metrics.get("bit_exact"):
        own.status = "identical"
    elif tainted and error > own.tolerance:
        own.status, own.verdict = "failed", own.verdict or "inherits"
        state.tainted.add(id(own))
    else:
        own.status = "passed"


def _judge_output(state: VerdictState, node: Node, out: Pair, in_error: float, in_taint: bool,
                  floor: float) -> None:
    if out.mode == "skipped" or not out.metrics:
        out.status = out.status or "skipped"
        return
    lower = state.noise.lower_dtype(out.t.get("dtype"), out.r.get("dtype"))  # type: ignore[union-attr]
    tol = state.noise.tolerance(lower)
    m = out.metrics
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        error = math.inf
    else:
        diff, ref = m.get("diff_norm", 0.0), m.get("ref_norm", 0.0)
        denom = max(ref, floor)
        error = 0.0 if diff == 0 else (diff / denom if denom > 0 else math.inf)
    out.error, out.tolerance = error, tol
    in_error *= condition(node.rows, out.home, m.get("ref_norm") or 0.0)
    m["input_error"] = in_error
    m["ratio"] = error / in_error if in_error > 0 else (0.0 if error == 0 else math.inf)
    out.status = _output_status(state, node, out, error, tol, in_error, in_taint, is_float(lower))


def _output_status(state: VerdictState, node: Node, out: Pair, error: float, tol: float,
                   in_error: float, in_taint: bool, floating: bool) -> str:
    if out.metrics.get("bit_exact"):
        return "identical"
    if not error > tol:
        return "passed"
    out_of_proportion = error > max(tol, state.noise.ratio * in_error) and (floating or in_error == 0)
    if out_of_proportion:
        out.verdict = "culprit"
        node.verdict = "culprit"
        if node.worst is None or _score(out, in_error, state) > _score(node.worst, in_error, state):
            node.worst = out
    elif in_taint:
        out.verdict = "inherits"
        node.verdict = node.verdict or "inherits"
    else:
        out.note = _join(out.note, "above tolerance but in proportion to its inputs' error")
        return "passed"
    state.tainted.add(id(out))
    return "failed"


def _score(pair: Pair, in_error: float, state: VerdictState) -> float:
    allowed = max(pair.tolerance, state.noise.ratio * in_error, 1e-300)
    return pair.error / allowed if math.isfinite(pair.error) else math.inf


def _settle(state: VerdictState, pair: Pair) -> None:
    """Status of pairs no call judged: unpaired, skipped, or a lone measured pair."""
    if pair.kind == "unpaired":
        pair.status = "unpaired"
    elif pair.mode == "skipped" or not pair.metrics:
        pair.status = "skipped"
    elif pair.metrics.get("bit_exact"):
        pair.status = "identical"
    else:
        lower = state.noise.lower_dtype(pair.t.get("dtype"), pair.r.get("dtype"))  # type: ignore[union-attr]
        pair.error, pair.tolerance = raw_error(pair), state.noise.tolerance(lower)
        pair.status = "passed" if not pair.error > pair.tolerance else "failed"
        if pair.status == "failed":
            pair.note = _join(pair.note, "differs, but no paired producer explains where from")


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _finite_or_inf(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


VerdictPass = Callable[[VerdictState], None]
VERDICT_PASSES: list[VerdictPass] = [index, judge, demote_enclosing]


def register_pass(fn: VerdictPass, *, before: VerdictPass | None = None) -> VerdictPass:
    """Add a pass (e.g. float64 replay of suspects); refuses one already registered."""
    if fn in VERDICT_PASSES:
        raise ValueError(f"verdict pass {fn.__name__} is already registered")
    at = VERDICT_PASSES.index(before) if before in VERDICT_PASSES else len(VERDICT_PASSES)
    VERDICT_PASSES.insert(at, fn)
    return fn


def run_passes(pairs: list[Pair], noise: NoiseModel) -> VerdictState:
    """Apply every registered pass; returns the state holding nodes, roots and findings."""
    from opscope.compare import blame

    state = VerdictState(pairs, noise)
    for fn in VERDICT_PASSES:
        fn(state)
    blame.describe(state)
    blame.rank(state)
    return state

