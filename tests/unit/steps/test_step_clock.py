"""StepClock on event sequences (pure logic), and the optimizer check it asks."""

from __future__ import annotations

import pytest

from opscope.capture.steps import StepClock

MODEL, LOSS = object(), object()


def feed(events: str, has_optimizer: bool = True) -> list[tuple[int, int]]:
    """Events: f = model forward, l = loss module, z = zero_grad, o = optimizer step,
    s = user step(), p = poll (data fetch, backward, stop)."""
    seen: list[tuple[int, int]] = []
    clock = StepClock(lambda a, b: seen.append((a, b)), has_optimizer=lambda m: has_optimizer)
    act = {"f": lambda: clock.outer_module_call(MODEL), "l": lambda: clock.outer_module_call(LOSS),
           "z": clock.zero_grad, "o": clock.optimizer_step, "s": clock.user_step, "p": clock.poll}
    for event in events.replace(" ", ""):
        act[event]()
    return seen


@pytest.mark.parametrize("events, boundaries", [
    ("flpoz s flpoz s flpoz s", 3),          # zero_grad last, then step(): one boundary each
    ("zflpo s zflpo s zflpo s", 3),          # zero_grad first, step()
    ("flpoz flpoz flpoz p", 3),              # zero_grad last, no step(): stop resolves the last
    ("zflpo zflpo zflpo p", 3),              # zero_grad first, no step()
    ("flp flp flpoz flp flp flpoz p", 2),    # accumulation of 3, no step()
    ("flp flp flpoz s flp flp flpoz s", 2),  # accumulation of 3, step()
])
def test_one_boundary_per_optimizer_step_in_every_order(events: str, boundaries: int) -> None:
    assert len(feed(events)) == boundaries


def test_zero_grad_last_stays_in_the_step_it_closes() -> None:
    seen: list[tuple[int, int]] = []
    clock = StepClock(lambda a, b: seen.append((a, b)), has_optimizer=lambda m: True)
    clock.outer_module_call(MODEL)
    clock.optimizer_step()
    clock.zero_grad()
    assert seen == [] and clock.pending  # resolved by the next iteration, not by zero_grad
    clock.outer_module_call(MODEL)
    assert seen == [(0, 1)]


def test_zero_grad_first_begins_the_next_step() -> None:
    seen: list[tuple[int, int]] = []
    clock = StepClock(lambda a, b: seen.append((a, b)), has_optimizer=lambda m: True)
    clock.zero_grad()
    clock.outer_module_call(MODEL)
    clock.optimizer_step()
    clock.zero_grad()
    assert seen == [(0, 1)] and clock.zero_grad_first


def test_without_an_optimizer_each_call_of_the_model_is_a_step_and_the_loss_module_is_not() -> None:
    assert len(feed("fl fl fl fl", has_optimizer=False)) == 3
    assert len(feed("fl fl fl fl", has_optimizer=True)) == 0  # waits for the optimizer step


def test_the_optimizer_is_asked_once() -> None:
    asked: list[object] = []
    clock = StepClock(has_optimizer=lambda m: asked.append(m) or False)
    for _ in range(4):
        clock.outer_module_call(MODEL)
    assert asked == [MODEL] and clock.step == 3


def test_has_optimizer_sees_a_live_optimizer_of_the_module_only() -> None:
    torch = pytest.importorskip("torch")
    from opscope.capture.torch.optimizers import has_optimizer

    trained, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    assert not has_optimizer(trained)
    opt = torch.optim.Adam([{"params": trained.parameters(), "lr": 0.1}])
    assert has_optimizer(trained) and not has_optimizer(other) and not has_optimizer(frozen)
    del opt
    assert not has_optimizer(trained)


def test_a_zero_grad_before_the_loop_and_a_user_step_make_one_boundary() -> None:
    # transformers.Trainer: model.zero_grad() once, then forward ... optimizer, zero_grad, step()
    assert len(feed("z flpoz s flpoz s flpoz s")) == 3


def test_a_call_of_the_model_that_contains_the_steps_first_module_ends_the_step() -> None:
    """An encoder-decoder's generate calls its encoder, then the whole model once per token:
    each model call is a step (before session 24 the whole generation was one). A module
    that does not contain the step's first one (a loss module, a second model) never ends it."""
    from torch import nn

    model = nn.ModuleDict({"encoder": nn.Linear(2, 2), "decoder": nn.Linear(2, 2)})
    other = nn.Linear(2, 2)
    seen: list[tuple[int, int]] = []
    clock = StepClock(lambda a, b: seen.append((a, b)), has_optimizer=lambda m: False)
    for module in (model["encoder"], other, model, other, model, model):
        clock.outer_module_call(module)
    assert seen == [(0, 1), (1, 2), (2, 3)]
    seen.clear()
    clock = StepClock(lambda a, b: seen.append((a, b)), has_optimizer=lambda m: True)
    for module in (model["encoder"], model, model):  # trained by an optimizer: its steps end it
        clock.outer_module_call(module)
    assert seen == []
