"""Writes that torch makes without moving a version counter, seen by the data flow.

GradScaler's ``torch._amp_foreach_non_finite_check_and_unscale_`` writes the gradients and
``found_inf`` in place, and the fused optimizers (``torch._fused_adamw_``) their parameters and
states, with no version moved. The capture links a tensor's next read to the row that last
measured it while its version stays: at the API level the next read of ``found_inf`` then
carried the 0 from before the check (a step the scaler skipped read as not skipped) and the
optimizer's gradients the scaled values. The aten level knows the writes from the schemas."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import opscope


def _train(path, level: str, init_scale: float, *, fused: bool = False) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    losses = []
    with opscope.dump(path, level=level) if path else contextlib.nullcontext() as d:
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                loss = (model(x).float() - y).square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
            if d is not None:
                d.step()
    return losses


def _ones(rows, op: str, slot: int):
    return rows[(rows.op.str.endswith(op)) & (rows.io == "input") & (rows.slot == slot)]


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("level", ["api", "aten"])
def test_the_scalers_found_inf_reads_what_the_check_wrote(tmp_path, monkeypatch, backend, level):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _train(tmp_path / "d", level, init_scale=2.0 ** 120)  # float16 overflows: both steps skipped
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    found_inf = _ones(rows, "_amp_update_scale_.default" if level == "aten" else "_amp_update_scale_", 2)
    assert list(found_inf["max"]) == [1.0, 1.0], "update_scale read found_inf = 1: the step was skipped"
    assert not (rows.phase == "optimizer").any()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_the_optimizer_reads_the_unscaled_gradients(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _train(tmp_path / "d", "api", init_scale=1024.0)  # no overflow: both steps update
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    step = rows[rows.step == 0]
    check = step[(step.op == "torch._amp_foreach_non_finite_check_and_unscale_") & (step.io == "input")]
    scaled = sorted(check[check.slot < 4]["norm"])  # the four gradients, as the check read them
    # single-tensor AdamW reads each gradient in lerp_ and addcmul_: 1/1024 of what the check
    # read (a power of two divides the norm exactly), not the scaled values the backward wrote
    reads = step[(step.phase == "optimizer") & step.op.isin(["Tensor.lerp_", "Tensor.addcmul_"])
                 & (step.io == "input") & (step.slot == 1)]
    assert len(scaled) == 4 and len(reads) == 8
    assert sorted(set(reads["norm"])) == [n / 1024.0 for n in scaled]


@pytest.mark.parametrize("level", ["api", "aten"])
def test_fused_adamw_under_a_dump_keeps_the_losses(tmp_path, level):
    bare = _train(None, level, 1024.0, fused=True)
    assert _train(tmp_path / "d", level, 1024.0, fused=True) == bare
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    assert rows.op.str.contains("_fused_adamw_").any()
