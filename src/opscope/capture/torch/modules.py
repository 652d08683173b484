"""Module tracking: module paths (as ``named_modules()`` names them), parameter names,
the outermost call (for step detection), and module-level capture.

Installed as global module hooks, which are removed on exit. Under ``torch.compile`` the
hooks do nothing while dynamo traces them: a module inside a compiled graph has no
boundary at run time, and a hook traced into the graph would run only at trace time (a
C function in it breaks the graph, once per module). The ``OptimizedModule`` that
``torch.compile(module)`` returns stands for the module it wraps: same path (``_orig_mod``
is never part of a name), same type name and parameters; the wrapped module's own call
inside it is not a second call.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.utils._pytree import tree_flatten


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's or an API call's arguments or output, in ``tree_flatten``'s
    order. Plain tensors, tuples, lists, dicts and scalars are walked here (every hooked
    call has them, and a tree walk costs ~10x more); anything else (namedtuples, registered
    pytree classes, tensor subclasses) goes through ``tree_flatten`` as before."""
    c = type(value)
    if c is torch.Tensor:
        return [value]
    out: list[torch.Tensor] = []
    _collect(value, c, out)
    return out


# types that tree_flatten keeps as leaves and that are never tensors
LEAVES: frozenset[type] = frozenset((int, float, bool, complex, str, bytes, type(None), slice, type(...),
                                     torch.dtype, torch.device, torch.memory_format, torch.layout))
# LEAVES and the other types found to be leaves of tree_flatten that are no tensors (Hugging
# Face's caches, passed to every attention call): skipped without a tree walk from then on,
# here and by the native module level's walk, which holds this very set
SKIPPED: set[type] = set(LEAVES)


def _collect(value: Any, c: type, out: list[torch.Tensor]) -> None:
    if c is torch.Tensor or c is torch.nn.Parameter:
        out.append(value)
    elif c in SKIPPED:
        return
    elif c is tuple or c is list:
        for x in value:
            _collect(x, type(x), out)
    elif c is dict:
        for x in value.values():
            _collect(x, type(x), out)
    else:
        leaves = tree_flatten(value)[0]
        if len(leaves) == 1 and leaves[0] is value and not isinstance(value, torch.Tensor):
            SKIPPED.add(c)  # (a pytree node type is one for good: tree_flatten decides by type)
        else:
            out.extend(x for x in leaves if isinstance(x, torch.Tensor))


# tensor types that are their own data (a subclass may dispatch to Python and hold none of
# its own); a parameter's ``grad`` is read natively as Python reads it
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def local(t: Any) -> Any:
    """A DTensor's local shard (the values this rank holds: FSDP2's and tensor parallelism's
    parameters and gradients), else ``t`` itself. Recorded as the shard, a parameter has
    statistics and links to the aten ops that update that shard."""
    to_local = getattr(t, "to_local", None) if t is not None and type(t) not in PLAIN_TENSORS else None
    if to_local is None:
        return t
    with torch.no_grad():
        return to_local()


WRAPPED = "_orig_mod"  # the attribute under which an OptimizedModule holds the compiled module


