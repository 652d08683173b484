"""Dump overhead against the bare training loop, in one invocation, one thread.

Prints, for a 2-layer transformer step (d=128, 4 heads, seq 64, batch 8, AdamW) and a
small MLP: the ratio of a step with dumping on to the bare step, for statistics at aten,
api and module level, for steps not selected, and for full-tensor mode (with the write
throughput next to the disk's own, measured in the same run). Runs are interleaved
(bare then dump, dump then bare, ...: the order alternates) and the median of each is
taken, so machine noise affects both sides alike. When mindstudio-probe is installed it is run on the same steps too.
Under each statistics row: the floor of that row on this machine, the statistics kernel's own time
in the dumped steps (the native dump's kernel clock), its bytes and rate, and the ratio a dump
that did nothing but read each new tensor once would have.

Then: the tensor dump's write speed as a share of a plain sequential write (each round: the
writer's bytes over its time in writes, and the whole dump's bytes over the loop's wall time
with how long the training thread waited for the writer, which says which of the two bound
it), the fixed cost of a dumped tiny step (~0.5 ms, ~100 op calls: dumped minus bare per step, step by
step in one process, and from whole loops with the dump's start and stop), and the
memory the native tensor dump's chunk pool holds between two tensor windows. Each ratio is
given with its spread (the lowest and highest of the rounds' bare/dumped pairs) and with the
ratio of the training thread's CPU time per step (what a loaded machine distorts least).
The two rows whose targets are finer than what whole runs resolve (steps not selected within
1%, the tiny step's 200 us) are measured pair by pair of neighbouring steps in one process,
two copies of the model stepping in turn, with a 95% confidence interval (dump_pairs.py).

    python benchmarks/bench_dump.py [--steps 30] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any

import dump_pairs  # this script's folder is on sys.path
import torch
from timing import KernelSteps, floor_text, host_text

import opscope
from opscope.demo.models import mlp_task, train_step, transformer_task

# The reference shapes: a 2-layer transformer step (~20 ms bare here) and a small
# MLP (~6 ms bare here).
TASKS = {
    "transformer": transformer_task,
    "mlp": lambda: mlp_task(batch=256, d_in=512, hidden=512, depth=3),
}


# the training thread's CPU seconds of each step, beside the wall-clock ones _time_steps returns
# (on a loaded machine wall-clock ratios spread widely; the thread's CPU time much less)
_CPU: list[float] = []
# the statistics kernel's seconds and bytes in each dumped step (the native dump's kernel clock):
# what reading each new tensor once costs in the step, the floor under the row's ratio
_KERNEL: list[tuple[float, int]] = []
# the wall time of the whole loop of each run (with a dump: its start and its stop, which waits
# for the writer, included): what the user waits for, where a per-step median leaves out the
# steps that the writer's rounds slow
_LOOP: list[float] = []


NOT_SELECTED = "steps not selected (target <= 1.01x)"


def _time_steps(task, n: int, dump_keys: dict | None, root: str) -> list[float]:
    model, opt, batch = task()
    times = []
    _CPU.clear()
    if dump_keys is None:
        w0 = time.perf_counter()
        for i in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            train_step(model, opt, *batch(i))
            times.append(time.perf_counter() - t0)
            _CPU.append(time.thread_time() - c0)
        _LOOP.append(time.perf_counter() - w0)
        return times
    path = os.path.join(root, "dump")
    shutil.rmtree(path, ignore_errors=True)
    clock = KernelSteps()
    w0 = time.perf_counter()
    with opscope.dump(path, **dump_keys) as d, clock:
        for i in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            clock.begin()
            train_step(model, opt, *batch(i))
            d.step()
            times.append(time.perf_counter() - t0)
            _CPU.append(time.thread_time() - c0)
            clock.end()
    _LOOP.append(time.perf_counter() - w0)
    _KERNEL[:] = clock.steps
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


def ratio(task, n: int, keys: dict, root: str, rounds: int) -> tuple[float, float, float, float, list[float], str]:
    """Median dumped step over median bare step (all rounds), the lowest and highest ratio of
    one round's pair (the spread), the same median ratio of the training thread's CPU time, and
    each round's ratio of whole loops (the dump's start and stop included), and the statistics
    kernel's part of the dumped steps (:func:`floor_text`)."""
    base: list[float] = []
    dumped: list[float] = []
    cpu: dict[bool, list[float]] = {False: [], True: []}
    pairs, loops, kernel = [], [], []
    for r in range(rounds):
        b: list[float] = []
        c: list[float] = []
        loop: dict[bool, float] = {}
        for dumping in ((False, True) if r % 2 == 0 else (True, False)):
            (c if dumping else b).extend(_time_steps(task, n, keys if dumping else None, root)[2:])
            cpu[dumping] += _CPU[2:]
            loop[dumping] = _LOOP[-1]
            kernel += _KERNEL[2:] if dumping else []
        base += b
        dumped += c
        pairs.append(statistics.median(c) / statistics.median(b))
        loops.append(loop[True] / loop[False])
    return (statistics.median(dumped) / statistics.median(base), min(pairs), max(pairs),
            statistics.median(cpu[True]) / statistics.median(cpu[False]), loops,
            floor_text(kernel, statistics.median(base)))


