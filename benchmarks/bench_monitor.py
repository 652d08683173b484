"""Monitor overhead against the bare training loop, in one invocation, one thread.

Prints, for the reference transformer step (2 layers, d=128, 4 heads, seq 64, batch 8,
AdamW; benchmarks/bench_dump.py), the ratio of a monitored step to the bare step for
weight gradients every step (target <= 1.01x), plus the optimizer state (<= 1.03x), plus
the activations and their gradients of every block (<= 1.10x), each with its target:

- by rounds of whole runs (bare then monitored, monitored then bare, ...), every step timed
  in wall time and in the training thread's CPU time; the ratio is the median monitored
  step over the median bare step of all rounds, beside the spread of the per-round ratios
  (+-15% even on a quiet machine: these rows cannot resolve 1%);
- interleaved at the step level (:func:`interleaved`): two identical models, one bare and
  one monitored, stepping in turn, so that what loads the machine hits both alike; the
  median of the per-pair ratios with its 95% confidence interval, in wall time and in the
  training thread's CPU time, the monitor's other threads' CPU per step, and a check that
  the two models' losses are bit-identical. The verdict of each target is read here (wall).

Then where the monitor's time goes per step (its hooks on the training thread, the judge
thread, the Parquet writer), what the gradients' statistics cost with each engine, what the
detector's step costs natively and in numpy, and the
memory the monitor holds beyond the rows it has not written yet (less what as many bare
steps leave held): per series and as a share of the parameters' size, for each case,
against the 1% target. The last lines repeat the three target rows with their verdicts.

    python benchmarks/bench_monitor.py [--steps 30] [--rounds 6] [--pairs 200]
    (300-500 s under a load of 5-6 on the shared 2-core machine; ~2 minutes expected idle)
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import struct
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import opscope
from opscope.demo.models import train_step, transformer_task
from opscope.monitor import stats

CASES = [
    ("weight gradients, loss, lr", 1.01, {"targets": ["grads", "loss", "lr"]}),
    ("+ optimizer state", 1.03, {"targets": ["grads", "loss", "lr", "optimizer"]}),
    ("+ activations and their gradients of every block", 1.10,
     {"targets": ["grads", "loss", "lr", "optimizer", "activations", "activation_grads"],
      "modules": ["layers.0", "layers.1"]}),
]
Times = tuple[list[float], list[float]]  # wall, CPU time of each step


def _run(n: int, keys: dict | None, root: str, each: Callable[[], None] | None = None) -> Times:
    """``n`` steps of a fresh model, bare (``keys`` None) or monitored; each step's times."""
    model, opt, batch = transformer_task()
    wall: list[float] = []
    cpu: list[float] = []
    m = None
    if keys is not None:
        path = os.path.join(root, "monitor")
        shutil.rmtree(path, ignore_errors=True)
        m = opscope.monitor(path, model=model, optimizer=opt, report=False, **keys).start()
    try:
        for i in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            loss = train_step(model, opt, *batch(i))
            if m is not None:
                m.step(loss=loss)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
            if each is not None:
                each()
    finally:
        if m is not None:
            m.stop()
    return wall, cpu


def ratios(keys: dict, steps: int, rounds: int, root: str, warmup: int = 3) -> dict[str, tuple[float, float, float]]:
    """Per clock: (median monitored / median bare over all rounds, lowest and highest round)."""
    bare: Times = ([], [])
    case: Times = ([], [])
    per_round: list[tuple[float, float]] = []
    for r in range(rounds):
        order = (None, keys) if r % 2 == 0 else (keys, None)
        got = {id(k): _run(steps, k, root) for k in order}
        b, c = got[id(None)], got[id(keys)]
        for side, run in ((bare, b), (case, c)):
            side[0].extend(run[0][warmup:])
            side[1].extend(run[1][warmup:])
        per_round.append(tuple(statistics.median(c[k][warmup:]) / statistics.median(b[k][warmup:])  # type: ignore[misc]
                               for k in (0, 1)))
    out = {}
    for k, clock in enumerate(("wall", "cpu")):
        each = [p[k] for p in per_round]
        out[clock] = (statistics.median(case[k]) / statistics.median(bare[k]), min(each), max(each))
    out["bare_ms"] = (statistics.median(bare[0]) * 1e3, statistics.median(bare[1]) * 1e3, 0.0)
    return out


