"""The API level of a statistics dump, run natively: a thin ``TorchFunctionMode`` finds each
torch-function call's name, module and phase and its tensors, and hands them to the native
dump module before the call runs (``api_begin``) and after it (``api_end``,
``_c/dumpobs_api.h``), which makes the rows, measures the tensors with the statistics kernel
at once and keeps the data flow in C++. The autograd node of each output that requires grad
gets a C++ post hook, which makes the row of that node's gradients in backward without
entering Python. The step's rows leave C++ as columns, as at the aten and module levels.

The rows are those of :class:`~opscope.capture.torch.levels.ApiLevel` (the Python path,
used with ``data="tensor"``, ``tensor_ops``, ``suspects`` or ``source``, without a C++
compiler, or with ``OPSCOPE_DUMP_BACKEND=python``), checked equal column by column in the
tests. What the Python path spends per call and the native one does not: building each row
as a Python list, handing every new tensor to the statistics thread and collecting its
result, and turning the rows into Arrow on the writer thread (which takes the GIL from the
training thread); see docs/dump-performance.md, "Where the time goes".
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from opscope.capture.torch.api_writes import makes_empty_call, writes_first, written_args
from opscope.capture.torch.dispatch import args_of
from opscope.capture.torch.levels import ApiCalls, _is_compiling, _ModeLevel, api_name, call_inputs
from opscope.capture.torch.modules import SKIPPED, run_eagerly, tensors_of
from opscope.capture.torch.native.aten import NativeAtenLevel
from opscope.config import PHASE_CODES
from opscope.errors import OpscopeError
from opscope.model.calls import makes_empty, overwrites_first, rearranges, views_first

if TYPE_CHECKING:
    import torch

    from opscope.capture.torch.host import CaptureHost


def args_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The ``args`` JSON of a call, as the writer encodes :func:`args_of` for the Python path.
    The same arguments recur every step (the optimizer's coefficients): their text is kept."""
    call_args = args_of(args, kwargs)
    if call_args is None:
        return None
    pairs, kw = call_args
    key = _key(pairs, kw)
    text = _TEXTS.get(key) if key is not None else None
    if text is None:
        text = json.dumps({"args": [list(p) for p in pairs], "kwargs": kw}, default=str)
        if key is not None and len(_TEXTS) < 4096:
            _TEXTS[key] = text
    return text


_TEXTS: dict[tuple[Any, ...], str] = {}
_UNSEEN: Any = object()


def _key(pairs: list[tuple[int, Any]], kw: dict[str, Any]) -> tuple[Any, ...] | None:
    """What the text depends on, with each value's type (1, 1.0 and True are equal keys
    otherwise); None where values are unhashable (lists) or a float zero (0.0 == -0.0)."""
    key = []
    for name, v in (*pairs, *kw.items()):
        c = v.__class__
        if c is list or (c is float and v == 0.0):
            return None
        key.append((name, c, v))
    return (len(pairs), *key)


# api_call's flags (native/_c/dumpobs_apicall.h); SLOW: the call takes begin, end and write_unmarked
UNREAD, WRITES, MUTATED, GRADS, MADE, SLOW, VIEWS = 1, 2, 4, 8, 16, 32, 64
_PLANS: dict[Any, tuple[str, int] | None] = {}  # func -> (name, flags), or None: not recorded


def _plan(func: Any) -> tuple[str, int] | None:
    """What a call of ``func`` takes, found once a function: its name and api_call's flags."""
    name = api_name(func)
    plan = None
    if name is not None:
        first = writes_first(name)
        flags = (UNREAD * overwrites_first(name) | WRITES * (first or rearranges(name)) | MUTATED * first
                 | MADE * makes_empty(name) | VIEWS * views_first(name))
        if written_args(name) or name == "Tensor.new":  # (unmarked writes; an empty by its arguments)
            flags |= SLOW
        plan = (name, flags)
    _PLANS[func] = plan
    return plan


