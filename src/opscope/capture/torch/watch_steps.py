"""Step-level checks of ``opscope.watch``: the loss (NaN/Inf and spikes against the median
of the last steps) and the step time (spikes), shared by :class:`WatchSession` as a mixin."""

from __future__ import annotations

import logging
import math
import statistics
from collections import deque
from typing import Any

import torch

from opscope.capture.torch.watch_event import OverflowEvent
from opscope.errors import OverflowDetected
from opscope.report.overflow_console import render

log = logging.getLogger("opscope.watch")


class StepChecks:
    """Needs ``cfg``, ``rank``, ``checker``, ``clock``, ``events``, ``_step_events``,
    ``_losses`` and ``_times`` from the session."""

    cfg: Any
    rank: int
    checker: Any
    clock: Any
    events: list[OverflowEvent]
    _step_events: list[OverflowEvent]
    _losses: deque[float]
    _times: deque[float]

    def _spike(self, kind: str, op: str, step: int, detail: str) -> None:
        event = OverflowEvent(kind=kind, op=op, module="", phase="forward", step=step, rank=self.rank,
                              level=self.cfg.level, detail=detail)
        self.events.append(event)
        self._step_events.append(event)
        if self.cfg.action == "raise":
            raise OverflowDetected(render(event), event)
        if self.cfg.action == "warn":
            log.warning("%s", render(event))

    # -- step-level checks -------------------------------------------------------------
    def _check_loss(self, loss: Any) -> None:
        if isinstance(loss, torch.Tensor):
            if loss.dtype.is_floating_point and loss.numel():
                self.checker.observe("<loss>", "", "forward", None, None, (self.checker.ident(loss),), [loss],
                                     strict=True)
                self.checker.resolve()  # the loss is read now anyway (float(loss) below)
            value = float(loss.detach().float().mean()) if loss.numel() else math.nan
        else:
            value = float(loss)
        if not math.isfinite(value):
            return
        history = list(self._losses)
        self._losses.append(value)
        if self.cfg.loss_spike and len(history) >= 2:
            median = statistics.median(history)
            if value - median > (self.cfg.loss_spike - 1) * abs(median):
                self._spike("loss_spike", "<loss>", self.clock.step,
                            f"loss {value:.6g} at step {self.clock.step} against a median of {median:.6g} over the "
                            f"previous {len(history)} steps (loss_spike={self.cfg.loss_spike:g})")

    def _check_time(self, step: int, elapsed: float) -> None:
        history = list(self._times)
        if step > 0:  # step 0 includes warm-up
            self._times.append(elapsed)
        if self.cfg.time_spike and len(history) >= 2:
            median = statistics.median(history)
            if elapsed > self.cfg.time_spike * median:
                self._spike("time_spike", "<step time>", step,
                            f"step {step} took {elapsed:.4g} s, {elapsed / median:.1f}x the median {median:.4g} s "
                            f"of the previous {len(history)} steps (time_spike={self.cfg.time_spike:g})")
