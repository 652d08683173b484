"""Sequence alignment of two frameworks' op calls within one module, where one call may
stand for a run of calls on the other side: a torch op exported as several ONNX nodes
(a decomposition: GELU as Div, Erf, Add, Mul, Mul) or an ONNX Runtime fused node standing
for several torch ops (a fusion). The match predicate is the correspondence table
(:mod:`opscope.capture.onnxruntime.ops`); two ONNX dumps match on the op and node name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from opscope.capture.onnxruntime import ops as table
from opscope.compare.align import OpCall

_RUN = 24            # longest run of ONNX nodes (or torch ops) one op may stand for
_DP_LIMIT = 400_000  # cells x run length above which runs are not tried


@dataclass
class Match:
    """Calls of the target and of the reference that compute the same thing."""

    t: list[OpCall]
    r: list[OpCall]
    note: str = ""
    fold: bool = False
    slot: int | None = None  # pair only this output slot of the multi-output side (a split's k-th piece)
    rows: tuple[dict[str, Any], dict[str, Any]] | None = None  # module level: (ONNX row, torch row)


def is_float_row(row: dict[str, Any]) -> bool:
    return str(row.get("dtype") or "").replace("torch.", "").startswith(("float", "bfloat", "complex"))


def outputs_fit(a: OpCall, b: OpCall) -> bool:
    """Main outputs of the same size and kind (floating or not)."""
    oa, ob = a.outputs(), b.outputs()
    return bool(oa and ob) and oa[0].get("numel") == ob[0].get("numel") and is_float_row(oa[0]) == is_float_row(ob[0])


# -- sequence alignment with runs ----------------------------------------------------------
def align_runs(tc: list[OpCall], rc: list[OpCall], t_onnx: bool, r_onnx: bool) -> list[Match]:
    """Best-scoring monotone matching of two call sequences, where one call may stand for a
    run of calls on the other side (a decomposition or a fusion)."""
    n, m = len(tc), len(rc)
    runs = _Runs(tc, rc, t_onnx, r_onnx, _RUN if n * m * _RUN <= _DP_LIMIT else 1)
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    move: dict[tuple[int, int], tuple[int, int, float]] = {}
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            best, how = score[i + 1][j], (1, 0, 0.0)
            if score[i][j + 1] > best:
                best, how = score[i][j + 1], (0, 1, 0.0)
            for di, dj, s in runs.at(i, j):
                if score[i + di][j + dj] + s > best:
                    best, how = score[i + di][j + dj] + s, (di, dj, s)
            score[i][j] = best
            move[(i, j)] = how
    out, i, j = [], 0, 0
    while i < n and j < m:
        di, dj, s = move[(i, j)]
        if s:
            out.append(Match(tc[i:i + di], rc[j:j + dj]))
        i, j = i + di, j + dj
    return out


class _Runs:
    """Candidate matches starting at (i, j): one to one, a torch op against a run of ONNX
    nodes (decomposition), an ONNX node against a run of torch ops (fusion)."""

    def __init__(self, tc: list[OpCall], rc: list[OpCall], t_onnx: bool, r_onnx: bool, span: int) -> None:
        self.tc, self.rc, self.t_onnx, self.r_onnx, self.span = tc, rc, t_onnx, r_onnx, span

    def at(self, i: int, j: int) -> list[tuple[int, int, float]]:
        out = []
        s = _run_score([self.tc[i]], [self.rc[j]], self.t_onnx, self.r_onnx)
        if s:
            out.append((1, 1, s))
        if self.span == 1 or self.t_onnx == self.r_onnx:
            return out
        onnx, other, start, k = (self.tc, self.rc, i, j) if self.t_onnx else (self.rc, self.tc, j, i)
        for length in _decomposition_ends(onnx, start, other[k].op, self.span):
            s = _run_score(onnx[start:start + length], [other[k]], True, False) if self.t_onnx \
                else _run_score([other[k]], onnx[start:start + length], False, True)
            if s:
                out.append((length, 1, s) if self.t_onnx else (1, length, s))
        for length in _fusion_ends(other, k, onnx[start].op, self.span):
            s = _run_score([onnx[start]], other[k:k + length], True, False) if self.t_onnx \
                else _run_score(other[k:k + length], [onnx[start]], False, True)
            if s:
                out.append((1, length, s) if self.t_onnx else (length, 1, s))
        return out


def _decomposition_ends(onnx: list[OpCall], start: int, torch_op: str, span: int) -> list[int]:
    """Lengths of ONNX runs from ``start`` that may be a decomposition of ``torch_op``."""
    allowed = frozenset().union(*(table.DECOMPOSITIONS.get(k, frozenset()) for k in table.torch_keys(torch_op)))
    if not allowed or table.is_internal(onnx[start].op):
        return []
    out, count = [], 0
    for length in range(1, min(span, len(onnx) - start) + 1):
        op = onnx[start + length - 1].op
        if table.is_internal(op):
            continue
        if table.split_onnx_op(op)[1] not in allowed or "::" in op and not op.startswith("onnx::"):
            break
        count += 1
        if count >= 2:
            out.append(length)
    return out


def _fusion_ends(torch_calls: list[OpCall], start: int, onnx_op: str, span: int) -> list[int]:
    """Lengths of torch runs from ``start`` that one fused ONNX node may stand for."""
    key = onnx_op if "::" in onnx_op else f"onnx::{onnx_op}"
    if key not in table.FUSED:
        return []
    out = []
    for length in range(2, min(span, len(torch_calls) - start) + 1):
        run = [c.op for c in torch_calls[start:start + length]]
        last = run[-1]
        if not table.preserves_order(last) and table.torch_keys(last).isdisjoint(table.FUSED[key]):
            break
        if table.is_fusion(onnx_op, run):
            out.append(length)
    return out


def _run_score(ts: list[OpCall], rs: list[OpCall], t_onnx: bool, r_onnx: bool) -> float:
    """Score of matching these calls (0: they cannot match)."""
    last_t, last_r = ts[-1], rs[-1]
    if not outputs_fit(last_t, last_r):
        return 0.0
    if t_onnx and r_onnx:
        if len(ts) > 1 or len(rs) > 1 or last_t.op != last_r.op:
            return 0.0
        return 4.0 + _bonus(last_t, last_r) + (3.0 if last_t.rows[0].get("node") == last_r.rows[0].get("node") else 0.0)
    (o_run, o_last), (p_run, p_last) = ((ts, last_t), (rs, last_r)) if t_onnx else ((rs, last_r), (ts, last_t))
    if has_activation(o_last):
        return 0.0  # pairing it with the conv (or the relu, modules apart) would compare unlike tensors
    if len(o_run) == 1 and len(p_run) == 1:
        ok = table.corresponds(o_last.op, p_last.op)
    elif len(p_run) == 1:
        ok = table.is_decomposition(p_last.op, [c.op for c in o_run])
    else:
        ok = table.is_fusion(o_last.op, [c.op for c in p_run])
    if not ok:
        return 0.0
    extra = len(o_run) + len(p_run) - 2
    return 4.0 + 0.5 * extra + _bonus(o_last, p_last) + _hint(o_last, p_last)


def has_activation(onnx_call: OpCall) -> bool:
    """ORT's FusedConv/FusedGemm with an ``activation``: the output is the activation's."""
    args = onnx_call.rows[0].get("args")
    if not args or "activation" not in args:
        return False
    try:
        return bool((json.loads(args).get("attrs") or {}).get("activation"))
    except ValueError:
        return False


def _bonus(a: OpCall, b: OpCall) -> float:
    oa, ob = a.outputs(), b.outputs()
    same = [list(o.get("shape") or []) for o in oa] == [list(o.get("shape") or []) for o in ob]
    closeness = 0.0
    na, nb = oa[0].get("norm"), ob[0].get("norm")
    if na is not None and nb is not None and math.isfinite(na) and math.isfinite(nb):
        closeness = 1.0 - min(1.0, abs(na - nb) / max(abs(na), abs(nb), 1e-30))
    return (1.0 if same else 0.0) + closeness


def _hint(onnx_call: OpCall, torch_call: OpCall) -> float:
    """The dynamo exporter records the torch op each node came from (``args.torch_op``)."""
    args = onnx_call.rows[0].get("args")
    if not args or "torch_op" not in args:
        return 0.0
    try:
        hint = json.loads(args).get("torch_op")
    except ValueError:
        return 0.0
    return 2.0 if hint and not table.torch_keys(hint).isdisjoint(table.torch_keys(torch_call.op)) else 0.0
