"""Records of one (rank, iteration) of a MindSpore Data Dump: ops in execution order, their
tensors, and where each input came from (see :mod:`opscope.storage.peers.mindspore`)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.model.records import SCHEMA_FIELDS, STAT_NAMES
from opscope.storage import format as fmt
from opscope.storage.peers.mindspore_files import (
    StatisticRow,
    TensorFile,
    load_array,
    mangle,
    numel,
)
from opscope.storage.peers.mindspore_ir import KernelGraph, Source

OP_PREFIX = "mindspore."
# Cells that wrap the user's net for training; their scopes are dropped from module paths.
WRAPPERS = frozenset({"WithLossCell", "WithEvalCell", "WithGradCell", "TrainOneStepCell",
                      "TrainOneStepWithLossScaleCell", "ForwardValueAndGrad", "GradAccumulationCell",
                      "PipelineCell", "MicroBatchInterleaved", "_VirtualDatasetCell"})
_MAX_UNDUMPED = 8  # undumped ops read through between a kernel and the one it reads
_GRAPH_SEQ = 1_000_000
_UPDATED = 100  # slot offset of an optimizer's in-place updated parameter, recorded as an output  # seq offset of each further graph of one iteration
_COLUMNS = [name for name, _ in SCHEMA_FIELDS]


def phase_of(full_name: str) -> str:
    """``Gradients/...`` -> backward; a scope inside ``optimizer-...`` -> optimizer; else forward."""
    segments = full_name.split("/")
    if segments[0] == "Gradients":
        return "backward"
    if any(s.split("-", 1)[0] == "optimizer" for s in segments[:-1]):
        return "optimizer"
    return "forward"


def module_of(full_name: str) -> str:
    """The cells of a scope as a module path: ``Default/network-WithLossCell/_backbone-Net/b0-Block/
    fc1-Dense/MatMul-op0`` -> ``b0.fc1`` (training wrappers and the net itself dropped)."""
    cells = [s.split("-", 1) for s in full_name.split("/")[:-1] if "-" in s]
    while cells and cells[0][1] in WRAPPERS:
        cells.pop(0)
    if cells and cells[0][0] == "_backbone":
        cells.pop(0)
    return ".".join(name for name, _ in cells)


def forward_op_of(full_name: str) -> str | None:
    """The forward op a gradient op differentiates (``.../Grad_MatMul/MatMul-op2`` -> MatMul)."""
    for segment in reversed(full_name.split("/")[:-1]):
        if segment.startswith("Grad_"):
            return OP_PREFIX + segment[len("Grad_"):]
    return None


class RowBuilder:
    """Rows of one (rank, iteration), graph by graph."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step
        self.rows: list[dict[str, Any]] = []
        self.outputs: dict[tuple[str, int], int] = {}  # (full name, slot) -> record id
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)

    def add_graph(self, data: str, folder: Path, order: tuple[str, ...], graph: KernelGraph | None,
                  files: dict[str, list[TensorFile]], statistics: dict[str, list[StatisticRow]],
                  problems: list[str]) -> list[str]:
        """Add the ops of one graph's iteration folder; returns the files no op claimed."""
        offset = int(data) * _GRAPH_SEQ
        claimed: set[str] = set()
        for index, full in enumerate(order):
            key = mangle(full)
            tensors, stats = files.get(key, []), statistics.get(key, [])
            if not tensors and not stats:
                continue
            claimed.add(key)
            self._add_call(offset + index, full, data, folder, tensors, stats, graph, problems)
        return [f.file for key, group in files.items() if key not in claimed for f in group]

    def _add_call(self, seq: int, full: str, data: str, folder: Path, tensors: list[TensorFile],
                  stats: list[StatisticRow], graph: KernelGraph | None, problems: list[str]) -> None:
        op_type = (tensors[0].op_type if tensors else stats[0].op_type) or full.rsplit("/", 1)[-1].split("-op")[0]
        phase, module, op = phase_of(full), module_of(full), OP_PREFIX + op_type
        call = self.calls[(phase, module, op)]
        self.calls[(phase, module, op)] += 1
        sources = graph.inputs.get(full, []) if graph is not None else []
        by_slot: dict[tuple[str, int], TensorFile | StatisticRow] = {(s.io, s.slot): s for s in stats}
        by_slot.update({(t.io, t.slot): t for t in tensors})
        for (io, slot), item in sorted(by_slot.items(), key=lambda kv: (kv[0][0] != "input", kv[0][1])):
            row = {"id": len(self.rows), "rank": self.rank, "step": self.step, "seq": seq, "phase": phase,
                   "module": module, "op": op, "call": call, "io": io, "slot": slot, "device": None,
                   "node": full, "fwd_op": forward_op_of(full) if phase == "backward" else None}
            if io == "input":
                self._link(row, sources[slot] if slot < len(sources) else None, graph)
            if isinstance(item, TensorFile):
                wrong = _wrong_dtype(graph, full, io, slot, item.dtype)
                if wrong:
                    row["dtype"], row["note"] = item.dtype, wrong
                    _add(problems, DEFECT)
                else:
                    self._tensor(row, item, data, folder, problems)
            else:
                _statistics(row, item)
            if io == "output":
                self.outputs[(full, slot)] = row["id"]
            self.rows.append(row)

    def _link(self, row: dict[str, Any], source: Source | None, graph: KernelGraph | None) -> None:
        for _ in range(_MAX_UNDUMPED):
            if source is None or source.kind != "kernel" or (source.name, source.slot) in self.outputs \
                    or graph is None:
                break
            # an op MindSpore ran but did not dump (a Cast it inserted): read through it to
            # the one tensor it read
            tensors = [s for s in graph.inputs.get(source.name, []) if s.kind != "const"]
            row["note"] = f"made by {source.name}, which the dump did not write; linked to its input"
            source = tensors[0] if len(tensors) == 1 else None
        if source is None:
            return
        if source.kind == "kernel":
            row["producer"] = self.outputs.get((source.name, source.slot))
        elif source.kind == "param" and row["phase"] == "optimizer":
            # an optimizer updates its weights and states in place, and MindSpore dumps an
            # op's inputs after it ran: the file is the parameter as the update left it
            row["io"], row["slot"], row["param"] = "output", _UPDATED + row["slot"], source.name
            row["note"] = "the parameter after this op updated it in place (MindSpore dumps inputs after the op)"
        elif source.kind == "param":
            row["io"], row["param"] = "param", source.name
        elif source.kind == "input":
            row["arg"] = source.name

    def _tensor(self, row: dict[str, Any], item: TensorFile, data: str, folder: Path, problems: list[str]) -> None:
        from opscope.capture.onnxruntime.stats import tensor_stats

        row["dtype"] = item.dtype
        try:
            arr = load_array(folder / item.file)
        except DumpFormatError as exc:
            message = f"{folder}: {exc}"
            if message not in problems:
                problems.append(message)
            row["note"] = "unreadable tensor file"
            return
        if item.dtype == "bfloat16" and arr.dtype.kind == "u":
            from opscope.storage.safetensors_io import widen

            values = widen(arr, "bfloat16")
        else:
            values = arr
        row["shape"], row["numel"] = list(arr.shape), int(arr.size)
        row.update(zip(STAT_NAMES, tensor_stats(values)))
        row["data"], row["key"] = data, item.file

    def table(self) -> pa.Table:
        """The rows as an Arrow table with opscope's schema."""
        return pa.Table.from_pylist([{c: r.get(c) for c in _COLUMNS} for r in self.rows], schema=fmt.SCHEMA)


