"""Where the wall time of one ``opscope compare`` goes, phase by phase.

A child Python runs the CLI as the console script does (``opscope.cli.main.entry``: the same
exit) with time stamps at its seams, and this process times the child from before it is
started to after it has exited:

- start-up: interpreter, imports and argument parsing, until ``compare()`` is called;
- index: reading the index, aligning and planning (the part of ``compare()`` that is not
  measuring or judging);
- measure: reading and summing the tensors (every ``measure.run``);
- verdict: judging after the last measurement, to ``compare()`` returning;
- reports: printing the verdict and writing the files;
- exit: from the command's return to the process gone.

Each phase is given in wall seconds and in CPU seconds of the compare process (all its
threads; a process pool's workers are counted in "measure" only as wall time). Used by
``bench_compare_e2e.py``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
seams = {"measure_wall": 0.0, "measure_cpu": 0.0}

def stamp(name):
    seams[name] = (time.time(), time.process_time())

from opscope.compare import api, measure
import opscope.cli.main as cli

def timed(module, name, before, after):
    inner = getattr(module, name)
    def outer(*args, **kwargs):
        stamp(before)
        try:
            return inner(*args, **kwargs)
        finally:
            stamp(after)
            if before == "measure_start":
                seams["measure_wall"] += seams[after][0] - seams[before][0]
                seams["measure_cpu"] += seams[after][1] - seams[before][1]
                seams.setdefault("first_measure", seams[before])
    setattr(module, name, outer)

timed(api, "compare", "compare_enter", "compare_exit")
timed(measure, "run", "measure_start", "measure_end")
main = cli.main
def reporting_main(argv=None):
    try:
        return main(argv)
    finally:
        stamp("main_return")
        print("PHASES " + json.dumps(seams), file=sys.stderr, flush=True)
cli.main = reporting_main
cli.entry()
"""

NAMES = ("start-up", "index", "measure", "verdict", "reports", "exit")


def user_env() -> dict[str, str]:
    """This environment as a user's shell has it: Python writes and reuses bytecode. With
    ``PYTHONDONTWRITEBYTECODE`` set (as in some sandboxes), every module edited since its
    ``.pyc`` was written is compiled again at each start (~0.1 s of a compare's start-up
    after a day of edits); an installed opscope has its ``.pyc`` files."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(args: list[str]) -> dict[str, tuple[float, float]]:
    """``opscope`` with ``args`` in a child; returns {phase: (wall s, CPU s)} (:data:`NAMES`)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, timeout=3600,
                          env=user_env())
    end = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("PHASES ")), None)
    if line is None or proc.returncode not in (0, 1):
        raise RuntimeError(f"opscope {' '.join(args[:1])} failed ({proc.returncode}): {proc.stderr[-800:]}")
    s = json.loads(line[len("PHASES "):])
    cpu_all = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    enter, leave, ret = s["compare_enter"], s["compare_exit"], s["main_return"]
    last = s.get("measure_end", enter)
    measure = s["measure_wall"], s["measure_cpu"]
    verdict = leave[0] - last[0], leave[1] - last[1]
    in_compare = leave[0] - enter[0], leave[1] - enter[1]
    return {
        "start-up": (enter[0] - start, enter[1]),
        "index": (in_compare[0] - measure[0] - verdict[0], in_compare[1] - measure[1] - verdict[1]),
        "measure": measure,
        "verdict": verdict,
        "reports": (ret[0] - leave[0], ret[1] - leave[1]),
        "exit": (end - ret[0], max(0.0, cpu_all - ret[1])),
    }


def line(phases: dict[str, tuple[float, float]]) -> str:
    """One printable line: each phase's wall and CPU seconds, and the total."""
    wall = sum(w for w, _ in phases.values())
    return ("phases, wall / CPU s: " + ", ".join(f"{name} {phases[name][0]:.3f} / {phases[name][1]:.3f}"
                                               for name in NAMES) + f" (wall {wall:.3f} s in all)")


def median_phases(args: list[str], repeat: int) -> dict[str, tuple[float, float]]:
    """Each phase's median over ``repeat`` runs (wall and CPU apart)."""
    runs = [run(args) for _ in range(repeat)]
    mid = len(runs) // 2
    return {name: (sorted(r[name][0] for r in runs)[mid], sorted(r[name][1] for r in runs)[mid]) for name in NAMES}


if __name__ == "__main__":  # python benchmarks/compare_phases.py TARGET REFERENCE [OUT] [--repeat N]
    argv = sys.argv[1:]
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 3
    argv = [a for i, a in enumerate(argv) if a != "--repeat" and (i == 0 or argv[i - 1] != "--repeat")]
    out = argv[2] if len(argv) > 2 else str(Path("/tmp") / "opscope-compare-phases")
    print(line(median_phases(["compare", argv[0], argv[1], "-o", out], repeat)))
