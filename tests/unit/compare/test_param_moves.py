"""How far Adam can move a parameter element in a step (opscope.compare.param_moves), against
torch's own Adam and AdamW run on gradient sequences chosen to reach the bound; the settings
the dump records for it (opscope.capture.torch.optimizer_args), and a culprit update that
names the setting that differs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import opscope  # noqa: E402
from opscope.capture.torch.optimizer_args import group_texts  # noqa: E402
from opscope.compare.param_moves import step_bound  # noqa: E402


def _moves(cls: type, grads: list[torch.Tensor], **settings: float) -> list[tuple[float, float]]:
    """Each step's largest |change| of the parameter, beside step_bound of what the dump records."""
    p = torch.nn.Parameter(torch.zeros_like(grads[0]))
    opt = cls([p], **settings)
    out = []
    for g in grads:
        bound = step_bound(json.loads(group_texts(opt)[0]))
        before = p.detach().clone()
        p.grad = g.clone()
        opt.step()
        out.append((float((p.detach() - before).abs().max()), bound))
    return out


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_no_gradient_sequence_moves_an_element_past_the_bound(cls: type, amsgrad: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    # random signs and sizes over eight decades, zeros, a spike, then a quiet run
    scale = 10.0 ** torch.randint(-8, 1, (40, 64), generator=gen).double()
    grads = list(torch.randn(40, 64, generator=gen, dtype=torch.float64) * scale)
    grads[5][:] = 0.0
    grads[6][:8] = 1e6
    grads[20:] = [g * 1e-12 for g in grads[20:]]
    moves = _moves(cls, grads, lr=1e-3, weight_decay=0.0, amsgrad=amsgrad)
    assert all(moved <= bound * (1 + 1e-9) for moved, bound in moves), moves
    moved, bound = moves[0]
    assert bound == pytest.approx(1e-3) and moved > 0.99 * bound  # the first step: every element by lr


def test_the_bound_is_reached_by_the_gradients_cauchy_schwarz_aligns() -> None:
    """|g_i| proportional to (b1/b2)^(t-i): m_t / sqrt(v_t) is as large as it can be at step t,
    so at t = 50 the element moves by more than 99% of the bound (61% more than lr there)."""
    b1, b2, t = 0.9, 0.999, 50
    grads = [torch.full((4,), (b1 / b2) ** (t - i), dtype=torch.float64) for i in range(1, t + 1)]
    moved, bound = _moves(torch.optim.Adam, grads, lr=1e-3, betas=(b1, b2), eps=1e-30)[-1]
    assert bound > 1.5e-3 and bound * 0.99 < moved <= bound * (1 + 1e-9), (moved, bound)


def test_settings_say_what_bounds_a_step() -> None:
    assert step_bound({"optimizer": "AdamW", "lr": 1e-3, "betas": [0.9, 0.999], "step": 0}) == pytest.approx(1e-3)
    # the step count not known (kept on an accelerator): the supremum over every step
    sup = step_bound({"optimizer": "Adam", "lr": 1e-3, "betas": [0.9, 0.999]})
    assert sup == pytest.approx(1e-3 * 0.1 / math.sqrt(0.001 * (1 - 0.81 / 0.999)))
    assert step_bound({"optimizer": "Adam", "lr": 1e-3, "betas": [0.99, 0.95]}) is None  # b1² > b2: none
    assert step_bound({"optimizer": "SGD", "lr": 0.1, "momentum": 0.9, "step": 3}) is None
    assert step_bound({"optimizer": "AdamW", "betas": [0.9, 0.999], "step": 0}) is None  # no lr recorded


def test_group_texts_record_each_groups_settings_and_steps_taken() -> None:
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 0.5, "betas": (0.8, 0.99)}], lr=1e-3)
    first = [json.loads(t) for t in group_texts(opt)]
    assert [(d["optimizer"], d["lr"], d["betas"], d["step"]) for d in first] == [
        ("AdamW", 1e-3, [0.9, 0.999], 0), ("AdamW", 0.5, [0.8, 0.99], 0)]
    assert "params" not in first[0] and "foreach" not in first[0]  # (None: not recorded)
    for _ in range(2):
        a.grad, b.grad = torch.ones(3), torch.ones(2)
        opt.step()
    assert [json.loads(t)["step"] for t in group_texts(opt)] == [2, 2]
    opt.param_groups[0]["lr"] = torch.tensor(0.25)  # a tensor lr on the CPU is read
    assert json.loads(group_texts(opt)[0])["lr"] == 0.25


def _lr_run(path: Path, lr: float, level: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    with opscope.dump(path, level=level, steps="0-1") as d:
        for i in range(2):
            model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i))).square().mean().backward()
            opt.step()
            opt.zero_grad()
            d.step()


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_a_changed_learning_rate_is_named_with_the_settings(tmp_path: Path, level: str) -> None:
    """The update whose inputs agree differs: the culprit says which setting differs."""
    _lr_run(tmp_path / "a", 1e-3, level)
    _lr_run(tmp_path / "b", 2e-3, level)
    found = opscope.compare(tmp_path / "b", tmp_path / "a").first_divergence
    assert found is not None and (found.kind, found.phase, found.step) == ("culprit", "optimizer", 0), found
    assert "lr 0.002 in the target, 0.001 in the reference" in found.note, found.note
    # the same runs with the same settings: no such note (and nothing differs)
    _lr_run(tmp_path / "c", 1e-3, level)
    assert opscope.compare(tmp_path / "c", tmp_path / "a").first_divergence is None
