"""Verdicts: which operator made the two sides diverge.

Passes over the measured pairs, applied in order (:data:`VERDICT_PASSES`; a pass that
needs the pairs and the verdict state registers with :func:`register_pass`; one over the
finished result, such as float64 replay, with :mod:`opscope.compare.passes`):

1. :func:`index` — op calls, their rows and the pair holding each row, per side.
2. :func:`judge` — in execution order, per rank and step: an op whose output error is out of
   proportion to its inputs' error (``> max(tolerance, ratio * input error)``) is a
   *culprit*; one whose inputs already carry a divergence *inherits*; a parameter or model
   input that differs at the start of a step is a *root* (inputs, leaves and the pairs no
   call judged: :mod:`opscope.compare.inputs`).
3. :func:`opscope.compare.recompute.repeats_its_forward` — a recomputation (activation
   checkpointing) that remade its own side's forward bit for bit inherits that forward's
   difference.
4. :func:`opscope.compare.healing.forgive_compensated` — a one-sided op judged as an identity
   is no culprit where the other side makes its difference up further on.
5. :func:`opscope.compare.nesting.demote_enclosing` — a module call that contains a diverged
   call of a submodule inherits.
6. :func:`opscope.compare.blame.describe` and :func:`opscope.compare.blame.rank` — findings
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
from typing import Any

from opscope.compare import carried
from opscope.compare.align import INPUT_IO, Pair
from opscope.compare.collectives import judge_collective, made_by
from opscope.compare.conditioning import condition
from opscope.compare.flow import base_op
from opscope.compare.graphs import (
    call_rows,
    carries_divergence,
    forwards,
    graph_chain,
    graph_dtype,
    graph_floor,
    has_graphs,
    is_graph_call,
    partner_graph_floor,
)
from opscope.compare.healing import forgive_compensated
from opscope.compare.inputs import is_leaf, judge_leaf, judge_one_sided, producer_entries, set_input_status, settle
from opscope.compare.internal import (
    available,
    build_spans,
    gradient_nodes,
    judge_gradient,
    judge_internal,
    owner_of,
)
from opscope.compare.loss_scale import excuse
from opscope.compare.measure import ENCODINGS_DIFFER
from opscope.compare.nesting import demote_enclosing
from opscope.compare.param_moves import Moves, carry_on, is_step, note_update, read_bound
from opscope.compare.recompute import repeats_its_forward
from opscope.compare.state import (
    PAIRED,
    Node,
    RowKey,
    VerdictState,
    exact_differs,
    finite,
    finite_or_inf,
    frees_reader,
    input_error,
    join,
    raw_error,
    statistics_spread,
)
from opscope.compare.tolerance import NoiseModel, dtype_extremes, is_float
from opscope.compare.unfilled import judge_unfilled, left_by
from opscope.model.calls import OVERWRITES_FIRST
from opscope.model.records import ABSENT_NOTE


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
            side = pair.side or "target"
            by_call[(side, home["rank"], home["step"], home["cseq"])].append(pair)
        elif pair.kind in PAIRED and home.get("io") == "param" and home.get("producer") is None:
            # a weight read by a call with no paired output (an inductor graph): judged as a
            # leaf all the same, so that one that differs is a root
            by_call.setdefault(("target", home["rank"], home["step"], home["cseq"]), [])
    for (side, rank, step, seq), outs in by_call.items():
        node = Node(side, rank, step, seq, float(seq), state.calls[(side, rank, step, seq)], outs)
        if side == "reference":
            node.order = _target_order(state, node)
        state.nodes.append(node)
    state.nodes.extend(gradient_nodes(state))
    state.nodes.sort(key=lambda n: (n.rank, n.step, n.order))
    build_spans(state)


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
    prev = state.previous  # per rank, carried over from partition to partition
    for node in state.nodes:
        info = prev.get(node.rank)
        if info is None or info["step"] != node.step:
            prev[node.rank] = info = _new_step(node, info)
        if node.kind == "gradient":
            info["tainted"] = judge_gradient(state, node, info["tainted"], info["noise"]) or info["tainted"]
            continue
        in_error, in_taint, floor = _judge_inputs(state, node, info)
        if info["moves"].moved_before:  # parameters moved where statistics cannot see: so did what they made
            in_error = max(in_error, info["noise"])
        if is_step(node.rows[0]):
            note_update(state, node, info)  # how far the update can move each parameter
        if _reads_unseen(node):  # an API's backward reads its forward's saved tensors, out of sight:
            # the step's rounding so far, or (as a compiled backward graph) its divergence
            in_error = math.inf if info["tainted"] else max(in_error, info["noise"])
            in_taint = in_taint or info["tainted"]
        if has_graphs(state):
            in_error, in_taint, floor = _graph_inputs(state, node, in_error, in_taint, floor)
            if node.graph is not None or is_graph_call(node):  # it computed out of sight: many ops' rounding
                in_error = max(in_error, info["noise"])
        span = state.span_ends.get((node.side, node.rank, node.step, node.seq))
        if span is not None:  # a module call's output is judged against its submodules' too
            known, known_taint = available(state, node, span, node.seq)
            in_error, in_taint = max(in_error, known), in_taint or known_taint
        node.in_error = in_error
        for out in node.outputs:
            through = _passed_through(state, node, out)  # a module's output is its last op's
            error = max(in_error, finite_or_inf(raw_error(through))) if through else in_error
            taint = in_taint or (through is not None and id(through) in state.tainted)
            _judge_output(state, node, out, error, taint, floor)
            carried.remember(info, out)
            if not (info["tainted"] or info["tainted_before"]):  # after a divergence: its consequence
                carried.count_decision(state, node, out, info["decisions"])
            if id(out) in state.tainted:
                info["tainted"] = True
            elif out.status == "passed" and math.isfinite(out.error):
                info["noise"] = max(info["noise"], out.error)  # what rounding did in this step
            param = out.home.get("param")
            if param:
                info["param_error"][param] = max(info["param_error"].get(param, 0.0), finite(raw_error(out)))
        carry_on(node, info["moves"])
    if state.extra_nodes:  # tensors made by a module's own code (module level)
        state.nodes.extend(state.extra_nodes)
        state.nodes.sort(key=lambda n: (n.rank, n.step, n.order))
    for pair in state.pairs:
        if not pair.status:
            settle(state, pair)
        elif pair.kind == "identity" and pair.status in ("passed", "identical"):
            pair.status = "unpaired"  # judged harmless as an identity, but never "passed"
            pair.note = join(pair.note, "no partner: its output matches its input's partner")


def _reads_unseen(node: Node) -> bool:
    """An API call's backward (api level): its record holds the gradients in and out only,
    not the forward's tensors it reads (a rsqrt's input, a softmax's output), which carry
    the step's rounding so far, or its divergence."""
    return node.rows[0].get("phase") == "backward" and any(
        r.get("io") == "output" and r.get("arg") == "grad_input" for r in node.rows)