def tiny_task():
    """A step of about half a millisecond (a 2-layer MLP of width 32, batch 16: ~100 op calls)."""
    return mlp_task(batch=16, d_in=32, hidden=32, depth=2)


def _tiny_run(n: int, keys: dict | None, root: str) -> tuple[list[float], float, float]:
    """Per-step wall times of ``n`` tiny steps (5 warm-up steps dropped), the whole loop's wall
    time per step (with a dump: its start and its stop, which waits for the writer, included)
    and the training thread's CPU time per step."""
    model, opt, batch = tiny_task()
    for i in range(5):
        train_step(model, opt, *batch(i))
    times = []
    w0, c0 = time.perf_counter(), time.thread_time()
    if keys is None:
        for i in range(n):
            t0 = time.perf_counter()
            train_step(model, opt, *batch(i))
            times.append(time.perf_counter() - t0)
    else:
        path = os.path.join(root, "tiny")
        shutil.rmtree(path, ignore_errors=True)
        with opscope.dump(path, **keys) as d:
            for i in range(n):
                t0 = time.perf_counter()
                train_step(model, opt, *batch(i))
                d.step()
                times.append(time.perf_counter() - t0)
    return times[5:], (time.perf_counter() - w0) / n, (time.thread_time() - c0) / n


def _not_selected(name: str, task, args: argparse.Namespace, root: str) -> float:
    """Steps not selected against bare ones, pair by pair in one process (dump_pairs.not_selected):
    as many steps as the 3x steps and rounds of whole runs this row took before."""
    got = dump_pairs.not_selected(task, 9 * args.steps, args.rounds, root)
    r, lo, hi = got["wall"]
    c, clo, chi = got["cpu"]
    print(f"{name:12s} {NOT_SELECTED:58s} {r:5.3f}x  (95% CI {lo:.3f}..{hi:.3f} over {got['n']} pairs, rounds "
          f"{got['rounds'][0]:.3f}..{got['rounds'][1]:.3f}; training thread's CPU {c:.3f}x, CI {clo:.3f}..{chi:.3f}; "
          f"losses {'identical' if got['identical'] else 'DIFFER'}; global hooks left {got['hooks_left']})")
    return r


