"""Alignment across frameworks: a PyTorch dump against an ONNX Runtime dump (either side may
be the target), or two ONNX Runtime dumps (an fp16 copy against its fp32 original, one
provider or optimisation level against another).

The two sides' op names differ (``aten.addmm.default`` / ``onnx::Gemm``) and one torch op
may be several ONNX nodes or the reverse, so calls are not paired by name. Within one
(rank, step), per module path:

1. **Ops** (aten and api levels) are sequence-aligned with
   :func:`opscope.capture.onnxruntime.ops.corresponds` as the match predicate. A torch op
   may also match a run of ONNX nodes that :func:`~opscope.capture.onnxruntime.ops.is_decomposition`
   accepts (GELU as Div/Erf/Add/Mul/Mul): its output pairs with the run's last node, the
   inner nodes stay unpaired. One ONNX node may match a run of torch ops that
   :func:`~opscope.capture.onnxruntime.ops.is_fusion` accepts (ORT's fused nodes), paired
   with the run's last op. A BatchNorm folded into the preceding Conv pairs the ONNX
   ``Conv`` output with the torch batch-norm output; the torch convolution is left unpaired.
2. **Modules** (module level): a torch module's output pairs with the last output of its
   module subtree on the ONNX side that leaves the subtree.
3. **Inputs and parameters**: model inputs pair with graph inputs (same content first), and
   parameters by name; an op's inputs pair where their producers are paired.
4. An element-preserving op on one side only (a view, a reshape, a cast) is judged as an
   identity, as in same-framework alignment; every other one-sided op is left unpaired
   and its rows are folded into the call of the paired op that consumes its output (its
   ``cseq``), so that call's verdict sees the inputs of the whole region it stands for.

Two ONNX dumps pair nodes of the same name and op first, then the rest as above with op
equality as the predicate.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from opscope.capture.onnxruntime import ops as table
from opscope.compare.align import OpCall, Pair, _calls
from opscope.compare.crosslevels import TORCH_LEVELS, dump_level, is_cross, manifest_warnings
from opscope.compare.crossmatch import Match, align_runs, has_activation, outputs_fit
from opscope.compare.crosspairing import RowPairing, _Side
from opscope.compare.crosssides import (
    _BATCH_NORM,
    _distance,
    _escaping_outputs,
    _forward,
    _last_escaping,
    _mark_fold,
    _moves_data,
    _producer_call,
    _within,
)


class _Aligner(RowPairing):
    """Matches calls across the two sides; pairing their rows is :class:`RowPairing`'s."""

    def __init__(self, t_rows: list[dict[str, Any]], r_rows: list[dict[str, Any]], t_level: str, r_level: str) -> None:
        self.t, self.r = _side("target", t_level, t_rows), _side("reference", r_level, r_rows)
        self.pairs: list[Pair] = []
        self.partner: dict[str, dict[int, dict[str, Any]]] = {"target": {}, "reference": {}}
        self.matches: list[Match] = []
        self.claimed: set[tuple[str, int]] = set()   # (side, seq) of calls in a match
        self.notes: dict[tuple[str, int], str] = {}  # (side, seq) -> why it stays unpaired
        self.fold_notes: dict[int, str] = {}  # torch module output id -> how its BatchNorm was folded

    # -- driver -------------------------------------------------------------------------
    def run(self) -> list[Pair]:
        if self.t.onnx and self.r.onnx:
            self._match_by_node_name()
        if "module" in (self.t.level, self.r.level):
            self._match_modules()
        else:
            self._match_folds()
            self._match_ops()
        for match in self.matches:
            _mark_fold(match, self.t.onnx)
        self._pair_leaves()
        for match in sorted(self.matches, key=lambda m: m.t[-1].seq):
            if self._founded(match):
                self._pair_outputs(match)
            else:
                self._unclaim(match)
        for match in self.matches:
            self._pair_inputs(match)
        self._pair_params_by_name()
        self._identities()
        self._absorb(self.t)
        self._absorb(self.r)
        return self._finish()

    # -- op matching --------------------------------------------------------------------
    def _match_by_node_name(self) -> None:
        r_by_node = {(c.rows[0].get("node"), c.op): c for c in self.r.calls if c.rows[0].get("node")}
        for a in self.t.calls:
            b = r_by_node.get((a.rows[0].get("node"), a.op))
            if b is not None and outputs_fit(a, b):
                self._claim(Match([a], [b]))

    def _match_ops(self) -> None:
        groups: dict[str, tuple[list[OpCall], list[OpCall]]] = defaultdict(lambda: ([], []))
        for side, k in ((self.t, 0), (self.r, 1)):
            for call in side.calls:
                if (side.name, call.seq) not in self.claimed and _forward(call):
                    groups[call.module][k].append(call)
        for module in sorted(groups, key=lambda m: min(c.seq for c in groups[m][0] + groups[m][1])):
            tc, rc = groups[module]
            if tc and rc:
                for match in align_runs(tc, rc, self.t.onnx, self.r.onnx):
                    self._claim(match)
                    self._claim_pieces(match, tc, rc)

    def _claim_pieces(self, match: Match, tc: list[OpCall], rc: list[OpCall]) -> None:
        """A torch op with k outputs (split, chunk) against k ONNX nodes of one output (Slice):
        each output takes the node of that op whose output statistics are closest (ONNX Runtime
        may reorder the nodes), and none when no node is close."""
        if len(match.t) != 1 or len(match.r) != 1:
            return
        (many, one, pool, side) = (match.t[0], match.r[0], rc, self.r) if len(match.t[0].outputs()) > 1 \
            else (match.r[0], match.t[0], tc, self.t)
        if len(one.outputs()) != 1 or len(many.outputs()) < 2:
            return
        self._unclaim(match)
        free = [c for c in pool if c.op == one.op and (side.name, c.seq) not in self.claimed and c.outputs()]
        for slot, out in enumerate(many.outputs()):
            best = min(free, key=lambda c: _distance(c.outputs()[0], out), default=None)
            if best is None or _distance(best.outputs()[0], out) > 1e-2:
                continue
            free.remove(best)
            self._claim(Match([many], [best], slot=slot) if many in match.t else Match([best], [many], slot=slot))

    def _match_folds(self) -> None:
        """A torch batch norm whose input is a convolution's output, where the ONNX side has a
        Conv (or Gemm) of that size and no BatchNormalization node: the norm was folded."""
        onnx, torch = (self.t, self.r) if self.t.onnx and not self.r.onnx else (self.r, self.t)
        if not onnx.onnx or torch.onnx:
            return
        for norm in torch.calls:
            keys = table.torch_keys(norm.op)
            if keys.isdisjoint(table.FOLDED) or not norm.outputs():
                continue
            conv = _producer_call(torch, norm)
            if conv is None or any(c.op.endswith("::BatchNormalization") and c.module in (conv.module, norm.module)
                                   for c in onnx.calls):
                continue
            if not any(table.corresponds(f"onnx::{o}", conv.op)
                                       for o in table.FOLDED[next(iter(keys & set(table.FOLDED)))]):
                continue
            numel = norm.outputs()[0].get("numel")
            fused = next((c for c in onnx.calls if (onnx.name, c.seq) not in self.claimed
                          and c.module in (conv.module, norm.module) and table.corresponds(c.op, norm.op)
                          and not has_activation(c)
                          and c.outputs() and c.outputs()[0].get("numel") == numel), None)
            if fused is None:
                continue
            note = (f"{norm.op} ({norm.module}) folded into {fused.op} ({fused.module}) by the exporter or "
                    f"ONNX Runtime: the ONNX output is the batch norm's")
            pair = Match([fused] if onnx is self.t else [norm], [norm] if onnx is self.t else [fused], note, fold=True)
            self._claim(pair)
            self.claimed.add((torch.name, conv.seq))
            self.notes[(torch.name, conv.seq)] = (f"{conv.op} has no ONNX counterpart: {norm.op} was folded "
                                                  f"into it ({fused.rows[0].get('node') or fused.op})")

    def _match_modules(self) -> None:
        """Module level: a torch module's outputs pair with the last outputs of its ONNX subtree
        that leave the subtree (the innermost module wins a tensor several modules return)."""
        onnx, torch = (self.t, self.r) if self.t.onnx else (self.r, self.t)
        if not onnx.onnx:
            return
        escaping = _escaping_outputs(onnx)
        chosen: dict[int, tuple[OpCall, dict[str, Any]]] = {}  # torch output id -> (onnx call, onnx row)
        for call in torch.calls:
            if not _forward(call):
                continue
            inside = [c for c in onnx.calls if _within(c.module, call.module) and not table.is_internal(c.op)
                      and not (has_activation(c) and c.module == call.module)]
            for out in call.outputs():
                found = _last_escaping(inside, call.module, out, escaping)
                if found is not None:
                    chosen[out["id"]] = found
        for call in torch.calls:  # a BatchNorm module with nothing in its ONNX subtree: folded
            if call.op in _BATCH_NORM and call.outputs() and call.outputs()[0]["id"] not in chosen:
                self._fold_module(torch, call, chosen)
        for call in torch.calls:
            for out in call.outputs():
                if out["id"] in chosen:
                    o_call, o_row = chosen[out["id"]]
                    t_calls, r_calls = ([o_call], [call]) if onnx is self.t else ([call], [o_call])
                    self.matches.append(Match(t_calls, r_calls, self.fold_notes.get(out["id"], ""), rows=(o_row, out)))

    def _fold_module(self, torch: _Side, norm: OpCall, chosen: dict[int, tuple[OpCall, dict[str, Any]]]) -> None:
        conv = _producer_call(torch, norm)
        if conv is None or not conv.outputs() or conv.outputs()[0]["id"] not in chosen:
            return
        o_call, o_row = chosen[conv.outputs()[0]["id"]]
        if table.split_onnx_op(o_call.op)[1] not in ("Conv", "ConvTranspose", "Gemm") \
                or o_row.get("numel") != norm.outputs()[0].get("numel"):
            return
        del chosen[conv.outputs()[0]["id"]]
        chosen[norm.outputs()[0]["id"]] = (o_call, o_row)
        self.fold_notes[norm.outputs()[0]["id"]] = f"{norm.module} ({norm.op}) folded into {o_call.op} ({o_call.module})"
        self.notes[(torch.name, conv.seq)] = f"output has no ONNX counterpart: {norm.module} was folded into {o_call.op}"

    def _founded(self, match: Match) -> bool:
        """A data-movement op (reshape, transpose, slice...) pairs only where its input is the
        other side's input: many of them move tensors of one size, so position is no proof."""
        if match.rows is not None or len(match.t) > 1 or len(match.r) > 1:
            return True
        if not any(_moves_data(c.op) for c in match.t + match.r):
            return True
        sources = {self._source(self.r, row) for c in match.r for row in c.inputs() if row.get("io") == "input"}
        return any(self._source(self.t, row) in sources - {None} for c in match.t for row in c.inputs()
                   if row.get("io") == "input")

    def _unclaim(self, match: Match) -> None:
        self.matches.remove(match)
        for side, calls in ((self.t, match.t), (self.r, match.r)):
            for call in calls:
                self.claimed.discard((side.name, call.seq))

    def _claim(self, match: Match) -> None:
        self.matches.append(match)
        for side, calls in ((self.t, match.t), (self.r, match.r)):
            for call in calls:
                self.claimed.add((side.name, call.seq))


