"""MindSpore Data Dumps written by the real MindSpore 2.10 (tests/data/mindspore, made by
make_dumps.py) judged by the opscope CLI: the same run twice identical, float16 vs float32
within tolerance with no culprit, a one-layer fault named at its op and layer, an inserted
op that does not shift the pairing; show, and convert to opscope's own format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import opscope

DATA = Path(__file__).resolve().parents[1] / "data" / "mindspore"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "opscope.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def _compare(tmp_path: Path, target: str | Path, reference: str | Path,
             workers: str = "1") -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "out"
    run = _cli("compare", str(DATA / target), str(DATA / reference), "-o", str(out), "--workers", workers)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    assert {p.name for p in out.iterdir()} >= {"summary.json", "pairs.csv", "report.html"}
    return run.returncode, json.loads((out / "summary.json").read_text()), run.stdout


def test_same_run_twice_is_identical(tmp_path: Path) -> None:
    rc, summary, _ = _compare(tmp_path, "rerun", "reference")
    assert (rc, summary["verdict"]) == (0, "identical")
    counts = summary["counts"]
    assert counts["pairs"] == counts["identical"] > 700 and counts["unpaired_target"] == 0


def test_float16_against_float32_is_within_tolerance(tmp_path: Path) -> None:
    rc, summary, _ = _compare(tmp_path, "fp16", "reference")
    assert (rc, summary["verdict"], summary["culprits"]) == (0, "within_tolerance", [])
    counts = summary["counts"]
    assert counts["failed"] == 0 and counts["passed"] > 150  # float16 rounding, judged as such
    # MindSpore's own defects are said, not judged: files of another dtype than their kernel's
    assert any("dtype other than their kernel's" in p for p in summary["problems"])
    assert any("step 1 is in the reference only" in p for p in summary["problems"])


def test_one_layer_fault_is_named_at_its_op_and_layer(tmp_path: Path) -> None:
    rc, summary, stdout = _compare(tmp_path, "fault", "reference")
    first = summary["first_divergence"]
    assert (rc, summary["verdict"]) == (1, "diverged")
    assert (first["module"], first["op"], first["phase"], first["io"], first["slot"]) == (
        "b1.norm2", "mindspore.LayerNorm", "forward", "input", 5)  # the epsilon, an input like any other
    assert len(summary["culprits"]) == 1  # everything after it inherits
    assert "b1.norm2" in stdout


def test_inserted_op_does_not_shift_the_pairing(tmp_path: Path) -> None:
    rc, summary, _ = _compare(tmp_path, "inserted", "reference")
    first = summary["first_divergence"]
    assert (rc, first["kind"], first["module"], first["op"]) == (1, "culprit", "b1.fc2", "mindspore.Mul")
    assert first["metrics"]["error"] == pytest.approx(1e-3, rel=1e-3)  # the x1.001 itself
    assert len(summary["culprits"]) == 1
    assert summary["counts"]["unpaired_reference"] == 0  # every reference op found its partner
    d = opscope.compare(DATA / "inserted", DATA / "reference", workers=1)
    table = d.pairs_table.to_pylist()
    after = [p for p in table if p["module"] == "head" and p["op"] == "mindspore.MatMul" and p["phase"] == "forward"]
    assert after and all(p["kind"] == "exact" for p in after)  # ops after the insertion pair as before


def test_statistic_dumps(tmp_path: Path) -> None:
    rc, summary, _ = _compare(tmp_path, "statistic_fault", "statistic_reference")
    first = summary["first_divergence"]
    assert rc == 1 and summary["statistics_only"]
    assert (first["module"], first["op"], first["slot"]) == ("b1.norm2", "mindspore.LayerNorm", 5)


def test_show(tmp_path: Path) -> None:
    run = _cli("show", str(DATA / "reference"))
    assert run.returncode == 0, run.stderr
    assert "rank 0     steps 0-1" in run.stdout and "forward:" in run.stdout and "optimizer:" in run.stdout


def test_convert_to_opscope_keeps_the_verdicts(tmp_path: Path) -> None:
    for case in ("fault", "reference"):
        run = _cli("convert", str(DATA / case), "--to", "opscope", "-o", str(tmp_path / case))
        assert run.returncode == 0, run.stdout + run.stderr
        assert (tmp_path / case / "manifest.json").is_file()
    converted = opscope.load(tmp_path / "fault")
    assert type(converted).__name__ == "Dump" and converted.partitions() == [(0, 0)]
    result = opscope.compare(tmp_path / "fault", tmp_path / "reference", workers=1)
    direct = opscope.compare(DATA / "fault", DATA / "reference", workers=1)
    assert result.verdict == direct.verdict == "diverged"
    assert (result.first_divergence.module, result.first_divergence.op) == (
        direct.first_divergence.module, direct.first_divergence.op) == ("b1.norm2", "mindspore.LayerNorm")


def test_worker_processes_reopen_the_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    from opscope.compare import measure

    monkeypatch.setattr(measure, "POOL_MIN_BYTES", 0)  # a pool even for these small dumps
    pooled = opscope.compare(DATA / "fault", DATA / "reference", workers=2)
    inline = opscope.compare(DATA / "fault", DATA / "reference", workers=1)
    assert pooled.counts == inline.counts and pooled.bytes_compared == inline.bytes_compared > 0
    assert (pooled.first_divergence.module, pooled.first_divergence.slot) == ("b1.norm2", 5)

