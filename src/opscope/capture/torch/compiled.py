"""``torch.compile`` under a dump: record what runs, never what dynamo traces.

While dynamo compiles, nothing is captured: its ops run on fake tensors (no data) and are
not the user's (dynamo's start/end callbacks pause the level; the native observer also
skips any op run under a fake, proxy or functional mode). Module hooks do nothing while
traced (:mod:`~opscope.capture.torch.modules`), so the compiled graph is the one dynamo
makes without opscope, and results stay bit-identical.

Each graph dynamo hands to its backend is wrapped (in ``OutputGraph.call_user_compiler``,
the one place where dynamo calls a backend, patched only while a dump runs) so that:

- its inputs and outputs are recorded as a call of ``compiled_graph_<n>`` at the module
  that called it (at every level; at the aten level only when its inner ops are not seen);
- a backend that runs the FX graph as it is (``eager``, or any backend returning the
  graph's own ``forward``) gets a call before each group of nodes naming the module those
  nodes came from, so its aten ops keep their module paths;
- a backend whose inner ops are not the model's ops (inductor's fused kernels, whose
  calls of a few aten kernels on scratch buffers would read as model ops) runs with capture
  paused, forward and backward, and is said once in a warning.

With graph breaks a forward runs several graphs, made from the frames of submodules or
from dynamo's resumed frames, whose module hooks dynamo dropped (it traced them): each
graph's call finds the module of its frame, and what its module paths start from, in the
Python frames that call it (:func:`~opscope.capture.torch.compiled_frames.frames`), and
leaves the tracker at the module whose frame goes on after it.

What was compiled is written to the manifest (``compiled``). Graphs compiled before the
dump started are not wrapped.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

import torch

from opscope.capture.torch.compiled_frames import Scope, frames, module_of, random_draws, source_of
from opscope.capture.torch.modules import tensors_of

if TYPE_CHECKING:
    from opscope.capture.torch.host import CaptureHost

# Backends whose graphs run the model's aten ops one by one, as eager PyTorch would.
_ATEN_BACKENDS = frozenset(("eager", "aot_eager", "aot_eager_decomp_partition", "aot_eager_default_partitioner"))

_ACTIVE: CompileWatch | None = None  # graphs outlive the dump: their hooks do nothing after it


def graph_scope(root: str, path: str) -> None:
    """Called by an instrumented FX graph before the nodes of module ``path``, relative to
    ``root``: the frame's local or global the graph's module paths start from (``""``: the
    module whose frame made the graph)."""
    watch = _ACTIVE
    if watch is not None and watch.entries:
        scope = watch.entries[-1]
        base = scope.roots.get(root, scope.frame) if root else scope.frame
        watch.session.modules.set_inner(scope.depth, f"{base}.{path}" if base and path else base or path)


def _scope_nodes(gm: torch.fx.GraphModule) -> list[str]:
    """Insert a :func:`graph_scope` call wherever the module of the nodes changes; returns
    the modules, in order."""
    seen: list[str] = []
    last = None
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        source = source_of(node)
        if source != last:
            with gm.graph.inserting_before(node):
                gm.graph.call_function(graph_scope, source)
            last = source
            if source[1] not in seen:
                seen.append(source[1])
    gm.recompile()
    return seen


class CompileWatch:
    """Installed by the session when torch._dynamo is (or becomes) loaded; removed at stop."""

    def __init__(self, session: CaptureHost) -> None:
        self.session = session
        self.graphs: list[dict[str, Any]] = []
        self.entries: list[Scope] = []  # the running graphs, innermost last
        self.installed = False
        self._paused: list[bool] = []
        self._original: Any = None
        self._warned = False

    # -- install / remove ---------------------------------------------------------------
    def poll(self) -> None:
        """Install once dynamo is loaded (importing it ourselves would cost seconds)."""
        if not self.installed and "torch._dynamo" in sys.modules:
            self.install()

    def install(self) -> None:
        global _ACTIVE
        from torch._dynamo import callback
        from torch._dynamo.output_graph import OutputGraph

        self.installed = True
        _ACTIVE = self
        callback.callback_handler.register_start_callback(self._compile_start)
        callback.callback_handler.register_end_callback(self._compile_end)
        self._original = OutputGraph.__dict__["call_user_compiler"]
        watch = self

        def call_user_compiler(graph: Any, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
            return watch.wrap(graph, gm, watch._original(graph, gm, example_inputs))
        # patching dynamo's method on the class (undone by remove()); the wrapper's looser
        # signature is what dynamo calls it with
        OutputGraph.call_user_compiler = call_user_compiler  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        global _ACTIVE
        if not self.installed:
            return
        self.installed = False
        from torch._dynamo import callback
        from torch._dynamo.output_graph import OutputGraph

        for hooks, fn in ((callback.callback_handler.start_callbacks, self._compile_start),
                          (callback.callback_handler.end_callbacks, self._compile_end)):
            if fn in hooks:
                hooks.remove(fn)
        OutputGraph.call_user_compiler = self._original  # type: ignore[method-assign]  # undoes install()
        if _ACTIVE is self:
            _ACTIVE = None

    def manifest(self) -> dict[str, Any] | None:
        """The manifest's ``compiled`` entry (None when nothing was compiled)."""
        if not self.graphs:
            return None
        return {"graphs": self.graphs, "note": _note(self.session.cfg.level, self.graphs)}

    # -- pausing -----------------------------------------------------------------------------
    def pause(self) -> None:
        s = self.session
        self._paused.append(s.capturing)
        level = s.level
        if s.capturing and level is not None:
            s.capturing = False
            level.stop_capture()

    def resume(self) -> None:
        s = self.session
        level = s.level
        if self._paused.pop() and s.started and s.failure is None and level is not None:
            s.capturing = True
            level.set_phase(s.phase)

    def _compile_start(self, args: Any) -> None:
        self.pause()

    def _compile_end(self, args: Any) -> None:
        if self._paused:
            self.resume()

    # -- graphs ------------------------------------------------------------------------------
    def wrap(self, graph: Any, gm: torch.fx.GraphModule, compiled_fn: Any) -> Any:
        """The backend's compiled function, recorded at run time."""
        backend = _backend_name(getattr(graph, "compiler_fn", None))
        runs_graph = getattr(compiled_fn, "__self__", None) is gm  # eager: the FX code itself
        modules = sorted({module_of(n) for n in gm.graph.nodes} - {""})
        roots = frozenset(source_of(n)[0] for n in gm.graph.nodes) - {""}
        if runs_graph:
            modules = _scope_nodes(gm)
            compiled_fn = gm.forward
        inner = "recorded" if runs_graph or backend in _ATEN_BACKENDS else "not recorded"
        info = {"graph": f"compiled_graph_{len(self.graphs)}", "backend": backend, "inner_ops": inner,
                "compile_id": str(getattr(graph, "dynamo_compile_id", "") or ""),
                "inputs": sum(1 for n in gm.graph.nodes if n.op == "placeholder"), "modules": modules,
                "module_paths": "kept" if runs_graph else "the calling module's", "draws": random_draws(gm)}
        if backend == "inductor" and info["draws"]:  # its own generator, unless told to fall back
            config = sys.modules.get("torch._inductor.config")
            info["fallback_random"] = bool(getattr(config, "fallback_random", False))
        self.graphs.append(info)
        self._warn(info)
        reason = getattr(graph, "compile_subgraph_reason", None)
        run = GraphRun(self, info, compiled_fn, runs_graph, inner == "recorded")
        run.roots, run.returns = roots, reason is not None and not reason.graph_break
        return run.as_callable()

    def _warn(self, info: dict[str, Any]) -> None:
        """One line, once per dump, where compile hides what this level would record."""
        level = self.session.cfg.level
        if self._warned or (level != "module" and info["inner_ops"] == "recorded") or not (
                level != "module" or info["modules"]):
            return
        self._warned = True
        if level == "module":
            message = ("opscope: modules inside torch.compile'd graphs have no call at run time; level='module' "
                       "records each compiled graph's inputs and outputs instead - dump without compile to see "
                       "every module")
        else:
            message = (f"opscope: {info['backend']}-compiled graphs run fused kernels; their inner ops are not "
                       f"recorded at level='{level}' (only each graph's inputs and outputs) - dump with "
                       "torch.compile(..., backend='aot_eager') or without compile to see them")
        warnings.warn(message, RuntimeWarning, stacklevel=2)


