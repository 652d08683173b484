"""Attention rows that a mask leaves without any key.

A query whose every key is masked has no defined attention output. It happens wherever a
batch is padded on the left under a causal mask: a pad position comes before every real
token, and the padding mask hides the pads as keys. Implementations fill such rows by their
own convention. PyTorch's ``scaled_dot_product_attention`` writes zeros. An eager softmax
over keys that all hold the mask's fill (``finfo.min``) weighs them alike and writes the mean
of the values. So a model run with eager attention differs from the same model under SDPA in
those rows, however right both are elsewhere. Where the loss reads a padded position, the
losses differ too: a causal LM predicts the first real token of a left-padded row from the
pad before it.

:func:`explain` looks at each culprit that read an attention mask, finds the query rows the
mask leaves empty, and says when the culprit's difference lies only there. With full tensors
on both sides, the rest must agree within the culprit's own allowance. From statistics alone
the evidence is weaker: one side's output holds whole rows of zeros that the other's lacks.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opscope.compare.pair import SIDES
from opscope.compare.state import join

MASK_ARGS = frozenset({"attn_mask", "attention_mask"})
FILL = -1e4  # at or below this, an additive mask's entry hides its key (finfo.min, -inf, -10000)
HIDES = ("What follows from these rows can hide a difference downstream: to judge the rest, compare "
         "runs that fill them alike (one attention implementation on both sides) or whose batches are "
         "padded on the right (a causal mask then leaves no query without a key)")
LOOKED = 64  # attention culprits looked at, at most (each reads its step's records on both sides)
Rows = dict[tuple[str, int, int], list[dict[str, Any]]]


def explain(culprits: list[Any], dumps: tuple[Any, Any], ratio: float) -> None:
    """Add to each culprit that read an attention mask the rows that mask leaves empty, where
    the culprit differs only there. ``ratio``: the noise model's input-to-output allowance."""
    cache: Rows = {}
    looked = sorted((f for f in culprits if f.kind == "culprit" and f.outputs and _reads_attention(f)),
                    key=lambda f: (f.rank, f.step))
    for f in looked[:LOOKED]:
        if not any(key[1:] == (f.rank, f.step) for key in cache):
            cache.clear()  # one partition's records held at a time
        said = _note(f, dict(zip(SIDES, dumps, strict=True)), cache, ratio)
        if said:
            f.note = join(f.note, said)


def _reads_attention(f: Any) -> bool:
    """Whether either side's call is an attention (or read a mask): the others' records are not read."""
    calls = [(f.calls.get(side) or {}).get("capture") or [] for side in SIDES]
    return (any(i.get("arg") in MASK_ARGS for i in f.inputs)
            or any(keys and "attention" in str(keys[0][2]).lower() for keys in calls))


def _note(f: Any, dumps: dict[str, Any], cache: Rows, ratio: float) -> str | None:
    rows = {side: _records(dumps[side], cache, side, f.rank, f.step) for side in SIDES}
    masks = [(side, row) for side in SIDES for row in rows[side] if _mask_of(row, f, side)]
    compared = {side: _compared(rows[side], f, side) for side in SIDES}
    t, r = compared["target"], compared["reference"]
    if not masks or t is None or r is None:
        return None
    if t.get("data") and r.get("data"):
        for side, mask in masks:
            if mask.get("data"):
                return _from_tensors(f, dumps, (side, mask), t, r, ratio)
    return _from_statistics(masks, t, r)


def _records(dump: Any, cache: Rows, side: str, rank: int, step: int) -> list[dict[str, Any]]:
    key = (side, rank, step)
    if key not in cache:
        cache[key] = dump.records(rank=rank, step=step).to_pylist()
    return cache[key]


def _mask_of(row: dict[str, Any], f: Any, side: str) -> bool:
    """Whether ``row`` is an attention mask read by the culprit's call on ``side`` (its module's
    call, where the culprit is that module's own code)."""
    if row.get("io") != "input" or row.get("arg") not in MASK_ARGS or len(row.get("shape") or []) < 3:
        return False
    return row.get("seq") == (f.calls.get(side) or {}).get("seq") or (
        row.get("phase") == f.phase and row.get("module") == f.module and row.get("op") == f.op
        and row.get("call") == f.call)


