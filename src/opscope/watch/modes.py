"""Helpers of ``opscope.watch``: its dispatch mode's place on the mode stack, the user's
source line, an optimizer's parameters."""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

import torch
from torch.utils import _python_dispatch as pd

_LIBRARY_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}opscope{os.sep}", "<frozen", f"{os.sep}contextlib.py")


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def optimizer_tensors(optimizer: torch.optim.Optimizer, name_of: Any) -> tuple[list[torch.Tensor], Any]:
    """Every parameter of ``optimizer`` and its state tensors, and ``describe(i)`` giving
    tensor ``i``'s name and named inputs (built on a hit only: names cost per step)."""
    params = optimizer_params(optimizer)
    tensors, where = [], []
    for j, p in enumerate(params):
        tensors.append(p)
        where.append((j, None))
        for k, v in optimizer.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                tensors.append(v)
                where.append((j, k))

    def describe(i: int) -> tuple[str, list[tuple[str, torch.Tensor]]]:
        j, key = where[i]
        p = params[j]
        name = name_of(p)
        grad = [(f"{name} (grad)", p.grad)] if p.grad is not None else []
        state = [(f"{name} ({k})", v) for k, v in optimizer.state.get(p, {}).items()
                 if isinstance(v, torch.Tensor) and v.numel() > 1]
        return (name, grad + state) if key is None else (f"{name} ({key})", [(name, p), *grad])

    return tensors, describe


def user_source() -> str | None:
    """The user's innermost frame outside torch and opscope, as ``file:line (function)``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _LIBRARY_PARTS):
            return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return None


def top_mode() -> Any:
    stack = pd._get_current_dispatch_mode_stack()
    return stack[-1] if stack else None


def enter_under(mode: Any) -> None:
    """Enter ``mode`` below every dispatch mode already entered."""
    above = []
    while pd._get_current_dispatch_mode_stack():
        above.append(pd._pop_mode())
    try:
        mode.__enter__()
    finally:
        for m in reversed(above):
            pd._push_mode(m)


def exit_mode(mode: Any) -> None:
    """Leave ``mode`` even when another session pushed its own mode above it since."""
    stack = pd._get_current_dispatch_mode_stack()
    if mode not in stack:
        return
    above = []
    while stack and stack[-1] is not mode:
        above.append(pd._pop_mode())
        stack = pd._get_current_dispatch_mode_stack()
    try:
        mode.__exit__(None, None, None)
    finally:
        for m in reversed(above):
            pd._push_mode(m)
