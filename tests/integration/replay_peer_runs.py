"""A tiny MLP dumped by the real msprobe (``task: tensor``, ``level: L1``) for replay tests:
step 0 as written, step 1 the same forward and backward with one kernel fault, on the same
input and weights. msprobe's step folders are then moved to ``OUT/ref/step0`` and
``OUT/fault/step0`` (folders moved, files as msprobe wrote them), two dumps that differ by
exactly one faulty call.

    python replay_peer_runs.py OUT

The fault: ``F.linear`` is wrapped before msprobe installs its hooks, so msprobe records the
wrapper as ``Functional.linear``; at step 1 the wrapper scales ``fc2``'s output by 1.001 in
place (a kernel that writes a wrong result; msprobe records no call nested in an API call).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

FAULT = {"on": False}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc2(F.gelu(self.fc1(x), approximate="tanh")))
        return F.softmax(self.head(h * 0.5), dim=-1)


def faulty_linear(net: Net) -> Any:
    original = F.linear

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = original(x, weight, bias)
        if FAULT["on"] and weight is net.fc2.weight:
            with torch.no_grad():
                out.mul_(1.001)
        return out
    return linear


def main(out: str) -> None:
    torch.manual_seed(0)
    net = Net()
    F.linear = faulty_linear(net)  # before msprobe wraps the functional API
    from msprobe.pytorch import PrecisionDebugger

    raw = Path(out) / "msprobe"
    config = Path(out) / "config.json"
    config.write_text(json.dumps({"task": "tensor", "dump_path": str(raw), "rank": [], "step": [], "level": "L1",
                                  "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}))
    debugger = PrecisionDebugger(config_path=str(config))
    x = torch.randn(8, 16)
    for step in range(2):
        FAULT["on"] = step == 1
        debugger.start(model=net)
        net(x).sum().backward()
        debugger.stop()
        debugger.step()
        net.zero_grad()
    for step, name in ((0, "ref"), (1, "fault")):
        (Path(out) / name).mkdir()
        (raw / f"step{step}").rename(Path(out) / name / "step0")


if __name__ == "__main__":
    Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
    main(sys.argv[1])