def _compared(rows: list[dict[str, Any]], f: Any, side: str) -> dict[str, Any] | None:
    """The record of one side that the culprit's worst tensor was measured from."""
    seq = (f.calls.get(side) or {}).get("seq")
    out = next((o for o in f.outputs if (o.get("io"), o.get("slot")) == (f.io, f.slot)), f.outputs[0])
    mine = [row for row in rows if row.get("seq") == seq and row.get("io") == out.get("io")]
    for row in mine:
        if row.get("slot") == out.get("slot"):
            return row
    return next((row for row in mine if list(row.get("shape") or []) == out.get("shape")), None)


def empty_rows(mask: np.ndarray) -> np.ndarray:
    """Per query row (the mask's last axis is the keys): True where every key is hidden."""
    hidden = ~mask.astype(bool) if mask.dtype == bool else np.asarray(mask, np.float64) <= FILL
    return np.asarray(hidden.all(axis=-1))


def rows_of(empty: np.ndarray, shape: list[int]) -> np.ndarray | None:
    """``empty`` ([batch, heads or 1, queries]) laid over the rows of a tensor of ``shape``:
    ``[batch, heads, queries, x]`` as attention writes it, ``[batch, queries, x]`` once the
    heads are merged (a row empty for every head). None where they do not line up."""
    lead = tuple(shape[:-1])
    if empty.ndim == 3 and len(lead) == 2:
        empty = np.asarray(empty.all(axis=1))
    try:
        return np.broadcast_to(empty, lead) if empty.ndim == len(lead) else None
    except ValueError:
        return None


def _from_tensors(f: Any, dumps: dict[str, Any], mask: tuple[str, dict[str, Any]], t: dict[str, Any],
                  r: dict[str, Any], ratio: float) -> str | None:
    try:
        empty = empty_rows(np.asarray(dumps[mask[0]].row_tensor(mask[1])))
        x_t = np.asarray(dumps["target"].row_tensor(t), dtype=np.float64)
        x_r = np.asarray(dumps["reference"].row_tensor(r), dtype=np.float64)
    except (OSError, KeyError, ValueError):  # a shard gone since: no note
        return None
    where = rows_of(empty, list(x_t.shape)) if x_t.shape == x_r.shape else None
    if where is None or not where.any():
        return None
    diff = x_t - x_r
    rest = float(np.linalg.norm(diff[~where])) / max(float(np.linalg.norm(x_r[~where])), 1e-300)
    allowed = max(float(f.metrics.get("tolerance") or 0.0), ratio * float(f.metrics.get("input_error") or 0.0))
    if not math.isfinite(rest) or rest > allowed or not np.any(diff[where]):
        return None
    zeros = [side for side, x in (("target", x_t), ("reference", x_r)) if not np.any(x[where])]
    return (f"only the {int(where.sum())} of {where.size} query rows that its attention mask leaves without "
            f"any key differ (the rest within {allowed:.3g}){_convention(zeros)}")


def _from_statistics(masks: list[tuple[str, dict[str, Any]]], t: dict[str, Any], r: dict[str, Any]) -> str | None:
    width = int((t.get("shape") or [0])[-1] or 0)
    more = int(t.get("zeros") or 0) - int(r.get("zeros") or 0)
    if not any(_hides(row) for _, row in masks) or width <= 0 or abs(more) < width or more % width:
        return None
    side = "target" if more > 0 else "reference"
    return (f"the tensor it differs in holds {abs(more) // width} rows of zeros more in the {side} "
            f"({abs(more)} zeros, rows of {width}), as scaled_dot_product_attention writes where its "
            f"attention mask leaves a query without any key (a left-padded row under a causal mask); "
            f"the other run fills such rows otherwise. Dump with data=\"tensor\" to see whether only "
            f"those rows differ. {HIDES}")


def _hides(mask: dict[str, Any]) -> bool:
    """Whether a mask's statistics show it hides any key (a False, or a fill at or below FILL)."""
    if mask.get("dtype") == "bool":
        return int(mask.get("zeros") or 0) > 0
    low = mask.get("min")
    return isinstance(low, (int, float)) and low <= FILL


def _convention(zeros: list[str]) -> str:
    """What each side wrote in the empty rows, and why that is no fault of the op."""
    said = (f": the {zeros[0]} writes zeros there, as scaled_dot_product_attention does, and the "
            f"{'reference' if zeros[0] == 'target' else 'target'} other values (an eager softmax over keys "
            f"that are all masked weighs them alike: the mean of the values)") if len(zeros) == 1 else ""
    return (f"{said}. Such a row (a left-padded position under a causal mask) has no defined output, and "
            f"each implementation fills it by its own convention; it reaches the loss only where the loss "
            f"reads a padded position (a causal LM predicts a left-padded row's first real token from the "
            f"pad before it). {HIDES}")