DEFECT = ("some tensors were written under a dtype other than their kernel's (the IR's device type), "
          "so their files hold other bytes than the tensor's (seen with MindSpore 2.10 on CPU, where "
          "kernels without a float16 version run in float32): they are not compared (their records "
          "say so in 'note')")


def _wrong_dtype(graph: KernelGraph | None, full: str, io: str, slot: int, dtype: str) -> str | None:
    """Why a file's dtype cannot be trusted (it is not the kernel's device dtype), or None."""
    types = graph.device_dtypes.get(full) if graph is not None else None
    if types is None:
        return None
    listed = types[0] if io == "input" else types[1]
    device = listed[slot] if slot < len(listed) else None
    if device is None or device == dtype or device not in _FLOAT_NAMES or dtype not in _FLOAT_NAMES:
        return None
    return (f"not compared: MindSpore wrote it as {dtype} but the kernel's {io} {slot} is {device} "
            "on the device (IR), so the file holds other bytes than the tensor")


_FLOAT_NAMES = frozenset({"float16", "float32", "float64", "bfloat16"})


def _add(problems: list[str], message: str) -> None:
    if message not in problems:
        problems.append(message)


def _statistics(row: dict[str, Any], item: StatisticRow) -> None:
    row["dtype"], row["shape"], row["numel"] = item.dtype, item.shape, numel(item.shape)
    stats = dict(item.stats)
    norm, n = stats.get("norm"), row["numel"]
    mean = stats.get("mean")
    if norm is not None and mean is not None and n:
        stats["std"] = math.sqrt(max(0.0, norm * norm / n - mean * mean))
    row.update(stats)
    row["note"] = "statistics from statistic.csv"
