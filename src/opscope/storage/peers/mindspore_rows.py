"""Records of one (rank, iteration) of a MindSpore Data Dump: ops in execution order, their
tensors, and where each input came from (see :mod:`opscope.storage.peers.mindspore`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.model.records import SCHEMA_FIELDS, STAT_NAMES
from opscope.model.tensor_stats import tensor_stats
from opscope.storage import format as fmt
from opscope.storage.peers.mindspore_files import (
    HOST_FORMATS,
    StatisticRow,
    TensorFile,
    load_array,
    numel,
)
from opscope.storage.peers.mindspore_ir import KernelGraph, Source
from opscope.storage.peers.mindspore_match import match_files
from opscope.storage.peers.mindspore_places import (
    OP_PREFIX,
    forward_op_of,
    module_of,
    phase_of,
    places,
)

_MAX_UNDUMPED = 8  # undumped ops read through between a kernel and the one it reads
_GRAPH_SEQ = 1_000_000  # seq offset of each further graph of one iteration
_STEP_START_IDS = 1 << 40  # ids of the rows added for an in-place update's input (never a file's)
_UNDUMPED_INPUT_IDS = 1 << 41  # ids of the rows added for an input the dump did not write
_UPDATED = 100  # slot offset of an optimizer's in-place updated parameter, recorded as an output
_COLUMNS = [name for name, _ in SCHEMA_FIELDS]


class RowBuilder:
    """Rows of one (rank, iteration), graph by graph."""

    def __init__(self, rank: int, step: int, digests: bool = False) -> None:
        self.rank, self.step, self.digests = rank, step, digests
        self.rows: list[dict[str, Any]] = []
        self.outputs: dict[tuple[str, int], int] = {}  # (full name, slot) -> record id
        self.calls: dict[tuple[str, str, str], int] = defaultdict(int)
        self.places: dict[str, tuple[str, str]] = {}  # ops the scope alone would misplace

    def add_graph(self, data: str, folder: Path, order: tuple[str, ...], graph: KernelGraph | None,
                  files: dict[str, list[TensorFile]], statistics: dict[str, list[StatisticRow]],
                  problems: list[str]) -> list[str]:
        """Add the ops of one graph's iteration folder; returns the files no op claimed."""
        offset = int(data) * _GRAPH_SEQ
        first: dict[str, int] = {}
        for name, stamps in [*((k, [f.timestamp for f in v]) for k, v in files.items()),
                             *((k, [r.timestamp for r in v]) for k, v in statistics.items())]:
            first[name] = min([first.get(name, 1 << 62), *stamps])
        matched, renumbered = match_files(order, first)
        self.places = places(order, graph)
        for index, full in enumerate(order):
            mangled = matched.get(full)
            tensors = files.get(mangled, []) if mangled else []
            stats = statistics.get(mangled, []) if mangled else []
            if tensors or stats:
                self._add_call(offset + index, full, data, folder, tensors, stats, graph, problems)
        if renumbered:
            _add(problems, f"{folder}: MindSpore numbered {len(renumbered)} ops differently in file names than "
                           f"in the execution order (e.g. {sorted(renumbered)[0]}), so a file name cannot say "
                           "which of them it is: they are not compared")
        claimed = set(matched.values())
        return [f.file for key, group in files.items() if key not in claimed for f in group
                if f.op_type != "Parameter"]

    def _add_call(self, seq: int, full: str, data: str, folder: Path, tensors: list[TensorFile],
                  stats: list[StatisticRow], graph: KernelGraph | None, problems: list[str]) -> None:
        op_type = (tensors[0].op_type if tensors else stats[0].op_type) or full.rsplit("/", 1)[-1].split("-op")[0]
        phase, module = self.places.get(full) or (phase_of(full), module_of(full))
        op = OP_PREFIX + op_type
        call = self.calls[(phase, module, op)]
        self.calls[(phase, module, op)] += 1
        sources = graph.inputs.get(full, []) if graph is not None else []
        by_slot: dict[tuple[str, int], TensorFile | StatisticRow] = {(s.io, s.slot): s for s in stats}
        by_slot.update({(t.io, t.slot): t for t in tensors})
        for (io, slot), item in sorted(by_slot.items(), key=lambda kv: (kv[0][0] != "input", kv[0][1])):
            row: dict[str, Any] = {
                "id": len(self.rows), "rank": self.rank, "step": self.step, "seq": seq, "phase": phase,
                "module": module, "op": op, "call": call, "io": io, "slot": slot, "device": None,
                "node": full, "fwd_op": forward_op_of(full) if phase == "backward" else None,
                "source": graph.sources.get(full) if graph is not None else None}
            if io == "input":
                self._link(row, sources[slot] if slot < len(sources) else None, graph)
            if isinstance(item, TensorFile):
                self._tensor(row, item, data, folder, problems, partial(_untrusted, graph, full, io, slot, item.dtype))
            else:
                _statistics(row, item, self.digests)
            if io == "output":
                self.outputs[(full, slot)] = row["id"]
            self.rows.append(row)
            if row["io"] == "output" and row["slot"] >= _UPDATED:
                self._add_step_start(row)
        self._undumped_inputs(full, seq, sources, by_slot)
        if phase == "optimizer":
            self._drop_in_place_outputs(full, seq)

    def _undumped_inputs(self, full: str, seq: int, sources: list[Source],
                         by_slot: dict[tuple[str, int], TensorFile | StatisticRow]) -> None:
        """Inputs the dump did not write (``"input_output": 2``, outputs only) but whose producer
        it did: the same tensor, so a record carrying the producer's statistics and data. Without
        them every op would be judged with no inputs, and each one after a divergence blamed."""
        head = next((r for r in reversed(self.rows) if r["seq"] == seq), None)
        if head is None:
            return
        for slot, source in enumerate(sources):
            producer = self.outputs.get((source.name, source.slot)) if source.kind == "kernel" else None
            if ("input", slot) in by_slot or producer is None:
                continue
            made = next(r for r in reversed(self.rows) if r["id"] == producer)
            row = {**{k: head[k] for k in ("rank", "step", "seq", "phase", "module", "op", "call", "node",
                                            "fwd_op", "source")},
                   **{k: made.get(k) for k in ("dtype", "shape", "numel", "data", "key", *STAT_NAMES)},
                   "id": len(self.rows) + _UNDUMPED_INPUT_IDS, "io": "input", "slot": slot, "producer": producer,
                   "note": "not in the dump: the output of its producer"}
            self.rows.append(row)

    def _add_step_start(self, updated: dict[str, Any]) -> None:
        """The input an in-place update read: the parameter as the step began, which is what its
        first reader in the forward pass saw (the dump has it only after the update). Without
        it, a parameter that differed from the start would look made different by the update."""
        first = next((r for r in self.rows if r.get("param") == updated["param"] and r["io"] == "param"
                      and r["phase"] == "forward"), None)
        if first is None:
            return
        start = {**first, "id": len(self.rows) + _STEP_START_IDS, "seq": updated["seq"], "phase": updated["phase"],
                 "module": updated["module"], "op": updated["op"], "call": updated["call"], "io": "param",
                 "slot": updated["slot"] - _UPDATED, "node": updated["node"], "fwd_op": None, "producer": None,
                 "note": "the parameter as the step began (what the forward read): MindSpore dumps an "
                         "in-place input after the update"}
        self.rows.append(start)

    def _drop_in_place_outputs(self, full: str, seq: int) -> None:
        """An optimizer op that updates parameters in place (SGD, Adam): its own outputs are
        placeholders MindSpore need not write (Adam's on CPU hold whatever the memory held and
        differ between two identical runs; SGD's repeat the parameter), so they are left out;
        the updated parameters are its outputs here."""
        call = [r for r in self.rows if r["seq"] == seq]
        if not any(r["io"] == "output" and r["slot"] >= _UPDATED for r in call):
            return
        dropped = {r["id"] for r in call if r["io"] == "output" and r["slot"] < _UPDATED}
        self.rows = [r for r in self.rows if r["id"] not in dropped]
        for key in [k for k, v in self.outputs.items() if k[0] == full and v in dropped]:
            del self.outputs[key]

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

    def _tensor(self, row: dict[str, Any], item: TensorFile, data: str, folder: Path, problems: list[str],
                check: Callable[[list[int]], str | None]) -> None:
        """Shape, statistics and where the tensor is; ``check(shape)`` says why the file is not
        the tensor (then only its shape is kept, and a note says why)."""
        row["dtype"] = item.dtype
        try:
            arr = load_array(folder / item.file)
        except DumpFormatError as exc:
            _add(problems, f"{folder}: {exc}")
            row["note"] = "unreadable tensor file"
            return
        row["shape"], row["numel"] = list(arr.shape), int(arr.size)
        wrong = check(row["shape"]) if item.layout in HOST_FORMATS else (
            f"not compared: stored in the device format {item.layout}, not in the tensor's own order; "
            "dump with \"trans_flag\": true in e2e_dump_settings")
        if wrong:
            row["note"] = wrong
            _add(problems, _why_not_compared(wrong))
            return
        if item.dtype == "bfloat16" and arr.dtype.kind == "u":
            from opscope.storage.safetensors_io import widen

            values = widen(arr, "bfloat16")
        else:
            values = arr
        row.update(zip(STAT_NAMES, tensor_stats(values)))
        row["data"], row["key"] = data, item.file

    def table(self) -> pa.Table:
        """The rows as an Arrow table with opscope's schema."""
        return pa.Table.from_pylist([{c: r.get(c) for c in _COLUMNS} for r in self.rows], schema=fmt.SCHEMA)