def align_partition(t_rows: list[dict[str, Any]], r_rows: list[dict[str, Any]],
                    t_level: str | None, r_level: str | None) -> list[Pair]:
    """Align one (rank, step) of two dumps of which at least one is an ONNX Runtime dump."""
    return _Aligner(t_rows, r_rows, t_level or "aten", r_level or "aten").run()


# -- helpers ---------------------------------------------------------------------------------
def _side(name: str, level: str, rows: list[dict[str, Any]]) -> _Side:
    side = _Side(name, level, rows)
    groups = _calls(rows, name)
    side.calls = sorted((c for calls in groups.values() for c in calls), key=lambda c: c.seq)
    side.by_id = {r["id"]: r for r in rows}
    for call in side.calls:
        for row in call.rows:
            side.call_of[row["id"]] = call
    for call in side.calls:
        for row in call.inputs():
            producer = side.by_id.get(row.get("producer"))
            while producer is not None and producer.get("io") != "output":
                producer = side.by_id.get(producer.get("producer"))  # a re-read of a model input
            if producer is not None and side.call_of.get(producer["id"]) is not call:
                side.consumers[producer["id"]].append(call)
    return side


__all__ = ["TORCH_LEVELS", "align_partition", "dump_level", "is_cross", "manifest_warnings"]
