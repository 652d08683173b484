"""Loss scaling: values that carry mixed precision's power-of-two loss scale.

``torch.amp.GradScaler`` multiplies the loss by a scale S (a power of two, 65536 at first),
so every gradient of the backward pass is S times its true value until
``_amp_foreach_non_finite_check_and_unscale_`` multiplies the gradients by 1/S in place
before the optimizer reads them. Compared with a run without a scaler (float16 autocast
against float32), every backward value would differ by S, and the loss's ``mul`` by S would
be the first culprit.

:func:`unscale` finds S on one side of a (rank, step) from its evidence (the unscale op's
``inv_scale`` input; at the api level GradScaler's ``reciprocal`` of its scale; at the module
level the ``GradScaler.scale`` and ``GradScaler.unscale_`` records a module-level dump makes)
and divides every value that carries it: the statistics of its rows in
place, and a ``scale`` the tensor reader divides by (:mod:`opscope.compare.stream`). A
power of two divides exactly, so nothing is hidden: a value that over- or underflowed under
the scale still differs.

Which values carry S follows the data flow in execution order: the one-element values equal
to S that a product of one-element values reads (``loss * scale`` in forward, its backward's
``grad * scale``) carry S; a product's output carries the product of its inputs' scales, a
quotient their quotient; a value-independent op (``ones_like``) or a non-float output carries
none; any other op carries the one scale its inputs carry (backward ops are linear in the
gradient they read), and the unscale op's outputs none. At the module level, where no op
links a module's gradient to the scaled loss, every backward record before the unscaling
carries S.
"""

from __future__ import annotations

import math
from typing import Any

from opscope.compare.flow import base_op
from opscope.compare.pair import INPUT_IO, Pair, call_key
from opscope.compare.result import spans
from opscope.compare.state import join
from opscope.compare.tolerance import is_float
from opscope.compare.unwritten import Unwritten

Row = dict[str, Any]

UNSCALE, UPDATE = "_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"
# a module-level dump's records of the scaler's two steps (opscope.capture.torch.grad_scaler)
SCALE_RECORD, UNSCALE_RECORD = "GradScaler.scale", "GradScaler.unscale_"
_PRODUCTS = frozenset({"mul", "mul_", "mm", "bmm", "matmul", "mv", "dot", "outer", "vdot"})
_QUOTIENTS = frozenset({"div", "div_"})
_CREATORS = frozenset({"full", "zeros", "ones", "empty", "scalar_tensor", "arange", "empty_strided"})
_STATS = ("mean", "std", "norm", "min", "max", "absmax")


class LossScales:
    """The loss scales of a comparison's two sides, read a (rank, step) at a time in order.

    A step whose unscale op found an Inf or NaN gradient was skipped by the scaler (no
    optimizer step, a smaller scale next): its values that overflowed under the scale are no
    culprits (``overflowed``). From the next step on, that side's weights are an update behind
    the other's: every row of those steps gets ``skips`` (the side's skipped steps before it),
    and where the other side did not skip the same ones a parameter that differs there is no
    root (:func:`explained_by_skip`) and an op out of proportion inherits (no culprit can be
    told from the skipped update)."""

    def __init__(self) -> None:
        self.found: dict[tuple[str, float], set[int]] = {}  # (side, scale) -> steps
        self.skipped: set[tuple[str, int, int]] = set()  # (side, rank, step)
        self.unwritten = Unwritten()  # optimizer state a skipped step left holding no data

    def read(self, side: str, rank: int, step: int, rows: list[Row], *, optimizer_seen: bool = True,
             api: bool = False) -> None:
        """Divide the values of this side's (rank, step) that carry its loss scale
        (``optimizer_seen``: the dump records the optimizer phase; ``api``: an api-level dump)."""
        skips = self._skips(side, rank, step)
        for row in rows if skips else ():
            row["skips"] = skips
        scale, skipped = unscale(rows, optimizer_seen, api)
        self.unwritten.read(side, rank, rows, step, skipped)
        if scale is None:
            return
        self.found.setdefault((side, scale), set()).add(step)
        if skipped:
            self.skipped.add((side, rank, step))
            for row in rows:  # a fused optimizer's records of the update it did not make
                if row.get("phase") == "optimizer" and "skips" not in row:
                    row["skips"] = (step,)

    def _skips(self, side: str, rank: int, before: int) -> tuple[int, ...]:
        return tuple(sorted(s for x, r, s in self.skipped if x == side and r == rank and s < before))

    def notes(self) -> list[str]:
        """One sentence per side and scale, and per side's skipped steps."""
        out = []
        for (side, scale), steps in sorted(self.found.items(), key=lambda kv: (kv[0][0], min(kv[1]))):
            out.append(f"the {side}'s gradients carry a loss scale of {show(scale)} in {_steps(steps)} "
                       "(torch.amp.GradScaler): its backward values were compared divided by it")
        for side in ("target", "reference"):
            steps = {step for s, _, step in self.skipped if s == side}
            if steps:
                out.append(f"the {side}'s GradScaler found Inf/NaN gradients in {_steps(steps)} and skipped "
                           "the optimizer step (float16 overflowed under the loss scale, as dynamic loss "
                           "scaling expects at first): those overflows are no culprits, the next step's weights "
                           f"differ by the update the {side} did not make, and the steps from there on "
                           "inherit that difference (no culprit can be told from it: compare the steps "
                           "before a skip, or give GradScaler a lower init_scale)")
        return out