DEFECT = ("some tensors were written under a dtype other than their kernel's (the IR's device type), "
          "so their files hold other bytes than the tensor's (seen with MindSpore 2.10 on CPU, where "
          "kernels without a float16 version run in float32): they are not compared (their records "
          "say so in 'note')")
OTHER_OP = ("some files do not have the shape the IR gives their op: they are another op's (MindSpore "
            "named them after this one), not compared (their records say so in 'note')")
DEVICE_FORMAT = ("some tensors are stored in an Ascend device format (NC1HWC0, FRACTAL_NZ...), not in "
                 "their own order: not compared; dump with \"trans_flag\": true in e2e_dump_settings")


def _why_not_compared(note: str) -> str:
    """The dump-wide problem a record's 'not compared' note belongs to."""
    if "device format" in note:
        return DEVICE_FORMAT
    return OTHER_OP if "shape" in note else DEFECT


def _untrusted(graph: KernelGraph | None, full: str, io: str, slot: int, dtype: str, shape: list[int]) -> str | None:
    """Why a file is not the tensor the IR says the op has there (another dtype on the
    device, another shape), or None."""
    if graph is None:
        return None
    at = 0 if io == "input" else 1
    dtypes, shapes = graph.device_dtypes.get(full, ([], [])), graph.shapes.get(full, ([], []))
    device = dtypes[at][slot] if slot < len(dtypes[at]) else None
    if device is not None and device != dtype and device in _FLOAT_NAMES and dtype in _FLOAT_NAMES:
        return (f"not compared: MindSpore wrote it as {dtype} but the kernel's {io} {slot} is {device} "
                "on the device (IR), so the file holds other bytes than the tensor")
    inferred = shapes[at][slot] if slot < len(shapes[at]) else None
    if inferred is not None and inferred != shape and -1 not in inferred and -2 not in inferred:
        return (f"not compared: the file's shape {shape} is not the {inferred} the IR gives {io} {slot} "
                "of this op: the file belongs to another op")
    return None


_FLOAT_NAMES = frozenset({"float16", "float32", "float64", "bfloat16"})


def _add(problems: list[str], message: str) -> None:
    if message not in problems:
        problems.append(message)


def _statistics(row: dict[str, Any], item: StatisticRow, digests: bool) -> None:
    row["dtype"], row["shape"], row["numel"] = item.dtype, item.shape, numel(item.shape)
    stats = dict(item.stats)
    if not digests:
        stats.pop("hash", None)
    norm, n = stats.get("norm"), row["numel"]
    mean = stats.get("mean")
    if norm is not None and mean is not None and n:
        stats["std"] = math.sqrt(max(0.0, norm * norm / n - mean * mean))
    row.update(stats)
    row["note"] = "statistics from statistic.csv"
