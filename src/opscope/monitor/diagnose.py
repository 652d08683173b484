"""Why an optimizer step made a NaN/Inf weight: checks run only on that alarm path.

Adam's update is ``exp_avg / (sqrt(exp_avg_sq) + eps)``. In float16, ``eps=1e-8`` rounds to
0 (the smallest float16 is 6e-8), and ``exp_avg_sq = (1 - beta2) * grad**2`` underflows to
0 for gradients below ~8e-3 on the first step a parameter is trained: the update divides a
non-zero ``exp_avg`` by 0. When a weight (or its state) turns non-finite in the optimizer
step, each such parameter's state is read once to see whether that is what happened; if so
the ``exp_avg_sq`` of that parameter is named as the tensor that moved first.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from opscope.monitor.events import Departure
from opscope.monitor.registry import SeriesTable


def adam_eps_departures(optimizer: torch.optim.Optimizer, items: Iterable[tuple[str, torch.Tensor, int]],
                        blocks: list[tuple[np.ndarray, np.ndarray]], series: SeriesTable) -> list[Departure]:
    """Departures naming ``exp_avg_sq`` of each parameter whose update divided by zero.

    Args:
        optimizer: the optimizer that just stepped.
        items: ``(name, parameter, position)`` of its parameters.
        blocks: the step's statistics read so far (series ids, ``[n, 4]``: norm, max, NaN, Inf).
        series: the session's series (the named state is added to it).
    """
    # the blocks of state or weights (they start with exp_avg, or are weights), with a NaN/Inf count: rare
    suspects = [(ids, values) for ids, values in blocks
                if len(ids) and series.key(int(ids[0]))[0] in ("weight", "exp_avg") and values[:, 2:].any()]
    keys = [series.key(int(ids[i])) for ids, values in suspects for i in np.flatnonzero(values[:, 2:].any(axis=1))]
    broken = {name for kind, name in keys if kind in ("weight", "exp_avg")}
    if not broken:
        return []
    eps_of = {id(p): g.get("eps") for g in optimizer.param_groups for p in g["params"]}
    out = []
    for name, p, position in items:
        state = optimizer.state.get(p, {}) if name in broken else {}
        v, m, eps = state.get("exp_avg_sq"), state.get("exp_avg"), eps_of.get(id(p))
        if not isinstance(v, torch.Tensor) or not isinstance(m, torch.Tensor) or not isinstance(eps, float):
            continue
        zero = int(((v == 0) & (m != 0)).sum())
        eps_here = float(torch.tensor(eps, dtype=v.dtype))
        if zero == 0 or eps_here != 0.0:
            continue
        place = series.order[series.id("exp_avg_sq", name, position)]
        dtype = str(v.dtype).removeprefix("torch.")
        tiny = torch.finfo(v.dtype).tiny
        out.append(Departure(kind="exp_avg_sq", name=name, stat="zeros", value=float(zero), median=0.0,
                             z=float("inf"), order=place,
                             reason=f"0 at {zero} elements where exp_avg is not, and eps={eps:g} is 0 in {dtype}: "
                                    f"Adam divided by zero; use eps >= {tiny:.0e} or keep the optimizer state in "
                                    "float32"))
    return out

