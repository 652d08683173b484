"""Row and call helpers of the cross-framework alignment (see crossframework.py)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from opscope.capture.onnxruntime import ops as table
from opscope.compare.align import OpCall
from opscope.compare.crossmatch import Match, is_float_row

_BATCH_NORM = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")

if TYPE_CHECKING:
    from opscope.compare.crossframework import _Side

def _forward(call: OpCall) -> bool:
    return call.phase in ("forward", "")


def _within(module: str, scope: str) -> bool:
    return scope == "" or module == scope or module.startswith(scope + ".")


def _suffix(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _root(side: _Side, row: dict[str, Any]) -> dict[str, Any] | None:
    """The record an input reads: its producer's output, or the first read of a model input."""
    seen = 0
    while row.get("producer") is not None and seen < 64:
        producer = side.by_id.get(row["producer"])
        if producer is None:
            return None
        if producer.get("io") == "output":
            return producer
        row, seen = producer, seen + 1
    if row.get("io") == "input" and side.onnx and row.get("arg"):
        return _graph_input_first_read(side).get(row["arg"], row)
    return row


def _graph_input_first_read(side: _Side) -> dict[str, dict[str, Any]]:
    if side.first_reads is None:
        side.first_reads = {}
        for row in sorted(side.rows, key=lambda r: (r["seq"], r.get("slot") or 0)):
            if row.get("io") == "input" and row.get("producer") is None and row.get("arg"):
                side.first_reads.setdefault(row["arg"], row)
    return side.first_reads


def _distance(a: dict[str, Any], b: dict[str, Any]) -> float:
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


def _same_content(a: dict[str, Any], b: dict[str, Any]) -> bool:
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


def _leaf_reads(side: _Side) -> list[dict[str, Any]]:
    """The first read of every model input (inputs that no record produced), in order."""
    out, seen = [], set()
    for row in sorted(side.rows, key=lambda r: (r["seq"], r.get("slot") or 0)):
        if row.get("io") != "input" or row.get("producer") is not None or row.get("param"):
            continue
        key = row.get("arg") if side.onnx else row["id"]
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def _producer_call(side: _Side, call: OpCall) -> OpCall | None:
    """The call that produced a call's first input."""
    for row in call.inputs():
        if row.get("io") == "input":
            root = _root(side, row)
            return side.call_of.get(root["id"]) if root is not None and root.get("io") == "output" else None
    return None


def _escaping_outputs(onnx: _Side) -> dict[int, set[str]]:
    """ONNX output row id -> modules of the nodes that read it."""
    readers: dict[int, set[str]] = defaultdict(set)
    for producer_id, calls in onnx.consumers.items():
        readers[producer_id] |= {c.module for c in calls}
    return readers


def _last_escaping(inside: list[OpCall], scope: str, out: dict[str, Any],
                   readers: dict[int, set[str]]) -> tuple[OpCall, dict[str, Any]] | None:
    for call in sorted(inside, key=lambda c: -c.seq):
        for row in call.outputs():
            if row.get("numel") != out.get("numel") or is_float_row(row) != is_float_row(out):
                continue
            modules = readers.get(row["id"], set())
            if not modules or any(not _within(m, scope) for m in modules):
                return call, row
    return None


_MOVEMENT = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split", "Gather",
                       "Expand", "Identity", "Cast", "Concat", "Tile", "Pad", "Dropout"})


def _moves_data(op: str) -> bool:
    """ONNX nodes that only move or copy elements (see :func:`_Aligner._founded`)."""
    return "::" in op and not op.startswith("aten::") and table.split_onnx_op(op)[1] in _MOVEMENT


def _mark_fold(match: Match, t_onnx: bool) -> None:
    """A Conv (or Gemm) paired with a batch norm computes both: its weights are not the
    convolution's (whatever name the exporter left on them), so its parameters never pair."""
    onnx, torch = (match.t, match.r) if t_onnx else (match.r, match.t)
    if match.fold or any(c.op.startswith("onnx::") for c in torch):
        return
    conv = next((c for c in onnx if table.split_onnx_op(c.op)[1] in ("Conv", "ConvTranspose", "Gemm")), None)
    norm = next((c for c in torch if c.op in _BATCH_NORM or not table.torch_keys(c.op).isdisjoint(table.FOLDED)), None)
    if conv is not None and norm is not None:
        match.fold = True
        match.note = match.note or f"{norm.op} ({norm.module}) folded into {conv.op} ({conv.module})"


def _run_note(match: Match) -> str:
    if len(match.t) == 1 and len(match.r) == 1:
        return ""
    many, one = (match.t, match.r[0]) if len(match.t) > 1 else (match.r, match.t[0])
    names = ", ".join(c.op.split("::")[-1].split(".")[-1 if "::" in c.op else 1] for c in many
                      if not table.is_internal(c.op))
    return f"{one.op} against {len(many)} ops ({names}): the last one's output; the others have no counterpart"
