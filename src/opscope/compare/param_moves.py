"""How far an adaptive optimizer can have moved a parameter that statistics cannot follow.

Adam divides each element's averaged gradient by the root of its averaged square, so every
element moves by about the learning rate whatever its gradient's size: an element whose
gradient is noise on both sides (near zero in truth, with a sign that bf16 rounding flips)
moves by ``lr`` one way in one run and the other way in the other. Two runs that were equal
then differ by up to ``2·lr`` in such elements, while the parameter's norm, mean and extremes
barely change (RWKV's time-mix vectors under bf16 autocast: 3.7e-11 relative in their
statistics, 2e-3 in what reads them). From statistics, a parameter's error is a lower bound;
after such an update, its readers need an estimate from above.

How far one element can move has a bound, from the optimizer's own settings (recorded as the
``args`` of its parameter rows): by Cauchy-Schwarz over the gradients so far, ``|m_t| /
sqrt(v_t) <= (1-b1) sqrt(S_t) / sqrt(1-b2)`` with ``S_t = sum_{j<t} (b1^2/b2)^j``, so Adam (and
AdamW, amsgrad or not) moves an element at most ``lr · sqrt(1-b2^t) / (1-b1^t) · (1-b1)
sqrt(S_t) / sqrt(1-b2)`` in its ``t``-th step: exactly ``lr`` in the first, 1.04 lr in the
tenth, at most 7.3 lr for the default betas (:func:`step_bound`). Weight decay only shrinks a
difference. How many elements move apart, statistics cannot tell: those whose gradient is
within the two runs' difference of zero. :func:`note_update` takes their share as
``min(1, FLIPS · r)``, ``r`` the gradient's relative error, and grows the parameter's
root-mean-square bound by both runs' step bounds times the square root of that share: two
runs apart by a thread count (``r`` ~1e-7) keep nearly every element, a bf16 run against its
float32 one (``r`` ~1e-3) may have moved most of them apart. ``FLIPS`` = 100 is what RWKV's
time-mix vectors needed (40% of their elements moved apart under a gradient 4e-3 off in its
statistics, 1.3e-2 element by element): gradients pile up near zero far more than a normal
distribution does.

:func:`moved_error` turns the bound into a relative error for a read of the parameter in a
later step (a bias's against its reader's output: what is added moves that output by as
much, a far smaller share of it than of a bias near zero), and :func:`read_bound` carries it
on through ops of parameters alone (``1 - time_mix``, a weight's cast under autocast), whose
outputs' statistics hide it as well. What the forward makes of moved parameters differs by
more than its statistics show too: the verdict takes the step's rounding so far (its largest
passed error) as a floor of every input's error in such steps (docs/compare.md, "Parameters
after an update").
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any

from opscope.compare.pair import Pair
from opscope.compare.state import Node, VerdictState, raw_error
from opscope.compare.tolerance import epsilon

ADAPTIVE = frozenset({"Adam", "AdamW"})
FLIPS = 100.0


@functools.lru_cache(maxsize=256)
def _factor(b1: float, b2: float, t: int) -> float | None:
    """The most ``|m̂_t| / sqrt(v̂_t)`` can be in step ``t`` (1-based; 0: any step)."""
    ratio = b1 * b1 / b2
    if t <= 0:  # the step is not known: the supremum over all steps
        return None if ratio >= 1 else (1 - b1) / math.sqrt((1 - b2) * (1 - ratio))
    s = float(t) if ratio == 1 else (1 - ratio ** t) / (1 - ratio)
    return math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * (1 - b1) * math.sqrt(s) / math.sqrt(1 - b2)


def step_bound(settings: dict[str, Any]) -> float | None:
    """The most one update moves an element, from an optimizer row's settings; None where
    they do not bound it (another optimizer, a setting not recorded)."""
    if settings.get("optimizer") not in ADAPTIVE:
        return None
    lr, betas, step = settings.get("lr"), settings.get("betas"), settings.get("step")
    if not isinstance(lr, (int, float)) or not isinstance(betas, list) or len(betas) != 2:
        return None
    b1, b2 = betas
    if not (isinstance(b1, (int, float)) and isinstance(b2, (int, float)) and 0 <= b1 < 1 and 0 < b2 < 1):
        return None
    factor = _factor(float(b1), float(b2), step + 1 if isinstance(step, int) and step >= 0 else 0)
    return None if factor is None else abs(lr) * factor


def is_step(row: dict[str, Any]) -> bool:
    """Is the row an optimizer step's own record (``<Optimizer>.step``, optimizer phase)?"""
    return row.get("phase") == "optimizer" and str(row.get("op")).endswith(".step")


def settings_of(row: dict[str, Any] | None) -> dict[str, Any]:
    """The optimizer settings on a parameter row (``{}`` where none were recorded; not to be
    changed: the rows of one group share one text, parsed once)."""
    text = row.get("args") if row is not None else None
    return _parsed(text) if text else {}


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and "optimizer" in doc else {}


