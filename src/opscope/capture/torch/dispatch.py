"""aten-level capture: a private TorchDispatchMode that sees every dispatcher op,
forward, backward (attributed through the autograd node being executed) and optimizer."""

from __future__ import annotations

from threading import get_ident
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opscope.errors import OpscopeError
from opscope.model.calls import empty_base

if TYPE_CHECKING:
    from opscope.capture.torch.host import CaptureHost

_current_node = torch._C._current_autograd_node
# Argument positions written in place that the schema does not mark: batch norm's kernels update
# running_mean and running_var in training, declared plain ``Tensor?``, and torch moves no
# version counter for them. A capture that links a tensor to the row that last measured it
# (same object, same version) must forget that row after such an op, or it reports the
# statistics from before the update; the statistics worker must measure them before it runs.
UNMARKED_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4), "miopen_batch_norm": (3, 4),
                   "batch_norm_update_stats": (1, 2), "batch_norm_gather_stats": (3, 4),
                   "batch_norm_gather_stats_with_counts": (3, 4)}

# torch.distributed's collectives (the ops of these namespaces). What one writes arrives when it
# completes, on gloo's worker thread or NCCL's stream, after its op returned: its outputs are
# measured at their next read (model/records.py COLLECTIVE_NOTE). Their schemas mark no
# argument written: a destination (``output_tensor``...) is filled without being read, and
# ``tensors`` (all-reduce, broadcast, reduce, receive) is written in place.
COLLECTIVES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
_DESTINATIONS = frozenset(("output_tensor", "output_tensors", "outputs", "output", "output_lists"))
_RECEIVES = ("c10d.recv_", "c10d.recv_any_source_")
_PENDING = ("_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd")
# Custom ops' arguments filled without being read that their schemas do not say: FSDP lays this
# rank's shards into the all-gather's buffer, whose other ranks' parts the all-gather fills.
UNREAD_ARGS = {"fsdp.all_gather_copy_in": frozenset(("all_gather_output",))}
# Outputs that hold no data yet: that buffer, returned whole.
UNFILLED_OUTPUTS = {"fsdp.all_gather_copy_in.default": (1,)}


def _unread(name: str, arg: Any) -> bool:
    """Does op ``name`` fill argument ``arg`` (its schema's) without reading it?"""
    if arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write:
        return True  # out=: mul.out into a DDP bucket, FSDP's split_with_sizes_copy
    base = name.rsplit(".", 1)[0]
    if arg.name in UNREAD_ARGS.get(base, ()):
        return True
    if name.split(".", 1)[0] not in COLLECTIVES:
        return False
    return arg.name in _DESTINATIONS or (arg.name == "tensors" and base in _RECEIVES) \
        or base in _PENDING  # a functional collective's result, not there until it is waited for


def _collective_writes(name: str, arg: str) -> bool:
    """Does collective ``name`` write its argument ``arg`` (unmarked in its schema)?"""
    return arg in _DESTINATIONS or (arg == "tensors" and not name.startswith(("c10d.send", "c10d.barrier")))