def _new_step(node: Node, last: dict[str, Any] | None) -> dict[str, Any]:
    """Per-rank memory across steps: was anything tainted before, and parameter errors."""
    info = {"step": node.step, "tainted": False, "param_error": {}, "seen": {}, "noise": 0.0,
            "first": last is None, "tainted_before": False, "prev_param_error": {}, "prev_noise": 0.0,
            "made": {}, "prev_made": {}, "decisions": {"first": None, "more": 0}, "found": bool(last and last["found"]),
            "moves": Moves() if last is None else last["moves"].next_step()}
    if last is not None:
        info["prev_made"], info["decisions"] = last["made"], last["decisions"]
        info["tainted_before"] = last["tainted"] or last["tainted_before"]
        info["prev_param_error"] = last["param_error"]
        info["prev_noise"] = last["noise"]
        info["previous_step"] = last["step"]
    return info


def _judge_inputs(state: VerdictState, node: Node, info: dict[str, Any]) -> tuple[float, bool, float]:
    """Largest input error, whether any input carries a divergence, smallest input norm."""
    in_error, taint, floor, unknown, known = 0.0, False, math.inf, 0.0, False
    for row in node.rows:
        if row.get("io") not in INPUT_IO:
            continue
        key = (node.side, node.rank, node.step, row["id"])
        own = state.entry.get(key)
        own = own if own is not None and own.kind in PAIRED else None
        # (dumps from before such an argument was recorded unmeasured hold what was there)
        if row.get("slot") == 0 and base_op(row.get("op")) in OVERWRITES_FIRST:
            if own is not None and not own.status:  # what was there before does not count
                if own.metrics.get("bit_exact"):
                    own.status = "identical"
                else:
                    own.status, own.note = "passed", join(own.note, "overwritten without being read")
            continue
        producers = producer_entries(state, node, row, own)
        measured = own if own is not None and own.metrics else next((p for p in producers if p.metrics), None)
        if own is not None and own.mode == "skipped" and ("shapes differ" in own.note or ENCODINGS_DIFFER in own.note):
            # a data-dependent shape (tokens routed to an expert, a nonzero), or a mask encoded
            # otherwise: the input is another tensor on each side, so this op's output says
            # nothing of the op itself
            in_error = math.inf
            continue
        if row.get("note") == ABSENT_NOTE or (own is not None and any(r.get("note") == ABSENT_NOTE for r in own.rows)):
            # not in the graph that ran (TensorFlow, Grappler): what the op read is unknown
            in_error = math.inf
            continue
        if measured is None:
            if info["tainted"] and is_float(row.get("dtype")):  # unknown, in a step already diverged
                in_error, taint = math.inf, True
            elif (own is None or own.status == "unpaired") and is_float(row.get("dtype")) and not has_graphs(state):
                unknown = max(unknown, math.inf if info["decisions"]["first"] is not None  # after a choice came
                              else state.noise.tolerance(str(row.get("dtype"))))  # out otherwise (graphs: below)
            continue
        tainted = any(id(p) in state.tainted for p in [measured, *producers])
        made = made_by(state, node, row) if own is not None and own.metrics else None
        left = left_by(state, node, row) if own is not None and own.metrics and made is None else None
        if made is not None and own is not None and not own.status:  # what a collective brought from the other ranks
            tainted = judge_collective(state, node, own, made)
        elif own is not None and not own.status and (written := judge_one_sided(state, node, own, info)) is not None:
            tainted = written or tainted  # a parameter an op only one side ran wrote (in part, too)
        elif left is not None and own is not None and not own.status:  # memory an op left holding no data
            tainted = judge_unfilled(state, node, own, left) or tainted
        elif own is not None and is_leaf(state, node, row, own):
            span = owner_of(state, node.side, node.rank, node.step, row)
            if span is not None:
                tainted = judge_internal(state, node, row, own, span) or tainted
            else:
                tainted = judge_leaf(state, node, row, own, info) or tainted
        error = input_error(state, measured, elementwise=node.rows[0].get("phase") == "optimizer")
        error = max(error, read_bound(state, node, row, own, measured, producers))  # moved by earlier updates
        if frees_reader(row, measured, error):  # indices, masks, counts that differ
            error = math.inf
        if is_float(row.get("dtype")) or error > 0:
            in_error, known = max(in_error, finite_or_inf(error)), known or is_float(row.get("dtype"))
        if measured.mode == "statistics" and not measured.metrics.get("bit_exact"):
            node.spread_n = max(node.spread_n, int(row.get("numel") or 0))
        # (no floor from a tensor holding Infs: its "norm" is an element's scale, metrics._norm_or_bound)
        ref_norm = 0.0 if measured.metrics.get("extremes_only") else measured.metrics.get("ref_norm", 0.0)
        if (row.get("numel") or 0) > 1 and is_float(row.get("dtype")) and ref_norm > 0:
            floor = min(floor, ref_norm)
        taint = taint or tainted
        if own is not None and not own.status:
            set_input_status(state, own, tainted)
    in_error = unknown if unknown and not known and not in_error else in_error  # all from ops one side ran
    return in_error, taint, (floor if math.isfinite(floor) else 0.0)


