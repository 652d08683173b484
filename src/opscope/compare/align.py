"""Alignment: which record of the target goes with which record of the reference.

Within one (rank, step), op calls are grouped by (phase, module path). Where both sides
called the same ops in the same order, calls pair by position, which is the pairing by key
(phase, module, op, call index); rows inside a call pair by (io, slot). Where the op
sequences differ (an inserted cast, an extra op, a fused or decomposed op), the group is
sequence-aligned, so the difference does not shift the pairing of what follows. Then:

- *flow* pairs: a paired op whose inputs come from unpaired producers on both sides (a
  fused op vs its decomposition) pairs those producers' outputs;
- *identity* pairs: an op present on one side only, with nothing in its place on the other
  side, is judged as an identity: its output against the other side's version of its input.

Everything left is unpaired, and reported so.
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict
from typing import Any

from opscope.compare.call_match import matchable, matchable_table, same_ops
from opscope.compare.flow import Sides, base_op, flow_pairs, inserted
from opscope.compare.mapping import Mapping
from opscope.compare.pair import INPUT_IO, PHASE_ORDER, OpCall, Pair, call_key
from opscope.compare.param_reads import parameter_pairs
from opscope.compare.row_pairs import pair_rows

__all__ = ["INPUT_IO", "PHASE_ORDER", "OpCall", "Pair", "align_partition", "rename_target"]

_DP_LIMIT = 250_000


def rename_target(rows: list[dict[str, Any]], mapping: Mapping) -> None:
    """Apply the mapping to target rows in place; original names kept under ``orig_*``."""
    if not mapping:
        return
    for row in rows:
        for col, fn in (("module", mapping.module), ("op", mapping.op), ("param", mapping.param)):
            new = fn(row.get(col))
            if new != row.get(col):
                row[f"orig_{col}"] = row.get(col)
                row[col] = new


def align_partition(t_rows: list[dict[str, Any]], r_rows: list[dict[str, Any]]) -> list[Pair]:
    """Align the rows of one (rank, step); returns paired, identity and unpaired entries."""
    t_calls, r_calls = op_calls(t_rows, "target"), op_calls(r_rows, "reference")
    replays = _replay_pairs(t_calls, r_calls)  # (their groups leave t_calls / r_calls)
    pairs: list[Pair] = []
    partner: dict[str, dict[int, dict[str, Any]]] = {"target": {}, "reference": {}}
    one_sided: list[OpCall] = []
    sides = Sides(t_rows, r_rows)
    grads = _gradient_makers(sides, "target", t_rows), _gradient_makers(sides, "reference", r_rows)
    for key in sorted(set(t_calls) | set(r_calls), key=lambda k: (PHASE_ORDER.get(k[0], 9), k)):
        tc, rc = t_calls.get(key, []), r_calls.get(key, [])
        by_name = _pair_by_gradient(tc, rc, *grads)
        taken = {id(c) for pair in by_name for c in pair}
        by_name += _pair_by_reads([c for c in tc if id(c) not in taken], [c for c in rc if id(c) not in taken])
        for ta, rb in by_name:
            pairs.extend(pair_rows(ta, rb, "aligned", partner))
        if by_name:
            tc = [c for c in tc if not any(r["id"] in partner["target"] for r in c.rows)]
            rc = [c for c in rc if not any(r["id"] in partner["reference"] for r in c.rows)]
        same = len(tc) == len(rc) and same_ops(tc, rc)  # once a group: each call is O(len)
        for a, b in _align_calls(tc, rc, same):
            if a is not None and b is not None:
                pairs.extend(pair_rows(a, b, "exact" if same else "aligned", partner))
            else:
                one_sided.extend(c for c in (a, b) if c is not None)  # the one side that ran it
    for pair in replays:  # the recomputing side's rows get partners; the forward rows keep theirs
        t, r = pair.rows
        partner[pair.side][pair.home["id"]] = r if pair.side == "target" else t
    pairs.extend(flow_pairs(pairs, sides, partner))
    pairs.extend(parameter_pairs(t_rows, r_rows, sides, partner))
    one_sided.sort(key=lambda call: call.seq)
    pairs.extend(_identity_pairs(one_sided, sides, partner))
    pairs.extend(replays)  # after every other pair: the forward rows they reuse keep their own
    paired = {"target": set(partner["target"]), "reference": set(partner["reference"])}
    judged = {(p.side, p.home["id"]) for p in pairs if p.kind == "identity"}
    for side, rows in (("target", t_rows), ("reference", r_rows)):
        for row in rows:
            if row["id"] not in paired[side] and (side, row["id"]) not in judged:
                pairs.append(Pair(row if side == "target" else None,
                                  row if side == "reference" else None, "unpaired", side=side))
    return pairs


def _replay_pairs(t_calls: dict[tuple[str, str], list[OpCall]],
                  r_calls: dict[tuple[str, str], list[OpCall]]) -> list[Pair]:
    """A recomputation on one side only pairs with the other side's forward of its module.

    Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's gradient
    checkpointing) runs the forward of a block again inside the backward to remake what the
    backward reads (phase ``recompute``, under the forward's module paths). A run without it
    has nothing of that phase; what the recomputation must remake is the forward, so each
    (recompute, module) group with no counterpart is aligned with the other side's
    (forward, module) group and judged against it: a faithful recomputation is identical,
    one that is not (a random op drawn again from another generator state) is a culprit
    where the backward that reads it would be blamed. Its pairs carry the recomputing side
    (its call is judged as that side's); the group leaves ``t_calls`` / ``r_calls``.
    """
    out: list[Pair] = []
    for mine, other, side in ((t_calls, r_calls, "target"), (r_calls, t_calls, "reference")):
        for key in [k for k in mine if k[0] == "recompute" and k not in other]:
            calls, forward = mine.pop(key), other.get(("forward", key[1]), [])
            tc, rc = (calls, forward) if side == "target" else (forward, calls)
            partner: dict[str, dict[int, dict[str, Any]]] = {"target": {}, "reference": {}}
            aligned = _align_calls(tc, rc, len(tc) == len(rc) and same_ops(tc, rc))
            for a, b in _with_interrupted(aligned, side):
                for pair in pair_rows(a, b, "aligned", partner):
                    pair.side = side
                    out.append(pair)
    return out


def _with_interrupted(aligned: list[tuple[OpCall | None, OpCall | None]],
                      side: str) -> list[tuple[OpCall, OpCall]]:
    """The matched calls, and a recomputed call without outputs matched to the first call of
    the same op left unmatched between the same neighbours: torch stops a recomputation once
    it has remade what the backward needs by raising from inside the op that made the last
    of it, whose outputs are then never recorded."""
    out: list[tuple[OpCall, OpCall]] = []
    gap: list[OpCall] = []  # this gap's recomputed calls without outputs
    spare: list[OpCall] = []  # this gap's unmatched forward calls
    for a, b in [*aligned, (None, None)]:
        mine, theirs = (a, b) if side == "target" else (b, a)
        if mine is not None and theirs is None and not mine.outputs():
            gap.append(mine)
        elif mine is None and theirs is not None:
            spare.append(theirs)
        if (a is None) == (b is None):  # a match (or the end) ends the gap
            for cut in gap:
                found = next((c for c in spare if c.op == cut.op), None)
                if found is not None:
                    spare.remove(found)
                    out.append((cut, found) if side == "target" else (found, cut))
            gap, spare = [], []
            if a is not None and b is not None:
                out.append((a, b))
    return out


def _gradient_makers(sides: Sides, side: str, rows: list[dict[str, Any]]) -> dict[int, str]:
    """Row id -> parameter, for each backward row whose value the optimizer reads as that
    parameter's gradient (autograd's accumulating ``detach``, the optimizer's ``grad``
    records linking to it)."""
    out = {}
    for row in rows:
        if row.get("io") == "grad" and row.get("param"):
            made = sides.producer(side, row)
            if made is not None and made.get("phase") == "backward":
                out[made["id"]] = row["param"]
    return out


def _pair_by_gradient(tc: list[OpCall], rc: list[OpCall], t_grads: dict[int, str],
                      r_grads: dict[int, str]) -> list[tuple[OpCall, OpCall]]:
    """Backward calls that make the same parameter's gradient, paired by that parameter.

    Autograd accumulates a gradient when its last contribution arrives, so the order of
    these calls follows the graph that ran: a compiled backward returns them in its own
    order, and position would pair the gradients of two same-shaped biases crosswise."""
    def by_param(calls: list[OpCall], grads: dict[int, str]) -> dict[str, OpCall]:
        found: dict[str, list[OpCall]] = defaultdict(list)
        for call in calls:
            names = {grads[row["id"]] for row in call.outputs() if row["id"] in grads}
            if len(names) == 1:
                found[names.pop()].append(call)
        return {name: cs[0] for name, cs in found.items() if len(cs) == 1}
    if not t_grads or not r_grads:
        return []
    t_by, r_by = by_param(tc, t_grads), by_param(rc, r_grads)
    return [(t_by[name], r_by[name]) for name in t_by.keys() & r_by.keys() if matchable(t_by[name], r_by[name])]


def _pair_by_reads(tc: list[OpCall], rc: list[OpCall]) -> list[tuple[OpCall, OpCall]]:
    """Calls that read parameters, paired by the names they read where the two sides read them
    in another order (else by position, as before).

    ModernBERT's rotary module is called once per attention type; compiled, it makes the
    global one's frequencies first, uncompiled the local one's: by position, each read of one
    buffer paired with a read of the other, a "root" at the start of step 0."""
    def by_names(calls: list[OpCall]) -> dict[frozenset[str], OpCall]:
        found: dict[frozenset[str], list[OpCall]] = defaultdict(list)
        for call in calls:
            names = frozenset(r["param"] for r in call.rows if r.get("io") == "param" and r.get("param"))
            if names:
                found[names].append(call)
        return {names: cs[0] for names, cs in found.items() if len(cs) == 1}
    t_by, r_by = by_names(tc), by_names(rc)
    both = t_by.keys() & r_by.keys()
    if len(both) < 2 or [k for k in t_by if k in both] == [k for k in r_by if k in both]:
        return []  # (dicts keep the calls' order)
    return [(t_by[k], r_by[k]) for k in both if matchable(t_by[k], r_by[k])]


def op_calls(rows: list[dict[str, Any]], side: str) -> dict[tuple[str, str], list[OpCall]]:
    """Op calls per (phase, module), in execution order.

    A call is identified by (phase, module, op, call index), so records of one call written
    at different times (module entry and exit, an optimizer's parameter before and after
    its update) form one call. Each row gets ``cseq``: the sequence number of its call's
    last record, where the call's outputs are known.
    """
    by_call: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_call[call_key(row)].append(row)
    calls = []
    for members in by_call.values():
        first = min(members, key=lambda r: r["seq"])
        last = max(r["seq"] for r in members)
        for row in members:
            row["cseq"] = last
        calls.append(OpCall(side, first["seq"], first.get("phase") or "", first.get("module") or "",
                            first.get("op") or "", members))
    groups: dict[tuple[str, str], list[OpCall]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.seq):
        groups[(call.phase, call.module)].append(call)
    return groups


def _align_calls(tc: list[OpCall], rc: list[OpCall],
                 same: bool) -> list[tuple[OpCall | None, OpCall | None]]:
    """Pairs of calls in order, one-sided calls with None opposite (``same``: they match one to one)."""
    if same:
        return list(zip(tc, rc))
    matches = _match(tc, rc)
    out: list[tuple[OpCall | None, OpCall | None]] = []
    i = j = 0
    for mi, mj in [*matches, (len(tc), len(rc))]:
        out += [(a, None) for a in tc[i:mi]]
        out += [(None, b) for b in rc[j:mj]]
        if mi < len(tc) and mj < len(rc):
            out.append((tc[mi], rc[mj]))
        i, j = mi + 1, mj + 1
    return out


def _match(tc: list[OpCall], rc: list[OpCall]) -> list[tuple[int, int]]:
    """Indices of matched calls: dynamic programming on op names, ties broken by shapes and norms."""
    n, m = len(tc), len(rc)
    if n * m > _DP_LIMIT:
        sm = difflib.SequenceMatcher(None, [c.op for c in tc], [c.op for c in rc], autojunk=False)
        return [(b.a + k, b.b + k) for b in sm.get_matching_blocks() for k in range(b.size)]
    ok = matchable_table(tc, rc)
    score = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below, oki = score[i], score[i + 1], ok[i]
        for j in range(m - 1, -1, -1):
            best = max(below[j], row[j + 1])
            if oki[j]:
                best = max(best, below[j + 1] + _similarity(tc[i], rc[j]))
            row[j] = best
    matches, i, j = [], 0, 0
    while i < n and j < m:
        if ok[i][j] and score[i][j] == score[i + 1][j + 1] + _similarity(tc[i], rc[j]):
            matches.append((i, j))
            i, j = i + 1, j + 1
        elif score[i][j] == score[i + 1][j]:
            i += 1
        else:
            j += 1
    return matches


def _similarity(a: OpCall, b: OpCall) -> float:
    """3 for a match (same op, same output shapes: see _matchable), +1 as output norms get
    closer, +0.5 as the first inputs' do (CLIP's loss `(a + b) / 2`, then the training loop's
    `loss / accumulate`: against a compiled graph that made the loss, the second `div` reads
    what the graph returned, the first twice as much)."""
    return 3.0 + _closeness(a.outputs(), b.outputs()) + 0.5 * _closeness(a.inputs(), b.inputs())


def _closeness(ra: list[dict[str, Any]], rb: list[dict[str, Any]]) -> float:
    """1 for equal norms of the first rows, down to 0 as they differ."""
    if not ra or not rb:
        return 0.0
    na, nb = ra[0].get("norm"), rb[0].get("norm")
    if na is None or nb is None or not (math.isfinite(na) and math.isfinite(nb)):
        return 0.0
    return 1.0 - min(1.0, abs(na - nb) / max(abs(na), abs(nb), 1e-30))


def _identity_pairs(one_sided: list[OpCall], sides: Sides, partner: dict) -> list[Pair]:
    """Judge ops inserted on one side as identities (output vs the input's partner).

    Only an op that was truly inserted qualifies: on the other side, the consumers of its
    output read its input's partner directly (:func:`opscope.compare.flow.inserted`). An op
    with something else in its place (one half of a fused region) stays unpaired.
    """
    out = []
    for call in one_sided:
        if any(row["id"] in partner[call.side] for row in call.rows):
            continue  # paired by data flow
        for row in call.outputs():
            source = _input_partner(call, row, sides, partner)
            if source is None:
                continue
            partner[call.side][row["id"]] = source  # later inserted ops chain through this one
            pair = Pair(row, source, "identity", side="target") if call.side == "target" \
                else Pair(source, row, "identity", side="reference")
            pair.note = f"{call.op} ran on the {call.side} only: judged as an identity"
            out.append(pair)
    return out


def _input_partner(call: OpCall, out_row: dict[str, Any], sides: Sides,
                   partner: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any] | None:
    """The other side's row holding this inserted call's main input (same element count).

    None for a sum of two values that both sides have (:func:`_regrouped_sum`)."""
    mine = partner[call.side]
    if _regrouped_sum(call, out_row, mine):
        return None
    for row in call.inputs():
        producer = row.get("producer")
        source = mine.get(producer) if producer is not None else None
        if source is not None and source.get("numel") == out_row.get("numel") \
                and inserted(sides, call.side, row, out_row, partner):
            return source
    return None


# Elementwise sums: autograd adds the gradients of a tensor read by several ops with these.
_SUMS = frozenset({"add", "add_"})


def _regrouped_sum(call: OpCall, out_row: dict[str, Any], mine: dict[int, dict[str, Any]]) -> bool:
    """Is this one-sided call a sum of two or more full-size values that both sides have?

    Then the other side adds the same terms in another grouping, not nothing: a tensor read
    by several ops gets its gradient summed by autograd in the order its graph gives, and a
    cast on one side only (a bf16 model's norm computing in float32) regroups those sums.
    Judged as an identity, the sum would be held to one of its terms. It stays unpaired; the
    total is judged where both sides use it."""
    if base_op(call.op) not in _SUMS:
        return False
    shared = [row for row in call.inputs() if row.get("numel") == out_row.get("numel")
              and row.get("producer") is not None and row["producer"] in mine]
    return len(shared) >= 2