def strip_wrapped(name: str) -> str:
    """``name`` without ``_orig_mod`` components: the path the module has without compile."""
    if WRAPPED not in name:
        return name
    return ".".join(part for part in name.split(".") if part != WRAPPED)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module an ``OptimizedModule`` (``torch.compile(module)``) wraps, else ``module``."""
    if type(module).__name__ == "OptimizedModule":
        inner = module.__dict__.get("_modules", {}).get(WRAPPED)
        if inner is not None:
            return inner
    return module


_is_compiling = torch.compiler.is_compiling
# the autograd engine's graph task this thread runs (-1: none): a module called inside it
# (activation checkpointing's recomputation of a forward) is no outermost call of a forward
_graph_task = torch._C._current_graph_task_id


def run_eagerly(*functions: Callable[..., Any]) -> None:
    """Never let dynamo compile a frame of ``functions``, nor a frame they call, when torch
    calls them from code that runs eagerly (dynamo inlining them while it traces is unchanged).

    Under ``torch.compile`` a frame that dynamo gives up on runs eagerly, and dynamo still
    tries every Python frame that it calls: the module hooks and the torch-function mode
    among them. Such a compiled hook sees ``is_compiling()`` true and records nothing (the
    modules and calls of that frame were missing from the dump), and torch 2.13 guards a
    compiled ``__torch_function__`` on its arguments but not on ``func``: ``x.device`` ran
    the code compiled for ``x.shape`` and handed the model a ``torch.Size``. A torch without
    the per-code switch keeps its default.
    """
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # pragma: no cover - a torch without it
        return
    for fn in functions:
        set_code_exec_strategy(fn.__code__, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


class ModuleTracker:
    """Keeps the stack of module paths being executed.

    Args:
        on_outer_call: called with the module before each call of an outermost module.
        on_enter / on_exit: optional per-module callbacks for module-level capture,
            ``on_enter(module, path, args)`` and ``on_exit(module, path, args, output)``.

    A module called while the autograd engine runs a backward on this thread (activation
    checkpointing running a forward again: capture/torch/checkpointing.py) is no outermost
    call of a forward pass.
    """

    def __init__(self, on_outer_call: Callable[[torch.nn.Module], None],
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
        self._callers: list[torch.nn.Module | None] = []  # the modules of the stack's entries
        self._shadows: list[bool] = []  # per entry: a compiled module's own call inside its OptimizedModule
        self.on_change: Callable[[str], None] | None = None  # the innermost module path changed
        self.on_indexed: Callable[[torch.nn.Module], None] | None = None  # a root's names were learnt
        self.said: list[str] = []  # what the dump's notes say of the model (TENSOR_PARALLEL_NOTE)

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
        self._callers.clear()
        self._shadows.clear()

    def index(self, root: torch.nn.Module) -> None:
        """Learn the names of ``root``'s submodules and parameters."""
        for name, m in root.named_modules(remove_duplicate=False):
            self.names.setdefault(id(m), strip_wrapped(name))
        for name, p in root.named_parameters(remove_duplicate=False):
            self.param_names.setdefault(id(p), strip_wrapped(name))
        for name, b in root.named_buffers(remove_duplicate=False):
            self.param_names.setdefault(id(b), strip_wrapped(name))
        if self.on_indexed is not None:
            self.on_indexed(root)
        if self._on_exit is not None and TENSOR_PARALLEL_NOTE not in self.said and _tensor_parallel(root):
            self.said.append(TENSOR_PARALLEL_NOTE)
            warnings.warn(f"opscope: {TENSOR_PARALLEL_NOTE}", RuntimeWarning, stacklevel=5)  # the model's call

    def learn(self, module: torch.nn.Module, path: str) -> list[tuple[torch.Tensor, str]]:
        """Name ``module``'s own parameters that :meth:`index` did not see (``path.name``) and
        return them: a wrapper set them after the model was indexed, as FSDP2 sets each
        layer's unsharded parameters before its forward. Unnamed, such a weight reads as a
        tensor no op made: the enclosing module's own code. A name is dropped with its tensor,
        so that no later tensor takes it by its id."""
        new: list[tuple[torch.Tensor, str]] = []
        for key, p in module._parameters.items():
            if p is not None and id(p) not in self.param_names:
                name = f"{path}.{key}" if path else key
                self.param_names[id(p)] = name
                weakref.finalize(p, self.param_names.pop, id(p), None)
                new.append((p, name))
        return new

    def _name(self, module: torch.nn.Module) -> str:
        name = self.names.get(id(module))
        if name is None:
            inner = unwrap(module)  # an OptimizedModule made after indexing: its module's name
            name = self.names.get(id(inner)) if inner is not module else None
            if name is None:
                # no module of the model: named after its caller at each call, never kept. A
                # module made inside a forward (transformers' ACT2FN[...] in Mamba's reference
                # kernels) is another object at each call, and a later one may take a freed
                # one's id; one shared by several modules has as many callers.
                parent = self.path
                return f"{parent}.{type(inner).__name__}" if parent else type(inner).__name__
            self.names[id(module)] = name
        return name

    def _shadow(self, module: torch.nn.Module) -> bool:
        """A call that is no module of the model, whose work belongs to its caller: the
        compiled module's own call inside its OptimizedModule's, or a graph that
        torch.compile made (AOT autograd calls its GraphModules as modules)."""
        if self._callers:
            caller = self._callers[-1]
            if caller is not None and caller is not module and unwrap(caller) is module:
                return True
        return id(module) not in self.names and isinstance(module, torch.fx.GraphModule)

    def hooked(self) -> int:
        """The stack's depth without the entries :meth:`set_inner` made (compiled graphs' scopes)."""
        depth = len(self._callers)
        while depth and self._callers[depth - 1] is None:
            depth -= 1
        return depth

    def name_of(self, obj: Any) -> str | None:
        """The path of a module of the model (None: not a module of it)."""
        if not isinstance(obj, torch.nn.Module):
            return None
        name = self.names.get(id(obj))
        return name if name is not None else self.names.get(id(unwrap(obj)))

    def set_inner(self, depth: int, path: str | None) -> None:
        """Inside a compiled graph run as its FX code: the module its next ops belong to
        (``path``; None: back to the graph's caller at stack ``depth``)."""
        del self.stack[depth:], self._callers[depth:], self._shadows[depth:]
        if path is not None and path != self.path:
            self.stack.append(path)
            self._callers.append(None)
            self._shadows.append(False)
        if self.on_change is not None:
            self.on_change(self.path)

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if _is_compiling():  # traced by dynamo (see the module docstring)
            return
        shadow = self._shadow(module)
        if not self.stack and not shadow and _graph_task() < 0:
            if id(module) not in self.names:
                self.index(_generating_owner(module) or module)
            self._on_outer_call(module)
        path = self.path if shadow else self._name(module)
        self.stack.append(path)
        self._callers.append(module)
        self._shadows.append(shadow)
        if shadow:
            return
        if self.on_change is not None:
            self.on_change(path)
        if self._on_enter is not None:
            self._on_enter(unwrap(module), path, args)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_compiling():
            return
        callers = self._callers
        if not callers or callers[-1] is not module:
            # Under torch.compile a call's hooks need not pair up: dynamo turns a frame that
            # graph-breaks into code without its (traced) hooks, and a compiled graph's
            # scopes replace the entries above it. Only this module's own entry is popped,
            # with whatever is left above it; a call without one has nothing to pop.
            if not any(c is module for c in callers):
                return
            while callers[-1] is not module:
                del self.stack[-1], callers[-1], self._shadows[-1]
        path = self.stack.pop()
        callers.pop()
        if self._shadows.pop():
            return
        if self.on_change is not None:
            self.on_change(self.stack[-1] if self.stack else "")
        if self._on_exit is not None:
            self._on_exit(unwrap(module), path, args, output)


