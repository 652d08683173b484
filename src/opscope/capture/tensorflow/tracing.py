"""Plans made while TensorFlow traces, and the host callback each traced graph runs.

``op_callbacks.add_op_callback`` is called for every op TensorFlow creates in a graph and
for every op it executes eagerly. While a ``tf.function`` is traced, :class:`Tracer`
records each op's inputs and outputs (:mod:`.plan`); when the Python function of the trace
returns, one stateful ``tf.numpy_function`` is added to its graph. Automatic control
dependencies make it run with the graph; it calls :meth:`Host.graph_ran`. For a statistics
dump (no tensors, no watch) the planned tensors go to ``OpscopeStats`` ops in the graph
(:mod:`.opstats`, built on first use by :mod:`.opbuild`), which measure them on TensorFlow's
threads; the host callback receives their small outputs (and any tensor of a dtype the
kernel does not read). Otherwise, or where the op cannot be built, the callback receives
every planned tensor as a numpy array sharing a CPU tensor's buffer. Either way TensorFlow
holds a tensor until it is measured, so a variable read stays the value it read even if the
variable is updated later in the graph. Those ops read the graph's tensors unseen by Grappler
(the passes of ``_c/tap_passes.cc``, loaded with the op: a dumped graph computes the bits of the
bare one), and a tensor Grappler removed or rewrote is recorded as absent (:mod:`.absent`).
A ``numpy_function`` rather than a ``py_function``:
the conversion is TensorFlow's own C++, where a ``py_function`` makes an ``EagerTensor`` of
each of a graph run's ~1,000 tensors for Python to convert one by one.
Graphs compiled by XLA (``jit_compile=True``) get no host callback: XLA refuses it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from opscope.capture.tensorflow import opattrs, opbuild, opstats
from opscope.capture.tensorflow.context import BACKWARD_SCOPE, CallContext
from opscope.capture.tensorflow.plan import ALIASES, ASSIGNS, SILENT, GraphPlan, OpPlan, Ref, predicate
from opscope.capture.tensorflow.stats import NUMERIC

SKIP_GRAPHS = ("Dataset_", "__inference_Dataset")


class Host(Protocol):
    def graph_ran(self, plan: GraphPlan, arrays: list[Any]) -> None: ...
    def stats_in_graph(self) -> bool: ...
    def eager_op(self, op_type: str, inputs: Any, outputs: Any, ctx: CallContext) -> None: ...
    def function_ran(self, name: str, inputs: Any, outputs: Any) -> None: ...
    def variable_name(self, handle: Any) -> str | None: ...
    def note_xla(self, name: str) -> None: ...


def is_numeric(tensor: Any) -> bool:
    """Whether a tensor's dtype is one whose statistics are taken."""
    try:
        return tensor.dtype.name in NUMERIC
    except AttributeError:
        return False


