"""Step-level checks of ``opscope.watch``: the loss (NaN/Inf and spikes against the median
of the last steps) and the step time (spikes). A spike becomes an :class:`OverflowEvent`
handed to ``emit`` (the session records it and acts on it)."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from opscope.config import WatchConfig
from opscope.watch.events import OverflowEvent


class StepChecks:
    """The loss and step-time checks of one watch.

    Args:
        cfg: the watch's config (``history``, ``loss_spike``, ``time_spike``, ``level``).
        rank: this process's rank (named in the events).
        checker: the per-op checker; the loss tensor goes through it like an op output.
        emit: called with each spike event.
    """

    def __init__(self, cfg: WatchConfig, rank: int, checker: Any, emit: Callable[[OverflowEvent], None]) -> None:
        self.cfg = cfg
        self.rank = rank
        self.checker = checker
        self.emit = emit
        self.losses: deque[float] = deque(maxlen=cfg.history)
        self.times: deque[float] = deque(maxlen=cfg.history)

    def _spike(self, kind: str, op: str, step: int, detail: str) -> None:
        self.emit(OverflowEvent(kind=kind, op=op, module="", phase="forward", step=step, rank=self.rank,
                                level=self.cfg.level, detail=detail))

    def check_loss(self, loss: Any, step: int) -> None:
        """Check the loss of ``step``: through the checker (NaN/Inf), then against the median."""
        checker = self.checker
        if isinstance(loss, torch.Tensor):
            if loss.dtype.is_floating_point and loss.numel():
                checker.observe("<loss>", "", "forward", None, None, (checker.ident(loss),), [loss], strict=True)
                checker.resolve()  # the loss is read now anyway (float(loss) below)
            value = float(loss.detach().float().mean()) if loss.numel() else math.nan
        else:
            value = float(loss)
        if not math.isfinite(value):
            return
        history = list(self.losses)
        self.losses.append(value)
        if self.cfg.loss_spike and len(history) >= 2:
            median = statistics.median(history)
            if value - median > (self.cfg.loss_spike - 1) * abs(median):
                self._spike("loss_spike", "<loss>", step,
                            f"loss {value:.6g} at step {step} against a median of {median:.6g} over the "
                            f"previous {len(history)} steps (loss_spike={self.cfg.loss_spike:g})")

    def check_time(self, step: int, elapsed: float) -> None:
        """Check how long ``step`` took (seconds) against the median of the previous steps."""
        history = list(self.times)
        if step > 0:  # step 0 includes warm-up
            self.times.append(elapsed)
        if self.cfg.time_spike and len(history) >= 2:
            median = statistics.median(history)
            if elapsed > self.cfg.time_spike * median:
                self._spike("time_spike", "<step time>", step,
                            f"step {step} took {elapsed:.4g} s, {elapsed / median:.1f}x the median {median:.4g} s "
                            f"of the previous {len(history)} steps (time_spike={self.cfg.time_spike:g})")
