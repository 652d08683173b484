"""The native aten dump's cost per op, in one process: a loop of small ops run bare and inside a
dumped step, in turn (issue 18: the tiny step's fixed cost is mostly per op).

Each round runs the same loop of ``--ops`` calls bare, then inside a step of an aten-level
statistics dump (the dump's start, its step boundary and its stop are outside the timed part),
the order flipping every round; the cost per op is (dumped - bare) / ops in the training
thread's CPU time, the median over the rounds with the lowest and highest round. Loops:

- ``forward``: ``x + 1.0``, ``x * y``, ``relu``, ``mm`` on 16x16 float32, no autograd (each op
  one or two input rows, one output row);
- ``autograd``: the same on tensors that require grad, then ``backward`` of their sum (the
  engine's records and the backward ops too; a call is counted per recorded row's op).

Then the tiny step (``bench_dump.tiny_task``) dumped every step against bare, cycle by cycle
(``dump_pairs.tiny_cycle``).

With ``--against OLD.so`` (another build of ``_opscope_dump``, e.g. from the cache folder of an
older tree) both builds are loaded in this process and each round runs the loop bare, with
this tree's build and with the other, in turn (the tiny step: ``--cycles`` per round and build):
whole processes alternated spread by 2x on a loaded machine, more than the changes judged.

    python benchmarks/bench_dump_ops.py [--ops 2000] [--rounds 9] [--cycles 300] [--against OLD.so]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch

import opscope
from opscope.capture.torch.native import build as native


def _forward(n: int, grad: bool) -> None:
    x = torch.randn(16, 16, requires_grad=grad)
    y = torch.randn(16, 16, requires_grad=grad)
    acc = []
    for _ in range(n // 4):
        a = x + 1.0
        b = a * y
        c = b.relu()
        acc.append(torch.mm(c, x))
    if grad:
        torch.stack(acc).sum().backward()


def _timed(n: int, grad: bool) -> float:
    """CPU seconds of one loop, Python's collector kept out of it (a full collection of the
    heap, ~0.2 s here, would land in one side's loop or the other's)."""
    gc.collect()
    gc.disable()
    try:
        c0 = time.thread_time()
        _forward(n, grad)
        return time.thread_time() - c0
    finally:
        gc.enable()


def _use(module: Any) -> None:
    """Dumps started from now on run ``module`` as the native aten observer."""
    native._LOADED["_opscope_dump"] = module


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("_opscope_dump", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dumped(n: int, grad: bool, path: str) -> float:
    shutil.rmtree(path, ignore_errors=True)
    with opscope.dump(path, level="aten") as d:
        _forward(n, grad)  # step 0: warm (op kinds learnt)
        d.step()
        time.sleep(0.2)  # the writer thread writes step 0 now, not beside the timed loop
        took = _timed(n, grad)
        d.step()
    return took


def per_op(n: int, rounds: int, grad: bool, root: str, builds: dict[str, Any]) -> dict[str, Any]:
    """Per build: median µs per op (dumped - bare), lowest and highest round; with two builds
    also the per-round difference (first - second); the recorded calls of one loop."""
    torch.set_num_threads(1)
    path = os.path.join(root, "ops")
    got: dict[str, list[float]] = {name: [] for name in builds}
    for r in range(rounds):
        sides = ["bare", *builds]
        sides = sides[r % len(sides):] + sides[:r % len(sides)]
        t: dict[str, float] = {}
        for side in sides:
            if side == "bare":
                _forward(n, grad)  # warm
                t[side] = _timed(n, grad)
            else:
                _use(builds[side])
                t[side] = _dumped(n, grad, path)
        for name in builds:
            got[name].append((t[name] - t["bare"]) / n * 1e6)
    out: dict[str, Any] = {name: (statistics.median(v), min(v), max(v)) for name, v in got.items()}
    if len(builds) == 2:
        a, b = (got[name] for name in builds)
        diff = [x - y for x, y in zip(a, b, strict=True)]
        out["diff"] = (statistics.median(diff), min(diff), max(diff))
    out["calls"] = len({r["seq"] for r in opscope.load(path).records(columns=["seq", "step"]).to_pylist()
                        if r["step"] == 1})
    return out


def tiny(cycles: int, rounds: int, root: str, builds: dict[str, Any]) -> dict[str, list[float]]:
    """The tiny step's fixed cost (median of ``cycles`` cycles, µs CPU) per build and round."""
    import dump_pairs  # this script's folder is on sys.path
    from bench_dump import tiny_task

    got: dict[str, list[float]] = {name: [] for name in builds}
    for r in range(rounds):
        for name in list(builds)[::1 if r % 2 == 0 else -1]:
            _use(builds[name])
            res = dump_pairs.tiny_cycle(tiny_task, cycles, root)
            assert res["identical"], "losses differ with the dump on"
            got[name].append(res["fixed_cpu"][0])
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cycles", type=int, default=300, help="tiny-step cycles a round (0: skip)")
    parser.add_argument("--tiny-rounds", type=int, default=1)
    parser.add_argument("--against", help="another build of _opscope_dump to run in turn with this tree's")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="opscope-ops-")
    builds: dict[str, Any] = {"this": native.load("_opscope_dump")}
    if args.against:
        builds["other"] = _load(args.against)
    try:
        for name, grad in (("forward", False), ("autograd", True)):
            got = per_op(args.ops, args.rounds, grad, root, builds)
            for build in builds:
                m, lo, hi = got[build]
                print(f"{name:9s} {build:5s} {m:6.2f} us an op call of the loop (rounds {lo:.2f}..{hi:.2f}; "
                      f"{args.ops} op calls run, {got['calls']} recorded)")
            if "diff" in got:
                m, lo, hi = got["diff"]
                print(f"{name:9s} this - other, per round: {m:+.2f} us an op call (rounds {lo:+.2f}..{hi:+.2f})")
        if args.cycles:
            for build, v in tiny(args.cycles, args.tiny_rounds, root, builds).items():
                print(f"tiny step {build:5s} fixed cost {statistics.median(v):.0f} us CPU (rounds' medians "
                      f"{', '.join(f'{x:.0f}' for x in v)}; {args.cycles} cycles each; losses identical)")
    finally:
        _use(builds["this"])
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
