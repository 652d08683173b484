"""The CPU time of opscope's module and optimizer hooks per dumped step, with and without the
native walks of issue 18's fourth round, in one process (docs/dump-performance.md, "Python per module call
and per optimizer step").

``old`` makes ``record_module`` answer None and hides ``NativeRecorder.record_selected``, so the
hooks take the Python walks those replaced; ``new`` is the tree as it is; bare rounds run
between them. Each round runs the three in a rotating order after one warm-up of each; printed:
the dumped step's training-thread CPU over the bare one's, and the CPU inside the hooks (each
timed by a wrapper that adds a few microseconds a call to both sides).

    python benchmarks/bench_dump_hooks.py transformer module [--rounds 6] [--steps 12]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch

import opscope
from opscope.capture.torch import modules, optimizer_hooks
from opscope.capture.torch.native import aten, build
from opscope.demo.models import mlp_task, train_step, transformer_task

TASKS = {"transformer": transformer_task, "mlp": lambda: mlp_task(batch=256, d_in=512, hidden=512, depth=3)}
_HOOK = [0.0]  # CPU seconds inside the hooks since the last reset


def _timed(cls: type, name: str) -> None:
    f = getattr(cls, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            _HOOK[0] += time.thread_time() - c0
    setattr(cls, name, timed)


def _run(cfg: str, task: Any, level: str, steps: int, root: str) -> tuple[list[float], float]:
    """Training-thread CPU per step (2 warm-up steps left out) and CPU in the hooks per step."""
    backend = build.load("_opscope_dump")
    real_module, real_selected = backend.record_module, aten.NativeRecorder.record_selected
    if cfg == "old":
        backend.record_module = lambda *args: None
        del aten.NativeRecorder.record_selected
    model, opt, batch = task()
    cpu: list[float] = []
    try:
        if cfg == "bare":
            for i in range(steps):
                c0 = time.thread_time()
                train_step(model, opt, *batch(i))
                cpu.append(time.thread_time() - c0)
        else:
            shutil.rmtree(root, ignore_errors=True)
            with opscope.dump(root, level=level) as d:
                for i in range(steps):
                    if i == 2:
                        _HOOK[0] = 0.0
                    c0 = time.thread_time()
                    train_step(model, opt, *batch(i))
                    d.step()
                    cpu.append(time.thread_time() - c0)
    finally:
        backend.record_module = real_module
        aten.NativeRecorder.record_selected = real_selected
    return cpu[2:], _HOOK[0] / (steps - 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("level", choices=["aten", "module"])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    for cls, name in ((modules.ModuleTracker, "_pre"), (modules.ModuleTracker, "_post"),
                      (optimizer_hooks.OptimizerHooks, "pre"), (optimizer_hooks.OptimizerHooks, "post")):
        _timed(cls, name)
    task, order = TASKS[args.task], ["bare", "old", "new"]
    cpu: dict[str, list[float]] = {c: [] for c in order}
    hooks: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for cfg in order:  # warm-up: the process's first dump pays imports and set-up
            _run(cfg, task, args.level, args.steps, tmp + "/dump")
        for r in range(args.rounds):
            for cfg in order[r % 3:] + order[:r % 3]:
                steps, in_hooks = _run(cfg, task, args.level, args.steps, tmp + "/dump")
                cpu[cfg] += steps
                if cfg != "bare":
                    hooks[cfg].append(in_hooks)
    bare = statistics.median(cpu["bare"])
    print(f"{args.task} {args.level}: bare {bare * 1e3:.2f} ms of CPU a step, {args.rounds} rounds")
    for cfg in ("old", "new"):
        print(f"  {cfg}: {statistics.median(cpu[cfg]) / bare:.3f}x, in the hooks "
              f"{statistics.median(hooks[cfg]) * 1e6:.0f} us a step")
    saved = [o - n for o, n in zip(hooks["old"], hooks["new"], strict=True)]
    print(f"  old - new in the hooks, per round: median {statistics.median(saved) * 1e6:.0f} us, "
          f"range {min(saved) * 1e6:.0f}..{max(saved) * 1e6:.0f}")


if __name__ == "__main__":
    main()