class GraphRun:
    """One compiled graph at run time: its inputs and outputs recorded, its module scopes
    set (FX code run as it is), or capture paused inside it (fused kernels)."""

    def __init__(self, watch: CompileWatch, info: dict[str, Any], fn: Any, scoped: bool, transparent: bool) -> None:
        self.watch, self.info, self.fn = watch, info, fn
        self.scoped, self.transparent = scoped, transparent
        self.op = info["graph"]
        self.roots: frozenset[str] = frozenset()  # the frame's locals and globals its module paths start from
        self.returns = False  # the graph ends its frame (dynamo compiled it at a return, not a graph break)

    def as_callable(self) -> Any:
        run = self.__call__

        def compiled_graph(*args: Any, **kwargs: Any) -> Any:
            return run(*args, **kwargs)
        if getattr(self.fn, "_boxed_call", False):  # called with one list, which it empties
            compiled_graph._boxed_call = True  # type: ignore[attr-defined]  # the flag AOT autograd reads
        return compiled_graph

    def adopt(self, watch: CompileWatch) -> None:
        """Record for ``watch``, a later dump's: dynamo keeps a compiled graph for the rest of
        the process, so a graph compiled under an earlier dump runs again under this one,
        where it gets this dump's next number."""
        self.info = {**self.info, "graph": f"compiled_graph_{len(watch.graphs)}"}
        watch.graphs.append(self.info)
        watch._warn(self.info)
        self.watch, self.op = watch, self.info["graph"]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        watch = _ACTIVE
        if watch is None or not watch.session.capturing:
            return self.fn(*args, **kwargs)
        if watch is not self.watch:
            self.adopt(watch)
        s = watch.session
        tracker = s.modules
        depth = tracker.hooked()
        try:
            frame, called, roots = frames(tracker, self.roots)
        except Exception as exc:  # opscope's failure never stops the run
            s.internal_error(exc)
            frame, called, roots = None, None, {}
        if frame is None:  # no module frame below the innermost hooked call
            frame = tracker.stack[depth - 1] if depth else ""
        tracker.set_inner(depth, frame)  # the graph's frame's module: its ops', and its own call's
        path, phase = tracker.path, s.phase
        level = s.cfg.level
        record = (level != "aten" or not self.transparent) and s.recorder.selected(path, self.op, phase)
        call = self._record(path, phase, tensors_of((args, kwargs)), None) if record else -1
        watch.entries.append(Scope(depth, frame, roots))
        if not self.transparent:
            watch.pause()
        try:
            out = self.fn(*args, **kwargs)
        finally:
            if not self.transparent:
                watch.resume()
            watch.entries.pop()
            # what runs next runs in the graph's frame (it goes on after a graph break), or in
            # the frame that called it (the graph ended its frame)
            tracker.set_inner(depth, called if self.returns else frame)
        if record and s.capturing:
            self._record(path, phase, tensors_of(out), call)
        if not self.transparent and s.capturing and "backward" in s.cfg.phases:
            self._pause_backward(path, out)
        return out

    def _record(self, path: str, phase: str, tensors: list[torch.Tensor], call: int | None) -> int:
        """The graph's inputs (``call`` None) or outputs; opscope's failure never stops the run."""
        s = self.watch.session
        items = [(i, None, t) for i, t in enumerate(tensors)]
        level = s.level
        if level is None:  # the session has not started: there is nowhere to record
            return -1
        was, s.capturing = s.capturing, False  # the Python levels' own ops are not the user's
        try:
            if call is None:
                return level.record_graph(self.op, path, phase, items, [])
            return level.record_graph(self.op, path, phase, [], items, call)
        except Exception as exc:
            s.internal_error(exc)
            return -1
        finally:
            s.capturing = was and s.failure is None

    def _pause_backward(self, path: str, out: Any) -> None:
        """The compiled backward runs fused kernels too: capture pauses while its autograd
        node runs, whose gradients in and out are recorded instead."""
        nodes = {id(t.grad_fn): t.grad_fn for t in tensors_of(out) if t.grad_fn is not None}
        for node in nodes.values():
            call = [-1]  # the backward call's index, from its prehook to its hook

            def pre(grad_outputs: tuple[Any, ...], call: list[int] = call) -> None:
                self.watch.pause()
                if self.watch._paused[-1] and self.watch.session.recorder.selected(path, self.op, "backward"):
                    call[0] = self._record_grads(path, grad_outputs, None)

            def post(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...], call: list[int] = call) -> None:
                if call[0] >= 0:
                    self._record_grads(path, grad_inputs, call[0])
                self.watch.resume()
            node.register_prehook(pre)
            node.register_hook(post)

    def _record_grads(self, path: str, grads: tuple[Any, ...], call: int | None) -> int:
        s = self.watch.session
        io = "grad_output" if call is None else "grad_input"
        items = [(i, io, g) for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
        level = s.level
        if level is None:  # the session has not started: there is nowhere to record
            return -1
        try:
            if call is None:
                return level.record_graph(self.op, path, "backward", items, [])
            return level.record_graph(self.op, path, "backward", [], items, call)
        except Exception as exc:
            s.internal_error(exc)
            return -1


def _backend_name(compiler_fn: Any) -> str:
    for attr in ("compiler_name", "__name__"):
        name = getattr(compiler_fn, attr, None)
        if isinstance(name, str) and name:
            return name
    return type(compiler_fn).__name__


def _note(level: str, graphs: list[dict[str, Any]]) -> str:
    """What a dump of these compiled graphs holds, in one sentence."""
    hidden = sorted({g["backend"] for g in graphs if g["inner_ops"] == "not recorded"})
    if level == "module":
        return ("modules inside compiled graphs have no call at run time: each graph's inputs and outputs "
                "are recorded at the module that called it (compiled_graph_<n>)")
    if hidden:
        return (f"graphs of {', '.join(hidden)} run fused kernels: only their inputs and outputs are recorded; "
                "compile with backend='aot_eager' (or dump without compile) to see their ops")
    return "the aten ops inside compiled graphs are recorded as they run"