class Tracer:
    """Installs the op callback and the trace hooks; keeps one plan per graph being traced.

    Args:
        host: receives graph runs and eager ops.
        ctx: the layer stack and phase.
        op_level: plan every op (False: only layer calls and gradients, added by the session).
    """

    def __init__(self, host: Host, ctx: CallContext, op_level: bool) -> None:
        self.host, self.ctx, self.op_level = host, ctx, op_level
        self._local = threading.local()
        self.xla_functions: dict[str, str] = {}  # inference name -> python name
        self.xla_steps: set[str] = set()  # python names of XLA functions that apply gradients
        self._undo: list[Callable[[], None]] = []

    # -- install -----------------------------------------------------------------------
    def install(self) -> None:
        from tensorflow.python.eager.polymorphic_function import tracing_compilation as tc
        from tensorflow.python.framework import func_graph as fgm
        from tensorflow.python.framework import op_callbacks

        create, trace = tc._create_concrete_function, fgm.func_graph_from_py_func
        tc._create_concrete_function = self._wrap_create(create)
        fgm.func_graph_from_py_func = self._wrap_trace(trace)
        self._undo.append(lambda: setattr(tc, "_create_concrete_function", create))
        self._undo.append(lambda: setattr(fgm, "func_graph_from_py_func", trace))
        op_callbacks.add_op_callback(self._op_callback)
        self._undo.append(self._remove_callback)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _remove_callback(self) -> None:
        from tensorflow.python.eager import context
        from tensorflow.python.framework import op_callbacks

        if self._op_callback in context.context().op_callbacks:  # not while deferred
            op_callbacks.remove_op_callback(self._op_callback)

    def defer(self, on: bool) -> None:
        """``on``: the op callback leaves this thread's list until ``defer(False)``, and is on it
        only while a graph is traced (the graph's ops are planned as usual). For fit without XLA
        or run_eagerly, whose eager ops between steps are not recorded: while a callback is
        registered, TensorFlow runs every eager op and function call on a slower path (a step
        not selected measured 1.03x with it, 1.00x without)."""
        from tensorflow.python.eager import context
        from tensorflow.python.framework import op_callbacks

        registered = self._op_callback in context.context().op_callbacks
        if on and registered and not getattr(self._local, "deferred", False):
            op_callbacks.remove_op_callback(self._op_callback)
            self._local.deferred = self._local.held = True
        elif not on and getattr(self._local, "held", False):
            self._local.deferred = self._local.held = False
            op_callbacks.add_op_callback(self._op_callback)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is planned or recorded on this thread inside: a graph traced here gets no
        host callback (the plain train step that runs the steps not selected). The op callback
        is taken off this thread's list meanwhile: while one is registered, TensorFlow runs
        function calls on a slower path (~1.7 ms a step of the benchmark's fit, measured)."""
        from tensorflow.python.eager import context
        from tensorflow.python.framework import op_callbacks

        before = getattr(self._local, "paused", False)
        self._local.paused = True
        registered = self._op_callback in context.context().op_callbacks  # a thread's own list
        if registered:
            op_callbacks.remove_op_callback(self._op_callback)
        try:
            yield
        finally:
            self._local.paused = before
            if registered:
                op_callbacks.add_op_callback(self._op_callback)

    @contextlib.contextmanager
    def traces_only(self) -> Iterator[None]:
        """The op callback is on this thread's list only while a graph is traced inside (the
        graph's ops are planned as usual); a run of a traced graph then takes TensorFlow's
        faster path. For fit's train step without XLA and run_eagerly, whose eager ops are
        not recorded."""
        from tensorflow.python.eager import context
        from tensorflow.python.framework import op_callbacks

        if self._op_callback not in context.context().op_callbacks or getattr(self._local, "deferred", False):
            yield
            return
        op_callbacks.remove_op_callback(self._op_callback)
        self._local.deferred = True
        try:
            yield
        finally:
            self._local.deferred = False
            op_callbacks.add_op_callback(self._op_callback)

    @property
    def tracing(self) -> list[tuple[Any, GraphPlan | None]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self, graph: Any = None) -> GraphPlan | None:
        """The plan of ``graph`` (default: the innermost graph being traced)."""
        for g, plan in reversed(self.tracing):
            if graph is None or g is graph:
                return plan
        return None

    # -- trace hooks -------------------------------------------------------------------
    def _wrap_create(self, create: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self

        def _create_concrete_function(function_type: Any, type_context: Any, func_graph: Any,
                                      tracing_options: Any) -> Any:
            attrs = getattr(tracing_options, "attributes", None) or {}
            xla = bool(attrs.get("_XlaMustCompile"))
            tracer._local.pending_xla = xla
            concrete = create(function_type, type_context, func_graph, tracing_options)
            closed = getattr(tracer._local, "closed", None)
            if xla and closed is not None and closed.steps:
                tracer.xla_steps.add(func_graph.name)
            if xla:
                name = getattr(getattr(concrete, "_inference_function", None), "name", None)
                if name is not None:
                    tracer.xla_functions[name.decode() if isinstance(name, bytes) else str(name)] = func_graph.name
            return concrete
        return _create_concrete_function

    def _wrap_trace(self, trace: Callable[..., Any]) -> Callable[..., Any]:
        tracer = self

        def func_graph_from_py_func(name: Any, python_func: Any, *args: Any, **kwargs: Any) -> Any:
            def traced(*f_args: Any, **f_kwargs: Any) -> Any:
                from tensorflow.python.framework import op_callbacks, ops

                graph = ops.get_default_graph()
                plan = tracer._open(graph)
                tracer.tracing.append((graph, plan))
                deferred = getattr(tracer._local, "deferred", False)
                if deferred:  # traces_only: the callback is on while this graph is traced
                    tracer._local.deferred = False
                    op_callbacks.add_op_callback(tracer._op_callback)
                try:
                    out = python_func(*f_args, **f_kwargs)
                    if plan is not None:
                        tracer._close(plan)
                    return out
                finally:
                    tracer.tracing.pop()
                    if deferred:
                        op_callbacks.remove_op_callback(tracer._op_callback)
                        tracer._local.deferred = True
            from tensorflow.python.util import tf_decorator

            return trace(name, tf_decorator.make_decorator(python_func, traced), *args, **kwargs)
        return func_graph_from_py_func

    def _open(self, graph: Any) -> GraphPlan | None:
        name = str(getattr(graph, "name", ""))
        xla = bool(getattr(self._local, "pending_xla", False))
        self._local.pending_xla = False
        if getattr(self._local, "paused", False):
            return None
        outer = self.current()
        if name.startswith(SKIP_GRAPHS) or (outer is not None and outer.xla):
            return GraphPlan(name, xla=True, outer=outer) if outer is not None and outer.xla else None
        return GraphPlan(name, xla=xla, outer=outer)

    def _close(self, plan: GraphPlan) -> None:
        """The traced function returned: add the host callback that receives every value."""
        self._local.closed = plan
        if plan.steps or plan.xla:
            for _, outer in self.tracing[:-1]:
                if outer is not None:
                    outer.contains_step = outer.contains_step or not plan.xla
                    outer.steps = outer.steps or plan.xla  # the call of an XLA step ends the step
        if plan.xla and not any(p is not None and p.xla for _, p in self.tracing[:-1]):
            self.host.note_xla(plan.name)
        if plan.xla or not plan.values:
            return
        import tensorflow as tf

        host = self.host

        def graph_ran(*arrays: Any) -> None:
            host.graph_ran(plan, list(arrays))
        lib = opbuild.load()  # with the op, the passes that keep these taps out of Grappler's sight
        in_graph = lib is not None and opbuild.ENABLED and host.stats_in_graph()
        if not in_graph or not opstats.add(plan, list(plan.values), lib, graph_ran):
            with tf.name_scope("opscope_dump"):  # the tap passes know the dump's ops by this scope
                tf.numpy_function(graph_ran, list(plan.values), Tout=[], stateful=True, name="opscope_dump")
        plan.__dict__["value_shapes"] = [static_shape(t) for t in plan.values]  # an absent value's (absent.py)
        plan.predicates = all(predicate(t) for t in plan.values)
        plan.values = [t.name for t in plan.values]  # the plan keeps names, not the graph's tensors

    # -- the op callback ---------------------------------------------------------------
    def _op_callback(self, op_type: str, inputs: Any, attrs: Any, outputs: Any,
                     op_name: str | None = None, graph: Any = None) -> Any:
        """Plan a graph op (or record an eager one); returns ``outputs`` unchanged, since TensorFlow
        hands a callback's return value to the next callback (a second session, tfdbg2)."""
        if getattr(self._local, "paused", False):
            return outputs
        if isinstance(op_type, bytes):  # eager ops name their type in bytes
            op_type = op_type.decode()
        if graph is None:
            if op_type.startswith("__inference_"):
                self.host.function_ran(op_type, inputs, outputs)
            elif self.op_level:
                self.host.eager_op(op_type, inputs, outputs, self.ctx)
            return outputs
        plan = self.current(graph)
        if plan is None:
            return outputs
        if self.ctx.phase == "optimizer":
            plan.steps = True
        if plan.xla or is_dump_op(op_name):  # the dump's own ops (opstats)
            return outputs
        if self.op_level:
            self.plan_op(plan, op_type, str(op_name or op_type), list(inputs), list(outputs), attrs)
        return outputs

    def plan_op(self, plan: GraphPlan, op_type: str, node: str, inputs: list[Any], outputs: list[Any],
                attrs: Any = None) -> None:
        """Plan one graph op: its refs, and its rows unless it is plumbing."""
        index = len(plan.ops)
        read_after_write = False
        if op_type in ASSIGNS and len(inputs) >= 2:
            plan.written[inputs[0].name] = inputs[1]
        if op_type == "ReadVariableOp" and inputs and inputs[0].name in plan.written:
            # a read of a variable this graph wrote: its value comes from what was written
            # (data flow for compare), not from the start of the step
            inputs = [plan.written[inputs[0].name]]
            op_type = "ReadVariableOp"
            read_after_write = True
        if op_type == "ReadVariableOp" and outputs and inputs and not read_after_write:
            param = self.host.variable_name(inputs[0])
            if param:
                plan.param_of[outputs[0].name] = param
        alias = op_type in ALIASES and len(inputs) >= 1 and outputs and is_numeric(outputs[0]) \
            and outputs[0].shape.is_fully_defined() and inputs[0].name in plan.value_of
        ins = [self._ref(plan, t) for t in inputs]
        outs = []
        for slot, t in enumerate(outputs):
            plan.made_by[t.name] = (index, slot)
            if alias and slot == 0:
                plan.value_of[t.name] = plan.value_of[inputs[0].name]
                if inputs[0].name in plan.param_of:
                    plan.param_of[t.name] = plan.param_of[inputs[0].name]
            outs.append(Ref(plan.value(t, is_numeric(t)), None, shape=static_shape(t)))
        module, phase, fwd = self._where(plan, node, op_type)
        silent = op_type in SILENT and not read_after_write
        if silent or not any(r.value >= 0 for r in outs) and not any(r.value != -1 for r in ins):
            plan.ops.append(OpPlan(op_type, node, module, phase, fwd, [], [], note="silent"))
            return
        plan.ops.append(OpPlan(op_type, node, module, phase, fwd, ins, outs, note="view" if alias else None,
                               args=opattrs.describe(op_type, attrs, inputs, [r.value >= 0 for r in ins])))

    def _ref(self, plan: GraphPlan, tensor: Any) -> Ref:
        numeric = is_numeric(tensor)
        return Ref(plan.value(tensor, numeric) if numeric else -1, plan.made_by.get(tensor.name),
                   plan.param_of.get(tensor.name), shape=static_shape(tensor))

    def _where(self, plan: GraphPlan, node: str, op_type: str) -> tuple[str, str, str | None]:
        phase = self.ctx.phase
        if phase == "backward" or node.startswith(BACKWARD_SCOPE):
            module, fwd = plan.module_of_gradient(node)
            return module, "backward" if phase != "optimizer" else phase, fwd
        module = self.ctx.module()
        if phase == "forward":
            plan.scopes[node] = (module, op_type)
            scope = node.rpartition("/")[0]
            if scope and scope not in plan.scopes:
                plan.scopes[scope] = (module, "")
        return module, phase, None


def is_dump_op(name: str | None) -> bool:
    """An op the dump added: in an ``opscope_dump`` name scope, at any depth (a while loop's
    cond graph names it ``while/opscope_dump/OpscopeStats``), as ``_c/tap_graph.h`` finds them."""
    return bool(name) and any(part.startswith("opscope_dump") for part in str(name).split("/"))


def static_shape(tensor: Any) -> list[int] | None:
    """The graph tensor's shape when fully known (a view's rows show it, not its source's)."""
    try:
        shape = tensor.shape
        return [int(d) for d in shape] if shape.is_fully_defined() else None
    except (AttributeError, ValueError, TypeError):
        return None
