"""Pairing along the data flow, where the two sides ran different code for the same math.

Sequence alignment pairs the ops both sides share. Where one side runs a fused kernel
(SDPA, a fused norm) and the other its decomposition, the ops in between have no partner;
what both sides still share is the *boundary* of that region: the tensors that enter it
(paired already, by the ops that made them) and the tensors that leave it (the inputs of
paired ops after it). This module pairs the ops that produce those leaving tensors, walking
back from each paired input to the op that computed its values: through one-sided views
that keep the values and their order, and through the same layout op on both sides (a
transpose against a transpose). Two tensors are paired only when their shapes are equal.

It also says whether a one-sided op was *inserted*: on the other side its consumer reads
the very tensor this op reads. Only such an op can be judged as an identity.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from opscope.compare.opnames import torch_base
from opscope.compare.pair import INPUT_IO, Pair

Row = dict[str, Any]

# Ops whose output holds the input's values in the same (row-major) order: a pure reshape,
# an alias, a copy. Values are unchanged, whatever the shape.
ORDER_KEEPING = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "_reshape_copy", "alias", "detach",
    "detach_", "lift_fresh", "clone", "contiguous", "flatten", "unflatten", "squeeze",
    "squeeze_", "unsqueeze", "unsqueeze_", "view_as", "reshape_as", "view_copy", "alias_copy",
})
# Ops that keep values but move them: the same op on both sides moves them the same way.
LAYOUT = frozenset({
    "t", "transpose", "transpose_", "permute", "swapaxes", "swapdims", "movedim", "numpy_T",
    "mT", "expand", "expand_as", "slice", "narrow", "select", "diagonal", "as_strided",
    "unfold", "t_copy", "transpose_copy", "permute_copy", "expand_copy", "slice_copy",
})
# Ops that change values only by rounding them to another dtype.
CASTS = frozenset({
    "_to_copy", "to", "type_as", "float", "half", "bfloat16", "double", "type",
    "_autocast_to_reduced_precision", "_autocast_to_full_precision", "_to_dtype",
})
# A one-sided op of these kinds carries its input's error on: errors and divergences are
# read through it when nothing pairs its output.
PASS_THROUGH = ORDER_KEEPING | LAYOUT | CASTS
_MAX_WALK = 16


def base_op(op: str | None) -> str:
    """``aten.view.default`` -> ``view``; ``Tensor.view`` / ``torch.reshape`` -> the last name;
    ``mindspore.Reshape`` -> ``reshape`` (:mod:`opscope.compare.opnames`)."""
    parts = str(op or "").split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    if len(parts) == 2:  # another framework's op (mindspore.MatMul): its vocabulary's torch op
        return torch_base(parts[0], parts[1]) or parts[1]
    return parts[-1]


def shape_of(row: Row) -> list[int] | None:
    shape = row.get("shape")
    return None if shape is None else [int(x) for x in shape]


def same_shape(a: Row, b: Row) -> bool:
    """Equal shapes (equal element counts where a side recorded no shape)."""
    sa, sb = shape_of(a), shape_of(b)
    if sa is None or sb is None:
        return a.get("numel") == b.get("numel")
    return sa == sb


class Sides:
    """Rows, calls and consumers of both sides of one (rank, step), looked up by id."""

    def __init__(self, t_rows: list[Row], r_rows: list[Row]) -> None:
        self.by_id: dict[str, dict[int, Row]] = {"target": {}, "reference": {}}
        self.call_rows: dict[str, dict[int, list[Row]]] = {"target": defaultdict(list),
                                                           "reference": defaultdict(list)}
        self.consumers: dict[str, dict[int, list[Row]]] = {"target": defaultdict(list),
                                                           "reference": defaultdict(list)}
        for side, rows in (("target", t_rows), ("reference", r_rows)):
            for row in rows:
                self.by_id[side][row["id"]] = row
                self.call_rows[side][row["cseq"]].append(row)
                if row.get("io") in INPUT_IO and row.get("producer") is not None:
                    self.consumers[side][row["producer"]].append(row)

    def producer(self, side: str, row: Row) -> Row | None:
        producer = row.get("producer")
        return None if producer is None else self.by_id[side].get(producer)

    def tensor_inputs(self, side: str, row: Row) -> list[Row]:
        return [r for r in self.call_rows[side][row["cseq"]] if r.get("io") in INPUT_IO]

    def alias_source(self, side: str, row: Row, *, same_shape_only: bool = True) -> Row | None:
        """The tensor an order-keeping op's output ``row`` holds the values of, if any."""
        if row.get("io") != "output" or base_op(row.get("op")) not in ORDER_KEEPING:
            return None
        inputs = [r for r in self.tensor_inputs(side, row) if (r.get("numel") or 0) == row.get("numel")]
        if len(inputs) != 1:
            return None
        source = self.producer(side, inputs[0])
        if source is None or (same_shape_only and not same_shape(source, row)):
            return None
        return source


