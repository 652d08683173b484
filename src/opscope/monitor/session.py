"""``opscope.monitor``: training-state statistics every step, and which tensor moved first.

Per monitored step (``every``): the model's inputs and chosen modules' outputs as they are
made, the activations' gradients as backward makes them (under DDP each rank's own
weight gradients before the all-reduce: :mod:`~opscope.monitor.ddp`), the weights'
gradients before ``optimizer.step()``, the learning rate, the optimizer's state and the
weights after it, and the loss given to ``m.step(loss=...)`` (else the scalar backward
started from: :mod:`~opscope.monitor.loss`). Each tensor gives its L2 norm, max |x| and NaN
and Inf counts (:mod:`~opscope.monitor.stats`: one batched native call per kind on the CPU,
the gradients on the kernel's own thread while ``optimizer.step()`` runs; batched torch
ops on a device; read once per step). A background thread
(:mod:`~opscope.monitor.judge`) then hands the rows to a Parquet time series
(:mod:`~opscope.monitor.series`) and the norms to the detector
(:mod:`~opscope.monitor.detect`); a step where something left its band is an event naming
the earliest tensor of the step that moved, handed to the session's ``report`` callable for
its one line, and optionally to a watch's flight recorder.
"""

from __future__ import annotations

import logging
import operator
import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from opscope.capture.steps import StepClock
from opscope.capture.torch.dist import current_rank
from opscope.config import MonitorConfig
from opscope.config.monitor import tensorboard_dir
from opscope.errors import ConfigError
from opscope.monitor import ddp, series, stats
from opscope.monitor import loss as loss_hook
from opscope.monitor.detect import BandDetector
from opscope.monitor.diagnose import adam_eps_departures
from opscope.monitor.events import Departure, MonitorData, MonitorEvent
from opscope.monitor.hooks import ModelHooks, named_inputs
from opscope.monitor.judge import Judge
from opscope.monitor.layout import OptimizerLayouts, ids_array
from opscope.monitor.registry import SeriesTable
from opscope.monitor.stats import Pending, Running, scalar_stats
from opscope.monitor.tensorboard import ScalarWriter

log = logging.getLogger("opscope.monitor")
Key = tuple[str, str]
_TRANSIENT = ("input", "activation", "activation_grad")
# finished steps handed to the judge's thread together as a backward begins: one step at a time
# its Python ran cold and took ~1.7x the CPU; 4 still fit well within a backward pass
_BACKWARD_GROUP = 4


