"""Step boundaries, shared by dump, profile, watch and monitor. Pure logic: torch is asked
only whether an optimizer holds a module (:func:`torch_has_optimizer`), when it is loaded.

A step ends at the user's ``step()``; when the user never calls it, at each
``optimizer.step()``; with no optimizer, at each call of the outermost module that began
the step, or of a module that contains it: an encoder-decoder's ``generate`` calls its
encoder first, then the whole model once per token, each call a step.

An optimizer step only marks the boundary as *pending*: it is resolved at the next
event that belongs to the next iteration (the next outermost module call, data-loader
fetch, backward, ``step()`` or stop). So a user who calls ``d.step()`` right after
``optimizer.step(); optimizer.zero_grad()`` gets one boundary, not two, and that
``zero_grad`` stays in the step it closes. A ``zero_grad`` resolves the boundary only in a
loop that calls it first (seen before the first forward of step 0): there it begins the
next iteration.

Before the first ``optimizer.step()`` nobody knows yet whether one will come: under
gradient accumulation k forwards and backwards run before it. So a second call of the
step's outermost module ends the step only when no optimizer holds that module's
parameters (``has_optimizer``, asked once); a loss module or a second model called in the
same iteration never ends it.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any


class StepClock:
    """Counts steps from the events the capture hooks feed it.

    Args:
        on_boundary: called as ``on_boundary(finished_step, next_step)`` at each boundary.
        has_optimizer: ``has_optimizer(module)`` says whether an optimizer holds the
            module's parameters (then a forward never ends a step on its own); None: asks
            torch's optimizers when torch is loaded (:func:`torch_has_optimizer`).
    """

    def __init__(
        self,
        on_boundary: Callable[[int, int], None] | None = None,
        has_optimizer: Callable[[Any], bool] | None = None,
    ) -> None:
        self.step = 0
        self.manual = False
        self.pending = False
        self.saw_optimizer = False
        self.zero_grad_first = False
        self._outer_calls = 0
        self._resolved_by_event = False
        self._step_root: int | None = None
        self._root_module: Any = None
        self._enclosing: dict[tuple[int, int], bool] = {}
        self._trained: bool | None = None
        self._has_optimizer = has_optimizer if has_optimizer is not None else torch_has_optimizer
        self._on_boundary = on_boundary

    def user_step(self) -> None:
        """The user called ``step()``: from now on only these calls end a step. The first
        call, right after a ``zero_grad`` ended the step (nothing ran since), is that boundary."""
        first_after_resolve = not self.manual and self._resolved_by_event
        self.manual = True
        self.pending = False
        if not first_after_resolve:
            self._advance()

    def optimizer_step(self) -> None:
        """An ``optimizer.step()`` finished."""
        self.saw_optimizer = True
        self._resolved_by_event = False
        if not self.manual:
            self.pending = True

    def outer_module_call(self, module: Any = None) -> None:
        """The outermost module (``module``, when the caller knows it) is about to be called."""
        self.poll()
        self._resolved_by_event = False
        key = None if module is None else id(module)
        again = key == self._step_root or self._encloses(module)
        repeat = self._outer_calls and again and not (self.manual or self.saw_optimizer)
        if repeat and not self._trained_by_optimizer(module):
            self._advance()
        if not self._outer_calls:
            self._step_root, self._root_module = key, _weak(module)
        self._outer_calls += 1

    def _encloses(self, module: Any) -> bool:
        """Is the step's outermost module one of ``module``'s submodules? (Asked once a pair.)"""
        root = self._root_module() if self._root_module is not None else None
        if module is None or root is None or module is root:
            return False
        key = (id(module), id(root))
        if key not in self._enclosing:
            walk = getattr(module, "modules", None)
            self._enclosing[key] = callable(walk) and any(m is root for m in walk())
        return self._enclosing[key]

    def zero_grad(self) -> None:
        """``zero_grad`` is about to run: the next iteration's start in a zero_grad-first loop."""
        if self.step == 0 and not self._outer_calls and not self.saw_optimizer:
            self.zero_grad_first = True
        if self.zero_grad_first:
            self.poll()

    def poll(self) -> None:
        """Resolve a pending boundary, if any. Cheap; call it at any safe point."""
        if self.pending:
            self.pending = False
            self._advance()
            self._resolved_by_event = True

    def _trained_by_optimizer(self, module: Any) -> bool:
        if self._trained is None:
            self._trained = bool(self._has_optimizer(module))
        return self._trained

    def _advance(self) -> None:
        finished = self.step
        self.step += 1
        self._outer_calls = 0
        if self._on_boundary is not None:
            self._on_boundary(finished, self.step)


def _weak(module: Any) -> Any:
    """A weak reference to ``module`` (the clock must not keep a model alive), or None."""
    try:
        return weakref.ref(module)
    except TypeError:  # None, or an object without weak references
        return None


def torch_has_optimizer(module: Any) -> bool:
    """Whether a torch optimizer holds ``module``'s parameters (``module`` None, unknown to
    the caller: whether any torch optimizer was made); False when torch was never imported
    (a TensorFlow or ONNX session) or ``module`` is not a torch module."""
    if "torch" not in sys.modules:
        return False
    from opscope.capture.torch import optimizers

    return optimizers.optimizer_made() if module is None else optimizers.has_optimizer(module)