def _tiny_step(root: str, rounds: int, n: int = 400) -> None:
    """The fixed cost of a dumped step: dumped minus bare per step, on a step of few ops. First
    step by step in one process (dump_pairs.tiny_cycle: the median of the cycles' differences
    with its 95% CI), then whole loops of ``n`` steps (the dump's start and stop included),
    each round's pair alternating which runs first; the spread is the lowest and highest pair."""
    got = dump_pairs.tiny_cycle(tiny_task, 100 * rounds, root)
    whole, cpu = [], []
    for r in range(max(rounds, 4)):
        order = [None, {"level": "aten"}] if r % 2 == 0 else [{"level": "aten"}, None]
        runs = {}
        for keys in order:
            runs[keys is None] = _tiny_run(n, keys, root)
        (_, bw, bc), (_, cw, cc) = runs[True], runs[False]
        whole.append(cw - bw)
        cpu.append(cc - bc)
    model, opt, batch = tiny_task()
    with opscope.dump(os.path.join(root, "tiny-ops"), level="aten", overwrite=True) as d:
        train_step(model, opt, *batch(0))
        d.step()
    ops = len({(r["seq"]) for r in opscope.load(os.path.join(root, "tiny-ops")).records(columns=["seq"]).to_pylist()})
    us = statistics.median

    def span(key: str) -> str:
        m, lo, hi = got[key]
        return f"{m:.0f} us (CI {lo:.0f}..{hi:.0f})"

    print(f"{'tiny':12s} {'statistics, aten, every step: fixed cost per step (target <= 200 us)':58s} "
          f"{got['fixed_cpu'][0]:5.0f} us  (training thread's CPU, 95% CI {got['fixed_cpu'][1]:.0f}.."
          f"{got['fixed_cpu'][2]:.0f} over {got['n']} cycles; wall {span('fixed')}; {ops} op calls a step, whose "
          f"own cost this includes)")
    print(f"{'tiny':12s} {'  the same against a step not selected; not selected against bare':58s} "
          f"{got['vs_idle_cpu'][0]:5.0f} us  (CPU; wall {span('vs_idle')}); {span('idle_cpu')} CPU, wall "
          f"{span('idle')}; writer thread {got['others_us']:.0f} us CPU a dumped step; losses "
          f"{'identical' if got['identical'] else 'DIFFER'}")
    print(f"{'tiny':12s} {'  the same, whole loop with start and stop / steps':58s} {us(whole) * 1e6:5.0f} us  "
          f"(pairs {min(whole) * 1e6:.0f}..{max(whole) * 1e6:.0f}); training thread's CPU "
          f"{us(cpu) * 1e6:.0f} us (pairs {min(cpu) * 1e6:.0f}..{max(cpu) * 1e6:.0f})")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _pool_between_windows(root: str) -> None:
    """Memory of the native tensor dump's chunk pool between two tensor windows."""
    from opscope.capture.torch.native import build

    native = build.load("_opscope_dump")
    if native is None:
        return
    model, opt, batch = transformer_task()
    train_step(model, opt, *batch(0))
    rss0 = _rss_mb()
    with opscope.dump(os.path.join(root, "pool"), level="aten", data="tensor", steps="0|1|6", overwrite=True) as d:
        for i in range(8):
            train_step(model, opt, *batch(i))
            d.step()
            if i == 1:
                held_window = native.pool_bytes()[0] / 2**20
            if i == 4:  # between the windows, the writer done with the first
                time.sleep(0.5)
                between, rss = native.pool_bytes()[0] / 2**20, _rss_mb()
    print(f"{'transformer':12s} {'tensor chunk pool between tensor windows (returned)':58s} {between:5.0f} MB held "
          f"({held_window:.0f} MB at the end of the first window); RSS {rss - rss0:+.0f} MB over the process "
          f"before the dump")


