"""How near the tie was, where a choice came out differently and both dumps kept its inputs.

A choice (:mod:`opscope.compare.carried`) is said in a comparison's notes from statistics
alone: its integer output differs while its float inputs differ only by rounding. Where both
dumps hold the full tensors of what an ``argmax`` or ``argmin`` chose from (``data="tensor"``),
the rows that chose differently are found again, and the note says by how much the
reference's choice led the target's there, against how far the two runs' values of those two
candidates moved: a greedy decoder's next token picked from two logits closer than the runs'
rounding.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from opscope.compare.flow import base_op

PICKS = {"argmax": np.argmax, "argmin": np.argmin}


def margin(decision: dict[str, Any], target: Any, reference: Any) -> str | None:
    """The tie in words, or None (another op, no full tensors, shapes that differ)."""
    pick = PICKS.get(base_op(decision.get("op")))
    rows = decision.get("rows")
    if pick is None or rows is None:
        return None
    t_in, r_in, t_out, _ = rows
    if not (t_in and r_in and t_in.get("data") and r_in.get("data")):
        return None
    try:
        x_t = np.asarray(target.row_tensor(t_in), dtype=np.float64)
        x_r = np.asarray(reference.row_tensor(r_in), dtype=np.float64)
    except (OSError, KeyError, ValueError):  # a shard gone since: the note stays without it
        return None
    if x_t.shape != x_r.shape or x_t.size == 0:
        return None
    x_t, x_r = _rows(x_t, _dim(t_out)), _rows(x_r, _dim(t_out))
    c_t, c_r = pick(x_t, axis=-1), pick(x_r, axis=-1)
    apart = np.nonzero(c_t != c_r)[0]
    if apart.size == 0:
        return None
    at = np.arange(x_r.shape[0])[apart]
    mine, theirs = c_r[apart], c_t[apart]  # (only these: masked candidates hold -inf on both sides)
    lead = np.abs(x_r[at, mine] - x_r[at, theirs])
    moved = np.abs(x_t[at, mine] - x_r[at, mine]) + np.abs(x_t[at, theirs] - x_r[at, theirs])
    size = np.abs(x_r[at, mine]).max()
    share = f" ({lead.max() / size:.2%} of its size)" if size > 0 else ""
    return (f"From the full tensors: {apart.size} of {x_r.shape[0]} rows chose differently; there the "
            f"reference's pick led the target's by at most {lead.max():.3g}{share}, while the two runs' "
            f"values of those two candidates moved by up to {moved.max():.3g} between them")


def _dim(row: dict[str, Any] | None) -> int | None:
    """The ``dim`` the call was given (argument 1 or the keyword), None: over all elements."""
    try:
        args = json.loads((row or {}).get("args") or "{}")
    except ValueError:
        return None
    value = dict(args.get("kwargs") or {}).get("dim")
    for position, given in args.get("args") or []:
        if position == 1:
            value = given
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rows(x: np.ndarray, dim: int | None) -> np.ndarray:
    """The candidates of each choice as the rows of a matrix."""
    if dim is None:
        return x.reshape(1, -1)
    x = np.moveaxis(x, dim, -1)
    return x.reshape(-1, x.shape[-1])
