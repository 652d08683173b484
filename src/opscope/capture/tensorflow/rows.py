"""Plans and measured values into opscope records (one row per tensor an op read or wrote)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from opscope.capture.tensorflow import absent
from opscope.capture.tensorflow.plan import GraphPlan, OpPlan, Ref
from opscope.config import DumpConfig
from opscope.model.records import COL, STATS, new_row

_ID, _STEP, _SEQ, _CALL, _IO, _SLOT, _ARG = (COL[c] for c in ("id", "step", "seq", "call", "io", "slot", "arg"))
_DTYPE, _SHAPE, _NUMEL, _DATA, _KEY = (COL[c] for c in ("dtype", "shape", "numel", "data", "key"))
_PRODUCER, _PARAM, _VIEW, _NOTE = COL["producer"], COL["param"], COL["view"], COL["note"]
Value = tuple[str, list[int], int, tuple[Any, ...], str | None, str | None]  # dtype, shape, numel, stats, data, key


class StepRows:
    """Numbers one rank's records: ids across the run; seq and per-(module, phase) call
    counters within a step (:meth:`next_step` resets them)."""

    def __init__(self, cfg: DumpConfig, rank: int, device: str) -> None:
        self.cfg, self.rank, self.device = cfg, rank, device
        self.next_id = 0
        self.step = 0
        self.seq = 0
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)

    def next_step(self, step: int) -> None:
        self.step, self.seq = step, 0
        self.calls.clear()

    def wanted(self, op: str, node: str, module: str, phase: str) -> bool:
        cfg = self.cfg
        if phase not in cfg.phases or (cfg.scope and not cfg.scope.matches(module)):
            return False
        return not cfg.ops or cfg.ops.matches(op) or cfg.ops.matches(node)

    def op_rows(self, op: OpPlan, ins: list[tuple[Ref, Value | None, int | None]],
                outs: list[tuple[Ref, Value | None]]) -> tuple[list[list[Any]], list[int | None]]:
        """Rows of one op run: ``ins`` carry each input's producer row id; returns the rows
        and the row id of each output (None where it has no row)."""
        op_name = op.op if op.note == "layer" or "." in op.op else f"tf.{op.op}"
        out_ids: list[int | None] = [None] * len(outs)
        if not self.wanted(op_name, op.node, op.module, op.phase):
            return [], out_ids
        call_key = (op.module, op.phase, op_name)
        call = self.calls[call_key]
        self.calls[call_key] = call + 1
        seq, self.seq = self.seq, self.seq + 1
        rows: list[list[Any]] = []
        mode = self.cfg.mode
        for slot, (ref, value, producer) in enumerate(ins):
            if value is None or mode == "output":
                continue
            io = ref.io or ("param" if ref.param else "input")
            rows.append(self._row(op, op_name, seq, call, io, slot, ref, value, producer))
        for slot, (ref, value) in enumerate(outs):
            if value is None:
                continue
            out_ids[slot] = self.next_id
            if mode != "input":
                rows.append(self._row(op, op_name, seq, call, "output", slot, ref, value, None))
            else:
                self.next_id += 1  # ids stay those a full dump would give
        return rows, out_ids

    def _row(self, op: OpPlan, op_name: str, seq: int, call: int, io: str, slot: int, ref: Ref,
             value: Value, producer: int | None) -> list[Any]:
        dtype, shape, numel, stats, data, key = value
        view = None
        if ref.shape is not None and ref.shape != shape and _numel(ref.shape) == numel:
            shape = ref.shape
            if data is not None:
                view = json.dumps({"shape": shape, "stride": _strides(shape), "offset": 0})
        row = new_row(id=self.next_id, rank=self.rank, step=self.step, seq=seq, phase=op.phase,
                      module=op.module, op=op_name, call=call, io=io, slot=slot, arg=ref.arg,
                      dtype=dtype, shape=shape, device=self.device, numel=numel, stats=stats,
                      data=data, key=key, producer=producer, param=ref.param, fwd_op=op.fwd_op,
                      node=op.node, note=op.note if op.note in ("view",) else None, view=view, args=op.args)
        self.next_id += 1
        return row

    def template(self, plan: GraphPlan) -> _Template:
        template = plan.__dict__.get("rows_template")
        if template is None:
            template = plan.__dict__["rows_template"] = _Template(self, plan)
        return template

    def stats_table(self, plan: GraphPlan, run: Any, constants: Any) -> Any:
        """The rows of one graph run from its values' statistics columns and the constants'
        (:class:`~.stats.Measured`): a :class:`~.columns.PendingTable`, an Arrow table built
        on the writer's thread (statistics only; tensors and the watch take :meth:`graph_rows`)."""
        from opscope.capture.tensorflow.columns import PendingTable

        columns = self._columns(plan, len(run.shapes))
        return PendingTable(columns, run, constants, *self._number(plan))

    def _columns(self, plan: GraphPlan, n_values: int) -> Any:
        template = self.template(plan)
        if template.columns is None:
            from opscope.capture.tensorflow.columns import GraphColumns

            template.columns = GraphColumns(template.entries, COL, template.ids, template.ops, n_values)
        return template.columns

    def _number(self, plan: GraphPlan) -> tuple[int, int, int, Any]:
        """A run's first id, step, first seq and per-call-key offsets; counts the run."""
        import numpy as np

        template = self.template(plan)
        offsets = np.array([self.calls[k] for k in template.keys] or [0], dtype=np.int64)
        numbers = (self.next_id, self.step, self.seq, offsets)
        for key, count in zip(template.keys, template.counts):
            self.calls[key] += count
        self.next_id += template.ids
        self.seq += template.ops
        return numbers

    def graph_rows(self, plan: GraphPlan, values: list[Value | None], constants: list[Value | None]) -> list[list[Any]]:
        """Rows of one run of a traced graph, in the order its ops were created. The rows'
        fixed columns are laid out once per graph (:class:`_Template`); a run fills in ids,
        step, order and the measured values."""
        template = self.template(plan)
        base, step, seq = self.next_id, self.step, self.seq
        calls = self.calls
        offsets = [calls[k] for k in template.keys]
        rows: list[list[Any]] = []
        for static, index, producer, local_id, seq_local, key, call_local, shape in template.entries:
            value = values[index] if index >= 0 else constants[-2 - index]
            if value is None:
                continue
            row = static.copy()
            dtype, vshape, numel, stats, data, tkey = value
            view = None
            if shape is not None and shape != vshape and _numel(shape) == numel:
                vshape = shape
                if data is not None:
                    view = json.dumps({"shape": shape, "stride": _strides(shape), "offset": 0})
            row[_ID], row[_STEP], row[_SEQ] = base + local_id, step, seq + seq_local
            row[_CALL], row[_DTYPE], row[_SHAPE], row[_NUMEL] = call_local + offsets[key], dtype, vshape, numel
            row[STATS], row[_DATA], row[_KEY] = stats, data, tkey
            if stats is absent.STATS:
                row[_NOTE] = absent.NOTE
            row[_PRODUCER] = None if producer is None else base + producer
            row[_VIEW] = view
            rows.append(row)
        for call_key, count in zip(template.keys, template.counts):
            calls[call_key] += count
        self.next_id += template.ids
        self.seq += template.ops
        return rows