@dataclass
class Moves:
    """One rank's bounds (per element, absolute) by parameter name: ``after`` the steps judged
    so far, ``before`` the step being judged (what its reads carry), and for the notes the
    first update that grew one, the largest, and whether a read was judged against one."""

    after: dict[str, float] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)
    first: dict[str, Any] | None = None
    largest: tuple[float, str, int] = (0.0, "", -1)
    used: bool = False
    # the largest bound an output of this step carries: what a gradient made out of sight
    # (module level) may carry as well, as it may carry the step's rounding
    in_step: float = 0.0

    # did an update before this step move a parameter by a bound statistics cannot see (asked
    # once a call: found once a step)
    moved_before: bool = False

    def next_step(self) -> Moves:
        return Moves(dict(self.after), self.after, self.first, self.largest, self.used,
                     moved_before=any(0 < v < math.inf for v in self.after.values()))


def note_update(state: VerdictState, node: Node, info: dict[str, Any]) -> None:
    """An optimizer step's call (``X.step``): each parameter's bound after it. Unchanged while
    both runs' parameters and gradients are equal; once either differs, grown by both runs'
    step bounds times the square root of the share of elements that may have moved apart
    (and by a rounding of the parameter's dtype); infinite (not known: statistics stay a
    lower bound) for an optimizer that does not bound its steps."""
    moves: Moves = info["moves"]
    grads = {r.get("param"): r for r in node.rows if r.get("io") == "grad"}
    grown = []
    for row in node.rows:
        name = row.get("param")
        if row.get("io") != "param" or not name:
            continue
        pair = state.entry.get((node.side, node.rank, node.step, row["id"]))
        grad = grads.get(name)
        gpair = state.entry.get((node.side, node.rank, node.step, grad["id"])) if grad is not None else None
        delta = moves.before.get(name, 0.0)
        if delta == 0.0 and _equal(pair) and (grad is None or _equal(gpair)):
            moves.after[name] = 0.0
            continue
        if pair is None or pair.t is None or pair.r is None:
            moves.after[name] = math.inf
            continue
        t, r = pair.rows
        settings = [settings_of(t), settings_of(r)]
        bounds = [b for b in map(step_bound, settings) if b is not None]
        if len(bounds) != 2 or not math.isfinite(delta):
            moves.after[name] = math.inf
            continue
        size = max(float(t.get("absmax") or 0.0), float(r.get("absmax") or 0.0)) + max(bounds)
        moved_apart = min(1.0, FLIPS * _finite_or_one(raw_error(gpair) if gpair is not None else 1.0))
        rounding = epsilon(t.get("dtype")) * size  # each side rounds by half an ulp
        moves.after[name] = delta + math.sqrt(moved_apart) * sum(bounds) + rounding
        moves.largest = max(moves.largest, (moves.after[name], name, node.step))
        grown.append(settings[0])
    if grown and moves.first is None:
        moves.first = {"rank": node.rank, "step": node.step, "count": 0, "settings": grown[0]}
    if grown and moves.first is not None and moves.first["step"] == node.step:
        moves.first["count"] += len(grown)


def _finite_or_one(x: float) -> float:
    return x if math.isfinite(x) else 1.0


def _equal(pair: Pair | None) -> bool:
    return pair is not None and bool(pair.metrics.get("bit_exact"))


def moved_error(moves: Moves | None, name: str | None, measured: Pair | None, out: Pair | None = None) -> float:
    """The relative error a later step's read of parameter ``name`` may carry from the
    updates before it: ``delta·sqrt(n) / ||reference||``, at most ``(||t|| + ||r||) / ||r||``
    (0 where nothing bounds it: the statistics' own error stands). A bias read by a call with
    output ``out``: at most ``delta·sqrt(n_out) / ||out||``."""
    delta = moves.before.get(name) if moves is not None and name else None
    if not delta or not math.isfinite(delta) or measured is None or measured.mode != "statistics":
        return 0.0
    assert moves is not None
    moves.used = True
    ref_norm = float(measured.metrics.get("ref_norm") or 0.0)
    t, r = measured.t or {}, measured.r or {}
    if ref_norm <= 0:
        return math.inf
    t_norm = float(t.get("norm") or 0.0)
    cap = (t_norm + ref_norm) / ref_norm if math.isfinite(t_norm) else math.inf  # ||t - r|| <= ||t|| + ||r||
    error = min(delta * math.sqrt(int(r.get("numel") or 0)) / ref_norm, cap)
    if out is not None and name is not None and name.rpartition(".")[2] == "bias" and out.metrics.get("ref_norm"):
        # a bias is added: what it moves, its reader's output moves by as much, element by
        # element, which is a far smaller share of that output than of a bias near zero
        home = out.r or out.t or {}
        error = min(error, delta * math.sqrt(int(home.get("numel") or 0)) / float(out.metrics["ref_norm"]))
    return error


