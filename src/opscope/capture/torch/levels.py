"""The three capture levels behind one small interface: activate / deactivate / remove.

- ``aten``: every dispatcher op (:class:`~opscope.capture.torch.dispatch.DumpDispatchMode`).
- ``api``: torch / torch.nn.functional / Tensor-method calls, through a TorchFunctionMode;
  backward recorded per autograd node of each call's outputs.
- ``module``: module inputs, parameters and outputs through global module hooks; backward
  as the gradients arriving at each module output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from opscope.capture.torch.api_writes import WRITTEN as _WRITTEN
from opscope.capture.torch.api_writes import makes_empty_call, unmarked_writes, writes_first, written_args
from opscope.capture.torch.dataflow import grad_fn_of, holds_elements_of
from opscope.capture.torch.dispatch import DumpDispatchMode, args_of
from opscope.capture.torch.module_kwargs import module_kwargs
from opscope.capture.torch.modules import run_eagerly, tensors_of
from opscope.model.calls import overwrites_first, rearranges, views_first

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opscope.capture.torch.host import CaptureHost, GraphItem


class Level:
    """Base: a level that installs nothing (module hooks are always on)."""

    def __init__(self, session: CaptureHost) -> None:
        self.session = session
        self.on = False

    def activate(self) -> None:
        self.on = True

    def deactivate(self) -> None:
        self.on = False

    def remove(self) -> None:
        self.deactivate()

    def set_phase(self, phase: str) -> None:
        """The session's phase changed (levels that do not read it per op are told)."""

    def recompute(self, on: bool) -> None:
        """Activation checkpointing's recomputation of a forward starts (``on``) or ends, inside
        the backward (after :meth:`set_phase` was told ``recompute``, before it is told the
        phase after)."""

    def stop_capture(self) -> None:
        """Capture stopped for good (an internal error); levels that do not check per op stop."""

    def forked(self) -> None:
        """In a child process (a DataLoader worker): capture nothing, pay nothing."""
        self.stop_capture()

    def record_graph(self, op: str, path: str, phase: str, inputs: Sequence[GraphItem],
                     outputs: Sequence[GraphItem], call: int = -1) -> int:
        """A compiled graph's inputs (``call`` -1: a new call) or outputs (the call its inputs
        got); returns the call index. Recorded as a module call is, at every level."""
        return self.session.recorder.record(op, path, phase, inputs, outputs, call=None if call < 0 else call)


class _ModeLevel(Level):
    mode: Any
    _pushed = False  # the mode entered again for a recomputation

    def recompute(self, on: bool) -> None:
        """The autograd engine runs the backward without the thread's torch-function modes:
        an API mode is entered again for the recomputation, so that its calls are recorded
        (and a reentrant checkpoint's nested backward, through their autograd nodes)."""
        if on and self.on and not self._pushed and _current_mode(self.mode) is None:
            self.mode.__enter__()
            self._pushed = True
        elif not on and self._pushed and self._on_top():
            self._pushed = False
            self.mode.__exit__(None, None, None)

    def activate(self) -> None:
        if not self.on:
            self.mode.__enter__()
            self.on = True

    def deactivate(self) -> None:
        """Leave the mode stack, unless someone pushed a mode above ours since: leaving pops
        the top, which would be theirs. Then the mode stays, passing every op through (the
        session is not capturing), and leaves at a later boundary or at stop."""
        if self.on and self._on_top():
            self.on = False
            self.mode.__exit__(None, None, None)

    def remove(self) -> None:
        if self.on and not self._on_top():
            # stop() with a foreign mode still above ours: take ours out from under it
            _remove_from_stack(self.mode)
            self.on = False
        self.deactivate()

    def _on_top(self) -> bool:
        return _current_mode(self.mode) is self.mode


def _current_mode(mode: Any) -> Any:
    if isinstance(mode, TorchFunctionMode):
        from torch.overrides import _get_current_function_mode

        return _get_current_function_mode()
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def _remove_from_stack(mode: Any) -> None:
    """Pop the modes above ``mode``, pop ``mode``, push the others back in their order."""
    above = []
    while _current_mode(mode) is not mode and _current_mode(mode) is not None:
        top = _current_mode(mode)
        top.__exit__(None, None, None)
        above.append(top)
    if _current_mode(mode) is mode:
        mode.__exit__(None, None, None)
    for other in reversed(above):
        other.__enter__()


