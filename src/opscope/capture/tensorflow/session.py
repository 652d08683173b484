"""``opscope.tensorflow.dump``: the TensorFlow / Keras dump session."""

from __future__ import annotations

import atexit
import gc
import sys
import threading
from collections.abc import Callable
from typing import Any

from opscope.capture.steps import StepClock
from opscope.capture.tensorflow import absent
from opscope.capture.tensorflow.columns import measure, measured_constants
from opscope.capture.tensorflow.context import (
    CallContext,
    layer_args,
    layer_path,
    resource_handle,
    variable_names,
)
from opscope.capture.tensorflow.manifest import check_strategy, manifest
from opscope.capture.tensorflow.plan import SILENT, GraphPlan, OpPlan, Ref
from opscope.capture.tensorflow.rows import StepRows
from opscope.capture.tensorflow.tracing import Tracer, is_numeric, static_shape
from opscope.capture.tensorflow.values import TFValues
from opscope.config import DumpConfig
from opscope.config.env import foreign
from opscope.errors import ConfigError, OpscopeError
from opscope.storage.arrow_build import convert_ready
from opscope.storage.writer import DumpWriter

LEVELS = {"op": "tf-op", "layer": "tf-layer"}
XLA_NOTE = ("jit_compile=True: the ops inside XLA-compiled function(s) {names} were not captured, only "
            "their inputs and outputs (XLA refuses host callbacks); to see every op, run the steps to "
            "inspect without XLA (model.compile(jit_compile=False) or tf.function(jit_compile=False))")


