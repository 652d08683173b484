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
        if i == 20:
            loss = loss * 100  # a loss scaled by mistake
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {loss.item()!r}")
    """
)


def test_opscope_run_with_a_monitor_section(tmp_path, run_cli):
    (tmp_path / "train.py").write_text(TRAIN)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"monitor": {"path": "mon", "targets": ["inputs", "loss", "grads", "lr", "optimizer"]}}))
    done = run_cli("run", "-c", cfg, "--", sys.executable, "train.py", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "monitor (inputs, loss, grads, lr, optimizer, every step) -> mon" in done.stderr
    assert "opscope.monitor: step 16 (rank 0): arg0 (input) moved first" in done.stderr
    data = read(tmp_path / "mon")
    rank = data.ranks[0]
    assert rank.status == "complete" and rank.steps == 24
    assert rank.values[("momentum_buffer", "2.weight", "norm")][0] == list(range(24))
    assert rank.values[("lr", "lr", "value")][1] == [0.05] * 24
    # the loss, with no m.step(loss=...): the scalar backward was called on, each step
    printed = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("loss ")]
    assert rank.values[("loss", "loss", "value")] == (list(range(24)), printed)
    assert "opscope.monitor: step 20 (rank 0): loss moved first" in done.stderr
    assert (tmp_path / "mon" / "report.html").stat().st_size > 1000


def test_an_event_triggers_the_watch_flight_recorder(tmp_path):
    import torch
    from torch import nn

    import opscope

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [(torch.randn(32, 16), torch.randint(0, 4, (32,))) for _ in range(8)]
    with opscope.watch(action="record", path=str(tmp_path / "flight"), history=2) as w, \
            opscope.monitor(tmp_path / "mon", flight=w) as m:
        for i in range(24):
            x, y = data[i % 8]
            loss = nn.functional.cross_entropy(model(x * (1e3 if i == 18 else 1)), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss)
            m.step(loss=loss)
    assert [(e.step, e.first.label) for e in m.result.events] == [(18, "arg0 (input)")]
    assert w.result.dumps == [str(tmp_path / "flight")]
    flight = json.loads((tmp_path / "flight" / "manifest.json").read_text())["flight_recorder"]
    assert (flight["trigger"], flight["step"], flight["history_steps"]) == ("monitor: arg0 (input) moved", 18, [17, 18])
    assert opscope.load(tmp_path / "flight").steps() == [17, 18, 19]  # and the step after, in full
