"""Packages that are also functions: ``opscope.compare``, ``opscope.profile``, ``opscope.watch``.

Once a submodule of such a package is imported, Python binds the package to its name on
``opscope``, hiding the function of the same name. So the package itself is made callable
and forwards to the function. :func:`callable_package` does that for one package, given
where the function lives (``"module:attribute"``).

The profile and watch functions live with the public API in ``opscope/__init__.py`` (they
hand their session a renderer from :mod:`opscope.report`), so their forward resolves a name
in the top-level package at call time: the one reference in opscope that runs up the layers
(docs/architecture.md).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    _opscope_target = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, _, attr = self._opscope_target.partition(":")
        target = importlib.import_module(module)
        function = getattr(target, attr)
        if attr == "ENTRY_POINTS":  # the public API's table of functions hidden by packages
            function = function[self.__name__.rpartition(".")[2]]
        return function(*args, **kwargs)


def callable_package(name: str, target: str) -> None:
    """Make the already-imported package ``name`` callable, forwarding to ``target``."""
    module = sys.modules[name]
    module.__class__ = _CallableModule
    module._opscope_target = target  # type: ignore[attr-defined]  # read by _CallableModule.__call__