class _Template:
    """The rows one run of a graph writes, with their fixed columns filled in."""

    def __init__(self, owner: StepRows, plan: GraphPlan) -> None:
        self.entries: list[tuple[list[Any], int, int | None, int, int, int, int, list[int] | None]] = []
        key_index: dict[tuple[str, str, str], int] = {}
        self.keys: list[tuple[str, str, str]] = []
        self.counts: list[int] = []
        out_local: dict[tuple[int, int], int] = {}
        mode, local, ops = owner.cfg.mode, 0, 0
        for op_index, op in enumerate(plan.ops):
            if not op.inputs and not op.outputs:
                continue
            op_name = op.op if op.note == "layer" or "." in op.op else f"tf.{op.op}"
            if not owner.wanted(op_name, op.node, op.module, op.phase):
                continue
            key = key_index.setdefault((op.module, op.phase, op_name), len(self.keys))
            if key == len(self.keys):
                self.keys.append((op.module, op.phase, op_name))
                self.counts.append(0)
            call, seq = self.counts[key], ops
            self.counts[key] += 1
            ops += 1
            base = new_row(rank=owner.rank, phase=op.phase, module=op.module, op=op_name, device=owner.device,
                           fwd_op=op.fwd_op, node=op.node, note=op.note if op.note == "view" else None,
                           args=op.args)
            for slot, ref in enumerate(op.inputs):
                if ref.value == -1 or mode == "output":
                    continue
                io = ref.io or ("param" if ref.param else "input")
                producer = out_local.get(ref.producer) if ref.producer is not None else None
                self._add(base, io, slot, ref, producer, local, seq, key, call)
                local += 1
            for slot, ref in enumerate(op.outputs):
                if ref.value == -1:
                    continue
                out_local[(op_index, slot)] = local
                if mode != "input":
                    self._add(base, "output", slot, ref, None, local, seq, key, call)
                local += 1
        self.ids, self.ops = local, ops
        self.columns: Any = None  # the Arrow layout of the same rows (columns.GraphColumns), built on first use

    def _add(self, base: list[Any], io: str, slot: int, ref: Ref, producer: int | None, local: int, seq: int,
             key: int, call: int) -> None:
        static = base.copy()
        static[_IO], static[_SLOT], static[_ARG], static[_PARAM] = io, slot, ref.arg, ref.param
        self.entries.append((static, ref.value, producer, local, seq, key, call, ref.shape))


def _producer_id(out_ids: list[list[int | None]], producer: tuple[int, int] | None) -> int | None:
    if producer is None or producer[0] >= len(out_ids):
        return None
    ids = out_ids[producer[0]]
    return ids[producer[1]] if producer[1] < len(ids) else None


def _strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return strides[::-1]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
