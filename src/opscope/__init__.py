"""opscope: find where a deep-learning model's numbers go wrong and where its time goes.

Public API (each imported lazily, so ``import opscope`` is cheap and torch-free):

- :func:`dump` — record what every operator receives and produces (``opscope.capture``).
- :func:`load` — open a dump written earlier.
- :func:`compare` — line two dumps up and name the operator where they start to differ.
- :func:`profile` — training trace and task trace of a training loop.
- :func:`watch` — catch the first operator that makes NaN or Inf.
"""

from __future__ import annotations

from typing import Any

from opscope.errors import (
    ConfigError,
    DumpExistsError,
    DumpFormatError,
    DumpWriteError,
    OpscopeError,
    OverflowDetected,
)

__version__ = "0.1.0"

_LAZY = {
    "dump": ("opscope.capture.torch.session", "dump"),
    "load": ("opscope.storage.reader", "load"),
    "Dump": ("opscope.storage.reader", "Dump"),
    "compare": ("opscope.compare.api", "compare"),
    "profile": ("opscope.profile.session", "profile"),
    "watch": ("opscope.watch", "watch"),
}

__all__ = [
    "ConfigError",
    "Dump",
    "DumpExistsError",
    "DumpFormatError",
    "DumpWriteError",
    "OpscopeError",
    "OverflowDetected",
    "__version__",
    "compare",
    "dump",
    "load",
    "profile",
    "watch",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'opscope' has no attribute {name!r}")
