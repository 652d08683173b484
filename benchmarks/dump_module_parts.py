"""Where a module-level statistics dump's extra time goes: the training thread's CPU time per
dumped step inside each group of hooks (module entry, module exit, optimizer before and after
its step, the step boundary), of which the statistics kernel's own (the native dump's kernel
clock), the bytes the kernel read, and the whole step's CPU against a bare step, in one process
(docs/dump-performance.md, "Session 13: the module level").

The step is ``demo.models.train_step``'s, each phase timed (forward with the loss, backward,
optimizer step with ``zero_grad``, the dump's step boundary). Bare and dumped runs alternate
round by round (the order too); each hook group is timed by a wrapper (~0.5 us a call: read
differences between trees, not sums).
To compare two trees, run each tree's copy of this script in turn (``git worktree`` for the
old one), process after process.

    python benchmarks/dump_module_parts.py transformer [--rounds 6] [--steps 20]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from timing import native_dump  # this script's folder is on sys.path

import opscope
from opscope.capture.torch import modules, optimizer_hooks, session
from opscope.demo.models import mlp_task, transformer_task

TASKS = {"transformer": transformer_task, "mlp": lambda: mlp_task(batch=256, d_in=512, hidden=512, depth=3)}
GROUPS = [(modules.ModuleTracker, "_pre", "module entry (tracker, level, record_module)"),
          (modules.ModuleTracker, "_post", "module exit (outputs, gradient hooks placed)"),
          (optimizer_hooks.OptimizerHooks, "pre", "optimizer before its step"),
          (optimizer_hooks.OptimizerHooks, "post", "optimizer after its step"),
          (session.DumpSession, "step", "step boundary (d.step)")]
_NS: collections.Counter = collections.Counter()  # thread CPU ns per group since the last clear
_KERNEL: collections.Counter = collections.Counter()  # of which the statistics kernel's (its clock), ns
_NATIVE: list[Any] = []  # the native dump module, whose kernel clock _kernel_ns reads


def _kernel_ns() -> int:
    return int(_NATIVE[0].kernel_seconds() * 1e9) if _NATIVE else 0


def _timed(cls: type, name: str, group: str) -> None:
    f: Callable[..., Any] = getattr(cls, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        c0, k0 = time.thread_time_ns(), _kernel_ns()
        try:
            return f(*args, **kwargs)
        finally:
            _NS[group] += time.thread_time_ns() - c0
            _KERNEL[group] += _kernel_ns() - k0

    setattr(cls, name, timed)


PHASES = ("forward", "backward", "optimizer", "boundary")


def _train_step(model: Any, opt: Any, inputs: torch.Tensor, targets: torch.Tensor, d: Any) -> None:
    """``demo.models.train_step``'s ops, each phase's thread CPU counted in ``_NS``."""
    c0, k0 = time.thread_time_ns(), _kernel_ns()
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    c1, k1 = time.thread_time_ns(), _kernel_ns()
    loss.backward()
    c2, k2 = time.thread_time_ns(), _kernel_ns()
    opt.step()
    opt.zero_grad()
    float(loss.detach())
    c3, k3 = time.thread_time_ns(), _kernel_ns()
    if d is not None:
        d.step()
    c4, k4 = time.thread_time_ns(), _kernel_ns()
    for phase, ns, kns in zip(PHASES, (c1 - c0, c2 - c1, c3 - c2, c4 - c3), (k1 - k0, k2 - k1, k3 - k2, k4 - k3),
                              strict=True):
        _NS[phase] += ns
        _KERNEL[phase] += kns


def _run(task: Callable[[], Any], steps: int, root: str | None, native: Any) -> dict[str, float]:
    """Per-step CPU seconds of ``steps`` steps (the first two not counted) by phase and hook
    group, and the bytes the kernel read, dumped when ``root``."""
    model, opt, batch = task()
    shutil.rmtree(root or "", ignore_errors=True)
    with opscope.dump(root, level="module") if root else contextlib.nullcontext() as d:
        for i in range(steps):
            if i == 2:
                _NS.clear(), _KERNEL.clear()
                c0, b0 = time.thread_time(), native.read_bytes() if native else 0
                if native and root:
                    native.kernel_clock(True)
            _train_step(model, opt, *batch(i), d)
        if native:
            native.kernel_clock(False)
        out = {g: ns / 1e9 / (steps - 2) for g, ns in _NS.items()}
        out |= {f"{g} kernel": ns / 1e9 / (steps - 2) for g, ns in _KERNEL.items()}
        out["step"] = (time.thread_time() - c0) / (steps - 2)
        out["MB"] = ((native.read_bytes() - b0) / 1e6 if native else 0.0) / (steps - 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(TASKS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for cls, name, group in GROUPS:
        _timed(cls, name, group)
    native = native_dump()
    _NATIVE[:] = [native] if native is not None else []
    got: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as tmp:
        for r in range(args.rounds):
            for dumped in ((False, True) if r % 2 == 0 else (True, False)):
                run = _run(TASKS[args.model], args.steps, os.path.join(tmp, "d") if dumped else None, native)
                for key, value in run.items():
                    got[("dumped " if dumped else "bare ") + key].append(value)
    med = {key: statistics.median(values) for key, values in got.items()}
    bare, dumped = med["bare step"], med["dumped step"]
    print(f"{args.model}, load {os.getloadavg()[0]:.1f}: bare {bare * 1e3:.2f} ms, dumped {dumped * 1e3:.2f} ms "
          f"a step ({dumped / bare:.3f}x, training thread's CPU), {med['dumped MB']:.1f} MB read by the kernel")
    for phase in PHASES:
        print(f"  {phase:48s} {med[f'bare {phase}'] * 1e6:6.0f} us bare, {med[f'dumped {phase}'] * 1e6:6.0f} us dumped"
              f" (the kernel {med.get(f'dumped {phase} kernel', 0.0) * 1e6:.0f})")
    for _, _, group in GROUPS:
        values = got[f"dumped {group}"]
        print(f"  {group:48s} {statistics.median(values) * 1e6:6.0f} us  "
              f"({min(values) * 1e6:.0f}..{max(values) * 1e6:.0f} over the rounds; the statistics kernel "
              f"{med.get(f'dumped {group} kernel', 0.0) * 1e6:.0f})")


if __name__ == "__main__":
    main()
