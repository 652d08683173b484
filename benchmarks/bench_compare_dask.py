"""Local vs a 2-worker Dask cluster on the ~5 GB pair: ``opscope compare ... --scheduler ADDRESS``.

    python benchmarks/bench_compare_dask.py [--keep DIR] [--repeat 3] [--steps 8]

Uses the 8-step wide-MLP pair of ``bench_compare_e2e.py`` (created there, ~4.8 GB both sides),
starts a loopback cluster (a scheduler and 2 worker processes of 1 thread each, as
``dask scheduler`` / ``dask worker --nthreads 1`` would), and runs the CLI as a user does,
locally (every core) and with ``--scheduler``, in alternation, page cache warm. Prints both
wall and CPU seconds, their ratio, and whether the verdict lines, summary.json (less elapsed time and
worker count) and pairs.csv are equal. ``bench_compare_e2e.py`` calls :func:`dask_vs_local`
for its Dask row.

On one machine a cluster cannot beat the local pool (the same 2 cores, plus task and
scheduler overhead); the figure shows what the cluster path costs, and that it gives the
same answer. Its gain is on many machines, each reading its share from shared storage.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_compare_e2e import compare_cli, mlp_pair, size  # noqa: E402  (the e2e benchmark's dumps and CLI run)


def _same_files(a: Path, b: Path) -> bool:
    """summary.json (less elapsed time and worker count) and pairs.csv equal in both outputs."""
    summaries = []
    for out in (a, b):
        summary = json.loads((out / "summary.json").read_text())
        summary.pop("elapsed_s", None)
        summary.get("settings", {}).pop("workers", None)
        summaries.append(summary)
    return summaries[0] == summaries[1] and (a / "pairs.csv").read_bytes() == (b / "pairs.csv").read_bytes()


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _timed(target: Path, reference: Path, out: Path, extra: list[str], client: Any) -> tuple[float, float, str]:
    """One CLI run: wall seconds, CPU seconds (the CLI and its pool, plus the cluster's workers
    when ``extra`` names one: their background work included), verdict line."""
    workers = sum(client.run(_cpu, resource.RUSAGE_SELF).values()) if extra else 0.0
    children = _cpu(resource.RUSAGE_CHILDREN)  # the CLI process and its pool, once reaped
    wall, verdict, _ = compare_cli(target, reference, out, extra)
    cpu = _cpu(resource.RUSAGE_CHILDREN) - children
    if extra:
        cpu += sum(client.run(_cpu, resource.RUSAGE_SELF).values()) - workers
    return wall, cpu, verdict


def dask_vs_local(target: Path, reference: Path, local: dict, root: Path, repeat: int = 2) -> dict:
    """Local vs 2-worker Dask time on one pair, with the verdicts compared; prints one line.

    The CLI runs alternate, local then Dask, ``repeat`` times (a load that changes meanwhile
    then weighs on both); the best of each is reported, wall and CPU seconds. ``local`` is the
    local row of ``bench_compare_e2e.measure_pair`` for this pair (its ``verdict``; its
    ``wall_s`` is printed beside this run's own local figure).
    """
    from distributed import Client, LocalCluster

    with (LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=":0",
                       local_directory=str(root)) as cluster,
          Client(cluster, set_as_default=False) as client):
        extra = ["--scheduler", cluster.scheduler_address]
        client.wait_for_workers(2)
        compare_cli(target, reference, root / "out-dask", extra)  # warms the workers' imports and page cache
        runs: dict[str, list[tuple[float, float, str]]] = {"local": [], "dask": []}
        for _ in range(repeat):
            runs["local"].append(_timed(target, reference, root / "out-local", [], client))
            runs["dask"].append(_timed(target, reference, root / "out-dask", extra, client))
        idle = sum(client.run(_cpu, resource.RUSAGE_SELF).values())
        time.sleep(5)
        idle = (sum(client.run(_cpu, resource.RUSAGE_SELF).values()) - idle) / 5
    (best_local, local_cpu, _), (best, dask_cpu, verdict) = (min(runs[k]) for k in ("local", "dask"))
    nbytes = size(target) + size(reference)
    equal = len({v for rows in runs.values() for _, _, v in rows} | {local["verdict"]}) == 1
    same = equal and _same_files(root / "out-local", root / "out-dask")
    print(f"dask, 2 workers x 1 thread on loopback: {best:.2f} s (best of {repeat}: "
          f"{', '.join(f'{w:.2f}' for w, _, _ in runs['dask'])}) = {nbytes / 1e6 / best:.0f} MB/s; local in "
          f"alternation {best_local:.2f} s ({', '.join(f'{w:.2f}' for w, _, _ in runs['local'])}; before: "
          f"{local['wall_s']:.2f} s); dask/local = {best / best_local:.2f}x; CPU s of those runs: local "
          f"{local_cpu:.1f}, dask {dask_cpu:.1f} (its workers idle: {idle:.2f} CPU-s per s); verdicts "
          f"{'equal' if equal else 'DIFFER'} ({verdict}); summary.json and pairs.csv {'equal' if same else 'DIFFER'}",
          flush=True)
    return {"local_s": best_local, "dask_s": best, "local_cpu_s": local_cpu, "dask_cpu_s": dask_cpu,
            "runs": runs, "verdicts_equal": equal, "files_equal": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", default=None, help="create (or reuse) the MLP dumps here and keep them")
    parser.add_argument("--steps", type=int, default=8, help="steps of the MLP pair (8: ~4.8 GB both sides)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="opscope-dask-"))
    root.mkdir(parents=True, exist_ok=True)
    outputs = Path(tempfile.mkdtemp(prefix="opscope-dask-out-"))
    print(f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    try:
        target, reference = mlp_pair(root, args.steps)
        wall, verdict, _ = compare_cli(target, reference, outputs / "out-local", [])  # warms the page cache
        print(f"local (every core), first run: {wall:.2f} s; {verdict}", flush=True)
        dask_vs_local(target, reference, {"wall_s": wall, "verdict": verdict}, outputs, args.repeat)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        shutil.rmtree(outputs, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