def unscale(rows: list[Row], optimizer_seen: bool = True, api: bool = False) -> tuple[float | None, bool]:
    """Divide the values of one side's (rank, step) that carry its loss scale; returns the
    scale (None where the step shows none) and whether the scaler skipped the step. Rows
    that carry it get ``scale`` (and ``overflowed`` where the step was skipped and they hold
    an Inf or NaN)."""
    scale, skipped = _scale(rows, optimizer_seen)
    if scale is None:
        return None, False
    carried = _carried(rows, scale, api)
    for row in rows:
        factor = carried.get(_value(row), 1.0)
        if factor != 1.0:
            _divide(row, factor)
            if skipped and (row.get("inf") or row.get("nan")):
                row["overflowed"] = factor
    return scale, skipped


def excuse(pair: Pair) -> str | None:
    """Whether loss scaling explains an output out of proportion to its inputs: "passed" (an
    overflow under a loss scale in a step the scaler skipped) or "inherits" (a step after a
    skipped one: the weights are an update apart), with the reason added to the pair's note;
    None where it does not."""
    t, r = pair.rows
    why = overflowed(t, r)
    outcome = "passed" if why else "inherits"
    why = why or explained_by_skip(t, r)
    if why is None:
        return None
    pair.note = join(pair.note, why)
    return outcome


def overflowed(t: Row, r: Row) -> str | None:
    """Why an output that holds Inf/NaN on one side is no culprit: that side's scaler skipped
    the step, and the value overflowed under its loss scale; None otherwise."""
    for side, row, other in (("target", t, r), ("reference", r, t)):
        if row.get("overflowed") and not (other.get("inf") or other.get("nan")):
            return (f"overflowed under the {side}'s loss scale {show(row['overflowed'])}: its GradScaler "
                    "skipped this step's update (dynamic loss scaling), no fault")
    return None


def explained_by_skip(t: Row, r: Row) -> str | None:
    """Why a parameter that differs at a step's start is no root, or an op out of proportion
    no culprit: a side skipped the update of an earlier step that the other made; None
    otherwise. A value that is Inf or NaN on one side only is never explained so: the update a
    skip leaves out is finite."""
    if one_sided_nonfinite(t, r):
        return None
    ts, rs = set(t.get("skips") or ()), set(r.get("skips") or ())
    if ts == rs:  # both skipped the same updates (or neither did)
        return None
    side, only = ("target", ts - rs) if ts - rs else ("reference", rs - ts)
    steps = sorted(only)
    which, behind = (f"step {steps[0]}", "an update") if len(steps) == 1 else (f"steps {spans(steps)}",
                                                                             f"{len(steps)} updates")
    return (f"the {side}'s GradScaler skipped the update of {which}, which the other run made: its "
            f"weights are {behind} behind, and what reads them carries that difference")


def one_sided_nonfinite(t: Row, r: Row) -> bool:
    """Does one side hold an Inf or NaN where the other holds none?"""
    return bool(t.get("inf") or t.get("nan")) != bool(r.get("inf") or r.get("nan"))


def show(scale: float) -> str:
    """A power of two as people write it: 65536, 2^40, 2^-3."""
    exponent = math.frexp(scale)[1] - 1
    return f"{scale:.0f}" if 0 <= exponent <= 20 else f"2^{exponent}"


def _steps(steps: set[int]) -> str:
    shown = sorted(steps)
    return f"step {shown[0]}" if len(shown) == 1 else f"steps {spans(shown)}"


