"""Tensor layouts of a Keras dump against a PyTorch port: the Keras tensor of a pair is read
in the torch layout before element-wise metrics are taken.

- **Channels-last activations**: a convolution's or pooling layer's tensors (``data_format``
  ``channels_last``, Keras' default) are ``[N, H, W, C]`` where torch's are ``[N, C, H, W]``.
  A Keras tensor is channels-last when a spatial layer
  (:data:`~opscope.compare.crossframework.tables.keras.SPATIAL`) reads or writes it, or when
  a layer that keeps its shape (an activation, a batch norm, dropout) reads a channels-last
  tensor; a ``Flatten`` of one holds its elements in ``H, W, C`` order, which the torch
  ``Flatten`` of ``[N, C, H, W]`` holds as ``C, H, W``. Such a tensor is read permuted
  (``[0, rank-1, 1, ..., rank-2]``, before flattening). Where shapes say nothing (a square
  ``[N, 4, 4, 4]``), the kind decides; where they differ and the permutation makes them
  equal, the shapes decide (a custom layer too).
- **Kernels**: a Keras ``kernel`` is ``(in, out)`` (``Dense``) or ``(kh, kw, in, out)``
  (``Conv2D``), a torch ``weight`` ``(out, in)`` / ``(out, in, kh, kw)``: its gradient is
  read with the axes ``[rank-1, rank-2, 0, ..., rank-3]``.

Statistics do not depend on the layout; a pair is only re-read (through the record's
``view`` geometry, which the reader applies) when both sides hold full tensors.
"""

from __future__ import annotations

import json
from typing import Any

from opscope.compare.align import Pair
from opscope.compare.crossframework.layers import exit_seq, layer_args
from opscope.compare.crossframework.sides import Side, is_forward
from opscope.compare.crossframework.tables.keras import SPATIAL


def apply_layouts(pairs: list[Pair], foreign: Side) -> None:
    """Give the Keras row of each pair the ``view`` that reads it in its torch partner's layout."""
    layout = channels_last(foreign)
    target_is_foreign = foreign.name == "target"
    for pair in pairs:
        if pair.t is None or pair.r is None:
            continue
        f_row, p_row = (pair.t, pair.r) if target_is_foreign else (pair.r, pair.t)
        if not f_row.get("data") or not p_row.get("data") or f_row.get("view"):
            continue
        source_of = f_row.get("layer_input") if f_row.get("io") in ("grad", "param") else f_row["id"]
        perm, source = _permutation(f_row, p_row, layout.get(source_of) if source_of is not None else None)
        if perm is not None:
            f_row["view"] = json.dumps(_geometry(source, perm))
            f_row["hash"] = None  # the hash is of the stored order: equal hashes prove nothing now
            pair.note = "; ".join(n for n in (pair.note, f"Keras tensor read as {_axes(source, perm)}") if n)


def channels_last(side: Side) -> dict[int, list[int]]:
    """Keras row id -> the channels-last shape whose element order the row's data has."""
    out: dict[int, list[int]] = {}
    for call in sorted((c for c in side.calls if is_forward(c)), key=exit_seq):
        ins = [r for r in call.inputs() if r.get("io") == "input"]
        for row in ins:
            if row.get("producer") is not None and row["producer"] in out:
                out[row["id"]] = out[row["producer"]]
        spatial = call.op in SPATIAL and layer_args(call).get("data_format", "channels_last") == "channels_last"
        first = out.get(ins[0]["id"]) if ins else None
        for row in ins if spatial else ():
            if len(row.get("shape") or []) >= 3:
                out[row["id"]] = list(row["shape"])
        for row in call.outputs():
            shape = list(row.get("shape") or [])
            if spatial and len(shape) >= 3:
                out[row["id"]] = shape
            elif first is not None and ins and row.get("numel") == ins[0].get("numel") \
                    and (shape == list(ins[0].get("shape") or []) or call.op == "Flatten"):
                out[row["id"]] = first
    _same_tensors(side, out)
    return out


def _same_tensors(side: Side, out: dict[int, list[int]]) -> None:
    """A model's own input and output rows are its layers' tensors again (same content)."""
    by_hash = {(side.by_id[i].get("hash"), side.by_id[i].get("numel")): shape for i, shape in out.items()
               if side.by_id.get(i) is not None and side.by_id[i].get("hash") is not None}
    for row in side.rows:
        if row["id"] not in out and row.get("hash") is not None and is_forward_row(row):
            shape = by_hash.get((row.get("hash"), row.get("numel")))
            if shape is not None:
                out[row["id"]] = shape


def is_forward_row(row: dict[str, Any]) -> bool:
    return (row.get("phase") or "forward") == "forward"


def _permutation(f_row: dict[str, Any], p_row: dict[str, Any],
                 source: list[int] | None) -> tuple[list[int] | None, list[int]]:
    """The axes to read the Keras row with (None: as it is) and the shape they apply to."""
    shape, other = list(f_row.get("shape") or []), list(p_row.get("shape") or [])
    if f_row.get("io") in ("grad", "param"):
        return _kernel(f_row, shape, other, source)
    cl = None if len(shape) < 3 else [0, len(shape) - 1, *range(1, len(shape) - 1)]
    if source is None:  # the shapes decide
        return (cl, shape) if cl and shape != other and [shape[k] for k in cl] == other else (None, shape)
    perm = [0, len(source) - 1, *range(1, len(source) - 1)]
    if source == shape and [shape[k] for k in perm] != other:
        return None, shape  # the port keeps this tensor channels-last too
    return perm, source


def _kernel(f_row: dict[str, Any], shape: list[int], other: list[int],
            source: list[int] | None) -> tuple[list[int] | None, list[int]]:
    """A kernel (or its gradient) in torch's layout: ``(in, out)`` -> ``(out, in)``,
    ``(kh, kw, in, out)`` -> ``(out, in, kh, kw)``; a Dense kernel whose input is a flattened
    channels-last ``[N, H, W, C]`` has its rows in ``H, W, C`` order: read as ``(H, W, C, out)``
    -> ``(out, C, H, W)``; an ``EinsumDense`` kernel against a 2-D weight moves its output axes
    first (``(d, heads, head_dim)`` -> ``(heads, head_dim, d)``)."""
    if not str(f_row.get("orig_param") or f_row.get("param") or "").endswith("kernel") or len(shape) < 2 \
            or _numel(shape) != _numel(other):
        return None, shape
    if len(shape) == 2 and source is not None and len(source) >= 3 and _numel(source[1:]) == shape[0]:
        shape = [*source[1:], shape[1]]
    elif len(shape) != len(other):
        cut = next((k for k in range(1, len(shape)) if len(other) == 2 and _numel(shape[:k]) == other[1]
                    and _numel(shape[k:]) == other[0]), None)
        return (None, shape) if cut is None else ([*range(cut, len(shape)), *range(cut)], shape)
    rank = len(shape)
    perm = [1, 0] if rank == 2 else [rank - 1, rank - 2, *range(rank - 2)]
    return (perm, shape) if [shape[k] for k in perm] == other or rank > len(other) else (None, shape)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _geometry(shape: list[int], perm: list[int]) -> dict[str, Any]:
    strides, step = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        strides[k], step = step, step * max(shape[k], 1)
    return {"shape": [shape[k] for k in perm], "stride": [strides[k] for k in perm], "offset": 0}


def _axes(shape: list[int], perm: list[int]) -> str:
    return f"{shape} transposed {perm}"


__all__ = ["apply_layouts", "channels_last"]
