"""The module level of a statistics dump, run natively: the module hooks hand each call's
inputs, own parameters and outputs to the native dump module in one call (``record_call``,
``_c/dumpobs_calls.h``), which makes the rows, measures the tensors with the statistics
kernel and keeps the data flow in C++; it hooks the outputs that require grad with C++
tensor hooks, which make the gradient rows in backward without entering Python. The per-op
observer is never registered at this level. Python keeps the filters and the module hooks.

Each hook is one native call (``record_module``) that walks the call's arguments or output
and the module's own parameters itself; only what it does not know (a namedtuple, a
registered pytree class, a tensor subclass, an overridden ``named_parameters``) is walked in
Python, as before. The rows are those of :class:`~opscope.capture.torch.levels.ModuleLevel`
(the Python path, used without a C++ compiler or with ``OPSCOPE_DUMP_BACKEND=python``); the
step leaves C++ as columns, as at the aten level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from opscope.capture.torch.levels import hooks_gradients, module_inputs, module_phase
from opscope.capture.torch.module_kwargs import module_kwargs
from opscope.capture.torch.modules import SKIPPED, tensors_of
from opscope.capture.torch.native.aten import NativeAtenLevel
from opscope.config import PHASE_CODES
from opscope.errors import OpscopeError

if TYPE_CHECKING:
    from opscope.capture.torch.host import CaptureHost

_NAMED_PARAMETERS = torch.nn.Module.named_parameters  # a module type that overrides it: module_inputs


class NativeModuleLevel(NativeAtenLevel):
    """Module inputs, own parameters and outputs; gradients at module outputs in backward."""

    def __init__(self, session: CaptureHost, backend: Any) -> None:
        super().__init__(session, backend)
        session.modules.on_change = None  # no per-op observer asks which module runs
        session.modules._on_enter = self._enter
        session.modules._on_exit = self._exit
        self._calls: list[int] = []
        self._grads = "backward" in session.cfg.phases
        backend.set_leaves(SKIPPED)  # what record_module's walk skips, as tensors_of does (shared)

    # the per-op observer stays unregistered: only the configuration changes
    def activate(self) -> None:
        if not self.on:
            self.on = True
            self.native.configure(True, PHASE_CODES[self.session.phase])

    def deactivate(self) -> None:
        if self.on:
            self.on = False
            self.native.configure(False, 0)

    def forked(self) -> None:
        self.on = False
        self.native.configure(False, 0)

    # -- hooks (opscope's failure in them stops capture, never the user's step) -----------
    def _guard(self, exc: Exception) -> None:
        if isinstance(exc, OpscopeError):
            raise exc
        self.session.internal_error(exc)

    def _enter(self, module: torch.nn.Module, path: str, args: Any) -> None:
        s = self.session
        op = type(module).__name__
        call = -1
        try:
            name = module_phase(s)
            if self.on and s.capturing and s.recorder.selected(path, op, name):
                phase = PHASE_CODES[name]
                # one native call walks the arguments, own parameters and keyword arguments
                # (None: something only Python walks, or named_parameters overridden)
                kwargs = module_kwargs(module, args)
                params = module._parameters if type(module).named_parameters is _NAMED_PARAMETERS else None
                found = None if params is None else self.native.record_module(
                    op, path, phase, args, params, -1, False, kwargs)
                if found is None:  # (record_module names new own parameters itself)
                    self.native.set_params(s.modules.learn(module, path))
                    found = self.native.record_call(op, path, phase, module_inputs(module, args, kwargs), (), -1)
                call = found
        except Exception as exc:
            self._guard(exc)
        self._calls.append(call)

    def _exit(self, module: torch.nn.Module, path: str, args: Any, output: Any) -> None:
        s = self.session
        call = self._calls.pop() if self._calls else -1
        if call < 0 or output is None or not (self.on and s.capturing):
            return
        op = type(module).__name__
        try:
            # outputs that require grad get a C++ hook: their gradient's row in backward
            name = module_phase(s)
            grads = self._grads and hooks_gradients(s, name) and s.recorder.selected(path, op, "backward")
            phase = PHASE_CODES[name]
            if self.native.record_module(op, path, phase, output, None, call, grads) is None:
                outs = [(i, None, t) for i, t in enumerate(tensors_of(output))]
                self.native.record_call(op, path, phase, (), outs, call, grads)
        except Exception as exc:
            self._guard(exc)
