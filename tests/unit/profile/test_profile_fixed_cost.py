"""What keeps the training trace's cost per step small: after two steps only the outermost
modules and the parameters accumulated last keep hooks; the usual step's breakdown takes
the one-pass path with the same result as the general one."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

import opscope  # noqa: E402
from opscope.profile import breakdown as bd  # noqa: E402
from opscope.profile.model import PHASES, PRIORITY  # noqa: E402


def _hooked(model) -> tuple[int, int]:
    """(forward pre-hooks on the model, parameters with a post-accumulate hook)."""
    params = sum(1 for p in model.parameters() if getattr(p, "_post_accumulate_grad_hooks", None))
    return len(model._forward_pre_hooks), params


def test_hooks_narrow_to_the_outermost_module_and_last_parameters(tmp_path) -> None:
    from torch.nn.modules import module as nn_module

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    global_before = len(nn_module._global_forward_pre_hooks)
    seen = []
    with opscope.profile(tmp_path / "p") as p:
        for _ in range(5):
            model(torch.randn(3, 4)).square().sum().backward()
            opt.step()
            opt.zero_grad()
            seen.append((len(nn_module._global_forward_pre_hooks) - global_before, _hooked(model)))
            p.step()
    # steps 0-1: global module hooks and every parameter; from step 2: the model and the
    # parameter whose gradient the autograd engine accumulated last
    assert seen[0] == (1, (0, 6)) and seen[1] == (1, (0, 6))
    assert all(s == (0, (1, 1)) for s in seen[2:]), seen
    assert len(nn_module._global_forward_pre_hooks) == global_before and _hooked(model) == (0, 0)  # all removed
    rows = p.result.steps
    assert [r.step for r in rows] == list(range(5))
    assert all(r.phases["forward"] > 0 and r.phases["backward"] > 0 and r.phases["optimizer"] > 0 for r in rows)


def test_one_pass_breakdown_matches_the_general_one() -> None:
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, 10_000), 12))
        start, end = 0, 10_000
        intervals = {p: [] for p in PRIORITY}
        for lo, hi in zip(cuts[::2], cuts[1::2]):
            intervals[rng.choice(PRIORITY)].append((lo, hi))
        quick = bd._disjoint_inside(start, end, intervals)
        assert quick is not None
        general = {p: sum(hi - lo for lo, hi in intervals[p]) for p in PRIORITY}
        assert {p: quick[p] for p in PRIORITY} == general
        assert quick["other"] == end - start - sum(general.values()) and set(quick) == set(PHASES)
    assert bd._disjoint_inside(0, 100, {"forward": [(10, 50)], "backward": [(40, 60)]}) is None  # overlap
    assert bd._disjoint_inside(0, 100, {"forward": [(10, 150)]}) is None  # sticks out: clipped by the general path
    result, comm, overlap = bd.breakdown(0, 100, {"forward": [(10, 50)], "communication": [(40, 60)]})
    assert (result["forward"], result["communication"], comm, overlap) == (40, 10, 20, 10)
