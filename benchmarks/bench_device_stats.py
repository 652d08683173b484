"""The statistics of tensors on an accelerator (CUDA, NPU) at the aten level: what a dumped
step costs through the native device path (torch reductions issued from C++, read back once a
step: native/_c/dumpobs_device.h) against the way before it (a Python call per tensor into
``stats.device_stats``, ~57 aten ops each), each over the bare step, in one process; and the
device path with each tensor reduced alone (``OPSCOPE_DEVICE_STAGING_MB=0``, ~22 ops a tensor).

On a GPU (``--device cuda``) the dump's cost there is launching the reductions' kernels from the
training thread: each configuration's training-thread CPU and wall time a step (the wall time
after ``torch.cuda.synchronize()``) are printed, with the device path as the dump runs it and
the way before through the native observer's Python hook (``route_slow``). On a machine
without one (``--device cpu``, the default) the same two paths run on CPU tensors routed as
if they lay on another device (``route_device``; the hook made to call ``device_stats``): the
reductions' own arithmetic is the CPU's then, so read the CPU figures as the per-op overhead
of each path. Configurations alternate round by round; medians over the steps of all rounds:

    python benchmarks/bench_device_stats.py [--device cuda] [--task transformer] [--steps 10] [--rounds 3]

The torch threads are set to 1 on CPU (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dump import TASKS, tiny_task  # noqa: E402

import opscope  # noqa: E402
from opscope.capture.torch import stats  # noqa: E402
from opscope.capture.torch.native import aten as native_aten  # noqa: E402
from opscope.capture.torch.native import build as native  # noqa: E402
from opscope.demo.models import train_step  # noqa: E402


def _old_hook(self, index: int, t: torch.Tensor) -> None:  # the hook as before: device_stats in Python
    with torch._C._DisableTorchDispatch():
        self.recorder.slow[index] = native_aten.DeviceJob(stats.device_stats(t))


def _steps(task, device: str, n: int, how: str | None, root: str) -> tuple[list[float], list[float]]:
    model, opt, batch = task()
    model.to(device)  # (the same Parameter objects: the optimizer made before keeps them)
    data = [tuple(x.to(device) for x in batch(i)) for i in range(n)]
    backend = native.load("_opscope_dump")
    path = os.path.join(root, "d")
    shutil.rmtree(path, ignore_errors=True)
    cpu, wall = [], []
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    real_hook = native_aten._Hooks.slow
    if how == "python":
        backend.route_slow(True)
        native_aten._Hooks.slow = _old_hook
    elif how is not None and device == "cpu":
        backend.route_device(True)
    os.environ["OPSCOPE_DEVICE_STAGING_MB"] = "0" if how == "alone" else "8"  # (read as the dump starts)
    try:
        with opscope.dump(path, level="aten", enable=how is not None) as d:
            for inputs, targets in data:
                sync()
                c0, w0 = time.thread_time(), time.perf_counter()
                train_step(model, opt, inputs, targets)
                d.step()
                sync()
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - w0)
    finally:
        backend.route_slow(False)
        backend.route_device(False)
        native_aten._Hooks.slow = real_hook
    return cpu[1:], wall[1:]  # (the first step warms the caches and builds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--task", default="transformer", choices=[*TASKS, "tiny"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    task = tiny_task if args.task == "tiny" else TASKS[args.task]
    configs = [None, "batched", "alone", "python"]
    got: dict[str | None, tuple[list[float], list[float]]] = {k: ([], []) for k in configs}
    with tempfile.TemporaryDirectory(prefix="opscope-devstats-") as root:
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for how in order:
                c, w = _steps(task, args.device, args.steps + 1, how, root)
                got[how][0].extend(c)
                got[how][1].extend(w)
    bare_c, bare_w = (statistics.median(v) for v in got[None])
    print(f"{args.task} on {args.device}, aten level, statistics; {args.rounds} rounds of {args.steps} steps "
          f"(torch {torch.__version__})")
    print(f"  bare step: training thread's CPU {bare_c * 1e3:.2f} ms, wall {bare_w * 1e3:.2f} ms")
    for how, name in (("batched", "C++, staging buffers (default)"), ("alone", "C++, each tensor alone (staging 0)"),
                      ("python", "a Python call per tensor (before)")):
        c, w = (statistics.median(v) for v in got[how])
        print(f"  {name:36s} CPU {c * 1e3:8.2f} ms ({c / bare_c:5.2f}x)   wall {w * 1e3:8.2f} ms ({w / bare_w:5.2f}x)")


if __name__ == "__main__":
    main()
