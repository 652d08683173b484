"""Rebuild one API-level call (opscope's ``level="api"``, msprobe's ``Functional.`` /
``Torch.`` / ``Tensor.`` entries) or one MindSpore kernel from a dump, as a
:class:`~opscope.replay.calls.Call` whose ``runner`` re-runs it.

API calls. The record holds the call's tensors as input rows (``slot`` in argument order;
``arg`` names a keyword tensor where the tool recorded it) and its other arguments in
``args``: opscope writes ``{"args": [[position, value], ...], "kwargs": {...}}``, the msprobe
reader ``[[[position, value], ...], {...}]``. A position missing there held a tensor (or a
list of tensors: ``torch.cat([a, b], 1)``); tensors fill those positions in order, the rest
follow the last recorded position. Values that are not numbers or strings were written as
text and are parsed back without evaluating anything: ``torch.float32`` (a dtype, from
torch's own dtype table), ``torch.Size([2, 3])``, ``slice(None, 2, None)``, ``Ellipsis``;
device names become ``cpu``. The function comes from the allow-list
(:mod:`opscope.replay.api_names`) only.

MindSpore kernels. Every input was dumped, attributes included; the table
(:mod:`opscope.replay.mindspore_ops`) computes the op from them.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

import torch

from opscope.errors import ReplayError
from opscope.replay import api_names, mindspore_ops
from opscope.replay.calls import INPUT_IO, Call, head_of, read_rows, to_golden
from opscope.replay.rules import RULES

# functions whose first argument is a list of tensors
LIST_FIRST = frozenset(f"torch.{n}" for n in "cat concat concatenate stack hstack vstack dstack".split())
_DTYPES: dict[str, torch.dtype] = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}
_FORMATS: dict[str, Any] = {str(v): v for v in vars(torch).values()
                            if isinstance(v, (torch.layout, torch.memory_format))}
_DEVICE = re.compile(r"^(cpu|cuda|npu|xpu|mps|hpu|mlu|meta)(:\d+)?$")
_SIZE = re.compile(r"^torch\.Size\((\[[-\d, ]*\])\)$")
_SLICE = re.compile(r"^slice\(([-\w]+), ([-\w]+), ([-\w]+)\)$")
_NUMBERS = re.compile(r"^[(\[][-+\d., eE]*[)\]]$")  # a tuple or list of numbers written as text


def load_api_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """One API-level call with its tensors read; ``runner`` re-runs it (golden or native)."""
    head = head_of(rows)
    name = str(head.get("op") or "")
    if name == "parameters_grad":
        raise ReplayError("not replayable: msprobe's parameters_grad entry lists the gradients a module's "
                          "parameters received: it records no call")
    if head.get("phase") == "backward" or any(r.get("io") == "grad" for r in rows):
        raise ReplayError(f"not replayable: {name} backward: an API-level dump records a backward call's "
                          "gradients only, not the forward tensors it also reads (a linear's weight); "
                          "replay its forward call, or dump with level=\"aten\"")
    fn = RULES.get(name) or api_names.resolve_api(name)  # refused before anything is read
    call = read_rows(dump, rows, side)
    text = next((r.get("args") for r in rows if r.get("args")), None)
    pairs, keywords = parse_args(text, name)
    call.doc = {"args": [[i, v] for i, v in sorted(pairs.items())], "kwargs": keywords}
    call.runner = lambda golden: _run_api(call, fn, pairs, keywords, golden)
    return call


def load_mindspore_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """One MindSpore kernel with its inputs read; ``runner`` computes it with the table."""
    name = str(head_of(rows).get("op") or "")
    op_type = name.removeprefix("mindspore.")
    kernel = RULES.get(name)
    if kernel is None:
        reason = mindspore_ops.why_not(op_type)
        if reason:
            raise ReplayError(f"not replayable: {reason}")  # before anything is read
    call = read_rows(dump, rows, side)
    slots = [r.get("slot") or 0 for r in call.inputs]
    if slots != list(range(len(slots))):
        raise ReplayError(f"cannot replay {call.name}: the {side} dump holds inputs {slots}, not every input "
                          "of the kernel (dump with \"input_output\": 0)")
    outputs = [r for r in call.outputs if (r.get("slot") or 0) < 100]

    def runner(golden: bool) -> dict[int, torch.Tensor]:
        inputs = [_tensor(call, row, golden) for row in call.inputs]
        meta = mindspore_ops.Outputs([_dtype(r) for r in outputs], [list(r.get("shape") or []) for r in outputs],
                                     golden)
        out = kernel(*inputs) if kernel is not None else mindspore_ops.OPS[op_type](inputs, meta)
        found = [out] if isinstance(out, torch.Tensor) else list(out)
        return {int(r.get("slot") or 0): t for r, t in zip(outputs, found, strict=False)}
    call.runner = runner
    return call


def parse_args(text: str | None, name: str) -> tuple[dict[int, Any], dict[str, Any]]:
    """``(position -> value, keyword -> value)`` from either tool's ``args`` JSON."""
    if not text:
        return {}, {}
    try:
        doc = json.loads(text)
    except ValueError:
        raise ReplayError(f"{name}: its recorded arguments are not valid JSON") from None
    if isinstance(doc, dict):
        pairs, keywords = doc.get("args") or [], doc.get("kwargs") or {}
    elif isinstance(doc, list) and len(doc) == 2:
        pairs, keywords = doc
    else:
        raise ReplayError(f"{name}: its recorded arguments have a form opscope does not know")
    try:
        return {int(p): v for p, v in pairs}, dict(keywords)
    except (TypeError, ValueError):
        raise ReplayError(f"{name}: its recorded arguments have a form opscope does not know") from None


