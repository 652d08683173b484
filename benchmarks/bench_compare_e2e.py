"""End-to-end compare as a user runs it: ``opscope compare TARGET REFERENCE -o OUT``.

    python benchmarks/bench_compare_e2e.py [--keep DIR] [--huge] [--repeat 3] [--workers N]

Creates its dumps with opscope's own dump of a wide MLP (3 x Linear(2048, 2048) + ReLU,
batch 512, data="tensor", float32): a one-step pair (~0.6 GB, both sides) and an 8-step
pair (~4.8 GB); the target's input differs from the reference's by 1e-6 noise, so no
tensor is skipped as bit-identical except those the noise cannot reach. Then runs the CLI
in a subprocess, warm page cache, and prints per pair: wall time, end-to-end MB/s (both
dumps' bytes over the wall time), peak RSS of the compare process and of its pool workers,
the verdict, and where the wall time went (start-up, index, measure, verdict, reports, exit:
``compare_phases.py``); then the start-up of ``opscope compare --help`` against a bare
Python. The CLI runs with bytecode cached, as an installed opscope has it (``PYTHONDONTWRITEBYTECODE``
is left out of its environment: the first run writes what the others read).

``--huge`` also writes a synthetic float32 pair of ~12 GB (holding both would need more than
10 GB; opscope's writer, not a model run) in a temporary folder, compares it, prints the
same figures and deletes it. Targets (issue #14): >= 1 GB/s on the small pair, >= 2 GB/s on
the large one, peak RSS <= 1 GB whatever the size, ``compare --help`` < 0.1 s.

``--many N`` writes a statistics-only pair of N small records per side (ops of one input and
one output: the index is all there is) and of N/4, compares both and prints the compare
process's peak RSS and what one more pair costs in it (the difference of the two peaks over
the difference of the pairs): once with every record in one partition (one rank's step:
memory follows the largest partition) and once spread over 4 ranks x 4 steps (memory should
not grow with the records; issue #14: <= 1 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import compare_phases  # this script's folder is on sys.path
from compare_phases import user_env

DUMP_MLP = """
import sys, torch, opscope
width, depth, batch, steps, out, noise = 2048, 3, 512, int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(1)
layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
xs = [torch.randn(batch, width, generator=torch.Generator().manual_seed(s)) for s in range(steps)]
xs = [x + noise * torch.randn(batch, width, generator=torch.Generator().manual_seed(99 + s)) if noise else x
      for s, x in enumerate(xs)]
with opscope.dump(out, data="tensor", steps=list(range(steps)), overwrite=True):
    for x in xs:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# The compare CLI in-process, reporting its own peak RSS and its pool workers' (KB on Linux).
CLI_RSS = """
import json, resource, sys
from opscope.cli.main import main
rc = main(sys.argv[1:])
me, pool = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
peak = {"compare": me.ru_maxrss, "workers": pool.ru_maxrss,
        "cpu_s": me.ru_utime + me.ru_stime + pool.ru_utime + pool.ru_stime}
print("RSS " + json.dumps(peak), file=sys.stderr)
sys.exit(rc)
"""


def opscope_cmd() -> list[str]:
    """The console script next to this Python (what a user types), else ``python -m opscope``."""
    script = Path(sys.executable).with_name("opscope")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "opscope"]


def mlp_pair(root: Path, steps: int) -> tuple[Path, Path]:
    """Target and reference dumps of ``steps`` steps of the wide MLP (kept when present)."""
    pair = []
    for side, noise in (("target", "1e-6"), ("reference", "0")):
        path = root / f"mlp{steps}-{side}"
        if not (path / "manifest.json").is_file():
            subprocess.run([sys.executable, "-W", "ignore", "-c", DUMP_MLP, str(steps), str(path), noise], check=True,
                           capture_output=True, timeout=3600)
        pair.append(path)
    return pair[0], pair[1]


def huge_pair(root: Path, gb: float) -> tuple[Path, Path]:
    """A synthetic float32 pair of ``gb`` GB in all: 64 MB tensors over 2 ranks x 2 steps,
    the target the reference plus 1e-4 noise (drawn once, scaled per tensor: generating is
    not what is measured)."""
    import numpy as np

    n = 16 << 20  # elements of 64 MB
    per_partition = max(1, int(gb * 1e9 / 2 / (n * 4) / 4 + 0.5))
    base = np.random.default_rng(42).standard_normal(n).astype(np.float32)
    noise = (1e-4 * np.random.default_rng(7).standard_normal(n)).astype(np.float32)
    for side, jitter in (("reference", 0.0), ("target", 1.0)):
        write_synthetic(root / f"huge-{side}", base, noise * np.float32(jitter), per_partition)
    return root / "huge-target", root / "huge-reference"


