"""Per-tensor statistics of many tensors at once: L2 norm, max |x|, NaN and Inf counts.

Two engines, the cheaper one per place (benchmarks/bench_monitor.py prints both):

- on the CPU, the native one-pass kernel (``_fastats``, :mod:`opscope.capture.torch.stats`):
  every statistic in one read of each tensor, ~0.35-0.5 ms for the 421K parameters of the
  reference transformer where ``torch._foreach_norm`` alone takes ~0.4 ms and
  ``_foreach_norm(ord=inf)`` ~4 ms;
- on an accelerator, batched torch ops: ``torch._foreach_norm`` and
  ``torch._foreach_max(torch._foreach_abs(...))`` per (device, dtype) group, one launch
  each, left on the device as one stacked tensor until the step's end, where everything
  is read in one transfer. NaN/Inf counts there cost a pass per tensor, so they are taken
  only for tensors whose norm came back non-finite (a finite norm means none), while the
  tensors are still alive.

Statistics never change the tensors they read (no in-place op, no dtype change of theirs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from opscope.capture.torch.stats import CODES, F16_FAST, _fastats
from opscope.config.env import env
from opscope.monitor.events import STATS

__all__ = ["NATIVE", "STATS", "Pending", "scalar_stats"]
# OPSCOPE_STATS_BACKEND=torch takes the device path on the CPU too (as dump does)
NATIVE = (env("STATS_BACKEND") or "auto").lower() != "torch"


class Pending:
    """The statistics of a list of tensors, possibly still on a device.

    ``values()`` returns one ``[norm, max, nan, inf]`` per tensor (floats), reading the
    device results once. Until then the tensors read on a device are kept when ``keep``,
    so that the counts of a tensor with a non-finite norm can be taken (the session reads
    gradients, state and weights in the optimizer step, while they are alive anyway). With
    ``keep=False`` (activations, which backward would otherwise free) nothing is kept and
    the counts of such a tensor are unknown (NaN); the CPU kernel counts at once either way.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], keep: bool = True) -> None:
        self.tensors = list(tensors)
        self.host: list[list[float] | None] = [None] * len(self.tensors)
        self.device: list[tuple[list[int], torch.Tensor]] = []
        self._issue()
        if not keep or not self.device:
            self.tensors = []

    def _issue(self) -> None:
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, t in enumerate(self.tensors):
            if t.is_cpu and _native(t):
                self.host[i] = _native_stats(t)
            else:
                groups.setdefault((t.device, t.dtype), []).append(i)
        for indices in groups.values():
            group = [_real(self.tensors[i]) for i in indices]
            if not group[0].dtype.is_floating_point:
                group = [g.float() for g in group]
            low = group[0].dtype in (torch.float16, torch.bfloat16)  # accumulate and return in float32
            norms = torch._foreach_norm(group, 2, dtype=torch.float32) if low else torch._foreach_norm(group)
            maxes = torch._foreach_max(torch._foreach_abs(group))
            pair = torch.stack([torch.stack(norms).double(), torch.stack(maxes).double()], 1)
            self.device.append((indices, pair))

    def values(self) -> np.ndarray:
        """``[norm, max, nan, inf]`` of each tensor, in the order given: a ``[n, 4]`` array."""
        for indices, pair in self.device:
            for i, (norm, mx) in zip(indices, pair.cpu().tolist(), strict=True):
                nan = inf = 0.0
                if not math.isfinite(norm):
                    nan, inf = _counts(self.tensors[i]) if self.tensors else (math.nan, math.nan)
                    mx = math.nan if nan or not self.tensors else mx
                self.host[i] = [norm, mx, nan, inf]
        self.device = []
        self.tensors = []
        return np.array([v if v is not None else [math.nan] * 4 for v in self.host], dtype=np.float64).reshape(-1, 4)


def _native(t: torch.Tensor) -> bool:
    code = CODES.get(t.dtype)
    usable = _fastats is not None and code is not None and t.dtype.is_floating_point
    return NATIVE and usable and (code != 2 or F16_FAST)


def _native_stats(t: torch.Tensor) -> list[float]:
    assert _fastats is not None  # _native() said so
    if not t.is_contiguous():  # (data_ptr needs no detach: nothing here is recorded by autograd)
        t = t.detach().contiguous()
    n = t.numel()
    if n == 0:
        return [0.0, 0.0, 0.0, 0.0]
    mn, mx, _total, sumsq, nan, inf, _zeros, _hash = _fastats.stats(t.data_ptr(), n, CODES[t.dtype])
    if nan:
        return [math.nan, math.nan, float(nan), float(inf)]
    return [math.sqrt(sumsq), max(abs(mn), abs(mx)), 0.0, float(inf)]


def _real(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t) if t.is_complex() else t


def _counts(t: torch.Tensor) -> tuple[float, float]:
    t = _real(t)
    if not t.dtype.is_floating_point:
        return 0.0, 0.0
    return float(torch.isnan(t).sum()), float(torch.isinf(t).sum())


def scalar_stats(value: Any) -> float:
    """A loss or learning rate (a number or a tensor) as one float; the mean of a tensor."""
    if isinstance(value, torch.Tensor):
        if not value.numel():
            return math.nan
        return float(value.detach().float().mean())
    return float(value)