class TFDumpSession(TFValues):
    """A running (or ready) TensorFlow dump. See :func:`opscope.tensorflow.dump`."""

    def __init__(self, cfg: DumpConfig, level: str, model: Any = None,
                 on_rows: Callable[[list[list[Any]]], None] | None = None, write: bool = True) -> None:
        """``on_rows(rows)`` sees each batch of records before it is written (the TensorFlow
        watch); with ``write=False`` nothing is written and :meth:`stop` returns None."""
        self.cfg, self.level, self.model = cfg, level, model
        self.on_rows, self.write = on_rows, write
        self.rank = int(foreign("RANK", "0") or 0)
        self.active = cfg.enable and (cfg.ranks is None or self.rank in cfg.ranks)
        self.started = self.stopped = False
        self._unjoin: Callable[[], None] = lambda: None  # fit patched while the dump runs (fit_join)
        self.failure: BaseException | None = None
        self.writer: DumpWriter | None = None
        self.clock = StepClock(self._boundary)
        self.ctx = CallContext(on_layer=self._layer if level == "layer" else None,
                               on_apply=self._apply, on_step=self._eager_step)
        self.tracer = Tracer(self, self.ctx, op_level=level == "op")
        self.rows = StepRows(cfg, self.rank, "cpu")
        self.notes: list[str] = []
        self._lock = threading.RLock()
        self._names: dict[int, str] = {}
        self._captures: dict[int, dict[str, int]] = {}
        self._eager: dict[int, tuple[Any, int]] = {}  # id(tensor) -> (tensor, output row id), this step
        self._xla_seen: set[str] = set()
        self._steps_written: set[int] = set()
        self._keys = 0  # tensor keys in the safetensors shards
        self.eager_ops = True  # record ops run eagerly (the Keras callback turns it off unless run_eagerly)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> TFDumpSession:
        """Install the op callback and patches. A rank not in ``ranks`` installs nothing."""
        if self.started:
            raise ConfigError("this dump was already started; create a new opscope.tensorflow.dump(...)")
        self.started = True
        if not self.active:
            return self
        check_strategy(self.model)
        if not self.write:
            self._install()
            return self
        self.writer = DumpWriter(self.cfg.path, self.rank, manifest(self.cfg, self.level, LEVELS[self.level]),
                                 queue_limit=int(self.cfg.queue_limit_mb * (1 << 20)),
                                 shard_bytes=int(self.cfg.shard_mb * (1 << 20)), overwrite=self.cfg.overwrite,
                                 batch=self.cfg.data != "tensor")  # small steps' rows: a file a round
        self.writer.open()
        convert_ready()  # the rows become Arrow arrays with pyarrow.array: its pandas import now, not mid-run
        self._install()
        return self

    def _install(self) -> None:
        self.watch_model(self.model)
        self.ctx.install()
        self.tracer.install()
        if "keras" in sys.modules:  # fit's validation paused also in a with-block around fit
            from opscope.capture.tensorflow.fit_join import join_fit
            from opscope.capture.tensorflow.keras import FitScope

            self._unjoin = join_fit(self, lambda: FitScope(self), lambda: not self.stopped)
        atexit.register(self._atexit)

    def callback(self) -> Any:
        """This dump as a Keras callback for ``model.fit(callbacks=[...])``."""
        from opscope.capture.tensorflow.keras import DumpCallback

        return DumpCallback(self)

    def watch_model(self, *owners: Any) -> None:
        """Name the variables of a Keras model (and its optimizer) in ``param`` columns."""
        for owner in owners:
            if owner is not None:
                self._names.update(variable_names(owner, getattr(owner, "optimizer", None)))

    def step(self) -> None:
        """End the current step (call it after each training iteration of a custom loop)."""
        with self._lock:
            self.clock.user_step()
        self.raise_failure()

    def stop(self, error: BaseException | None = None) -> Any:
        """Remove every hook, finish the files; returns the written :class:`opscope.Dump`."""
        if not self.started or self.stopped:
            return None
        self.stopped = True
        self._unjoin()
        self.tracer.uninstall()
        self.ctx.uninstall()
        atexit.unregister(self._atexit)
        if self.writer is None:
            return None
        with self._lock:
            self._flush_step(self.clock.step)
        wait = self.writer.wait_note()  # the disk behind the steps: said, with what shortens it
        with self.writer.editing_manifest() as manifest:  # (the writer thread still runs)
            manifest.setdefault("notes", []).extend([*self.notes, *([wait] if wait else [])])
        failure = error or self.failure
        self.writer.close("crashed" if failure else "complete",
                          error=None if failure is None else f"{type(failure).__name__}: {failure}")
        if error is None:
            self.failure = self.failure or self.writer.error  # met while the last steps were written
            self.raise_failure()
        from opscope.storage.reader import load

        return load(self.cfg.path)

    def __enter__(self) -> TFDumpSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.stop(exc)

    def raise_failure(self) -> None:
        """Raise, on the caller's thread, an error met inside a TensorFlow callback (a full disk)."""
        if self.failure is not None:
            raise self.failure

    def _atexit(self) -> None:
        if self.writer is not None and not self.stopped:
            self.stop(RuntimeError("the process exited inside the dump (no stop() or end of with-block)"))

    # -- steps -------------------------------------------------------------------------
    @property
    def selected(self) -> bool:
        return self.failure is None and not self.stopped and self.clock.step in self.cfg.steps

    def _boundary(self, finished: int, following: int) -> None:
        self._flush_step(finished)
        self.rows.next_step(following)
        self._eager.clear()

    def _flush_step(self, step: int) -> None:
        if step in self._steps_written and self.writer is not None:
            self._guard(self.writer.end_step, step)

    def steps_ran(self, count: int) -> None:
        """``count`` training steps ran without capture (the Keras callback's plain train step)."""
        with self._lock:
            for _ in range(count):
                self.clock.poll()
                self.clock.optimizer_step()

    def _eager_step(self) -> None:
        import tensorflow as tf

        if tf.executing_eagerly():
            with self._lock:
                self.clock.optimizer_step()

    def _write(self, rows: list[list[Any]]) -> None:
        if rows and self.on_rows is not None:
            try:
                self.on_rows(rows)
            except Exception as exc:  # the watch's verdict: raised on the user's thread
                self.failure = self.failure or exc
        if rows and self.writer is not None:
            self._steps_written.add(self.clock.step)
            self._guard(self.writer.add_rows, self.clock.step, rows)

    def _write_table(self, table: Any) -> None:
        if table.num_rows and self.writer is not None:
            self._steps_written.add(self.clock.step)
            self._guard(self.writer.add_table, self.clock.step, table)

    def _guard(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except OpscopeError as exc:  # the writer's: keep it for the user's thread, stop capturing
            self.failure = self.failure or exc
            return None

    # -- host callbacks (tracing.Host) -------------------------------------------------
    def stats_in_graph(self) -> bool:
        """Whether a traced graph's statistics may be measured by its ``OpscopeStats`` op: only
        columns are written (no tensors, no watch, which take the arrays)."""
        return self.cfg.data != "tensor" and self.on_rows is None

    def graph_ran(self, plan: GraphPlan, arrays: list[Any]) -> None:
        # A graph run hands over ~1,000 tensors and makes a few thousand short-lived tuples:
        # with the collector on, they set off generation 0 and 1 collections (and promote
        # objects to the old generation, whose full collections scan every object of
        # TensorFlow and Keras: ~0.5 s each). They are all freed before it is turned on again.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            self._graph_ran(plan, arrays)
        finally:
            if collecting:
                gc.enable()

    def _graph_ran(self, plan: GraphPlan, arrays: list[Any]) -> None:
        with self._lock:
            if plan.around_steps():
                return  # a loop around the step function, its condition: plumbing, not a step
            self.clock.poll()
            if self.selected and self.stats_in_graph():  # columns only
                run = measure(plan, arrays)
                absent.note_once(plan, 0 if run.absent is None else len(run.absent), self.notes)
                self._write_table(self.rows.stats_table(plan, run, measured_constants(plan)))
            elif self.selected:
                values = self._measure_all(plan, arrays)
                constants = plan.__dict__.get("measured")
                if constants is None or self.cfg.data == "tensor":  # tensors: each step's shards hold them
                    constants = plan.__dict__["measured"] = [self._value(c) for c in plan.constants]
                self._write(self.rows.graph_rows(plan, values, constants))
            if plan.steps:
                self.clock.optimizer_step()

    def eager_op(self, op_type: str, inputs: Any, outputs: Any, ctx: CallContext) -> None:
        if not self.eager_ops or op_type in SILENT or op_type.startswith("opscope"):
            if op_type == "ReadVariableOp" and inputs and outputs:
                self._eager_param(inputs[0], outputs[0])
            return
        with self._lock:
            self.clock.poll()
            if not self.selected:
                return
            phase = ctx.phase
            op = OpPlan(op_type, op_type, ctx.module() if phase == "forward" else "", phase, None, [], [])
            self._record_eager(op, list(inputs), list(outputs))

    def _eager_param(self, handle: Any, value: Any) -> None:
        name = self._names.get(id(handle))
        if name:
            self._params[id(value)] = (value, name)

    @property
    def _params(self) -> dict[int, tuple[Any, str]]:
        params = self.__dict__.get("_param_reads")
        if params is None:
            params = self.__dict__["_param_reads"] = {}
        return params

    def _record_eager(self, op: OpPlan, inputs: list[Any], outputs: list[Any],
                      params: list[str | None] | None = None) -> None:
        ins, outs = [], []
        for i, t in enumerate(inputs):
            known = self._eager.get(id(t))
            param = (t, params[i]) if params and params[i] else self._params.get(id(t))
            ref = Ref(0, None, param[1] if param else None, io="grad" if op.note == "grad" else None)
            ins.append((ref, self._measure(t) if is_numeric(t) else None, known[1] if known else None))
        for t in outputs:
            outs.append((Ref(0, None), self._measure(t) if is_numeric(t) else None))
        rows, ids = self.rows.op_rows(op, ins, outs)
        for t, row_id in zip(outputs, ids):
            if row_id is not None:
                self._eager[id(t)] = (t, row_id)
        self._write(rows)

    def function_ran(self, name: str, inputs: Any, outputs: Any) -> None:
        python_name = self.tracer.xla_functions.get(name)
        if python_name is None:
            return
        self.note_xla(python_name)
        with self._lock:
            self.clock.poll()
            if self.selected:
                op = OpPlan(python_name, name, "", "forward", None, [], [], note="xla")
                self._record_eager(op, list(inputs), list(outputs))
            if python_name in self.tracer.xla_steps:
                self.clock.optimizer_step()

    def note_xla(self, name: str) -> None:
        """Say once, in the manifest's notes and on stderr, what XLA kept from the dump."""
        if name in self._xla_seen:
            return
        self._xla_seen.add(name)
        note = XLA_NOTE.format(names=", ".join(sorted(self._xla_seen)))
        self.notes[:] = [n for n in self.notes if not n.startswith("jit_compile")] + [note]
        import sys

        print(f"opscope: {note}", file=sys.stderr)

    def variable_name(self, handle: Any) -> str | None:
        graph = getattr(handle, "graph", None)
        if graph is None or not hasattr(graph, "captures"):
            return self._names.get(id(handle))
        table = self._captures.get(id(graph))
        if table is None or handle.name not in table:
            table = self._captures[id(graph)] = {internal.name: id(ext) for ext, internal in graph.captures}
        ext = table.get(handle.name)
        return None if ext is None else self._names.get(ext)

    # -- layer level and gradients -----------------------------------------------------
    def _layer(self, layer: Any, path: str, args: Any, kwargs: Any, outputs: Any) -> None:
        import tensorflow as tf

        ins = [t for t in tf.nest.flatten((args, kwargs)) if tf.is_tensor(t)]
        outs = [t for t in tf.nest.flatten(outputs) if tf.is_tensor(t)]
        op = OpPlan(type(layer).__name__, path or layer.name, path, "forward", None, [], [], note="layer",
                    args=layer_args(layer))
        names: list[str | None] = [None] * len(ins)
        plan = None if tf.executing_eagerly() else self.tracer.current()
        if tf.executing_eagerly() or (plan is not None and not plan.xla):
            # the layer's own weights, read as its params (a sublayer's are the sublayer's)
            for v in getattr(layer, "_trainable_variables", None) or []:
                ins.append(tf.convert_to_tensor(getattr(v, "value", v)))
                names.append(str(getattr(v, "path", None) or v.name))
        self._plan_or_record(op, ins, outs, params=names)

    def _apply(self, optimizer: Any, grads: Any, variables: Any) -> None:
        import tensorflow as tf

        if variables is None:
            variables = getattr(optimizer, "_trainable_variables", None) or []
        grads, variables = list(grads), list(variables)
        if self.model is None and not self._names:
            self._names.update({id(resource_handle(v)): str(getattr(v, "path", v.name)) for v in variables})
        op = OpPlan(f"{type(optimizer).__name__}.apply", "", "", "optimizer", None, [], [], note="grad")
        names = [str(getattr(v, "path", None) or getattr(v, "name", "")) for v in variables]
        grads = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]  # a sparse gradient's rows
        pairs = [(g, n) for g, n in zip(grads, names) if g is not None and tf.is_tensor(g)]
        self._plan_or_record(op, [g for g, _ in pairs], [], params=[n for _, n in pairs])

    def _plan_or_record(self, op: OpPlan, ins: list[Any], outs: list[Any],
                        params: list[str | None] | None = None) -> None:
        """``params``: the variable each input is (None: not one), for layer weights and gradients."""
        import tensorflow as tf

        if tf.executing_eagerly():
            with self._lock:
                self.clock.poll()
                if self.selected:
                    self._record_eager(op, ins, outs, params)
            return
        plan = self.tracer.current()
        if plan is None or plan.xla:
            return
        for i, t in enumerate(ins):
            ref = self.tracer._ref(plan, t)
            ref.io = "grad" if op.note == "grad" else None
            ref.param = params[i] if params and params[i] else ref.param
            op.inputs.append(ref)
        for slot, t in enumerate(outs):
            op.outputs.append(Ref(plan.value(t, is_numeric(t)), None, shape=static_shape(t)))
            plan.made_by.setdefault(t.name, (len(plan.ops), slot))
        plan.ops.append(op)


__all__ = ["LEVELS", "TFDumpSession", "layer_path"]
