"""The native aten observer's callback is off while a recorded op whose kernel calls ops runs
(observer.h, QUIET): torch then makes no record of those inner ops. Nothing of the dump may
change with it, nor what another RecordFunction user (torch's profiler) sees."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from dump_helpers import calls

import opscope
from opscope.capture.torch.native import build as native


@pytest.fixture(scope="module", autouse=True)
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump observer did not build: {native.error('_opscope_dump')}"
    return module


def _ops(x: torch.Tensor, mask: torch.Tensor, raise_at: int | None) -> torch.Tensor:
    """Ops whose kernels call 2-4 ops each (masked_select, std, sum over a dim), run three
    times so that their kinds go quiet, one call raising inside its kernel."""
    total = x.sum()
    for i in range(3):
        if i == raise_at:
            with pytest.raises(RuntimeError):
                x.masked_select(torch.ones(3, dtype=torch.bool))  # the mask does not broadcast
        total = total + x.masked_select(mask).sum() + x.std(0).sum() + (x * 2.0).sum(1).mean()
    return total


def _rows(path, backend_name, monkeypatch, raise_at):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    mask = x.detach() > 0
    losses = []
    with opscope.dump(path, steps="all") as d:
        for step in range(2):
            loss = _ops(x, mask, raise_at if step == 1 else None)
            loss.backward()
            losses.append(loss.item())
            d.step()
    dump = opscope.load(path)
    assert (dump.manifest["stats_backend"] == "native") == (backend_name == "native")
    return losses, {key: row["hash"] for key, row in calls(dump).items()}


@pytest.mark.parametrize("raise_at", [None, 2], ids=["plain", "raising"])
def test_ops_after_a_quiet_op_are_recorded_as_by_the_python_mode(tmp_path, monkeypatch, raise_at):
    """Every recorded op, also after a quiet op that raised, is in the native dump as in the
    Python mode's, with the same contents (a callback left off would lose the ops after it)."""
    losses_n, nat = _rows(tmp_path / "n", "native", monkeypatch, raise_at)
    losses_p, py = _rows(tmp_path / "p", "python", monkeypatch, raise_at)
    assert losses_n == losses_p
    assert nat == py
    outputs = Counter(key[3] for key in nat if key[5] == "output")
    assert outputs["std"] == outputs["masked_select"] == 6 and outputs["mean"] >= 6  # 3 calls a step, 2 steps


def test_torchs_profiler_sees_every_op_while_the_dump_runs(tmp_path, monkeypatch):
    """The dump turns its own callback off, not RecordFunction: the profiler's events, the
    inner ops of quiet ops among them, are the same with the dump on as without it."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")

    def events(dumped: bool) -> Counter:
        x = torch.randn(4, 4, requires_grad=True)
        mask = x.detach() > 0
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            if dumped:
                with opscope.dump(tmp_path / "d", steps="all") as d:
                    for _ in range(2):
                        _ops(x, mask, None).backward()
                        d.step()
            else:
                for _ in range(2):
                    _ops(x, mask, None).backward()
        return Counter(e.name for e in prof.events() if e.name.startswith("aten::"))

    alone, dumped = events(False), events(True)
    assert alone["aten::masked_select"] == 6 and alone["aten::item"] >= 6  # an inner op of masked_select
    assert {n: c for n, c in dumped.items() if alone[n] != c} == {}
