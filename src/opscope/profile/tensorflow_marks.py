"""Phase marks of the TensorFlow training trace: where a step's phases start and end.

TensorFlow runs a training step as a graph (``tf.function``, Keras ``fit``), so Python
hooks alone see only the tracing, not the execution. At trace time the hooks below put a
``tf.timestamp`` op into the graph at each phase edge, wired with control dependencies:

====================  ===========================================  ============================
mark                  runs after                                   what waits for it
====================  ===========================================  ============================
``data_start``        (nothing)                                    the iterator's ``get_next``
``data_end``          the iterator's outputs                       (nothing)
``forward_start``     the model's inputs (first outermost Keras    the model's inputs
                      layer call, or the ``fp_point`` layer)
``backward_start``    the loss (``GradientTape.gradient`` entry)   (nothing)
``backward_end``      every gradient (the ``bp_point`` layer's)    the gradients it returns
``optimizer_start``   the gradients handed to ``optimizer.apply``  those gradients, and the
                      (= ``backward_end``'s stamp when they are    update's first ops
                      the gradients it gated)
``optimizer_end``     every op ``apply`` created                   (nothing)
====================  ===========================================  ============================

Each timestamp is written into one slot of a small float64 variable, one per depth of
function nesting (a graph that calls another, as fit's loop calls its step, then shares no
variable with it: automatic control dependencies add no edge into the call, whose inlining
made an identity of each captured input per edge, ~110 a step of the benchmark's model), which
the session reads every :data:`READ_EVERY` steps; in eager code (``run_eagerly``, an eager
custom loop) the same hooks take a host clock mark instead. The added ops are identities and
timestamps: the numbers the model computes do not change. Inside an XLA cluster no timestamp
can run, so no mark is placed there (:attr:`PhaseMarks.notes` says so).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from opscope.profile.phases import patch, unpatch
from opscope.profile.tensorflow_graph import (
    bp_gradients,
    default_graph,
    flat_tensors,
    hold_roots,
    identity,
    is_graph_tensor,
    outermost_graph,
    probe,
    symbolic,
)
from opscope.profile.tensorflow_phases import SLOT, SLOTS

ROWS = 128  # graph marks kept between two reads: one row per run of a graph that marks
BANKS = 6  # marks variables: one per depth of nesting (the deepest shared by any deeper)
READ_EVERY = 32  # steps between reads of the marks (and at a task-traced step and at the end)
XLA_NOTE = (
    "XLA: forward, backward and optimizer inside a jit-compiled function are not separated "
    "(a timestamp cannot run inside an XLA cluster), so that time is counted as other; "
    "compile with jit_compile=False for the split"
)
NO_MARKS = (
    "no forward, backward or optimizer time was seen: the train step was traced before the "
    "profile started (start the profile before the first call of the tf.function), or it "
    "has no Keras layer, GradientTape or Keras optimizer; those steps count as other"
)

SPE_NOTE = (
    "steps_per_execution={spe}: {why}, so a step is one call of the train function ({spe} "
    "batches) and its data wait, forward, backward and optimizer are summed over them"
)
SPE_NO_TRACE = "the training trace is off (it tells the batches of a call apart)"
SPE_NO_MARKS = "a call's optimizer runs did not tell its batches apart"


class PhaseMarks:
    """Installs the hooks and turns one step's marks into phase intervals (host ns).

    Args:
        on_poll: called at safe points (iterator next, outermost layer call, tf.function
            entry): resolves a pending step boundary.
        on_optimizer_step: called after an eager ``optimizer.apply`` and after each call of
            a ``tf.function`` that applies an optimizer (step detection).
        fp_point / bp_point: Keras layer names (``layer.name`` or ``layer.path``), or None.
        detailed: False records no phase marks (``training_trace=False``), only steps.
    """

    def __init__(
        self,
        on_poll: Callable[[], None],
        on_optimizer_step: Callable[[], None],
        fp_point: str | None = None,
        bp_point: str | None = None,
        detailed: bool = True,
    ) -> None:
        import tensorflow as tf

        self.tf = tf
        self.detailed = detailed
        self.fp_point, self.bp_point = fp_point, bp_point
        self.found = {k: False for k in (fp_point, bp_point) if k}
        self.notes: list[str] = []
        self.step_functions: set[str] = set()
        self.bp_variables: set[int] = set()  # ids of the bp_point layer's variables
        self.host: list[tuple[int, int]] = []  # (slot, perf_counter_ns) from eager code
        with tf.device("/CPU:0"):  # made eagerly: a tf.function may not make variables while traced
            self._banks = [(_variable(tf.zeros([ROWS * len(SLOTS)], tf.float64), "opscope_profile_marks"),
                            _variable(tf.constant(0, tf.int64), "opscope_profile_row")) for _ in range(BANKS)]
        self._used: set[int] = set()  # banks written by some graph
        self._on_poll, self._on_opt = on_poll, on_optimizer_step
        self._depth = 0
        self._rows: dict[int, Any] = {}  # graph id -> its row tensor
        self._opt_depth = 0
        self._grads_gate: tuple[Any, dict[int, Any], Any] = (None, {}, None)  # graph, gated gradients, stamp
        self._patches: list[tuple[Any, str, Any, Any]] = []
        self.active = False

    # ------------------------------------------------------------------ install / remove
    def install(self) -> None:
        """Patch the classes; :meth:`remove` undoes it (call it on every exit path)."""
        from keras.src.layers.layer import Layer
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from tensorflow.python.data.ops import iterator_ops
        from tensorflow.python.eager import backprop
        from tensorflow.python.eager.polymorphic_function import polymorphic_function

        self.active = True
        self._patch(polymorphic_function.Function, "__call__", self._wrap_function)
        self._patch(BaseOptimizer, "apply", self._wrap_apply)
        self._patch(Layer, "__call__", self._wrap_layer)
        if not self.detailed:
            return
        iterator = iterator_ops.OwnedIterator
        self._patch(iterator, "_next_internal", self._wrap_next)
        self._patch(iterator, "get_next_as_optional", self._wrap_next)
        self._patch(backprop.GradientTape, "gradient", self._wrap_gradient)

    def remove(self) -> None:
        """Undo every patch; safe to call twice."""
        self.active = False
        unpatch(self._patches)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        patch(self._patches, owner, name, make)

    # ------------------------------------------------------------------ reading a step
    def take_host(self, start: int, end: int) -> list[tuple[int, int]]:
        """The eager marks ``(ns, slot)`` of the step ``[start, end]``; all eager marks are dropped."""
        marks = [(t, s) for s, t in self.host if start <= t <= end]
        self.host.clear()
        return marks

    def graph_marks(self, offset_ns: int) -> list[tuple[int, int]]:
        """Every graph mark still in the buffer as ``(host ns, slot)``: one read of the
        variable (the caller reads at most every :data:`READ_EVERY` steps).

        Args:
            offset_ns: ``time.time_ns() - time.perf_counter_ns()``, to bring graph
                timestamps (Unix seconds) onto the host clock.
        """
        if not self.detailed:
            return []
        out = []
        for bank in sorted(self._used):
            for at, seconds in enumerate(self._banks[bank][0].numpy().tolist()):
                if seconds:
                    out.append((round(seconds * 1e9) - offset_ns, at % len(SLOTS)))
        return out

    def unresolved_points(self) -> list[str]:
        """fp_point / bp_point names that matched no Keras layer called so far."""
        return [name for name, found in self.found.items() if not found]

    # ------------------------------------------------------------------ marks
    def _in_graph(self) -> bool:
        return not self.tf.executing_eagerly()

    def _mark(self, slot: str, after: list[Any] | None = None) -> Any:
        """A host mark (eager) or a timestamp op run after ``after`` (graph); returns the op."""
        if not self._in_graph():
            self.host.append((SLOT[slot], time.perf_counter_ns()))
            return None
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util

        if control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()):
            if XLA_NOTE not in self.notes:
                self.notes.append(XLA_NOTE)
            return None
        tf = self.tf
        with tf.control_dependencies(probe(tf, [t for t in after or () if is_graph_tensor(tf, t)])):
            stamp = tf.timestamp()
        self._write(slot, stamp)
        return stamp

    def _write(self, slot: str, stamp: Any) -> None:
        """Store a graph timestamp in ``slot`` of this run's row (one scatter of a scalar: the
        marks are ops the step runs, fewest is cheapest)."""
        tf = self.tf
        slots, _ = self._bank()
        index = self._row() + tf.constant(SLOT[slot], tf.int64)
        tf.raw_ops.ResourceScatterUpdate(resource=slots.handle, indices=index, updates=stamp)

    def _bank(self) -> tuple[Any, Any]:
        """The marks variable (``ROWS`` rows: one per run of a graph, read once every
        ``READ_EVERY`` steps, not after each: an eager read waits for TensorFlow's inter-op
        threads, 0.1-0.2 ms a step with one of them) and row cursor of the current graph's
        depth of nesting."""
        depth, graph = 0, default_graph()
        while getattr(graph, "outer_graph", None) is not None and depth < BANKS - 1:
            graph, depth = graph.outer_graph, depth + 1
        self._used.add(depth)
        return self._banks[depth]

    def _gradients_stamp(self, grads: Any) -> Any:
        """The ``backward_end`` stamp when ``grads`` are exactly the gradients it gated (in
        this graph), else None."""
        graph, gated, stamp = self._grads_gate
        flat = flat_tensors(self.tf, grads)
        if graph is not default_graph() or not flat or any(id(t) not in gated for t in flat):
            return None
        return stamp

    def _row(self) -> Any:
        """Where the row this run of the current graph writes its marks to starts: each run of
        a graph that marks takes the next row once (at its first mark), whatever it holds."""
        graph = default_graph()
        row = self._rows.get(id(graph))
        if row is None or row.graph is not graph:
            _, cursor = self._bank()
            row = (cursor.assign_add(1, read_value=True) - 1) % ROWS * len(SLOTS)
            self._rows[id(graph)] = row
        return row

    def _optimizer_start(self, grads: Any) -> tuple[Any, Any]:
        """Mark the optimizer's start; returns the gradients its update must read and the
        stamp the rest of the update must wait for (None in eager code).

        Gradients that come straight from a gated ``tape.gradient`` already wait for the
        ``backward_end`` stamp: the optimizer starts there (one write, nothing added on the
        update's path). Others (clipped, all-reduced, unscaled) get a stamp of their own and
        pass through identities that wait for it."""
        stamp = self._gradients_stamp(grads) if self._in_graph() else None
        if stamp is not None:
            self._write("optimizer_start", stamp)
            return grads, stamp
        stamp = self._mark("optimizer_start", flat_tensors(self.tf, grads))
        return self._gate(stamp, grads), stamp

    def _gate(self, stamp: Any, structure: Any) -> Any:
        """``structure`` with every tensor passed through an identity that waits for ``stamp``."""
        if stamp is None:
            return structure
        tf = self.tf
        with tf.control_dependencies([stamp]):
            return tf.nest.map_structure(lambda t: identity(tf, t), structure)

    # ------------------------------------------------------------------ wrappers
    def _wrap_function(self, original: Any) -> Any:
        marks = self

        @functools.wraps(original)
        def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not marks.active or not marks.tf.executing_eagerly():
                return original(fn, *args, **kwargs)
            marks._on_poll()
            out = original(fn, *args, **kwargs)
            if getattr(fn, "_name", None) in marks.step_functions:
                marks._on_opt()
            return out

        return call

    def _wrap_next(self, original: Any) -> Any:
        marks = self

        @functools.wraps(original)
        def next_element(iterator: Any, *args: Any, **kwargs: Any) -> Any:
            if not marks.active:
                return original(iterator, *args, **kwargs)
            if not marks._in_graph():
                marks._on_poll()
            stamp = marks._mark("data_start")
            if stamp is None:
                out = original(iterator, *args, **kwargs)
            else:
                with marks.tf.control_dependencies([stamp]):
                    out = original(iterator, *args, **kwargs)
            stamp = marks._mark("data_end", flat_tensors(marks.tf, out))
            if stamp is None or not isinstance(out, (marks.tf.Tensor, tuple, list, dict)):
                return out  # (an Optional, with steps_per_execution > 1, is never held back)
            # The step waits for the data-end mark (an identity of each batch tensor): else the
            # executor may run the step first (with one inter-op thread the whole step counted as
            # data wait; an XLA-compiled step, one op: 8 ms of false data wait). The step's call
            # used to wait through the marks variable both wrote (an automatic control edge,
            # ~110 identities once inlined: ~5% of the benchmark's step); now each depth of
            # nesting has its own (_bank).
            with marks.tf.control_dependencies([stamp]):
                return marks.tf.nest.map_structure(lambda t: identity(marks.tf, t), out, expand_composites=True)

        return next_element

    def _wrap_layer(self, original: Any) -> Any:
        marks = self

        @functools.wraps(original)
        def layer_call(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if not marks.active:
                return original(layer, *args, **kwargs)
            outer = marks._depth == 0
            named = marks.fp_point is not None and marks.fp_point in (layer.name, getattr(layer, "path", None))
            if named:
                marks.found[marks.fp_point] = True  # type: ignore[index]
            bp_layer = marks.bp_point is not None and marks.bp_point in (layer.name, getattr(layer, "path", None))
            if outer and not marks._in_graph():
                marks._on_poll()
            starts = marks.detailed and (named if marks.fp_point else outer) and not symbolic(args)
            if starts:  # only the inputs wait: control inputs on every op would stop Grappler's fusions
                args = marks._gate(marks._mark("forward_start", flat_tensors(marks.tf, args)), args)
            marks._depth += 1
            try:
                out = original(layer, *args, **kwargs)
            finally:
                marks._depth -= 1
            if bp_layer:  # built by now: its variables exist
                marks.found[marks.bp_point] = True  # type: ignore[index]
                marks.bp_variables.update(id(v) for v in layer.trainable_variables)
            if outer and marks.detailed and not symbolic(args):
                marks._mark("forward_end", flat_tensors(marks.tf, out))
            return out

        return layer_call

    def _wrap_gradient(self, original: Any) -> Any:
        marks = self

        @functools.wraps(original)
        def gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            if not marks.active:
                return original(tape, target, sources, *args, **kwargs)
            stamp = marks._mark("backward_start", flat_tensors(marks.tf, target))
            if stamp is not None and not args and kwargs.get("output_gradients") is None:
                # The backward pass starts from ones (TF's own seed): handing the same ones,
                # made after the mark, makes the backward ops wait for it.
                kwargs["output_gradients"] = marks._gate(stamp, marks.tf.nest.map_structure(marks.tf.ones_like, target))
            elif stamp is not None and kwargs.get("output_gradients") is not None:
                kwargs["output_gradients"] = marks._gate(stamp, kwargs["output_gradients"])
            grads = original(tape, target, sources, *args, **kwargs)
            watched = bp_gradients(marks.tf, sources, grads, marks.bp_variables) if marks.bp_point else None
            stamp = marks._mark("backward_end", watched if watched is not None else flat_tensors(marks.tf, grads))
            gated = marks._gate(stamp, grads)
            if stamp is not None and watched is None:  # the optimizer may start from this stamp
                flat = flat_tensors(marks.tf, gated)
                marks._grads_gate = (default_graph(), {id(t): t for t in flat}, stamp)
            return gated

        return gradient

    def _wrap_apply(self, original: Any) -> Any:
        marks = self

        @functools.wraps(original)
        def apply(optimizer: Any, grads: Any, *args: Any, **kwargs: Any) -> Any:
            if not marks.active or marks._opt_depth:  # a wrapping optimizer (loss scale) calls its inner one
                return original(optimizer, grads, *args, **kwargs)
            in_graph = marks._in_graph()
            grads, stamp = marks._optimizer_start(grads) if marks.detailed else (grads, None)
            graph = default_graph() if in_graph else None
            first = len(graph.get_operations()) if graph is not None else 0
            marks._opt_depth += 1
            try:
                out = original(optimizer, grads, *args, **kwargs)
            finally:
                marks._opt_depth -= 1
            if graph is not None:
                marks.step_functions.add(outermost_graph(graph).name)
                if marks.detailed:
                    update = graph.get_operations()[first:]
                    hold_roots(stamp, update)
                    marks._mark("optimizer_end", [op for op in update if op._is_stateful])
            else:
                if marks.detailed:
                    marks._mark("optimizer_end")
                marks._on_opt()
            return out

        return apply


def _variable(value: Any, name: str) -> Any:
    import tensorflow as tf

    return tf.Variable(value, trainable=False, name=name)
