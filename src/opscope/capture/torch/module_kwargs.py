"""The keyword arguments of a module call, seen from the global forward pre-hook.

A global forward pre-hook gets the positional arguments only, and a model is mostly called
with keywords (``model(**batch)``, ``generate``'s ``model(input_ids=...)``), as are its layers
(Hugging Face's attention gets ``hidden_states``, ``position_embeddings`` and
``attention_mask`` by keyword). They are read from ``Module._call_impl``'s frame: its
``f_locals`` (before Python 3.13 a dict of the frame's seven variables built at each read,
~3 µs a module call with the frame walk). Most calls cannot have any: a forward with no
``**kwargs`` and no keyword-only parameter, given a positional argument for each of its
parameters (a Linear's, a LayerNorm's), would raise on any keyword, so its frame is not read.
"""

from __future__ import annotations

import inspect
import sys
from types import FrameType
from typing import Any

import torch

_CALL_IMPL = torch.nn.Module._call_impl.__code__
# (a forward function, bound or not) -> its parameters that positional arguments fill; -1: a
# keyword may come whatever they fill (**kwargs, a keyword-only parameter, a signature unread)
_FILLED: dict[tuple[Any, bool], int] = {}


def _positional_params(forward: Any) -> int:
    try:  # (a wrapper's own signature: functools.wraps may show one narrower than it takes)
        params = inspect.signature(forward, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):
        return -1
    n = 0
    for p in params:
        if p.kind in (p.VAR_KEYWORD, p.KEYWORD_ONLY):
            return -1
        n += p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    return n


def may_take_keywords(module: torch.nn.Module, args: tuple[Any, ...]) -> bool:
    """Could this call of ``module`` with positional ``args`` have keyword arguments too?"""
    forward = module.forward  # (an instance's own forward first, as _call_impl calls it)
    key = (getattr(forward, "__func__", forward), hasattr(forward, "__self__"))
    n = _FILLED.get(key)
    if n is None:
        n = _FILLED[key] = _positional_params(forward)
    return n < 0 or len(args) < n


def call_kwargs(depth: int = 2) -> dict[str, Any] | None:
    """The keyword arguments of the module call whose global pre-hook runs now, read from the
    frame ``depth`` up (2: called from the hook, or from the ``on_enter`` it calls) and a few
    above; None where there are none, or where ``_call_impl``'s frame is not found (a torch
    that calls hooks from elsewhere)."""
    frame: FrameType | None = sys._getframe(depth)
    for _ in range(5):
        if frame is None:
            return None
        if frame.f_code is _CALL_IMPL:
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) and kwargs else None
        frame = frame.f_back
    return None


def module_kwargs(module: torch.nn.Module, args: tuple[Any, ...]) -> dict[str, Any] | None:
    """:func:`call_kwargs` (for its caller's caller), read only where the call may have
    keywords (:func:`may_take_keywords`)."""
    return call_kwargs(3) if may_take_keywords(module, args) else None
