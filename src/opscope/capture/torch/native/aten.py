"""The aten level of a dump, run natively: the C++ observer of ``_c/dumpobs.cpp`` (built on
first use by :mod:`opscope.capture.torch.native.build`) records every op a dispatch mode would see and measures
its tensors in one pass, without entering Python per op; Python receives the step's rows
once, at its end, in the same layout as :class:`~opscope.capture.torch.recorder.Recorder`
builds them. A Python dispatch mode alone costs more than this whole capture.

With ``data="tensor"`` the same pass copies each measured tensor's bytes, at the op (inputs
before it runs, outputs after), into tensor shards held in C++ memory, whose safetensors
headers it builds too; a view is kept as its input's data plus its geometry, as the Python
path keeps it. Each shard reaches the writer in one call (:meth:`DumpWriter.add_shard`), when
it fills up (``shard_mb``) or at the step's end, so the writer's queue limit bounds the memory
and applies back-pressure. ``tensor_limit_mb`` is counted natively (its budget set at each
step, what was stored and where it stopped reported at its end, :class:`TensorPlan`); the size
probe of the step before a tensor window runs natively too. Tensors the kernel does not read
(another device, another dtype) get their statistics from Python and their bytes through
torch's copy to the host, one at a time. With ``tensor_ops`` only the calls of the named ops
keep their tensors (asked once per op), and views are stored as themselves, as on the
Python path.

Used for ``level="aten"`` dumps (statistics, full tensors, ``tensor_ops``) without
``suspects`` or ``source``, and for module-level statistics
(:mod:`~opscope.capture.torch.native.module`); everything else (and
``OPSCOPE_DUMP_BACKEND=python``, or no C++ compiler) goes through
:class:`~opscope.capture.torch.dispatch.DumpDispatchMode`. Both write the same dump.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

import torch

from opscope.capture.torch.levels import Level
from opscope.capture.torch.modules import strip_wrapped
from opscope.capture.torch.native import build as native
from opscope.capture.torch.native.ops import classify_op
from opscope.capture.torch.native.table import Columns
from opscope.capture.torch.recorder import Recorder
from opscope.capture.torch.stats import cpu_stats, device_stats, materialize
from opscope.capture.torch.tensor_size import table_rows
from opscope.config import PHASE_CODES, PHASES, DumpConfig, env
from opscope.errors import ConfigError, DumpWriteError
from opscope.model.records import NO_STATS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opscope.capture.torch.host import CaptureHost, GraphItem



def backend_for(cfg: DumpConfig) -> Any:
    """The native module when this dump can use it, else None."""
    if (env("DUMP_BACKEND") or "native").lower() == "python":
        return None
    if (env("STATS_BACKEND", "auto") or "auto").lower() != "auto":  # an engine of the Python path asked for
        return None
    if cfg.suspects or cfg.source:
        return None
    if cfg.level != "aten" and (cfg.data != "statistics" or cfg.tensor_ops):  # api and module tensors: Python
        return None
    return native.load("_opscope_dump")


def _staging_bytes() -> int:
    """OPSCOPE_DEVICE_STAGING_MB in bytes (docs/dump.md, "Tensors on a GPU or NPU")."""
    text = env("DEVICE_STAGING_MB") or "8"
    try:
        mb = float(text)
    except ValueError:
        raise ConfigError(f"OPSCOPE_DEVICE_STAGING_MB={text!r} is not a number of MB (8 is the default; "
                          f"0 reduces each tensor alone)") from None
    if mb < 0:
        raise ConfigError(f"OPSCOPE_DEVICE_STAGING_MB={text!r}: a size cannot be negative "
                          f"(0 reduces each tensor alone)")
    return int(mb * (1 << 20))


def on_host(t: torch.Tensor) -> bool:
    """Is ``t`` read by the C kernel (a CPU tensor), not reduced on its device? (Tests route CPU
    tensors through the device's reductions by replacing it.)"""
    return t.is_cpu


class DeviceJob:
    """Reductions of a tensor still on its device (``stats.device_stats``), read at the step's end
    with the step's others. (A class of its own: the pending reductions are a tuple too, which
    the statistics of a CPU tensor are.)"""

    __slots__ = ("pending",)

    def __init__(self, pending: tuple[torch.Tensor, torch.Tensor, int]) -> None:
        self.pending = pending


class NativeRecorder(Recorder):
    """A :class:`Recorder` whose rows (and full tensors) come from the native observer, the
    optimizer's parameters included (:meth:`record_params`)."""

    def __init__(self, cfg: DumpConfig, writer: Any, rank: int, param_names: dict[int, str], backend: Any) -> None:
        super().__init__(cfg, writer, rank, param_names, "sync")
        self.native = backend
        self.slow: dict[int, Any] = {}  # row index -> statistics, or a DeviceJob
        self._told: Any = False  # the plan whose tensor_ops the native side knows

    def record_params(self, op: str, items: list[tuple[int, str, torch.Tensor, Any, str | None]],
                      before: bool, args: list[str] | None = None) -> None:
        self.native.record_params(op, items, before, args)

    def record_selected(self, op: str, params: list[tuple[int, str, torch.Tensor, str | None]], before: bool,
                        args: list[str] | None = None) -> None:
        """:meth:`record_params` of plain tensors ``(call, module, param, name)``, each gradient read natively."""
        self.native.record_params(op, params, before, args)

    def begin_step(self, step: int, probe: bool = False) -> None:
        super().begin_step(step, probe)
        self.slow = {}
        plan = self.plan  # data="tensor" or tensor_ops (suspects take the Python path)
        if plan is not self._told:  # a new plan (the flight recorder replans): its tensor_ops
            self._told = plan
            self.native.set_tensor_ops(plan is not None and plan.tensor_ops is not None)
        tensors = plan is not None and plan.stopped is None
        self.native.begin_step(step, tensors, probe, -1 if plan is None else plan.budget())

    def idle(self) -> None:
        """Between captured steps the native chunk pool of full tensors returns its memory."""
        self.native.idle()

    def end_step(self) -> None:
        if self.probing:  # what a tensor step would store, said before the window opens
            self.probing = False
            raw = self.native.take_columns()
            table = Columns(raw, self.rank, self.step, getattr(self.native, "args_json", None)).table()
            assert self.plan is not None  # probing is planned by the tensor plan
            self.plan.estimate_from(self.step, table_rows(table), self.wants_data)
            self._reset()
            return
        native, plan, step = self.native, self.plan, self.step
        if plan is not None:
            plan.admitted(step, *native.tensor_counts())
        # hands over the last shard; the arguments become JSON on the writer's thread (args_json)
        cols = Columns(native.take_columns(), self.rank, step, getattr(native, "args_json", None))
        if self.slow:  # tensors measured in Python (only theirs, and rows linked to them, are SLOW)
            self._slow_stats(cols)
        self.meta_skipped = native.meta_skipped()
        self.writer.add_table(step, cols)  # the writer thread builds the Arrow table
        if self.rows:  # (no level of the native dump makes Python rows)
            super().end_step()
            return
        self._close_step()

    def _slow_stats(self, cols: Columns) -> None:
        stats: dict[int, tuple[Any, ...]] = {i: st for i, st in self.slow.items() if not isinstance(st, DeviceJob)}
        jobs = [(i, job.pending) for i, job in self.slow.items() if isinstance(job, DeviceJob)]
        if jobs:
            stats.update(zip((i for i, _ in jobs), materialize([job for _, job in jobs]), strict=True))
        for i, src in cols.links:
            if src in stats:
                stats[i] = stats[src]
        for i, st in stats.items():
            cols.set_stats(i, st)

    # -- hooks the native observer calls (with the GIL) ------------------------------------
    def slow_stats(self, index: int, t: torch.Tensor) -> None:
        with torch._C._DisableTorchDispatch():
            self.slow[index] = cpu_stats(t) if on_host(t) else DeviceJob(device_stats(t))


class _Hooks:
    """What the C++ side asks Python: filters, slow statistics, generator states, errors."""

    def __init__(self, session: CaptureHost, recorder: NativeRecorder) -> None:
        self.session = session
        self.recorder = recorder

    def selected(self, module: str, op: str, phase: int) -> bool:
        return self.recorder.selected(module, op, PHASES[phase])

    def tensor_op(self, op: str) -> bool:
        """With ``tensor_ops``: does ``op`` keep its full tensors (asked once per op)?"""
        plan = self.recorder.plan
        return plan is not None and plan.tensor_ops is not None and plan.tensor_ops.matches(op)

    def slow(self, index: int, t: torch.Tensor) -> None:
        self.recorder.slow_stats(index, t)

    def shard(self, step: int, chunks: list[Any], size: int, nbytes: int) -> str | None:
        """A full tensor shard, onto the writer's queue (waits while it is full); its name."""
        writer = self.recorder.writer
        if writer.error is not None:
            return None  # the disk failed: the error reaches the user once, from the step
        try:
            return writer.add_shard(step, chunks, size, nbytes)
        except DumpWriteError:
            return None  # likewise

    def rng(self, device: str) -> str | None:
        state = None
        if device == "cpu":
            state = torch.get_rng_state()
        elif device.startswith("cuda") and torch.cuda.is_available():
            state = torch.cuda.get_rng_state(device)
        text = None if state is None else base64.b64encode(state.numpy().tobytes()).decode("ascii")
        return json.dumps({"device": device, "state": text})

    def error(self, message: str) -> None:
        self.session.internal_error(RuntimeError(message))

    def backward_ran(self) -> None:
        """A gradient hook of the API level ran: the session's phase turns to backward."""
        self.session.backward_ran()


class NativeAtenLevel(Level):
    """The aten level through the native observer."""

    def __init__(self, session: CaptureHost, backend: Any) -> None:
        super().__init__(session)
        self.native = backend
        recorder = session.recorder
        assert isinstance(recorder, NativeRecorder)  # the session pairs this level with the native recorder
        writer = recorder.writer
        staging = _staging_bytes()  # (a bad value refused before the observer is installed)
        backend.install(classify_op, _Hooks(session, recorder), session.rank, recorder.want_inputs,
                        recorder.want_outputs, NO_STATS, writer.shard_bytes, writer.queue_limit)
        # the worker thread only on request: it measured no faster here, and an op whose schema
        # hides an in-place write would be measured after it (docs/dump.md)
        backend.set_async((env("STATS_THREAD") or "0") == "1")
        backend.set_device_staging(staging)
        self.installed = True
        session.modules.on_change = backend.set_module
        session.modules.on_indexed = self._index

    def _index(self, root: torch.nn.Module) -> None:
        pairs: list[tuple[torch.Tensor, str]] = [
            (p, strip_wrapped(name)) for name, p in root.named_parameters(remove_duplicate=False)]
        pairs += [(b, strip_wrapped(name)) for name, b in root.named_buffers(remove_duplicate=False)]
        self.native.set_params(pairs)

    def set_phase(self, phase: str) -> None:
        self.native.configure(self.on, PHASE_CODES[phase])

    def stop_capture(self) -> None:
        self.native.configure(False, 0)  # safe inside an op; the callback is removed at stop

    def record_graph(self, op: str, path: str, phase: str, inputs: Sequence[GraphItem],
                     outputs: Sequence[GraphItem], call: int = -1) -> int:
        return self.native.record_call(op, path, PHASE_CODES[phase], inputs, outputs, call)

    def forked(self) -> None:
        self.on = False
        self.native.configure(False, 0)
        self.native.register(False)  # the child's copy of the parent thread's callback

    def activate(self) -> None:  # at step boundaries only: see _c/observer.h
        if not self.on:
            self.on = True
            self.native.configure(True, PHASE_CODES[self.session.phase])
            self.native.register(True)

    def deactivate(self) -> None:
        if self.on:
            self.on = False
            self.native.register(False)
            self.native.configure(False, 0)

    def remove(self) -> None:
        self.deactivate()
        if self.installed:
            self.installed = False
            self.native.uninstall()
