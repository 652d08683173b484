"""Compare throughput and start-up, printed from one invocation.

    python benchmarks/bench_compare.py [--mb 256] [--tensor-mb 4] [--keep DIR]

Writes two float32 tensor dumps (target = reference + noise, so no hash short-cut applies)
over 2 ranks x 2 steps, then times ``opscope.compare`` with 1 worker and with every core
(MB/s of tensor data read, both sides counted), and the start-up of ``opscope --help`` and
``opscope compare --help``. Peer figure (msprobe compare, measured on this kind of machine):
14-63 MB/s after ~4 s of start-up; when mindstudio-probe is installed it is not run here
(it needs its own dump format), only named.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from opscope.model.records import new_row
from opscope.storage.writer import DumpWriter

PEER_MB_S = (14, 63)


def write_dump(path: Path, total_mb: int, tensor_mb: int, noise: float, seed: int = 0) -> int:
    """A float32 dump of about ``total_mb`` MB; returns its tensor bytes."""
    n = tensor_mb * (1 << 20) // 4
    per_partition = max(1, total_mb // tensor_mb // 4)
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(42).standard_normal(n).astype(np.float32)
    written = 0
    for rank in (0, 1):
        # one run id for both ranks: without it, overwrite=True takes rank 1 for a new run and removes rank 0
        writer = DumpWriter(path, rank, {"tool": "bench", "run_id": f"bench-{path.name}"}, overwrite=True)
        writer.open()
        for step in (0, 1):
            rows = []
            for i in range(per_partition):
                value = base * (1 + i * 1e-3)
                if noise:
                    value = value + (noise * rng.standard_normal(n)).astype(np.float32)
                key = f"r{i}"
                data = writer.add_tensor(step, key, "float32", [n], value.tobytes(), value.nbytes)
                row = new_row(id=i, rank=rank, step=step, seq=i, phase="forward", module=f"layer{i}",
                              op="aten.mm.default", call=0, io="output", slot=0, dtype="float32", shape=[n],
                              numel=n, data=data, key=key)
                row[-1] = (float(value.min()), float(value.max()), float(value.mean()), float(value.std()),
                           float(np.linalg.norm(value)), float(np.abs(value).max()), 0, 0, 0, i + seed * 1000)
                rows.append(row)
                written += value.nbytes
            writer.add_rows(step, rows)
            writer.end_step(step)
        writer.close()
    return written


def timed(fn, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def startup(args: list[str]) -> float:
    cmd = [sys.executable, "-m", "opscope", *args]
    subprocess.run(cmd, capture_output=True, check=False)  # warm the file cache
    return timed(lambda: subprocess.run(cmd, capture_output=True, check=False), repeat=3)


MSPROBE_DUMP = """
import json, sys, torch
from msprobe.pytorch import PrecisionDebugger
from opscope.demo.models import transformer_task, train_step
torch.set_num_threads(1)
out, fault = sys.argv[1], sys.argv[2] == "fault"
json.dump({"task": "tensor", "dump_path": out, "rank": [], "step": [0], "level": "L1",
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}, open(out + ".json", "w"))
model, opt, batch = transformer_task()
if fault:
    model.layers[1].act.approximate = "tanh"
