"""Whether an optimizer trains a module, for step detection before the first ``optimizer.step()``.

Asked once per session, when the outermost module is called a second time before any
optimizer step: under gradient accumulation that call is the next micro-batch of the same
step, in a loop without an optimizer it begins the next step.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


def optimizer_made() -> bool:
    """Any optimizer class instantiated in this process (``Optimizer.__init__`` marks its
    class's ``step`` as ``hooked``): a free check that spares the heap scan when none was."""
    import torch

    pending: list[type] = [torch.optim.Optimizer]
    while pending:
        cls = pending.pop()
        if getattr(cls.__dict__.get("step"), "hooked", False):
            return True
        pending.extend(cls.__subclasses__())
    return False


def has_optimizer(module: Any) -> bool:
    """True when a parameter group of a live optimizer holds one of ``module``'s trainable
    parameters (its ``"params"`` list refers to the parameter)."""
    parameters = getattr(module, "parameters", None)
    if parameters is None or not optimizer_made():
        return False
    first = next((p for p in parameters() if p.requires_grad), None)
    if first is None:
        return False
    lists = [ref for ref in gc.get_referrers(first) if type(ref) is list]
    if not lists:
        return False
    for holder in gc.get_referrers(*lists):
        if type(holder) is dict and any(holder.get("params") is group for group in lists):
            return True
    return False


def phased_closure(closure: Callable[[], Any], enter: Callable[[], None],
                   leave: Callable[[bool], None]) -> Callable[[], Any]:
    """``closure`` between ``enter()`` and ``leave(first)``; ``first`` is true on its first
    return only (LBFGS calls the closure again while it searches)."""
    calls: list[int] = []

    def phased() -> Any:
        enter()
        try:
            return closure()
        finally:
            leave(not calls)
            calls.append(1)

    return phased


def with_closure(args: Any, kwargs: Any, closure: Callable[[], Any]) -> tuple[Any, Any]:
    """A step pre-hook's ``(args, kwargs)`` (``args[0]`` is the optimizer) with another closure."""
    if "closure" in kwargs:
        return args, {**kwargs, "closure": closure}
    return (args[0], closure, *args[2:]), kwargs
