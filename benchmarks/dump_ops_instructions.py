"""Instructions of one dumped step of small ops, counted by callgrind: a measure of the native
aten observer's per-op cost that the machine's load does not move (issue 18).

On the shared 2-core machine, times of the same tree spread by 2x from one run to the next,
more than the changes judged; instruction counts repeat to within 0.1%. Run under callgrind
with collection off; the script switches it on for one step (``bench_dump_ops._forward``:
``--ops`` small op calls with autograd, then ``d.step()``: its rows to columns), after two
warm steps, and off again:

    valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes \\
        --callgrind-out-file=/tmp/cg.%p python benchmarks/dump_ops_instructions.py this 1000
    callgrind_annotate --inclusive=yes /tmp/cg.<pid>-01     # the training thread

``bare`` instead of ``this`` counts the same loop without a dump; a path to another build of
``_opscope_dump`` (e.g. from ``~/.cache/opscope/native/<older tree's tag>/``) counts that
build. With ``tiny`` as the count (``... this tiny``) the step is instead ten steps of
``bench_dump.tiny_task`` (a ~0.5 ms MLP step, ~100 op calls), each dumped with its hooks and
boundary: (dumped - bare) / 10 is issue 18's fixed cost a step; ``transformer`` or ``mlp`` counts
ten steps of that task of ``bench_dump.TASKS`` the same way (dumped / bare: the aten level's
ratio in instructions); ``transformer:3`` counts 3 steps instead of ten (a transformer step
takes ~1 min under callgrind here). Callgrind counts instructions,
not cache misses: a change that only saves memory traffic (allocation, a table's layout) shows
little here.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import sys
import tempfile
import time

import torch
from bench_dump_ops import _forward  # this script's folder is on sys.path

import opscope
from opscope.capture.torch.native import build as native


def _callgrind(on: bool) -> None:
    os.system(f"callgrind_control -i {'on' if on else 'off'} {os.getpid()} > /dev/null")


def _steps(which: str, task_name: str, n: int = 10) -> None:
    """``n`` steps of a task counted (after three warm ones), dumped every step unless ``bare``."""
    from bench_dump import TASKS, tiny_task

    from opscope.demo.models import train_step

    model, opt, batch = (tiny_task if task_name == "tiny" else TASKS[task_name])()
    root = tempfile.mkdtemp(prefix="opscope-instr-")
    gc.disable()
    try:
        if which == "bare":
            for i in range(3):
                train_step(model, opt, *batch(i))
            _callgrind(True)
            for i in range(3, 3 + n):
                train_step(model, opt, *batch(i))
            _callgrind(False)
            return
        with opscope.dump(os.path.join(root, "d"), level="aten") as d:
            for i in range(3):
                train_step(model, opt, *batch(i))
                d.step()
            time.sleep(0.5)
            _callgrind(True)
            for i in range(3, 3 + n):
                train_step(model, opt, *batch(i))
                d.step()
            _callgrind(False)
    finally:
        gc.enable()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    which = sys.argv[1]
    torch.set_num_threads(1)
    if which not in ("bare", "this"):
        spec = importlib.util.spec_from_file_location("_opscope_dump", which)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        native._LOADED["_opscope_dump"] = module
    task, _, steps = sys.argv[2].partition(":")
    if task in ("tiny", "transformer", "mlp"):
        _steps(which, task, int(steps or 10))
        return
    n = int(sys.argv[2])
    root = tempfile.mkdtemp(prefix="opscope-instr-")
    gc.disable()
    try:
        if which == "bare":
            _forward(n, True)
            _forward(n, True)
            _callgrind(True)
            _forward(n, True)
            _callgrind(False)
            return
        with opscope.dump(os.path.join(root, "d"), level="aten") as d:
            for _ in range(2):
                _forward(n, True)
                d.step()
            time.sleep(0.5)  # the writer done with the warm steps
            _callgrind(True)
            _forward(n, True)
            d.step()
            _callgrind(False)
    finally:
        gc.enable()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
