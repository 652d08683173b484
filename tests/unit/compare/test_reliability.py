"""Broken, partial and odd dumps: compare what can be compared, say what was skipped."""

import json

import numpy as np
import pytest
import synth

import opscope
from opscope.errors import NothingToCompareError


def test_truncated_tensor_shard_falls_back_to_statistics(tmp_path):
    ref = synth.mlp_run(tmp_path / "r", steps=2)
    target = synth.mlp_run(tmp_path / "t", steps=2, fault="gelu_tanh")
    shard = target / "rank0" / "step0" / "tensors-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    result = opscope.compare(target, ref)
    assert any("truncated" in p or "cut off" in p for p in result.problems)
    assert result.statistics_only and result.first_divergence.op == "aten.gelu.default"


def test_corrupt_records_shard_is_skipped_and_named(tmp_path):
    ref = synth.mlp_run(tmp_path / "r", steps=2)
    target = synth.mlp_run(tmp_path / "t", steps=2)
    (target / "rank0" / "step1" / "records-00000.parquet").write_bytes(b"not parquet at all")
    result = opscope.compare(target, ref)
    assert any("records-00000.parquet: unreadable" in p for p in result.problems)
    assert any("step 1 has no readable records in the target" in p for p in result.problems)
    assert result.verdict == "identical" or result.counts["pairs"] > 0


def test_step_on_one_side_only_and_running_dump(tmp_path):
    ref = synth.mlp_run(tmp_path / "r", steps=1)
    target = synth.mlp_run(tmp_path / "t", steps=2, status="running")
    result = opscope.compare(target, ref)
    assert "rank 0 step 1 is in the target only: skipped" in result.problems
    assert any("still marked running" in p for p in result.problems)
    assert result.counts["pairs"] == 12


def test_older_format_version_is_read(tmp_path):
    ref = synth.mlp_run(tmp_path / "r")
    target = synth.mlp_run(tmp_path / "t")
    manifest = target / "manifest.json"
    data = json.loads(manifest.read_text())
    data["format_version"] = "0.9"
    manifest.write_text(json.dumps(data))
    assert opscope.compare(target, ref).verdict == "identical"


def test_mismatched_models_compare_nothing(tmp_path):
    ref = synth.mlp_run(tmp_path / "r")
    run = synth.Run(tmp_path / "t")
    x = run.leaf(np.ones((3, 5)))
    run.op("aten.mm.default", [x], [np.ones((3, 7))], module="fc1")
    run.close()
    with pytest.raises(NothingToCompareError, match="nothing could be compared"):
        opscope.compare(tmp_path / "t", ref)


def test_no_dump_at_all(tmp_path):
    from opscope.errors import DumpFormatError

    with pytest.raises(DumpFormatError):
        opscope.compare(tmp_path, tmp_path)


def _flip_run(path, reverse: bool):
    """One op whose output holds the same labels on both sides, in reverse order on one."""
    run = synth.Run(path)
    x = run.leaf(np.arange(64, dtype=np.int64).reshape(8, 8), "int64")
    out = x.value[::-1].copy() if reverse else x.value.copy()
    run.op("aten.clone.default", [x], [out], module="m")
    run.end_step()
    run.close()
    return path


def test_an_unreadable_tensor_is_judged_as_a_dump_without_tensors(tmp_path):
    """Its pair falls back to statistics the way a statistics dump's pair is judged: equal
    statistics with another hash are contents that differ, here labels in another order (the
    fallback looked at no hash before, and called the op's output passed)."""
    ref = _flip_run(tmp_path / "r", reverse=False)
    target = _flip_run(tmp_path / "t", reverse=True)
    shard = next((target / "rank0" / "step0").glob("tensors-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])
    result = opscope.compare(target, ref)
    assert any("truncated" in p or "cut off" in p for p in result.problems)
    row = next(r for r in result.pairs_table.to_pylist() if r["op"] == "aten.clone.default" and r["io"] == "output")
    assert row["mode"] == "statistics" and "tensor unreadable" in row["note"] and row["status"] == "failed"
    assert result.first_divergence is not None and result.first_divergence.op == "aten.clone.default"
