"""Pairing the rows of the calls that :class:`~opscope.compare.crossframework.matcher.CallMatcher`
matched (steps 3 and 4 of :mod:`opscope.compare.crossframework`): outputs of matched calls,
model inputs and parameters, inputs through their paired producers, one-sided
element-preserving ops as identities, and the rest folded into the call that consumes it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from opscope.compare.align import Pair
from opscope.compare.crossframework.matcher import Claims
from opscope.compare.crossframework.runs import Match
from opscope.compare.crossframework.sides import Side, name_suffix, same_content


class RowPairing:
    """The pairs of one (rank, step): built from the matched calls in :class:`Claims`."""

    def __init__(self, t: Side, r: Side, claims: Claims) -> None:
        self.t, self.r, self.claims = t, r, claims
        self.pairs: list[Pair] = []
        self.partner: dict[str, dict[int, dict[str, Any]]] = {"target": {}, "reference": {}}

    def founded(self, match: Match) -> bool:
        """A data-movement op (reshape, transpose, slice...) pairs only where its input is the
        other side's input: many of them move tensors of one size, so position is no proof."""
        if match.rows is not None or len(match.t) > 1 or len(match.r) > 1:
            return True
        if not any(side.table.moves_data(c.op) for side, calls in ((self.t, match.t), (self.r, match.r))
                   if side.table is not None for c in calls):
            return True
        sources = {self.source(self.r, row) for c in match.r for row in c.inputs() if row.get("io") == "input"}
        return any(self.source(self.t, row) in sources - {None} for c in match.t for row in c.inputs()
                   if row.get("io") == "input")

    # -- row pairing --------------------------------------------------------------------
    def add(self, t: dict[str, Any], r: dict[str, Any], kind: str = "aligned", note: str = "") -> Pair:
        self.partner["target"].setdefault(t["id"], r)
        self.partner["reference"].setdefault(r["id"], t)
        pair = Pair(t, r, kind, note=note)
        self.pairs.append(pair)
        return pair

    def paired(self, side: Side, row: dict[str, Any]) -> bool:
        return row["id"] in self.partner[side.name]

    def pair_outputs(self, match: Match) -> None:
        if match.rows is not None:  # module level: chosen rows
            o_row, t_row = match.rows
            t, r = (o_row, t_row) if self.t.foreign else (t_row, o_row)
            self.add(t, r, note=match.note)
            return
        # the output of a run is its last call's; one-to-one calls pair slot by slot
        t_outs, r_outs = match.t[-1].outputs(), match.r[-1].outputs()
        if match.slot is not None:
            t_outs, r_outs = (t_outs[match.slot:match.slot + 1], r_outs) if len(t_outs) > len(r_outs) \
                else (t_outs, r_outs[match.slot:match.slot + 1])
        note = match.note or run_note(match, self.t, self.r)
        for a, b in zip(t_outs, r_outs):
            if a.get("numel") == b.get("numel") and not self.paired(self.t, a) and not self.paired(self.r, b):
                self.add(a, b, note=note)

    def pair_leaves(self) -> None:
        """Model inputs: the first read of each, same content first; then in order, when both
        sides have as many left (a torch module's input made by unrecorded code is no leaf)."""
        t_leaves, r_leaves = self.t.leaf_reads(), self.r.leaf_reads()
        for a in t_leaves:
            b = next((b for b in r_leaves if not self.paired(self.r, b) and same_content(a, b)), None)
            if b is not None:
                self.add(a, b, note="model input")
        t_left = [a for a in t_leaves if not self.paired(self.t, a)]
        r_left = [b for b in r_leaves if not self.paired(self.r, b)]
        if len(t_left) == len(r_left) and all(a.get("numel") == b.get("numel") for a, b in zip(t_left, r_left)):
            for a, b in zip(t_left, r_left):
                self.add(a, b, note="model input")

    def pair_inputs(self, match: Match) -> None:
        """Inputs of matched calls whose producers (or model inputs) are paired; parameters by name."""
        t_ins = [r for c in match.t for r in c.inputs() if not self.paired(self.t, r)]
        r_ins = [r for c in match.r for r in c.inputs() if not self.paired(self.r, r)]
        for a in t_ins:
            src = self.source(self.t, a)
            for b in r_ins:
                if self.paired(self.r, b) or a.get("numel") != b.get("numel"):
                    continue
                same_param = a.get("param") and a.get("param") == b.get("param")
                if (src is not None and src == self.source(self.r, b)) or (same_param and not match.fold):
                    self.add(a, b)
                    break
        if match.fold:
            return
        for a in t_ins:  # a weight the exporter shared between equal modules (norm1.weight for norm2.weight)
            if self.paired(self.t, a) or not a.get("param"):
                continue
            shared = next((b for b in r_ins if b.get("param") and not self.paired(self.r, b)
                           and name_suffix(b["param"]) == name_suffix(a["param"])
                           and list(b.get("shape") or []) == list(a.get("shape") or [])), None)
            if shared is not None:
                self.add(a, shared, note=f"parameter {a['param']} against {shared['param']}")

    def source(self, side: Side, row: dict[str, Any]) -> int | None:
        """Where an input row's tensor comes from, as a target-side record id (for matching);
        through unpaired views and reshapes, which hold the same elements."""
        root = side.root(row)
        for _ in range(16):
            if root is None or root["id"] in self.partner[side.name] or root.get("io") != "output":
                break
            call = side.call_of.get(root["id"])
            if call is None:
                break
            main = [r for r in call.inputs() if r.get("io") == "input"]
            if not main or not side.preserves_order(call.op) or main[0].get("numel") != root.get("numel"):
                break
            root = side.root(main[0])
        if root is None:
            return None
        if side is self.t:
            return root["id"]
        partner = self.partner["reference"].get(root["id"])
        return partner["id"] if partner is not None else None

    def pair_params_by_name(self) -> None:
        """Parameters left over, by name: a torch weight read through ``t()`` against the ONNX
        node's initializer. An ONNX node that matched nothing keeps its initializers to itself
        (ORT's fused nodes carry folded weights under the original name)."""
        folded = {id(r) for m in self.claims.matches if m.fold for c in m.t + m.r for r in c.rows}
        for side in (self.t, self.r):
            if side.foreign:
                folded |= {id(r) for c in side.calls if not self.claims.holds(side, c) for r in c.rows}
        r_by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in self.r.rows:
            if row.get("io") == "param" and row.get("param") and not self.paired(self.r, row) and id(row) not in folded:
                r_by_name[row["param"]].append(row)
        for a in self.t.rows:
            if a.get("io") != "param" or not a.get("param") or self.paired(self.t, a) or id(a) in folded:
                continue
            candidates = [b for b in r_by_name.get(a["param"], []) if not self.paired(self.r, b)
                          and list(b.get("shape") or []) == list(a.get("shape") or [])]
            if candidates:
                self.add(a, candidates[0])

    # -- one-sided calls ----------------------------------------------------------------
    def identities(self) -> None:
        """Judge a one-sided element-preserving op (view, reshape, cast) as an identity."""
        one_sided = [(side, c) for side in (self.t, self.r) for c in side.calls
                     if not self.claims.holds(side, c) and side.preserves_order(c.op)
                     and not any(self.paired(side, r) for r in c.outputs())]
        one_sided.sort(key=lambda item: item[1].seq)
        for side, call in one_sided:
            main = [r for r in call.inputs() if r.get("io") == "input"]
            for out in call.outputs():
                source = self._version_of(side, main, out)
                if source is None:
                    continue
                self.partner[side.name][out["id"]] = source
                graph_output = side.foreign and source.get("arg") == out.get("arg")
                pair = Pair(out, source, "aligned" if graph_output else "identity",
                            side="" if graph_output else side.name) \
                    if side is self.t else Pair(source, out, "aligned" if graph_output else "identity",
                                                side="" if graph_output else side.name)
                pair.note = "graph output of the same name" if graph_output else \
                    f"{call.op} ran on the {side.name} only: judged as an identity"
                self.pairs.append(pair)

    def _version_of(self, side: Side, inputs: list[dict[str, Any]], out: dict[str, Any]) -> dict[str, Any] | None:
        partners = self.partner[side.name]
        for row in inputs:
            for key in (row.get("producer"), row["id"]):
                source = partners.get(key) if key is not None else None
                if source is not None and source.get("numel") == out.get("numel"):
                    return source
        return None

    def absorb(self, side: Side) -> None:
        """Fold each unpaired call into the paired call that consumes its output (transitively):
        the verdict then judges that call against the inputs of the whole region."""
        anchored = {c.seq for c in side.calls if any(self.paired(side, r) for r in c.outputs())}
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

    def finish(self) -> list[Pair]:
        judged = {(p.side, p.home["id"]) for p in self.pairs if p.kind == "identity"}
        for side in (self.t, self.r):
            for call in side.calls:
                note = self.claims.notes.get((side.name, call.seq), "")
                for row in call.rows:
                    if not self.paired(side, row) and (side.name, row["id"]) not in judged:
                        t, r = (row, None) if side is self.t else (None, row)
                        self.pairs.append(Pair(t, r, "unpaired", side=side.name, note=note))
        return self.pairs


def run_note(match: Match, t: Side, r: Side) -> str:
    """How a run of calls stands for one call on the other side (a decomposition or a fusion)."""
    if len(match.t) == 1 and len(match.r) == 1:
        return ""
    (many, side), one = ((match.t, t), match.r[0]) if len(match.t) > 1 else ((match.r, r), match.t[0])
    names = ", ".join(c.op.split("::")[-1].split(".")[-1 if "::" in c.op else 1] for c in many
                      if not side.is_internal(c.op))
    return f"{one.op} against {len(many)} ops ({names}): the last one's output; the others have no counterpart"
