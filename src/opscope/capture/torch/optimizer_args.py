"""An optimizer step's hyperparameters, as the ``args`` of its parameter rows.

Each parameter group's scalar settings (``lr``, ``betas``, ``eps``, ``weight_decay``, flags)
and the number of steps the optimizer had taken before this one (``step``, where its state
holds it on the CPU: a count on an accelerator is not read, which would wait for the device),
with the optimizer's class name, as one JSON object a group. Compare reads them to bound how
far an adaptive optimizer can move a parameter (statistics cannot see that: docs/compare.md,
"Parameters after an update") and to name a setting that differs between two runs.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

_SKIP = object()


def _scalar(value: Any) -> Any:
    """A JSON value of a group setting, or _SKIP (parameters, tensors of several elements)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, torch.Tensor):  # a tensor lr (capturable): read only where it costs no sync
        return _scalar(value.item()) if value.numel() == 1 and value.device.type == "cpu" else _SKIP
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
            return int(step.item()) if step.numel() == 1 and step.device.type == "cpu" else None
        return int(step) if isinstance(step, (int, float)) else None
    return 0 if not optimizer.state else None  # no state yet: its first step


def group_texts(optimizer: torch.optim.Optimizer) -> list[str]:
    """One JSON text per parameter group of ``optimizer``: its settings as this step runs."""
    name = type(optimizer).__name__
    texts = []
    for group in optimizer.param_groups:
        doc: dict[str, Any] = {"optimizer": name}
        for key, value in group.items():
            if key != "params" and (v := _scalar(value)) is not _SKIP and v is not None:
                doc[key] = v
        steps = _steps_taken(optimizer, group)
        if steps is not None:
            doc["step"] = steps
        texts.append(json.dumps(doc, sort_keys=True))
    return texts


def texts_by_param(optimizer: torch.optim.Optimizer) -> list[str]:
    """:func:`group_texts` for each parameter, in the order ``param_groups`` lists them."""
    out: list[str] = []
    for group, text in zip(optimizer.param_groups, group_texts(optimizer)):
        out.extend([text] * len(group["params"]))
    return out