class OpInfo:
    """What the schema of one aten overload says, computed once per overload."""

    __slots__ = ("name", "arg_names", "written", "unmarked", "view_outputs", "written_outputs", "uninitialized",
                 "random", "unread", "collective", "unfilled", "written_names")

    def __init__(self, func: Any) -> None:
        self.name = str(func)
        schema = func._schema
        self.arg_names = [a.name for a in schema.arguments]
        self.written = tuple(i for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.collective = self.name.split(".", 1)[0] in COLLECTIVES
        # arguments it fills without reading them: an out= argument, a collective's destination
        self.unread = frozenset(a.name for a in schema.arguments if _unread(self.name, a))
        if self.collective:
            self.written = tuple(sorted({*self.written, *(i for i, a in enumerate(schema.arguments)
                                                           if _collective_writes(self.name, a.name))}))
        self.view_outputs = tuple(i for i, r in enumerate(schema.returns)
                                  if r.alias_info is not None and not r.alias_info.is_write)
        self.written_outputs = tuple(i for i, r in enumerate(schema.returns)
                                     if r.alias_info is not None and r.alias_info.is_write)
        base = self.name.split(".")[1] if self.name.count(".") >= 1 else self.name
        self.unmarked = UNMARKED_WRITES.get(base, ())
        # empty, empty_like, new_empty, empty_strided...: their outputs are not data yet
        self.uninitialized = empty_base(base)
        self.random = torch.Tag.nondeterministic_seeded in func.tags  # replay needs its generator state
        self.unfilled = UNFILLED_OUTPUTS.get(self.name, ())
        self.written_names = frozenset(self.arg_names[i] for i in (*self.written, *self.unmarked)
                                       if i < len(self.arg_names))


_INFO: dict[Any, OpInfo] = {}


def op_info(func: Any) -> OpInfo:
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = OpInfo(func)
    return info


def flat_inputs(info: OpInfo, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> list[tuple[int, str | None, torch.Tensor]]:
    out: list[tuple[int, str | None, torch.Tensor]] = []
    names = info.arg_names
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            out.append((len(out), names[i] if i < len(names) else None, a))
        elif isinstance(a, (list, tuple)):
            name = names[i] if i < len(names) else None
            flat = [z for y in a for z in (y if isinstance(y, (list, tuple)) else (y,))]
            base = len(out)  # (taken once: out grows while the list's tensors are added)
            out.extend((base + j, name, x) for j, x in enumerate(y for y in flat if isinstance(y, torch.Tensor)))
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            out.append((len(out), k, v))
    return out


def flat_outputs(out: Any) -> list[tuple[int, str | None, torch.Tensor]]:
    if isinstance(out, torch.Tensor):
        return [(0, None, out)]
    if isinstance(out, (list, tuple)):
        res: list[tuple[int, str | None, torch.Tensor]] = []
        for i, x in enumerate(out):
            if isinstance(x, torch.Tensor):
                res.append((i, None, x))
            elif isinstance(x, (list, tuple)):  # _foreach ops return lists, some collectives lists of lists
                flat = [z for y in x for z in (y if isinstance(y, (list, tuple)) else (y,))]
                tensors = [z for z in flat if isinstance(z, torch.Tensor)]
                res.extend((len(res) + j, None, y) for j, y in enumerate(tensors))
        return res
    return []


def written_tensors(info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any],
                    positions: tuple[int, ...] | None = None) -> list[torch.Tensor]:
    """Tensors an op writes in place (its ``Tensor(a!)`` arguments, lists included), or those
    at ``positions``."""
    found: list[torch.Tensor] = []
    for i in info.written if positions is None else positions:
        a = args[i] if i < len(args) else kwargs.get(info.arg_names[i])
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):  # (a collective's output lists may nest)
            found.extend(x for y in a for x in (y if isinstance(y, (list, tuple)) else (y,))
                         if isinstance(x, torch.Tensor))
    return found


