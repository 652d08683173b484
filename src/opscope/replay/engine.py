"""Replay: re-run an op on each side's own recorded inputs in float64 on CPU, measure each
side's *local* error against that golden result in units of its dtype's epsilon, and say
which side is wrong.

This separates an op's own error from the error it inherited, even when its inputs already
differ: each side is judged only against what its op should have made of its own inputs.
A side's output is

- **ok** within ``abs_factor`` (16) eps of the float64 result,
- **ill-conditioned** beyond that, but no more than 4x as far as torch's CPU kernel run in
  the same dtypes on the same inputs (the precision cannot do better here),
- **wrong** beyond both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from opscope.compare.tolerance import NoiseModel, epsilon
from opscope.errors import ReplayError
from opscope.replay.calls import run
from opscope.replay.loader import load_call
from opscope.replay.result import ReplayResult, SideReplay

NATIVE_FACTOR = 4.0
SIDES = ("target", "reference")


@dataclass
class CallRef:
    """Which call to replay: its id, place, and its record ``seq`` on each side (None: absent)."""

    id: str
    rank: int
    step: int
    phase: str = ""
    module: str = ""
    op: str = ""
    seqs: dict[str, int | None] = field(default_factory=dict)


class RowCache:
    """Rows of one (dump, rank, step), grouped by ``seq``, read once for several replays."""

    def __init__(self) -> None:
        self._parts: dict[tuple[int, int, int], dict[int, list[dict[str, Any]]]] = {}

    def call_rows(self, dump: Any, rank: int, step: int, seq: int) -> list[dict[str, Any]]:
        key = (id(dump), rank, step)
        part = self._parts.get(key)
        if part is None:
            rows = dump.records(rank=rank, step=step).to_pylist()
            by_id = {r["id"]: r for r in rows}
            part = {}
            for row in rows:
                producer = by_id.get(row.get("producer"))
                if not row.get("data") and producer is not None and producer.get("data") \
                        and producer.get("numel") == row.get("numel"):
                    row["data"], row["key"] = producer["data"], producer["key"]  # the same tensor
                part.setdefault(row["seq"], []).append(row)
            self._parts[key] = part
        rows = part.get(seq)
        if not rows:
            raise ReplayError(f"{dump.path} has no record with seq {seq} at rank {rank} step {step}")
        return rows


def replay_call(t_dump: Any, r_dump: Any, ref: CallRef, noise: NoiseModel | None = None,
                cache: RowCache | None = None) -> ReplayResult:
    """Replay one call on both sides (or the one side it ran on) and judge it."""
    noise = noise or NoiseModel()
    cache = cache or RowCache()
    sides: dict[str, SideReplay] = {}
    errors: dict[str, str] = {}
    for side, dump in zip(SIDES, (t_dump, r_dump), strict=True):
        seq = ref.seqs.get(side)
        if seq is None:
            continue
        try:
            rows = cache.call_rows(dump, ref.rank, ref.step, int(seq))
            sides[side] = replay_side(dump, rows, side, noise)
        except ReplayError as exc:
            errors[side] = str(exc)
    verdict, reason = judge(sides, errors, ref)
    return ReplayResult(id=ref.id, rank=ref.rank, step=ref.step, phase=ref.phase, module=ref.module, op=ref.op,
                        verdict=verdict, reason=reason, target=sides.get("target"), reference=sides.get("reference"))


def replay_side(dump: Any, rows: list[dict[str, Any]], side: str, noise: NoiseModel) -> SideReplay:
    """Re-run one side's call in float64 and in its own dtypes; measure its recorded outputs."""
    call = load_call(dump, rows, side)
    golden = run(call, golden=True)
    try:
        native: dict[int, torch.Tensor] | None = run(call, golden=False)
    except ReplayError:
        native = None  # e.g. no CPU kernel for bfloat16: judged against abs_factor alone
    outputs = []
    for slot, recorded in sorted(call.recorded.items()):
        expected = golden.get(slot)
        if expected is None:
            raise ReplayError(f"{call.name} re-run on CPU gives no output {slot}, but the {side} recorded one")
        if list(expected.shape) != list(recorded.shape):
            raise ReplayError(f"{call.name}: the rebuilt call gives output {slot} of shape {list(expected.shape)}, "
                              f"the {side} recorded {list(recorded.shape)}: its arguments could not be rebuilt")
        outputs.append(_measure(slot, recorded, expected, None if native is None else native.get(slot),
                                side, noise))
    worst = max(outputs, key=_badness)
    status = ("wrong" if any(o["status"] == "wrong" for o in outputs) else
              "ill_conditioned" if any(o["status"] == "ill_conditioned" for o in outputs) else "ok")
    reproduced = None if native is None else all(o["reproduced"] for o in outputs)
    head = call.head
    return SideReplay(side=side, seq=int(head["seq"]), op=call.name, module=str(head.get("module") or ""),
                      dtype=worst["dtype"], error=worst["error"], units=worst["units"],
                      allowed_units=worst["allowed_units"], status=status, native_units=worst["native_units"],
                      reproduced=reproduced, outputs=outputs, args=_arguments_text(call.doc), note=call.note)