def write_synthetic(path: Path, base: object, noise: object, per_partition: int) -> None:
    import numpy as np

    from opscope.model.records import new_row
    from opscope.storage.writer import DumpWriter

    assert isinstance(base, np.ndarray) and isinstance(noise, np.ndarray)
    for rank in (0, 1):
        writer = DumpWriter(path, rank, {"tool": "bench", "run_id": f"huge-{path.name}"}, overwrite=True)
        writer.open()
        for step in (0, 1):
            rows = []
            for i in range(per_partition):
                scale = np.float32(1 + (rank * 1000 + step * 100 + i) * 1e-3)
                value = base * scale + noise * scale
                data = writer.add_tensor(step, f"r{i}", "float32", [value.size], value, value.nbytes)
                row = new_row(id=i, rank=rank, step=step, seq=i, phase="forward", module=f"layer{i}",
                              op="aten.mm.default", call=0, io="output", slot=0, dtype="float32", shape=[value.size],
                              numel=value.size, data=data, key=f"r{i}")
                row[-1] = (float(value.min()), float(value.max()), float(value.mean()), float(value.std()),
                           float(np.linalg.norm(value)), float(np.abs(value).max()), 0, 0, 0, None)
                rows.append(row)
                writer.check()
            writer.add_rows(step, rows)
            writer.end_step(step)
        writer.close()


def write_many(path: Path, records: int, noise: float, ranks: int = 1, steps: int = 1) -> None:
    """A statistics-only dump of ``records`` rows in all, spread evenly over ``ranks`` x
    ``steps`` partitions: ops of one input (the previous op's output) and one output over 97
    modules; ``noise`` shifts every statistic a little."""
    import numpy as np

    from opscope.storage.writer import DumpWriter

    ops = records // 2 // (ranks * steps)  # per partition
    base = np.random.default_rng(0).standard_normal((ops * ranks * steps, 6))
    base += noise * np.random.default_rng(1).standard_normal(base.shape)
    values = base.tolist()
    for rank in range(ranks):
        writer = DumpWriter(path, rank, {"tool": "bench", "run_id": f"many-{path.name}"}, overwrite=rank == 0)
        writer.open()
        for step in range(steps):
            first = (rank * steps + step) * ops
            writer.add_rows(step, _many_rows(values[first:first + ops], rank, step))
            writer.end_step(step)
        writer.close()


def _many_rows(values: list[list[float]], rank: int, step: int) -> list[list[object]]:
    from opscope.model.records import new_row

    rows: list[list[object]] = []
    for i, b in enumerate(values):
        stats = (b[0] - 3, b[1] + 3, b[2], 1 + abs(b[3]), 32 + abs(b[4]), 3 + abs(b[5]), 0, 0, 0, None)
        common = dict(rank=rank, step=step, seq=i, phase="forward", module=f"layers.{i % 97}.mlp",
                      op="aten.add.Tensor", call=i // 97, dtype="float32", shape=[8, 128], numel=1024, device="cpu",
                      slot=0)
        for io, producer in (("input", 2 * i - 1 if i else None), ("output", None)):
            row = new_row(id=len(rows), io=io, producer=producer, **common)
            row[-1] = stats
            rows.append(row)
    return rows


