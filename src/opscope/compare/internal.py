"""Module-level dumps: tensors a module's own code makes between its submodules.

At module level only module calls are recorded. A tensor made by the code of a parent's
``forward`` between two leaf modules (attention math between the q/k/v projections and the
output projection, a residual add, a pooling before the head) first appears as the input
of the next submodule, with no captured producer. It is not a root of the divergence: it
is an output of the innermost module call that brackets it (the *owner*), whose inputs,
and whose submodules' outputs so far, are everything its code could have read. Judged
against those, a tensor whose error is out of proportion makes the owner the culprit
("its own code, between its submodules"); one that carries their divergence inherits.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from typing import Any

from opscope.compare.conditioning import reduction
from opscope.compare.loss_scale import excuse
from opscope.compare.pair import INPUT_IO
from opscope.compare.param_moves import pair_bound
from opscope.compare.state import Node, VerdictState, frees_reader, input_error, join, raw_error
from opscope.compare.tolerance import is_float

Row = dict[str, Any]


# Phases that run forward code: the forward, and activation checkpointing's second run of it
FORWARD_LIKE = ("forward", "recompute")


def build_spans(state: VerdictState) -> None:
    """Forward module calls (a recomputation's too) whose records bracket other records, per
    side, rank and step."""
    bounds: dict[tuple[Any, ...], list[Any]] = {}
    ordered: dict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for (side, rank, step, _), row in state.rows.items():
        ordered[(side, rank, step)].append(row)
        phase = row.get("phase")
        if phase not in FORWARD_LIKE or row.get("call") is None:
            continue
        key = (side, rank, step, row.get("module") or "", row.get("op"), row.get("call"), phase)
        b = bounds.setdefault(key, [row["seq"], row["seq"], row])
        b[0], b[1] = min(b[0], row["seq"]), max(b[1], row["seq"])
        if row["seq"] < b[2]["seq"]:
            b[2] = row
    for where, rows in ordered.items():
        rows.sort(key=lambda r: r["seq"])
        state.ordered[where] = rows
    for (side, rank, step, module, _, _, phase), (start, end, head) in bounds.items():
        if end == start and "." not in str(head.get("op") or "."):
            # a module call (op = its class name, not aten.* / torch.* / Opt.step) whose
            # inputs came as keywords (model(**batch)) and were not recorded
            start = _first_inside(state.ordered[(side, rank, step)], module, end, phase)
        if end > start:
            span = {"start": start, "end": end, "module": module, "head": head}
            state.spans.setdefault((side, rank, step), []).append(span)
            state.span_ends[(side, rank, step, end)] = span


def _first_inside(rows: list[Row], module: str, end: int, phase: str) -> float:
    """Where a call whose inputs were not recorded began: before the run of records of its
    submodules (in its phase) that ends at its output."""
    i = bisect.bisect_left(rows, end, key=lambda r: r["seq"])
    start: float = end
    while i > 0:
        row = rows[i - 1]
        inner = row.get("module") or ""
        if row.get("phase") != phase or not (inner == module or _inside(inner, module)):
            break
        start, i = row["seq"] - 0.5, i - 1
    return start


def owner_of(state: VerdictState, side: str, rank: int, step: int, row: Row) -> dict[str, Any] | None:
    """The innermost forward module call (or recomputed one) that brackets this record, if any."""
    if row.get("phase") not in FORWARD_LIKE or row.get("io") != "input":
        return None
    module, seq = row.get("module") or "", row["seq"]
    best = None
    for span in state.spans.get((side, rank, step), []):
        if span["start"] < seq < span["end"] and _inside(module, span["module"]) \
                and (best is None or span["start"] > best["start"]):
            best = span
    return best


def judge_internal(state: VerdictState, node: Node, row: Row, own: Any, span: dict[str, Any]) -> bool:
    """Judge a tensor made by ``span``'s own code; True when it carries a divergence."""
    known, tainted = available(state, node, span, row["seq"])
    owner = span["head"]
    what = f"made by {owner.get('module') or '(top level)'}'s own code between its submodules"
    return _judge_made(state, node, row, own, known, tainted, owner, what)


def gradient_nodes(state: VerdictState) -> list[Node]:
    """Module-level gradients at module outputs: records that no captured op produced."""
    out = []
    for pair in state.pairs:
        row = pair.t
        if pair.kind not in ("exact", "aligned", "mapped") or row is None or pair.r is None \
                or row.get("phase") != "backward" or row.get("io") != "input" \
                or row.get("producer") is not None:
            continue
        call = state.calls.get(("target", row["rank"], row["step"], row["cseq"]), [])
        if any(r.get("io") == "output" for r in call):
            continue
        out.append(Node("target", row["rank"], row["step"], row["seq"], float(row["seq"]), [row],
                        [pair], kind="gradient"))
    return out


def judge_gradient(state: VerdictState, node: Node, step_tainted: bool, noise: float = 0.0) -> bool:
    """A gradient at a module's output, against every gradient recorded before it in the
    step, the step's rounding so far (``noise``: the backward reads the forward's activations
    too, made under autocast in bf16 where the gradients are float32) and what the forward of
    the module whose code runs around it could read. Blamed on that module (the backward of
    its code between submodules, or of the next submodule)."""
    pair = node.outputs[0]
    row = pair.home
    known, tainted = backward_known(state, node.side, node.rank, node.step, row["seq"], pair)
    known = max(known, noise)
    if step_tainted:  # the backward also reads the forward's activations, already diverged
        known, tainted = math.inf, True
    parent = _parent_span(state, node, row.get("module") or "")
    if parent is not None:
        # that backward reads what the forward of the same code read (its inputs, its weights,
        # also slices of them: an expert's; inf where indices differ, a router's choice)
        key = ("forward read", node.side, node.rank, node.step, parent["start"], parent["module"])
        if key not in state.indexes:  # (once a span: a model's span is every row of its forward)
            state.indexes[key] = available(state, node, parent, parent["end"] + 1)[0]
        known = max(known, state.indexes[key])
    owner = parent["head"] if parent is not None else row
    what = (f"the gradient at {row.get('module') or '(top level)'}'s output: made by the backward of "
            f"{owner.get('module') or '(top level)'}'s own code or of the submodule that read it")
    mask = _threshold_reader(state, node, row.get("module") or "")
    if mask is not None and known < math.inf:
        known = math.inf
        what = (f"{what}, {mask} (its mask, whose input differs: an element that crossed the threshold "
                f"moves the gradient by all of that element's, a decision as an index is)")
    diverged = _judge_made(state, node, row, pair, known, tainted, owner, what, nest=False)
    if pair.verdict == "culprit":
        node.verdict, node.worst, node.in_error, node.owner = "culprit", pair, known, owner
    return diverged


# Activations whose backward keeps or drops each element of the gradient by which side of a
# threshold its input fell (ReLU's zero): piecewise, with a jump in the factor
THRESHOLDS = frozenset(("ReLU", "ReLU6", "LeakyReLU", "RReLU", "PReLU", "Hardtanh", "Threshold",
                        "Hardshrink", "Softshrink", "Hardsigmoid", "Hardswish"))


def _threshold_reader(state: VerdictState, node: Node, module: str) -> str | None:
    """The threshold activation module (THRESHOLDS) that read this module's forward output
    where that input differs between the sides, or None."""
    key = (node.side, node.rank, node.step)
    index_key = ("forward outputs", node.side, node.rank, node.step)
    outputs = state.indexes.get(index_key)
    if outputs is None:
        outputs = state.indexes[index_key] = defaultdict(list)
        for row in state.ordered.get(key, []):
            if row.get("phase") == "forward" and row.get("io") == "output":
                outputs[row.get("module") or ""].append(row)
    for row in outputs.get(module, ()):
        for reader in state.consumers.get((*key, row["id"]), []):
            if str(reader.get("op")) in THRESHOLDS:
                pair = state.entry.get((*key, reader["id"]))
                if pair is not None and pair.metrics and not pair.metrics.get("bit_exact") \
                        and raw_error(pair) > 0:
                    return f"read by {reader.get('module')} ({reader.get('op')})"
    return None


def backward_known(state: VerdictState, side: str, rank: int, step: int, seq: int,
                   exclude: Any) -> tuple[float, bool]:
    """Largest error, and any divergence, among the step's backward records before ``seq``."""
    rows = state.ordered.get((side, rank, step), [])
    known, tainted = 0.0, False
    for other in rows[:bisect.bisect_left(rows, seq, key=lambda r: r["seq"])]:
        if other.get("phase") != "backward":
            continue
        earlier = state.entry.get((side, rank, step, other["id"]))
        if earlier is not None and earlier.metrics and earlier is not exclude:
            error = max(input_error(state, earlier), earlier.metrics.get("moved") or 0.0)  # (param_moves)
            known = max(known, 0.0 if math.isnan(error) else error)
            tainted = tainted or id(earlier) in state.tainted
    return known, tainted


def module_gradient_error(state: VerdictState, node: Node, grad_row: Row, own: Any) -> float:
    """The error a parameter's gradient may carry from the gradient recorded at its module's
    output: a bias gradient sums that over the batch, and where the sum cancels (a key bias,
    whose true gradient is zero) the error relative to it grows ||g_out||·sqrt(r)/||g||."""
    rows = state.ordered.get((node.side, node.rank, node.step), [])
    module = grad_row.get("module")
    for row in rows[:bisect.bisect_left(rows, grad_row["seq"], key=lambda r: r["seq"])]:
        if row.get("phase") != "backward" or row.get("module") != module or row.get("producer") is not None:
            continue
        record = state.entry.get((node.side, node.rank, node.step, row["id"]))
        if record is None or not record.metrics:
            continue
        error = max(input_error(state, record), record.metrics.get("moved") or 0.0)
        factor = reduction([row], grad_row, own.metrics.get("ref_norm") or 0.0)
        return 0.0 if math.isnan(error) else error * factor
    return 0.0


def _parent_span(state: VerdictState, node: Node, module: str) -> dict[str, Any] | None:
    best = None
    for span in state.spans.get((node.side, node.rank, node.step), []):
        if _inside(module, span["module"]) and (best is None or len(span["module"]) > len(best["module"])):
            best = span
    return best


def _judge_made(state: VerdictState, node: Node, row: Row, own: Any, known: float, tainted: bool,
                owner: Row, what: str, *, nest: bool = True) -> bool:
    """Judge a tensor some module's code made from what had ``known`` error (and taint)."""
    lower = state.noise.lower_dtype(own.t.get("dtype"), own.r.get("dtype"))
    error, tol = raw_error(own), state.noise.tolerance(lower)
    own.error, own.tolerance = error, tol
    if own.metrics.get("bit_exact"):
        own.status = "identical"
        return False
    if not error > tol:
        own.status = "passed"
        return False
    out_of_proportion = error > max(tol, state.noise.ratio * known) and (is_float(lower) or known == 0)
    scaled = excuse(own) if out_of_proportion else None  # mixed precision's loss scaling
    if scaled == "passed":
        own.status = "passed"
        return False
    if scaled == "inherits":
        out_of_proportion, tainted = False, True
    if out_of_proportion:
        _blame(state, node, row, own, known, owner, what, nest)
        return True
    if tainted:
        own.status, own.verdict = "failed", "inherits"
        state.tainted.add(id(own))
        return True
    own.status = "passed"
    own.note = join(own.note, f"{what}; in proportion to the error of what it read")
    return False


def _blame(state: VerdictState, node: Node, row: Row, own: Any, known: float, owner: Row, what: str,
           nest: bool) -> None:
    """``own`` is out of proportion to what its maker read: the culprit (its owner's, nested)."""
    own.status, own.verdict = "failed", "culprit"
    own.metrics["input_error"] = known
    own.metrics["ratio"] = own.error / known if known > 0 else math.inf
    own.note = join(own.note, what)
    state.tainted.add(id(own))
    if nest:
        rows = [r for r in state.calls.get((node.side, node.rank, node.step, owner["cseq"]), [])
                if r.get("io") in INPUT_IO]
        state.extra_nodes.append(Node(node.side, node.rank, node.step, row["seq"], row["seq"] - 0.5,
                                      rows, [own], verdict="culprit", in_error=known, worst=own,
                                      owner=owner))


def available(state: VerdictState, node: Node, span: dict[str, Any], seq: int) -> tuple[float, bool]:
    """Largest error, and any divergence, among what the owner's code could read by ``seq``:
    its own inputs and the records of its submodules so far."""
    rows = state.ordered.get((node.side, node.rank, node.step), [])
    lo = bisect.bisect_left(rows, span["start"], key=lambda r: r["seq"])
    hi = bisect.bisect_left(rows, seq, key=lambda r: r["seq"])
    known, tainted = 0.0, False
    for row in rows[lo:hi]:
        if not _inside(row.get("module") or "", span["module"]) and (row.get("module") or "") != span["module"]:
            continue
        pair = state.entry.get((node.side, node.rank, node.step, row["id"]))
        if pair is None or not pair.metrics:
            continue
        error = max(input_error(state, pair), pair_bound(state, node, row, pair, pair))  # (param_moves)
        if frees_reader(row, pair, error):  # the indices it routes by (MixtralExperts' top_k_index)
            error = math.inf
        if math.isfinite(error) or error == math.inf:
            known = max(known, 0.0 if math.isnan(error) else error)
        tainted = tainted or id(pair) in state.tainted
    return known, tainted


def _inside(inner: str, outer: str) -> bool:
    return (outer == "" and inner != "") or inner.startswith(outer + ".")