def _arguments_text(doc: dict[str, Any]) -> dict[str, str]:
    """The recorded non-tensor arguments by position or keyword, each as comparable text
    (a dtype, tuple or device written as text reads the same as its value)."""
    from opscope.replay.api_calls import decode

    named = {str(pos): value for pos, value in doc.get("args") or []} | dict(doc.get("kwargs") or {})
    return {key: repr(decode(value, golden=False)) for key, value in named.items()}


def _measure(slot: int, recorded: torch.Tensor, expected: torch.Tensor, native: torch.Tensor | None,
             side: str, noise: NoiseModel) -> dict[str, Any]:
    dtype = str(recorded.dtype).removeprefix("torch.")
    if side == "target":
        dtype = noise.lower_dtype(dtype, dtype)  # precision="tf32" judges the target's float32 as tf32
    eps = epsilon(dtype)
    error = local_error(recorded, expected)
    units = error / eps if eps else (0.0 if error == 0 else math.inf)
    native_units = None
    if native is not None and native.shape == expected.shape:
        n_error = local_error(native, expected)
        native_units = n_error / eps if eps else (0.0 if n_error == 0 else math.inf)
    allowed = max(noise.abs_factor, NATIVE_FACTOR * (native_units or 0.0)) if eps else 0.0
    status = "ok" if units <= (noise.abs_factor if eps else 0.0) else "ill_conditioned" if units <= allowed else "wrong"
    reproduced = native is not None and native.shape == recorded.shape and _bit_equal(native, recorded)
    return {"slot": slot, "dtype": dtype, "error": error, "units": units, "native_units": native_units,
            "allowed_units": allowed, "status": status, "reproduced": reproduced}


def _badness(o: dict[str, Any]) -> float:
    rank = {"wrong": 2.0, "ill_conditioned": 1.0, "ok": 0.0}[o["status"]]
    return rank * 1e308 + (o["units"] / o["allowed_units"] if o["allowed_units"] else o["units"])