def many_rows(records: int, extra: list[str], layouts: tuple[tuple[int, int], ...] = ((1, 1), (4, 4))) -> None:
    """Peak RSS of compares of ``records`` and ``records // 4`` small records per side, and
    the bytes one more pair costs (written by another process, as the huge pair is): all in
    one partition (one rank's step: memory follows the largest partition), and spread over
    4 ranks x 4 steps (a realistic step holds 10k-100k ops: memory should not grow)."""
    for ranks, steps in layouts:
        peaks = {}
        where = "one partition" if ranks * steps == 1 else f"{ranks} ranks x {steps} steps"
        for n in (records // 4, records):
            peaks.update(_many_once(n, ranks, steps, where, extra))
        (few, low), (many, high) = sorted(peaks.items())
        print(f"memory per pair, {where}: {(high - low) * 1e6 / max(1, many - few):.0f} bytes (peak RSS "
              f"difference over {many - few} more pairs; target: a peak <= 1 GB that does not grow with "
              "the records)", flush=True)


def _many_once(n: int, ranks: int, steps: int, where: str, extra: list[str]) -> dict[int, float]:
    root = Path(tempfile.mkdtemp(prefix="opscope-e2e-many-"))
    try:
        write = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
                 "from bench_compare_e2e import write_many; "
                 f"write_many(Path({str(root / 'target')!r}), {n}, 1e-9, {ranks}, {steps}); "
                 f"write_many(Path({str(root / 'reference')!r}), {n}, 0.0, {ranks}, {steps})")
        subprocess.run([sys.executable, "-c", write], check=True, timeout=3600)
        start = time.perf_counter()
        rss = peak_rss(root / "target", root / "reference", root / "out", extra)
        wall = time.perf_counter() - start
        summary = json.loads((root / "out" / "summary.json").read_text())
        pairs = summary["counts"]["pairs"]
        print(f"statistics-only pair of {n} records per side ({where}): {pairs} pairs, verdict "
              f"{summary['verdict']}, {wall:.1f} s, {rss['cpu_s']:.1f} CPU-s, peak RSS {rss['compare']} MB "
              f"compare process ({rss['compare'] * 1e6 / max(1, pairs):.0f} bytes a pair in all)", flush=True)
        return {pairs: rss["compare"]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def compare_cli(target: Path, reference: Path, out: Path, extra: list[str]) -> tuple[float, str, int]:
    """One run as the user runs it (the full terminal report, the files): wall seconds, the
    verdict with the first divergence (from the report), exit code."""
    start = time.perf_counter()
    proc = subprocess.run([*opscope_cmd(), "compare", str(target), str(reference), "-o", str(out), *extra],
                          capture_output=True, text=True, timeout=3600, env=user_env())
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"opscope compare failed ({proc.returncode}): {proc.stderr[-800:]}")
    summary = json.loads((out / "summary.json").read_text())
    first = summary.get("first_divergence") or {}
    verdict = summary["verdict"] + (f" at {first.get('module')} {first.get('op')} step {first.get('step')} "
                                    f"rank {first.get('rank')}" if first else "")
    return wall, verdict, proc.returncode


def peak_rss(target: Path, reference: Path, out: Path, extra: list[str]) -> dict[str, float]:
    """Peak RSS (MB) of the compare process and of the largest pool worker, and the CPU
    seconds of both (user + system: what the compare costs whatever else loads the machine)."""
    proc = subprocess.run([sys.executable, "-c", CLI_RSS, "compare", str(target), str(reference), "-o", str(out),
                           *extra], capture_output=True, text=True, timeout=3600, env=user_env())
    line = next((ln for ln in proc.stderr.splitlines() if ln.startswith("RSS ")), None)
    if line is None:
        raise RuntimeError(f"no RSS line from the compare: {proc.stderr[-800:]}")
    peak = json.loads(line[4:])
    return {"compare": peak["compare"] // 1024, "workers": peak["workers"] // 1024, "cpu_s": peak["cpu_s"]}


def measure_pair(name: str, target: Path, reference: Path, root: Path, repeat: int, extra: list[str]) -> dict:
    nbytes = size(target) + size(reference)
    compare_cli(target, reference, root / "out", extra)  # warms the page cache
    walls, verdict = [], ""
    for _ in range(repeat):
        wall, verdict, _ = compare_cli(target, reference, root / "out", extra)
        walls.append(wall)
    rss = peak_rss(target, reference, root / "out", extra)
    phases = compare_phases.median_phases(["compare", str(target), str(reference), "-o", str(root / "out"), *extra],
                                          repeat)
    best = min(walls)
    row = {"pair": name, "gb": nbytes / 1e9, "wall_s": best, "mb_s": nbytes / 1e6 / best, "rss": rss,
           "verdict": verdict, "walls": walls}
    workers = f"{rss['workers']} MB largest pool worker" if rss["workers"] else "no pool worker (threads)"
    print(f"{name}: {nbytes / 1e9:.2f} GB (both dumps) in {best:.2f} s (best of {repeat}: "
          f"{', '.join(f'{w:.2f}' for w in walls)}) = {row['mb_s']:.0f} MB/s end to end; peak RSS "
          f"{rss['compare']} MB compare process, {workers}; CPU {rss['cpu_s']:.2f} s "
          f"in all ({nbytes / 1e6 / rss['cpu_s']:.0f} MB per CPU-second); verdict: {verdict}",
          flush=True)
    print(f"  {name}, median of {repeat}: {compare_phases.line(phases)}", flush=True)
    return row


def help_time(repeat: int = 7) -> tuple[tuple[float, float], tuple[float, float]]:
    """Best (wall, CPU) seconds of ``opscope compare --help`` and of a bare ``python -c pass``."""
    import resource

    def best(cmd: list[str]) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, env=user_env())
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        return min(walls), min(cpus)

    return best([*opscope_cmd(), "compare", "--help"]), best([sys.executable, "-c", "pass"])


