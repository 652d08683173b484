"""Which op calls of two sides may pair: the same op (or its in-place twin) with outputs of
the same shapes. The sequence alignment of :mod:`opscope.compare.align` asks it of every
pair of calls in a group, so :func:`matchable_table` judges each kind of call once."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from opscope.compare.pair import OpCall  # outputs compared as flow.same_shape does


def same_ops(tc: list[OpCall], rc: list[OpCall]) -> bool:
    """Calls that pair one to one, in order."""
    return all(matchable(a, b) for a, b in zip(tc, rc))


def matchable(a: OpCall, b: OpCall) -> bool:
    """Same op, and outputs of the same shapes (a reordered sequence must not pair by name;
    a [4, 16, 32] view is not a [8, 16, 16] view, whatever their element counts). A module's
    call may return more tensors on one side, after those both return (eager attention's
    weights, None under sdpa)."""
    return _same_op(a.op, b.op) and _outputs_match(a.op, _outputs(a), _outputs(b))


def _same_op(a: str, b: str) -> bool:
    """The same op, or an aten op and its in-place form (``add`` / ``add_``): the same values.
    The autograd engine sums a tensor's gradients with ``add_`` where it may reuse the buffer
    and ``add`` where not, which one depending on the graph around it (a fault elsewhere
    swaps them)."""
    if a == b:
        return True
    pa, pb = a.split("."), b.split(".")
    return len(pa) == len(pb) == 3 and pa[0] == pb[0] == "aten" and pa[2] == pb[2] \
        and pa[1] != pb[1] and pa[1].rstrip("_") == pb[1].rstrip("_") and not pa[1].startswith("__")


def matchable_table(tc: list[OpCall], rc: list[OpCall]) -> list[list[bool]]:
    """``matchable(tc[i], rc[j])`` for every i, j, judged once per pair of distinct kinds of
    call (op, outputs' shapes and element counts) whose ops are the same: the sequence
    alignment asks it of every cell (1M times over a test file's comparisons)."""
    kt, ft = _kinds(tc)
    kr, fr = _kinds(rc)
    by_op: dict[str, list[int]] = defaultdict(list)
    for b, (op, _) in enumerate(fr):
        by_op[op].append(b)
    rows: dict[int, list[bool]] = {}  # one row per kind of target call, shared (read only)
    for a in set(kt):
        op, outs = ft[a]
        yes = {b for other, kinds in by_op.items() if _same_op(op, other)
               for b in kinds if _outputs_match(op, outs, fr[b][1])}
        rows[a] = [b in yes for b in kr]
    return [rows[a] for a in kt]


_Outputs = tuple[tuple[Any, Any], ...]


def _kinds(calls: list[OpCall]) -> tuple[list[int], list[tuple[str, _Outputs]]]:
    """Each call's kind (an index), and each kind's op and outputs' (shape, element count)."""
    ids: dict[tuple[str, _Outputs], int] = {}
    out = [ids.setdefault((call.op, _outputs(call)), len(ids)) for call in calls]
    return out, list(ids)


def _outputs(call: OpCall) -> _Outputs:
    """Each output's (shape, element count): what same_shape compares."""
    return tuple((None if r.get("shape") is None else tuple(int(x) for x in r["shape"]), r.get("numel"))
                 for r in call.outputs())


def _outputs_match(op: str, oa: _Outputs, ob: _Outputs) -> bool:
    """The outputs' test: as many on both sides (a module's call may return more on one, after
    those both return), and same_shape on each (shapes, or element counts where one has none)."""
    if len(oa) != len(ob) and ("." in op or not oa or not ob):
        return False
    return all(na == nb if sa is None or sb is None else sa == sb for (sa, na), (sb, nb) in zip(oa, ob))
