"""``opscope profile show`` and ``diff`` through the real CLI, on profiles of real runs.

One subprocess trains a tiny model four times: the same code twice, once with a 30 ms
delay injected into backward, once with a wider hidden layer. Each phase is padded with an
8 ms sleep so that the machine's drift in the tiny matmuls cannot pass as a regression
(with 4 ms, a run of the same code came out 10% slower about once in twelve on a shared VM:
the CPU-bound rest of the step ran slower throughout the second run).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

TRAIN = textwrap.dedent(
    '''
    import sys, time, torch
    from torch import nn
    import opscope
    torch.set_num_threads(1)

    class Delay(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fwd, bwd):
            ctx.bwd = bwd
            time.sleep(fwd)
            return x.view_as(x)
        @staticmethod
        def backward(ctx, g):
            time.sleep(ctx.bwd)
            return g, None, None

    class Net(nn.Module):
        def __init__(self, hidden, extra_bwd):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(256, hidden), nn.Linear(hidden, 8)
            self.extra_bwd = extra_bwd
        def forward(self, x):
            h = Delay.apply(self.fc1(x), 0.008, 0.008 + self.extra_bwd)
            return self.fc2(torch.relu(h))

    def run(out, hidden=64, extra_bwd=0.0):
        torch.manual_seed(0)
        model = Net(hidden, extra_bwd)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(512, 256), torch.randn(512, 8)
        with opscope.profile(out, steps="6-9", task_trace=True, overwrite=True) as p:
            for _ in range(24):
                opt.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                p.step()

    root = sys.argv[1]
    run(root + "/base")
    run(root + "/same")
    run(root + "/slow", extra_bwd=0.03)
    run(root + "/wide", hidden=2048)
    '''
)


def opscope_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opscope", "profile", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    script = root / "train.py"
    script.write_text(TRAIN)
    done = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def test_show_prints_phases_ops_and_files_exist(runs) -> None:
    base = runs / "base"
    for name in ("steps.parquet", "steps.csv", "ops.csv", "summary.json", "trace.json.gz", "report.html"):
        assert (base / name).is_file(), name
    done = opscope_cli("show", str(base))
    assert done.returncode == 0, done.stderr
    assert "status: complete" in done.stdout
    for word in ("backward", "forward", "optimizer", "aten::addmm", "task trace cost"):
        assert word in done.stdout
    summary = json.loads(opscope_cli("show", str(base), "--json").stdout)
    assert summary["steps"]["recorded"] == 24 and summary["steps"]["task_traced"] == 4
    header = (base / "steps.csv").read_text().splitlines()[0].split(",")
    assert {"wall_ns", "forward_ns", "backward_ns", "other_ns"} <= set(header)


def test_same_code_twice_is_not_flagged(runs) -> None:
    done = opscope_cli("diff", str(runs / "base"), str(runs / "same"))
    assert done.returncode == 0, done.stdout
    assert "no phase changed beyond noise" in done.stdout


def test_injected_backward_delay_is_flagged_in_backward(runs) -> None:
    done = opscope_cli("diff", str(runs / "base"), str(runs / "slow"), "--json")
    assert done.returncode == 1, done.stdout
    result = json.loads(done.stdout)
    flagged = {c["name"]: c for c in result["phases"] if c["direction"] != "same"}
    assert flagged["backward"]["direction"] == "slower"
    assert flagged["backward"]["delta_ms"] > 20
    assert "forward" not in flagged and "optimizer" not in flagged
    assert any(h.startswith("backward") and "slower" in h for h in result["headlines"])
    assert result["machine"]["speed"] is not None, "both profiles carry a machine calibration"


def test_wider_layer_is_flagged_with_the_matmul(runs) -> None:
    done = opscope_cli("diff", str(runs / "base"), str(runs / "wide"), "--json")
    assert done.returncode == 1, done.stdout
    result = json.loads(done.stdout)
    slower = {c["name"] for c in result["phases"] if c["direction"] == "slower"}
    assert {"forward", "backward"} <= slower
    # the ops whose work grows with the layer's width: its matmuls, and the ReLU after it
    assert result["causes"]["forward"] in ("aten::addmm", "aten::mm", "aten::relu", "aten::clamp_min")
    assert result["causes"]["backward"] in ("aten::mm", "aten::addmm", "aten::threshold_backward")


def test_unreadable_profile_is_a_clear_error(tmp_path) -> None:
    done = opscope_cli("show", str(tmp_path))
    assert done.returncode == 2
    assert "not an opscope profile folder" in done.stderr
