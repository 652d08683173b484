"""The series table: a parameter's name held once (packed), its series found by slot or by name
alike, every (kind, name) one id whichever way it was asked for first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opscope
from opscope.monitor.registry import PLACE, Names, SeriesTable

ODD = ["layers.0.weight", "é.ü", "a\0b", "b", "", "a", "x" * 300, "\ud800"]  # a NUL, a lone surrogate


def test_names_read_back_and_find_each_and_nothing_else():
    names = Names()
    for name in ODD:
        assert names[names.add(name)] == name
    assert [names[i] for i in range(len(names))] == ODD
    assert [names.find(n) for n in ODD] == list(range(len(ODD)))
    # pieces of a name, or two names' bytes across their separator, are no names
    assert [names.find(n) for n in ("layers.0", "weight", "é", "a\0", "\0b", "b\0a", "x" * 299)] == [None] * 7


def test_a_series_is_one_id_by_slot_or_by_name_whichever_came_first():
    table = SeriesTable()
    w, b = table.params.add("fc.weight"), table.params.add("fc.bias")
    grad_w = table.slot_id("grad", w, 3)
    assert table.id("grad", "fc.weight") == grad_w == table.slot_id("grad", w) == table.find("grad", "fc.weight")
    state_b = table.id("exp_avg", "fc.bias", 1)  # by name first: still the slot's series
    assert table.slot_id("exp_avg", b) == state_b
    assert table.find("exp_avg", "fc.weight") is None and table.find("weight", "fc.bias") is None
    early = table.id("grad", "head.weight", 0)  # a name no slot has yet
    head = table.params.add("head.weight")
    assert table.slot_id("grad", head) == early  # found by its name when the slot asks
    loss = table.id("loss", "loss")
    assert len(table) == 4 and table.id("loss", "loss") == loss
    assert [table.key(i) for i in range(4)] == [("grad", "fc.weight"), ("exp_avg", "fc.bias"),
                                                ("grad", "head.weight"), ("loss", "loss")]
    assert table.names[:] == ["fc.weight", "fc.bias", "head.weight", "loss"] and table.names[2] == "head.weight"
    assert list(table.order) == [4 * PLACE + 3, 6 * PLACE + 1, 4 * PLACE, 2 * PLACE]
    assert table.places(2) == {"grad\tfc.weight": 4 * PLACE + 3, "exp_avg\tfc.bias": 6 * PLACE + 1}


def test_series_added_out_of_the_slots_order_are_found_by_slot_and_by_name():
    table = SeriesTable()
    slots = [table.params.add(f"p{k}") for k in range(5)]
    grads = [table.slot_id("grad", s, s) for s in slots]  # in the slots' order: ids found by arithmetic
    local = [table.slot_id("grad_local", s) for s in slots[::-1]]  # DDP's buckets: backward's order
    assert grads == [0, 1, 2, 3, 4] and local == [5, 6, 7, 8, 9]
    assert [table.slot_id("grad", s) for s in slots] == grads  # nothing added
    assert [table.slot_id("grad_local", s) for s in slots] == local[::-1]
    assert [table.find("grad_local", f"p{k}") for k in range(5)] == local[::-1]
    skipped = table.slot_id("exp_avg", 3), table.slot_id("exp_avg", 1), table.slot_id("exp_avg", 4)
    assert skipped == (10, 11, 12) and table.find("exp_avg", "p0") is None and table.find("exp_avg", "p2") is None
    assert [table.key(i) for i in skipped] == [("exp_avg", "p3"), ("exp_avg", "p1"), ("exp_avg", "p4")]
    assert len(table) == 13 and len({table.key(i) for i in range(13)}) == 13


def test_a_monitor_names_each_parameters_series_once(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with opscope.monitor(tmp_path / "m", targets=["grads", "optimizer", "loss", "lr"], report=False) as m:
        for _ in range(3):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            m.step(loss=loss)
    keys = [m.series.key(i) for i in range(len(m.series))]
    assert len(set(keys)) == len(keys) == 3 * 4 + 2
    names = [n for n, _ in model.named_parameters()]
    assert {n for k, n in keys if k == "grad"} == set(names) == {n for k, n in keys if k == "exp_avg_sq"}
    assert len(m.series.params) == len(names)  # each parameter's name once, whatever its series
    rank = m.result.ranks[0]
    assert set(rank.order) == set(keys)
    assert rank.values[("grad", "2.weight", "norm")][0] == [0, 1, 2]
    assert np.isfinite(rank.values[("exp_avg_sq", "0.bias", "norm")][1]).all()


@pytest.mark.parametrize("groups", [1, 2])
def test_parameters_the_hooks_do_not_know_are_named_by_group_and_index(tmp_path, groups):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    extra = torch.nn.Parameter(torch.ones(3))  # in the optimizer, not in the model
    params = [{"params": [model.weight, model.bias]}, {"params": [extra]}] if groups == 2 else \
        [{"params": [model.weight, model.bias, extra]}]
    opt = torch.optim.SGD(params, lr=1e-2)
    with opscope.monitor(tmp_path / "m", model=model, targets=["grads", "weights"], report=False) as m:
        for _ in range(2):
            (model(torch.randn(8, 4)).pow(2).mean() + extra.sum()).backward()
            opt.step()
            opt.zero_grad()
            m.step()
    name = "group1.param0" if groups == 2 else "group0.param2"
    keys = {m.series.key(i) for i in range(len(m.series))}
    assert {("grad", name), ("weight", name), ("grad", "weight"), ("weight", "bias")} <= keys
    first = m.result.ranks[0].values[("weight", name, "norm")][1][0]  # after one step of SGD
    assert first == pytest.approx(0.99 * 3 ** 0.5, rel=1e-6)