def _ci(values: list[float]) -> tuple[float, float, float]:
    """Median of ``values`` and its 95% confidence interval (order statistics, no assumption
    on the distribution)."""
    s = sorted(values)
    n = len(s)
    k = max(0, int((n - 1.96 * n**0.5) / 2))
    return statistics.median(s), s[k], s[n - 1 - k]


def interleaved(keys: dict, pairs: int, root: str, warmup: int = 6) -> dict[str, Any]:
    """Two identical models (same seed, same batches), one bare and one monitored, stepping in
    turn (the order flips every pair): what loads the machine hits both alike, and each pair
    gives one ratio, monitored step over bare step, in wall time and in the training
    thread's CPU time. The monitor's other threads (judge, writer, kernel) are the process's
    CPU time less the training thread's: charged to the monitored side in ``all_cpu``. The
    two models' losses must be bit-identical at every step (the monitor changes nothing)."""
    sides = [transformer_task(), transformer_task()]
    path = os.path.join(root, "interleaved")
    shutil.rmtree(path, ignore_errors=True)
    m = opscope.monitor(path, model=sides[1][0], optimizer=sides[1][1], report=False, **keys).start()
    wall: list[float] = []
    cpu: list[float] = []
    spent = [0.0, 0.0]  # training thread's CPU time, bare and monitored, over the measured pairs
    identical = True
    try:
        proc0 = time.process_time()
        for i in range(warmup + pairs):
            if i == warmup:
                proc0, spent = time.process_time(), [0.0, 0.0]
            got: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * 2
            for side in (0, 1) if i % 2 == 0 else (1, 0):
                model, opt, batch = sides[side]
                t0, c0 = time.perf_counter(), time.thread_time()
                loss = train_step(model, opt, *batch(i))
                if side:
                    m.step(loss=loss)
                got[side] = (time.perf_counter() - t0, time.thread_time() - c0, loss)
            identical = identical and struct.pack("d", got[0][2]) == struct.pack("d", got[1][2])
            spent = [spent[0] + got[0][1], spent[1] + got[1][1]]
            if i >= warmup:
                wall.append(got[1][0] / got[0][0])
                cpu.append(got[1][1] / max(got[0][1], 1e-9))
        others = time.process_time() - proc0 - sum(spent)
    finally:
        m.stop()
    return {"wall": _ci(wall), "cpu": _ci(cpu), "all_cpu": (spent[1] + others) / spent[0],
            "others_ms": others / pairs * 1e3, "bare_cpu_ms": spent[0] / (warmup + pairs) * 1e3,
            "identical": identical}


