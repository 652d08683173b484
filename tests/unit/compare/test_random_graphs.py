"""Compiled graphs that draw random numbers from their backend's own generator
(graphs.explain_random_graphs): inductor's kernels do not draw from torch's generator, so a
compiled run's draws differ from an eager run's by design (Reformer's LSH rotations under
inductor were 33% apart), unless ``torch._inductor.config.fallback_random`` is set."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import opscope
from opscope.capture.torch.compiled_frames import random_draws

_SCRIPT = textwrap.dedent("""
    import sys, torch, opscope
    import torch._inductor.config as config

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            torch.manual_seed(0)  # the same seed on both sides: only the generator differs
            return (self.fc(x) + torch.randn(4, 8)).square().mean()

    path, compiled, fallback = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    config.fallback_random = fallback
    torch.manual_seed(1)
    model = Noisy()
    x = torch.randn(4, 8)
    run = torch.compile(model, backend="inductor") if compiled else model
    with opscope.dump(path, level="aten") as d:
        run(x).backward()
        d.step()
""")


def _dump(path, compiled: bool, fallback: bool = False):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(int(compiled)), str(int(fallback))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return path


def test_the_random_ops_of_a_graph_are_listed_but_not_dropout_that_draws_nothing():
    class M(torch.nn.Module):
        def forward(self, x):
            y = F.dropout(x, 0.0, True) + F.dropout(x, 0.5, False)  # p = 0, evaluation: no draw
            return F.dropout(y, 0.1, True) + torch.randn_like(y)

    assert random_draws(torch.fx.symbolic_trace(M())) == ["dropout", "randn_like"]


@pytest.mark.slow
def test_an_inductor_graph_drawing_from_its_own_generator_is_explained(tmp_path):
    eager = _dump(tmp_path / "eager", compiled=False)
    result = opscope.compare(_dump(tmp_path / "inductor", compiled=True), eager)
    first = result.first_divergence
    assert first is not None and first.op.startswith("compiled_graph_"), result.culprits
    assert "draw random numbers in kernels inductor generated" in first.note and "randn" in first.note
    assert "fallback_random = True" in first.note
    fallback = opscope.compare(_dump(tmp_path / "fallback", compiled=True, fallback=True), eager)
    assert not fallback.culprits, fallback.culprits  # drawn from torch's generator: as eager