def _scale(rows: list[Row], optimizer_seen: bool = True) -> tuple[float | None, bool]:
    """S, from the unscale op's one-element ``inv_scale`` input (exactly 1/S), and whether
    its ``found_inf`` output (the slot before) says the step is skipped; where no unscale op
    is recorded (the api level), from the one-element power of two whose reciprocal
    GradScaler takes, the step skipped where no optimizer record shows (``optimizer_seen``:
    the dump records that phase). An unscale whose ``inv_scale`` is 1 only checked the
    gradients for a fused optimizer, which unscales them itself: S is then what the scaler
    gave that optimizer (:func:`_handed_scale`)."""
    for call in _calls([r for r in rows if r.get("op") == UNSCALE_RECORD or base_op(r.get("op")) == UNSCALE]):
        row = _inv_scale(call)
        if row is None:
            continue
        inverse = _number(row)
        if inverse == 1.0:
            scale = _handed_scale(rows)
        elif inverse and inverse < 1.0 and _power_of_two(1.0 / inverse):
            scale = 1.0 / inverse
        else:
            continue
        if scale is None:
            continue
        slot = _found_slot(call, row)
        found = [r for r in call if r.get("io") == "output" and r.get("slot") == slot and r.get("numel") == 1]
        if found:
            return scale, (_number(found[0]) or 0.0) > 0
        return scale, _skipped(rows, optimizer_seen)  # (the api level: a call has no outputs)
    for row in rows:  # the api level records no unscale op: GradScaler's scale.double().reciprocal()
        if base_op(row.get("op")) == "reciprocal" and row.get("io") in INPUT_IO:
            value = _scale_value(row)
            if value is not None:
                return value, _skipped(rows, optimizer_seen)
    return None, False


def _handed_scale(rows: list[Row]) -> float | None:
    """The loss scale GradScaler handed a fused optimizer (``_fused_adamw_``'s ``grad_scale``
    input), or at the module level the one its ``scale`` multiplied the loss by."""
    for row in rows:
        op = row.get("op")
        handed = base_op(op).startswith("_fused_") and row.get("arg") == "grad_scale"
        if (handed or (op == SCALE_RECORD and row.get("slot") == 1)) and row.get("io") in INPUT_IO:
            value = _scale_value(row)
            if value is not None:
                return value
    return None


def _scale_value(row: Row) -> float | None:
    """A one-element row holding a loss scale (a power of two above 1), or None."""
    value = _number(row) if row.get("numel") == 1 else None
    return value if value and value > 1.0 and _power_of_two(value) else None


def _found_slot(call: list[Row], inv_scale: Row) -> int:
    """The slot of an unscale call's ``found_inf`` output: the argument before ``inv_scale``
    (a module-level record's only output)."""
    return 0 if call[0].get("op") == UNSCALE_RECORD else (inv_scale.get("slot") or 0) - 1


def _inv_scale(call: list[Row]) -> Row | None:
    """An unscale call's one-element ``inv_scale`` input (its last argument), or None."""
    row = max((r for r in call if r.get("io") in INPUT_IO), key=lambda r: r.get("slot") or 0, default=None)
    return row if row is not None and row.get("numel") == 1 else None


def _check_only(call: list[Row]) -> int | None:
    """The ``found_inf`` slot of an unscale call that multiplied the gradients by 1 (a fused
    optimizer's check: its outputs before that slot still carry the scale), else None."""
    op = call[0].get("op")
    if op != UNSCALE_RECORD and base_op(op) != UNSCALE:
        return None
    row = _inv_scale(call)
    if row is None or _number(row) != 1.0:
        return None
    return _found_slot(call, row)


def _skipped(rows: list[Row], optimizer_seen: bool) -> bool:
    """Whether the scaler skipped a step whose unscale op shows no ``found_inf`` output (the
    api level): no optimizer record where the dump records that phase, or ``found_inf`` read
    non-zero by ``_amp_update_scale_`` (its third input; dumps before session 28 carried the
    0 from before the check there, so the optimizer's absence also counts)."""
    if optimizer_seen and not any(r.get("phase") == "optimizer" for r in rows):
        return True
    return any(base_op(r.get("op")) == UPDATE and r.get("io") in INPUT_IO and r.get("slot") == 2
               and r.get("numel") == 1 and (_number(r) or 0.0) > 0 for r in rows)