def _passed_through(state: VerdictState, node: Node, out: Pair) -> Pair | None:
    """The pair of the record an output aliases (module outputs, views), if measured."""
    producer = out.home.get("producer")
    if producer is None:
        return None
    pair = state.entry.get((node.side, node.rank, node.step, producer))
    return pair if pair is not None and pair is not out and pair.metrics else None


def _graph_inputs(state: VerdictState, node: Node, in_error: float, in_taint: bool,
                  floor: float) -> tuple[float, bool, float]:
    """What compiled graphs add to a call's inputs (:mod:`opscope.compare.graphs`): the first
    graph of an uncompared chain it reads, the precision they computed in, the gradient that
    entered a backward graph, and a divergence they carry."""
    calls = call_rows(state, node)
    chain = graph_chain(state, node, calls)
    if chain:  # what it reads was made by compiled graphs nothing compared
        side, rows = chain[0]
        node.graph = (side, min(rows, key=lambda r: r["seq"]))
    saved = forwards(state, node, [*calls, *chain])  # what their backward graphs read unseen
    node.precision = graph_dtype([*calls, *chain, *saved])
    if carries_divergence(state, node, [*chain, *saved]):
        in_error, in_taint = math.inf, True  # a root they read, or a diverged forward: carried on
    return in_error, in_taint, max(floor, graph_floor(node), partner_graph_floor(calls))