def where_time_goes(steps: int, root: str) -> None:
    """CPU time per step in the monitor's hooks (training thread), in the judge thread
    (detector and rows) and in the Parquet writer's thread, against the bare step's CPU
    time; the hooks' sum as a ratio (what the monitor adds to the training thread)."""
    from opscope.monitor import judge, series
    from opscope.monitor.session import MonitorSession

    spent: dict[str, float] = {}
    patched: list[tuple[Any, str, Any]] = []

    def timed(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.thread_time() - t0
        patched.append((owner, name, fn))
        setattr(owner, name, wrapper)

    hooks = {"_optimizer_pre": "optimizer pre-hook (gradients handed to the kernel, lr)",
             "_optimizer_post": "optimizer post-hook (gradients read back; state, weights)",
             "_boundary": "step end (rows handed over)", "_root_call": "model call (inputs)",
             "_output": "module outputs (activations)", "_activation_grad": "activations' gradients"}
    for name, label in hooks.items():
        timed(MonitorSession, name, label)
    timed(judge.Judge, "judge", "judge thread: detector, rows kept (off the training thread)")
    timed(series.SeriesWriter, "_write", "writer thread: Parquet chunks (off the training thread)")
    try:
        _run(8, CASES[-1][2], root)  # imports and first calls out of the way
        bare = statistics.median(_run(steps, None, root)[1][3:])
        print(f"  bare step: {bare * 1e3:.1f} ms of CPU time")
        for label, target, keys in CASES:
            spent.clear()
            _run(steps, keys, root)
            print(f"  {label}: CPU time per step, and against the bare step's:")
            for what, total in spent.items():
                per = total / steps
                print(f"    {what:72s} {per * 1e3:7.3f} ms  {per / bare:6.2%}")
            hooks_cpu = sum(v for k, v in spent.items() if "thread:" not in k) / steps
            print(f"    training thread: 1 + {hooks_cpu * 1e3:.3f} / {bare * 1e3:.1f} ms = {1 + hooks_cpu / bare:.3f}x "
                  f"(target <= {target:.2f}x)")
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)


def engines(repeat: int = 200) -> None:
    """Per-step cost of the gradients' statistics with each engine, on the reference model's gradients."""
    model, opt, batch = transformer_task()
    train_step(model, opt, *batch(0))
    grads = [torch.randn_like(p) for p in model.parameters()]
    choices = [("batched native kernel, one call (monitor/_c/monstats.c)", True, True, False),
               ("batched native kernel on its thread: the training thread's part", True, True, True),
               ("the dump's native kernel, one call per tensor", True, False, False),
               ("batched torch ops (_foreach_norm, _foreach_max(abs))", False, False, False)]
    saved = stats.NATIVE, stats.BATCHED
    try:
        for label, native, batched, background in choices:
            if batched and not saved[1]:
                print(f"  {label}: not built here")
                continue
            stats.NATIVE, stats.BATCHED = native, batched
            times = []
            for _ in range(repeat):
                t0 = time.thread_time()
                pending = stats.Pending(grads, background=background)
                if background:
                    times.append(time.thread_time() - t0)
                    pending.values()
                else:
                    pending.values()
                    times.append(time.thread_time() - t0)
            print(f"  {label:66s} {statistics.median(times) * 1e3:.3f} ms per step")
    finally:
        stats.NATIVE, stats.BATCHED = saved
    print(f"  ({len(grads)} gradients, {sum(g.numel() for g in grads)} values)")


def detector_paths(steps: int = 300, rounds: int = 3) -> None:
    """The detector's step (``BandDetector.update``) per path on the optimizer-state case's 92
    series (30 gradients, 30 ``exp_avg``, 30 ``exp_avg_sq``, loss, lr; log-normal noise, no
    departure), the paths alternating: CPU time of the calling thread, median of the rounds."""
    from opscope.monitor.detect import BandDetector
    from opscope.monitor.registry import SeriesTable

    rng = np.random.default_rng(0)
    keys = [(k, f"p{i}") for k in ("grad", "exp_avg", "exp_avg_sq") for i in range(30)] + [("loss", ""), ("lr", "")]
    values = 10.0 ** rng.uniform(-6, 1, len(keys)) * np.exp(rng.normal(0, 0.2, (steps, len(keys))))
    values[:, -2:] = 3.0, 1e-3
    paths = [("native (monitor/_c/band.c)", True), ("numpy (without a C compiler)", False)]
    spent: dict[str, list[float]] = {label: [] for label, _ in paths}
    for r in range(rounds):
        for label, native in paths if r % 2 == 0 else paths[::-1]:
            if native and not BandDetector.native:
                continue
            det = BandDetector(32, 8.0, 8, SeriesTable())
            det.native = native
            ids = np.array([det.series.id(*k) for k in keys])
            t0 = time.thread_time()
            for i in range(steps):
                det.update(i, 0, ids, values[i], np.zeros(len(keys)))
            spent[label].append((time.thread_time() - t0) / steps)
    for label, times in spent.items():
        print(f"  {label:66s} " + (f"{statistics.median(times) * 1e6:.0f} us per step" if times else "not built here"))