def notes(previous: dict[int, dict[str, Any]]) -> list[str]:
    """For the result's notes: each rank whose later steps' reads were judged against a bound."""
    out = []
    for _, info in sorted(previous.items()):
        moves: Moves | None = info.get("moves")
        if moves is None or not moves.used or moves.first is None:
            continue
        first, (delta, name, step) = moves.first, moves.largest
        lr = first["settings"].get("lr")
        out.append(
            f"rank {first['rank']}: {first['settings']['optimizer']} updated {first['count']} "
            f"parameter{'s' if first['count'] > 1 else ''} "
            f"in step {first['step']} from gradients that differ. It moves each element by up to about "
            f"its learning rate ({lr:g}) whatever the gradient's size, so an element whose gradient is "
            f"rounding noise may move one way in one run and the other way in the other; statistics "
            f"cannot see how far each element moved. From step {first['step'] + 1} on, what reads "
            f"those parameters is judged against how far they may have moved (the most: {name}, "
            f"{delta:.3g} an element, root mean square, after step {step}), so a smaller fault there "
            f"can hide; dump with data=\"tensor\" to judge those steps element by element")
    return out


def read_bound(state: VerdictState, node: Node, row: dict[str, Any], own: Pair | None, measured: Pair | None,
               producers: list[Pair]) -> float:
    """The upper bound of input ``row``'s error from earlier updates (0: none): a parameter as
    the step began (on either side: the other may read it through a cast autocast made), or
    an output of ops that read only such parameters (``metrics["moved"]`` of its pair or its
    producers'). Sets ``node.moved``: 1 while every input that differs carries one, -1 once
    one does not."""
    bound = pair_bound(state, node, row, own, measured)
    bound = max([bound, *(float(p.metrics.get("moved") or 0.0) for p in producers)])
    if bound > 0:
        node.moved = node.moved or 1
    elif (row.get("numel") or 0) > 1:  # data besides the parameters (indices, activations)
        node.moved = -1
    return bound


def pair_bound(state: VerdictState, node: Node, row: dict[str, Any], own: Pair | None,
               measured: Pair | None) -> float:
    """:func:`read_bound` of one measured pair, without its producers (what a module's own code
    could read: :func:`opscope.compare.internal.available`)."""
    name = _param_read(state, node, row, own)
    if name:
        out = node.outputs[0] if node.outputs else None
        return moved_error((state.previous.get(node.rank) or {}).get("moves"), name, measured, out)
    return float(measured.metrics.get("moved") or 0.0) if measured is not None else 0.0


def _param_read(state: VerdictState, node: Node, row: dict[str, Any], own: Pair | None) -> str | None:
    """The parameter this input reads as the step began, on its side or the other, or None."""
    other_side = "reference" if node.side == "target" else "target"
    other = (own.r if node.side == "target" else own.t) if own is not None else None
    for side, r in ((node.side, row), (other_side, other)):
        if r is not None and r.get("param") and as_step_began(state, side, node, r):
            return str(r["param"])
    return None


def as_step_began(state: VerdictState, side: str, node: Node, row: dict[str, Any]) -> bool:
    """Does the row read the parameter as the step began (no op of this step wrote it)? A
    second read links to the first one's row: followed back to it."""
    for _ in range(8):
        producer = row.get("producer")
        made = state.rows.get((side, node.rank, node.step, producer)) if producer is not None else None
        if made is None:
            return True
        if made.get("io") != "param" or made.get("param") != row.get("param"):
            return False
        row = made
    return False


def carry_on(node: Node, moves: Moves) -> None:
    """The outputs of a call whose inputs that differ all carry a bound: theirs, as judged
    (and the step's largest so far, ``moves.in_step``)."""
    if node.moved == 1:
        for out in node.outputs:
            if out.metrics and out.metrics.get("input_error"):
                out.metrics["moved"] = out.metrics["input_error"]
                moves.in_step = max(moves.in_step, out.metrics["moved"])


def settings_note(state: VerdictState, node: Node) -> str | None:
    """Why an optimizer-phase culprit differs where its inputs agree, when the two runs'
    recorded settings for its parameter differ (a learning rate, betas, the step count a
    resumed run restarted from): those settings, side by side."""
    name = next((r.get("param") for r in [node.worst.home if node.worst else {}, *node.rows] if r.get("param")), None)
    if name is None:
        return None
    key = ("optimizer settings", node.rank, node.step)
    index = state.indexes.get(key)
    if index is None:  # the optimizer's parameter rows of this (rank, step), by parameter
        index = state.indexes[key] = {
            p.t["param"]: (settings_of(p.t), settings_of(p.r)) for p in state.pairs
            if p.t is not None and p.r is not None and p.t.get("io") == "param" and p.t.get("param")
            and p.t.get("rank") == node.rank and p.t.get("step") == node.step and is_step(p.t)}
    t, r = index.get(name, ({}, {}))
    differ = [k for k in sorted(set(t) | set(r)) if t.get(k) != r.get(k)]
    if not t or not r or not differ:
        return None
    said = "; ".join(f"{k} {t.get(k)!r} in the target, {r.get(k)!r} in the reference" for k in differ[:4])
    return f"the optimizer's settings for {name} differ: {said}"
