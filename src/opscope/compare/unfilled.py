"""Reads of memory that an op left holding no data: an empty (``torch.empty_like``,
``Tensor.new(*size)``), or one an in-place op wrote only in part (``scatter_`` into an empty);
and, at the api level, of a tensor a call wrote in place and did not return
(``Tensor.__setitem__``: model/records.py ``WRITTEN_NOTE``), judged alike.

The capture records such an output unmeasured (model/records.py ``UNINITIALIZED_NOTE``) and
measures the memory at its next read, with that output's row for its producer (since session
28; before, the read had no producer and a difference there was named a root). Judged here, a
read that differs carries the divergence of the op that left it where that op's inputs carry
one (Reformer's inverse permutation, scattered from a sort of randomly rotated buckets), and
passes where it is in proportion to what that op read (an index a near tie of a router chose
otherwise: Jamba's experts write their outputs into an empty by ``index_put_``); where they agree,
that op is the culprit: it left bytes no op wrote (a part of an empty never written, which
differs from run to run) or that code no op records filled (a custom kernel writing an
empty_like's memory).
"""

from __future__ import annotations

import math
from typing import Any

from opscope.compare.align import INPUT_IO, Pair
from opscope.compare.blame import finding_of
from opscope.compare.state import Node, VerdictState, frees_reader, join, made_with_note, raw_error
from opscope.model.records import UNINITIALIZED_NOTE, WRITTEN_NOTE


def left_by(state: VerdictState, node: Node, row: dict[str, Any]) -> dict[str, Any] | None:
    """The output row, holding no data, of the op whose memory input ``row`` reads (measured at
    this, its next read), or None."""
    return made_with_note(state, node, row, UNINITIALIZED_NOTE) or made_with_note(state, node, row, WRITTEN_NOTE)


def judge_unfilled(state: VerdictState, node: Node, own: Pair, made: dict[str, Any]) -> bool:
    """Judge a read of memory that ``made``'s op left holding no data; True when it carries a
    divergence (inherited from that op's inputs, or that op named a culprit)."""
    t, r = own.rows
    own.error = raw_error(own)
    own.tolerance = state.noise.tolerance(state.noise.lower_dtype(t.get("dtype"), r.get("dtype")))
    if own.metrics.get("bit_exact"):
        return False
    op = made.get("op")
    rows = [x for x in state.calls.get((node.side, node.rank, node.step, made["cseq"]), []) if x.get("io") in INPUT_IO]
    inputs = [state.entry.get((node.side, node.rank, node.step, x["id"])) for x in rows]
    if any(p is not None and id(p) in state.tainted for p in inputs):
        own.status, own.verdict = "failed", "inherits"
        own.note = join(own.note, f"left by {op}, whose inputs carry a divergence")
        state.tainted.add(id(own))
        return True
    if not own.error > own.tolerance:
        return False
    in_error = max((_error(row, p) for row, p in zip(rows, inputs)), default=0.0)
    if not own.error > max(own.tolerance, state.noise.ratio * in_error):
        # in proportion to what the op read (an index a near tie of the router chose otherwise:
        # Jamba's experts write their outputs into an empty by index_put_)
        own.status = "passed"
        own.note = join(own.note, f"left by {op}, in proportion to the error of its inputs")
        return False
    own.status, own.verdict = "failed", "inherits"
    state.tainted.add(id(own))
    state.findings.append(_culprit(node, own, made))
    return True


def _culprit(node: Node, own: Pair, made: dict[str, Any]) -> Any:
    """The op that left the memory, named for the read ``own`` that differs while it read agrees."""
    op, reader = made.get("op"), node.rows[0].get("op")
    score = own.error / own.tolerance if math.isfinite(own.error) and own.tolerance > 0 else math.inf
    found = finding_of("culprit", made, own, score)
    if made.get("note") == WRITTEN_NOTE:
        own.note = join(own.note, f"written in place by {op}, read here")
        found.note = (f"{op} wrote this tensor in place and returned nothing; what {reader} reads from it next "
                      f"differs while what {op} read agrees")
    else:
        own.note = join(own.note, f"memory {op} left holding no data (uninitialized), read here")
        found.note = (f"{op} left memory that holds no data (an empty, or one it wrote only in part), and what "
                      f"is read from it at {reader} differs while {op}'s inputs agree: bytes no op wrote (they "
                      "differ from run to run), or code that no op records filled it (a custom kernel)")
    return found


def _error(row: dict[str, Any], pair: Pair | None) -> float:
    """What an input of the op that left the memory carries: its error; an index or mask that
    differs frees what the op writes (state.frees_reader), and an input unpaired is unknown."""
    if pair is None or not pair.metrics:
        return 0.0 if row.get("note") else math.inf  # (an argument not measured: the empty itself)
    error = raw_error(pair)
    return math.inf if frees_reader(row, pair, error) else error
