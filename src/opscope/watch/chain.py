"""From a hit to an :class:`~opscope.watch.events.OverflowEvent`: the inputs'
statistics and the chain back to the earliest op whose output was already abnormal.

Only runs on a hit, so it may be slow-ish: producers are found by scanning the step's
entries backwards (the most recent output with an input's id before the consumer is its
producer, since that input was alive when the consumer ran).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from opscope.capture.torch.op_kinds import base_name
from opscope.capture.torch.stats import cpu_stats, device_stats, materialize_one
from opscope.watch.check import (
    FWD,
    IN_IDS,
    MODULE,
    NAME,
    NODE,
    O_DTYPE,
    O_HI,
    O_ID,
    O_LO,
    O_REF,
    O_VER,
    OUTS,
    PHASE,
    VIEW,
    classify,
)
from opscope.watch.events import ChainLink, OverflowEvent, TensorSummary

# consumer op -> input slots where a zero (or a negative) makes Inf/NaN
ZERO_SENSITIVE = {
    "div": (1,), "div_": (1,), "reciprocal": (0,), "reciprocal_": (0,), "rsqrt": (0,), "rsqrt_": (0,),
    "log": (0,), "log_": (0,), "log2": (0,), "log10": (0,), "fmod": (1,), "remainder": (1,),
    "sqrt": (0,), "sqrt_": (0,), "pow": (0,),  # sqrt keeps a zero a zero: follow it back to the variance
}
NEGATIVE_SENSITIVE = frozenset("log log_ log2 log10 sqrt sqrt_ rsqrt rsqrt_ pow".split())
SPREAD_OPS = frozenset("var var_mean std std_mean norm linalg_vector_norm".split())
EXP_LIKE = frozenset("exp exp_ exp2 expm1 sinh cosh".split())
MAX_LINKS = 64
MAX_SCAN = 20000
_KIND_TEXT = {"nan": "NaN", "inf": "Inf", "-inf": "-Inf"}


def producer(entries: list[list[Any]], tensor_id: int, before: int) -> tuple[int, int] | None:
    """(entry index, output slot) of the op that made the tensor ``tensor_id``, through views."""
    stop = max(-1, before - 1 - MAX_SCAN)
    j = before - 1
    while j > stop:
        outs = entries[j][OUTS]
        for k, rec in enumerate(outs):
            if rec[O_ID] == tensor_id:
                entry = entries[j]
                if entry[VIEW] and entry[IN_IDS]:  # a view: its elements come from its first input
                    tensor_id = entry[IN_IDS][0]
                    break
                return j, k
        j -= 1
    return None


def suspicion(rec: list[Any], consumer: list[Any], slot: int, limit: float, made_by: str = "") -> str | None:
    """What is abnormal about output ``rec`` (of op ``made_by``) as input ``slot`` of ``consumer``."""
    lo, hi = rec[O_LO], rec[O_HI]
    if lo is None:
        return None
    kind = classify(lo, hi, limit)
    if kind in ("nan", "inf"):
        return _KIND_TEXT[kind]
    if kind == "limit":
        return f"beyond limit {limit:g}"
    op = base_name(consumer[NAME])
    if op in EXP_LIKE:
        dtype = rec[O_DTYPE] if isinstance(rec[O_DTYPE], torch.dtype) else torch.float32
        ceiling = math.log(torch.finfo(dtype).max) if dtype.is_floating_point else 88.7
        if hi > ceiling:
            return f"large values (max {hi:.4g}) feeding {op}, which overflows above {ceiling:.4g}"
    if slot in ZERO_SENSITIVE.get(op, ()) and lo <= 0 <= hi and _has_zero(rec):
        spread = base_name(made_by) in SPREAD_OPS
        what = ("a zero variance" if "var" in made_by else "a zero norm") if spread else "zeros"
        return f"{what} feeding {op}"
    if op in NEGATIVE_SENSITIVE and slot == 0 and lo < 0:
        return f"negative values (min {lo:.4g}) feeding {op}"
    return None


def _has_zero(rec: list[Any]) -> bool:
    if rec[O_LO] == 0 or rec[O_HI] == 0:
        return True
    t = rec[O_REF]() if rec[O_REF] is not None else None
    if t is None or getattr(t, "_version", rec[O_VER]) != rec[O_VER]:
        return True  # freed or changed since: the range says it may hold zeros
    with torch._C._DisableTorchDispatch():
        return bool((t == 0).any())


def chain(entries: list[list[Any]], index: int, slot: int, kind: str, limit: float) -> list[ChainLink]:
    """The links from the earliest abnormal output to entry ``index`` (which is last)."""
    hit = entries[index]
    rec = hit[OUTS][slot]
    reason = _KIND_TEXT.get(kind, f"beyond limit {limit:g}" if kind == "limit" else kind)
    links = [_link(hit, rec, reason)]
    cur = index
    while len(links) < MAX_LINKS:
        consumer = entries[cur]
        best: tuple[int, int, str] | None = None
        for in_slot, tid in enumerate(consumer[IN_IDS]):
            found = producer(entries, tid, cur)
            if found is None:
                continue
            made_by = entries[found[0]]
            why = suspicion(made_by[OUTS][found[1]], consumer, in_slot, limit, made_by[NAME])
            if why and (best is None or found[0] < best[0]):
                best = (found[0], found[1], why)
        if best is None:
            break
        cur = best[0]
        links.append(_link(entries[cur], entries[cur][OUTS][best[1]], best[2]))
    links.reverse()
    return links


def _link(entry: list[Any], rec: list[Any], reason: str) -> ChainLink:
    return ChainLink(op=entry[NAME], module=entry[MODULE], phase=entry[PHASE], reason=reason,
                     min=rec[O_LO], max=rec[O_HI], fwd_op=entry[FWD])


def summarize(t: torch.Tensor, slot: int, name: str | None = None, origin: str | None = None) -> TensorSummary:
    """Statistics of one live tensor (computed now, synchronously: only on a hit)."""
    s = TensorSummary(slot=slot, name=name, dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape),
                      origin=origin)
    if t.device.type == "meta" or t.layout != torch.strided or not t.numel():
        return s
    with torch._C._DisableTorchDispatch():
        d = t.detach()
        stats = cpu_stats(d) if d.is_cpu else materialize_one(device_stats(d))
    s.min, s.max, s.mean, s.std = stats[0], stats[1], stats[2], stats[3]
    s.nan, s.inf, s.zeros = stats[6], stats[7], stats[8]
    return s


def origin_of(entries: list[list[Any]], tensor_id: int, before: int, param_names: dict[int, str],
              level: str = "aten") -> str:
    name = param_names.get(tensor_id)
    if name:
        return f"parameter {name}"
    found = producer(entries, tensor_id, before)
    if found is None:
        if level == "module":
            return "not a watched module's output (model input, code between modules, constant or earlier step)"
        return "not produced by a watched op (model input, constant or earlier step)"
    e = entries[found[0]]
    return f"{e[NAME]} in {e[MODULE] or '(top level)'} ({e[PHASE]})"


def input_summaries(entries: list[list[Any]], index: int, args: Any, param_names: dict[int, str],
                    names: list[str] | None = None, ident: Callable[[torch.Tensor], int] = id,
                    level: str = "aten") -> list[TensorSummary]:
    """Statistics of the hit op's inputs: live tensors when at hand, else their producers' ranges."""
    out = []
    if args is not None:
        for i, t in enumerate(_tensors(args)):
            name = names[i] if names and i < len(names) else param_names.get(ident(t))
            out.append(summarize(t, i, name, origin_of(entries, ident(t), index, param_names, level)))
        return out
    for i, tid in enumerate(entries[index][IN_IDS]):
        origin = origin_of(entries, tid, index, param_names, level)
        found = producer(entries, tid, index)
        if found is None:
            out.append(TensorSummary(slot=i, name=param_names.get(tid), origin=origin))
            continue
        rec = entries[found[0]][OUTS][found[1]]
        live = rec[O_REF]() if rec[O_REF] is not None else None
        if live is not None and getattr(live, "_version", None) == rec[O_VER]:
            out.append(summarize(live, i, param_names.get(tid), origin))
        else:
            dtype = rec[O_DTYPE]
            out.append(TensorSummary(slot=i, name=param_names.get(tid), origin=origin, min=rec[O_LO], max=rec[O_HI],
                                     dtype=str(dtype).removeprefix("torch.") if dtype is not None else None))
    return out


def _tensors(args: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def build_event(entries: list[list[Any]], index: int, slot: int, kind: str, t: torch.Tensor | None, args: Any, *,
                step: int, rank: int, level: str, limit: float, param_names: dict[int, str],
                source: str | None = None, param: str | None = None, names: list[str] | None = None,
                ident: Callable[[torch.Tensor], int] = id) -> OverflowEvent:
    """Everything the user needs about one hit."""
    entry = entries[index]
    rec = entry[OUTS][slot]
    event = OverflowEvent(kind=kind, op=entry[NAME], module=entry[MODULE], phase=entry[PHASE], step=step, rank=rank,
                          level=level, min=rec[O_LO], max=rec[O_HI], source=source, fwd_op=entry[FWD],
                          node=entry[NODE], param=param, limit=None if limit == math.inf else limit)
    if t is not None:
        event.dtype, event.shape = str(t.dtype).removeprefix("torch."), list(t.shape)
        with torch._C._DisableTorchDispatch():
            d = t.detach()
            event.nan, event.inf = int(torch.isnan(d).sum()), int(torch.isinf(d).sum())
    event.inputs = input_summaries(entries, index, args, param_names, names, ident, level)
    event.chain = chain(entries, index, slot, kind, limit)
    return event
