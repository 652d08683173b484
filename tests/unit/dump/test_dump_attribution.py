"""Which module and phase a row is given in real training code: custom autograd Functions,
gradient clipping between backward and the optimizer step, gradient accumulation. Both
capture paths (the native observer and the Python dispatch mode)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import opscope


class DoubleGrad(torch.autograd.Function):
    """x * sigmoid(x) forward; a backward of its own, made of several ops."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s)))


class Act(nn.Module):
    """Calls the Function after its own child (fc), whose node comes just before."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return DoubleGrad.apply(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.act = Act()
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.pre(x)))


def _rows(path: Any, backend: str, monkeypatch: Any, train: Any, **keys: Any) -> list[dict]:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # the last of three steps: before the first d.step() a second forward without an
    # optimizer step in between would end step 0 (step detection)
    with opscope.dump(path, steps=[2], overwrite=True, **keys) as d:
        for _ in range(3):
            train(model, x, opt)
            d.step()
    dump = opscope.load(path)
    assert (dump.manifest["stats_backend"] == "native") == (backend == "native")
    return dump.records().to_pylist()


def _plain_step(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("mode", ["all", "output"])
@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_custom_functions_backward_belongs_to_the_module_that_applied_it(tmp_path, monkeypatch, backend, mode):
    rows = _rows(tmp_path / "d", backend, monkeypatch, _plain_step, mode=mode)
    own = [r for r in rows if r["phase"] == "backward" and r["node"] == "DoubleGradBackward"]
    assert {r["op"] for r in own} >= {"aten.sigmoid.default", "aten.mul.Tensor"}
    # not act.fc, whose addmm made the autograd node just before the Function's
    assert {(r["module"], r["fwd_op"]) for r in own} == {("act", "DoubleGrad")}
    # the nodes around it keep theirs, also when input rows are not recorded (mode="output")
    fc = {r["module"] for r in rows if r["phase"] == "backward" and r["node"] == "AddmmBackward0"}
    assert fc == {"pre", "act.fc", "head"}


def _clipped_accumulation(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> None:
    for half in (x[:2], x[2:]):  # two micro-batches: the second forward comes after a backward
        model(half).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01, foreach=True)
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize(("backend", "level"), [("native", "aten"), ("python", "aten"), ("python", "api")])
def test_gradient_clipping_before_the_optimizer_step_is_backward(tmp_path, monkeypatch, backend, level):
    rows = _rows(tmp_path / "d", backend, monkeypatch, _clipped_accumulation, level=level)
    ours = [r for r in rows if r["io"] == "output"]
    clip = [r for r in ours if "norm" in r["op"] and "layer_norm" not in r["op"]]
    assert clip and {r["phase"] for r in clip} == {"backward"}, clip
    assert all(r["node"] is None and r["module"] == "" for r in clip)
    # both micro-batches' forwards stay forward, the second one after a backward included
    linear = "aten.addmm.default" if level == "aten" else "torch.nn.functional.linear"
    head = [r["phase"] for r in ours if r["module"] == "head" and r["op"] == linear and r["node"] is None]
    assert head == ["forward", "forward"]
    # and the optimizer's own rows stay optimizer
    assert {r["phase"] for r in rows if r["op"] == "SGD.step"} == {"optimizer"}


SHARED = nn.Tanh()  # one module object that two layers call


class Mixer(nn.Module):
    """Makes its activation at each call (as transformers' Mamba reference kernels do with
    ACT2FN[...]): a module of no model, another object each time, often at a freed one's id."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SHARED(nn.SiLU()(self.proj(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Mixer(), Mixer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.sum()


@pytest.mark.parametrize(("backend", "level"), [("native", "aten"), ("python", "aten"), ("native", "module")])
def test_a_module_of_no_model_is_named_after_its_caller_at_every_call(tmp_path, monkeypatch, backend, level):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    model, x = Stack(), torch.randn(3, 8)
    with opscope.dump(tmp_path / "d", level=level, phases=["forward"]) as d:
        for _ in range(3):
            model(x).backward()
            d.step()
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    for op, name in (("silu", "SiLU"), ("tanh", "Tanh")):
        found = rows[(rows.op.str.contains(op, case=False) | (rows.op == name)) & (rows.io == "output")]
        for step in range(3):
            paths = found[found.step == step].module.tolist()
            assert paths == [f"layers.0.{name}", f"layers.1.{name}"], (step, paths)