def decode(value: Any, golden: bool) -> Any:
    """A recorded non-tensor argument back as Python (see the module docstring); nothing is
    evaluated and no name becomes an attribute lookup."""
    if isinstance(value, list):
        return [decode(v, golden) for v in value]
    if not isinstance(value, str):
        return value
    if value in _DTYPES:
        dtype = _DTYPES[value]
        if golden and dtype.is_floating_point:
            return torch.float64
        return torch.complex128 if golden and dtype.is_complex else dtype
    if value in _FORMATS:
        return _FORMATS[value]
    if _DEVICE.match(value):
        return "cpu"
    if value == "Ellipsis":
        return Ellipsis
    size = _SIZE.match(value)
    if size or _NUMBERS.match(value):
        return _number_list(size.group(1) if size else value)
    part = _SLICE.match(value)
    if part:
        return slice(*(None if p == "None" else _int(p, value) for p in part.groups()))
    return value


def place(name: str, values: dict[int, Any], tensors: list[Any]) -> list[Any]:
    """The positional arguments: recorded values, and tensors in the positions left free."""
    values = dict(values)
    end = max(values, default=-1) + 1
    holes = [i for i in range(end) if i not in values]
    if name in LIST_FIRST and 0 not in values:
        values[0], tensors, holes = list(tensors), [], [h for h in holes if h]
    if len(tensors) < len(holes):
        raise ReplayError(f"cannot replay {name}: its record holds {len(tensors)} tensor(s) for {len(holes)} "
                          "tensor argument(s): its arguments cannot be rebuilt")
    for i in holes:
        values[i] = tensors.pop(0)
    for t in tensors:
        values[len(values)] = t
    return [values[i] for i in range(len(values))]


def _run_api(call: Call, fn: Callable[..., Any], pairs: dict[int, Any], keywords: dict[str, Any],
             golden: bool) -> dict[int, torch.Tensor]:
    from opscope.capture.torch.modules import tensors_of

    positional: list[torch.Tensor] = []
    by_keyword: dict[str, list[torch.Tensor]] = {}
    for row in call.inputs:
        t = _tensor(call, row, golden)
        if row.get("arg"):
            by_keyword.setdefault(str(row["arg"]), []).append(t)
        else:
            positional.append(t)
    args = place(call.name, {i: decode(v, golden) for i, v in pairs.items()}, positional)
    if call.name == "Tensor.__getitem__" and len(args) > 1 and isinstance(args[1], list):
        args[1] = tuple(args[1])  # x[:, 0] was recorded as a list
    kwargs = {str(k): decode(v, golden) for k, v in keywords.items()}
    kwargs.update({k: v[0] if len(v) == 1 else v for k, v in by_keyword.items()})
    try:
        out = fn(*args, **kwargs)
    except (TypeError, AttributeError, KeyError) as exc:
        raise ReplayError(f"cannot replay {call.name}: the call rebuilt from the dump was refused ({exc}); "
                          "its arguments could not be rebuilt") from None
    return dict(enumerate(tensors_of(out)))


def _tensor(call: Call, row: dict[str, Any], golden: bool) -> torch.Tensor:
    t = call.tensors[row["id"]]
    assert t is not None  # read_rows refuses calls with a missing input
    t = t.clone()  # a call may write into an argument (batch_norm's running statistics)
    return to_golden(t) if golden else t


def _dtype(row: dict[str, Any]) -> torch.dtype:
    return _DTYPES.get(f"torch.{row.get('dtype')}", torch.float32)


def _number_list(text: str) -> Any:
    """``(0, 1)`` / ``[2, 3]`` as a list of numbers; other text stays text."""
    try:
        found = ast.literal_eval(text)  # literals only: nothing is evaluated
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return list(found) if isinstance(found, (tuple, list)) else text


def _int(text: str, whole: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ReplayError(f"cannot read the recorded argument {whole!r}") from None


__all__ = ["INPUT_IO", "decode", "load_api_call", "load_mindspore_call", "parse_args", "place"]
