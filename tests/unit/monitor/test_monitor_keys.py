"""The detector's smallest moves as keys: ``move_decades`` (a norm) and ``loss_rise`` (the loss)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import opscope
from opscope.config import monitor_config
from opscope.errors import ConfigError
from opscope.monitor.detect import BandDetector
from opscope.monitor.registry import SeriesTable


def _train_with_a_10x_gradient(path, jump_at: int = 20, steps: int = 30, **keys) -> list:
    """A real model on one fixed batch (smooth gradients); its first layer's gradient 10x at one step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with opscope.monitor(path, model=model, optimizer=opt, targets=["grads"], report=False, **keys) as m:
        for step in range(steps):
            hook = model[0].weight.register_hook(lambda g: g * 10) if step == jump_at else None
            (model(x) - y).pow(2).mean().backward()
            if hook is not None:
                hook.remove()
            opt.step()
            opt.zero_grad()
    return m.events


def test_a_10x_gradient_jump_fires_with_half_a_decade_and_not_by_default(tmp_path):
    assert _train_with_a_10x_gradient(tmp_path / "default") == []  # 1 decade < the default 2 (100x)
    events = _train_with_a_10x_gradient(tmp_path / "sensitive", move_decades=0.5)
    assert [e.step for e in events] == [20]
    assert events[0].first.name == "0.weight" and 8 < events[0].first.factor < 12


def test_loss_rise_is_the_loss_smallest_rise():
    def events(**keys) -> list:
        det = BandDetector(16, 8.0, 6, SeriesTable(), **keys)
        loss = det.series.id("loss", "loss", None)
        found = []
        for step in range(40):  # a flat loss, then 15% higher from step 25
            value = 2.0 * (1 + 0.001 * (step % 3)) * (1.15 if step >= 25 else 1)
            event = det.update(step, 0, np.array([loss]), np.array([value]), np.zeros(1))
            found += [event.step] if event is not None else []
        return found

    assert events() == []  # below the default 25%
    assert events(loss_rise=0.1) == [25]


@pytest.mark.parametrize(("keys", "message"), [
    ({"move_decades": 0}, "move_decades: 0 is not a positive number; give one such as 1.0"),
    ({"move_decades": "big"}, "move_decades: 'big' is not a positive number"),
    ({"loss_rise": -0.1}, "loss_rise: -0.1 is not a positive number; give one such as 0.1"),
    ({"loss_rise": float("nan")}, "loss_rise: nan is not a positive number"),
])
def test_a_bad_smallest_move_is_refused_naming_the_key(keys, message):
    with pytest.raises(ConfigError, match=message):
        opscope.monitor("unused", **keys)


def test_the_keys_in_a_config_file_and_their_defaults(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"monitor": {"move_decades": 1, "loss_rise": 0.1}}))
    cfg = monitor_config(path)
    assert (cfg.move_decades, cfg.loss_rise) == (1.0, 0.1)
    assert (monitor_config({}).move_decades, monitor_config({}).loss_rise) == (2.0, 0.25)
    assert monitor_config(path, move_decades=0.5).move_decades == 0.5  # a keyword over the file