class AtenLevel(_ModeLevel):
    def __init__(self, session: CaptureHost) -> None:
        super().__init__(session)
        self.mode = DumpDispatchMode(session)


# Tensor methods and properties that only describe a tensor: never worth a record.
_SKIP_API = frozenset("""
size dim shape stride numel element_size is_contiguous data_ptr storage_offset untyped_storage
device dtype layout requires_grad grad_fn is_leaf is_cuda is_sparse is_quantized is_meta is_complex
is_floating_point item tolist __len__ __repr__ __format__ __hash__ __bool__ __index__ __int__ __float__
__iter__ __contains__ __array__ _version grad data names ndim nbytes itemsize T mT H mH real imag
""".split())

_NAMES: dict[Any, str | None] = {}


def api_name(func: Any) -> str | None:
    name = _NAMES.get(func, "")
    if name == "":
        try:
            name = resolve_name(func)
        except Exception:  # some builtins have no resolvable name
            name = None
        qualname = getattr(func, "__qualname__", "")
        if name is None and qualname.startswith("_VariableFunctionsClass."):
            # a private torch function torch.overrides does not name: torch._weight_norm (a
            # weight-normed conv's weight, Wav2Vec2's positional conv) made a weight no record
            # had made, a root at every step
            name = "torch." + qualname.rpartition(".")[2]
        short = (name or "").rsplit(".", 1)[-1]
        if name is None or short in _SKIP_API or name.endswith(".__get__") or name.endswith(".__set__"):
            name = None
        elif name.startswith("torch.Tensor."):
            name = "Tensor." + name[len("torch.Tensor."):]
        _NAMES[func] = name
    return name


_is_compiling = torch.compiler.is_compiling


