"""Reads of a parameter paired by its name (an alignment rule, docs/compare.md "Alignment").

- A phase's first read of a parameter on each side: a call with no partner (an inductor
  graph, whose inputs are the weights it reads) still reads the same weights.
- The first read after each in-place write that only one side made (``weight[1] += 0.05``
  between steps, a mask applied by hand): paired with the other side's first read, so the
  edited weight is compared with the weight the other run reads, also where the edited one
  is read only through a cast one side makes (autocast), which pairs with nothing.
"""

from __future__ import annotations

from typing import Any

from opscope.compare.flow import Sides, base_op, same_shape
from opscope.compare.pair import Pair

Row = dict[str, Any]
Key = tuple[Any, str]  # (phase, parameter name)


def written_in_place(row: Row | None) -> bool:
    """Is ``row`` the output of an op that writes its first argument in place (``add_``,
    ``copy_``, ``__setitem__``)?"""
    if row is None or row.get("io") != "output":
        return False
    return base_op(row.get("op")).endswith("_") or "setitem" in str(row.get("op"))


def parameter_pairs(t_rows: list[Row], r_rows: list[Row], sides: Sides,
                    partner: dict[str, dict[int, Row]]) -> list[Pair]:
    """The pairs of parameter reads by name (the module's docstring), for one partition."""
    t_first, t_written = _reads(sides, "target", t_rows)
    r_first, r_written = _reads(sides, "reference", r_rows)
    out = []
    for key, t in t_first.items():
        r = r_first.get(key)
        if r is None or not same_shape(t, r) or partner["target"].get(t["id"]) is r:
            continue
        t_free, r_free = t["id"] not in partner["target"], r["id"] not in partner["reference"]
        if t_free and r_free:
            partner["target"][t["id"]], partner["reference"][r["id"]] = r, t
            out.append(Pair(t, r, "flow"))
        elif t_free or r_free:
            # one side reads the weight through a cast (autocast) whose output pairs with the
            # other side's read: the weights themselves still pair, or a changed one is no root
            out.append(Pair(t, r, "flow"))
    for mine, theirs, first, side in ((t_written, r_written, r_first, "target"),
                                      (r_written, t_written, t_first, "reference")):
        for key, rows in mine.items():
            other = first.get(key)
            if key in theirs or other is None:
                continue
            for row in rows:
                if row["id"] not in partner[side] and same_shape(row, other):
                    out.append(Pair(row, other, "flow") if side == "target" else Pair(other, row, "flow"))
    return out


def _reads(sides: Sides, side: str, rows: list[Row]) -> tuple[dict[Key, Row], dict[Key, list[Row]]]:
    """Per (phase, parameter): its first read, and the first read after each in-place write."""
    first: dict[Key, Row] = {}
    written: dict[Key, list[Row]] = {}
    writers: set[Any] = set()
    for row in sorted(rows, key=lambda r: r["seq"]):
        if row.get("io") != "param" or not row.get("param"):
            continue
        key = (row.get("phase"), row["param"])
        first.setdefault(key, row)
        producer = row.get("producer")
        if producer not in writers and written_in_place(sides.producer(side, row)):
            writers.add(producer)
            written.setdefault(key, []).append(row)
    return first, written
