"""``opscope.watch``: catch the first operator that makes NaN or Inf, cheaply enough to leave on.

Every op output (aten level: every dispatcher op, forward, backward and optimizer; module
level: every module output) gets one fused reduction; gradients, updated parameters, the
loss and the model's inputs are checked too. On a hit: the op, module path, phase, step,
rank, source line, its inputs' statistics and the chain back to the earliest abnormal
output (see :mod:`~opscope.watch.chain`), handed to the session's ``report`` callable
(``event -> str``) for its text. Then, per ``action``:

- ``raise``: :class:`opscope.OverflowDetected` at the end of the op (CPU) or of the step
  (accelerators, where the flags are read once per step);
- ``warn``: one log line (logger ``opscope.watch``) per op, and go on;
- ``record``: the flight recorder (:mod:`~opscope.watch.flight`) writes the
  last ``history`` steps' statistics as a dump, plus the next step with full tensors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from opscope.capture.steps import StepClock
from opscope.capture.torch.dist import current_rank
from opscope.capture.torch.modules import ModuleTracker, tensors_of
from opscope.capture.torch.optimizers import has_optimizer
from opscope.config import WatchConfig
from opscope.errors import ConfigError, OverflowDetected
from opscope.watch.chain import build_event
from opscope.watch.check import MODULE, NAME, PHASE, Checker, WatchDispatchMode
from opscope.watch.events import OverflowEvent, WatchResult
from opscope.watch.modes import (
    enter_under,
    exit_mode,
    optimizer_params,
    optimizer_tensors,
    top_mode,
    user_source,
)
from opscope.watch.observer import NativeChecker, load_backend, param_names_by_impl
from opscope.watch.step_checks import StepChecks

log = logging.getLogger("opscope.watch")
_current_node = torch._C._current_autograd_node


class WatchSession:
    """A running (or ready) watch. See :func:`opscope.watch.watch`.

    Args:
        cfg: the resolved ``overflow`` config.
        report: turns an event into the text of a warning or of :class:`OverflowDetected`.
    """

    def __init__(self, cfg: WatchConfig, report: Callable[[OverflowEvent], str]) -> None:
        self.cfg = cfg
        self.report = report
        self.rank = current_rank()
        self.active = cfg.enable and (cfg.ranks is None or self.rank in cfg.ranks)
        self.started = False
        self.events: list[OverflowEvent] = []
        self.clock = StepClock(self._boundary, has_optimizer=has_optimizer)
        module_level = cfg.level == "module"
        backend = None if not self.active else load_backend()
        self.modules = ModuleTracker(self.clock.outer_module_call, self._enter,
                                     self._exit if module_level else self._exit_op_level)
        self.native = backend is not None
        self.ops_native = self.native and not module_level  # module level: no per-op observer
        self.checker: Checker = (NativeChecker(self.modules, cfg.limit, self._hit, backend, ops=not module_level)
                                 if self.native else Checker(self.modules, cfg.limit, self._hit))
        self.checker.tag_nodes = not module_level
        self.step_checks = StepChecks(cfg, self.rank, self.checker, self._emit)
        self.flight: Any = None
        self._mode: WatchDispatchMode | None = None
        self._handles: list[Any] = []
        self._step_events: list[OverflowEvent] = []
        self._warned: set[tuple[str, ...]] = set()
        self._seen: dict[int, int] = {}
        self._roots: list[weakref.ref] = []
        self._step_start = 0.0
        self._optimizer_seen = False
        self._mode_suspended = False
        self._resolving: int | None = None
        self._last_dump_step = -10**9
        self._dumped: set[tuple[str, ...]] = set()

    @property
    def step_index(self) -> int:
        """The step being executed (0-based)."""
        return self.clock.step

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> WatchSession:
        """Install the checks. A rank not in ``ranks`` (or ``enable=False``) installs nothing."""
        if self.started:
            raise ConfigError("this watch was already started; create a new opscope.watch(...) to watch again")
        self.started = True
        if not self.active:
            return self
        try:
            if self.cfg.action == "record":
                from opscope.watch.flight import FlightRecorder

                self.flight = FlightRecorder(self.cfg.path or "opscope-overflow", self.cfg.level, self.cfg.history)
                self.flight.start()
            self.modules.install()
            from torch.optim import optimizer as opt

            self._handles = [opt.register_optimizer_step_pre_hook(self._optimizer_pre),
                             opt.register_optimizer_step_post_hook(self._optimizer_post)]
            if isinstance(self.checker, NativeChecker):
                self.checker.install()
                os.register_at_fork(after_in_child=self._forked)
            elif self.cfg.level == "aten":
                # Slid under the modes already on the stack: a dump entered before the watch
                # leaves its mode per step with a plain pop of the top, which must be its own.
                self._mode = WatchDispatchMode(self.checker)
                enter_under(self._mode)
        except BaseException:
            self._remove_hooks("crashed", "failed to start")
            raise
        self.checker.on = 0 in self.cfg.steps
        self._sync_mode()
        self._step_start = time.perf_counter()
        return self

    def step(self, loss: Any = None) -> None:
        """End the current step; pass the loss to have it checked (and watched for spikes)."""
        if not (self.active and self.started):
            return
        self._reraise()
        if loss is not None and self.checker.on:
            with self._quiet():
                self.step_checks.check_loss(loss, self.clock.step)
        self.clock.user_step()

    def stop(self) -> WatchResult:
        """Check what is still pending, remove every hook; returns the :class:`WatchResult`."""
        self._finish(None)
        return self.result

    @property
    def result(self) -> WatchResult:
        """What the watch has seen so far (a :class:`WatchResult`; after ``stop()`` or the
        ``with`` block, all of it): ``bool(w.result)`` is True when nothing was found."""
        return WatchResult(events=list(self.events), dumps=list(self.flight.written) if self.flight else [],
                           steps=self.clock.step + 1)

    def __enter__(self) -> WatchSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if not self.started or not self.active:
            self.started = False
            return
        self.started = False
        status, error = ("complete", None) if exc is None else ("crashed", f"{type(exc).__name__}: {exc}")
        try:
            if exc is None and self.checker.on:
                self.checker.resolve()  # may raise OverflowDetected (action="raise" on a device)
                self._record_events(self.clock.step)
            elif exc is not None and self.flight is not None and not isinstance(exc, OverflowDetected):
                self.flight.end_step()
                self.flight.trigger(self.clock.step, f"exception {type(exc).__name__}: {exc}", [], None)
        finally:
            self._remove_hooks(status, error)

    def _remove_hooks(self, status: str, error: str | None) -> None:
        try:
            if isinstance(self.checker, NativeChecker):
                self.checker.uninstall()
            if self._mode is not None:
                if not self._mode_suspended:
                    exit_mode(self._mode)
                self._mode = None
            self.modules.remove()
            for h in self._handles:
                h.remove()
            self._handles = []
            self.checker.on = False
            self.checker.reset()
        finally:
            if self.flight is not None and self.flight.started:
                self.flight.finish(status, error)

    # -- steps -------------------------------------------------------------------------
    def _boundary(self, finished: int, step: int) -> None:
        with self._quiet():
            self._end_step(finished, step)

    def _end_step(self, finished: int, step: int) -> None:
        now = time.perf_counter()
        elapsed, self._step_start = now - self._step_start, now
        if self.flight is not None:
            self.flight.end_step()  # the ring now ends with `finished`
        self._resolving = finished  # events found now belong to the step that just ended
        try:
            if self.checker.on:
                if not self._optimizer_seen:
                    self._check_parameters()
                self.checker.resolve()
                self.step_checks.check_time(finished, elapsed)
            self._record_events(finished)
        finally:
            self._resolving = None
            self.checker.reset()
            self._seen.clear()
            self._step_events = []
            self._optimizer_seen = False
            self.checker.on = step in self.cfg.steps
            self._sync_mode()

    def _record_events(self, step: int) -> None:
        events, self._step_events = self._step_events, []
        if not events or self.flight is None:
            return
        keys = {(e.kind, e.op, e.module) for e in events}
        if keys <= self._dumped or step - self._last_dump_step < self.cfg.history:
            return
        ops = list(dict.fromkeys(op for e in events for op in e.chain_ops))
        first = events[0]
        reason = f"{first.kind} in {first.op} ({first.module or 'top level'}, {first.phase})"
        path = self.flight.trigger(step, reason, ops, first.to_json())
        if path is not None:
            self._dumped |= keys
            self._last_dump_step = step
            log.warning("%s\nflight recorder: writing steps up to %d and the next one to %s", self.report(first), step,
                        path)

    # -- hits --------------------------------------------------------------------------
    def _hit(self, index: int, slot: int, kind: str, t: torch.Tensor | None, args: Any,
             detail: str | None = None) -> None:
        entry = self.checker.entries[index]
        key = (entry[NAME], entry[MODULE], entry[PHASE], kind)
        if self.cfg.action == "warn" and key in self._warned:
            return
        immediate = t is not None and t.is_cpu and not self.checker.pending
        param = self.checker.params.get(index)
        named = self.checker.inputs.get(index)
        names = None
        if named is not None:
            names, args = [n for n, _ in named], [x for _, x in named]
        step = self.clock.step if self._resolving is None else self._resolving
        event = build_event(self.checker.entries, index, slot, kind, t, args, step=step, rank=self.rank,
                            level=self.cfg.level, limit=self.checker.limit, param_names=self._param_names(),
                            source=user_source() if immediate else None, param=param, names=names,
                            ident=self.checker.ident)
        event.detail = detail
        if self.cfg.action == "warn":
            self._warned.add(key)
        self._emit(event)

    def _emit(self, event: OverflowEvent) -> None:
        """Keep ``event`` and act on it: raise or warn (``record`` acts at the step's end)."""
        self.events.append(event)
        self._step_events.append(event)
        if self.cfg.action == "raise":
            raise OverflowDetected(self.report(event), event)
        if self.cfg.action == "warn":
            log.warning("%s", self.report(event))

    def _check_parameters(self) -> None:
        """No optimizer ran this step: check the gradients and parameters of the models seen."""
        named = [(name, p) for ref in self._roots if (root := ref()) is not None for name, p in root.named_parameters()]
        if self.cfg.level == "module":
            with_grad = [(name, p) for name, p in named if p.grad is not None]
            self.checker.group("<grad>", "backward", [p.grad for _, p in with_grad],
                               lambda i: (f"{with_grad[i][0]} (grad)", [with_grad[i]]))
        self.checker.group("<param>", "optimizer", [p for _, p in named], lambda i: (named[i][0], []))

    # -- hooks -------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._reraise()
        self.clock.poll()
        checker = self.checker
        checker.phase = "optimizer"
        self._optimizer_seen = True
        if not checker.on:
            return
        if self._mode is not None or self.ops_native:
            # aten level: gradients were checked as backward ops' outputs; the optimizer's
            # own ops are checked per parameter after the step (param and state, one fused
            # call), which costs a fraction of ~10 ops per parameter through the mode.
            checker.ops_on = False
            self._sync_mode()
        else:
            with_grad = [(p, grad) for p in optimizer_params(optimizer) if (grad := p.grad) is not None]
            checker.group("<grad>", "backward", [grad for _, grad in with_grad],
                          lambda i: (f"{self._param_name(with_grad[i][0])} (grad)", []))

    def _optimizer_post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        checker = self.checker
        checker.ops_on = True
        self._sync_mode()
        if checker.on:
            tensors, describe = optimizer_tensors(optimizer, self._param_name)
            checker.group(f"{type(optimizer).__name__}.step", "optimizer", tensors, describe)
        checker.phase = "forward"
        self.clock.optimizer_step()

    def _sync_mode(self) -> None:
        """Leave the dispatch mode while nothing is to be checked (steps not selected, the
        optimizer step) and come back after; only when it is on top of the mode stack, since
        another session's mode above it expects to leave first."""
        mode = self._mode
        if mode is None:
            if self.native:
                self.checker.on = self.checker.on  # pushes on/ops_on to the observer
            return
        wanted = self.checker.on and self.checker.ops_on
        if wanted and self._mode_suspended:
            self._mode_suspended = False
            enter_under(mode)
        elif not wanted and not self._mode_suspended and top_mode() is mode:
            mode.__exit__(None, None, None)
            self._mode_suspended = True

    def _forked(self) -> None:
        """A child process (a DataLoader worker) inherits the observer: it checks nothing."""
        checker = self.checker
        if isinstance(checker, NativeChecker) and self.started:
            self.active = self.started = False
            checker.on = False
            checker.uninstall()

    def _param_names(self) -> dict[int, str]:
        return param_names_by_impl(self._roots) if self.native else self.modules.param_names

    def _quiet(self) -> Any:
        checker = self.checker
        return checker.quiet() if isinstance(checker, NativeChecker) else contextlib.nullcontext()

    def _reraise(self) -> None:
        checker = self.checker
        if isinstance(checker, NativeChecker):
            checker.reraise()

    def _exit_op_level(self, module: torch.nn.Module, path: str, args: Any, output: Any) -> None:
        checker = self.checker
        if isinstance(checker, NativeChecker):
            checker.module_changed(self.modules.path)
            self._reraise()

    def _param_name(self, p: torch.Tensor) -> str:
        return self.modules.param_names.get(id(p)) or f"<unnamed {tuple(p.shape)}>"

    def _enter(self, module: torch.nn.Module, path: str, args: Any) -> None:
        checker = self.checker
        if self.ops_native and isinstance(checker, NativeChecker):
            self._reraise()
            checker.module_changed(path)
        if len(self.modules.stack) != 1:
            return
        if not any(r() is module for r in self._roots):
            self._roots.append(weakref.ref(module))
        if self.checker.on:
            inputs = [t for t in tensors_of(args) if t.dtype.is_floating_point]
            if inputs:
                self.checker.observe("<model input>", path, self.checker.phase, None, None, (), inputs, select=True)

    def _exit(self, module: torch.nn.Module, path: str, args: Any, output: Any) -> None:
        checker = self.checker
        if not checker.on or output is None:
            return
        outs = tensors_of(output)
        seen = self._seen
        fresh = []
        for t in outs:
            key, version = id(t), (-1 if t.is_inference() else t._version)
            if seen.get(key, -2) != version:
                seen[key] = version
                fresh.append(t)
        if not fresh:
            return
        ident = checker.ident
        args = args if type(args) is tuple else (args,)
        in_ids = tuple(ident(a) for a in args if isinstance(a, torch.Tensor))
        phase = "backward" if _current_node() is not None else checker.phase
        if isinstance(checker, NativeChecker):
            checker.observe_module(type(module).__name__, path, phase, in_ids, fresh, args)
        else:
            checker.observe(type(module).__name__, path, phase, None, None, in_ids, fresh, args)