class DumpDispatchMode(TorchDispatchMode):
    """Records every aten op while the session is capturing a selected step."""

    def __init__(self, session: CaptureHost) -> None:
        super().__init__()
        self.session = session
        # Ops are recorded on the thread that made the mode and in autograd's nodes. Torch
        # hands a thread's modes to the threads that do work for it: gloo's worker threads
        # run a collective's own ops (the all-gather's copies), whose order against the
        # training thread's is the scheduler's, and whose effect the collective's outputs show.
        self.home = get_ident()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """torch.compile compiles with this mode on the stack (else it would run the model
        eagerly: other numbers than the compiled run), turns it off while it compiles (its
        ops run on fake tensors) and on again while the compiled code runs."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        s = self.session
        if not s.capturing:
            return func(*args, **kwargs)
        foreign = get_ident() != self.home and _current_node() is None
        if foreign or s.collective_depth:
            # a collective's own work: on another thread given this one's modes (gloo's worker
            # copying into an all-gather's output), or beside its c10d op inside its Python call
            # (gloo's reduce-scatter splitting its buffer): not recorded, what it writes told
            info = op_info(func)
            if foreign or not info.collective:
                out = func(*args, **kwargs)
                if info.written:
                    try:
                        s.recorder.foreign_write([t for _, _, t in flat_inputs(info, args, kwargs)],
                                                 written_tensors(info, args, kwargs))
                    except Exception as exc:  # opscope's own failure must never stop the collective
                        s.internal_error(exc)
                return out
        try:
            info = op_info(func)
            call = self._record_inputs(info, args, kwargs)  # before an in-place op changes them
            written, unmarked = self._before_write(info, args, kwargs)
        except OpscopeError:
            raise
        except Exception as exc:  # opscope's own failure must never stop the user's op
            s.internal_error(exc)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if call is not None:
            try:
                self._record_outputs(info, call, out, written, unmarked)
            except OpscopeError:
                raise
            except Exception as exc:
                s.internal_error(exc)
        return out

    def _before_write(self, info: OpInfo, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Tensors the op writes in place, once no pending statistic reads them any more
        (their input rows, just taken, included): those its schema marks, and the others."""
        written = written_tensors(info, args, kwargs) if info.written else []
        recorder = self.session.recorder
        unmarked = written_tensors(info, args, kwargs, info.unmarked) if info.unmarked else []
        for t in (*written, *unmarked):
            recorder.before_write(t)
        return written, unmarked

    def _record_inputs(self, info: OpInfo, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        s = self.session
        node = _current_node()
        if node is not None and not (s.phase == "recompute" and node is s.recompute_node):
            # torch's stub declares Node.metadata a method; autograd's C++ nodes make it a dict property
            tag = node.metadata.get("opscope")  # type: ignore[attr-defined]
            module, fwd_op, phase = (tag[0], tag[1], "backward") if tag else ("", None, "backward")
            node_name = node.name()
            s.backward_ran()
        else:
            module, fwd_op, node_name = s.modules.path, None, None
            phase = s.phase
        if not s.recorder.selected(module, info.name, phase):
            return None
        rng = rng_state(args, kwargs) if info.random else None
        call_args = args_of(args, kwargs) if rng is None else args_with_rng(args_of(args, kwargs), rng)
        return s.recorder.record_inputs(info.name, module, phase, flat_inputs(info, args, kwargs), args=call_args,
                                        views=bool(info.view_outputs), fwd_op=fwd_op, node=node_name,
                                        source=s.source() if s.cfg.source else None, unread=info.unread,
                                        view_op=bool(info.view_outputs), written=info.written_names)

    def _record_outputs(self, info: OpInfo, call: Any, out: Any, written: Any, unmarked: list[torch.Tensor]) -> None:
        outputs = flat_outputs(out)
        mutated = info.written_outputs
        if written and not outputs:  # in-place ops returning nothing (_foreach_add_): their targets are the outputs
            outputs = [(i, None, t) for i, t in enumerate(written)]
            mutated = tuple(range(len(outputs)))
        # what it wrote unmarked (batch norm's running statistics) follows its outputs: their next
        # use links to these rows, made by this op (their version did not move: not `mutated`)
        outputs += [(len(outputs) + j, None, t) for j, t in enumerate(unmarked)]
        self.session.recorder.record_outputs(call, outputs, views=info.view_outputs, mutated=mutated,
                                             uninitialized=info.uninitialized, unfilled=info.unfilled,
                                             collective=info.collective)


def rng_state(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """``(device, state)`` of the generator a random op is about to draw from (state None
    when it cannot be read), so that replay can draw the same numbers."""
    gen = kwargs.get("generator")
    if gen is not None:
        return str(gen.device), gen.get_state()
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    device = torch.device(kwargs.get("device") or device or "cpu")
    if device.type == "cpu":
        return "cpu", torch.get_rng_state()
    if device.type == "cuda":
        return str(device), torch.cuda.get_rng_state(device)
    return str(device), None


def args_with_rng(call_args: tuple[list, dict] | None, rng: tuple[str, Any]) -> str:
    """The ``args`` JSON of a random op, with ``"rng": {"device", "state" (base64)}`` added."""
    import base64
    import json

    pairs, kw = call_args or ([], {})
    state = None if rng[1] is None else base64.b64encode(rng[1].numpy().tobytes()).decode("ascii")
    return json.dumps({"args": [list(p) for p in pairs], "kwargs": kw, "rng": {"device": rng[0], "state": state}},
                      default=str)


_SIMPLE = frozenset((int, float, bool, str, type(None)))


def args_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list, dict] | None:
    """The call's non-tensor arguments, for replay: ``([[position, value], ...], {name: value})``.

    Tensors (and lists of tensors) are left out: they are the call's input rows, found by
    ``arg`` (schema name) and ``slot``. Values other than numbers, strings and lists of
    them (dtype, device, memory_format) are kept as their ``str``. Encoded as JSON when
    the step is written, off the training thread.
    """
    pairs = []
    for i, a in enumerate(args):
        c = a.__class__
        if c in _SIMPLE:
            pairs.append((i, a))
        elif c is list or c is tuple:
            if not any(isinstance(x, torch.Tensor) for x in a):
                pairs.append((i, [x if x.__class__ in _SIMPLE else str(x) for x in a]))
        elif not isinstance(a, torch.Tensor):
            pairs.append((i, str(a)))
    kw = {k: (v if v.__class__ in _SIMPLE else str(v)) for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    if not pairs and not kw:
        return None
    return pairs, kw
