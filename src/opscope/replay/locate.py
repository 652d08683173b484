"""Which call an id names: ``first``, a culprit's position (``3``), or ``rank:step:seq``
(``r`` before the seq when it is the reference's), from a compare result or its summary.json.

No torch here.
"""

from __future__ import annotations

import re
from typing import Any

from opscope.errors import ReplayError

_ID = re.compile(r"^(\d+):(\d+):(r?)(\d+)$")


def locate(source: Any, op_id: str) -> Any:
    """A :class:`~opscope.replay.engine.CallRef` for ``op_id``.

    Args:
        source: a :class:`~opscope.compare.result.CompareResult` or a summary.json dict.
        op_id: ``first``, a 1-based culprit number as the compare output lists them, or an id.
    """
    from opscope.replay.engine import CallRef

    culprits = _culprits(source)
    text = str(op_id).strip()
    finding = None
    if text == "first":
        finding = _get(source, "first_divergence")
        if finding is None:
            raise ReplayError("the comparison found no divergence: there is no first culprit to replay; "
                              "give --op rank:step:seq to replay any op")
    elif text.isdigit():
        n = int(text)
        if not 1 <= n <= len(culprits):
            raise ReplayError(f"--op {text}: the comparison lists {len(culprits)} culprits (1..{len(culprits)})")
        finding = culprits[n - 1]
    elif _ID.match(text):
        finding = next((c for c in culprits if _get(c, "id") == text), None)
    else:
        raise ReplayError(f"--op {text!r} is not an id: give first, a culprit number, or rank:step:seq "
                          "(as in the compare output)")
    if finding is not None:
        if _get(finding, "kind") == "root":
            raise ReplayError(f"{_get(finding, 'id')} is a root (a parameter or model input that already differs "
                              "at the start of the step), not an op: there is nothing to replay")
        calls = _get(finding, "calls") or {}
        if not calls:
            raise ReplayError(f"{_get(finding, 'id')}: the comparison did not record which calls to replay "
                              "(a summary.json from an older opscope); compare again")
        return CallRef(id=_get(finding, "id"), rank=int(_get(finding, "rank")), step=int(_get(finding, "step")),
                       phase=_get(finding, "phase") or "", module=_get(finding, "module") or "",
                       op=_get(finding, "op") or "", seqs={s: (calls.get(s) or {}).get("seq") for s in calls})
    return _from_pairs(source, text)


def _from_pairs(source: Any, text: str) -> Any:
    from opscope.replay.engine import CallRef

    match = _ID.match(text)
    if match is None:  # locate() hands over ids of this form only
        raise ReplayError(f"--op {text!r} is not an id of the form rank:step:seq")
    rank, step, ref_side, seq = match.groups()
    table = getattr(source, "pairs_table", None)
    if table is None:
        raise ReplayError(f"{text} is not one of the culprits in this summary.json; replay it from the dumps "
                          "(without --summary) to look it up among every pair")
    mine, other = ("seq_reference", "seq_target") if ref_side else ("seq_target", "seq_reference")
    for row in table.to_pylist():
        if row["rank"] == int(rank) and row["step"] == int(step) and row.get(mine) == int(seq) \
                and row.get("io") == "output":
            seqs = {mine[4:]: int(seq), other[4:]: row.get(other) if row.get("kind") != "identity" else None}
            return CallRef(id=text, rank=int(rank), step=int(step), phase=row.get("phase") or "",
                           module=row.get("module") or "", op=row.get("op") or "", seqs=seqs)
    raise ReplayError(f"no op call with id {text} (rank:step:seq) produced an output in the comparison")


def _culprits(source: Any) -> list[Any]:
    return list(_get(source, "culprits") or [])


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