class _NativeApiMode(ApiCalls):
    def __init__(self, session: CaptureHost, native: Any) -> None:
        super().__init__(session)
        self.native = native
        self.grads = "backward" in session.cfg.phases
        self.fallback = native.api_setup(tensors_of, args_text)
        self.failed = self._failed
        self.grads_flag = GRADS * self.grads

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """The call recorded and run in one native call (``api_call``), as ApiCalls'
        begin, call and end would; those run where the call's arguments hold what only
        Python walks, or its name writes more than its first argument."""
        if kwargs is None:
            kwargs = {}
        if _is_compiling():
            return func(*args, **kwargs)
        s = self.session
        try:  # (the user's call runs outside: its errors are its own)
            plan = _PLANS.get(func, _UNSEEN)
            if plan is _UNSEEN:
                plan = _plan(func)
            record = plan is not None and s.capturing
            if record:
                name, flags = plan
                module, phase = s.modules.path, s.phase
                record = bool(flags & SLOW) or s.recorder.selected(module, name, phase)
        except Exception as exc:  # opscope's own failure: the call runs unrecorded
            self._failed(exc)
            record = False
        if not record:
            return func(*args, **kwargs)
        if flags & SLOW:
            return ApiCalls.__torch_function__(self, func, types, args, kwargs)
        out = self.native.api_call(func, args, kwargs, name, module, PHASE_CODES[phase], flags | self.grads_flag,
                                   self.failed)
        if out is self.fallback:
            return ApiCalls.__torch_function__(self, func, types, args, kwargs)
        return out

    # opscope's failure in these stops capture, never the user's call
    def begin(self, name: str, module: str, phase: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        if not self.session.recorder.selected(module, name, phase):
            return None
        try:
            writes = writes_first(name)
            token: int = self.native.api_begin(name, module, PHASE_CODES[phase], call_inputs(args, kwargs),
                                               args_text(args, kwargs), overwrites_first(name),
                                               writes or rearranges(name), views_first(name))
            # (api_end takes a tensor only)
            return token, name, args[0] if writes and args else None, makes_empty_call(name, args)
        except Exception as exc:
            self._failed(exc)
            return None

    def end(self, token: Any, out: Any) -> None:
        try:
            outputs = [(i, None, t) for i, t in enumerate(tensors_of(out))]
            self.native.api_end(token[0], outputs, writes_first(token[1]), self.grads, token[3], token[2])
        except Exception as exc:
            self._failed(exc)

    def write_unmarked(self, items: list[tuple[int, None, torch.Tensor]]) -> None:
        try:
            self.native.api_write(items)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, OpscopeError):
            raise exc
        self.session.internal_error(exc)


run_eagerly(_NativeApiMode.__torch_function__)


class NativeApiLevel(_ModeLevel, NativeAtenLevel):
    """Torch-function calls through the native dump module; backward per autograd node."""

    def __init__(self, session: CaptureHost, backend: Any) -> None:
        NativeAtenLevel.__init__(self, session, backend)
        backend.set_leaves(SKIPPED)  # what api_call's walk skips, as tensors_of does (shared)
        session.modules.on_change = None  # the mode passes the module path with each call
        self.mode = _NativeApiMode(session, backend)

    # the per-op observer stays unregistered: the mode, and the configuration, change
    def activate(self) -> None:
        if not self.on:
            self.native.configure(True, PHASE_CODES[self.session.phase])
            _ModeLevel.activate(self)

    def deactivate(self) -> None:
        _ModeLevel.deactivate(self)  # leaves the mode stack unless a mode above ours stays
        if not self.on:
            self.native.configure(False, 0)

    def remove(self) -> None:
        _ModeLevel.remove(self)
        NativeAtenLevel.remove(self)  # the native module's state goes

    def forked(self) -> None:
        self.native.configure(False, 0)
