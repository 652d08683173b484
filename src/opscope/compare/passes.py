"""Passes over a finished comparison: ``pass_(result, inputs)`` may add to the result (a
finding's ``replay``), never re-judge it.

Compare runs the passes it is handed (``compare(..., then=[...])``) after the result is
built. A feature that lives above compare (replay, which needs torch) offers its pass by
registering a factory under a name, and ``compare(..., replay=N)`` asks for it by that name:
compare never imports the feature. :data:`PROVIDERS` names the package that registers each
built-in name when it is imported, so ``opscope.compare(a, b, replay=3)`` works without an
import of :mod:`opscope.replay` first; it is a name, loaded on demand, not an import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this module stays cheap: replay registers through it
    from opscope.compare.result import CompareResult
    from opscope.compare.tolerance import NoiseModel


@dataclass(frozen=True)
class CompareInputs:
    """What the comparison read: the two open dumps and the thresholds it judged with."""

    target: Any       # opscope.Dump
    reference: Any    # opscope.Dump
    noise: NoiseModel


ResultPass = Callable[["CompareResult", CompareInputs], None]
PassFactory = Callable[[int], ResultPass]

# name -> the package that registers it on import (torch: loaded only when asked for)
PROVIDERS: dict[str, str] = {"replay": "opscope.replay"}

_FACTORIES: dict[str, PassFactory] = {}


def register_result_pass(name: str) -> Callable[[PassFactory], PassFactory]:
    """Register ``factory(n) -> ResultPass`` under ``name``; refuses a name already taken."""
    def add(factory: PassFactory) -> PassFactory:
        if name in _FACTORIES:
            raise ValueError(f"result pass {name!r} is already registered")
        _FACTORIES[name] = factory
        return factory
    return add


def result_pass(name: str, n: int) -> ResultPass:
    """The pass registered as ``name``, for ``n`` (e.g. how many culprits to replay)."""
    if name not in _FACTORIES and name in PROVIDERS:
        importlib.import_module(PROVIDERS[name])
    try:
        return _FACTORIES[name](n)
    except KeyError:
        raise ValueError(f"no result pass named {name!r} (known: {sorted(_FACTORIES) or 'none'})") from None


__all__ = ["PROVIDERS", "CompareInputs", "PassFactory", "ResultPass", "register_result_pass", "result_pass"]