# At the module level a module's global hooks run before its own: the output recorded is the
# one a tensor-parallel plan's forward hook (torch's distribute_module) has not turned yet
TENSOR_PARALLEL_NOTE = (
    "level='module' under tensor parallelism: a module's output is recorded before the plan's own forward "
    "hook turns it (a row-parallel projection's partial sums, before their all-reduce), so compare may name "
    "a module on a rank whose output another rank changed - dump at level='aten', which records the shards' "
    "ops and the collectives (docs/dump.md, \"DTensor\")")


def _tensor_parallel(root: torch.nn.Module) -> bool:
    """Has a module of ``root`` a forward hook of torch's tensor parallelism (distribute_module)?"""
    return any(str(getattr(hook, "__module__", "")).startswith("torch.distributed.tensor")
               for m in root.modules() for hook in m._forward_hooks.values())


def _generating_owner(module: torch.nn.Module) -> torch.nn.Module | None:
    """The model whose ``generate`` (Hugging Face's) calls ``module``, one of its submodules,
    before the model itself: an encoder-decoder runs its encoder first. Indexed as the root,
    the encoder's modules get the model's paths (``encoder.block.0``), as in its later calls
    and in training, instead of paths from the encoder (``block.0``). Looked for in the
    calling frames once, at a root's first call."""
    import sys

    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(owner, torch.nn.Module) and owner is not module and callable(getattr(owner, "generate", None)):
            return owner if any(m is module for m in owner.modules()) else None
        frame = frame.f_back
    return None


run_eagerly(ModuleTracker._pre, ModuleTracker._post)
