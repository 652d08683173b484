"""`opscope compare --replay N` and `opscope replay` driven as a user would, in a subprocess."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
HERE = Path(__file__).resolve().parents[1] / "unit" / "replay"
sys.path.insert(0, str(HERE))
import runs  # noqa: E402


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay_cli")
    return runs.train(root / "bf16-wrong-gelu", autocast=True, wrong_gelu=True), runs.train(root / "fp32")


def test_compare_replay_names_the_wrong_side(dumps, run_cli, tmp_path):
    proc = run_cli("compare", *dumps, "--replay", "2", "--workers", "1", "-o", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "target wrong" in proc.stdout and "aten.gelu.default" in proc.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    first = summary["first_divergence"]
    assert first["replay"]["verdict"] == "target_wrong"
    assert first["replay"]["target"]["dtype"] == "bfloat16" and first["replay"]["reference"]["status"] == "ok"
    # the id from the compare output replays the same op, without comparing again
    proc = run_cli("replay", *dumps, "--op", first["id"], "--summary", tmp_path / "out")
    assert proc.returncode == 1 and "verdict: target wrong" in proc.stdout, proc.stdout + proc.stderr


def test_replay_first_as_json(dumps, run_cli):
    proc = run_cli("replay", *dumps, "--op", "first", "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["op"], out["verdict"]) == ("aten.gelu.default", "target_wrong")


def test_replay_of_a_bad_id_exits_2_with_a_message(dumps, run_cli):
    proc = run_cli("replay", *dumps, "--op", "gelu")
    assert proc.returncode == 2 and "is not an id" in proc.stderr


def test_custom_op_missing_in_the_replay_process(run_cli, tmp_path):
    import torch

    import opscope

    lib = torch.library.Library("opscope_cli", "DEF")
    lib.define("triple(Tensor x) -> Tensor")
    lib.impl("triple", lambda x: x * 3, "CPU")
    try:
        with opscope.dump(tmp_path / "d", data="tensor") as d:
            torch.ops.opscope_cli.triple.default(torch.ones(3) + 1)
            d.step()
    finally:
        lib._destroy()
    seq = next(r["seq"] for r in opscope.load(tmp_path / "d").records().to_pylist() if "triple" in r["op"])
    proc = run_cli("replay", tmp_path / "d", tmp_path / "d", "--op", f"0:0:{seq}")
    assert proc.returncode == 2 and "not registered in this process" in proc.stdout + proc.stderr
    (tmp_path / "gpu_only_lib.py").write_text(
        "import torch\nlib = torch.library.Library('opscope_cli', 'DEF')\n"
        "lib.define('triple(Tensor x) -> Tensor')\nlib.impl('triple', lambda x: torch.empty_like(x), 'Meta')\n")
    proc = run_cli("replay", tmp_path / "d", tmp_path / "d", "--op", f"0:0:{seq}", "--import", "gpu_only_lib",
                   env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert proc.returncode == 2 and "cannot run on CPU" in proc.stdout, proc.stdout + proc.stderr
