"""Module tracking: module paths (as ``named_modules()`` names them), parameter names,
the outermost call (for step detection), and module-level capture.

Installed as global module hooks, which are removed on exit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's arguments or output; a tensor or a plain tuple of tensors
    (and None) without a tree walk (the common case, on every module call)."""
    if type(value) is torch.Tensor:
        return [value]
    if type(value) is tuple and all(type(x) is torch.Tensor or x is None for x in value):
        return [x for x in value if x is not None]
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


class ModuleTracker:
    """Keeps the stack of module paths being executed.

    Args:
        on_outer_call: called before each call of an outermost module.
        on_enter / on_exit: optional per-module callbacks for module-level capture,
            ``on_enter(module, path, args)`` and ``on_exit(module, path, args, output)``.
    """

    def __init__(self, on_outer_call: Callable[[], None],
                 on_enter: Callable[[torch.nn.Module, str, Any], None] | None = None,
                 on_exit: Callable[[torch.nn.Module, str, Any, Any], None] | None = None) -> None:
        self.names: dict[int, str] = {}
        self.param_names: dict[int, str] = {}
        self.owners: dict[str, str] = {}
        self.stack: list[str] = []
        self._on_outer_call = on_outer_call
        self._on_enter = on_enter
        self._on_exit = on_exit
        self._handles: list[Any] = []
        self.on_change: Callable[[str], None] | None = None  # the innermost module path changed
        self.on_indexed: Callable[[torch.nn.Module], None] | None = None  # a root's names were learnt

    @property
    def path(self) -> str:
        """Path of the innermost module being executed ("" outside any module)."""
        return self.stack[-1] if self.stack else ""

    def install(self) -> None:
        mm = torch.nn.modules.module
        self._handles = [
            mm.register_module_forward_pre_hook(self._pre),
            mm.register_module_forward_hook(self._post, always_call=True),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()

    def index(self, root: torch.nn.Module) -> None:
        """Learn the names of ``root``'s submodules and parameters."""
        for name, m in root.named_modules(remove_duplicate=False):
            self.names.setdefault(id(m), name)
        for name, p in root.named_parameters(remove_duplicate=False):
            self.param_names.setdefault(id(p), name)
        for name, b in root.named_buffers(remove_duplicate=False):
            self.param_names.setdefault(id(b), name)
        if self.on_indexed is not None:
            self.on_indexed(root)

    def _name(self, module: torch.nn.Module) -> str:
        name = self.names.get(id(module))
        if name is None:
            parent = self.path
            name = f"{parent}.{type(module).__name__}" if parent else type(module).__name__
            self.names[id(module)] = name
        return name

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self.stack:
            if id(module) not in self.names:
                self.index(module)
            self._on_outer_call()
        path = self._name(module)
        self.stack.append(path)
        if self.on_change is not None:
            self.on_change(path)
        if self._on_enter is not None:
            self._on_enter(module, path, args)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        path = self.stack.pop() if self.stack else self._name(module)
        if self.on_change is not None:
            self.on_change(self.stack[-1] if self.stack else "")
        if self._on_exit is not None:
            self._on_exit(module, path, args, output)
