"""Overflow-watch overhead against the bare training loop, in one invocation, one thread.

Prints, for a 2-layer transformer step (d=128, 4 heads, seq 64, batch 8, AdamW) and a
small MLP (batch 256, 512 wide, 3 layers: the dump benchmark's), the ratio of a step with
``opscope.watch`` on to the bare step: at aten level
(every dispatcher op's outputs, target <= 1.2x on the transformer), at module level
(module outputs, gradients and parameters, target <= 1.05x), for steps not selected, and
for the flight recorder (``action="record"``, which also keeps a statistics dump of the
last steps in memory). Also an empty TorchDispatchMode, the floor of any aten-level
mechanism written in Python, and ``torch.autograd.detect_anomaly`` for comparison.
Runs are interleaved, the order alternating each round (bare then watched, watched then
bare), and the median of each is taken.

    python benchmarks/bench_watch.py [--steps 30] [--rounds 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time

import torch
from bench_dump import TASKS  # the same two models as the dump benchmark
from timing import interleaved_ratio
from torch.utils._python_dispatch import TorchDispatchMode

import opscope
from opscope.demo.models import train_step, transformer_task


class _EmptyMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return func(*args, **(kwargs or {}))


def _time_steps(task, n: int, keys: dict | None, root: str) -> list[float]:
    model, opt, batch = task()
    times = []
    if keys is None:
        for i in range(n):
            t0 = time.perf_counter()
            train_step(model, opt, *batch(i))
            times.append(time.perf_counter() - t0)
        return times
    if "special" in keys:
        ctx = _EmptyMode() if keys["special"] == "empty" else torch.autograd.detect_anomaly(check_nan=True)
        with ctx:
            for i in range(n):
                t0 = time.perf_counter()
                train_step(model, opt, *batch(i))
                times.append(time.perf_counter() - t0)
        return times
    path = os.path.join(root, "flight")
    shutil.rmtree(path, ignore_errors=True)
    keys = dict(keys)
    os.environ["OPSCOPE_WATCH_BACKEND"] = keys.pop("backend", "native")
    with opscope.watch(path=path, **keys) as w:
        for i in range(n):
            t0 = time.perf_counter()
            train_step(model, opt, *batch(i))
            w.step()
            times.append(time.perf_counter() - t0)
    return times


def ratio(task, n: int, keys: dict, root: str, rounds: int) -> float:
    return interleaved_ratio(lambda: _time_steps(task, n, None, root), lambda: _time_steps(task, n, keys, root), rounds)


CASES = [
    ("empty TorchDispatchMode (floor of any aten-level check)", {"special": "empty"}),
    ("watch, aten level (target <= 1.2x transformer)", {"level": "aten", "action": "raise"}),
    ("watch, aten level, Python dispatch mode (no C++ compiler)", {"level": "aten", "action": "raise",
                                                                  "backend": "python"}),
    ("watch, module level (target <= 1.05x)", {"level": "module", "action": "raise"}),
    ("watch, steps not selected", {"level": "aten", "action": "raise", "steps": "100000"}),
    ("flight recorder, module level (record, history 4)", {"level": "module", "action": "record"}),
    ("flight recorder, aten level (record, history 4)", {"level": "aten", "action": "record"}),
    ("torch.autograd.detect_anomaly(check_nan=True)", {"special": "anomaly"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--models", default="transformer,mlp", help="comma-separated: transformer, mlp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {args.steps} steps x {args.rounds} rounds, "
          "order alternating")
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as root:
        tasks = {"transformer": transformer_task, "mlp": TASKS["mlp"]}
        for name in args.models.split(","):
            task = tasks[name]
            for label, keys in CASES:
                with contextlib.redirect_stderr(open(os.devnull, "w")):  # noqa: SIM115 (anomaly mode warns)
                    r = ratio(task, args.steps, keys, root, args.rounds)
                print(f"{name:12s} {label:58s} {r:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
