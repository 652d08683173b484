"""Where a local measurement runs (compare/pool.py): threads of the compare process or a
process pool, and the C loop that reads and sums a whole tensor pair without the GIL. Each
must give the numbers the one-thread Python block loop gives, bit for bit, including blocks
that hold NaN or Inf, a last partial block, mixed dtypes and a dtype the kernel cannot read."""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from synth import to_bf16_bits

from opscope.compare import kernel, measure, pool
from opscope.compare import stream as S
from opscope.compare.metrics import register_metric, unregister_metric
from opscope.model.records import new_row
from opscope.storage.writer import DumpWriter

SHARD = "tensors-00000.safetensors"
needs_c = pytest.mark.skipif(not kernel.can_stream("float32", "float32"),
                             reason="the C kernel was not built (no compiler at install) or cannot stream here")


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """One partition; ``tensors``: key -> (opscope dtype, array as stored)."""
    writer = DumpWriter(path, 0, {"tool": "test"}, overwrite=True)
    writer.open()
    rows = []
    for i, (key, (dtype, value)) in enumerate(tensors.items()):
        writer.add_tensor(0, key, dtype, list(value.shape), value.tobytes(), value.nbytes)
        rows.append(new_row(id=i, rank=0, step=0, seq=i, phase="forward", module="m", op="aten.mm.default", call=i,
                            io="output", slot=0, dtype=dtype, shape=list(value.shape), numel=value.size,
                            data=SHARD, key=key))
    writer.add_rows(0, rows)
    writer.end_step(0)
    writer.close()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Target and reference of six tensors (~9 MB a side), and a job per tensor."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(3)

    def noisy(x: np.ndarray) -> np.ndarray:
        return (x + 1e-3 * rng.standard_normal(x.shape)).astype(x.dtype)

    big = rng.standard_normal(700_001).astype(np.float32)  # 10 full blocks of 65,536 and a partial one
    nan_t, inf_r = noisy(big), big.copy()
    nan_t[200_000], inf_r[500_000] = np.nan, np.inf  # two blocks the kernel leaves to the masked pass
    half = rng.standard_normal(300_000).astype(np.float32)
    ref = {"r0": ("float32", inf_r), "r1": ("float32", half), "r2": ("float16", half.astype(np.float16)),
           "r3": ("float64", big.astype(np.float64)), "r4": ("int32", np.arange(100_000, dtype=np.int32)),
           "r5": ("bfloat16", to_bf16_bits(half))}
    tgt = {"r0": ("float32", nan_t), "r1": ("bfloat16", to_bf16_bits(noisy(half))),
           "r2": ("float16", noisy(half).astype(np.float16)), "r3": ("float64", noisy(big.astype(np.float64))),
           "r4": ("int32", np.arange(100_000, dtype=np.int32) + (np.arange(100_000) % 7 == 0)),
           "r5": ("bfloat16", to_bf16_bits(noisy(half)))}
    write(root / "t", tgt)
    write(root / "r", ref)
    jobs = [measure.Job(0, 0, (SHARD, key, None), (SHARD, key, None), 1e-6, 1e-3, 0, ref[key][0] == tgt[key][0])
            for key in ref]
    return str(root / "t"), str(root / "r"), jobs


def bits(outcomes: list[measure.Outcome]) -> list[tuple[str, dict[str, object] | str]]:
    """Outcomes keyed by tensor, NaN as a string (so that equal means the same bits)."""
    def same(v: object) -> object:
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return sorted((job.t_ref[1], {k: same(v) for k, v in out.items()} if isinstance(out, dict) else out)
                  for job, out in outcomes)


@needs_c
def test_the_c_loop_gives_the_python_loops_bits(mixed, monkeypatch) -> None:
    target, reference, jobs = mixed
    before = S.READS.blocks
    in_c = measure.measure_batch(target, reference, jobs)
    blocks_in_c = S.READS.blocks - before
    monkeypatch.setattr(kernel, "can_stream", lambda a, b: False)
    before = S.READS.blocks
    in_python = measure.measure_batch(target, reference, jobs)
    assert bits(in_c) == bits(in_python)
    assert blocks_in_c == S.READS.blocks - before  # the same blocks, only read and summed in C
    r0 = dict(bits(in_c))["r0"]
    assert isinstance(r0, dict) and r0["nan_mismatch"] == 1 and r0["inf_mismatch"] == 1  # the masked pass ran
    assert all(isinstance(out, dict) for _, out in in_c)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_threads_and_processes_measure_what_one_thread_does(mixed, mode) -> None:
    target, reference, jobs = mixed
    alone = measure.measure_batch(target, reference, jobs)
    batches = [[job] for job in jobs]
    if mode == "threads":  # numpy's pass sums with BLAS, whose sums depend on its threads: one for all
        with measure.one_blas_thread():
            parts = pool.run_batches(functools.partial(measure.measure_batch, pin_blas=False), (target, reference),
                                     batches, workers=3, mode=mode)
    else:
        parts = pool.run_batches(measure.measure_batch, (target, reference), batches, workers=3, mode=mode)
    assert bits([o for part in parts for o in part]) == bits(alone)


