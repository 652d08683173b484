"""Two trees of opscope on the same dump cases, process after process (issue 18's A/B runs).

Each process runs one case (a task of ``bench_dump.py`` dumped at one level) in ``--rounds``
rounds alternating with its bare loop, and reports the median of the training thread's CPU a
step, dumped over bare. The processes of tree A and tree B alternate (A B, then B A, ...), so
a machine whose speed drifts over minutes moves both alike; the medians over ``--pairs`` pairs
are printed per case. A tree is a ``src`` folder (``git archive <commit> src | tar -x -C DIR``
makes one from a commit; a copy with a change, for an experiment). The native modules of each
tree are built on first use into the shared cache, keyed by their sources.

    python benchmarks/ab_trees.py OLD/src NEW/src [--cases transformer:aten mlp:module] [--pairs 3]

``--one TASK LEVEL`` is the child process's mode: it prints ``ratio <dumped/bare>``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = {"transformer": 20, "mlp": 30, "tiny": 200}


def _one(task_name: str, level: str, rounds: int) -> float:
    """Dumped over bare, the training thread's CPU a step: ``bench_dump.ratio``'s reading."""
    import torch
    from bench_dump import TASKS, ratio, tiny_task  # this script's folder is on sys.path

    torch.set_num_threads(1)
    task = tiny_task if task_name == "tiny" else TASKS[task_name]
    with tempfile.TemporaryDirectory(prefix="opscope-ab-") as root:
        return ratio(task, STEPS[task_name], {"level": level}, root, rounds)[3]


def _child(src: str, task: str, level: str, rounds: int) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.abspath(src), HERE])}
    out = subprocess.run([sys.executable, __file__, "--one", task, level, "--rounds", str(rounds)],
                         capture_output=True, text=True, env=env, check=True).stdout
    return float(out.split("ratio")[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="tree A's and tree B's src folders")
    parser.add_argument("--cases", nargs="+", default=["transformer:aten", "mlp:aten", "transformer:module",
                                                      "mlp:module"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--one", nargs=2, metavar=("TASK", "LEVEL"))
    args = parser.parse_args()
    if args.one:
        print(f"ratio {_one(*args.one, args.rounds):.4f}")
        return
    if len(args.trees) != 2:
        parser.error("two src folders: tree A's and tree B's")
    got: dict[tuple[str, int], list[float]] = {}
    for p in range(args.pairs):
        for side in ((0, 1) if p % 2 == 0 else (1, 0)):
            for case in args.cases:
                task, level = case.split(":")
                got.setdefault((case, side), []).append(_child(args.trees[side], task, level, args.rounds))
    print(f"dumped / bare, the training thread's CPU a step; medians of {args.pairs} processes a tree "
          f"({args.rounds} rounds each); load average {os.getloadavg()[0]:.1f} at the end")
    for case in args.cases:
        a, b = got[(case, 0)], got[(case, 1)]
        print(f"  {case:22s} A {statistics.median(a):.3f}x  B {statistics.median(b):.3f}x   "
              f"(A {' '.join(f'{x:.3f}' for x in a)}; B {' '.join(f'{x:.3f}' for x in b)})")


if __name__ == "__main__":
    main()
