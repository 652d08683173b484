"""Replay rules: how to compute an op's golden result when re-running the op itself will
not do (no CPU kernel, a fused kernel with a CPU equivalent), and ops that cannot be replayed.

A rule is called like the op, with float64 tensors for the golden run and the recorded
dtypes for the native run, and returns what the op returns::

    import opscope.replay

    @opscope.replay.register_replay("mylib.fused_gelu.default")
    def fused_gelu(x):
        return torch.nn.functional.gelu(x)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RULES: dict[str, Callable[..., Any]] = {}

# op name (or name fragment) -> why it cannot be replayed from a dump
_NOT_REPLAYABLE = {
    "as_strided": "reads its input through storage offsets and strides, and the dump keeps each "
                  "tensor contiguous: it cannot be rebuilt",
    "_local_scalar_dense": "returns a Python number, not a tensor: nothing to check",
}
_UNINITIALIZED = ("empty", "new_empty", "empty_like", "empty_strided", "empty_permuted")


def register_replay(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: compute ``op``'s golden result with this function; refuses an op registered twice."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if op in RULES:
            raise ValueError(f"a replay rule for {op} is already registered ({RULES[op].__name__})")
        RULES[op] = fn
        return fn
    return wrap


def not_replayable(op: str) -> str | None:
    """Why ``op`` cannot be replayed, or None."""
    if op in RULES:
        return None
    base = op.split(".")[1] if op.count(".") >= 2 else op
    if base in _UNINITIALIZED:
        return "makes uninitialized memory (empty): its output is not data, nothing to replay"
    for fragment, why in _NOT_REPLAYABLE.items():
        if fragment in base:
            return why
    return None
