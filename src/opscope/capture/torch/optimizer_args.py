"""An optimizer step's hyperparameters, as the ``args`` of its parameter rows.

Each parameter group's scalar settings (``lr``, ``betas``, ``eps``, ``weight_decay``, flags)
and the number of steps the optimizer had taken before this one (``step``, where its state
holds it on the CPU: a count on an accelerator is not read, which would wait for the device),
with the optimizer's class name, as one JSON object a group. Compare reads them to bound how
far an adaptive optimizer can move a parameter (statistics cannot see that: docs/compare.md,
"Parameters after an update") and to name a setting that differs between two runs.
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
import weakref
from typing import Any

import torch

_SKIP = object()
_FORMATS = {torch.float32: ("=f", 4), torch.float64: ("=d", 8), torch.int64: ("=q", 8), torch.int32: ("=i", 4)}


def _read_one(t: torch.Tensor) -> float | int | None:
    """The value of a 0-dim CPU tensor, read from its memory: ``.item()`` or ``.numpy()``
    would dispatch ops the dump records as the user's. None on a device (no wait for it)."""
    form = _FORMATS.get(t.dtype)
    if form is None or not t.is_cpu or type(t) is not torch.Tensor or t.dim() != 0:
        return None
    value: float | int = struct.unpack(form[0], ctypes.string_at(t.data_ptr(), form[1]))[0]
    return value


def _scalar(value: Any) -> Any:
    """A JSON value of a group setting, or _SKIP (parameters, tensors of several elements)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, torch.Tensor):  # a tensor lr (capturable): read only where it costs no sync
        one = _read_one(value)
        return _SKIP if one is None else _scalar(one)
    if isinstance(value, (tuple, list)) and len(value) <= 8:
        items = [_scalar(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) else items
    return _SKIP


def _steps_taken(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> int | None:
    """The steps the optimizer took before this one, from the first parameter it keeps state for."""
    for p in group["params"]:
        state = optimizer.state.get(p)
        if not state:
            continue
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            one = _read_one(step)
            return None if one is None else int(one)
        return int(step) if isinstance(step, (int, float)) else None
    return 0 if not optimizer.state else None  # no state yet: its first step


# optimizer -> per group (its values as last seen, the JSON of its settings without "step")
_SEEN: weakref.WeakKeyDictionary[Any, list[tuple[tuple[Any, ...], str]]] = weakref.WeakKeyDictionary()


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Unchanged settings: the same objects, or equal plain values (never a tensor's ``==``,
    which would be an op)."""
    return len(a) == len(b) and all(x is y or (x.__class__ in (float, int, bool, str, tuple) and x == y)
                                    for x, y in zip(a, b))


def _settings(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> str:
    doc: dict[str, Any] = {"optimizer": type(optimizer).__name__}
    for key, value in group.items():
        if key != "params" and (v := _scalar(value)) is not _SKIP and v is not None:
            doc[key] = v
    return json.dumps(doc, sort_keys=True)


def group_texts(optimizer: torch.optim.Optimizer) -> list[str]:
    """One JSON text per parameter group of ``optimizer``: its settings as this step runs
    (made again only where a group's values changed: a scheduler's new ``lr``)."""
    seen = _SEEN.get(optimizer) or []
    now, texts = [], []
    for i, group in enumerate(optimizer.param_groups):
        values = tuple(group.values())
        known = seen[i] if i < len(seen) and _same(seen[i][0], values) else (values, _settings(optimizer, group))
        now.append(known)
        steps = _steps_taken(optimizer, group)
        texts.append(known[1] if steps is None else f'{known[1][:-1]}, "step": {steps}}}')
    _SEEN[optimizer] = now
    return texts


def texts_by_param(optimizer: torch.optim.Optimizer) -> list[str]:
    """:func:`group_texts` for each parameter, in the order ``param_groups`` lists them (with
    torch-function modes off: a capture level's mode would see each tensor method it calls)."""
    out: list[str] = []
    with torch._C.DisableTorchFunction():
        texts = group_texts(optimizer)
    for group, text in zip(optimizer.param_groups, texts):
        out.extend([text] * len(group["params"]))
    return out
