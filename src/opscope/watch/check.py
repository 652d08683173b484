"""The per-op check behind ``opscope.watch``: one fused reduction per output, no per-op sync.

Every checked output gets one ``torch.aminmax`` (one pass: NaN propagates into both ends,
+Inf shows in the max, -Inf in the min, a limit is two comparisons). On the CPU the two
numbers are read at once (no device to wait for); on an accelerator they stay on the
device and are read for the whole step in one transfer per dtype (:meth:`Checker.resolve`).

Each observed call leaves an *entry* (op, module, phase, input ids, outputs with their
range and a weak reference) so that, on a hit, the chain back to the earliest abnormal
output can be walked (:mod:`~opscope.watch.chain`). Entries live for one step.

The -Inf that a mask writes on purpose is not an alarm: in forward, -Inf (and no NaN/+Inf)
in the output of an op that only moves values (masked_fill, where, full, cat, ...) or of an
op with an input already known to be a mask is *masked*; everything else alarms.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.capture.torch.dispatch import flat_outputs, written_tensors
from opscope.capture.torch.op_kinds import ADDITIVE, KINDS, OpKind, base_name

_current_node = torch._C._current_autograd_node
_no_dispatch = torch._C._DisableTorchDispatch
_Tensor = torch.Tensor
_INF = math.inf

# entry layout (lists, cheap on the hot path)
NAME, MODULE, PHASE, FWD, NODE, IN_IDS, OUTS, VIEW = range(8)
# output record layout
O_ID, O_REF, O_VER, O_LO, O_HI, O_DTYPE = range(6)
# Names tensor i of a checked group and its named inputs (called on hits only).
Describe = Callable[[int], tuple[str, list[tuple[str, torch.Tensor]]]]

_WIDENS = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.float64),
           (torch.float16, torch.float64), (torch.bfloat16, torch.float64)}


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
        limit: values beyond ``±limit`` are abnormal (None = only NaN/Inf).
        on_hit: ``on_hit(entry_index, out_index, kind, tensor_or_None, args_or_None)``,
            called in execution order for each abnormal output where it *starts* (an
            output whose input was already NaN/Inf is not reported again).
    """

    def __init__(self, modules: Any, limit: float | None, on_hit: Callable[..., None]) -> None:
        self.modules = modules
        self.limit = _INF if limit is None else float(limit)
        self.on_hit = on_hit
        self.on = False
        self.defer = False  # read results once per step, as on an accelerator (set by tests on CPU)
        self.tag_nodes = True  # aten level: backward ops find their module through the autograd node
        self.ops_on = True  # off while an optimizer step runs at aten level (checked per parameter)
        self.phase = "forward"
        self.ident: Callable[[torch.Tensor], int] = id  # a tensor's identity in entries
        self.range_of: Callable[[torch.Tensor], tuple[float, float] | None] | None = None  # native pass
        self.ranges_of: Callable[[list[torch.Tensor]], list[Any]] | None = None  # the same, for a list
        self.reset()

    def reset(self) -> None:
        self.entries: list[list[Any]] = []
        self.pending: dict[torch.dtype, list[tuple[Any, ...]]] = {}
        self.masked: set[int] = set()
        self.bad: set[int] = set()
        self.groups: list[tuple[str, str, list[torch.Tensor], Describe, list[int], torch.Tensor]] = []
        self.params: dict[int, str] = {}  # entry index -> parameter name (group entries)
        self.inputs: dict[int, list[tuple[str, torch.Tensor]]] = {}  # entry index -> named inputs (group entries)
        self.made: dict[int, tuple[str, str]] = {}  # forward tensor id -> (module, op) that made it

    # -- observing -----------------------------------------------------------------------
    def op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Check one aten op's outputs (called by the dispatch mode after the op ran)."""
        kind = KINDS.get(func)
        if kind is None:
            kind = KINDS[func] = OpKind(func)
        if type(out) is _Tensor:
            outs: Any = (out,)
        else:
            outs = [t for _, _, t in flat_outputs(out)]
            if not outs and kind.info.written:  # _foreach_add_ and friends return nothing
                outs = written_tensors(kind.info, args, kwargs)
        node = _current_node()
        if node is None:
            stack = self.modules.stack
            module, phase, fwd, nname = (stack[-1] if stack else ""), self.phase, None, None
        else:
            # torch's stub declares Node.metadata a method; autograd's C++ nodes make it a dict property
            tag = node.metadata.get("opscope")  # type: ignore[attr-defined]
            module, fwd = tag if tag else ("", None)
            phase, nname = "backward", node.name()
        in_ids = _ids(args, kwargs)
        if phase == "forward" and self.tag_nodes:
            self._tag(args)
        transparent = kind.transparent
        if kind.cast and args and isinstance(args[0], _Tensor):
            transparent = args[0].dtype is out.dtype or (args[0].dtype, out.dtype) in _WIDENS
        if transparent:
            self.entries.append([kind.name, module, phase, fwd, nname, in_ids,
                                 [[id(t), None, 0, None, None, None] for t in outs], True])
            if self.masked or self.bad:
                self._carry(in_ids, outs)
            if phase == "forward":
                for t in outs:
                    self.made[id(t)] = (module, kind.name)
            return
        self.observe(kind.name, module, phase, fwd, nname, in_ids, outs, args, check=not kind.skip,
                     select=kind.select)

    def _tag(self, args: tuple[Any, ...]) -> None:
        """Tag the autograd nodes of this op's inputs with the forward module and op that made
        them, so that backward ops can name them. (An op's own output gets its ``grad_fn`` only
        after ``__torch_dispatch__`` returns, so nodes are tagged when their tensor is used.)"""
        made = self.made
        for a in args:
            if type(a) is _Tensor and a.requires_grad:
                fn = a.grad_fn
                if fn is not None:
                    meta: dict[str, Any] = fn.metadata  # type: ignore[assignment]  # a dict property (stub: method)
                    if "opscope" not in meta:
                        tag = made.get(id(a))
                        if tag is not None:
                            meta["opscope"] = tag

    def _carry(self, in_ids: tuple[int, ...], outs: Any) -> None:
        """A view or copy holds its input's values: it is a mask / already bad when its input is."""
        for marks in (self.masked, self.bad):
            hit = bool(in_ids) and in_ids[0] in marks
            for t in outs:
                if hit:
                    marks.add(id(t))
                elif id(t) not in in_ids:
                    marks.discard(id(t))

    def observe(self, name: str, module: str, phase: str, fwd: str | None, node: str | None,
                in_ids: tuple[int, ...], outs: Any, args: Any = None, *, check: bool = True,
                select: bool = False, strict: bool = False) -> int:
        """Record one call and check its floating outputs; returns the entry index."""
        entries = self.entries
        index = len(entries)
        recs: list[list[Any]] = []
        entries.append([name, module, phase, fwd, node, in_ids, recs, False])
        masked, bad, limit = self.masked, self.bad, self.limit
        for t in outs:
            tid = id(t)
            if (masked or bad) and tid not in in_ids:
                masked.discard(tid)  # a new tensor may reuse the id of a freed one
                bad.discard(tid)
            rec: list[Any] = [tid, None, 0, None, None, None]
            recs.append(rec)
            if not check or not t.dtype.is_floating_point or t.is_meta or not t.numel():
                continue
            if phase == "forward":
                self.made[tid] = (module, name)
            rec[O_REF] = weakref.ref(t)
            rec[O_VER] = t._version if not t.is_inference() else -1
            rec[O_DTYPE] = t.dtype
            r = self.range_of(t) if self.range_of is not None and t.is_cpu and not self.defer else None
            if r is not None:
                lo, hi = rec[O_LO], rec[O_HI] = r
            else:
                with _no_dispatch():
                    mn, mx = torch.aminmax(t.detach())
                    if t.is_cpu and not self.defer:
                        lo = rec[O_LO] = mn.item()
                        hi = rec[O_HI] = mx.item()
                    else:
                        lo = None
            if lo is not None:
                if not (lo > -limit and hi < limit):
                    self.judge(index, len(recs) - 1, t, args, select, strict)
            else:
                self.pending.setdefault(mn.dtype, []).append((rec, mn, mx, index, len(recs) - 1, select, strict))
        return index

    def count(self) -> int:
        """Number of entries this step."""
        return len(self.entries)

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
                select or any(i in self.masked for i in in_ids) or self._constant_mask(entry, args)):
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

    def _constant_mask(self, entry: list[Any], args: Any) -> bool:
        """Is one of the inputs a mask built before this step (a buffer or an attribute made in
        ``__init__``: not produced by any op watched in this step) holding -Inf?"""
        made = self.made
        if args is None:  # read at the step's end: the inputs are gone; judge by the op
            return base_name(entry[NAME]) in ADDITIVE and any(i not in made for i in entry[IN_IDS])
        for a in args:
            for t in (a if type(a) in (list, tuple) else (a,)):
                if isinstance(t, _Tensor) and id(t) not in made and t.dtype.is_floating_point and t.numel():
                    with _no_dispatch():
                        if t.detach().min().item() == -_INF:
                            self.masked.add(id(t))
                            return True
        return False

    def group(self, label: str, phase: str, tensors: list[torch.Tensor],
              describe: Describe) -> None:
        """Strict check of tensors that have names (gradients, parameters, optimizer state).

        ``describe(i)`` gives tensor ``i``'s name and its named inputs (shown on a hit); it is
        called on hits only. CPU tensors get the native range pass (exact); others one fused
        ``_foreach_norm`` (the L2 norm is NaN/Inf when any element is, and >= the abs-max; a
        tensor whose norm is not finite or beyond the limit is checked exactly, since the norm
        of large finite values may overflow: the norm only filters).
        """
        picked: Sequence[int] = range(len(tensors))
        if self.ranges_of is not None and not self.defer:  # it says None for what it cannot read
            hits, rest, limit = [], [], self.limit
            for i, r in enumerate(self.ranges_of(tensors)):
                if r is None:
                    rest.append(i)
                elif not (r[0] > -limit and r[1] < limit):
                    hits.append(i)
            self._group_done(label, phase, tensors, describe, hits)
            picked = rest
        picked = [i for i in picked if _checkable(tensors[i])]
        if not picked:
            return
        with _no_dispatch():
            norms = torch._foreach_norm([tensors[i].detach() for i in picked])
            flat = torch.stack([n if n.dtype is torch.float32 else n.float() for n in norms])
        if flat.is_cpu and not self.defer:
            self._group_done(label, phase, tensors, describe, _beyond(picked, flat.tolist(), self.limit))
        else:  # read with the rest of the step
            self.groups.append((label, phase, tensors, describe, picked, flat))

    def _group_done(self, label: str, phase: str, tensors: list[torch.Tensor], describe: Callable[..., Any],
                    hits: list[int]) -> None:
        ident = self.ident
        for i in hits:
            name, inputs = describe(i)
            t = tensors[i]
            index = self.count()
            self.params[index] = name
            self.inputs[index] = inputs
            self.observe(label, name.partition(" ")[0].rpartition(".")[0], phase, None, None,
                         tuple(ident(x) for _, x in inputs) or (ident(t),), [t], strict=True)

    def _resolve_groups(self) -> None:
        groups, self.groups = self.groups, []
        for label, phase, tensors, describe, picked, flat in groups:
            self._group_done(label, phase, tensors, describe, _beyond(picked, flat.tolist(), self.limit))

    def resolve(self) -> None:
        """Read every pending device result (one transfer per dtype) and judge them in order."""
        self._resolve_groups()
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


def _checkable(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point and not t.is_meta and bool(t.numel()) and t.layout == torch.strided


def _beyond(picked: Sequence[int], norms: list[float], limit: float) -> list[int]:
    return [i for i, norm in zip(picked, norms, strict=True) if not norm <= limit]


def _ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    ids = []
    for a in args:
        if isinstance(a, _Tensor):
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
        checker = self.checker
        if checker.on and checker.ops_on:
            checker.op(func, args, kwargs, out)
        return out
