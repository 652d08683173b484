"""One side of a cross-framework comparison: its calls, their data flow, and what its
framework's op table says about them; plus the record helpers the matcher and the pairing
share."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.compare.align import OpCall, op_calls
from opscope.compare.crossframework import torchnames
from opscope.compare.crossframework.tables import OpTable


@dataclass
class Side:
    """The target's or the reference's rows of one (rank, step), as calls with data flow."""

    name: str             # "target" or "reference"
    level: str            # "onnx", "aten", "api", "module"
    rows: list[dict[str, Any]]
    table: OpTable | None = None  # the framework's op table; None for a torch dump
    calls: list[OpCall] = field(default_factory=list)
    by_id: dict[int, dict[str, Any]] = field(default_factory=dict)
    call_of: dict[int, OpCall] = field(default_factory=dict)     # row id -> its call
    consumers: dict[int, list[OpCall]] = field(default_factory=lambda: defaultdict(list))
    first_reads: dict[str, dict[str, Any]] | None = None  # graph input name -> its first read

    @classmethod
    def build(cls, name: str, level: str, rows: list[dict[str, Any]], table: OpTable | None) -> Side:
        side = cls(name, level, rows, table)
        groups = op_calls(rows, name)
        side.calls = sorted((c for calls in groups.values() for c in calls), key=lambda c: c.seq)
        side.by_id = {r["id"]: r for r in rows}
        for call in side.calls:
            for row in call.rows:
                side.call_of[row["id"]] = call
        for call in side.calls:
            for row in call.inputs():
                producer = side.row(row.get("producer"))
                while producer is not None and producer.get("io") != "output":
                    producer = side.row(producer.get("producer"))  # a re-read of a model input
                if producer is not None and side.call_of.get(producer["id"]) is not call:
                    side.consumers[producer["id"]].append(call)
        return side

    @property
    def foreign(self) -> bool:
        """A dump of another framework than torch (its ops are looked up in :attr:`table`)."""
        return self.table is not None

    def preserves_order(self, op: str) -> bool:
        """The op keeps every element in place (a view, a reshape, a cast)."""
        return self.table.preserves_order(op) if self.table is not None else torchnames.preserves_order(op)

    def is_internal(self, op: str) -> bool:
        return self.table is not None and self.table.is_internal(op)

    def row(self, row_id: int | None) -> dict[str, Any] | None:
        """The record with this id; None for no id (a row without producer) or an unknown one."""
        return self.by_id.get(row_id) if row_id is not None else None

    def root(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The record an input reads: its producer's output, or the first read of a model input."""
        seen = 0
        while row.get("producer") is not None and seen < 64:
            producer = self.by_id.get(row["producer"])
            if producer is None:
                return None
            if producer.get("io") == "output":
                return producer
            row, seen = producer, seen + 1
        if row.get("io") == "input" and self.foreign and row.get("arg"):
            return self._graph_input_first_reads().get(row["arg"], row)
        return row

    def _graph_input_first_reads(self) -> dict[str, dict[str, Any]]:
        if self.first_reads is None:
            self.first_reads = {}
            for row in sorted(self.rows, key=lambda r: (r["seq"], r.get("slot") or 0)):
                if row.get("io") == "input" and row.get("producer") is None and row.get("arg"):
                    self.first_reads.setdefault(row["arg"], row)
        return self.first_reads

    def leaf_reads(self) -> list[dict[str, Any]]:
        """The first read of every model input (inputs that no record produced), in order."""
        out, seen = [], set()
        for row in sorted(self.rows, key=lambda r: (r["seq"], r.get("slot") or 0)):
            if row.get("io") != "input" or row.get("producer") is not None or row.get("param"):
                continue
            key = row.get("arg") if self.foreign else row["id"]
            if key not in seen:
                seen.add(key)
                out.append(row)
        return out

    def producer_call(self, call: OpCall) -> OpCall | None:
        """The call that produced a call's first input."""
        for row in call.inputs():
            if row.get("io") == "input":
                root = self.root(row)
                return self.call_of.get(root["id"]) if root is not None and root.get("io") == "output" else None
        return None

    def readers(self) -> dict[int, set[str]]:
        """Output row id -> modules of the calls that read it."""
        out: dict[int, set[str]] = defaultdict(set)
        for producer_id, calls in self.consumers.items():
            out[producer_id] |= {c.module for c in calls}
        return out


# -- record helpers -----------------------------------------------------------------------
def is_forward(call: OpCall) -> bool:
    return call.phase in ("forward", "")


def within(module: str, scope: str) -> bool:
    return scope == "" or module == scope or module.startswith(scope + ".")


def name_suffix(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def is_float_row(row: dict[str, Any]) -> bool:
    return str(row.get("dtype") or "").replace("torch.", "").startswith(("float", "bfloat", "complex"))


def outputs_fit(a: OpCall, b: OpCall) -> bool:
    """Main outputs of the same size and kind (floating or not)."""
    oa, ob = a.outputs(), b.outputs()
    return bool(oa and ob) and oa[0].get("numel") == ob[0].get("numel") and is_float_row(oa[0]) == is_float_row(ob[0])


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Relative difference of two records' norms and means (inf for other sizes)."""
    if a.get("numel") != b.get("numel"):
        return math.inf
    worst = 0.0
    for key in ("norm", "mean"):
        x, y = a.get(key), b.get(key)
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-30) if key == "norm" else
                    abs(x - y) / max(abs(a.get("norm") or 0.0), 1e-30))
    return worst


def same_content(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal hashes, or equal statistics (the hash is computed by each capture's own code)."""
    if a.get("numel") != b.get("numel"):
        return False
    if a.get("hash") is not None and a.get("hash") == b.get("hash"):
        return True
    for key in ("norm", "min", "max", "mean"):
        x, y = a.get(key), b.get(key)
        if x is None or y is None or not (x == y or abs(x - y) <= 1e-6 * max(abs(x), abs(y))):
            return False
    return True
