"""Dump overhead against the bare training loop, in one invocation, one thread.

Prints, for a 2-layer transformer step (d=128, 4 heads, seq 64, batch 8, AdamW) and a
small MLP: the ratio of a step with dumping on to the bare step, for statistics at aten,
api and module level, for steps not selected, and for full-tensor mode (with the write
throughput next to the disk's own, measured in the same run). Runs are interleaved
(bare then dump, dump then bare, ...: the order alternates) and the median of each is
taken, so machine noise affects both sides alike. When mindstudio-probe is installed it is run on the same steps too.

    python benchmarks/bench_dump.py [--steps 30] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import warnings

import torch
from timing import interleaved_ratio

import opscope
from opscope.demo.models import mlp_task, train_step, transformer_task

# The reference shapes: a 2-layer transformer step (~20 ms bare here) and a small
# MLP (~6 ms bare here).
TASKS = {
    "transformer": transformer_task,
    "mlp": lambda: mlp_task(batch=256, d_in=512, hidden=512, depth=3),
}


def _time_steps(task, n: int, dump_keys: dict | None, root: str) -> list[float]:
    model, opt, batch = task()
    times = []
    if dump_keys is None:
        for i in range(n):
            t0 = time.perf_counter()
            train_step(model, opt, *batch(i))
            times.append(time.perf_counter() - t0)
        return times
    path = os.path.join(root, "dump")
    shutil.rmtree(path, ignore_errors=True)
    with opscope.dump(path, **dump_keys) as d:
        for i in range(n):
            t0 = time.perf_counter()
            train_step(model, opt, *batch(i))
            d.step()
            times.append(time.perf_counter() - t0)
    return times


def disk_throughput(root: str, mb: int = 256) -> float:
    """MB/s of a plain sequential write of ``mb`` MB with fsync, in the dump's directory."""
    buf = os.urandom(1 << 20)
    path = os.path.join(root, "disk-probe")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(buf)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.remove(path)
    return mb / dt


def ratio(task, n: int, keys: dict, root: str, rounds: int) -> float:
    return interleaved_ratio(lambda: _time_steps(task, n, None, root), lambda: _time_steps(task, n, keys, root), rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved runs per side (even: both orders)")
    parser.add_argument("--no-peers", action="store_true", help="skip msprobe even when it is installed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # tensor dumps from step 0 say once that their size is measured while written: not news here
    warnings.filterwarnings("ignore", message=r"opscope dump: the size of the full tensors")
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {args.steps} steps x {args.rounds} rounds, "
          "order alternating")
    cases = [
        ("statistics, aten level (target <= 1.5x transformer, 2x MLP)", {"level": "aten"}),
        ("statistics, api level", {"level": "api"}),
        ("statistics, module level (target <= 1.15x)", {"level": "module"}),
        ("steps not selected (target <= 1.03x)", {"level": "aten", "steps": "1000"}),
        ("full tensors, aten level (target <= 3x)", {"level": "aten", "data": "tensor"}),
    ]
    ours: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as root:
        for name, task in TASKS.items():
            for label, keys in cases:
                r = ours[(name, label)] = ratio(task, args.steps, keys, root, args.rounds)
                print(f"{name:12s} {label:58s} {r:5.2f}x")
        _tensor_throughput(root, args.steps)
        if not args.no_peers:
            _msprobe(root, args.steps, ours)


def _tensor_throughput(root: str, n: int) -> None:
    model, opt, batch = transformer_task()
    path = os.path.join(root, "tput")
    t0 = time.perf_counter()
    with opscope.dump(path, level="aten", data="tensor") as d:
        for i in range(n):
            train_step(model, opt, *batch(i))
            d.step()
    dt = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(path) for f in fs) / 2**20
    print(f"tensor dump wrote {size:.0f} MB in {dt:.1f} s = {size / dt:.0f} MB/s; "
          f"the disk's own sequential write: {disk_throughput(root):.0f} MB/s")


MSPROBE_SCRIPT = """
import json, statistics, sys, time, torch
from msprobe.pytorch import PrecisionDebugger
sys.path.insert(0, {bench_dir!r})
from bench_dump import TASKS, train_step
torch.set_num_threads(1)
model, opt, batch = TASKS[{task!r}]()
def steps(n, debug):
    out = []
    for i in range(n):
        t = time.perf_counter()
        if debug:
            PrecisionDebugger.start(model)
        train_step(model, opt, *batch(i))
        if debug:
            PrecisionDebugger.stop(); PrecisionDebugger.step()
        out.append(time.perf_counter() - t)
    return statistics.median(out[2:])
bare = steps({n}, False)
PrecisionDebugger(config_path={config!r})
print(json.dumps(steps({n}, True) / bare))
"""


def _msprobe(root: str, n: int, ours: dict[tuple[str, str], float]) -> None:
    """Run mindstudio-probe (msprobe) on the same models and steps, if it is installed."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("msprobe") is None:
        print("mindstudio-probe is not installed: no peer ratio printed "
              "(measured elsewhere: 3.6x transformer / 6.2x MLP statistics at API level, 16.5x tensors)")
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for task, (mode, ours_label) in [(t, m) for t in TASKS for m in (
            ("statistics", "statistics, api level"), ("tensor", "full tensors, aten level (target <= 3x)"))]:
        config = os.path.join(root, f"msprobe-{task}-{mode}.json")
        with open(config, "w") as f:
            json.dump({"task": mode, "dump_path": os.path.join(root, f"msprobe-{task}-{mode}"), "rank": [],
                       "step": [], "level": "L1", mode: {"scope": [], "list": [], "data_mode": ["all"]}}, f)
        script = MSPROBE_SCRIPT.format(bench_dir=here, task=task, n=n, config=config)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            print(f"msprobe {task} {mode}: failed ({proc.stderr.strip().splitlines()[-1:]})")
            continue
        theirs = float(proc.stdout.strip().splitlines()[-1])
        mine = ours[(task, ours_label)]
        print(f"{task:12s} msprobe {mode} (L1, API level) {theirs:5.2f}x   opscope {ours_label}: {mine:5.2f}x   "
              f"opscope/msprobe = {mine / theirs:4.2f}")


if __name__ == "__main__":
    main()
