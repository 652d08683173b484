"""Rebuild one recorded aten call and run it on CPU: in float64 (the golden result) or in
the recorded dtypes (what torch's own CPU kernel gives in that precision).

A call's rows (docs/format.md) hold everything: ``op`` names the overload, input rows
give the tensors by schema argument (``arg``) and position among the flattened tensors
(``slot``), ``args`` the non-tensor arguments by schema position or keyword, and a random
op's ``args`` also the generator state it drew from (``rng``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from opscope.capture.torch.dispatch import flat_outputs
from opscope.errors import ReplayError
from opscope.model.records import NOT_DATA_NOTES
from opscope.replay.rules import RULES, not_replayable

INPUT_IO = ("input", "param")
_OP_PART = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Call:
    """One side's recorded call: its op, rows, and the tensors read back from the dump."""

    side: str
    name: str
    op: Any
    head: dict[str, Any]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    doc: dict[str, Any]
    tensors: dict[int, torch.Tensor | None] = field(default_factory=dict)
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)
    # re-runs a call that is not an aten op (API calls, MindSpore kernels): golden -> outputs
    runner: Callable[[bool], dict[int, torch.Tensor]] | None = None
    note: str = ""  # said with the side's result (a replay that cannot match the run's kernels)

    @property
    def device(self) -> str:
        return str(self.head.get("device") or "cpu")


def resolve_op(name: str) -> Any:
    """``aten.mm.default`` -> ``torch.ops.aten.mm.default``; a clear error when it cannot be."""
    parts = name.split(".")
    if len(parts) != 3:
        raise ReplayError(f"{name!r} is not an aten-level record (level=\"aten\" dumps name ops as "
                          "aten.<name>.<overload>); replay re-runs dispatcher ops only: dump with level=\"aten\"")
    ns, op_name, overload = parts
    if not all(_OP_PART.match(p) and not p.startswith("__") for p in parts):
        raise ReplayError(f"not replayable: {name!r} is not an operator name (namespace.op.overload, "
                          "identifiers without a leading double underscore)")
    try:
        found = getattr(getattr(getattr(torch.ops, ns), op_name), overload)
    except (AttributeError, RuntimeError):
        raise ReplayError(f"operator {name} is not registered in this process: import the library that "
                          "defines it first (opscope replay --import MODULE, or torch.ops.load_library(...) "
                          "before opscope.replay)") from None
    if not isinstance(found, torch._ops.OpOverload):
        raise ReplayError(f"not replayable: {name!r} names no dispatcher operator overload")
    return found


def load_aten_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """Read one aten op's rows and tensors; raises ReplayError when it cannot be replayed
    (:func:`opscope.replay.loader.load_call` picks the loader for a record)."""
    head = head_of(rows)
    name = str(head.get("op") or "")
    reason = not_replayable(name)
    if reason:
        raise ReplayError(f"{name} {reason}")
    op = resolve_op(name)
    doc = json.loads(head["args"]) if head.get("args") else {"args": [], "kwargs": {}}
    inputs, outputs = split_rows(rows)
    call = Call(side, name, op, head, inputs, outputs, doc)
    written = _written_args(op)
    missing = []
    for row in inputs:
        if row.get("data") and row.get("key"):
            call.tensors[row["id"]] = read_tensor(dump, row)
        elif row.get("note") in NOT_DATA_NOTES and row.get("arg") in written:
            call.tensors[row["id"]] = None  # a buffer the op overwrites: its values do not matter
        else:
            missing.append(f"{row.get('arg') or 'input'} {row.get('slot')}")
    if missing:
        raise ReplayError(missing_message(dump, name, side, missing))
    for row in outputs:
        if row.get("data") and row.get("key") and "uninitialized" not in str(row.get("note") or ""):
            call.recorded[row.get("slot") or 0] = read_tensor(dump, row)
    if not call.recorded:
        what = "holds no output tensor" if not outputs else "has no full output tensor in the dump"
        raise ReplayError(f"{name} {what} on the {side} side: nothing to check a replay against")
    return call


def split_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A call's input rows (inputs and parameters) and output rows, each in slot order."""
    by_slot = lambda r: r.get("slot") or 0  # noqa: E731
    return (sorted((r for r in rows if r.get("io") in INPUT_IO), key=by_slot),
            sorted((r for r in rows if r.get("io") == "output"), key=by_slot))


