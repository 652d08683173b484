"""Replay of TensorFlow ops (``tf.<OpType>`` records of a ``tf-op`` dump) through TensorFlow.

The op is run again by TensorFlow itself on CPU, eagerly, from its recorded input tensors,
the inputs the dump knew at trace time, and its attributes (both in the rows' ``args``,
:mod:`opscope.capture.tensorflow.opattrs`): in float64 for the golden result (every floating
input, and every floating dtype attribute such as ``T`` or ``DstT``, widened) and in the
recorded dtypes for what TensorFlow's own CPU kernel gives in that precision. An input that
was neither recorded nor known when the graph was traced (a shape computed at run time), an
attribute holding a tensor or a function, or an op with no float64 CPU kernel makes the op
not replayable, and the message says which. A rule registered for ``tf.<OpType>``
(``opscope.replay.register_replay``) is called instead, with torch tensors in input order.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import torch

from opscope.errors import ReplayError
from opscope.model.records import ABSENT_NOTE
from opscope.replay.calls import Call, head_of, missing_message, read_tensor, split_rows
from opscope.replay.rules import RULES

NARROW_FLOATS = ("float16", "bfloat16", "float32")
# Ops that hand their (first) input on unchanged: a variable read's input row is the value read
# (what the graph wrote, or the variable at the start of the step), not its resource handle.
PASSING = frozenset({"tf.ReadVariableOp", "tf.Identity", "tf.Snapshot", "tf.StopGradient"})


def load_tf_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """One TensorFlow op with its inputs read; ``runner`` re-runs it through TensorFlow."""
    note = match_kernels(dump)
    head = head_of(rows)
    name = str(head.get("op") or "")
    doc = _args(head.get("args"), name)
    attrs, known = doc.get("attrs", {}), doc.get("inputs", {})
    rule = RULES.get(name)
    op_def = None if rule is not None else _op_def(name.removeprefix("tf."), attrs, side)
    call = Call(side, name, None, head, *split_rows(rows),
                {"args": [], "kwargs": {k: json.dumps(v) for k, v in attrs.items()}})
    for row in call.outputs:
        if row.get("data") and row.get("key"):
            call.recorded[_slot(row)] = read_tensor(dump, row)
    if not call.recorded:
        what = "makes no tensor (it writes a variable)" if not call.outputs else "has no full output tensor in " \
            f"the {side} dump"
        raise ReplayError(f"{name} {what}: nothing to check a replay against")
    seen = max([_slot(r) + 1 for r in call.inputs] + [int(k) + 1 for k in known], default=0)
    inputs = _inputs(dump, call, known, seen if op_def is None else _input_count(op_def, attrs, seen))

    def runner(golden: bool) -> dict[int, torch.Tensor]:
        values = [t.to(torch.float64) if golden and t.is_floating_point() else t for t in inputs]
        if rule is not None:
            out = rule(*values)
            return dict(enumerate([out] if isinstance(out, torch.Tensor) else list(out)))
        if name in PASSING:
            return {0: values[0]}
        assert op_def is not None
        return dict(enumerate(_execute(op_def, values, attrs, golden)))
    call.runner = runner
    call.note = note
    return call


def match_kernels(dump: Any) -> str:
    """Run TensorFlow's kernels as the dumped run did: oneDNN on or off
    (``TF_ENABLE_ONEDNN_OPTS``, read when TensorFlow starts; the two round bfloat16
    differently). Set here when TensorFlow is not imported yet and the user did not choose;
    otherwise a note when they differ (the recorded bits are then not expected back)."""
    wanted = (getattr(dump, "manifest", None) or {}).get("framework", {}).get("onednn")
    if wanted is None:
        return ""
    if "tensorflow" not in sys.modules and "TF_ENABLE_ONEDNN_OPTS" not in os.environ:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if wanted else "0"
    from opscope.capture.tensorflow.manifest import onednn

    now = onednn()
    if now is None or now == wanted:
        return ""
    def word(on: bool) -> str:
        return "on" if on else "off"
    return (f"the dump ran TensorFlow with oneDNN {word(wanted)}, this replay with it {word(now)} "
            f"(TF_ENABLE_ONEDNN_OPTS={'1' if wanted else '0'} before TensorFlow starts matches it): "
            "the kernel in the recorded dtypes may round differently")


def _slot(row: dict[str, Any]) -> int:
    return int(row.get("slot") or 0)


def _inputs(dump: Any, call: Call, known: dict[str, Any], count: int) -> list[torch.Tensor]:
    """The op's inputs in order: the recorded tensors, else the values known at trace time."""
    by_slot = {_slot(r): r for r in call.inputs}
    out: list[torch.Tensor] = []
    missing: list[int] = []
    absent: list[int] = []
    for slot in range(count):
        row, value = by_slot.get(slot), known.get(str(slot))
        if row is not None and row.get("data") and row.get("key"):
            out.append(read_tensor(dump, row))
        elif value is not None:
            out.append(torch.from_numpy(np.asarray(value["value"], dtype=np.dtype(value["dtype"]))
                                        .reshape(value["shape"])))
        else:
            (absent if row is not None and row.get("note") == ABSENT_NOTE else missing).append(slot)
    if absent:
        raise ReplayError(f"not replayable: input(s) {absent} of {call.name} on the {call.side} side are absent "
                          "(Grappler removed or rewrote the tensor, so the graph that ran never held it)")
    if missing and any(r.get("data") for r in call.inputs + call.outputs):
        raise ReplayError(f"not replayable: input(s) {missing} of {call.name} on the {call.side} side were not "
                          "recorded and their values were not known when the graph was traced (computed while it ran)")
    if missing:
        raise ReplayError(missing_message(dump, call.name, call.side, [f"input {s}" for s in missing]))
    return out


