"""A comparison judged a partition at a time, its pairs table written as it goes: the same
verdict, findings and table as the whole dump judged at once, and memory that follows the
largest partition, not the dump."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest
from synth import Run, gelu

import opscope
from opscope.compare import api, measure, pairs_file
from opscope.compare.mapping import load_mapping
from opscope.compare.partitioned import identify, order
from opscope.compare.table import pairs_table
from opscope.compare.tolerance import NoiseModel
from opscope.compare.verdict import run_passes
from opscope.report import compare_html
from opscope.report.compare_files import write_all
from opscope.storage.reader import load

FAULT = (1, 1)  # (rank, step) whose GELU is the tanh approximation in the target


def _trained(path: Path, fault: tuple[int, int] | None, ranks: int = 3, steps: int = 3) -> None:
    """Ranks of a tiny MLP whose weight is updated from each step's output: a fault at one
    step leaves the next steps' weight different (explained by the step before, not a root)."""
    for rank in range(ranks):
        run = Run(path, rank=rank, run_id="run-1")
        rng = np.random.default_rng(rank)
        x0, w = rng.standard_normal((8, 16)), rng.standard_normal((16, 32)) * 0.25
        for step in range(steps):
            x, p = run.leaf(x0 + step), run.leaf(w, param="fc.weight")
            (h,) = run.op("aten.mm.default", [x, p], [x.value.astype(np.float64) @ p.value], module="fc")
            (g,) = run.op("aten.gelu.default", [h], [gelu(h.value.astype(np.float64), (rank, step) == fault)],
                          module="act")
            run.op("aten.sum.default", [g], [np.asarray(g.value.astype(np.float64).sum())])
            run.end_step()
            w = w - 1e-2 * float(g.value.mean())  # the "optimizer": the next step's weight
        run.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trained")
    _trained(root / "target", FAULT)
    _trained(root / "reference", None)
    return root / "target", root / "reference"


def _at_once(target: Path, reference: Path) -> tuple[pa.Table, list[dict[str, Any]]]:
    """The pairs table and findings with every partition judged together (before this work)."""
    t_dump, r_dump, noise, problems = load(target), load(reference), NoiseModel(), []
    pairs = [p for rank, step in api._partitions(t_dump, r_dump, None, None, problems)
             for p in api._align(t_dump, r_dump, rank, step, load_mapping(None), problems)]
    jobs = measure.plan(pairs, noise)
    measure.run(jobs, pairs, str(target), str(reference), workers=1)
    state = run_passes(pairs, noise)
    identify(state)
    pairs.sort(key=order)
    return pairs_table(pairs), [f.to_dict() for f in state.findings]


def test_partitions_judged_apart_and_written_as_they_go_equal_the_whole_at_once(
        trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole, findings = _at_once(*trained)
    monkeypatch.setattr(api, "WINDOW_PAIRS", 1)  # one partition a window
    monkeypatch.setattr(pairs_file, "SPILL_ROWS", 7)  # the table goes to its file, 7 rows at a time
    monkeypatch.setattr(pairs_file, "PREVIEW_ROWS", 10)
    result = opscope.compare(*trained, workers=1)
    assert result.pairs_file.path is not None and result.pairs_file.num_rows == whole.num_rows > 7 * 4
    assert result.pairs_table.equals(whole)
    assert [f.to_dict() for f in result.culprits] == findings
    first = result.first_divergence
    assert first is not None and (first.rank, first.step, first.op) == (1, 1, "aten.gelu.default")
    later = [f for f in result.culprits if f.rank == 1 and f.step == 2]
    assert not any(f.kind == "root" for f in later)  # the carried step said where the weight's error came from
    assert (result.ranks, result.steps) == ([0, 1, 2], [0, 1, 2])
    write_all(result, tmp_path / "out")
    pcsv.write_csv(whole, tmp_path / "whole.csv")
    assert (tmp_path / "out" / "pairs.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "out" / "pairs.parquet").equals(whole)
    preview, truncated = result.pairs_file.preview(10)
    statuses = whole.column("status").to_pylist()
    important = [i for i, s in enumerate(statuses) if s not in ("identical", "passed")][:10]
    rest = [i for i, s in enumerate(statuses) if s in ("identical", "passed")][:10 - len(important)]
    assert truncated and preview.column("order").to_pylist() == sorted(important + rest)
    monkeypatch.setattr(compare_html, "MAX_ROWS", 10)
    page = compare_html._pairs(result)  # what report.html embeds
    assert (page["rows"], page["total"], page["truncated"]) == (10, whole.num_rows, True)
    assert page["columns"]["order"] == sorted(important + rest)


def _chain(path: Path, ranks: int, steps: int, ops: int) -> None:
    """Statistics-only partitions of ``ops`` small ops each, the target a little off."""
    for side, noise in ((path / "target", 1e-3), (path / "reference", 0.0)):
        for rank in range(ranks):
            run = Run(side, rank=rank, data="statistics", run_id="chain")
            for _ in range(steps):
                x = run.leaf(np.ones(4))
                for i in range(ops):
                    (x,) = run.op("aten.add.Tensor", [x], [x.value + 1 + noise], module=f"layers.{i % 8}")
                run.end_step()
            run.close()


def _peak(target: Path, reference: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        result = opscope.compare(target, reference, workers=1)
        return tracemalloc.get_traced_memory()[1], result.counts["pairs"]
    finally:
        tracemalloc.stop()


def test_memory_follows_the_largest_partition_not_the_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _chain(tmp_path / "two", 1, 2, 150)
    _chain(tmp_path / "eight", 2, 4, 150)
    monkeypatch.setattr(api, "WINDOW_PAIRS", 1)
    monkeypatch.setattr(pairs_file, "SPILL_ROWS", 300)
    monkeypatch.setattr(pairs_file, "PREVIEW_ROWS", 100)
    two, pairs_two = _peak(tmp_path / "two" / "target", tmp_path / "two" / "reference")
    eight, pairs_eight = _peak(tmp_path / "eight" / "target", tmp_path / "eight" / "reference")
    assert pairs_eight == 4 * pairs_two == 4 * 2 * 2 * 150  # an input and an output pair an op
    # whole-dump judging held every pair to the end (~5 KB each: 4x the peak); now a window
    assert eight < 1.25 * two, (two, eight)