def head_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row that names a call: its first output row (else its first row)."""
    return next((r for r in rows if r.get("io") == "output"), rows[0])


def is_aten(name: str) -> bool:
    """``ns.op.overload`` of a dispatcher op, not an API name (``torch.linalg.norm``)."""
    parts = name.split(".")
    return len(parts) == 3 and parts[0] not in ("torch", "Tensor")


def read_rows(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """A call's input tensors and recorded outputs, for calls rebuilt without a schema."""
    head = head_of(rows)
    name = str(head.get("op") or "")
    inputs, outputs = split_rows(rows)
    call = Call(side, name, None, head, inputs, outputs, {})
    missing = [f"{r.get('arg') or r.get('io')} {r.get('slot')}" for r in inputs if not (r.get("data") and r.get("key"))]
    if missing:
        raise ReplayError(missing_message(dump, name, side, missing))
    for row in inputs:
        call.tensors[row["id"]] = read_tensor(dump, row)
    for row in outputs:
        if row.get("data") and row.get("key"):
            call.recorded[row.get("slot") or 0] = read_tensor(dump, row)
    if not call.recorded:
        raise ReplayError(f"{name} has no full output tensor in the {side} dump: nothing to check a replay against")
    return call


def run(call: Call, golden: bool) -> dict[int, torch.Tensor]:
    """Run the call on CPU: in float64 (``golden``) or in its recorded dtypes.

    Returns its output tensors by output slot (the numbering of the recorded output rows).
    """
    runner = call.runner
    if runner is not None:
        return _on_cpu(call, golden, lambda: runner(golden))
    args, kwargs = _arguments(call, golden)
    fn: Callable[..., Any] = RULES.get(call.name, call.op)
    with _random_state(call, kwargs):
        out = _on_cpu(call, golden, lambda: fn(*args, **kwargs))
    if out is None:  # in-place ops returning nothing (_foreach_*_): their written arguments are the outputs
        return dict(enumerate(_written_tensors(call.op, args, kwargs)))
    return {slot: t for slot, _, t in flat_outputs(out)}


