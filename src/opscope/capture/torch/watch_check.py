"""The per-op check behind ``opscope.watch``: one fused reduction per output, no per-op sync.

Every checked output gets one ``torch.aminmax`` (one pass: NaN propagates into both ends,
+Inf shows in the max, -Inf in the min, a limit is two comparisons). On the CPU the two
numbers are read at once (no device to wait for); on an accelerator they stay on the
device and are read for the whole step in one transfer per dtype (:meth:`Checker.resolve`).

Each observed call leaves an *entry* (op, module, phase, input ids, outputs with their
range and a weak reference) so that, on a hit, the chain back to the earliest abnormal
output can be walked (:mod:`~opscope.capture.torch.watch_chain`). Entries live for one step.

The -Inf that a mask writes on purpose is not an alarm: in forward, -Inf (and no NaN/+Inf)
in the output of an op that only moves values (masked_fill, where, full, cat, ...) or of an
op with an input already known to be a mask is *masked*; everything else alarms.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.capture.torch.dispatch import flat_outputs, op_info, written_tensors

_current_node = torch._C._current_autograd_node
_no_dispatch = torch._C._DisableTorchDispatch
_Tensor = torch.Tensor
_INF = math.inf

# entry layout (lists, cheap on the hot path)
NAME, MODULE, PHASE, FWD, NODE, IN_IDS, OUTS, VIEW = range(8)
# output record layout
O_ID, O_REF, O_VER, O_LO, O_HI, O_DTYPE, O_SHAPE = range(7)

# Ops that only move or fill values: -Inf in their output was put there (a mask), not made.
SELECT_OPS = frozenset("""
masked_fill masked_fill_ where full full_like new_full fill fill_ scalar_tensor lift_fresh lift_fresh_copy
index_put index_put_ masked_scatter masked_scatter_ triu triu_ tril tril_ cat stack clone copy copy_
_to_copy expand repeat constant_pad_nd index_select gather scatter scatter_ maximum minimum max min amax amin
unsqueeze_copy view_copy _unsafe_view contiguous narrow_copy slice_scatter select_scatter _reshape_alias
""".split())
# Ops whose output is uninitialised memory, filled in place afterwards: never checked.
UNINITIALISED = frozenset("empty empty_like empty_strided new_empty new_empty_strided set_ resize_".split())


def base_name(op: str) -> str:
    """``aten.masked_fill_.Scalar`` -> ``masked_fill_``."""
    parts = op.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "aten" else parts[-1]


class _OpKind:
    __slots__ = ("name", "view", "written", "select", "skip")

    def __init__(self, func: Any) -> None:
        info = op_info(func)
        self.name = info.name
        base = base_name(info.name)
        self.written = info
        self.view = bool(info.view_outputs) and not info.written_outputs
        self.select = base in SELECT_OPS
        self.skip = base in UNINITIALISED


_KINDS: dict[Any, _OpKind] = {}


def classify(lo: float, hi: float, limit: float) -> str | None:
    """Why a range is abnormal: ``nan``, ``inf``, ``-inf``, ``limit``; None when it is fine."""
    if lo != lo or hi != hi:
        return "nan"
    if hi == _INF:
        return "inf"
    if lo == -_INF:
        return "-inf"
    if hi > limit or lo < -limit:
        return "limit"
    return None


class Checker:
    """Checks outputs, keeps the step's entries, and reports hits to ``on_hit``.

    Args:
        modules: the module tracker (module path of the op being run).
        limit: values beyond ``±limit`` are abnormal (``inf`` = only NaN/Inf).
        on_hit: ``on_hit(entry_index, out_index, kind, tensor_or_None, args_or_None)``,
            called in execution order for each abnormal output.
    """

    def __init__(self, modules: Any, limit: float | None, on_hit: Callable[..., None]) -> None:
        self.modules = modules
        self.limit = _INF if limit is None else float(limit)
        self.on_hit = on_hit
        self.on = False
        self.phase = "forward"
        self.entries: list[list[Any]] = []
        self.pending: dict[torch.dtype, list[tuple[list[Any], Any]]] = {}
        self.masked: set[int] = set()
        self.bad: set[int] = set()

    def reset(self) -> None:
        self.entries = []
        self.pending = {}
        self.masked = set()
        self.bad = set()

    # -- observing -----------------------------------------------------------------------
    def where(self) -> tuple[str, str, str | None, str | None]:
        """(module, phase, fwd_op, node name) of the op being executed."""
        node = _current_node()
        if node is None:
            stack = self.modules.stack
            return (stack[-1] if stack else ""), self.phase, None, None
        tag = node.metadata.get("opscope")
        if tag:
            return tag[0], "backward", tag[1], node.name()
        return "", "backward", None, node.name()

    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Check one aten op's outputs (called by the dispatch mode after the op ran)."""
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _OpKind(func)
        if type(out) is _Tensor:
            outs: Any = (out,)
        else:
            outs = [t for _, _, t in flat_outputs(out)]
            if not outs and kind.written.written:  # _foreach_add_ and friends return nothing
                outs = written_tensors(kind.written, args, kwargs)
        module, phase, fwd, node = self.where()
        in_ids = _ids(args, kwargs)
        self.observe(kind.name, module, phase, fwd, node, in_ids, outs, args,
                     check=not kind.skip, view=kind.view, select=kind.select)

    def observe(self, name: str, module: str, phase: str, fwd: str | None, node: str | None,
                in_ids: tuple[int, ...], outs: Any, args: Any = None, *, check: bool = True,
                view: bool = False, select: bool = False, strict: bool = False) -> int:
        """Record one call and check its floating outputs; returns the entry index."""
        entries = self.entries
        index = len(entries)
        recs = []
        entry = [name, module, phase, fwd, node, in_ids, recs, view]
        entries.append(entry)
        masked, bad = self.masked, self.bad
        for t in outs:
            tid = id(t)
            if (masked or bad) and tid not in in_ids:
                masked.discard(tid)  # a new tensor may reuse the id of a freed one
                bad.discard(tid)
            rec = [tid, None, 0, None, None, None, None]
            recs.append(rec)
            if view or not check or not t.dtype.is_floating_point or t.device.type == "meta" or not t.numel():
                continue
            if phase == "forward" and t.requires_grad:
                fn = t.grad_fn
                if fn is not None:  # backward ops find their forward module through this tag
                    fn.metadata.setdefault("opscope", (module, name))
            rec[O_REF] = weakref.ref(t)
            rec[O_VER] = _version(t)
            rec[O_DTYPE] = t.dtype
            with _no_dispatch():
                mn, mx = torch.aminmax(t.detach())
            if t.is_cpu:
                lo = rec[O_LO] = mn.item()
                hi = rec[O_HI] = mx.item()
                if not (lo > -self.limit and hi < self.limit):
                    self.judge(index, len(recs) - 1, t, args, select, strict)
            else:
                self.pending.setdefault(mn.dtype, []).append((rec, mn, mx, index, len(recs) - 1, select, strict))
        return index

    # -- judging -------------------------------------------------------------------------
    def judge(self, index: int, slot: int, t: torch.Tensor | None, args: Any, select: bool, strict: bool) -> None:
        entry = self.entries[index]
        rec = entry[OUTS][slot]
        lo, hi = rec[O_LO], rec[O_HI]
        kind = classify(lo, hi, self.limit)
        if kind is None:
            return
        in_ids = entry[IN_IDS]
        if kind == "-inf" and not strict and entry[PHASE] == "forward" and (
                select or any(i in self.masked for i in in_ids)):
            self.masked.add(rec[O_ID])  # a mask: its -Inf is there on purpose
            if not hi > self.limit:
                return
            kind = "limit"
        if kind != "limit":
            bad = self.bad
            propagated = any(i in bad for i in in_ids)
            bad.add(rec[O_ID])
            if propagated:  # an input was already NaN/Inf: the hit where it started was reported
                return
        self.on_hit(index, slot, kind, t, args)

    def resolve(self) -> None:
        """Read every pending device result (one transfer per dtype) and judge them in order."""
        if not self.pending:
            return
        found = []
        for items in self.pending.values():
            with _no_dispatch():
                los = torch.stack([i[1] for i in items]).tolist()
                his = torch.stack([i[2] for i in items]).tolist()
            for item, lo, hi in zip(items, los, his, strict=True):
                rec = item[0]
                rec[O_LO], rec[O_HI] = lo, hi
                if not (lo > -self.limit and hi < self.limit):
                    found.append(item)
        self.pending = {}
        for rec, _, _, index, slot, select, strict in sorted(found, key=lambda i: (i[3], i[4])):
            ref = rec[O_REF]
            self.judge(index, slot, ref() if ref is not None else None, None, select, strict)


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter
        return -1


def _ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    ids = []
    for a in args:
        if type(a) is _Tensor or isinstance(a, _Tensor):
            ids.append(id(a))
        elif type(a) in (list, tuple):
            ids.extend(id(x) for x in a if isinstance(x, _Tensor))
    if kwargs:
        ids.extend(id(v) for v in kwargs.values() if isinstance(v, _Tensor))
    return tuple(ids)


class WatchDispatchMode(TorchDispatchMode):
    """Aten-level watch: every dispatcher op's outputs, forward, backward and optimizer."""

    def __init__(self, checker: Checker) -> None:
        super().__init__()
        self.checker = checker

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        out = func(*args, **kwargs)
        if self.checker.on:
            self.checker.op(func, args, kwargs, out)
        return out