def _untorched() -> int:
    """Bytes traced now, less torch's own allocations inside an operator's call (innermost frame
    ``torch/_ops.py``: the profiler's record_function in ``optimizer.step`` and ``zero_grad``
    holds 0.2-2 KiB run to run, with or without a monitor, which calls no torch operator) and
    tracemalloc's own."""
    drop = [tracemalloc.Filter(False, "*/torch/_ops.py"), tracemalloc.Filter(False, tracemalloc.__file__)]
    return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(drop).traces)


def _traced(step: Callable[[int], None], n: int, end: Callable[[], None] | None = None) -> tuple[int, int, int]:
    """Bytes traced (Python's and numpy's allocations) still held after ``n`` calls of
    ``step``: (right after them, after ``end()`` and a collection, the same without torch's
    operator-call allocations: :func:`_untorched`)."""
    gc.collect()
    tracemalloc.start()
    base, base_untorched = tracemalloc.get_traced_memory()[0], _untorched()
    try:
        for i in range(n):
            step(i)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
        if end is not None:
            end()
        gc.collect()
        return held, tracemalloc.get_traced_memory()[0] - base, _untorched() - base_untorched
    finally:
        tracemalloc.stop()


def memory(n: int, root: str) -> None:
    """What the monitor holds beyond the rows it has not written, against the parameters'
    size: bytes traced by tracemalloc (Python's and numpy's allocations; the batched kernel
    allocates nothing but its thread, and holds the tensors it reads only until they are
    read back) still held after ``n`` monitored steps once the rows are written, less what
    ``n`` bare steps leave held measured the same way (torch's own caches)."""
    model, opt, batch = transformer_task()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    for i in range(3):  # warm: imports, the first step's allocations
        train_step(model, opt, *batch(i))
    for w in range(2):  # and the monitor's first-use allocations (imports, caches of the modules it imports)
        with opscope.monitor(os.path.join(root, f"warm{w}"), model=model, optimizer=opt, report=False,
                             **CASES[-1][2]) as m:
            for i in range(3):
                m.step(loss=train_step(model, opt, *batch(i)))
    _, bare, bare_untorched = _traced(lambda i: train_step(model, opt, *batch(i)), n)
    print(f"  bare run: {bare} B held after {n} steps (torch's own; taken off each figure below), "
          f"{bare_untorched} B without torch's operator-call allocations")
    for label, _, keys in CASES:
        path = os.path.join(root, "memory")
        shutil.rmtree(path, ignore_errors=True)
        m = opscope.monitor(path, model=model, optimizer=opt, report=False, chunk=n + 1, **keys)

        def end(m: Any = m) -> None:
            m._settle()  # the last step's optimizer state (taken on the kernel's thread): the step handed over
            m.judge.close()  # the steps handed over are judged; the rows sit in the writer's memory
            m.judge = None
            m.writer.flush(wait=True)  # the rows go to Parquet; what stays is the monitor's own state

        def step(i: int, m: Any = m) -> None:
            if i == 0:
                m.start()
            m.step(loss=train_step(model, opt, *batch(i)))
        held, kept, untorched = _traced(step, n, end)
        series_n = len(m.series)
        m.stop()
        kept -= bare
        untorched -= bare_untorched
        print(f"  {label}: {series_n} series; rows in memory until written {(held - kept - bare) / n / 2**10:.1f} KiB "
              f"per step; beyond them {kept / 2**10:.1f} KiB = {kept / max(series_n, 1):.0f} B per series = "
              f"{kept / params:.2%} of the parameters' {params / 2**20:.2f} MiB (target <= 1%: "
              f"{'met' if kept <= 0.01 * params else 'NOT met'}; met for models whose tensors average "
              f"over {kept / max(series_n, 1) * 100 / 2**10:.0f} KiB); without torch's operator-call allocations "
              f"(both runs) {untorched / 2**10:.1f} KiB = {untorched / params:.2%}")


