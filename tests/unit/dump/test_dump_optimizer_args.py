"""An optimizer step's settings on its parameter rows, at every level and on both capture paths
(compare bounds Adam's moves from them: opscope.compare.param_moves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import opscope  # noqa: E402


def _train(path: Path, level: str) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW([{"params": model[0].parameters()},
                             {"params": model[2].parameters(), "lr": 0.01, "betas": (0.8, 0.99)}], lr=1e-3)
    losses = []
    with opscope.dump(path, level=level, steps="0-2") as d:
        for i in range(3):
            loss = model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i))).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            d.step()
    return losses


@pytest.mark.parametrize("level", ["aten", "api", "module"])
@pytest.mark.parametrize("backend", ["native", "python"])
def test_the_parameter_rows_carry_their_groups_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        level: str, backend: str) -> None:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _train(tmp_path / "d", level)
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    step_rows = rows[rows.op == "AdamW.step"]
    read = step_rows[step_rows.io.isin(["param", "grad"])]
    assert len(read) == 3 * 8, read[["step", "io", "param"]]  # 4 parameters, each with its gradient
    for _, row in read.iterrows():
        doc = json.loads(row.args)
        group = 0 if row.param.startswith("0.") else 1
        assert doc["optimizer"] == "AdamW" and doc["step"] == row.step, (row.param, doc)
        assert (doc["lr"], doc["betas"]) == [(1e-3, [0.9, 0.999]), (0.01, [0.8, 0.99])][group], (row.param, doc)
    assert step_rows[step_rows.io == "output"].args.isna().all()  # the updated values: no settings


def test_reading_the_settings_records_no_op_of_its_own(tmp_path: Path) -> None:
    """The step count is read from the state's memory: an ``.item()`` (or ``.numpy()``) there
    would be an op recorded in the user's optimizer phase, one more than AdamW's own (one
    ``_local_scalar_dense`` a parameter a step)."""
    _train(tmp_path / "d", "aten")
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    mine = rows[(rows.phase == "optimizer") & (rows.io != "output")
                & rows.op.isin(["aten._local_scalar_dense.default", "aten.detach.default"])]
    assert mine.groupby("step").size().to_dict() == {0: 4, 1: 4, 2: 4}, mine[["step", "op", "arg"]]
