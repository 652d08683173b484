"""A fused optimizer (``AdamW(fused=True)``) writes the parameters in one kernel that moves no
version counter: the rows of the updated parameters must hold what the step left, at every
level and on both capture paths, not the values measured before the step. A fused SGD with
momentum writes them in its first step beside momentum buffers ``empty_like`` just made: the
parameters hold data all the same."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import opscope  # noqa: E402

OPTIMIZERS = {"AdamW": lambda params, fused: torch.optim.AdamW(params, lr=0.05, fused=fused),
              "SGD": lambda params, fused: torch.optim.SGD(params, lr=0.05, momentum=0.9, fused=fused)}


def _train(path: Path, level: str, fused: bool, optimizer: str = "AdamW") -> dict[tuple[int, str], torch.Tensor]:
    """Two steps; returns each parameter's value right after each step, by (step, name)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = OPTIMIZERS[optimizer](model.parameters(), fused)
    after = {}
    with opscope.dump(path, level=level, steps="0-1") as d:
        for i in range(2):
            loss = model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i))).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            after.update({(i, name): p.detach().clone() for name, p in model.named_parameters()})
            d.step()
    return after


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("level", ["aten", "api", "module"])
@pytest.mark.parametrize("backend", ["native", "python"])
def test_the_updated_parameters_rows_hold_what_a_fused_step_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 level: str, backend: str, optimizer: str) -> None:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    after = _train(tmp_path / "d", level, True, optimizer)
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    updated = rows[(rows.op == f"{optimizer}.step") & (rows.io == "output")]
    assert len(updated) == 2 * 4, updated[["step", "param"]]
    for _, row in updated.iterrows():
        value = after[row.step, row.param].double()
        # (the step moved every element by about lr: a row from before it is 0.05 off)
        assert (row["min"], row["max"]) == (value.min().item(), value.max().item()), (row.step, row.param)
        assert row["mean"] == pytest.approx(value.mean().item(), rel=1e-6, abs=1e-9), (row.step, row.param)


def test_a_fused_step_is_recorded_as_the_same_update_as_the_loop(tmp_path: Path) -> None:
    """Fused and one-parameter-at-a-time AdamW move the parameters alike: the module level's
    rows after each step agree within float32 rounding (they did not: the fused run's were the
    values from before the step)."""
    _train(tmp_path / "fused", "module", fused=True)
    _train(tmp_path / "loop", "module", fused=False)
    f, lo = (opscope.load(tmp_path / k).records().to_pandas() for k in ("fused", "loop"))
    pick = ["step", "param", "min", "max", "mean", "norm"]
    f = f[(f.op == "AdamW.step") & (f.io == "output")][pick].set_index(["step", "param"]).sort_index()
    lo = lo[(lo.op == "AdamW.step") & (lo.io == "output")][pick].set_index(["step", "param"]).sort_index()
    assert len(f) == len(lo) == 8
    assert (f - lo).abs().max().max() < 1e-5, (f - lo)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_every_buffer_a_fused_first_step_fills_is_measured_at_its_next_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """A fused op writes every tensor of its lists: with 24 parameters, SGD's momentum buffers
    are its written outputs 48 to 71. Those that held no data (``empty_like``'s) are recorded
    unmeasured, and measured where the next step reads them; the native path marked the
    outputs past the 64th as not written and measured 64 to 71 on the spot, unlike the rest.
    Both paths number a list's tensors one after the other (the Python path's inputs went 0, 2,
    4, ...: the buffers were inputs 48 to 94, and grads too were among 48 and up)."""
    from opscope.model.records import UNINITIALIZED_NOTE

    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(12)])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    with opscope.dump(tmp_path / "d", level="aten", steps="0-1") as d:
        for i in range(2):
            model(torch.randn(5, 3, generator=torch.Generator().manual_seed(i))).square().mean().backward()
            opt.step()
            opt.zero_grad()
            d.step()
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    fused = rows[rows.op == "aten._fused_sgd_.default"]
    made = fused[(fused.step == 0) & (fused.io == "output") & (fused.slot >= 48)]
    assert sorted(made.slot) == list(range(48, 72))
    assert (made.note == UNINITIALIZED_NOTE).all(), made[made.note != UNINITIALIZED_NOTE].slot.tolist()
    read = fused[(fused.step == 1) & (fused.io != "output") & (fused.slot >= 48)]
    assert len(read) == 24 and read["norm"].notna().all() and (read["norm"] > 0).all()