def _pair_rows(pairs: int, root: str) -> list[str]:
    """The interleaved measurement of each case, one row each with its verdict (on the wall
    median of the per-pair ratios)."""
    print(f"interleaved at the step level: two identical models, one bare, one monitored, stepping in turn "
          f"(order flipped every pair); median of the {pairs} per-pair ratios (95% CI):")
    verdicts = []
    for label, target, keys in CASES:
        r = interleaved(keys, pairs, root)
        wall, cpu = r["wall"], r["cpu"]
        bound = wall[0] + r["others_ms"] / r["bare_cpu_ms"]
        verdict = "met" if wall[0] <= target else "NOT met"
        verdict += " (resolved)" if wall[1] > target or wall[2] <= target else " (its CI straddles the target)"
        row = (f"transformer  {label:50s} target <= {target:.2f}x  pairs wall {wall[0]:.3f}x "
               f"(CI {wall[1]:.3f}-{wall[2]:.3f})  thread cpu {cpu[0]:.3f}x (CI {cpu[1]:.3f}-{cpu[2]:.3f})  "
               f"{verdict} in wall time")
        print(f"{row}; all threads' cpu {r['all_cpu']:.3f}x (judge, writer, kernel threads {r['others_ms']:.3f} ms "
              f"a step: at most {bound:.3f}x if each stalled the training thread); losses "
              f"{'bit-identical' if r['identical'] else 'DIFFER'}; bare step {r['bare_cpu_ms']:.1f} ms cpu")
        verdicts.append(row)
    return verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6, help="alternating runs per side (even: both orders)")
    parser.add_argument("--pairs", type=int, default=200, help="interleaved step pairs per case")
    args = parser.parse_args()
    torch.set_num_threads(1)
    began = time.perf_counter()
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {args.steps} steps x {args.rounds} rounds, "
          f"order alternating; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"batched kernel {'built' if stats.BATCHED else 'NOT built'}")
    with tempfile.TemporaryDirectory() as root:
        _run(8, CASES[-1][2], root)  # imports and first calls out of the way
        for label, target, keys in CASES:
            r = ratios(keys, args.steps, args.rounds, root)
            verdict = "met" if r["cpu"][0] <= target else "NOT met"
            print(f"transformer  {label:50s} target <= {target:.2f}x  wall {r['wall'][0]:.3f}x "
                  f"(rounds {r['wall'][1]:.3f}-{r['wall'][2]:.3f})  cpu {r['cpu'][0]:.3f}x "
                  f"(rounds {r['cpu'][1]:.3f}-{r['cpu'][2]:.3f})  {verdict} in CPU time; "
                  f"bare step {r['bare_ms'][0]:.1f} ms wall, {r['bare_ms'][1]:.1f} ms cpu")
        verdicts = _pair_rows(args.pairs, root)
        print("where the time goes (CPU time of each thread, per step):")
        where_time_goes(args.steps, root)
        print("the gradients' statistics, per step, by engine (CPU time of the calling thread):")
        engines()
        print("the detector's step on 92 series, per path (CPU time of the judge's thread):")
        detector_paths()
        print(f"memory after {args.steps} steps:")
        memory(args.steps, root)
    print(f"load average at the end {os.getloadavg()[0]:.1f}; {time.perf_counter() - began:.0f} s")
    print("targets (interleaved pairs, wall):")
    for row in verdicts:
        print(row)

if __name__ == "__main__":
    main()
