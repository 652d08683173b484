"""Where the monitor's tensors come from: the model's inputs and chosen modules' outputs (and
their gradients), found through hooks on the models it is given or finds.

A model is found, when none is given, by a global forward pre-hook that lives for the first
step only: the first module called outside any other is a root. From then on the hooks sit
on the roots and the chosen modules alone, so a module call costs nothing unless it is
watched. The order in which backward accumulates the parameters' gradients is learned once
(``register_post_accumulate_grad_hook`` for one backward) and names the earliest gradient.
"""

from __future__ import annotations

import weakref
from array import array
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

from opscope.capture.torch.modules import strip_wrapped, tensors_of, unwrap
from opscope.config import Filter
from opscope.monitor.registry import Names


def first_float(output: Any) -> torch.Tensor | None:
    """The first floating-point tensor of a module's output (a tensor, tuple, dict, ...)."""
    for t in tensors_of(output):
        if t.dtype.is_floating_point and t.numel():
            return t
    return None


def named_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors a root module is called with, named ``arg0``... or by keyword."""
    named = [(f"arg{i}", a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    named += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return [(n, t) for n, t in named if t.numel() and (t.dtype.is_floating_point or not t.is_complex())]


class _Output:
    """A chosen module's forward hook: ``on_output(path, its first floating-point output)``
    (one small object: a ``partial`` of a bound method held ~150 B more per module)."""

    __slots__ = ("on_output", "path")

    def __init__(self, on_output: Callable[[str, torch.Tensor], None], path: str) -> None:
        self.on_output, self.path = on_output, path

    def __call__(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        t = first_float(output)
        if t is not None:
            self.on_output(self.path, t)


class ModelHooks:
    """The hooks on the models of one monitor session.

    Args:
        modules: which modules' outputs to follow (empty: every leaf module); None: none.
        on_root_call: ``(args, kwargs)`` before each call of a root model.
        on_output: ``(path, output tensor)`` after a chosen module's call.
        on_adopt: ``(root)`` once for each root model hooked (given or found).
        names: where the parameters' names go, a slot each (only these hooks add to it);
            a new one when None.
    """

    def __init__(self, modules: Filter | None, on_root_call: Callable[[tuple[Any, ...], dict[str, Any]], None],
                 on_output: Callable[[str, torch.Tensor], None],
                 on_adopt: Callable[[torch.nn.Module], None] | None = None, names: Names | None = None) -> None:
        self.modules = modules
        self.on_root_call, self.on_output, self.on_adopt = on_root_call, on_output, on_adopt
        self.roots: list[weakref.ref[torch.nn.Module]] = []
        # each parameter once, by slot: the parameter, its name (in ``names``) and its place in
        # backward (0: not known); the slot of a tensor is found through a dict made when asked
        self.names = names if names is not None else Names()
        self._params: list[torch.Tensor] = []
        self._places = array("i")
        self.ordered = 0  # parameters whose place in backward is known
        self._handles: list[Any] = []
        self.finder: list[Any] = []
        self.order_hooks: list[Any] = []
        self._depth = 0
        self._backward_seq = 0

    def install(self, model: torch.nn.Module | None) -> None:
        """Hook ``model``, or find the roots during the first step when it is None."""
        if model is not None:
            self.adopt(model)
            return
        from torch.nn.modules import module as nn_module

        self.finder = [nn_module.register_module_forward_pre_hook(self._find_pre),
                        nn_module.register_module_forward_hook(self._find_post)]

    def stop_finding(self) -> None:
        """The first step is over: no more global hooks."""
        for h in self.finder:
            h.remove()
        self.finder = []

    def remove(self) -> None:
        self.stop_finding()
        self.stop_learning_order()
        for h in self._handles:
            h.remove()
        self._handles = []
        self._params = []

    def _find_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._depth == 0 and not any(r() is module for r in self.roots):
            self.adopt(module)
            self.on_root_call(tuple(args), {})  # its own pre-hook was added after this call began
        self._depth += 1

    def _find_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def adopt(self, root: torch.nn.Module) -> None:
        """Hook a root model: its calls, its chosen modules, its gradients' order."""
        self.roots.append(weakref.ref(root))
        known = self._slots()
        for name, p in root.named_parameters():
            if id(p) not in known:
                known[id(p)] = slot = self.names.add(strip_wrapped(name))
                assert slot == len(self._params), "only the hooks add to their names"
                self._params.append(p)
                self._places.append(0)
        self._handles.append(root.register_forward_pre_hook(self._root_pre, with_kwargs=True))
        if self.modules is not None:
            for name, module in unwrap(root).named_modules():
                if name and self._chosen(name, module):
                    self._handles.append(module.register_forward_hook(_Output(self.on_output, strip_wrapped(name))))
        for p in root.parameters():
            if p.requires_grad:
                hook = partial(self._accumulated, known[id(p)])
                self.order_hooks.append(p.register_post_accumulate_grad_hook(hook))
        if self.on_adopt is not None:
            self.on_adopt(root)

    def _chosen(self, name: str, module: torch.nn.Module) -> bool:
        assert self.modules is not None
        if self.modules:
            return self.modules.matches(name)
        return not any(True for _ in module.children())

    def _root_pre(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        self.on_root_call(tuple(args), dict(kwargs))

    def _accumulated(self, slot: int, p: torch.Tensor) -> None:
        if not self._places[slot]:
            self._places[slot] = self.tick()
            self.ordered += 1

    def tick(self) -> int:
        """The next position in backward (gradients of parameters and of activations share it)."""
        self._backward_seq += 1
        return self._backward_seq

    def stop_learning_order(self) -> None:
        """One backward has run: the gradients' order is known."""
        for h in self.order_hooks:
            h.remove()
        self.order_hooks = []

    def _slots(self) -> dict[int, int]:
        return {id(p): slot for slot, p in enumerate(self._params)}  # (they are held: ids stay theirs)

    def slots(self, tensors: Iterable[torch.Tensor]) -> list[int]:
        """The slot of each parameter in ``tensors`` (its name is ``names[slot]``), -1 for a
        tensor that is no parameter of the models hooked."""
        known = self._slots()
        return [known.get(id(t), -1) for t in tensors]

    def place_of(self, slot: int) -> int:
        """Where backward made the gradient of the parameter in ``slot`` (learned on the first
        backward), 0: not known."""
        return self._places[slot]