def flow_pairs(pairs: list[Pair], sides: Sides, partner: dict[str, dict[int, Row]]) -> list[Pair]:
    """Pair the producers of paired inputs whose producers have no partner yet."""
    out: list[Pair] = []
    queue = deque((p.t, p.r) for p in pairs
                  if p.t is not None and p.r is not None and p.t.get("io") in INPUT_IO)
    while queue:
        ct, cr = queue.popleft()
        pt, pr = sides.producer("target", ct), sides.producer("reference", cr)
        if pt is None or pr is None or pt.get("io") != "output" or pr.get("io") != "output":
            continue
        if not (same_shape(pt, pr) and same_shape(pt, ct) and same_shape(pr, cr)):
            continue
        top_t, top_r = _top(sides, "target", pt, partner), _top(sides, "reference", pr, partner)
        if top_t["id"] in partner["target"] or top_r["id"] in partner["reference"]:
            continue
        if not (_agrees(sides, "target", top_t, top_r, partner) and _agrees(sides, "reference", top_r, top_t, partner)):
            continue
        partner["target"][top_t["id"]], partner["reference"][top_r["id"]] = top_r, top_t
        out.append(Pair(top_t, top_r, "flow"))
        for a, b in _same_layout_inputs(sides, top_t, top_r):
            if a["id"] not in partner["target"] and b["id"] not in partner["reference"]:
                partner["target"][a["id"]], partner["reference"][b["id"]] = b, a
                out.append(Pair(a, b, "flow"))
                queue.append((a, b))
    return out


def _top(sides: Sides, side: str, row: Row, partner: dict[str, dict[int, Row]]) -> Row:
    """Walk up through one-sided, value- and shape-keeping ops and casts to the op that made
    the values (T5 under autocast casts its activation's float16 output to float32 and back
    where the float32 run has no cast: the activation pairs, not the cast)."""
    for _ in range(_MAX_WALK):
        source = sides.alias_source(side, row) or _cast_source(sides, side, row)
        if source is None or source["id"] in partner[side] or source.get("io") != "output":
            return row
        row = source
    return row


def _agrees(sides: Sides, side: str, top: Row, other_top: Row, partner: dict[str, dict[int, Row]]) -> bool:
    """False when ``top`` is a cast or alias of a value already paired, and ``other_top`` does
    not hold that partner's values (itself, or through its own casts and aliases).

    Such a ``top`` can only stand for its source's partner. Where a bf16 model sums two
    gradients once (after casting) and the float32 run adds them in place one by one, the
    sums' inputs pair by position but hold other values; their producers must not pair."""
    source = sides.alias_source(side, top) or _cast_source(sides, side, top)
    if source is None or source["id"] not in partner[side]:
        return True
    want = partner[side][source["id"]]["id"]
    other = "reference" if side == "target" else "target"
    row: Row | None = other_top
    for _ in range(_MAX_WALK):
        if row is None:
            return False
        if row["id"] == want:
            return True
        row = sides.alias_source(other, row) or _cast_source(sides, other, row)
    return False


def _cast_source(sides: Sides, side: str, row: Row) -> Row | None:
    """The output a cast's output ``row`` holds the values of, rounded, if any."""
    if row.get("io") != "output" or base_op(row.get("op")) not in CASTS:
        return None
    inputs = sides.tensor_inputs(side, row)
    if len(inputs) != 1 or inputs[0].get("numel") != row.get("numel"):
        return None
    source = sides.producer(side, inputs[0])
    return source if source is not None and same_shape(source, row) else None


def _same_layout_inputs(sides: Sides, top_t: Row, top_r: Row) -> list[tuple[Row, Row]]:
    """The input pair of the same single-input layout or reshape op on both sides."""
    op_t, op_r = base_op(top_t.get("op")), base_op(top_r.get("op"))
    kinds = LAYOUT | ORDER_KEEPING
    if op_t not in kinds or op_r not in kinds:
        return []
    if op_t != op_r and not (op_t in ORDER_KEEPING and op_r in ORDER_KEEPING):
        return []
    if op_t in LAYOUT and top_t.get("args") != top_r.get("args"):
        return []
    in_t, in_r = sides.tensor_inputs("target", top_t), sides.tensor_inputs("reference", top_r)
    if len(in_t) != 1 or len(in_r) != 1 or not same_shape(in_t[0], in_r[0]):
        return []
    return [(in_t[0], in_r[0])]


def inserted(sides: Sides, side: str, input_row: Row, out_row: Row,
             partner: dict[str, dict[int, Row]]) -> bool:
    """True when the other side feeds this op's consumers straight from its input's partner.

    ``input_row`` is the one-sided op's main input, whose producer has a partner; walking on
    through other one-sided ops, every paired consumer of ``out_row`` must read, on the
    other side, that partner (or a value-keeping alias of it). Then nothing stands in this
    op's place on the other side: it was inserted.
    """
    other = "reference" if side == "target" else "target"
    producer = input_row.get("producer")
    source = partner[side].get(producer) if producer is not None else None
    if source is None:
        return False
    found = False
    frontier, seen = [out_row], set()
    for _ in range(_MAX_WALK):
        if not frontier:
            break
        row = frontier.pop()
        for consumer in sides.consumers[side].get(row["id"], []):
            paired = partner[side].get(consumer["id"])
            if paired is not None and paired.get("io") in INPUT_IO:
                if not _reads(sides, other, paired, source):
                    return False
                found = True
                continue
            for out in sides.call_rows[side][consumer["cseq"]]:
                if out.get("io") == "output" and out["id"] not in partner[side] \
                        and out["id"] not in seen and out.get("numel") == row.get("numel"):
                    seen.add(out["id"])
                    frontier.append(out)
    return found


def _reads(sides: Sides, side: str, consumer: Row, source: Row) -> bool:
    """Does ``consumer`` (an input row) read ``source``, directly or through aliases of it?"""
    row = sides.producer(side, consumer)
    for _ in range(_MAX_WALK):
        if row is None:
            return False
        if row["id"] == source["id"]:
            return True
        row = sides.alias_source(side, row, same_shape_only=False)
    return False