class ApiCalls(TorchFunctionMode):
    """What both API modes (this Python one and the native one, ``native/api.py``) do with a
    torch-function call: pass it through untouched while dynamo traces it (its trace must not
    depend on opscope's state), when it only describes a tensor (``_SKIP_API``: one dictionary
    look-up) or when the session does not capture; else :meth:`begin` before the call (its
    inputs: an in-place call changes them) and :meth:`end` after it, with what ``begin``
    returned unless that is None (the call not recorded)."""

    def __init__(self, session: CaptureHost) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if _is_compiling():
            return func(*args, **kwargs)
        name = _NAMES.get(func, "")
        if name == "":
            name = api_name(func)
        s = self.session
        if name is None or not s.capturing:
            return func(*args, **kwargs)
        token = self.begin(name, s.modules.path, s.phase, args, kwargs)
        written = _WRITTEN.get(name)  # (one look-up a call: the hot path)
        if written is None:
            written = written_args(name)
        if written:  # (after begin took their input rows)
            self.write_unmarked(unmarked_writes(written, args, kwargs))
        out = func(*args, **kwargs)
        if token is not None:
            self.end(token, out)
        return out

    def begin(self, name: str, module: str, phase: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Call ``name`` (in ``module``, ``phase``) is about to run: what :meth:`end` needs, or None."""
        raise NotImplementedError

    def end(self, token: Any, out: Any) -> None:
        """The call that :meth:`begin` returned ``token`` for returned ``out``."""
        raise NotImplementedError

    def write_unmarked(self, items: list[tuple[int, None, torch.Tensor]]) -> None:
        """The call about to run writes these tensors without moving their version counters
        (api_writes.unmarked_writes): the write is counted as an in-place call's."""
        raise NotImplementedError


run_eagerly(ApiCalls.__torch_function__)


def call_inputs(args: tuple, kwargs: dict[str, Any]) -> list[tuple[int, str | None, torch.Tensor]]:
    """A call's input items (slot, keyword or None, tensor): a keyword's tensors are named by it
    (replay rebuilds the call from the names)."""
    inputs: list[tuple[int, str | None, torch.Tensor]] = [(i, None, t) for i, t in enumerate(tensors_of(args))]
    if kwargs:
        inputs += [(len(inputs) + j, k, t) for j, (k, t) in enumerate(_keyword_tensors(kwargs))]
    return inputs


class _ApiMode(ApiCalls):
    def begin(self, name: str, module: str, phase: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        s = self.session
        call = None
        empty = False
        writes = writes_first(name)
        if s.recorder.selected(module, name, phase):  # inputs before the op: an in-place op changes them
            # a call writing part of an empty (`q[:, :8] = h`), or viewing one: what it reads and
            # leaves is no data yet
            empty = (writes or rearranges(name)) and not overwrites_first(name) and bool(args) and \
                s.recorder.holds_no_data(args[0])
            call = s.recorder.record_inputs(name, module, phase, call_inputs(args, kwargs), args=args_of(args, kwargs),
                                            source=s.source() if s.cfg.source else None, empty_first=empty,
                                            views=views_first(name))
        if writes or "out" in kwargs:
            for t in tensors_of((args[:1], kwargs.get("out"))):
                s.recorder.before_write(t)
        first = args[0] if args and writes else None
        return None if call is None else (call, name, module, args[0] if empty else None, makes_empty_call(name, args),
                                          first)

    def write_unmarked(self, items: list[tuple[int, None, torch.Tensor]]) -> None:
        for _, _, t in items:
            self.session.recorder.before_write(t)

    def end(self, token: Any, out: Any) -> None:
        # (empty: the first argument, written in part, where it held no data; made: a call
        # that returns an empty)
        call, name, module, empty, made, first = token
        s = self.session
        outputs = [(i, None, t) for i, t in enumerate(tensors_of(out))] or (
            [(0, None, empty)] if empty is not None else [])  # (Tensor.__setitem__ returns nothing)
        if not outputs and isinstance(first, torch.Tensor):  # written in place, not returned
            s.recorder.record_written(call, first)
        # torch moved the version of what the call wrote before it returned: the next use
        # of the tensor links to this row
        # (an output holding the first argument's elements, a view of it: linked to its row)
        views = tuple(i for i, _, t in outputs if holds_elements_of(t, call[3])) if views_first(name) else ()
        s.recorder.record_outputs(call, outputs, mutated=tuple(range(len(outputs))) if writes_first(name) else (),
                                  bumped=True, uninitialized=empty is not None or made, views=views)
        if "backward" in s.cfg.phases:
            _hook_backward(s, name, module, out)


def _keyword_tensors(kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    return [(k, t) for k, v in kwargs.items() for t in tensors_of(v)]


def _hook_backward(s: CaptureHost, name: str, module: str, out: Any) -> None:
    for t in tensors_of(out):
        node = grad_fn_of(t)
        if node is None:
            continue
        meta: dict[str, Any] = node.metadata  # a dict property (torch's stub: a method)
        if "opscope_api" not in meta:
            meta["opscope_api"] = True
            node.register_hook(_backward_recorder(s, name, module, node.name()))


def _backward_recorder(s: CaptureHost, name: str, module: str, node_name: str) -> Any:
    views = views_first(name)  # (a view's or a transpose's gradient: a view of the incoming one, linked)

    def hook(grad_inputs: tuple, grad_outputs: tuple) -> None:
        s.backward_ran()
        if s.capturing and s.recorder.selected(module, name, "backward"):
            inputs = [(i, "grad_output", g) for i, g in enumerate(grad_outputs) if isinstance(g, torch.Tensor)]
            outputs = [(i, "grad_input", g) for i, g in enumerate(grad_inputs) if isinstance(g, torch.Tensor)]
            call = s.recorder.record_inputs(name, module, "backward", inputs, views=views, fwd_op=name, node=node_name)
            slots = tuple(i for i, _, g in outputs if holds_elements_of(g, call[3])) if views else ()
            s.recorder.record_outputs(call, outputs, views=slots)
    return hook


_graph_task = torch._C._current_graph_task_id  # -1 outside the autograd engine's backward


def module_phase(s: CaptureHost) -> str:
    """The phase of a module call made now (both paths of the module level). A call the autograd
    engine makes inside its backward, outside activation checkpointing (a custom autograd
    Function's backward: Reformer's reversible layers remake their inputs from their outputs and
    run their feed-forward again), is a recomputation, as checkpointing's are: its inputs, made
    by code no module brackets, are judged as recomputed values (they were ``forward`` rows, and
    under bf16 such an input was named a root of the first step)."""
    return "recompute" if _graph_task() >= 0 else s.phase


def hooks_gradients(s: CaptureHost, phase: str | None = None) -> bool:
    """Do the outputs of the module call ending now get gradient hooks (both paths)? Not in a
    recomputation (activation checkpointing): the non-reentrant variant runs no backward over
    its outputs, and the reentrant one's nested backward gives a tensor the block returns only
    the gradient of its uses outside the block (T5's position bias: the other block's share).
    Not where the module ran without grad: what requires grad there passed through it from
    outside (a reentrant checkpoint's forward), and its gradient is not the module's. An
    output of the reentrant variant's Function is left out per tensor, for the same reason."""
    return (phase or s.phase) != "recompute" and torch.is_grad_enabled()


class ApiLevel(_ModeLevel):
    def __init__(self, session: CaptureHost) -> None:
        super().__init__(session)
        self.mode = _ApiMode(session)


class ModuleLevel(Level):
    """Module inputs, own parameters and outputs; gradients at module outputs in backward."""

    def __init__(self, session: CaptureHost) -> None:
        super().__init__(session)
        session.modules._on_enter = self._enter
        session.modules._on_exit = self._exit
        self._calls: list[int] = []

    def _enter(self, module: torch.nn.Module, path: str, args: Any) -> None:
        s = self.session
        op = type(module).__name__
        phase = module_phase(s)
        if not (self.on and s.capturing and s.recorder.selected(path, op, phase)):
            self._calls.append(-1)
            return
        s.modules.learn(module, path)
        inputs = module_inputs(module, args, module_kwargs(module, args))
        self._calls.append(s.recorder.record(op, path, phase, inputs, []))

    def _exit(self, module: torch.nn.Module, path: str, args: Any, output: Any) -> None:
        s = self.session
        op = type(module).__name__
        call = self._calls.pop() if self._calls else -1
        if call < 0 or output is None or not (self.on and s.capturing):
            return
        outs = tensors_of(output)
        phase = module_phase(s)
        s.recorder.record(op, path, phase, [], [(i, None, t) for i, t in enumerate(outs)], call=call)
        if "backward" in s.cfg.phases and hooks_gradients(s, phase):
            for i, t in enumerate(outs):
                if t.requires_grad and type(t.grad_fn).__name__ != "CheckpointFunctionBackward":
                    t.register_hook(self._grad_hook(op, path, i))

    def _grad_hook(self, op: str, path: str, slot: int) -> Any:
        s = self.session

        def hook(grad: torch.Tensor | None) -> None:
            # (a compiled backward hands None for an output no gradient reached)
            if grad is not None and s.capturing and s.recorder.selected(path, op, "backward"):
                s.recorder.record(op, path, "backward", [(slot, "grad_output", grad)], [])
        return hook


def module_inputs(module: torch.nn.Module, args: Any,
                  kwargs: dict[str, Any] | None = None) -> list[tuple[int, str | None, torch.Tensor]]:
    """A module call's input items (slot, arg name, tensor): its tensor arguments, then its
    own parameters by name, then the tensors of ``kwargs`` by keyword."""
    inputs: list[tuple[int, str | None, torch.Tensor]] = [(i, None, t) for i, t in enumerate(tensors_of(args))]
    n = len(inputs)
    inputs += [(n + i, name, p) for i, (name, p) in enumerate(module.named_parameters(recurse=False))]
    if kwargs:
        inputs += [(len(inputs) + j, k, t) for j, (k, t) in enumerate(_keyword_tensors(kwargs))]
    return inputs


def make(level: str, session: CaptureHost) -> Level:
    return {"aten": AtenLevel, "api": ApiLevel, "module": ModuleLevel}[level](session)
