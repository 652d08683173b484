"""tensorboard=True writes the monitor's series as TensorBoard scalars, read back here with
TensorBoard's own EventAccumulator: the same values as the Parquet series."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import opscope
from opscope.errors import ConfigError

pytest.importorskip("tensorboard")
# TensorBoard reads files through TensorFlow when it is installed (seconds to import): this runs
# its reader in TensorBoard's own no-TensorFlow mode (tensorboard.compat.notf), in a child process
READ = """
import json, sys, types
sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps({t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"""


def _train(path, **keys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with opscope.monitor(path, targets=["grads", "loss", "lr"], report=False, **keys) as m:
        for i in range(12):
            x = torch.randn(16, 8)
            if i == 9:
                x[0, 0] = float("nan")
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
    return m.result


def _scalars(folder):
    done = subprocess.run([sys.executable, "-c", READ, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return {tag: [tuple(p) for p in points] for tag, points in json.loads(done.stdout).items()}


def test_tensorboard_scalars_hold_the_monitored_series(tmp_path):
    result = _train(tmp_path / "m", tensorboard=True)
    got = _scalars(tmp_path / "m" / "tensorboard" / "rank0")
    rank = result.ranks[0]
    steps, norms = rank.values[("grad", "2.weight", "norm")]
    assert [s for s, _ in got["grad/2.weight/norm"]] == steps == list(range(12))
    assert [v for _, v in got["grad/2.weight/norm"][:9]] == pytest.approx(norms[:9], rel=1e-6)  # float32 there
    assert [v for _, v in got["loss"][:9]] == pytest.approx(rank.values[("loss", "loss", "value")][1][:9], rel=1e-6)
    assert [v for _, v in got["lr"]] == pytest.approx([0.05] * 12)
    assert [s for s, _ in got["grad/0.weight/nan"]] == [9, 10, 11]  # counts only where they are not 0


def test_tensorboard_to_a_folder_of_its_own_and_a_bad_value(tmp_path):
    _train(tmp_path / "m", tensorboard=str(tmp_path / "tb"))
    assert [p.name.split(".")[:3] for p in (tmp_path / "tb" / "rank0").iterdir()] == [["events", "out", "tfevents"]]
    assert not (tmp_path / "m" / "tensorboard").exists()
    with pytest.raises(ConfigError, match="tensorboard"):
        opscope.monitor(tmp_path / "x", tensorboard=3)