def _on_cpu(call: Call, golden: bool, thunk: Callable[[], Any]) -> Any:
    """``thunk()``, with torch's failures as ReplayErrors that say what to do."""
    try:
        return thunk()
    except NotImplementedError as exc:
        raise ReplayError(_no_cpu_kernel(call, exc)) from None
    except (RuntimeError, ValueError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "Could not run" in first or "no kernel" in first.lower():
            raise ReplayError(_no_cpu_kernel(call, exc)) from None
        what = "in float64" if golden else "in its recorded dtypes"
        raise ReplayError(f"{call.name} failed when re-run on CPU {what} ({first}); "
                          "register a replay rule (opscope.replay.register_replay) for it") from None


# -- arguments -----------------------------------------------------------------------------
def _arguments(call: Call, golden: bool) -> tuple[list[Any], dict[str, Any]]:
    schema = call.op._schema.arguments
    index = {a.name: i for i, a in enumerate(schema)}
    values: dict[int, Any] = {}
    kwargs: dict[str, Any] = {}
    for pos, value in call.doc.get("args", []):
        if pos < len(schema):
            values[pos] = _decode(schema[pos], value, golden)
    for name, value in call.doc.get("kwargs", {}).items():
        i = index.get(name)
        if i is None:
            kwargs[name] = value
        elif schema[i].kwarg_only:
            kwargs[name] = _decode(schema[i], value, golden)
        else:
            values[i] = _decode(schema[i], value, golden)
    for name, tensors in _tensor_args(call, golden).items():
        i = index.get(name)
        if i is None:
            raise ReplayError(f"{call.name}: recorded tensor argument {name!r} is not in its schema {call.op._schema}")
        value = tensors if _is_list(schema[i]) else tensors[0]
        if schema[i].kwarg_only:
            kwargs[name] = value
        else:
            values[i] = value
    args = []
    for i in range(max(values, default=-1) + 1):
        if i in values:
            args.append(values[i])
        elif schema[i].has_default_value():
            args.append(schema[i].default_value)
        else:
            raise ReplayError(f"{call.name}: argument {schema[i].name!r} was not recorded; cannot rebuild the call")
    return args, kwargs


def _tensor_args(call: Call, golden: bool) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    for row in call.inputs:
        t = call.tensors.get(row["id"])
        dtype = torch_dtype(row.get("dtype"))
        t = torch.zeros(list(row.get("shape") or []), dtype=dtype) if t is None else t.to(dtype)
        if golden:
            t = to_golden(t)
        out.setdefault(row.get("arg") or "", []).append(t)
    return out


def to_golden(t: torch.Tensor) -> torch.Tensor:
    """float64 (complex128) copy of a floating tensor; other tensors unchanged."""
    if t.is_complex():
        return t.to(torch.complex128)
    if t.is_floating_point():
        return t.to(torch.float64)
    return t.clone()


def _decode(arg: Any, value: Any, golden: bool) -> Any:
    kind = str(arg.type)
    if value is None:
        return None
    if "Device" in kind:
        return torch.device("cpu")
    if arg.name == "pin_memory":
        return False
    if isinstance(value, list):
        return [_decode_one(v, golden) for v in value]
    return _decode_one(value, golden)


def _decode_one(value: Any, golden: bool) -> Any:
    if isinstance(value, str) and value.startswith("torch."):
        found = getattr(torch, value[len("torch."):], None)
        if isinstance(found, torch.dtype):
            if golden and found.is_floating_point:
                return torch.float64
            if golden and found.is_complex:
                return torch.complex128
            return found
        if isinstance(found, (torch.layout, torch.memory_format)):
            return found
    return value


def _is_list(arg: Any) -> bool:
    kind = str(arg.type)
    return kind.startswith("List[") or kind.startswith("Optional[List[")


def _written_args(op: Any) -> set[str]:
    return {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}


def _written_tensors(op: Any, args: list[Any], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        found.extend(value if isinstance(value, list) else [value] if isinstance(value, torch.Tensor) else [])
    return found


# -- random ops ----------------------------------------------------------------------------
def is_random(op: Any) -> bool:
    return op is not None and torch.Tag.nondeterministic_seeded in op.tags


@contextlib.contextmanager
def _random_state(call: Call, kwargs: dict[str, Any]) -> Iterator[None]:
    """Draw the same random numbers as the recorded call (a fresh generator each run)."""
    if not is_random(call.op):
        yield
        return
    rng = call.doc.get("rng")
    if not rng or not rng.get("state"):
        why = ("the dump holds no generator state for it (written before opscope recorded it)" if not rng else
               f"its {rng.get('device')} generator state could not be read when it ran")
        raise ReplayError(f"cannot replay deterministically: {call.name} is a random op and {why}")
    if rng.get("device") != "cpu":
        raise ReplayError(f"cannot replay deterministically: {call.name} drew from the {rng.get('device')} "
                          "generator, whose random numbers cannot be reproduced on CPU")
    state = torch.frombuffer(bytearray(base64.b64decode(rng["state"])), dtype=torch.uint8)
    if "generator" in {a.name for a in call.op._schema.arguments}:
        gen = torch.Generator()
        gen.set_state(state)
        kwargs["generator"] = gen
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        yield


# -- reading -------------------------------------------------------------------------------
def read_tensor(dump: Any, row: dict[str, Any]) -> torch.Tensor:
    import numpy as np

    from opscope.errors import DumpFormatError

    try:
        arr = np.ascontiguousarray(dump.row_tensor(row))
    except DumpFormatError as exc:  # a refused or missing tensor file: this side cannot be replayed
        raise ReplayError(f"cannot replay {row.get('op')}: its {row.get('io')} {row.get('slot')} cannot be read "
                          f"({exc})") from None
    t = torch.from_numpy(arr.copy())
    shape = list(row.get("shape") or [])
    if list(t.shape) != shape:
        t = t.reshape(shape)
    return t.to(torch_dtype(row.get("dtype")))


def torch_dtype(name: str | None) -> torch.dtype:
    found = getattr(torch, str(name or "float32"), None)
    if not isinstance(found, torch.dtype):
        raise ReplayError(f"dtype {name!r} is not a torch dtype")
    return found


def missing_message(dump: Any, name: str, side: str, missing: list[str]) -> str:
    cfg = (dump.manifest or {}).get("config") or {}
    stats_only = cfg.get("data", "statistics") == "statistics"
    what = (f"{dump.path} is a statistics-only dump" if stats_only and not cfg.get("suspects")
            else f"the {side} dump holds no full tensor for {', '.join(missing[:4])}")
    if (((dump.manifest or {}).get("tool") or {}).get("name") or "opscope") != "opscope":  # another tool's dump
        hint = dump.manifest.get("tensor_hint") if stats_only else None
        return f"cannot replay {name}: {what}; replay needs the op's full inputs{f' ({hint})' if hint else ''}"
    return (f"cannot replay {name}: {what}; replay needs the op's full inputs. Two-pass workflow: "
            "`opscope compare TARGET REFERENCE -o OUT`, then dump both runs again with "
            "suspects=\"OUT\" (full tensors only for the culprits and the ops that made their inputs, "
            "statistics for the rest), compare those and replay")


def _no_cpu_kernel(call: Call, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"{call.name} cannot run on CPU ({first}); it ran on {call.device} in the {call.side} dump. "
            f"Register a CPU equivalent: @opscope.replay.register_replay({call.name!r})")
