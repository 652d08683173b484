"""Turns observed op calls into rows: data flow, call indices, statistics jobs.

Shared by the three capture levels (aten dispatch, torch API, module). Every tensor's
statistics are computed once: an op's input that an earlier captured op produced refers
to that output's row (``producer``) and gets its statistics when the step is flushed;
only tensors seen for the first time (parameters, model inputs) are reduced on their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from opscope.capture.torch.dataflow import DataFlow, annotate, storage_key, version_of, view_geometry
from opscope.capture.torch.recorder_measure import Measuring
from opscope.capture.torch.recorder_writes import Writes
from opscope.capture.torch.stats import dtype_name, materialize
from opscope.capture.torch.suspects import TensorPlan
from opscope.capture.torch.unfilled import Unfilled
from opscope.capture.torch.worker import NativeStats
from opscope.config import DumpConfig
from opscope.model.calls import overwrites_first
from opscope.model.records import (
    COL,
    COLLECTIVE_NOTE,
    COLUMNS,
    NO_STATS,
    STATS,
    UNINITIALIZED_NOTE,
    UNREAD_NOTE,
)
from opscope.storage.writer import DumpWriter

# One tensor of a call's inputs or outputs: (slot, argument name, tensor).
TensorItem = tuple[int, "str | None", torch.Tensor]

_ID, _PRODUCER, _DATA, _KEY = COL["id"], COL["producer"], COL["data"], COL["key"]
_NOTE = COL["note"]
_ARGS, _SOURCE, _FWD, _NODE, _PARAM = COL["args"], COL["source"], COL["fwd_op"], COL["node"], COL["param"]
_VIEW, _DTYPE = COL["view"], COL["dtype"]
_DTYPE_NAMES: dict[torch.dtype, str] = {}
assert COLUMNS == ("id", "rank", "step", "seq", "phase", "module", "op", "call", "io", "slot", "arg", "dtype",
                   "shape", "device", "numel", "data", "key", "producer", "param", "fwd_op", "node", "args",
                   "source", "note", "view", "stats"), "Recorder._new_row builds rows in this order"


def dtype_name_cached(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


class Recorder(Measuring, Writes):
    """Collects the rows of one rank, step by step, and hands them to the writer.

    Args:
        cfg: the dump configuration.
        writer: where rows and tensors go.
        rank: this process's rank.
        param_names: ``id(parameter) -> name``, filled in by the module tracker.
        engine: ``"c"`` (CPU worker thread with the C kernel), ``"sync"`` (C kernel on
            the calling thread) or ``"torch"`` (device reductions, one transfer per step).
    """

    def __init__(self, cfg: DumpConfig, writer: DumpWriter, rank: int, param_names: dict[int, str],
                 engine: str = "c") -> None:
        self.cfg = cfg
        self.writer = writer
        self.rank = rank
        self.param_names = param_names
        self.engine = engine
        self.worker = _native(self._store, self._publish) if engine == "async" else None
        if engine == "async" and self.worker is None:
            self.engine = "sync"  # another capture holds the native thread
        self.want_inputs = cfg.mode in ("input", "all")
        self.want_outputs = cfg.mode in ("output", "all")
        self.next_id = 0
        self.step = -1
        self.meta_skipped = 0
        self.probing = False
        self._selected: dict[tuple[str, str, str], bool] = {}
        self.plan = TensorPlan.make(cfg, rank)  # which calls keep full tensors; byte limit (suspects.py)
        # a view can share its input's data only when every tensor is stored (data="tensor");
        # with tensor_ops or suspects its input may hold statistics only
        plan = self.plan
        self.views_share_data = plan is not None and plan.every and plan.keys is None and plan.tensor_ops is None
        self._reset()

    def _reset(self) -> None:
        self.rows: list[list[Any]] = []
        self.links: list[tuple[list[Any], list[Any]]] = []
        self.device_jobs: list[tuple[list[Any], Any]] = []
        self.flow = DataFlow()  # which row last measured each tensor (dataflow.py)
        self._stepping: dict[int, tuple[int, int]] = {}  # parameter id -> (version, writes) as the update began
        self.unfilled = Unfilled()  # rows of memory that holds no data yet (unfilled.py)
        self.calls: dict[tuple[str, str, str], int] = {}
        self.seq = 0

    # -- selection -------------------------------------------------------------------
    def selected(self, module: str, op: str, phase: str) -> bool:
        """Whether ``op`` in ``module`` during ``phase`` passes the scope/ops/phases filters."""
        key = (module, op, phase)
        hit = self._selected.get(key)
        if hit is None:
            cfg = self.cfg
            hit = ((phase in cfg.phases or (phase == "recompute" and "backward" in cfg.phases))
                   and (not cfg.scope or cfg.scope.matches(module))
                   and (not cfg.ops or cfg.ops.matches(op)))
            self._selected[key] = hit
        return hit

    def wants_data(self, op: str, module: str = "", phase: str = "", call: int = 0) -> bool:
        """Full tensors for this call (data, tensor_ops, suspects), until tensor_limit_mb is reached."""
        plan = self.plan
        return plan is not None and plan.wants(self.step, phase, module, op, call)

    # -- recording -------------------------------------------------------------------
    def record(self, op: str, module: str, phase: str, inputs: Sequence[TensorItem],
               outputs: Sequence[TensorItem], *, views: tuple[int, ...] = (),
               mutated: tuple[int, ...] = (), uninitialized: bool = False, **head: Any) -> int:
        """Record one op call; returns its call index. ``views``/``mutated`` list output slots
        that alias an input (same elements) or were written in place; ``uninitialized`` marks
        outputs of ``empty``-like ops, whose memory is not data yet. The other keywords are
        those of :meth:`record_inputs`."""
        call = self.record_inputs(op, module, phase, inputs, views=bool(views), **head)
        self.record_outputs(call, outputs, views=views, mutated=mutated, uninitialized=uninitialized)
        return call[0][4]

    def record_inputs(self, op: str, module: str, phase: str, inputs: Sequence[TensorItem],
                      *, args: Any = None, views: bool = False, fwd_op: str | None = None, node: str | None = None,
                      source: str | None = None, input_io: str = "input", call: int | None = None,
                      param: str | None = None, unread: frozenset[str] = frozenset(),
                      view_op: bool = False, empty_first: bool = False,
                      written: frozenset[str] = frozenset()) -> tuple[Any, ...]:
        """The first half of :meth:`record`, taken before the op runs (an in-place op changes
        its inputs): the input rows. ``call`` reuses the index of an earlier record of the
        same call (module entry and exit); ``param`` names the parameter the inputs belong
        to (a gradient's parameter); ``unread``: the arguments the op fills without reading
        them (an out= argument, a collective's destination), recorded unmeasured as the
        first argument of ``copy_`` is; ``view_op``: an aten op that only views its inputs
        (reads no element); ``empty_first``: the first argument, which the call writes in part,
        holds no data yet (:meth:`holds_no_data`); ``written``: the arguments an aten op writes in
        place (one that holds no data yet is recorded unmeasured). Returns what
        :meth:`record_outputs` needs."""
        if call is None:
            key = (module, phase, op)
            call = self.calls.get(key, 0)
            self.calls[key] = call + 1
        seq = self.seq
        self.seq = seq + 1
        data = not self.probing and self.wants_data(op, module, phase, call)
        head = (seq, phase, module, op, call, args, source, fwd_op, node)
        first_input_row = first_input = None
        # the storages of the arguments it writes in place that hold no data: so do those written
        # outputs (only those: a fused SGD's first step writes parameters beside new empty buffers)
        wrote_empty: set[int] = set()
        if self.want_inputs or views:
            unread_first = overwrites_first(op) or empty_first
            for slot, arg, t in inputs:
                if (unread_first and slot == 0) or arg in unread:  # what is there before the op fills it is not data
                    if self.unfilled.view_reads:
                        self._unmeasure(t)
                    if self.want_inputs:
                        pname = self.param_names.get(id(t))
                        note = UNINITIALIZED_NOTE if empty_first and slot == 0 else UNREAD_NOTE
                        self._new_row(head, "param" if pname else input_io, slot, arg, t, pname)[_NOTE] = note
                    continue
                if arg in written and not view_op:  # (as _input_row finds it)
                    entry = self.flow.find(t)
                    if entry is not None and self.unfilled.holds_none(entry[1]):
                        wrote_empty.add(storage_key(t))
                row = self._input_row(head, slot, arg, t, data, input_io, view_op, arg in written)
                if first_input_row is None:
                    first_input_row, first_input = row, t
                if param is not None and row is not None:
                    row[_PARAM] = param
        else:  # no input rows (mode="output"): backward attribution still needs the tags
            for _, _, t in inputs:
                entry = self.flow.entries.get(id(t))
                if entry is not None and not entry[4] and entry[0]() is t:
                    entry[4] = True
                    annotate(t, entry[1])
        return head, data, first_input_row, first_input, wrote_empty

    def record_outputs(self, call: tuple[Any, ...], outputs: Sequence[TensorItem], *,
                       views: tuple[int, ...] = (), mutated: tuple[int, ...] = (), uninitialized: bool = False,
                       bumped: bool = False, unfilled: tuple[int, ...] = (), collective: bool = False) -> None:
        """The second half of :meth:`record`, after the op ran: the output rows. ``bumped``:
        the version counters of written outputs already moved on (else torch bumps them
        only after a dispatch mode returns). ``unfilled``: outputs that hold no data yet.
        ``collective``: what the outputs hold arrives later; each is measured at its next
        read, which has the output's row for its producer."""
        if not self.want_outputs:
            return
        head, data, first_input_row, first_input, wrote_empty = call
        for slot, arg, t in outputs:
            src = first_input_row if slot in views else None
            if uninitialized or slot in unfilled or (slot in mutated and storage_key(t) in wrote_empty):
                row = self._new_row(head, "output", slot, arg, t)
                self.unfilled.empty(row)
                version = version_of(t)  # (an in-place write's: torch bumps it after the op returns)
                self.flow.register(t, row, version + 1 if slot in mutated and not bumped and version >= 0 else version,
                                   None)
            elif collective:
                row = self._new_row(head, "output", slot, arg, t)
                row[_NOTE] = COLLECTIVE_NOTE
                self.flow.holds_result(t, row)
            else:
                self._output_row(head, slot, arg, t, data, src, slot in mutated,
                                 first_input if src is not None else None, bumped)

    def record_params(self, op: str, items: list[tuple[int, str, torch.Tensor, Any, str | None]],
                      before: bool, args: list[str] | None = None) -> None:
        """The optimizer step's parameters: ``items`` are ``(call, module, param, grad, name)``.
        Before the step each parameter and its gradient (rows linked to the parameter by
        name), with ``args`` (the settings of each item's group, JSON), after it each
        parameter again, as an output."""
        if before:
            self._stepping = {}
        for k, (call, module, p, grad, name) in enumerate(items):
            if not before:
                self._stepped(p)
                self.record(op, module, "optimizer", [], [(0, "param", p)], call=call)
                continue
            self._stepping[id(p)] = (version_of(p), self.flow.writes_to(p))
            text = args[k] if args is not None else None
            self.record(op, module, "optimizer", [(0, "param", p)], [], call=call, args=text)
            if grad is not None:
                self.record(op, module, "optimizer", [(1, "grad", grad)], [], input_io="grad", call=call, param=name,
                            args=text)

    def _stepped(self, p: torch.Tensor) -> None:
        """A parameter whose version and writes have not moved over the optimizer step was
        written where no op or version counter shows it (``AdamW(fused=True)``'s kernel): that
        write is counted, so that its row after the step is measured, not taken from before
        (dumpobs_module.h, ``stepped``)."""
        began = self._stepping.pop(id(p), None)
        if began is not None and began == (version_of(p), self.flow.writes_to(p)):
            self.flow.before_write(p)

    def _new_row(self, head: tuple[Any, ...], io: str, slot: int, arg: str | None, t: torch.Tensor,
                 param: str | None = None, producer: int | None = None) -> list[Any]:
        # one list display in COLUMNS order (checked at import): the hot path of every level
        rid = self.next_id
        self.next_id = rid + 1
        dtype = t.dtype
        row = [rid, self.rank, self.step, head[0], head[1], head[2], head[3], head[4], io, slot, arg,
               _DTYPE_NAMES.get(dtype) or dtype_name_cached(dtype), list(t.shape),
               "cpu" if t.is_cpu else str(t.device), t.numel(), None, None, producer, param,
               head[7], head[8], head[5], head[6], None, None, NO_STATS]
        self.rows.append(row)
        return row

    def _input_row(self, head: tuple[Any, ...], slot: int, arg: str | None, t: torch.Tensor, data: bool,
                   input_io: str, view_op: bool = False, written: bool = False) -> list[Any] | None:
        entry = self.flow.find(t)
        left = None  # the row of the op that left it holding no data (dumpobs_inputs.h input_row)
        if entry is not None and not view_op and not self.unfilled.read(entry[1]):
            if written:  # an op writing it in place reads no data there (dumpobs_inputs.h input_row)
                if not self.want_inputs:
                    return None
                row = self._new_row(head, input_io, slot, arg, t)
                self.unfilled.empty(row)
                return row
            left = entry[1][0]
            entry = None  # memory that held no data: whatever filled it since without an op is measured
        if entry is not None:
            if not self.want_inputs:
                return entry[1]
            row = self._new_row(head, "param" if entry[3] else input_io, slot, arg, t, entry[3], entry[1][0])
            self.unfilled.carry(row, entry[1])
            self.links.append((row, entry[1]))
            if not entry[4]:
                entry[4] = True
                annotate(t, entry[1])
            return row
        if not self.want_inputs:
            return None
        pname = self.param_names.get(id(t))
        if pname is None and t._base is not None and self.param_names:  # a view of a parameter (`weight.T`)
            pname = self.param_names.get(id(t._base))
        # (made in part by an in-place write through a view of it: that write is its producer;
        # else the op that left it holding no data: compare/unfilled.py)
        writer = self.flow.written_by(t)
        producer = left if writer is None else writer
        row = self._new_row(head, "param" if pname else input_io, slot, arg, t, pname, producer)
        made = self.flow.stale(t) if view_op else None
        if made is not None and self.unfilled.holds_none(made) and self.flow.result_of(t) is None:
            # an empty written since only in part, through views (dumpobs_inputs.h made_empty)
            self.unfilled.empty(row)
        else:
            self._measure(row, t, data)
        self.flow.register(t, row, version_of(t), pname)
        if view_op and not pname:
            self.unfilled.view_read(row)
        return row

    def _output_row(self, head: tuple[Any, ...], slot: int, arg: str | None, t: torch.Tensor, data: bool,
                    src: list[Any] | None, mutated: bool, base: torch.Tensor | None = None,
                    bumped: bool = False) -> None:
        row = self._new_row(head, "output", slot, arg, t)
        version = version_of(t)
        if mutated and version >= 0 and not bumped:
            version += 1  # torch bumps the counter only after the op returns
        pname = self.param_names.get(id(t))
        note = "view"
        if src is None and not mutated:
            entry = self.flow.same(t, version)
            if entry is not None:
                src, note = entry[1], "alias"  # the very tensor an earlier record measured
        geometry_ = None
        if src is not None and note == "view" and self.views_share_data and (
                data or (self.probing and self.wants_data(head[3], head[2], head[1], head[4]))):
            geometry_ = view_geometry(t, base)
        if src is not None and not mutated and note == "view" and self.unfilled.holds_none(src):
            self.unfilled.empty(row)  # a view of memory that holds no data yet (a part of an empty's)
            self.flow.register(t, row, version, pname, view=True)
            return
        # (the same elements: a view as another dtype, `x.view(torch.int32)`, is measured)
        if src is not None and not mutated and (not data or note == "alias" or geometry_) and src[14] == row[14] \
                and src[_DTYPE] == row[_DTYPE]:
            if geometry_:  # a full-tensor view is kept as its input's data plus this geometry
                row[_VIEW] = geometry_
            # the same elements as an earlier record, not read again (with full tensors a view
            # is stored in its own layout, so that reading it back gives the view)
            row[_PRODUCER] = src[_ID]
            row[_NOTE] = note
            pname = src[_PARAM] or pname
            self.links.append((row, src))
            self.unfilled.carry(row, src)
        else:
            self._measure(row, t, data)
        row[_PARAM] = pname
        self.flow.register(t, row, version, pname, view=src is not None and note == "view")
        if mutated:  # (a view's base: its next read has this row for its producer)
            self.flow.wrote_through(t, row, version)

    # -- steps -----------------------------------------------------------------------
    def begin_step(self, step: int, probe: bool = False) -> None:
        """Start recording ``step``; with ``probe``, only to measure what a tensor dump of
        such a step would store (nothing is written)."""
        self._reset()
        self.step = step
        self.probing = probe

    def idle(self) -> None:
        """No step is captured until the next :meth:`begin_step` (memory held for capture may go)."""

    def drain(self) -> None:
        """Wait for pending statistics (before tensors are changed behind the dispatcher)."""
        if self.worker is not None:
            self.worker.drain()

    def end_step(self) -> None:
        """Finish the step's statistics, resolve data-flow links, hand rows to the writer."""
        if self.probing:
            self.probing = False
            if self.plan is not None:  # the session probes only for a plan that needs an estimate
                self.plan.estimate_from(self.step, self.rows, self.wants_data)
            self._reset()
            return
        self.drain()
        self.unfilled.finish()
        if self.device_jobs:
            for (row, _), stats in zip(self.device_jobs, materialize([j for _, j in self.device_jobs]), strict=True):
                row[STATS] = stats
        for row, src in self.links:
            row[STATS], row[_DATA], row[_KEY] = src[STATS], src[_DATA], src[_KEY]
            if src[_VIEW] and row[_VIEW] is None and row[14] == src[14] and row[12] == src[12]:
                row[_VIEW] = src[_VIEW]  # an input that is a view recorded earlier: the same geometry
            if src[_NOTE] and src[_NOTE] != "view" and not row[_NOTE]:
                row[_NOTE] = src[_NOTE]  # e.g. "meta tensor: not measured" travels with the data
            elif src[_NOTE] == UNINITIALIZED_NOTE:
                row[_NOTE] = UNINITIALIZED_NOTE  # a view of memory that held no data
        if self.rows:
            self.writer.add_rows(self.step, self.rows)
        self._close_step()

    def _close_step(self) -> None:
        """The step's end for the writer and the tensor plan; the step's state cleared."""
        self.writer.end_step(self.step)
        if self.plan is not None:
            self.plan.end_step(self.step)
        self._reset()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def _native(store: Any, publish: Any) -> NativeStats | None:
    try:
        return NativeStats(store, publish=publish)
    except RuntimeError:
        return None
