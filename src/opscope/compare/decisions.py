"""An activation's backward whose mask came out otherwise where the forward sat at its threshold.

ReLU's backward (``threshold_backward``: the gradient where the forward's input is above the
threshold, zero elsewhere) is exact, but what it keeps is a decision: an element of the
forward that one run rounds to just above zero and the other to zero or below (a float16 run
against a float32 one: T5's feed-forward under float16 AMP, 3.4e-5 in float32 and 0 in
float16) keeps its whole gradient in one run and drops it in the other. One such element of
2048 moved T5's output by 3.4% where the rest agreed within 6e-4, and the op was named a
culprit. Statistics cannot tell that apart from a wrong op; the full tensors can.

:func:`settle` looks again at each such culprit where both dumps hold its tensors. It is no
culprit when, on each side, the output is exactly the gradient kept where that side's
forward is above the threshold (the op did what it should), both sides were called with one
threshold, the forward's values agreed within tolerance, and every element whose decision
differs sits within four root-mean-square differences of the two runs' forward values from
the threshold (one corrupted element is not such a difference). Such a
finding leaves the culprits for a note that says so; the pairs table keeps its own verdict.
At the api level a ReLU call's backward records the gradients only: the forward's values are
the output of the forward call it belongs to (:func:`_forward_output`), above zero where kept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opscope.compare.call_args import scalars
from opscope.compare.flow import base_op
from opscope.compare.pair import SIDES

GATES = frozenset({"threshold_backward"})  # out = grad_output where self > threshold, else 0
# API calls whose backward (the api level's record: the gradient in, the gradient out) keeps the
# gradient where the forward's output is above zero: the forward call's output row holds the mask
API_GATES = frozenset({"relu"})
LOOKED = 64  # such culprits looked at, at most (each reads its call's records and tensors)
SPREAD = 4.0  # a decision flips within this many root-mean-square differences of the forward's values


def settle(findings: list[Any], dumps: tuple[Any, Any]) -> tuple[list[Any], list[str]]:
    """(the findings still culprits or roots, a note for each that was a decision instead)."""
    kept, notes, looked = [], [], 0
    for f in findings:
        gate = _gate(f) and looked < LOOKED
        looked += gate
        said = _decision(f, dict(zip(SIDES, dumps, strict=True))) if gate else None
        if said:
            notes.append(said)
        else:
            kept.append(f)
    return kept, notes


def _gate(f: Any) -> bool:
    if not (f.kind == "culprit" and f.side == "both" and f.metrics.get("mode") == "tensor"):
        return False
    if f.phase == "backward" and base_op(f.op) in API_GATES:
        return True  # (its forward's output is found by _forward_output; judged untainted, or no culprit)
    forward = [i for i in f.inputs if i.get("slot") == 1]  # the forward's values (self)
    return base_op(f.op) in GATES and len(forward) == 1 and forward[0].get("status") in ("identical", "passed")


def _call(table: Any, seq: int | None) -> dict[tuple[str, int], dict[str, Any]]:
    """The rows of call ``seq`` in one partition's ``table``, by (io, slot)."""
    import pyarrow.compute as pc

    if seq is None:
        return {}
    rows = table.filter(pc.equal(table["seq"], seq)).to_pylist()
    return {(row["io"], row["slot"]): row for row in rows}


def _threshold(row: dict[str, Any]) -> float | None:
    """The threshold the call was given (argument 2, or the keyword)."""
    given = scalars(row)
    return given.get("2", given.get("threshold"))


def _forward_output(table: Any, back: dict[str, Any]) -> dict[str, Any] | None:
    """The output row of the forward call whose backward made row ``back`` (the api level): the
    k-th of the step's backward calls of its op in its module is the forward's k-th from the
    last, where both count alike (what it is then is checked: the output must be the gradient
    kept where that forward's output is above zero)."""
    import pyarrow.compute as pc

    mine = pc.and_(pc.equal(table["op"], back["op"]), pc.equal(table["module"], back["module"]))
    rows = table.filter(pc.and_(mine, pc.equal(table["io"], "output"))).to_pylist()
    forward = [r for r in rows if r["phase"] == "forward" and r["slot"] == 0]
    backward = [r["seq"] for r in rows if r["phase"] == "backward" and r["slot"] == 0]
    if back["seq"] not in backward or len(forward) != len(backward):
        return None
    return sorted(forward, key=lambda r: r["seq"])[len(forward) - 1 - sorted(backward).index(back["seq"])]


def _decision(f: Any, dumps: dict[str, Any]) -> str | None:
    arrays, thresholds = {}, set()
    api = base_op(f.op) in API_GATES
    for side in SIDES:
        table = dumps[side].records(rank=f.rank, step=f.step)  # (read once: the call's rows, its forward's)
        call = _call(table, (f.calls.get(side) or {}).get("seq"))
        if api:  # (the gradient, the forward's output, the gradient kept; threshold zero)
            grad, out = call.get(("input", 0)), call.get(("output", 0))
            x = _forward_output(table, out) if out is not None else None
            rows = [row for row in (grad, x, out) if row is not None]
        else:
            rows = [row for key in (("input", 0), ("input", 1), ("output", 0)) if (row := call.get(key)) is not None]
        if len(rows) < 3 or not all(row.get("data") for row in rows):
            return None
        try:
            arrays[side] = [np.asarray(dumps[side].row_tensor(row), np.float64) for row in rows]
        except (OSError, KeyError, ValueError):
            return None
        thresholds.add(0.0 if api else _threshold(rows[2]))
    threshold = thresholds.pop() if len(thresholds) == 1 else None
    return None if threshold is None else _flips(f, arrays, threshold)


def _flips(f: Any, arrays: dict[str, list[np.ndarray]], threshold: float) -> str | None:
    (g_t, x_t, out_t), (g_r, x_r, out_r) = arrays["target"], arrays["reference"]
    if not x_t.shape == x_r.shape == out_t.shape == out_r.shape:
        return None
    for g, x, out in ((g_t, x_t, out_t), (g_r, x_r, out_r)):
        if not np.array_equal(out, np.where(x > threshold, g, 0.0)):
            return None  # the op did not keep exactly the gradient its own forward asks for
    flipped = (x_t > threshold) != (x_r > threshold)
    apart = np.abs(x_t - x_r)
    within = SPREAD * float(np.sqrt(np.mean(apart**2)))  # the runs' typical difference, not one outlier's
    if not flipped.any() or not np.all(np.abs(x_r - threshold)[flipped] <= within):
        return None
    return (f"rank {f.rank} step {f.step}: {f.op} in {f.module or '(top level)'} ({f.phase}) is no culprit: "
            f"it kept the gradient otherwise at {int(flipped.sum())} of {flipped.size} elements, where the "
            f"forward's values sit at the threshold {threshold:g} within the two runs' difference (at most "
            f"{float(np.abs(x_r - threshold)[flipped].max()):.3g} from it, the runs {within / SPREAD:.3g} apart "
            f"root mean square); each run's output is exactly its gradient where its own forward is above the "
            f"threshold, so one run keeps a gradient there that the other drops, a decision of the rounding")