class MonitorSession:
    """A running (or ready) monitor. See :func:`opscope.monitor`.

    Args:
        cfg: the resolved ``monitor`` config.
        report: turns an event into its one line of text (stderr, logger ``opscope.monitor``).
        html: turns the data read back at stop into ``report.html``; None writes none.
        model, optimizer: what to hook; None: found from the first step / any optimizer.
        flight: a ``opscope.watch(action="record")`` session whose flight recorder an
            event triggers.
    """

    def __init__(self, cfg: MonitorConfig, report: Callable[[MonitorEvent], str],
                 html: Callable[[MonitorData], str] | None = None, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, flight: Any = None) -> None:
        self.cfg, self.report, self.html = cfg, report, html
        self.model, self.optimizer, self.flight = model, optimizer, flight
        self.rank = current_rank()
        self.active = cfg.enable and (cfg.ranks is None or self.rank in cfg.ranks)
        self.started = False
        self.targets = set(cfg.targets)
        self.clock = StepClock(self._boundary)
        self.series = SeriesTable()  # every series' kind, name and place, once; known elsewhere by id
        self.detector = BandDetector(cfg.window, cfg.threshold, cfg.warmup, self.series,
                                     move_decades=cfg.move_decades, loss_rise=cfg.loss_rise)
        follow = self.targets & {"activations", "activation_grads"}
        self.hooks = ModelHooks(cfg.modules if follow else None, self._root_call, self._output, self._adopted,
                                names=self.series.params)
        self.events: list[MonitorEvent] = []
        self.writer: series.SeriesWriter | None = None
        self.judge: Judge | None = None
        self.on = True
        self._handles: list[Any] = []
        self._pending: list[tuple[np.ndarray, Pending | Running]] = []  # series ids, their statistics to come
        self._blocks: list[tuple[np.ndarray, np.ndarray]] = []  # read: series ids, [n, 4] statistics (Running's: bytes)
        self._scalars: dict[int, float] = {}  # the loss and learning rates, by series id
        self._losses: list[torch.Tensor] = []  # what backward started from this step (loss.py)
        self._calls: dict[str, int] = {}
        self._buckets: dict[tuple[int, int], tuple[list[torch.Tensor], list[int], np.ndarray]] = {}  # DDP's
        self._optimizer_seen = False
        self._causes: list[Departure] = []
        # the optimizer state's statistics on the kernel's thread until the next optimizer step
        # (only it writes the state), and the finished step that waits for them
        self._late: tuple[np.ndarray, Pending, torch.optim.Optimizer, Any] | None = None
        self._held: tuple[int, list[tuple[np.ndarray, np.ndarray]], dict[int, float], list[Departure]] | None = None
        self._defer = False
        self._after = bool(self.targets & {"optimizer", "weights"})
        self.layouts = OptimizerLayouts(self.hooks, self.series, "optimizer" in self.targets, "weights" in self.targets)

    @property
    def step_index(self) -> int:
        """The step being executed (0-based)."""
        return self.clock.step

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> MonitorSession:
        """Install the hooks. A rank not in ``ranks`` (or ``enable=False``) installs nothing."""
        if self.started:
            raise ConfigError("this monitor was already started; create a new opscope.monitor(...) to monitor again")
        self.started = True
        if not self.active:
            return self
        tb_dir = tensorboard_dir(self.cfg)  # first: without the tensorboard package, an error and no folder
        tensorboard = None if tb_dir is None else ScalarWriter(tb_dir, self.rank, self.series)
        self.writer = series.SeriesWriter(self.cfg.path, self.rank, self.cfg.chunk, self.cfg.to_json(),
                                          self.cfg.overwrite, self.series)
        self.judge = Judge(self.detector, self.writer, self.rank, self._emit, threaded=self.flight is None,
                           tensorboard=tensorboard)
        # not the weights: code between two steps may write them (a clamp, an EMA)
        self._defer = self.flight is None and "weights" not in self.targets and stats.NATIVE and stats.BATCHED
        try:
            if "loss" in self.targets or self.flight is None:  # (the judge's hand-over too)
                loss_hook.listen(self._backward)
            self.hooks.install(self.model)
            if self.optimizer is not None:
                self._handles = [self.optimizer.register_step_pre_hook(self._optimizer_pre),
                                 self.optimizer.register_step_post_hook(self._optimizer_post)]
            else:
                from torch.optim import optimizer as opt

                self._handles = [opt.register_optimizer_step_pre_hook(self._optimizer_pre),
                                 opt.register_optimizer_step_post_hook(self._optimizer_post)]
        except BaseException:
            self._finish("crashed")
            raise
        return self

    def step(self, loss: Any = None, lr: Any = None) -> None:
        """End the current step; ``loss`` and ``lr`` (else read from the optimizer) are recorded."""
        if not (self.active and self.started):
            return
        if self.on:
            if loss is not None and "loss" in self.targets:
                self._scalars[self.series.scalar("loss", "loss")] = scalar_stats(loss)
            if lr is not None and "lr" in self.targets:
                self._scalar(("lr", "lr"), scalar_stats(lr))
            if not self._optimizer_seen and "grads" in self.targets:
                self._grads_of_models()
        self.clock.user_step()

    def stop(self) -> MonitorData:
        """End the last step, write the rest and the report; returns what was recorded."""
        self._finish("complete")
        return self.result

    @property
    def result(self) -> MonitorData:
        """The data written so far, read back from the folder (after ``stop()`` or the ``with``
        block, all of it): ``bool(m.result)`` is True when nothing moved (as ``w.result``)."""
        if self.writer is None:
            return MonitorData(path=self.cfg.path, config=self.cfg.to_json(), ranks={})
        return series.read(self.cfg.path)

    def __enter__(self) -> MonitorSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._finish("complete" if exc is None else "crashed")

    def _finish(self, status: str) -> None:
        if not self.started or not self.active:
            self.started = False
            return
        self.started = False
        try:
            if status == "complete":
                self.clock.poll()
                if self._pending or self._blocks or self._scalars or self._losses:  # a last step no boundary ended
                    self._end_step(self.clock.step)
                self._settle()
        finally:
            self._late = self._held = None
            stats.join()
            loss_hook.unlisten(self._backward)
            self.hooks.remove()
            for h in self._handles:
                h.remove()
            self._handles = []
            self.layouts.clear()  # it holds tensors
            self._buckets = {}
            if self.writer is not None:
                try:
                    if self.judge is not None:
                        self.judge.close()
                finally:
                    self.writer.close(status)
                self._write_report()

    def _write_report(self) -> None:
        if self.html is None or not self.cfg.report or self.writer is None:
            return
        where = Path(self.cfg.path) / "report.html" if self.rank == 0 else self.writer.dir / "report.html"
        tmp = where.with_name(where.name + ".tmp")
        tmp.write_text(self.html(series.read(self.cfg.path)), encoding="utf-8")
        os.replace(tmp, where)

    # -- what each step records --------------------------------------------------------
    def _place(self, kind: str, name: str, position: int | None = None) -> int:
        """The id of series ``(kind, name)`` (placed at ``position`` of its kind's class when new)."""
        return self.series.id(kind, name, position)

    def _track(self, kind: str, named: list[tuple[str, torch.Tensor]], positions: list[int] | None = None) -> None:
        named = [(n, t) for n, t in named if t.numel()]
        if not named:
            return
        ids = ids_array([self._place(kind, n, None if positions is None else positions[i])
                         for i, (n, _) in enumerate(named)])
        # activations are not kept alive past their own use (backward frees them)
        self._pending.append((ids, Pending([t for _, t in named], keep=kind not in _TRANSIENT)))

    def _track_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients of ``optimizer``'s parameters, reduced on the batched kernel's native
        thread while ``optimizer.step()`` runs (it only reads them); read in the post-hook."""
        batch = self.layouts.grad_batch(self.layouts.params(optimizer))
        if batch is not None:
            self._pending.append(batch)

    def _scalar(self, key: Key, value: float) -> None:
        self._scalars[self._place(*key)] = value

    def _has_scalar(self, kind: str, name: str) -> bool:
        i = self.series.find(kind, name)
        return i is not None and i in self._scalars

    def _root_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.clock.outer_module_call()
        if self.on and "inputs" in self.targets:
            inputs = [(n, t if t.dtype.is_floating_point else t.detach().double())
                      for n, t in named_inputs(args, kwargs)]
            self._track("input", inputs)

    def _output(self, path: str, t: torch.Tensor) -> None:
        if not self.on:
            return
        calls = self._calls[path] = self._calls.get(path, 0) + 1
        name = path if calls == 1 else f"{path}#{calls}"
        if "activations" in self.targets:
            self._track("activation", [(name, t)])
        if "activation_grads" in self.targets and t.requires_grad:
            t.register_hook(lambda g, name=name: self._activation_grad(name, g))

    def _activation_grad(self, name: str, g: torch.Tensor) -> None:
        known = self.series.find("activation_grad", name) is not None
        self._track("activation_grad", [(name, g)], None if known else [self.hooks.tick()])

    def _adopted(self, root: torch.nn.Module) -> None:
        if "grads" in self.targets and ddp.is_ddp(root):
            me = weakref.ref(self)

            def on_bucket(params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
                session = me()
                if session is not None and session.started and session.on:
                    session._local_grads(params, grads)
            if ddp.install(root, on_bucket):
                self.layouts.reduced = 500_000

    def _local_grads(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """A DDP bucket's gradients as this rank's backward made them, before the all-reduce;
        the bucket's series found once (while it holds the same parameters)."""
        key = (id(params[0]) if params else 0, len(params))
        layout = self._buckets.get(key)
        if layout is None or not all(map(operator.is_, layout[0], params)):
            chosen = [i for i, g in enumerate(grads) if g.numel()]
            slots, hooks = self.hooks.slots(params), self.hooks
            ids = ids_array([self.series.slot_id("grad_local", slots[i], hooks.place_of(slots[i]) or hooks.tick())
                             if slots[i] >= 0 else self._place("grad_local", f"param{i}", hooks.tick())
                             for i in chosen])
            layout = self._buckets[key] = (list(params), chosen, ids)
        _, chosen, ids = layout
        if len(ids):
            self._blocks.append((ids, Pending([grads[i] for i in chosen]).values()))

    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.clock.poll()
        if self._late is not None:
            self._settle()  # the last optimizer step's state, read before this one writes it
        self._optimizer_seen = True
        if self.hooks.order_hooks:
            self.hooks.stop_learning_order()
        if not self.on:
            return
        if "lr" in self.targets:
            self.layouts.rates(optimizer, self._scalars)
        if "grads" in self.targets:
            self._track_grads(optimizer)

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.on:
            self._read()  # the gradients (from the kernel's thread) and what else the step made
            if self._after:
                self._track_after(optimizer)
        self.clock.optimizer_step()

    def _track_after(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's state and the weights, after its step."""
        params = self.layouts.params(optimizer)
        ids, tensors = self.layouts.after(optimizer, params)
        if tensors and self._defer:  # the state alone: on the kernel's thread while training goes on
            self._late = (ids, Pending(tensors, background=True), optimizer, params)
        elif tensors:  # state and weights: one batch (the Adam-eps check reads only these)
            pending = Pending(tensors)
            self._blocks.append((ids, pending.values()))
            if not pending.finite:  # (the kernel's count says so without a numpy call)
                self._causes += adam_eps_departures(optimizer, params, self._blocks, self.series)

    def _settle(self) -> None:
        """Read the optimizer state's statistics taken on the kernel's thread (their values are
        the state after the step that took them: only the next optimizer step writes it); they
        join their step, which is handed over if it ended meanwhile."""
        late, self._late = self._late, None
        if late is None:
            return
        ids, pending, optimizer, params = late
        block = (ids, pending.values())
        causes = [] if pending.finite else adam_eps_departures(optimizer, params, [block], self.series)
        if self._held is None:  # their step goes on
            self._blocks.append(block)
            self._causes += causes
            return
        step, blocks, scalars, held_causes = self._held
        self._held = None
        assert self.judge is not None
        self.judge.submit(step, [*blocks, block], scalars, held_causes + causes)

    def _grads_of_models(self) -> None:
        named = [(n, p) for ref in self.hooks.roots if ref() is not None
                 for n, p in ref().named_parameters() if p.grad is not None and p.grad.numel()]  # type: ignore[union-attr]
        k = len(named)
        ids = [self.series.slot_id("grad", slot, k - 1 - i) if slot >= 0 else self._place("grad", n, k - 1 - i)
               for i, ((n, _), slot) in enumerate(zip(named, self.hooks.slots(p for _, p in named), strict=True))]
        if ids:
            self._pending.append((ids_array(ids), Pending([p.grad for _, p in named])))  # type: ignore[misc]

    def _read(self) -> None:
        """Bring every pending statistic of the step to the host (one read per device)."""
        self._blocks += [(keys, pending.read()) for keys, pending in self._pending]  # type: ignore[misc]
        self._pending = []

    # -- steps -------------------------------------------------------------------------
    def _boundary(self, finished: int, step: int) -> None:
        if self.hooks.finder and self.hooks.roots:
            self.hooks.stop_finding()
        if self.on:
            self._end_step(finished)
        self._optimizer_seen = False
        self._calls = {}
        self.on = step % self.cfg.every == 0

    def _backward(self, value: torch.Tensor) -> None:
        """A backward pass begins from the scalar ``value``: the loss, when followed; and the
        finished steps go to the judge's thread now, whose Python then runs while the autograd
        engine holds no GIL (handed over at a step's end it would make the training thread wait)."""
        if self.started:
            if self.on and "loss" in self.targets:
                self._losses.append(value)
            if self.judge is not None:
                self.judge.hand_over(_BACKWARD_GROUP)

    def _end_step(self, step: int) -> None:
        if self._held is not None:  # no optimizer step since the last step ended: its state now
            self._settle()
        losses, self._losses = self._losses, []
        if losses and not self._has_scalar("loss", "loss"):  # no m.step(loss=...): what backward started from
            self._scalar(("loss", "loss"), sum(scalar_stats(v) for v in losses) / len(losses))
        self._read()
        blocks, self._blocks = self._blocks, []
        scalars, self._scalars = self._scalars, {}
        causes, self._causes = self._causes, []
        if self._late is not None:  # handed over with its optimizer state's statistics (_settle)
            self._held = (step, blocks, scalars, causes)
            return
        assert self.judge is not None
        self.judge.submit(step, blocks, scalars, causes)

    def _emit(self, event: MonitorEvent) -> None:
        self.events.append(event)
        assert self.writer is not None
        self.writer.event(event)
        log.warning("%s", self.report(event))
        recorder = getattr(self.flight, "flight", None)
        if recorder is not None:
            recorder.trigger(event.step, f"monitor: {event.first.label} moved", [], event.to_json())