def local_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64; NaN/Inf where both agree are left out,
    a NaN/Inf on one side only is an infinite error. Integer and bool tensors: the fraction
    of elements that differ."""
    if not (expected.is_floating_point() or expected.is_complex()):
        if actual.numel() == 0:
            return 0.0
        return float((actual.to(expected.dtype) != expected).double().mean())
    wide = torch.complex128 if expected.is_complex() else torch.float64
    a, e = actual.to(wide).reshape(-1), expected.to(wide).reshape(-1)
    a_nan, e_nan = torch.isnan(a), torch.isnan(e)
    a_inf, e_inf = torch.isinf(a), torch.isinf(e)
    if bool((a_nan != e_nan).any()) or bool((a_inf != e_inf).any()) or bool((a_inf & (a != e)).any()):
        return math.inf
    keep = ~(a_nan | a_inf)
    diff = float(torch.linalg.vector_norm(a[keep] - e[keep]))
    ref = float(torch.linalg.vector_norm(e[keep]))
    if diff == 0:
        return 0.0
    return diff / ref if ref > 0 else math.inf


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
                    and torch.equal(torch.isnan(a), torch.isnan(b)))
    return bool(torch.equal(a, b))


# -- verdict -------------------------------------------------------------------------------
def judge(sides: dict[str, SideReplay], errors: dict[str, str], ref: CallRef) -> tuple[str, str]:
    """Per-op verdict and the sentence that explains it."""
    if not sides:
        if len(set(errors.values())) == 1:
            return "not_replayable", next(iter(errors.values()))
        return "not_replayable", "; ".join(f"{side}: {why}" for side, why in errors.items()) or "nothing to replay"
    wrong = [s for s in sides.values() if s.status == "wrong"]
    others = _other_sides(sides, errors, ref)
    if len(wrong) == 1 and not (len(sides) == 1 and errors):
        return f"{wrong[0].side}_wrong", _wrong_reason(wrong[0], sides, others)
    if len(sides) == 1 and errors:
        side = next(iter(sides.values()))
        if side.status == "wrong":
            return f"{side.side}_wrong", _wrong_reason(side, sides, others)
        return "not_replayable", f"{_describe(side)}; {others}"
    ops = {s.op for s in sides.values()}
    if all(s.status == "ok" for s in sides.values()) and len(ops) > 1:
        return "both_within", (f"{_join(sides)}: each side's op is right for its own inputs, but the sides ran "
                               f"different ops ({sides['target'].op} on the target, {sides['reference'].op} on "
                               "the reference): the difference comes from that choice, not from a kernel")
    differ = _argument_difference(sides)
    if all(s.status == "ok" for s in sides.values()) and differ:
        return "both_within", (f"{_join(sides)}: each side's op is right for its own inputs, but the sides "
                               f"passed different arguments ({differ}): the difference comes from them")
    if all(s.status == "ok" for s in sides.values()):
        return "both_within", (f"{_join(sides)}: the op is right for its inputs on "
                               f"{'both sides' if len(sides) == 2 else 'the only side it ran on'}; "
                               f"the difference comes from its inputs{_suffix(others)}")
    owner = kernel_owner(next(iter(sides.values())).op)
    if wrong:
        return "both_off", (f"{_join(sides)}: both are further from float64 than {owner} CPU kernel in their "
                            f"precision: both implementations differ from {owner}")
    return "both_off", (f"{_join(sides)}: far from float64, but no further than {owner} CPU kernel in the "
                        f"same precision: the op is ill-conditioned here{_suffix(others)}")


def kernel_owner(op: str) -> str:
    """Whose CPU kernel the native run used: TensorFlow re-runs its own ops, torch the rest."""
    return "TensorFlow's" if op.startswith("tf.") else "torch's"


def _argument_difference(sides: dict[str, SideReplay]) -> str:
    """``approximate: 'tanh' on the target, 'none' on the reference``, for arguments that differ."""
    if len(sides) != 2:
        return ""
    t, r = sides["target"].args, sides["reference"].args
    keys = [k for k in dict.fromkeys([*t, *r]) if t.get(k) != r.get(k)]
    name = lambda k: f"argument {k}" if k.isdigit() else k  # noqa: E731
    return "; ".join(f"{name(k)}: {t.get(k, '(not given)')} on the target, {r.get(k, '(not given)')} on the "
                     "reference" for k in keys[:3])


def _describe(s: SideReplay) -> str:
    native = "" if s.native_units is None else \
        f"; {kernel_owner(s.op)} CPU kernel in {s.dtype}: {_fmt(s.native_units)} eps"
    return f"the {s.side}'s output is {_fmt(s.units)} eps ({s.dtype}) from float64 on its own inputs{native}"


def _join(sides: dict[str, SideReplay]) -> str:
    return "; ".join(_describe(s) for s in sides.values())


def _wrong_reason(bad: SideReplay, sides: dict[str, SideReplay], others: str) -> str:
    rest = [s for s in sides.values() if s is not bad]
    tail = f"; {_describe(rest[0])}" if rest else ""
    return (f"{_describe(bad)}{tail}: the {bad.side}'s {bad.op} is wrong for its own inputs"
            f"{_suffix(others)}")


def _other_sides(sides: dict[str, SideReplay], errors: dict[str, str], ref: CallRef) -> str:
    parts = [f"the {side} could not be replayed: {why}" for side, why in errors.items()]
    parts += [f"the op ran on the {next(iter(sides))} only" for side in SIDES
              if side not in sides and side not in errors and ref.seqs.get(side) is None]
    return "; ".join(parts)


def _suffix(text: str) -> str:
    return f" ({text})" if text else ""


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.3g}" if x >= 0.01 or x == 0 else f"{x:.2e}"
