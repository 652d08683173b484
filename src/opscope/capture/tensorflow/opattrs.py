"""An op's attributes and the inputs the dump does not record, as the ``args`` JSON of its rows.

Replay (:mod:`opscope.replay.tf_ops`) re-runs a recorded TensorFlow op from its input tensors,
which needs what else made it: its attributes (``MatMul``'s ``transpose_b``, ``Cast``'s
``DstT``, ``Einsum``'s ``equation``) and the inputs whose rows hold no tensor, the small
integer ones (a reduction's axes, ``Transpose``'s ``perm``, ``Reshape``'s shape, which have no
rows) and constants (measured once, at trace time), when their value is known then. Both are
read from the graph op once, at trace time::

    {"attrs": {"transpose_a": false, "transpose_b": true},
     "inputs": {"1": {"dtype": "int32", "shape": [1], "value": [1]}}}

A dtype is ``{"dtype": name}``, a shape ``{"shape": [dims, -1 unknown]}``; attributes holding
tensors or functions are left out (replay then says the op cannot be rebuilt).
"""

from __future__ import annotations

import json
from typing import Any

KNOWN_INPUT_ELEMENTS = 64  # the largest unrecorded input whose value is kept


def describe(op_type: str, attrs: Any, inputs: list[Any], recorded: list[bool]) -> str | None:
    """The ``args`` JSON of a graph op: its attributes (``attrs``: the op callback's flat
    ``(name, AttrValue, ...)`` tuple) but the types its inputs give (``T``: they would make a
    bfloat16 op's args differ from a float32 one's, and compare reads a layout op's args), and
    the known values of its inputs not ``recorded`` (as tensors each time the graph runs)."""
    doc: dict[str, Any] = {}
    found = {k: v for k, v in attributes(attrs).items() if k not in input_types(op_type)}
    if found:
        doc["attrs"] = found
    known = {str(slot): value for slot, t in enumerate(inputs)
             if not recorded[slot] and (value := known_value(t)) is not None}
    if known:
        doc["inputs"] = known
    return json.dumps(doc, separators=(",", ":"), sort_keys=True) if doc else None


def input_types(op_type: str) -> frozenset[str]:
    """The op's type attributes that its inputs' dtypes set (``T``, ``Tidx``, ``Tperm``)."""
    found = _INPUT_TYPES.get(op_type)
    if found is None:
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(op_type)
        args = op_def.input_arg if op_def is not None else []
        found = _INPUT_TYPES[op_type] = frozenset(n for a in args for n in (a.type_attr, a.type_list_attr) if n)
    return found


_INPUT_TYPES: dict[str, frozenset[str]] = {}


def attributes(attrs: Any) -> dict[str, Any]:
    """Attribute name -> JSON value; internal ones (``_class``...) and those holding a tensor
    or a function left out."""
    items = list(attrs or ())
    out: dict[str, Any] = {}
    for name, value in zip(items[::2], items[1::2], strict=False):
        if isinstance(name, bytes):
            name = name.decode()
        if str(name).startswith("_"):
            continue
        encoded = encode(value)
        if encoded is not _SKIP:
            out[str(name)] = encoded
    return out


_SKIP = object()


def encode(value: Any) -> Any:
    """One ``AttrValue`` (or a plain Python value) as JSON; ``_SKIP`` when it cannot be."""
    which = value.WhichOneof("value") if hasattr(value, "WhichOneof") else None
    if which is None:
        return value if isinstance(value, (bool, int, float, str)) else _SKIP
    if which in ("b", "i", "f"):
        return getattr(value, which)
    if which == "s":
        return value.s.decode("utf-8", "replace")
    if which == "type":
        return {"dtype": _dtype_name(value.type)}
    if which == "shape":
        return _shape(value.shape)
    if which == "list":
        return _list(value.list)
    return _SKIP  # tensor, func, placeholder


def _list(lst: Any) -> Any:
    for field in ("i", "f", "b", "s"):
        if len(getattr(lst, field)):
            return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in getattr(lst, field)]
    if len(lst.type):
        return [{"dtype": _dtype_name(t)} for t in lst.type]
    if len(lst.shape):
        return [_shape(s) for s in lst.shape]
    return _SKIP if len(lst.tensor) or len(lst.func) else []


def _shape(proto: Any) -> dict[str, Any]:
    return {"shape": None if proto.unknown_rank else [int(d.size) for d in proto.dim]}


def _dtype_name(enum: int) -> str:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(enum).name


def known_value(tensor: Any) -> dict[str, Any] | None:
    """A small input's value when the trace knows it (a constant, or folded from constants)."""
    try:
        from tensorflow.python.framework import tensor_util

        value = tensor_util.constant_value(tensor)
    except Exception:  # noqa: BLE001 - a tensor TensorFlow cannot fold: not known
        return None
    if value is None or value.size > KNOWN_INPUT_ELEMENTS or value.dtype.kind not in "biuf":
        return None
    return {"dtype": tensor.dtype.name, "shape": list(value.shape), "value": value.reshape(-1).tolist()}
