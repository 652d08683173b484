"""``opscope demo``: the accuracy and profiling workflows on a bundled tiny transformer, offline.

Trains a few steps three times — the reference, a run with a fault (the GELU of one layer
replaced by its tanh approximation), and a run under bf16 autocast — dumps each, compares
the fault and the bf16 run against the reference, and profiles the reference.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opscope demo", description=__doc__)
    parser.add_argument("-o", "--output", default="opscope-demo", help="directory for dumps and reports")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run")
    args = parser.parse_args(argv)
    out = Path(args.output)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    start = time.perf_counter()
    print(f"opscope demo: a 2-layer transformer (d=128, 4 heads), {args.steps} steps per run (the first "
          f"dumped with full tensors), into {out}/")
    runs = {"reference": {}, "fault": {"fault": True}, "bf16": {"bf16": True}}
    for name, kw in runs.items():
        train(out / "dumps" / name, args.steps, **kw)
        print(f"  dumped {name:9s} -> {out / 'dumps' / name}")
    from opscope.report import render
    from opscope.storage.reader import load

    print("\n" + render(load(out / "dumps" / "reference")))
    code = _compare(out)
    _profile(out, args.steps)
    print(f"\ndone in {time.perf_counter() - start:.0f} s; {out}/ holds {_size_mb(out):.0f} MB "
          f"(remove it when done: rm -r {out})")
    return code


def _size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def train(path: Path, steps: int, fault: bool = False, bf16: bool = False) -> list[float]:
    """Train the bundled model under a dump; ``fault`` swaps layer 1's GELU for tanh-GELU."""
    import torch

    import opscope
    from opscope.demo.models import train_step, transformer_task

    torch.manual_seed(0)
    model, opt, batch = transformer_task()
    if fault:
        act = model.get_submodule("layers.1.act")
        assert isinstance(act, torch.nn.GELU)
        act.approximate = "tanh"
    losses = []
    # full tensors of the first step only: where the fault starts and that bf16 stays within
    # tolerance show there, at a third of the disk; tensor_limit_mb caps it (and makes its
    # size a log line, not a warning)
    with opscope.dump(path, steps="0", data="tensor", overwrite=True, tensor_limit_mb=2048) as d:
        for i in range(steps):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                losses.append(train_step(model, opt, *batch(i)))
            d.step()
    return losses


def _compare(out: Path) -> int:
    try:
        from opscope.cli import compare as compare_cli
    except ImportError:
        print("\n(compare is not available in this build)")
        return 0
    code = 0
    for name, expect in (("fault", "a divergence that starts at the GELU of layers.1"),
                         ("bf16", "no culprit: bf16 rounding alone is within tolerance")):
        report = out / f"compare-{name}"
        print(f"\n== compare {name} vs reference (expected: {expect})")
        status = compare_cli.main([str(out / "dumps" / name), str(out / "dumps" / "reference"), "-o", str(report)])
        print(f"   report: {report / 'report.html'}")
        if name == "bf16" and status != 0:
            code = 1
    return code


def _profile(out: Path, steps: int) -> None:
    try:
        import opscope.profile.session  # noqa: F401
    except ImportError:
        print("\n(profile is not available in this build)")
        return
    import torch

    from opscope.demo.models import train_step, transformer_task

    model, opt, batch = transformer_task()
    total = steps + 5
    with opscope.profile(out / "profile", steps=f"{total - 2}-{total - 1}", task_trace=True,
                         overwrite=True) as p:
        for i in range(total):
            train_step(model, opt, *batch(i))
            p.step()
    from opscope.cli import profile as profile_cli

    print("\n== where the time goes (training trace of every step, task trace of two)")
    profile_cli.main(["show", str(out / "profile")])
    print(f"   report: {out / 'profile' / 'report.html'}   trace for Perfetto: {out / 'profile' / 'trace.json.gz'}")
    del torch