# ---- slot: local vs Dask (issue #14 item 3, added by the Dask work) ----------------------
def dask_vs_local(target: Path, reference: Path, local: dict, root: Path) -> None:
    """Local vs 2-worker Dask time on the ~5 GB pair, with the verdicts compared.

    ``local`` is the local row of :func:`measure_pair` for this pair (wall_s, verdict, ...).
    The measurement is ``bench_compare_dask.dask_vs_local`` (a loopback cluster, needs opscope[dask]).
    """
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        print("dask: not measured (pip install 'opscope[dask]')")
        return
    from bench_compare_dask import dask_vs_local as measure  # this script's folder is on sys.path

    measure(target, reference, local, root)
# ---- end of slot ---------------------------------------------------------------------------


def mlp_rows(root: Path, args: argparse.Namespace, extra: list[str]) -> None:
    small = mlp_pair(root, 1)
    large = mlp_pair(root, 8)
    one = measure_pair("1-step MLP pair", *small, root, args.repeat, extra)
    local = measure_pair("8-step MLP pair", *large, root, args.repeat, extra)
    cpu = local["rss"]["cpu_s"] / one["rss"]["cpu_s"]
    print(f"scaling: {local['gb'] / one['gb']:.1f}x the bytes took {cpu:.1f}x the CPU seconds and "
          f"{local['wall_s'] / one['wall_s']:.1f}x the wall time")
    if not args.no_dask:
        dask_vs_local(*large, local, root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default=None, help="create (or reuse) the MLP dumps here and keep them")
    parser.add_argument("--huge", action="store_true", help="also compare a ~12 GB synthetic pair (deleted after)")
    parser.add_argument("--huge-gb", type=float, default=12.0)
    parser.add_argument("--huge-only", action="store_true", help="only the synthetic huge pair (with --huge)")
    parser.add_argument("--many", type=int, default=0, metavar="N",
                        help="also compare statistics-only pairs of N and N/4 small records per side")
    parser.add_argument("--many-only", action="store_true", help="only the many-records pairs (with --many)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=None, help="--workers for the CLI (default: its own)")
    parser.add_argument("--no-dask", action="store_true", help="skip the local vs Dask row")
    args = parser.parse_args()
    extra = ["--workers", str(args.workers)] if args.workers else []
    root = Path(args.keep or tempfile.mkdtemp(prefix="opscope-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} cores; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    try:
        if not (args.huge_only or args.many_only):
            mlp_rows(root, args, extra)
        if args.huge:
            huge_root = Path(tempfile.mkdtemp(prefix="opscope-e2e-huge-"))
            try:
                # written by another process: a child's peak RSS starts at its parent's at the fork
                # (Linux keeps the high-water mark across exec), and writing holds ~0.7 GB
                write = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
                         "from bench_compare_e2e import huge_pair; "
                         f"huge_pair(Path({str(huge_root)!r}), {args.huge_gb})")
                subprocess.run([sys.executable, "-c", write], check=True, timeout=3600)
                pair = huge_root / "huge-target", huge_root / "huge-reference"
                measure_pair("synthetic huge pair", *pair, huge_root, 1, extra)
            finally:
                shutil.rmtree(huge_root, ignore_errors=True)
        if args.many:
            many_rows(args.many, extra)
        (help_wall, help_cpu), (bare_wall, bare_cpu) = help_time()
        print(f"opscope compare --help: {help_wall:.3f} s wall, {help_cpu:.3f} s CPU (a bare python -c pass: "
              f"{bare_wall:.3f} s wall, {bare_cpu:.3f} s CPU; target < 0.1 s)")
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
