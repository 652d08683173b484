"""The dump session's optimizer hooks: the optimizer phase, ``optimizer.step(closure)``, and
the parameters, gradients and updated parameters of each captured step's update.

Installed by :class:`~opscope.capture.torch.session.DumpSession` as torch's global optimizer
step hooks; they see the session through :class:`OptimizerHost`, so this module does not
import the session module.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Protocol

import torch

from opscope.capture.torch.host import CaptureHost
from opscope.capture.torch.modules import PLAIN_TENSORS, local
from opscope.capture.torch.optimizer_args import texts_by_param
from opscope.capture.torch.optimizers import phased_closure, with_closure
from opscope.errors import OpscopeError

if TYPE_CHECKING:
    from opscope.capture.steps import StepClock
    from opscope.capture.torch.host import GraphLevel

# (call, module path, parameter, name): one parameter of an optimizer step, its gradient read later
Param = tuple[int, str, torch.Tensor, "str | None"]


class OptimizerHost(CaptureHost, Protocol):
    """The session as its optimizer hooks see it."""

    clock: StepClock

    def started_level(self) -> GraphLevel:
        """The capture level (the hooks are installed after it exists)."""


class OptimizerHooks:
    """``pre`` and ``post``, torch's optimizer step hooks, for ``session``."""

    def __init__(self, session: OptimizerHost) -> None:
        self.session = session
        # optimizer -> (the names known and its parameters' ids, the recorder, (the op, the
        # selected parameters, all plain tensors), its parameters): the walk over names and
        # filters is done again only when one changes
        self._params: weakref.WeakKeyDictionary[
            Any, tuple[tuple[int, ...], Any, tuple[str, list[Param], bool], list[Any]]] = weakref.WeakKeyDictionary()
        # (id of the optimizer, the recorder, what _selected found) in its step's pre hook: the
        # post hook of the same step reads the same parameters without looking them up again
        self._in_step: tuple[int, Any, tuple[str, list[Param], bool]] | None = None

    def pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        self.session.clock.poll()
        self._phase("optimizer")
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: the optimizer
        if callable(closure):  # Lightning, LBFGS: forward and backward run inside the step
            return self._wrap_closure(optimizer, closure, args, kwargs)
        self._begins(optimizer)
        return None

    def post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.session.capturing:
            self._guarded(optimizer, False)
        self._phase("forward")
        self.session.clock.optimizer_step()

    def _phase(self, phase: str) -> None:
        """The session's phase; a level that is not capturing is told when it starts (``activate``)."""
        s = self.session
        s.phase = phase
        if s.capturing:
            s.started_level().set_phase(phase)

    def _begins(self, optimizer: torch.optim.Optimizer) -> None:
        if self.session.capturing:
            self.session.recorder.drain()  # the optimizer is about to change parameters in place
            self._guarded(optimizer, True)

    def _wrap_closure(self, optimizer: torch.optim.Optimizer, closure: Any, args: Any, kwargs: Any) -> Any:
        """``optimizer.step(closure)``: the closure's ops are forward and backward, not
        optimizer; the parameters and gradients the update reads are recorded after it."""
        def enter() -> None:
            self._phase("forward")

        def leave(first: bool) -> None:
            self._phase("optimizer")
            if first:
                self._begins(optimizer)

        return with_closure(args, kwargs, phased_closure(closure, enter, leave))

    def _guarded(self, optimizer: torch.optim.Optimizer, before: bool) -> None:
        """Record the step's parameters; opscope's failure stops capture, never the user's step."""
        try:
            self._record_params(optimizer, before)
        except OpscopeError:
            raise
        except Exception as exc:
            self.session.internal_error(exc)

    def _record_params(self, optimizer: torch.optim.Optimizer, before: bool) -> None:
        """The optimizer step's parameters (and gradients) before it, with its settings as their
        ``args``; its parameters after."""
        recorder = self.session.recorder
        found = self._in_step
        if before or found is None or found[0] != id(optimizer) or found[1] is not recorder:
            found = (id(optimizer), recorder, self._selected(optimizer, recorder))
        self._in_step = found if before else None
        op, params, plain = found[2]
        texts = None
        if before:  # the settings the update runs with, on each parameter's rows
            by_param = texts_by_param(optimizer)
            texts = [by_param[i] for i, _, _, _ in params]
        native = getattr(recorder, "record_selected", None) if plain else None
        if native is not None:  # one native call, which reads each parameter's gradient itself
            native(op, params, before, texts)
        else:
            recorder.record_params(op, [(i, module, local(p), local(p.grad), name) for i, module, p, name in params],
                                   before, texts)

    def _selected(self, optimizer: torch.optim.Optimizer, recorder: Any) -> tuple[str, list[Param], bool]:
        """The op name, the parameters of ``optimizer`` that the filters select and whether all
        are plain tensors (no subclass: their ``grad`` is the tensor's own), found again only when
        its parameters (the very tensors), the names known or the recorder changed since the last step."""
        names = self.session.modules.param_names
        params = [p for group in optimizer.param_groups for p in group["params"]]
        key = (len(names), *map(id, params))  # C speed: no Python-level walk per step
        known = self._params.get(optimizer)
        if known is not None and known[1] is recorder and known[0] == key:
            return known[2]
        op = f"{type(optimizer).__name__}.step"
        selected: list[Param] = []
        for i, p in enumerate(params):
            name = names.get(id(p))
            module = (name or "").rpartition(".")[0]
            if recorder.selected(module, op, "optimizer"):
                selected.append((i, module, p, name))
        found = (op, selected, all(type(p) in PLAIN_TENSORS for _, _, p, _ in selected))
        self._params[optimizer] = (key, recorder, found, params)  # params held: their ids stay theirs
        return found

