"""Monitor overhead against the bare training loop, in one invocation, one thread.

Prints, for the reference transformer step (2 layers, d=128, 4 heads, seq 64, batch 8,
AdamW; benchmarks/bench_dump.py), the ratio of a monitored step to the bare step for
weight gradients every step (target <= 1.01x), plus the optimizer state (<= 1.03x), plus
the activations and their gradients of every block (<= 1.10x); runs interleaved (bare then
monitored, monitored then bare, ...) and the median of each taken, once in wall time and
once in the training thread's CPU time (``time.thread_time``: everything the monitor does
runs on that thread), and from the inside: the time spent in the monitor's own hooks per
step over the monitored step (the least noisy of the three on a busy machine). Then what the statistics
of the gradients cost per step with each engine (the native one-pass kernel and batched
torch ops), and the monitor's memory beyond the model: the rows it holds between chunks
and the detector's windows (traced with tracemalloc), against the parameters' size.

    python benchmarks/bench_monitor.py [--steps 30] [--rounds 6]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import torch
from timing import interleaved_ratio

import opscope
from opscope.demo.models import train_step, transformer_task
from opscope.monitor import stats

CASES = [
    ("weight gradients, loss, lr (target <= 1.01x)", {"targets": ["grads", "loss", "lr"]}),
    ("+ optimizer state (target <= 1.03x)", {"targets": ["grads", "loss", "lr", "optimizer"]}),
    ("+ activations and their gradients of every block (target <= 1.10x)",
     {"targets": ["grads", "loss", "lr", "optimizer", "activations", "activation_grads"],
      "modules": ["layers.0", "layers.1"]}),
]


BARE: list[float] = []
CLOCK = time.perf_counter  # or time.thread_time: the training thread's CPU time, which a busy machine disturbs less


def _time_steps(n: int, keys: dict | None, root: str, each: Callable[[], None] | None = None) -> list[float]:
    model, opt, batch = transformer_task()
    times = []
    if keys is None:
        for i in range(n):
            t0 = CLOCK()
            train_step(model, opt, *batch(i))
            times.append(CLOCK() - t0)
        if CLOCK is time.perf_counter:
            BARE.extend(times[2:])
        return times
    path = os.path.join(root, "monitor")
    shutil.rmtree(path, ignore_errors=True)
    with opscope.monitor(path, model=model, optimizer=opt, report=False, **keys) as m:
        for i in range(n):
            t0 = CLOCK()
            loss = train_step(model, opt, *batch(i))
            m.step(loss=loss)
            times.append(CLOCK() - t0)
            if each is not None:
                each()
    return times


def self_time(n: int, root: str) -> None:
    """Time spent inside the monitor's own hooks per step, against the bare step: the same
    overhead measured from the inside, which the load of a busy machine inflates on both
    sides alike (both are wall times of the same thread)."""
    from opscope.monitor.session import MonitorSession

    names = ("_optimizer_pre", "_optimizer_post", "_boundary", "_root_call", "_output", "_activation_grad")
    originals = {name: getattr(MonitorSession, name) for name in names}
    spent = [0.0]  # CPU time of this thread in the hooks (a descheduled thread is not charged)

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.thread_time() - t0
        return wrapper

    for name, fn in originals.items():
        setattr(MonitorSession, name, timed(fn))
    try:
        _time_steps(12, CASES[-1][1], root)  # once: imports and first calls out of the way
        for label, keys in CASES:
            marks: list[float] = []
            spent[0] = 0.0
            steps = _time_steps(n, keys, root, lambda marks=marks: marks.append(spent[0]))
            inside = statistics.median(b - a for a, b in zip(marks[2:], marks[3:], strict=False))
            step = statistics.median(steps[3:])
            print(f"transformer  self {label:70s} {1 + inside / (step - inside):5.3f}x "
                  f"({inside * 1e3:.2f} ms of {step * 1e3:.1f} ms per step)")
    finally:
        for name, fn in originals.items():
            setattr(MonitorSession, name, fn)


def engines(repeat: int = 50) -> None:
    """Per-step cost of the gradients' statistics with each engine, on the reference model's gradients."""
    model, opt, batch = transformer_task()
    train_step(model, opt, *batch(0))
    grads = [torch.randn_like(p) for p in model.parameters()]
    for native in (True, False):
        stats.NATIVE = native
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            stats.Pending(grads).values()
            times.append(time.perf_counter() - t0)
        label = "native one-pass kernel" if native else "batched torch ops (_foreach_norm, _foreach_max(abs))"
        print(f"statistics of {len(grads)} gradients ({sum(g.numel() for g in grads)} values), {label}: "
              f"{statistics.median(times) * 1e3:.3f} ms per step")
    stats.NATIVE = True


def memory(n: int, root: str) -> None:
    model, opt, batch = transformer_task()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    keys = dict(CASES[-1][1])
    for i in range(3):  # warm: imports, the first step's allocations
        train_step(model, opt, *batch(i))
    path = os.path.join(root, "memory")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    with opscope.monitor(path, model=model, optimizer=opt, report=False, chunk=n + 1, **keys) as m:
        for i in range(n):
            m.step(loss=train_step(model, opt, *batch(i)))
        held = tracemalloc.get_traced_memory()[0] - base
        rows = sum(4 * len(k) for _, blocks, _ in m.writer.held for k, _ in blocks) if m.writer is not None else 0
        if m.writer is not None:
            m.writer.flush(wait=True)  # the rows go to Parquet; what stays is the monitor's own state
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"memory: {held / 2**10:.0f} KiB after {n} steps with {rows} rows in memory ({(held - kept) / n / 2**10:.1f} "
          f"KiB of rows per step, written every `chunk` steps); beyond the rows {kept / 2**10:.0f} KiB = "
          f"{kept / params:.2%} of the parameters' {params / 2**20:.2f} MiB (the detector's windows: "
          f"{len(m.detector.keys)} series x {m.cfg.window} steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved runs per side (even: both orders)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {args.steps} steps x {args.rounds} rounds, "
          f"order alternating; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as root:
        global CLOCK
        for clock, what in ((time.perf_counter, "wall"), (time.thread_time, "cpu ")):
            CLOCK = clock
            for label, keys in CASES:
                r = interleaved_ratio(lambda: _time_steps(args.steps, None, root),
                                      lambda keys=keys: _time_steps(args.steps, keys, root), args.rounds)
                print(f"transformer  {what} {label:70s} {r:5.3f}x")
        print(f"bare step: median {statistics.median(BARE) * 1e3:.1f} ms")
        CLOCK = time.thread_time
        self_time(args.steps, root)
        engines()
        memory(args.steps, root)


if __name__ == "__main__":
    main()
