"""A training script run as a user runs it, with the watch configured from OPSCOPE_CONFIG."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import torch, opscope
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with opscope.watch() as w:
        for step in range(3):
            x = torch.randn(2, 4) * (1e30 if step == 2 else 1.0)
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss=loss)
    print("finished", len(w.result.events))
""")


def _run(tmp_path, section):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "opscope.json").write_text(json.dumps({"overflow": section}))
    env = {"OPSCOPE_CONFIG": str(tmp_path / "opscope.json"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)


def test_raise_from_config_stops_the_script_with_the_op(tmp_path):
    proc = _run(tmp_path, {"action": "raise"})
    assert proc.returncode != 0
    assert "opscope.errors.OverflowDetected: opscope.watch: Inf in aten.pow.Tensor_Scalar" in proc.stderr
    assert "forward, step 2, rank 0" in proc.stderr and "train.py:9" in proc.stderr


def test_warn_from_config_lets_the_script_finish(tmp_path):
    proc = _run(tmp_path, {"action": "warn"})
    assert proc.returncode == 0, proc.stderr
    assert "finished" in proc.stdout and "opscope.watch: Inf in" in proc.stderr