def _args(text: Any, name: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        raise ReplayError(f"{name}: its recorded attributes are not valid JSON") from None
    return doc if isinstance(doc, dict) else {}


def _op_def(op_type: str, attrs: dict[str, Any], side: str) -> Any:
    """The op's definition; a ReplayError when TensorFlow has none or an attribute it needs
    is missing (besides the input types, which the inputs give)."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    if op_def is None:
        raise ReplayError(f"not replayable: tf.{op_type} is not an op registered in this TensorFlow (a custom "
                          "op: load its library first, opscope replay --import MODULE)")
    inferred = {a.type_attr for a in op_def.input_arg} | {a.type_list_attr for a in op_def.input_arg}
    needed = {a.name for a in op_def.attr if not a.HasField("default_value")} - inferred
    absent = sorted(needed - set(attrs))
    if absent:
        raise ReplayError(f"not replayable: tf.{op_type} on the {side} side has no recorded attribute {absent} "
                          "(dumps written before session 13 record none; nor are ones holding a tensor or a "
                          "function recorded)")
    return op_def


def _input_count(op_def: Any, attrs: dict[str, Any], seen: int) -> int:
    """How many inputs the op takes: its definition says, unless it takes a list of any types
    (then as many as the dump holds)."""
    if any(a.type_list_attr for a in op_def.input_arg):
        return seen
    return sum(int(attrs.get(a.number_attr, 1)) if a.number_attr else 1 for a in op_def.input_arg)


def _input_types(op_def: Any, attrs: dict[str, Any], tensors: list[Any]) -> dict[str, Any]:
    """The type attributes TensorFlow infers from the inputs (``T``, ``Tidx``, a list's types):
    the dump leaves them out, as they differ between a bfloat16 and a float32 run of an op."""
    fixed = sum(int(attrs.get(a.number_attr, 1)) if a.number_attr else 1
                for a in op_def.input_arg if not a.type_list_attr)
    out: dict[str, Any] = {}
    at = 0
    for arg in op_def.input_arg:
        size = int(attrs.get(arg.number_attr, 1)) if arg.number_attr else \
            (len(tensors) - fixed if arg.type_list_attr else 1)
        part = tensors[at:at + size]
        if arg.type_attr and part:
            out.setdefault(arg.type_attr, part[0].dtype.as_datatype_enum)
        if arg.type_list_attr:
            out[arg.type_list_attr] = [t.dtype.as_datatype_enum for t in part]
        at += size
    return out


def _output_count(op_def: Any, attrs: dict[str, Any]) -> int:
    return sum(int(attrs.get(a.number_attr, 1)) if a.number_attr else
               len(attrs.get(a.type_list_attr, [])) if a.type_list_attr else 1 for a in op_def.output_arg)


def _execute(op_def: Any, inputs: list[torch.Tensor], attrs: dict[str, Any], golden: bool) -> list[torch.Tensor]:
    import tensorflow as tf
    from tensorflow.python.eager import context, execute

    op_type = op_def.name
    with tf.device("/CPU:0"):
        tensors = [_to_tf(t) for t in inputs]
        full = {key: _attr(value, golden) for key, value in attrs.items()} | _input_types(op_def, attrs, tensors)
        flat = [item for pair in full.items() for item in pair]
        try:
            result = execute.execute(op_type, _output_count(op_def, full), tensors, tuple(flat), context.context())
        except (tf.errors.OpError, TypeError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            what = "in float64" if golden else "in its recorded dtypes"
            raise ReplayError(f"tf.{op_type} failed when re-run by TensorFlow on CPU {what} ({first}); register a "
                              f"replay rule for it (opscope.replay.register_replay('tf.{op_type}'))") from None
    return [_to_torch(t) for t in result]


def _attr(value: Any, golden: bool) -> Any:
    """A JSON attribute back as what TensorFlow's ``execute`` takes (dtypes as enums)."""
    from tensorflow.python.framework import dtypes

    if isinstance(value, list):
        return [_attr(v, golden) for v in value]
    if isinstance(value, dict) and "dtype" in value:
        name = "float64" if golden and value["dtype"] in NARROW_FLOATS else value["dtype"]
        return dtypes.as_dtype(name).as_datatype_enum
    if isinstance(value, dict) and "shape" in value:
        return value["shape"]
    return value


def _to_tf(t: torch.Tensor) -> Any:
    import tensorflow as tf

    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: through float32, exact both ways
        return tf.cast(tf.constant(t.float().numpy()), tf.bfloat16)
    return tf.constant(t.numpy())


def _to_torch(t: Any) -> torch.Tensor:
    import tensorflow as tf

    if t.dtype == tf.bfloat16:
        return torch.from_numpy(tf.cast(t, tf.float32).numpy()).to(torch.bfloat16)
    return torch.from_numpy(np.array(t.numpy()))