PrecisionDebugger(config_path=out + ".json")
PrecisionDebugger.start(model)
train_step(model, opt, *batch(0))
PrecisionDebugger.stop(); PrecisionDebugger.step()
"""


def _opscope_dump(out: Path, fault: bool) -> None:
    import opscope
    from opscope.demo.models import train_step, transformer_task

    model, opt, batch = transformer_task()
    if fault:
        model.layers[1].act.approximate = "tanh"
    with opscope.dump(out, level="api", data="tensor", steps="0"):
        train_step(model, opt, *batch(0))


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode not in (0, 1):  # 1: a divergence was found, as it should be here
        raise RuntimeError(f"{cmd[0]} failed: {proc.stderr[-500:]}")
    return time.perf_counter() - t0


def _mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def same_runs(root: Path) -> None:
    """With mindstudio-probe installed: both tools dump the same two runs (reference, and a
    tanh-GELU fault) at API level with full tensors, and both compare them from the CLI."""
    import importlib.util

    if importlib.util.find_spec("msprobe") is None:
        print("msprobe (mindstudio-probe) not installed: peer figures above are the measured ones from the issue")
        return
    for side, mode in (("ref", "ok"), ("tgt", "fault")):
        subprocess.run([sys.executable, "-c", MSPROBE_DUMP, str(root / f"msp-{side}"), mode], capture_output=True,
                       check=True, timeout=1800)
        _opscope_dump(root / f"ops-{side}", mode == "fault")
    msprobe = shutil.which("msprobe") or str(Path(sys.executable).with_name("msprobe"))  # the venv's script
    theirs = _wall([msprobe, "compare", "-tp", str(root / "msp-tgt" / "step0"), "-gp",
                    str(root / "msp-ref" / "step0"), "-o", str(root / "msp-out")])
    ours = _wall([sys.executable, "-m", "opscope", "compare", str(root / "ops-tgt"), str(root / "ops-ref"),
                  "-o", str(root / "ops-out"), "-q"])
    msp_mb, ops_mb = _mb(root / "msp-tgt") + _mb(root / "msp-ref"), _mb(root / "ops-tgt") + _mb(root / "ops-ref")
    print(f"same runs (transformer step, API level, full tensors): msprobe compare {theirs:.2f} s for "
          f"{msp_mb:.0f} MB ({msp_mb / theirs:.0f} MB/s); opscope compare {ours:.2f} s for {ops_mb:.0f} MB "
          f"({ops_mb / ours:.0f} MB/s); opscope/msprobe time = {ours / theirs:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="tensor MB per dump")
    parser.add_argument("--tensor-mb", type=int, default=4)
    parser.add_argument("--keep", default=None, help="write the dumps here and keep them")
    args = parser.parse_args()
    import opscope

    root = Path(args.keep or tempfile.mkdtemp(prefix="opscope-bench-"))
    try:
        ref_bytes = write_dump(root / "reference", args.mb, args.tensor_mb, 0.0)
        write_dump(root / "target", args.mb, args.tensor_mb, 1e-4, seed=1)
        total_mb = 2 * ref_bytes / 1e6
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        print(f"data: 2 dumps x {ref_bytes / 1e6:.0f} MB float32 tensors ({total_mb:.0f} MB read per compare), "
              f"{cores} cores")
        rows = []
        for workers in sorted({1, cores}):
            seconds = timed(lambda w=workers: opscope.compare(root / "target", root / "reference", workers=w), 2)
            rate = total_mb / seconds
            rows.append((workers, seconds, rate))
            print(f"compare, {workers} worker(s): {seconds:.2f} s, {rate:.0f} MB/s, {rate / workers:.0f} MB/s per core")
        one = rows[0][2]
        print(f"  vs msprobe compare ({PEER_MB_S[0]}-{PEER_MB_S[1]} MB/s, measured peer figure): "
              f"{one / PEER_MB_S[1]:.1f}x-{one / PEER_MB_S[0]:.1f}x on one core; target >= 500 MB/s per core")
        if len(rows) > 1:
            print(f"  scaling with {rows[-1][0]} workers: {rows[-1][2] / one:.2f}x of one worker")
        help_s = startup(["--help"])
        compare_s = startup(["compare", "--help"])
        write_dump(root / "tiny-t", 1, 1, 1e-4, seed=2)
        write_dump(root / "tiny-r", 1, 1, 0.0)
        whole_s = startup(["compare", str(root / "tiny-t"), str(root / "tiny-r"), "-q"])
        print(f"start-up: opscope --help {help_s:.3f} s, opscope compare --help {compare_s:.3f} s, a whole "
              f"opscope compare of two 4 MB dumps {whole_s:.3f} s (target < 0.5 s; msprobe ~4 s)")
        same_runs(root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
