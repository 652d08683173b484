"""Rows of two matched calls: which input or output of one goes with which of the other."""

from __future__ import annotations

from typing import Any

from opscope.compare.pair import OpCall, Pair

_OTHER_INPUT = {"input": "param", "param": "input"}


def pair_rows(a: OpCall, b: OpCall, kind: str, partner: dict) -> list[Pair]:
    """Rows of two matched calls pair by (io, slot); inputs passed by keyword by their keyword
    (a keyword that is None on one side, an attention mask under sdpa, is no tensor there and
    moves the later slots); a weight read directly (``param``) also pairs with the same slot
    read through a cast (``input``: mixed precision's autocast casts the weight on one side
    only) where neither call numbers a param and an input alike (a peer tool that counts
    params from 0 apart from inputs)."""
    r_by_slot = {(r.get("io"), r.get("slot")): r for r in b.rows}
    t_keys = {(t.get("io"), t.get("slot")) for t in a.rows}
    mapped = any("orig_op" in r or "orig_module" in r for r in a.rows)
    keyed = _names(a.rows) != _names(b.rows)
    out = []
    for t in a.rows:
        io, slot = t.get("io"), t.get("slot")
        r = r_by_slot.get((io, slot))
        if keyed and io == "input" and t.get("arg"):
            named = _same_keyword(t, a.rows, b.rows)
            r = named if named is not None or (r is not None and r.get("arg")) else r
        other = _OTHER_INPUT.get(str(io))
        if r is None and other is not None and (other, slot) not in t_keys:
            r = r_by_slot.get((other, slot))
        if r is not None and r["id"] not in partner["reference"]:
            partner["target"][t["id"]] = r
            partner["reference"][r["id"]] = t
            out.append(Pair(t, r, "mapped" if mapped else kind))
    return out


def _names(rows: list[dict[str, Any]]) -> list[Any]:
    return [r.get("arg") for r in rows if r.get("io") == "input"]


def _same_keyword(t: dict[str, Any], a_rows: list[dict[str, Any]],
                  b_rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The other call's input row of ``t``'s name, the same of its tensors (the n-th)."""
    arg = t["arg"]
    n = sum(1 for r in a_rows if r is not t and r.get("io") == "input" and r.get("arg") == arg
            and (r.get("slot") or 0) < (t.get("slot") or 0))
    found = [r for r in b_rows if r.get("io") == "input" and r.get("arg") == arg]
    return found[n] if n < len(found) else None
