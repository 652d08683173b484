"""Compare at scale: many ranks and steps (rank paired with rank, --ranks/--steps, which ranks
diverge first), the streaming engine's memory bound, check-ranks on the same engine, the C
kernel against numpy's pass, and a --help that imports nothing heavy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from synth import Run, gelu

import opscope
from opscope.check_ranks import check_ranks
from opscope.cli.main import main as cli
from opscope.compare import kernel, measure
from opscope.compare import metrics as M
from opscope.compare import stream as S
from opscope.compare.accumulate import accumulate
from opscope.model.records import new_row
from opscope.report import render
from opscope.storage.writer import DumpWriter

RANKS, STEPS = (0, 1, 2, 3), (0, 1, 2)
FAULTS = {(2, 1), (3, 2)}  # (rank, step) whose GELU is the tanh approximation in the target


def ranked_dump(path, faults: set[tuple[int, int]]) -> None:
    """Four ranks of three steps of a tiny MLP (each rank its own input), one rank after the other."""
    for rank in RANKS:
        run = Run(path, rank=rank, run_id="run-1")
        rng = np.random.default_rng(rank)
        x0, w1, w2 = rng.standard_normal((8, 16)), rng.standard_normal((16, 32)) * 0.25, rng.standard_normal((32, 8))
        for step in STEPS:
            x, p1, p2 = run.leaf(x0 + step), run.leaf(w1, param="fc1.weight"), run.leaf(w2, param="fc2.weight")
            (h,) = run.op("aten.mm.default", [x, p1], [x.value.astype(np.float64) @ p1.value], module="fc1")
            tanh = (rank, step) in faults
            (g,) = run.op("aten.gelu.default", [h], [gelu(h.value.astype(np.float64), tanh)], module="act")
            (o,) = run.op("aten.mm.default", [g, p2], [g.value.astype(np.float64) @ p2.value], module="fc2")
            run.op("aten.sum.default", [o], [np.asarray(o.value.astype(np.float64).sum())])
            run.end_step()
        run.close()


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranked")
    ranked_dump(root / "target", FAULTS)
    ranked_dump(root / "reference", set())
    return root / "target", root / "reference"


def test_ranks_pair_rank_with_rank_and_the_earliest_diverging_rank_is_named(ranked) -> None:
    result = opscope.compare(*ranked, workers=1)
    assert result.verdict == "diverged" and (result.ranks, result.steps) == ([0, 1, 2, 3], [0, 1, 2])
    by_rank = {rank: (f.step, f.op) for rank, f in result.first_divergence_by_rank.items()}
    assert by_rank == {2: (1, "aten.gelu.default"), 3: (2, "aten.gelu.default")}
    assert (result.first_divergence.rank, result.first_divergence.step) == (2, 1)
    text = " ".join(render(result, "text").split())
    assert "ranks 4 compared (0-3), steps 0-2: 2 diverged, earliest first: rank 2 at step 1" in text
    assert text.index("rank 2 at step 1") < text.index("rank 3 at step 2")
    summary = result.to_summary()
    assert (summary["ranks"], sorted(summary["first_divergence_by_rank"])) == ([0, 1, 2, 3], ["2", "3"])


def test_ranks_and_steps_select_what_is_compared(ranked) -> None:
    healthy = opscope.compare(*ranked, ranks=[0, 1], workers=1)
    assert healthy.verdict != "diverged" and healthy.ranks == [0, 1]
    late = opscope.compare(*ranked, steps=[2], workers=1)
    assert {r: f.step for r, f in late.first_divergence_by_rank.items()} == {3: 2} and late.steps == [2]
    assert opscope.compare(*ranked, ranks=[2], steps=[0, 2], workers=1).verdict != "diverged"


def test_cli_ranks_steps_and_the_ranks_line(ranked, capsys) -> None:
    assert cli(["compare", *map(str, ranked), "--ranks", "2,3", "--steps", "1,2", "--workers", "1"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "ranks 2 compared (2-3), steps 1-2: 2 diverged, earliest first: rank 2 at step 1" in out
    assert cli(["compare", *map(str, ranked), "--ranks", "0,1", "-q"]) == 0


def test_a_rank_only_one_side_has_is_named(ranked, tmp_path) -> None:
    reference = tmp_path / "reference"
    for rank in (0, 1):
        run = Run(reference, rank=rank, run_id="run-2")
        run.op("aten.sum.default", [run.leaf(np.ones(4))], [np.asarray(4.0)])
        run.close()
    result = opscope.compare(ranked[0], reference, steps=[0], workers=1)
    assert "rank 3 step 0 is in the target only: skipped" in result.problems and result.ranks == [0, 1]


# -- the engine: streaming, bounded memory, C kernel ------------------------------------------
def pair_dump(path, values: dict[str, np.ndarray], views: dict[str, str] | None = None) -> None:
    """One partition of float32 tensors ``r0, r1, ...`` (a view row shares its base's data)."""
    writer = DumpWriter(path, 0, {"tool": "test"}, overwrite=True)
    writer.open()
    rows = []
    for i, (name, value) in enumerate(values.items()):
        data = writer.add_tensor(0, name, "float32", list(value.shape), value.tobytes(), value.nbytes)
        rows.append(new_row(id=i, rank=0, step=0, seq=i, phase="forward", module="m", op="aten.mm.default", call=i,
                            io="output", slot=0, dtype="float32", shape=list(value.shape), numel=value.size,
                            data=data, key=name, view=(views or {}).get(name)))
    writer.add_rows(0, rows)
    writer.end_step(0)
    writer.close()


def job(key: str, t_view: str | None = None, r_view: str | None = None) -> measure.Job:
    return measure.Job(0, 0, ("tensors-00000.safetensors", key, t_view), ("tensors-00000.safetensors", key, r_view),
                       1e-30, 1e-3, 0, True)


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(0)
    ref = {"r0": rng.standard_normal((512, 1024)).astype(np.float32)}  # 2 MB: 8 blocks of 256 KB
    tgt = {"r0": (ref["r0"] + np.float32(1e-3) * rng.standard_normal((512, 1024))).astype(np.float32)}
    pair_dump(root / "t", tgt)
    pair_dump(root / "r", ref)
    return root, tgt["r0"], ref["r0"]


def test_streaming_holds_one_block_per_side_and_measures_what_a_whole_read_does(big_pair) -> None:
    root, a, b = big_pair
    before = (S.READS.blocks, S.READS.whole)
    [(_, metrics)] = measure.measure_batch(str(root / "t"), str(root / "r"), [job("r0")])
    assert S.READS.blocks - before[0] == a.nbytes // S.BLOCK_BYTES and S.READS.whole == before[1]
    assert S.READS.largest_block <= S.BLOCK_BYTES < a.nbytes
    whole = M.finish(accumulate(a, b, rel_floor=1e-30, rtol=1e-3))
    for name in ("rel_l2", "max_abs", "cosine", "mean_rel", "out_of_tolerance", "max_rel"):
        assert metrics[name] == pytest.approx(whole[name], rel=1e-12), name


def test_a_transpose_view_streams_and_a_one_sided_view_is_read_whole(big_pair) -> None:
    root, a, b = big_pair
    transpose = json.dumps({"shape": [1024, 512], "stride": [1, 1024], "offset": 0})
    before = S.READS.whole
    [(_, streamed)] = measure.measure_batch(str(root / "t"), str(root / "r"), [job("r0", transpose, transpose)])
    assert S.READS.whole == before
    whole = M.finish(accumulate(a.T.copy(), b.T.copy(), rel_floor=1e-30, rtol=1e-3))
    assert streamed["rel_l2"] == pytest.approx(whole["rel_l2"], rel=1e-12)
    measure.measure_batch(str(root / "t"), str(root / "r"), [job("r0", transpose, None)])
    assert S.READS.whole == before + 2  # element orders may differ: not streamed


def test_a_truncated_shard_is_a_problem_named_not_a_crash(big_pair, tmp_path) -> None:
    root, a, _ = big_pair
    shutil.copytree(root / "t", tmp_path / "t")
    shard = tmp_path / "t" / "rank0" / "step0" / "tensors-00000.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    [(_, outcome)] = measure.measure_batch(str(tmp_path / "t"), str(root / "r"), [job("r0")])
    assert isinstance(outcome, str) and "truncated" in outcome


@pytest.mark.skipif(kernel.native is None, reason="the C kernel was not built (no compiler at install)")
def test_c_kernel_matches_numpy_and_its_portable_loop() -> None:
    rng = np.random.default_rng(1)
    b = rng.standard_normal(100_003).astype(np.float32)
    a = (b + np.float32(1e-4) * rng.standard_normal(b.size)).astype(np.float32)
    b[:50] = 0  # zeros and tiny values take the second division
    b[50:60] = 1e-30
    assert kernel.sums(a, "float32", b, "float32", 1e-6, 1e-3) is not None
    saved, kernel.native = kernel.native, None
    try:
        reference = accumulate(a, b, rel_floor=1e-6, rtol=1e-3)
    finally:
        kernel.native = saved
    fast = accumulate(a, b, rel_floor=1e-6, rtol=1e-3)
    for name in ("sum_sq_diff", "sum_abs_diff", "max_abs", "dot", "max_rel", "sum_rel", "sum_sq_elem_rel"):
        assert getattr(fast, name) == pytest.approx(getattr(reference, name), rel=1e-12), name
    assert fast.out_of_tolerance == reference.out_of_tolerance and fast.n == reference.n
    previous = kernel.native.set_simd(False)
    try:
        assert accumulate(a, b, rel_floor=1e-6, rtol=1e-3) == fast  # bit for bit
    finally:
        kernel.native.set_simd(previous)
    a[7], b[9] = np.nan, np.inf  # a block with NaN/Inf takes the masked pass
    masked = accumulate(a, b, rel_floor=1e-6, rtol=1e-3)
    assert (masked.nan_mismatch, masked.inf_mismatch, masked.n) == (1, 1, b.size - 2)


def test_check_ranks_measures_on_compares_engine(tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from test_check_ranks import params, write_rank

    write_rank(tmp_path, 0, tensors=True)
    write_rank(tmp_path, 1, tensors=True, changes={1: {("fc2.weight", "grad"): 0.5}})
    before = S.READS.blocks
    first = check_ranks(tmp_path).first
    assert S.READS.blocks > before
    grad = params(1, 0)[("fc2.weight", "grad")]
    assert first.rel_l2 == pytest.approx(0.5 * np.sqrt(grad.size) / np.linalg.norm(grad), rel=1e-6)
    assert first.max_abs_diff == pytest.approx(0.5, rel=1e-6)


def test_compare_help_imports_no_torch_pyarrow_numpy() -> None:
    probe = ("import sys\nfrom opscope.cli.main import main\ntry:\n    main(['compare', '--help'])\n"
             "except SystemExit:\n    pass\n"
             "print(sorted(m for m in ('torch', 'pyarrow', 'numpy', 'pandas', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "usage: opscope compare" in out and out.strip().splitlines()[-1] == "[]"