def _judge_output(state: VerdictState, node: Node, out: Pair, in_error: float, in_taint: bool,
                  floor: float) -> None:
    if out.mode == "skipped" or not out.metrics:
        out.status = out.status or "skipped"
        return
    t, r = out.rows
    lower = state.noise.lower_dtype(t.get("dtype"), r.get("dtype"))
    if node.precision is not None:  # a compiled graph computed in it, out of sight
        lower = state.noise.lower_dtype(lower, node.precision)
    tol = state.noise.tolerance(lower)
    m = out.metrics
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        error = math.inf
    else:
        diff, ref = m.get("diff_norm", 0.0), m.get("ref_norm", 0.0)
        denom = max(ref, floor)
        error = (exact_differs(out) if m.get("hash_differs") else 0.0) if diff == 0 else (
            diff / denom if denom > 0 else math.inf)
    out.error, out.tolerance = error, tol
    in_error *= condition(node.rows, out.home, m.get("ref_norm") or 0.0)
    in_error *= statistics_spread(node.spread_n, int(out.home.get("numel") or 0))
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
    if out_of_proportion and dtype_extremes(*out.rows):
        out.note = join(out.note, "holds each side's own dtype extreme (a mask's fill, finfo.min): "
                                  "differs by the dtypes; its readers are judged against that")
        return "passed"
    scaled = excuse(out) if out_of_proportion else None  # mixed precision's loss scaling
    if scaled == "passed":
        return "passed"
    if scaled == "inherits":
        out_of_proportion, in_taint = False, True
    if out_of_proportion:
        out.verdict = "culprit"
        node.verdict = "culprit"
        if node.worst is None or _score(out, in_error, state) > _score(node.worst, in_error, state):
            node.worst = out
    elif in_taint:
        out.verdict = "inherits"
        node.verdict = node.verdict or "inherits"
    else:
        out.note = join(out.note, "above tolerance but in proportion to its inputs' error")
        return "passed"
    state.tainted.add(id(out))
    return "failed"


def _score(pair: Pair, in_error: float, state: VerdictState) -> float:
    allowed = max(pair.tolerance, state.noise.ratio * in_error, 1e-300)
    return pair.error / allowed if math.isfinite(pair.error) else math.inf


VerdictPass = Callable[[VerdictState], None]
VERDICT_PASSES: list[VerdictPass] = [index, judge, repeats_its_forward, forgive_compensated, demote_enclosing]


def register_pass(fn: VerdictPass, *, before: VerdictPass | None = None) -> VerdictPass:
    """Add a pass over the verdict state (before ``before``, or last); refuses one already
    registered. (Replay runs over the finished result instead: opscope.compare.passes.)"""
    if fn in VERDICT_PASSES:
        raise ValueError(f"verdict pass {fn.__name__} is already registered")
    at = VERDICT_PASSES.index(before) if before in VERDICT_PASSES else len(VERDICT_PASSES)
    VERDICT_PASSES.insert(at, fn)
    return fn


def run_passes(pairs: list[Pair], noise: NoiseModel,
               previous: dict[int, dict[str, Any]] | None = None) -> VerdictState:
    """Apply every registered pass; returns the state holding nodes, roots and findings.

    ``pairs`` may be one (rank, step) partition's (what :func:`opscope.compare` does: every
    index is per partition, and the ranking of findings is a sort of the findings alone);
    ``previous`` is then the dict the same call gave the rank's previous partition
    (``state.previous``), which judging the next step reads and updates."""
    from opscope.compare import blame

    state = VerdictState(pairs, noise, previous=previous if previous is not None else {})
    for fn in VERDICT_PASSES:
        fn(state)
    blame.describe(state)
    blame.rank(state)
    return state

