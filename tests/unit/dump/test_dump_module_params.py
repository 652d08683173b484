"""Module level: a parameter that a wrapper sets on a module after the model was indexed is read
as the parameter it is, by the name its module gives it.

FSDP2 keeps each layer's weights sharded and, before the layer's forward, sets the unsharded
weights on its modules (new ``nn.Parameter`` objects, made at the first forward). Unnamed,
such a weight read as a tensor that no op made, which compare takes for the enclosing module's
own code: with FSDP2, a weight the last update changed named the module around it a culprit."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch import nn

import opscope
from opscope.capture.torch.modules import ModuleTracker


class _Layer(nn.Module):
    """A Linear whose weight, as FSDP2 does it, is swapped for a gathered one around each forward."""

    def __init__(self, nudge: float) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.Tanh()
        self.nudge = nudge  # added to the gathered weight from the second forward on
        self.held: list[nn.Parameter] = []  # [the shard, the gathered weight]: no module attribute
        self.register_forward_pre_hook(self._gather, prepend=True)
        self.register_forward_hook(self._release)

    def _gather(self, module: nn.Module, args: Any) -> None:
        if not self.held:
            shard = self.lin._parameters["weight"]
            assert shard is not None
            self.held = [shard, nn.Parameter(torch.empty_like(shard))]
        shard, gathered = self.held
        with torch.no_grad():
            gathered.copy_(shard)
            if self.nudge and self.lin.bias.grad is not None:  # from the second forward on
                gathered.add_(self.nudge)
        self.lin._parameters["weight"] = gathered

    def _release(self, module: nn.Module, args: Any, output: Any) -> None:
        self.lin._parameters["weight"] = self.held[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


class _Model(nn.Module):
    def __init__(self, nudge: float) -> None:
        super().__init__()
        self.layer = _Layer(nudge)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x)).sum()


def _dump(path: Any, backend_name: str, monkeypatch: pytest.MonkeyPatch, nudge: float = 0.0) -> Any:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model, x = _Model(nudge), torch.randn(3, 8)
    with opscope.dump(path, level="module") as d:
        for _ in range(2):
            model(x).backward()
            d.step()
    return path


@pytest.mark.parametrize("backend_name", ["native", "python"])
def test_a_weight_set_after_indexing_is_a_parameter_by_its_modules_name(tmp_path, monkeypatch, backend_name):
    rows = opscope.load(_dump(tmp_path / "d", backend_name, monkeypatch)).records().to_pandas()
    weight = rows[(rows.module == "layer.lin") & (rows.arg == "weight")]
    assert list(weight.step) == [0, 1]
    assert list(weight.io) == ["param", "param"]
    assert list(weight.param) == ["layer.lin.weight", "layer.lin.weight"]
    bias = rows[(rows.module == "layer.lin") & (rows.arg == "bias")]
    assert list(bias.param) == ["layer.lin.bias", "layer.lin.bias"], "indexed parameters keep their names"


@pytest.mark.parametrize("backend_name", ["native", "python"])
def test_a_changed_gathered_weight_is_named_not_the_module_around_it(tmp_path, monkeypatch, backend_name):
    reference = _dump(tmp_path / "ref", backend_name, monkeypatch)
    target = _dump(tmp_path / "target", backend_name, monkeypatch, nudge=1e-3)
    result = opscope.compare(target, reference)
    first = result.first_divergence
    assert first is not None and first.step == 1
    assert first.param == "layer.lin.weight", result.culprits
    assert all(f.io != "its own code" for f in result.culprits), result.culprits


def test_a_learnt_name_goes_with_its_tensor():
    tracker = ModuleTracker(lambda m: None)
    lin = nn.Linear(2, 2)
    tracker.index(lin)
    lin._parameters["weight"] = nn.Parameter(torch.zeros(2, 2))
    ident = id(lin._parameters["weight"])
    assert tracker.learn(lin, "") == [(lin._parameters["weight"], "weight")]
    assert tracker.param_names[ident] == "weight"
    assert tracker.learn(lin, "") == [], "named once"
    del lin._parameters["weight"]
    gc.collect()
    assert ident not in tracker.param_names, "a later tensor with its id would take its name"
