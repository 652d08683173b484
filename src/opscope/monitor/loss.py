"""The loss without code changes: the scalar each ``backward()`` starts from.

Under ``opscope run`` (or ``OPSCOPE_CONFIG``) nobody calls ``m.step(loss=...)``. The loss
is then the tensor backward is called on: ``torch.autograd.backward`` (which
``Tensor.backward`` calls) is wrapped while a monitor that follows the loss runs (or one
that hands its finished steps to its judge's thread as a backward begins), and each call on
a single floating-point scalar with no explicit gradient hands that scalar (detached: no
graph kept, no read, so no device sync) to the listeners. A step that ran
several backward passes (gradient accumulation) records their mean. Calls with a gradient
argument or on several tensors are not losses and are ignored. What is wrapped is put back
when the last listener leaves (unless something else wrapped it since: then the wrapper
stays and only passes calls through); the wrapper is made once and serves the next monitor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

Listener = Callable[[torch.Tensor], None]
_listeners: list[Listener] = []
_original: Callable[..., Any] | None = None
_wrapper: tuple[Callable[..., Any], Callable[..., Any]] | None = None  # (original, its wrapper): made once


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def backward(tensors: Any, grad_tensors: Any = None, *args: Any, **kwargs: Any) -> Any:
        if (_listeners and grad_tensors is None and isinstance(tensors, torch.Tensor) and tensors.numel() == 1
                and tensors.dtype.is_floating_point):
            loss = tensors.detach()
            for listener in list(_listeners):
                listener(loss)
        return original(tensors, grad_tensors, *args, **kwargs)
    backward.__opscope_wrapped__ = original  # type: ignore[attr-defined]
    return backward


def listen(listener: Listener) -> None:
    """Call ``listener(loss)`` at each backward on a scalar, from now on."""
    global _original, _wrapper
    if _original is None and getattr(torch.autograd.backward, "__opscope_wrapped__", None) is None:
        _original = torch.autograd.backward
        if _wrapper is None or _wrapper[0] is not _original:
            _wrapper = (_original, _wrap(_original))
        setattr(torch.autograd, "backward", _wrapper[1])  # noqa: B010 (its declared type is the original's)
    _listeners.append(listener)


def unlisten(listener: Listener) -> None:
    """Stop calling ``listener``; unwrap backward when none is left."""
    global _original
    if listener in _listeners:
        _listeners.remove(listener)
    if not _listeners and _original is not None and getattr(torch.autograd.backward, "__opscope_wrapped__",
                                                             None) is _original:
        setattr(torch.autograd, "backward", _original)  # noqa: B010
        _original = None