def _tensor_write_share(root: str, n: int, rounds: int) -> None:
    """The writer's write speed (what it wrote over its time in writes) as a share of a plain
    sequential write in the same round, and the whole dump's rate (its bytes over the loop's
    wall time) beside it, with the time the training thread waited for room in the writer's
    queue: when it never waited, that rate is the dumped step's own, not the disk's."""
    shares, ends, waits = [], [], []
    for _ in range(rounds):
        size, dt, writer = _tensor_dump_seconds(root, n)
        disk = disk_throughput(root)
        speed = writer.tensor_bytes / 2**20 / max(writer.write_seconds, 1e-9)
        shares.append(speed / disk)
        ends.append(size / dt / disk)
        waits.append(writer.waited_seconds)
    print(f"{'transformer':12s} {'full tensors: write speed / plain sequential write (>= 0.8)':58s} "
          f"{statistics.median(shares):5.2f}  (rounds {min(shares):.2f}..{max(shares):.2f}; last: the writer "
          f"{speed:.0f} MB/s in its writes against {disk:.0f} MB/s)")
    bound = ": the rate is the dumped step's own, not the disk's" if max(waits) == 0 else ""
    print(f"{'transformer':12s}   {'the same, the whole dump (bytes / loop wall time)':56s} "
          f"{statistics.median(ends):5.2f}  (rounds {min(ends):.2f}..{max(ends):.2f}; last {size / dt:.0f} MB/s; "
          f"the training thread waited {1e3 * max(waits):.0f} ms at most for the writer in a loop of {n} steps{bound})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved runs per side (even: both orders)")
    parser.add_argument("--no-peers", action="store_true", help="skip msprobe even when it is installed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    # tensor dumps from step 0 say once that their size is measured while written: not news here
    warnings.filterwarnings("ignore", message=r"opscope dump: the size of the full tensors")
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {host_text()}; {args.steps} steps x "
          f"{args.rounds} rounds, order alternating; load average {os.getloadavg()[0]:.1f} at the start")
    cases = [
        ("statistics, aten level (target <= 1.2x)", {"level": "aten"}),
        ("statistics, api level (target <= 1.5x)", {"level": "api"}),
        ("statistics, module level (target <= 1.05x)", {"level": "module"}),
        (NOT_SELECTED, {}),  # dump_pairs.not_selected
        ("full tensors, aten level (target <= 3x)", {"level": "aten", "data": "tensor"}),
    ]
    ours: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as root:
        for name, task in TASKS.items():
            for label, keys in cases:
                if label == NOT_SELECTED:  # a ratio near 1, read within a percent: pair by pair
                    ours[(name, label)] = _not_selected(name, task, args, root)
                    continue
                r, low, high, cpu, loops, floor = ratio(task, args.steps, keys, root, args.rounds)
                ours[(name, label)] = r
                print(f"{name:12s} {label:58s} {r:5.2f}x  (pairs {low:.2f}..{high:.2f}; "
                      f"training thread's CPU {cpu:.2f}x; whole loops of {args.steps} steps, the dump's start "
                      f"and stop included, {statistics.median(loops):.2f}x, rounds {min(loops):.2f}..{max(loops):.2f})")
                if keys.get("data") != "tensor":  # (a tensor dump's copies are no part of the kernel's time)
                    print(f"{'':12s}   {floor}")
        _tensor_write_share(root, args.steps, max(2, args.rounds // 2))
        _tiny_step(root, args.rounds)
        _pool_between_windows(root)
        if not args.no_peers:
            _msprobe(root, args.steps, ours)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


def _tensor_dump_seconds(root: str, n: int) -> tuple[float, float, Any]:
    """MB written by an aten tensor dump of ``n`` transformer steps, the seconds it took, and
    its writer (``tensor_bytes``, ``write_seconds``, ``waited_seconds``)."""
    model, opt, batch = transformer_task()
    path = os.path.join(root, "tput")
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    with opscope.dump(path, level="aten", data="tensor") as d:
        writer = d.writer
        for i in range(n):
            train_step(model, opt, *batch(i))
            d.step()
    dt = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(path) for f in fs) / 2**20
    return size, dt, writer


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
            ("statistics", "statistics, api level (target <= 1.5x)"),
            ("tensor", "full tensors, aten level (target <= 3x)"))]:
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
