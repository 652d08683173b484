"""Two-pass dumping: statistics first, compare, then full tensors only for the culprits and
the ops that made their inputs; a size estimate before capture; a tensor limit that stops
tensor capture, never the run."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "replay"))
import runs  # noqa: E402

import opscope  # noqa: E402
from opscope.capture.torch.suspects import TensorDumpSize  # noqa: E402
from opscope.report.compare_files import write_all  # noqa: E402


@pytest.fixture(scope="module")
def first_pass(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_pass")
    t = runs.train(root / "t1", autocast=True, wrong_gelu=True, data="statistics")
    r = runs.train(root / "r1", data="statistics")
    result = opscope.compare(t, r, workers=1, replay=1)
    write_all(result, root / "out1", html=False)
    return root, result


def test_statistics_first_pass_cannot_replay_and_says_how(first_pass):
    _, result = first_pass
    assert result.culprits[0].replay["verdict"] == "not_replayable"
    assert "suspects" in result.culprits[0].replay["reason"]


def test_second_pass_captures_only_suspects_and_replay_blames_the_kernel(first_pass):
    root, first = first_pass
    (root / "cfg.json").write_text(json.dumps({"dump": {"suspects": str(root / "out1"), "data": "statistics"}}))
    with pytest.warns(TensorDumpSize, match=r"two-pass capture .* about .* at step 0 \(from the first-pass records"):
        t2 = runs.train(root / "t2", autocast=True, wrong_gelu=True, config=str(root / "cfg.json"), data="statistics")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TensorDumpSize)
        r2 = runs.train(root / "r2", suspects=str(root / "out1" / "summary.json"), data="statistics")
    dump = opscope.load(t2)
    wanted = {tuple(k) for c in first.culprits if c.calls for side in c.calls.values() for k in side["capture"]}
    stored = [r for r in dump.records().to_pylist() if r["data"] and r["producer"] is None]
    assert stored and all((r["phase"], r["module"], r["op"], r["call"]) in wanted for r in stored)
    assert len(stored) < 40  # statistics for everything else (a step has ~1000 rows)
    capture = dump.manifest["tensor_capture"]
    assert capture["estimate"]["bytes_per_step"]["0"] == capture["stored_bytes"] > 0  # the estimate was exact
    result = opscope.compare(t2, r2, workers=1, replay=1)
    assert result.first_divergence.op == "aten.gelu.default"
    assert result.first_divergence.replay["verdict"] == "target_wrong"


def test_tensor_limit_stops_tensor_capture_not_the_run(tmp_path):
    with pytest.warns(TensorDumpSize, match="tensor capture stopped at the limit tensor_limit_mb=0.02"):
        path = runs.train(tmp_path / "d", steps=2, tensor_limit_mb=0.02)
    dump = opscope.load(path)
    assert dump.status == "complete" and dump.steps() == [0, 1]
    stopped = dump.manifest["tensor_capture"]["stopped"]
    assert stopped["step"] == 0 and stopped["op"].startswith("aten.")
    assert any("tensor capture stopped" in n for n in dump.manifest["notes"])
    assert dump.manifest["tensor_capture"]["stored_bytes"] <= 0.02 * 2**20
    rows = dump.records().to_pylist()
    assert any(r["data"] for r in rows) and not any(r["data"] for r in rows if r["step"] == 1)


@pytest.mark.parametrize("keys, message", [
    ({"suspects": "no/such/dir"}, "has no summary.json"),
    ({"tensor_limit_mb": -1}, "tensor_limit_mb"),
])
def test_bad_two_pass_keys_are_refused_before_capture(tmp_path, keys, message):
    with pytest.raises(opscope.ConfigError, match=message):
        opscope.dump(tmp_path / "d", **keys)