def _carried(rows: list[Row], scale: float, api: bool = False) -> dict[int, float]:
    """Value (producing row id, or the row's own for a value from before the step) -> factor.

    ``api``: at the api level a backward row is an autograd node's gradient, and one that no
    recorded node made (a cast's backward, which no API call records, or the scaled loss's
    seed) carries S: the scale's ``mul`` records only its forward, so no one-element S is
    read in the backward."""
    carried: dict[int, float] = {}
    checked = False
    for call in _calls(rows):
        inputs = [r for r in call if r.get("io") in INPUT_IO]
        if api and call[0].get("phase") == "backward":
            for row in inputs:
                if row.get("producer") is None and _is_float(row):
                    carried.setdefault(_value(row), scale)
        op = "mul" if call[0].get("op") == SCALE_RECORD else base_op(call[0].get("op"))
        if op in _PRODUCTS and inputs and all(r.get("numel") == 1 for r in inputs):
            for row in inputs:  # loss * S, and its backward's grad * S
                if _is_float(row) and _number(row) == scale:
                    carried.setdefault(_value(row), scale)
        check = _check_only(call)  # the gradients left as they were: their outputs carry what they read
        factor = _output_factor("" if check is not None else op,
                                [carried.get(_value(r), 1.0) for r in inputs if _is_float(r)])
        if call[0].get("phase") == "optimizer":  # an update reads unscaled gradients, or unscales them (fused)
            factor = 1.0
        for row in call:
            if row.get("io") == "output" and _is_float(row) and factor != 1.0 \
                    and (check is None or (row.get("slot") or 0) < check):
                carried[row["id"]] = factor
        checked = checked or check is not None
    if any(r.get("op") == SCALE_RECORD for r in rows):
        # a module-level dump: no op links a module's gradient to the scaled loss, and every
        # gradient of the backward pass, up to the unscaling, carries the scale
        end = min((r["seq"] for r in rows if r.get("op") == UNSCALE_RECORD), default=math.inf)
        for row in rows:
            if row.get("phase") == "backward" and row["seq"] < end and _is_float(row):
                carried.setdefault(_value(row), scale)
    if checked:
        _handed_gradients(rows, scale, carried)
    return carried


def _handed_gradients(rows: list[Row], scale: float, carried: dict[int, float]) -> None:
    """The scaler only checked the gradients: the optimizer's reads of them (its records'
    ``grad`` rows, a fused op's ``grads``) carry the scale."""
    params: dict[Any, int] = {}  # a fused op's call seq -> how many parameters it updates
    for row in rows:
        if row.get("io") == "param" and base_op(row.get("op")).startswith("_fused_"):
            params[row["seq"]] = params.get(row["seq"], 0) + 1
    for row in rows:
        if row.get("phase") == "optimizer" and _is_float(row) and (row.get("io") == "grad" or _handed(row, params)):
            carried.setdefault(_value(row), scale)


def _handed(row: Row, params: dict[Any, int]) -> bool:
    """Is ``row`` a gradient a fused optimizer op reads (``grads``, its second list: at the api
    level, where positional tensors have no argument name, the slots after its parameters)?"""
    if row.get("io") not in INPUT_IO or row["seq"] not in params:
        return False
    if row.get("arg") is not None:
        return row.get("arg") == "grads"
    return params[row["seq"]] <= (row.get("slot") or 0) < 2 * params[row["seq"]]


def _output_factor(op: str, factors: list[float]) -> float:
    if op == UNSCALE or op in _CREATORS or op.endswith("_like") or op.startswith("new_") or not factors:
        return 1.0
    if op.startswith("_fused_"):  # a fused optimizer divides by the grad_scale it is handed (also
        return 1.0  # where no optimizer hook marks its phase: a custom optimizer calling it)
    if op in _PRODUCTS:
        return math.prod(factors)
    if op in _QUOTIENTS and len(factors) >= 2:
        return factors[0] / factors[1]
    scaled = {f for f in factors if f != 1.0}
    return scaled.pop() if len(scaled) == 1 else 1.0


def _calls(rows: list[Row]) -> list[list[Row]]:
    """Rows grouped by call, in execution order of the call's first row."""
    by_call: dict[Any, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        by_call.setdefault(call_key(row), []).append(row)
    return list(by_call.values())


def _value(row: Row) -> int:
    producer = row.get("producer") if row.get("io") in INPUT_IO else None
    return int(row["id"] if producer is None else producer)


def _divide(row: Row, factor: float) -> None:
    for key in _STATS:
        value = row.get(key)
        if value is not None:
            row[key] = value / factor
    row["scale"] = factor


def _number(row: Row) -> float | None:
    """The value of a one-element row (its statistics hold it exactly)."""
    low, high = row.get("min"), row.get("max")
    if low is None or low != high:
        return None
    return float(low)


def _power_of_two(x: float) -> bool:
    return math.isfinite(x) and x > 0 and math.frexp(x)[0] == 0.5


def _is_float(row: Row) -> bool:
    return is_float(row.get("dtype"))
