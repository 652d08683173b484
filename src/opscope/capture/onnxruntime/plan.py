"""The rows one step of an ONNX graph produces, planned once from the graph alone.

Every step of a capture writes the same rows (only statistics and data differ), so the
layout — which node, which slot, which row produced which input — is planned here, and
row ids of step ``s`` are ``s * len(plan) + local``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from opscope.capture.onnxruntime.graph import GraphNode, attrs_json
from opscope.capture.onnxruntime.scopes import NodeScope
from opscope.config import Filter

_DEFAULT_DOMAINS = ("", "ai.onnx")


def onnx_op_name(domain: str, op_type: str) -> str:
    """The ``op`` column of an ONNX Runtime record: ``onnx::Gemm``, ``com.microsoft::FusedMatMul``
    (compare reads it back with :func:`opscope.compare.crossframework.tables.onnx.split_onnx_op`)."""
    return f"onnx::{op_type}" if domain in _DEFAULT_DOMAINS else f"{domain}::{op_type}"


# Initializer names the exporters invent for values that are no parameter of the model.
_DERIVED = re.compile(r"(^onnx::)|(^_?val_\d+$)|(^const_)|(/)|(^[A-Z]\w*_\d+$)|(__\d+$)")


@dataclass
class PlannedRow:
    local: int
    seq: int
    module: str
    op: str
    call: int
    io: str
    slot: int
    value: str
    node: str
    args: str
    source: str | None
    param: str | None = None
    producer: int | None = None  # local id of the output row that produced the value
    owner: int = -1              # local id of the row whose key holds the value's tensor
    note: str | None = None


@dataclass
class Plan:
    rows: list[PlannedRow]
    fetch: list[str]            # node outputs to ask ONNX Runtime for
    feeds: list[str]            # graph inputs referenced by rows
    params: list[str]           # initializers referenced by rows

    def __len__(self) -> int:
        return len(self.rows)


def is_parameter_name(name: str) -> bool:
    """True when an initializer's name looks like a PyTorch parameter (``layers.0.fc1.weight``)."""
    return bool(name) and not _DERIVED.search(name)


def plan_rows(nodes: list[GraphNode], scopes: list[NodeScope], initializers: set[str],
              feeds: set[str], *, mode: str = "all", ops: Filter | None = None,
              scope: Filter | None = None, param_names: set[str] | None = None) -> Plan:
    """Plan the rows of one step.

    Args:
        nodes: the graph's nodes in execution order.
        scopes: module scope of each node (:func:`~.scopes.resolve_modules`).
        initializers: names of the graph's initializers (``param`` rows).
        feeds: names of the graph inputs that are fed.
        mode: ``input``, ``output`` or ``all`` rows.
        ops: glob filter on the op (``onnx::Gemm``), the op type (``Gemm``) or the node name.
        scope: glob filter on the module path.
        param_names: names that are PyTorch parameters (``param`` column); by default
            every initializer whose name looks like one (:func:`is_parameter_name`).
    """
    ops, scope = ops or Filter(), scope or Filter()
    if param_names is None:
        param_names = {n for n in initializers if is_parameter_name(n)}
    producer_node = {out: i for i, n in enumerate(nodes) for out in n.outputs if out}
    const_alias = _identity_of_initializer(nodes, initializers)
    calls: Counter[tuple[str, str]] = Counter()
    rows: list[PlannedRow] = []
    output_row: dict[str, int] = {}
    owner: dict[str, int] = {}
    for node, node_scope in zip(nodes, scopes):
        op = onnx_op_name(node.domain, node.op_type)
        call = calls[(node_scope.module, op)]
        calls[(node_scope.module, op)] += 1
        if not _selected(node, op, node_scope.module, ops, scope):
            continue
        common: dict[str, Any] = dict(seq=node.index, module=node_scope.module, op=op, call=call, node=node.name,
                      args=attrs_json(node, node_scope.torch_op), source=node_scope.source)
        inferred = "module inferred from graph neighbours" if node_scope.how == "inferred" else None
        if mode in ("input", "all"):
            for slot, name in enumerate(node.inputs):
                if not name:
                    continue
                row = PlannedRow(len(rows), io="input", slot=slot, value=name, **common)
                _classify_input(row, name, initializers, const_alias, feeds, producer_node, output_row,
                                param_names)
                row.note = _join_notes(row.note, inferred)
                row.owner = owner.setdefault(name, row.local)
                rows.append(row)
        if mode in ("output", "all"):
            for slot, name in enumerate(node.outputs):
                if not name:
                    continue
                row = PlannedRow(len(rows), io="output", slot=slot, value=name, note=inferred, **common)
                output_row[name] = row.local
                row.owner = owner.setdefault(name, row.local)
                rows.append(row)
    values = {r.value for r in rows}
    return Plan(rows,
                fetch=[v for v in _ordered(rows) if v in producer_node and v in values],
                feeds=sorted(v for v in values if v in feeds and v not in producer_node),
                params=sorted(v for v in values if v in initializers and v not in producer_node))


def _selected(node: GraphNode, op: str, module: str, ops: Filter, scope: Filter) -> bool:
    if ops and not (ops.matches(op) or ops.matches(node.op_type) or ops.matches(node.name)):
        return False
    return not scope or scope.matches(module)


def _classify_input(row: PlannedRow, name: str, initializers: set[str], const_alias: dict[str, str],
                    feeds: set[str], producer_node: dict[str, int], output_row: dict[str, int],
                    param_names: set[str]) -> None:
    if name in initializers and name not in producer_node:
        row.io = "param"
        _name_param(row, name, param_names)
        return
    if name in const_alias:
        row.io = "param"
        _name_param(row, name, param_names | {name} if const_alias[name] in param_names else param_names)
        row.note = _join_notes(row.note, f"shared weight: Identity of initializer {const_alias[name]!r}")
    row.producer = output_row.get(name)
    if row.producer is None and name in producer_node:
        row.note = _join_notes(row.note, "producer not captured (filtered out)")
    elif name not in producer_node and name not in feeds and name not in initializers:
        row.note = _join_notes(row.note, "value from outside the graph")


def _name_param(row: PlannedRow, name: str, param_names: set[str]) -> None:
    if name in param_names:
        row.param = name
    else:
        row.note = _join_notes(row.note, f"derived initializer {name!r}: the exporter transformed "
                                         "a parameter (folded BatchNorm, transposed weight) or made a constant")


def _identity_of_initializer(nodes: list[GraphNode], initializers: set[str]) -> dict[str, str]:
    """Values that are an Identity chain of an initializer (exporters share equal weights so)."""
    alias: dict[str, str] = {}
    for node in nodes:
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx") and node.inputs and node.outputs:
            src = node.inputs[0]
            root = alias.get(src, src if src in initializers else None)
            if root is not None:
                alias[node.outputs[0]] = root
    return alias


def _ordered(rows: list[PlannedRow]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r.value, None)
    return list(seen)


def _join_notes(*notes: Any) -> str | None:
    text = "; ".join(n for n in notes if n)
    return text or None
