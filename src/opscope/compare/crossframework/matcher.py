"""Which calls of the two sides compute the same thing: :class:`CallMatcher` fills
:class:`Claims` with :class:`~opscope.compare.crossframework.runs.Match` es, by node name
(two dumps of one foreign framework), by module (module level), by folds and by sequence
alignment with runs (op levels)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.compare.align import OpCall
from opscope.compare.crossframework import torchnames
from opscope.compare.crossframework.runs import Match, align_runs, has_activation
from opscope.compare.crossframework.sides import (
    Side,
    distance,
    is_float_row,
    is_forward,
    outputs_fit,
    within,
)
from opscope.compare.crossframework.tables import OpTable


@dataclass
class Claims:
    """The matches so far, the calls they hold, and why a call stays unpaired."""

    matches: list[Match] = field(default_factory=list)
    claimed: set[tuple[str, int]] = field(default_factory=set)   # (side, seq) of calls in a match
    notes: dict[tuple[str, int], str] = field(default_factory=dict)  # (side, seq) -> why it stays unpaired

    def claim(self, match: Match) -> None:
        self.matches.append(match)
        for name, calls in (("target", match.t), ("reference", match.r)):
            self.claimed.update((name, c.seq) for c in calls)

    def unclaim(self, match: Match) -> None:
        self.matches.remove(match)
        for name, calls in (("target", match.t), ("reference", match.r)):
            for call in calls:
                self.claimed.discard((name, call.seq))

    def holds(self, side: Side, call: OpCall) -> bool:
        return (side.name, call.seq) in self.claimed


class CallMatcher:
    """Matches the calls of a target and a reference side of which at least one is foreign."""

    def __init__(self, t: Side, r: Side, claims: Claims) -> None:
        self.t, self.r, self.claims = t, r, claims
        self.fold_notes: dict[int, str] = {}  # torch module output id -> how its BatchNorm was folded

    def run(self) -> None:
        if self.t.foreign and self.r.foreign:
            self.by_node_name()
        if "module" in (self.t.level, self.r.level):
            self.modules()
        else:
            self.folds()
            self.ops()
        for match in self.claims.matches:
            mark_fold(match, self.t, self.r)

    def _foreign_and_torch(self) -> tuple[Side, Side, OpTable] | None:
        """The side with an op table, the torch side and that table (None: no foreign side)."""
        if self.t.foreign == self.r.foreign:
            return None
        foreign, torch = (self.t, self.r) if self.t.foreign else (self.r, self.t)
        assert foreign.table is not None
        return foreign, torch, foreign.table

    def by_node_name(self) -> None:
        r_by_node = {(c.rows[0].get("node"), c.op): c for c in self.r.calls if c.rows[0].get("node")}
        for a in self.t.calls:
            b = r_by_node.get((a.rows[0].get("node"), a.op))
            if b is not None and outputs_fit(a, b):
                self.claims.claim(Match([a], [b]))

    def ops(self) -> None:
        groups: dict[str, tuple[list[OpCall], list[OpCall]]] = defaultdict(lambda: ([], []))
        for side, k in ((self.t, 0), (self.r, 1)):
            for call in side.calls:
                if not self.claims.holds(side, call) and is_forward(call):
                    groups[call.module][k].append(call)
        for module in sorted(groups, key=lambda m: min(c.seq for c in groups[m][0] + groups[m][1])):
            tc, rc = groups[module]
            if tc and rc:
                for match in align_runs(tc, rc, self.t.table, self.r.table):
                    self.claims.claim(match)
                    self._claim_pieces(match, tc, rc)

    def _claim_pieces(self, match: Match, tc: list[OpCall], rc: list[OpCall]) -> None:
        """A torch op with k outputs (split, chunk) against k foreign nodes of one output (Slice):
        each output takes the node of that op whose output statistics are closest (a runtime
        may reorder the nodes), and none when no node is close."""
        if len(match.t) != 1 or len(match.r) != 1:
            return
        (many, one, pool, side) = (match.t[0], match.r[0], rc, self.r) if len(match.t[0].outputs()) > 1 \
            else (match.r[0], match.t[0], tc, self.t)
        if len(one.outputs()) != 1 or len(many.outputs()) < 2:
            return
        self.claims.unclaim(match)
        free = [c for c in pool if c.op == one.op and not self.claims.holds(side, c) and c.outputs()]
        for slot, out in enumerate(many.outputs()):
            best = min(free, key=lambda c: distance(c.outputs()[0], out), default=None)
            if best is None or distance(best.outputs()[0], out) > 1e-2:
                continue
            free.remove(best)
            self.claims.claim(Match([many], [best], slot=slot) if many in match.t else Match([best], [many], slot=slot))

    def folds(self) -> None:
        """A torch batch norm whose input is a convolution's output, where the foreign side has a
        node it folds into (Conv, Gemm) of that size and no node of its own: the norm was folded."""
        sides = self._foreign_and_torch()
        if sides is None:
            return
        foreign, torch, table = sides
        for norm in torch.calls:
            targets = table.folds_into(norm.op)
            if targets and norm.outputs():
                self._fold(foreign, torch, table, norm, targets)

    def _fold(self, foreign: Side, torch: Side, table: OpTable, norm: OpCall, targets: frozenset[str]) -> None:
        conv = torch.producer_call(norm)
        if conv is None or any(table.computes_itself(c.op, norm.op) and c.module in (conv.module, norm.module)
                               for c in foreign.calls):
            return
        if not any(table.corresponds(o, conv.op) for o in targets):
            return
        numel = norm.outputs()[0].get("numel")
        fused = next((c for c in foreign.calls if not self.claims.holds(foreign, c)
                      and c.module in (conv.module, norm.module) and table.corresponds(c.op, norm.op)
                      and not has_activation(c, table)
                      and c.outputs() and c.outputs()[0].get("numel") == numel), None)
        if fused is None:
            return
        note = (f"{norm.op} ({norm.module}) folded into {fused.op} ({fused.module}) by the exporter or "
                f"{table.runtime}: the {table.name} output is the batch norm's")
        self.claims.claim(Match([fused] if foreign is self.t else [norm], [norm] if foreign is self.t else [fused],
                                note, fold=True))
        self.claims.claimed.add((torch.name, conv.seq))
        self.claims.notes[(torch.name, conv.seq)] = (f"{conv.op} has no {table.name} counterpart: "
                                                     f"{norm.op} was folded into it "
                                                     f"({fused.rows[0].get('node') or fused.op})")

    def modules(self) -> None:
        """Module level: a torch module's outputs pair with the last outputs of its foreign subtree
        that leave the subtree (the innermost module wins a tensor several modules return)."""
        sides = self._foreign_and_torch()
        if sides is None:
            return
        foreign, torch, table = sides
        readers = foreign.readers()
        chosen: dict[int, tuple[OpCall, dict[str, Any]]] = {}  # torch output id -> (foreign call, its row)
        for call in torch.calls:
            if not is_forward(call):
                continue
            inside = [c for c in foreign.calls if within(c.module, call.module) and not table.is_internal(c.op)
                      and not (has_activation(c, table) and c.module == call.module)]
            for out in call.outputs():
                found = _last_escaping(inside, call.module, out, readers)
                if found is not None:
                    chosen[out["id"]] = found
        for call in torch.calls:  # a BatchNorm module with nothing in its foreign subtree: folded
            if call.op in torchnames.BATCH_NORM_MODULES and call.outputs() and call.outputs()[0]["id"] not in chosen:
                self._fold_module(torch, table, call, chosen)
        for call in torch.calls:
            for out in call.outputs():
                if out["id"] in chosen:
                    o_call, o_row = chosen[out["id"]]
                    t_calls, r_calls = ([o_call], [call]) if foreign is self.t else ([call], [o_call])
                    self.claims.matches.append(Match(t_calls, r_calls, self.fold_notes.get(out["id"], ""),
                                                     rows=(o_row, out)))

    def _fold_module(self, torch: Side, table: OpTable, norm: OpCall,
                     chosen: dict[int, tuple[OpCall, dict[str, Any]]]) -> None:
        conv = torch.producer_call(norm)
        if conv is None or not conv.outputs() or conv.outputs()[0]["id"] not in chosen:
            return
        o_call, o_row = chosen[conv.outputs()[0]["id"]]
        if table.op_type(o_call.op) not in table.folds_into(norm.op) \
                or o_row.get("numel") != norm.outputs()[0].get("numel"):
            return
        del chosen[conv.outputs()[0]["id"]]
        chosen[norm.outputs()[0]["id"]] = (o_call, o_row)
        self.fold_notes[norm.outputs()[0]["id"]] = (f"{norm.module} ({norm.op}) folded into {o_call.op} "
                                                    f"({o_call.module})")
        self.claims.notes[(torch.name, conv.seq)] = (f"output has no {table.name} counterpart: "
                                                     f"{norm.module} was folded into {o_call.op}")


def _last_escaping(inside: list[OpCall], scope: str, out: dict[str, Any],
                   readers: dict[int, set[str]]) -> tuple[OpCall, dict[str, Any]] | None:
    for call in sorted(inside, key=lambda c: -c.seq):
        for row in call.outputs():
            if row.get("numel") != out.get("numel") or is_float_row(row) != is_float_row(out):
                continue
            modules = readers.get(row["id"], set())
            if not modules or any(not within(m, scope) for m in modules):
                return call, row
    return None


def mark_fold(match: Match, t: Side, r: Side) -> None:
    """A Conv (or Gemm) paired with a batch norm computes both: its weights are not the
    convolution's (whatever name the exporter left on them), so its parameters never pair."""
    if match.fold or t.foreign == r.foreign:
        return
    (foreign, table), torch = ((match.t, t.table), match.r) if t.foreign else ((match.r, r.table), match.t)
    assert table is not None
    conv = next((c for c in foreign if table.op_type(c.op) in table.fold_targets), None)
    norm = next((c for c in torch if table.folds_into(c.op)), None)
    if conv is not None and norm is not None:
        match.fold = True
        match.note = match.note or f"{norm.op} ({norm.module}) folded into {conv.op} ({conv.module})"
