"""A monitor section in the config: `opscope run -c CONFIG -- python train.py` monitors a script
that never imports opscope (steps end at optimizer.step(); the model is found)."""

from __future__ import annotations

import json
import sys
import textwrap

from opscope.monitor.series import read

TRAIN = textwrap.dedent(
    """
    import torch
    from torch import nn
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for i in range(24):
        x = torch.randn(32, 8)
        if i == 16:
            x = x * 1e4  # a corrupted batch
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    """
)


def test_opscope_run_with_a_monitor_section(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(TRAIN)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"monitor": {"path": "mon", "targets": ["inputs", "grads", "lr", "optimizer"]}}))
    done = run_cli("run", "-c", cfg, "--", sys.executable, "train.py", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "monitor (inputs, grads, lr, optimizer, every step) -> mon" in done.stderr
    assert "opscope.monitor: step 16 (rank 0): arg0 (input) moved first" in done.stderr
    data = read(tmp_path / "mon")
    rank = data.ranks[0]
    assert rank.status == "complete" and rank.steps == 24
    assert rank.values[("momentum_buffer", "2.weight", "norm")][0] == list(range(24))
    assert rank.values[("lr", "lr", "value")][1] == [0.05] * 24
    assert (tmp_path / "mon" / "report.html").stat().st_size > 1000
