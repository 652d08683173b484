"""Step boundaries of profile, dump and watch on real torch loops in every common order:
zero_grad first or last, set_to_none, gradient accumulation, a user step() or not, a
DataLoader or a list, the loss as a module. Iteration i feeds i + 1 rows, so the shapes
each tool recorded say which iteration landed in which step."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import pyarrow.parquet as pq  # noqa: E402
from loop_orders import ORDERS, run  # noqa: E402

import opscope  # noqa: E402

torch.set_num_threads(1)
ITERATIONS = 5


def _step_of_each_forward(session):
    """A forward pre-hook on every Linear that notes the session's step index and batch size."""
    seen: list[tuple[int, int]] = []

    def note(module, args):
        seen.append((session.step_index, args[0].shape[0]))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda m, a: note(m, a) if isinstance(m, torch.nn.Linear) and m.in_features == 8 else None)
    return seen, handle


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_profile_has_one_step_per_optimizer_step_each_with_its_phases(tmp_path, order) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p", steps="2-3", task_trace=True, record_shapes=True) as p:
            run(order, p, ITERATIONS)
    rows = p.result.steps
    assert [r.step for r in rows] == list(range(ITERATIONS))
    for r in rows:  # no step made of a lone zero_grad, no micro-batch split off
        assert r.phases["forward"] > 0 and r.phases["backward"] > 0 and r.phases["optimizer"] > 0, (order, r)
        assert r.phases["zero_grad"] > 0 or (r.step == ITERATIONS - 1 and ORDERS[order][0] == "first"), (order, r)
    assert [r.step for r in rows if r.task_trace] == [2, 3]
    ops = pq.read_table(tmp_path / "p" / "rank0" / "ops.parquet").to_pylist()
    for step in (2, 3):  # the window traced exactly iterations 2 and 3 (batches of 3 and 4 rows)
        shapes = " ".join(o["shapes"] for o in ops if o["step"] == step and o["name"] == "aten::linear")
        assert f"[{step + 1}, 8]" in shapes, (order, step, shapes)
        assert all(f"[{n}, 8]" not in shapes for n in range(1, ITERATIONS + 1) if n != step + 1), (order, step, shapes)


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_dump_puts_each_iteration_in_its_own_step(tmp_path, order) -> None:
    session = opscope.dump(tmp_path / "d", level="module", data="statistics")
    seen, handle = _step_of_each_forward(session)
    try:
        with session as d:
            run(order, d, ITERATIONS)
    finally:
        handle.remove()
    assert {batch - 1 for _, batch in seen} == set(range(ITERATIONS))
    assert all(step == batch - 1 for step, batch in seen), (order, seen)
    dump = opscope.load(tmp_path / "d")
    assert dump.steps() == list(range(ITERATIONS))


@pytest.mark.parametrize("order", ["zero_grad_last_pstep", "accumulate_3", "accumulate_3_pstep"])
def test_watch_counts_the_same_steps(order, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a flight-recorder dump would go
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = opscope.watch()
        seen, handle = _step_of_each_forward(session)
        try:
            with session as w:
                run(order, w, ITERATIONS)
        finally:
            handle.remove()
    assert all(step == batch - 1 for step, batch in seen), (order, seen)


def test_without_an_optimizer_each_model_call_is_a_step_and_the_loss_module_is_not(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    loss_fn = torch.nn.MSELoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with opscope.profile(tmp_path / "p") as p:
            for _ in range(4):
                with torch.no_grad():
                    loss_fn(model(torch.randn(2, 8)), torch.randn(2, 8))
    assert [r.step for r in p.result.steps] == [0, 1, 2, 3]
    assert all(r.phases["forward"] > 0 for r in p.result.steps)
