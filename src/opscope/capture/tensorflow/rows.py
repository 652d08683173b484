"""Plans and measured values into opscope records (one row per tensor an op read or wrote)."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from opscope.capture.tensorflow.plan import GraphPlan, OpPlan, Ref
from opscope.config import DumpConfig
from opscope.model.records import new_row

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
                      node=op.node, note=op.note if op.note in ("view",) else None, view=view)
        self.next_id += 1
        return row

    def graph_rows(self, plan: GraphPlan, values: list[Value | None], constants: list[Value | None]) -> list[list[Any]]:
        """Rows of one run of a traced graph, in the order its ops were created."""
        out_ids: list[list[int | None]] = []
        rows: list[list[Any]] = []
        for op in plan.ops:
            if not op.inputs and not op.outputs:
                out_ids.append([])
                continue
            ins = [(r, _pick(values, constants, r.value), _producer_id(out_ids, r.producer)) for r in op.inputs]
            outs = [(r, _pick(values, constants, r.value)) for r in op.outputs]
            op_rows, ids = self.op_rows(op, ins, outs)
            rows.extend(op_rows)
            out_ids.append(ids)
        return rows


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


def _pick(values: list[Value | None], constants: list[Value | None], index: int) -> Value | None:
    if index >= 0:
        return values[index]
    return constants[-2 - index] if index < -1 else None
