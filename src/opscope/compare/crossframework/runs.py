"""Sequence alignment of two frameworks' op calls within one module, where one call may
stand for a run of calls on the other side: a torch op exported as several nodes (a
decomposition: GELU as Div, Erf, Add, Mul, Mul) or a runtime's fused node standing for
several torch ops (a fusion). The match predicate is the foreign side's
:class:`~opscope.compare.crossframework.tables.OpTable`; two dumps of one foreign framework
match on the op and node name.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from opscope.compare.align import OpCall
from opscope.compare.crossframework import torchnames
from opscope.compare.crossframework.sides import outputs_fit
from opscope.compare.crossframework.tables import OpTable

_RUN = 24            # longest run of foreign nodes (or torch ops) one op may stand for
_DP_LIMIT = 400_000  # cells x run length above which runs are not tried


@dataclass
class Match:
    """Calls of the target and of the reference that compute the same thing."""

    t: list[OpCall]
    r: list[OpCall]
    note: str = ""
    fold: bool = False
    slot: int | None = None  # pair only this output slot of the multi-output side (a split's k-th piece)
    rows: tuple[dict[str, Any], dict[str, Any]] | None = None  # module level: (foreign row, torch row)


def align_runs(tc: list[OpCall], rc: list[OpCall], t_table: OpTable | None, r_table: OpTable | None) -> list[Match]:
    """Best-scoring monotone matching of two call sequences, where one call may stand for a
    run of calls on the other side (a decomposition or a fusion)."""
    n, m = len(tc), len(rc)
    runs = _Runs(tc, rc, t_table, r_table, _RUN if n * m * _RUN <= _DP_LIMIT else 1)
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
    """Candidate matches starting at (i, j): one to one, a torch op against a run of foreign
    nodes (decomposition), a foreign node against a run of torch ops (fusion)."""

    def __init__(self, tc: list[OpCall], rc: list[OpCall], t_table: OpTable | None, r_table: OpTable | None,
                 span: int) -> None:
        self.tc, self.rc, self.t_table, self.r_table, self.span = tc, rc, t_table, r_table, span
        self.table = t_table or r_table

    def score(self, ts: list[OpCall], rs: list[OpCall]) -> float:
        return run_score(ts, rs, self.t_table, self.r_table)

    def at(self, i: int, j: int) -> list[tuple[int, int, float]]:
        out = []
        s = self.score([self.tc[i]], [self.rc[j]])
        if s:
            out.append((1, 1, s))
        if self.span == 1 or (self.t_table is None) == (self.r_table is None) or self.table is None:
            return out
        t_foreign = self.t_table is not None
        foreign, other, start, k = (self.tc, self.rc, i, j) if t_foreign else (self.rc, self.tc, j, i)
        for length in _decomposition_ends(self.table, foreign, start, other[k].op, self.span):
            run = foreign[start:start + length]
            s = self.score(run, [other[k]]) if t_foreign else self.score([other[k]], run)
            if s:
                out.append((length, 1, s) if t_foreign else (1, length, s))
        for length in _fusion_ends(self.table, other, k, foreign[start].op, self.span):
            run = other[k:k + length]
            s = self.score([foreign[start]], run) if t_foreign else self.score(run, [foreign[start]])
            if s:
                out.append((1, length, s) if t_foreign else (length, 1, s))
        return out


def _decomposition_ends(table: OpTable, foreign: list[OpCall], start: int, torch_op: str, span: int) -> list[int]:
    """Lengths of foreign runs from ``start`` that may be a decomposition of ``torch_op``."""
    allowed = table.decomposition_parts(torch_op)
    if not allowed or table.is_internal(foreign[start].op):
        return []
    out, count = [], 0
    for length in range(1, min(span, len(foreign) - start) + 1):
        op = foreign[start + length - 1].op
        if table.is_internal(op):
            continue
        if table.key(op) not in allowed:
            break
        count += 1
        if count >= 2:
            out.append(length)
    return out


def _fusion_ends(table: OpTable, torch_calls: list[OpCall], start: int, fused_op: str, span: int) -> list[int]:
    """Lengths of torch runs from ``start`` that one fused node may stand for."""
    covered = table.fused_group(fused_op)
    if not covered:
        return []
    out = []
    for length in range(2, min(span, len(torch_calls) - start) + 1):
        run = [c.op for c in torch_calls[start:start + length]]
        last = run[-1]
        if not torchnames.preserves_order(last) and torchnames.torch_keys(last).isdisjoint(covered):
            break
        if table.is_fusion(fused_op, run):
            out.append(length)
    return out


def run_score(ts: list[OpCall], rs: list[OpCall], t_table: OpTable | None, r_table: OpTable | None) -> float:
    """Score of matching these calls (0: they cannot match)."""
    last_t, last_r = ts[-1], rs[-1]
    if not outputs_fit(last_t, last_r):
        return 0.0
    if t_table is not None and r_table is not None:
        if len(ts) > 1 or len(rs) > 1 or last_t.op != last_r.op:
            return 0.0
        return 4.0 + _bonus(last_t, last_r) + (3.0 if last_t.rows[0].get("node") == last_r.rows[0].get("node") else 0.0)
    table = t_table or r_table
    if table is None:
        return 0.0
    (o_run, o_last), (p_run, p_last) = ((ts, last_t), (rs, last_r)) if t_table else ((rs, last_r), (ts, last_t))
    if has_activation(o_last, table):
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


def _args(call: OpCall) -> dict[str, Any]:
    args = call.rows[0].get("args")
    if not args:
        return {}
    try:
        parsed = json.loads(args)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def has_activation(call: OpCall, table: OpTable) -> bool:
    """A fused node with an activation (ORT's FusedConv/FusedGemm): its output is the activation's."""
    if not table.activation_attrs or not any(a in (call.rows[0].get("args") or "") for a in table.activation_attrs):
        return False
    attrs = _args(call).get("attrs") or {}
    return any(bool(attrs.get(a)) for a in table.activation_attrs)


def _bonus(a: OpCall, b: OpCall) -> float:
    oa, ob = a.outputs(), b.outputs()
    same = [list(o.get("shape") or []) for o in oa] == [list(o.get("shape") or []) for o in ob]
    closeness = 0.0
    na, nb = oa[0].get("norm"), ob[0].get("norm")
    if na is not None and nb is not None and math.isfinite(na) and math.isfinite(nb):
        closeness = 1.0 - min(1.0, abs(na - nb) / max(abs(na), abs(nb), 1e-30))
    return (1.0 if same else 0.0) + closeness


def _hint(foreign_call: OpCall, torch_call: OpCall) -> float:
    """An exporter may record the torch op each node came from (``args.torch_op``: the dynamo exporter)."""
    if "torch_op" not in (foreign_call.rows[0].get("args") or ""):
        return 0.0
    hint = _args(foreign_call).get("torch_op")
    return 2.0 if hint and not torchnames.torch_keys(hint).isdisjoint(torchnames.torch_keys(torch_call.op)) else 0.0