def test_measure_run_in_a_pool_fills_the_pairs_as_alone(mixed, monkeypatch) -> None:
    """The whole path (batches, pool, results applied to their pairs), pool versus one thread."""
    target, reference, jobs = mixed

    class Pair:
        mode, metrics, note = "", None, ""

    monkeypatch.setattr(measure, "POOL_MIN_BYTES", 0)
    filled = {}
    for workers, mode in ((1, "auto"), (2, "threads"), (2, "processes")):
        pairs = [Pair() for _ in jobs]
        assert measure.run({job: [i] for i, job in enumerate(jobs)}, pairs, target, reference,  # type: ignore[arg-type]
                           workers=workers, pool=mode) == []
        filled[mode] = bits([(job, p.metrics) for job, p in zip(jobs, pairs)])
    assert filled["threads"] == filled["auto"] == filled["processes"]


def test_threads_are_chosen_only_when_every_block_leaves_the_gil() -> None:
    assert pool.choose("auto") == ("threads" if pool.threads_can_measure() else "processes")
    register_metric("test_pool_chunk_max", per_chunk=True, combine="max")(lambda t, r: float(t.max()))
    try:
        assert pool.choose("auto") == "processes"  # a Python metric on every chunk: the GIL would serialize it
    finally:
        unregister_metric("test_pool_chunk_max")
    with pytest.raises(ValueError, match="threads, processes"):
        pool.choose("fibers")


def test_a_task_given_to_while_measuring_runs_once_in_the_caller_while_batches_run() -> None:
    ran: list[int] = []
    released = threading.Event()

    def measure_batch(batch: int) -> str:  # waits for the task: it must run while batches are pending
        return "waited" if released.wait(10) else "the task never ran while measuring"

    def task() -> None:
        ran.append(threading.get_ident())
        released.set()

    pool.while_measuring(task)
    pool.while_measuring(task)  # waiting already: not twice
    assert pool.run_batches(measure_batch, (), [1, 2, 3, 4], workers=2, mode="threads") == ["waited"] * 4
    assert ran == [threading.get_ident()]
    pool.run_batches(measure_batch, (), [5], workers=2, mode="threads")
    assert len(ran) == 1  # once

    def broken() -> None:
        raise RuntimeError("the task failed")

    pool.while_measuring(broken)
    with pytest.raises(RuntimeError, match="the task failed"):
        pool.run_batches(measure_batch, (), [6], workers=2, mode="threads")


def test_the_cli_imports_what_follows_the_measurement_while_measuring(mixed, tmp_path) -> None:
    """Run as a user does (``python -m opscope``, a pool: threads), the compare imports the
    renderers while it measures, and the files it writes are whole and agree with a
    one-worker run in this process."""
    target, reference, _ = mixed
    probe = ("import sys\nfrom opscope.compare import measure, pool\nmeasure.POOL_MIN_BYTES = 0\n"
             "seen = []\n_run = pool.run_batches\n"
             "def run_batches(*a, **k):\n    out = _run(*a, **k)\n"
             "    seen.append(sorted(sys.modules))\n    return out\n"
             "pool.run_batches = run_batches\nfrom opscope.cli.main import main\n"
             "rc = main(sys.argv[1:])\nprint('MODULES', ' '.join(seen[0]))\nsys.exit(rc)\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", probe, "compare", target, reference, "-o", str(out), "--workers", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    modules = set(proc.stdout.split("MODULES ", 1)[1].split())
    assert {"opscope.report.compare_console", "opscope.report.compare_files", "rich.console"} <= modules
    from opscope.cli.main import main as cli

    alone = tmp_path / "alone"
    assert cli(["compare", target, reference, "-o", str(alone), "--workers", "1", "-q"]) == proc.returncode
    summaries = [json.loads((d / "summary.json").read_text()) for d in (out, alone)]
    for s in summaries:
        s.pop("elapsed_s", None)
        s.get("settings", {}).pop("workers", None)
    assert summaries[0] == summaries[1]
    assert (out / "pairs.csv").read_bytes() == (alone / "pairs.csv").read_bytes()
    assert (out / "report.html").read_text().rstrip().endswith("</html>")
