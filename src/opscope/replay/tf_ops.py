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
from typing import Any

import numpy as np
import torch

from opscope.errors import ReplayError
from opscope.model.records import ABSENT_NOTE
from opscope.replay.calls import INPUT_IO, Call, head_of, missing_message, read_tensor
from opscope.replay.rules import RULES

NARROW_FLOATS = ("float16", "bfloat16", "float32")
# Ops that hand their (first) input on unchanged: a variable read's input row is the value read
# (what the graph wrote, or the variable at the start of the step), not its resource handle.
PASSING = frozenset({"tf.ReadVariableOp", "tf.Identity", "tf.Snapshot", "tf.StopGradient"})


def load_tf_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """One TensorFlow op with its inputs read; ``runner`` re-runs it through TensorFlow."""
    head = head_of(rows)
    name = str(head.get("op") or "")
    doc = _args(head.get("args"), name)
    attrs, known = doc.get("attrs", {}), doc.get("inputs", {})
    rule = RULES.get(name)
    counts = None if rule is not None else _arity(name.removeprefix("tf."), attrs, side)
    call = Call(side, name, None, head, sorted((r for r in rows if r.get("io") in INPUT_IO), key=_slot),
                sorted((r for r in rows if r.get("io") == "output"), key=_slot),
                {"args": [], "kwargs": {k: json.dumps(v) for k, v in attrs.items()}})
    for row in call.outputs:
        if row.get("data") and row.get("key"):
            call.recorded[_slot(row)] = read_tensor(dump, row)
    if not call.recorded:
        what = "makes no tensor (it writes a variable)" if not call.outputs else "has no full output tensor in " \
            f"the {side} dump"
        raise ReplayError(f"{name} {what}: nothing to check a replay against")
    inputs = _inputs(dump, call, known, counts[0] if counts else len(call.inputs))

    def runner(golden: bool) -> dict[int, torch.Tensor]:
        values = [t.to(torch.float64) if golden and t.is_floating_point() else t for t in inputs]
        if rule is not None:
            out = rule(*values)
            return dict(enumerate([out] if isinstance(out, torch.Tensor) else list(out)))
        if name in PASSING:
            return {0: values[0]}
        assert counts is not None
        return dict(enumerate(_execute(name.removeprefix("tf."), values, attrs, counts[1], golden)))
    call.runner = runner
    return call


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


def _op_def(op_type: str) -> Any:
    from tensorflow.python.framework import op_def_registry

    found = op_def_registry.get(op_type)
    if found is None:
        raise ReplayError(f"not replayable: tf.{op_type} is not an op registered in this TensorFlow (a custom "
                          "op: load its library first, opscope replay --import MODULE)")
    return found


def _arity(op_type: str, attrs: dict[str, Any], side: str) -> tuple[int, int]:
    """How many input and output tensors the op takes and makes, from its definition."""
    op_def = _op_def(op_type)
    needed = {a.name for a in op_def.attr if not a.HasField("default_value")}
    absent = sorted(needed - set(attrs))
    if absent:
        raise ReplayError(f"not replayable: tf.{op_type} on the {side} side has no recorded attribute {absent} "
                          "(dumps before opscope 0.1 session 13 do not record attributes, nor ones holding a "
                          "tensor or a function)")

    def count(args: Any) -> int:
        total = 0
        for arg in args:
            if arg.number_attr:
                total += int(attrs.get(arg.number_attr, 1))
            elif arg.type_list_attr:
                total += len(attrs.get(arg.type_list_attr, []))
            else:
                total += 1
        return total
    return count(op_def.input_arg), count(op_def.output_arg)


def _execute(op_type: str, inputs: list[torch.Tensor], attrs: dict[str, Any], outputs: int,
             golden: bool) -> list[torch.Tensor]:
    import tensorflow as tf
    from tensorflow.python.eager import context, execute

    flat: list[Any] = []
    for key, value in attrs.items():
        flat += [key, _attr(value, golden)]
    with tf.device("/CPU:0"):
        try:
            result = execute.execute(op_type, outputs, [_to_tf(t) for t in inputs], tuple(flat), context.context())
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
