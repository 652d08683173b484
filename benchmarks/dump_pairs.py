"""The dump's per-step costs measured at step granularity in one process (used by bench_dump.py).

Whole runs alternated process by process, or block by block, spread more than the targets
they judge (a tiny step's 200 us, a not-selected step's 1%): what loads the machine changes
between blocks. Here two copies of the same model (same seed, same batches) step in turn,
one of them under the dump session, so each pair of neighbouring steps gives one difference
or ratio, and the median of the pairs comes with its 95% confidence interval (order
statistics, no assumption on the distribution). The two copies' losses are checked
bit-identical at every step (the dump changes no number it observes).

- :func:`not_selected`: a session that selects no step; its copy calls ``d.step()`` after
  each of its steps, the other copy is bare; the order flips every pair.
- :func:`tiny_cycle`: a session selecting steps 4k and 4k+1; copy A steps A0 (selected, after
  a selected boundary: a step of a dump of every step), A1 (selected, its boundary switches
  capture off), A2 (not selected), then copy B four bare steps B0..B3 (while A's session
  captures nothing), then A3 (not selected, its boundary switches capture on). Per cycle:
  A0 - B1 is the dumped step's fixed cost against a bare one, A0 - A2 against a step not
  selected, A2 - B2 a step not selected against a bare one (each pair: steps that follow a
  step of the same copy).
"""

from __future__ import annotations

import os
import shutil
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

import torch

import opscope
from opscope.demo.models import train_step


def ci(values: list[float]) -> tuple[float, float, float]:
    """Median of ``values`` and its 95% confidence interval (order statistics)."""
    s = sorted(values)
    n = len(s)
    k = max(0, int((n - 1.96 * n**0.5) / 2))
    return statistics.median(s), s[k], s[n - 1 - k]


def hooks_now() -> int:
    """Global module and optimizer hooks installed now (what puts every call on torch's slow path)."""
    from torch.optim import optimizer as opt

    mm = torch.nn.modules.module
    return (len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks)
            + len(opt._global_optimizer_pre_hooks) + len(opt._global_optimizer_post_hooks))


def _timed(model: Any, opt: Any, batch: Any, i: int, d: Any = None) -> tuple[float, float, float]:
    """(wall, training thread's CPU, loss) of step ``i``, ``d.step()`` included when given."""
    t0, c0 = time.perf_counter(), time.thread_time()
    loss = train_step(model, opt, *batch(i))
    if d is not None:
        d.step()
    return time.perf_counter() - t0, time.thread_time() - c0, loss


def _same(a: float, b: float) -> bool:
    return struct.pack("d", a) == struct.pack("d", b)


def not_selected(task: Callable[[], Any], pairs: int, rounds: int, root: str, warmup: int = 6) -> dict[str, Any]:
    """Steps not selected against bare steps, pair by pair (module docstring). Fresh copies and
    a fresh session each round (what memory layout favours one copy changes from round to round)."""
    wall: list[float] = []
    cpu: list[float] = []
    per_round: list[float] = []
    identical, left = True, 0
    for r in range(rounds):
        sides = [task(), task()]
        path = os.path.join(root, "not-selected")
        shutil.rmtree(path, ignore_errors=True)
        before = hooks_now()
        mine: list[float] = []
        with opscope.dump(path, level="aten", steps=str(10 * (pairs + warmup))) as d:  # a step never reached
            for i in range(warmup + pairs):
                got: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * 2
                for side in (0, 1) if (i + r) % 2 == 0 else (1, 0):
                    model, opt, batch = sides[side]
                    got[side] = _timed(model, opt, batch, i, d if side else None)
                    if i == warmup and side == 1:
                        left = max(left, hooks_now() - before)
                identical = identical and _same(got[0][2], got[1][2])
                if i >= warmup:
                    mine.append(got[1][0] / got[0][0])
                    cpu.append(got[1][1] / max(got[0][1], 1e-9))
        wall += mine
        per_round.append(statistics.median(mine))
    return {"wall": ci(wall), "cpu": ci(cpu), "rounds": (min(per_round), max(per_round)), "n": len(wall),
            "identical": identical, "hooks_left": left}


def tiny_cycle(task: Callable[[], Any], cycles: int, root: str, warmup: int = 4) -> dict[str, Any]:
    """The tiny step's fixed cost, cycle by cycle (module docstring); microseconds."""
    a, b = task(), task()
    path = os.path.join(root, "tiny-cycle")
    shutil.rmtree(path, ignore_errors=True)
    n = 4 * (warmup + cycles)
    out: dict[str, list[float]] = {k: [] for k in ("fixed", "fixed_cpu", "vs_idle", "vs_idle_cpu", "idle",
                                                   "idle_cpu")}
    identical = True
    proc0 = thread0 = 0.0
    with opscope.dump(path, level="aten", steps=[s for s in range(n + 1) if s % 4 < 2]) as d:
        for c in range(warmup + cycles):
            if c == warmup:
                proc0, thread0 = time.process_time(), time.thread_time()
            t = [_timed(*a, 4 * c + k, d) for k in range(3)]  # A0 A1 A2
            u = [_timed(*b, 4 * c + k) for k in range(4)]  # B0..B3, bare, while A's step 4c+3 is not selected
            t.append(_timed(*a, 4 * c + 3, d))  # A3
            identical = identical and all(_same(x[2], y[2]) for x, y in zip(t, u))
            if c >= warmup:
                for k, clock in ((0, ""), (1, "_cpu")):
                    out["fixed" + clock].append((t[0][k] - u[1][k]) * 1e6)
                    out["vs_idle" + clock].append((t[0][k] - t[2][k]) * 1e6)
                    out["idle" + clock].append((t[2][k] - u[2][k]) * 1e6)
        # the dump's other threads (the writer): the process's CPU less the training thread's
        others = (time.process_time() - proc0) - (time.thread_time() - thread0)
    return {**{k: ci(v) for k, v in out.items()}, "n": cycles, "identical": identical,
            "others_us": others / (2 * cycles) * 1e6}
