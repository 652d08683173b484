"""Pairing the rows of calls that cross-framework alignment matched
(:mod:`~opscope.compare.crossframework`, steps 3 and 4 of its docstring): outputs of matched
calls, model inputs and parameters, inputs through their paired producers, one-sided
element-preserving ops as identities, and the rest folded into the call that consumes it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from opscope.capture.onnxruntime import ops as table
from opscope.compare.align import OpCall, Pair
from opscope.compare.crossmatch import Match
from opscope.compare.crosssides import (
    _leaf_reads,
    _root,
    _run_note,
    _same_content,
    _suffix,
)


@dataclass
class _Side:
    name: str             # "target" or "reference"
    level: str            # "onnx", "aten", "api", "module"
    rows: list[dict[str, Any]]
    calls: list[OpCall] = field(default_factory=list)
    by_id: dict[int, dict[str, Any]] = field(default_factory=dict)
    call_of: dict[int, OpCall] = field(default_factory=dict)     # row id -> its call
    consumers: dict[int, list[OpCall]] = field(default_factory=lambda: defaultdict(list))
    first_reads: dict[str, dict[str, Any]] | None = None  # graph input name -> its first read

    @property
    def onnx(self) -> bool:
        return self.level == "onnx"


class RowPairing:
    """Mixin of the cross-framework aligner: needs ``t``, ``r`` (sides), ``pairs``,
    ``partner``, ``matches``, ``claimed`` and ``notes``."""

    t: Any
    r: Any
    pairs: list[Pair]
    partner: dict[str, dict[int, dict[str, Any]]]
    matches: list[Match]
    claimed: set[tuple[str, int]]
    notes: dict[tuple[str, int], str]

    # -- row pairing --------------------------------------------------------------------
    def _add(self, t: dict[str, Any], r: dict[str, Any], kind: str = "aligned", note: str = "") -> Pair:
        self.partner["target"].setdefault(t["id"], r)
        self.partner["reference"].setdefault(r["id"], t)
        pair = Pair(t, r, kind, note=note)
        self.pairs.append(pair)
        return pair

    def _paired(self, side: _Side, row: dict[str, Any]) -> bool:
        return row["id"] in self.partner[side.name]

    def _pair_outputs(self, match: Match) -> None:
        if match.rows is not None:  # module level: chosen rows
            o_row, t_row = match.rows
            t, r = (o_row, t_row) if self.t.onnx else (t_row, o_row)
            self._add(t, r, note=match.note)
            return
        # the output of a run is its last call's; one-to-one calls pair slot by slot
        t_outs, r_outs = match.t[-1].outputs(), match.r[-1].outputs()
        if match.slot is not None:
            t_outs, r_outs = (t_outs[match.slot:match.slot + 1], r_outs) if len(t_outs) > len(r_outs) \
                else (t_outs, r_outs[match.slot:match.slot + 1])
        note = match.note or _run_note(match)
        for a, b in zip(t_outs, r_outs):
            if a.get("numel") == b.get("numel") and not self._paired(self.t, a) and not self._paired(self.r, b):
                self._add(a, b, note=note)

    def _pair_leaves(self) -> None:
        """Model inputs: the first read of each, same content first; then in order, when both
        sides have as many left (a torch module's input made by unrecorded code is no leaf)."""
        t_leaves, r_leaves = _leaf_reads(self.t), _leaf_reads(self.r)
        for a in t_leaves:
            b = next((b for b in r_leaves if not self._paired(self.r, b) and _same_content(a, b)), None)
            if b is not None:
                self._add(a, b, note="model input")
        t_left = [a for a in t_leaves if not self._paired(self.t, a)]
        r_left = [b for b in r_leaves if not self._paired(self.r, b)]
        if len(t_left) == len(r_left) and all(a.get("numel") == b.get("numel") for a, b in zip(t_left, r_left)):
            for a, b in zip(t_left, r_left):
                self._add(a, b, note="model input")

    def _pair_inputs(self, match: Match) -> None:
        """Inputs of matched calls whose producers (or model inputs) are paired; parameters by name."""
        t_ins = [r for c in match.t for r in c.inputs() if not self._paired(self.t, r)]
        r_ins = [r for c in match.r for r in c.inputs() if not self._paired(self.r, r)]
        for a in t_ins:
            src = self._source(self.t, a)
            for b in r_ins:
                if self._paired(self.r, b) or a.get("numel") != b.get("numel"):
                    continue
                same_param = a.get("param") and a.get("param") == b.get("param")
                if (src is not None and src == self._source(self.r, b)) or (same_param and not match.fold):
                    self._add(a, b)
                    break
        if match.fold:
            return
        for a in t_ins:  # a weight the exporter shared between equal modules (norm1.weight for norm2.weight)
            if self._paired(self.t, a) or not a.get("param"):
                continue
            b = next((b for b in r_ins if b.get("param") and not self._paired(self.r, b)
                      and _suffix(b["param"]) == _suffix(a["param"]) and list(b.get("shape") or []) == list(a.get("shape") or [])), None)
            if b is not None:
                self._add(a, b, note=f"parameter {a['param']} against {b['param']}")

    def _source(self, side: _Side, row: dict[str, Any]) -> int | None:
        """Where an input row's tensor comes from, as a target-side record id (for matching);
        through unpaired views and reshapes, which hold the same elements."""
        root = _root(side, row)
        for _ in range(16):
            if root is None or root["id"] in self.partner[side.name] or root.get("io") != "output":
                break
            call = side.call_of.get(root["id"])
            main = [r for r in call.inputs() if r.get("io") == "input"] if call is not None else []
            if not main or not table.preserves_order(call.op) or main[0].get("numel") != root.get("numel"):
                break
            root = _root(side, main[0])
        if root is None:
            return None
        if side is self.t:
            return root["id"]
        partner = self.partner["reference"].get(root["id"])
        return partner["id"] if partner is not None else None

    def _pair_params_by_name(self) -> None:
        """Parameters left over, by name: a torch weight read through ``t()`` against the ONNX
        node's initializer. An ONNX node that matched nothing keeps its initializers to itself
        (ORT's fused nodes carry folded weights under the original name)."""
        folded = {id(r) for m in self.matches if m.fold for c in m.t + m.r for r in c.rows}
        for side in (self.t, self.r):
            if side.onnx:
                folded |= {id(r) for c in side.calls if (side.name, c.seq) not in self.claimed for r in c.rows}
        r_by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.r.rows:
            if row.get("io") == "param" and row.get("param") and not self._paired(self.r, row) and id(row) not in folded:
                r_by_name[row["param"]].append(row)
        for a in self.t.rows:
            if a.get("io") != "param" or not a.get("param") or self._paired(self.t, a) or id(a) in folded:
                continue
            candidates = [b for b in r_by_name.get(a["param"], []) if not self._paired(self.r, b)
                          and list(b.get("shape") or []) == list(a.get("shape") or [])]
            if candidates:
                self._add(a, candidates[0])

    # -- one-sided calls ----------------------------------------------------------------
    def _identities(self) -> None:
        """Judge a one-sided element-preserving op (view, reshape, cast) as an identity."""
        one_sided = [(side, c) for side in (self.t, self.r) for c in side.calls
                     if (side.name, c.seq) not in self.claimed and table.preserves_order(c.op)
                     and not any(self._paired(side, r) for r in c.outputs())]
        one_sided.sort(key=lambda item: item[1].seq)
        for side, call in one_sided:
            main = [r for r in call.inputs() if r.get("io") == "input"]
            for out in call.outputs():
                source = self._version_of(side, main, out)
                if source is None:
                    continue
                self.partner[side.name][out["id"]] = source
                graph_output = side.onnx and source.get("arg") == out.get("arg")
                pair = Pair(out, source, "aligned" if graph_output else "identity", side="" if graph_output else side.name) \
                    if side is self.t else Pair(source, out, "aligned" if graph_output else "identity",
                                                side="" if graph_output else side.name)
                pair.note = "graph output of the same name" if graph_output else \
                    f"{call.op} ran on the {side.name} only: judged as an identity"
                self.pairs.append(pair)

    def _version_of(self, side: _Side, inputs: list[dict[str, Any]], out: dict[str, Any]) -> dict[str, Any] | None:
        partners = self.partner[side.name]
        for row in inputs:
            for key in (row.get("producer"), row["id"]):
                source = partners.get(key) if key is not None else None
                if source is not None and source.get("numel") == out.get("numel"):
                    return source
        return None

    def _absorb(self, side: _Side) -> None:
        """Fold each unpaired call into the paired call that consumes its output (transitively):
        the verdict then judges that call against the inputs of the whole region."""
        anchored = {c.seq for c in side.calls if any(self._paired(side, r) for r in c.outputs())}
        home: dict[int, int] = {}
        for call in sorted(side.calls, key=lambda c: -c.seq):
            if call.seq in anchored:
                continue
            for consumer in sorted({id(c): c for o in call.outputs() for c in side.consumers.get(o["id"], [])}.values(),
                                   key=lambda c: c.seq):
                target = consumer.seq if consumer.seq in anchored else home.get(consumer.seq)
                if target is not None and target > call.seq:
                    home[call.seq] = target
                    break
        cseq = {c.seq: c.rows[0]["cseq"] for c in side.calls}
        for call in side.calls:
            if call.seq in home:
                for row in call.rows:
                    row["cseq"] = cseq[home[call.seq]]

    def _finish(self) -> list[Pair]:
        judged = {(p.side, p.home["id"]) for p in self.pairs if p.kind == "identity"}
        for side in (self.t, self.r):
            for call in side.calls:
                note = self.notes.get((side.name, call.seq), "")
                for row in call.rows:
                    if not self._paired(side, row) and (side.name, row["id"]) not in judged:
                        t, r = (row, None) if side is self.t else (None, row)
                        self.pairs.append(Pair(t, r, "unpaired", side=side.name, note=note))
        return self.pairs
