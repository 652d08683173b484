"""Which module calls may carry keyword arguments: only those have _call_impl's frame read."""

from __future__ import annotations

import functools

import torch
from torch import nn

import opscope
from opscope.capture.torch import module_kwargs as mk


class Masked(nn.Module):
    def forward(self, x, mask=None):
        return x if mask is None else x * mask


class Loose(nn.Module):
    def forward(self, x, **extra):
        return x


class KeywordOnly(nn.Module):
    def forward(self, x, *, scale=1.0):
        return x * scale


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.masked = nn.Linear(4, 4), Masked()

    def forward(self, x, mask):
        return self.masked(self.lin(x), mask=mask)


def test_a_call_that_fills_every_parameter_positionally_takes_no_keywords():
    x = torch.ones(2)
    assert not mk.may_take_keywords(nn.Linear(2, 2), (x,))
    assert mk.may_take_keywords(Masked(), (x,)) and not mk.may_take_keywords(Masked(), (x, x))
    assert mk.may_take_keywords(Loose(), (x,)) and mk.may_take_keywords(KeywordOnly(), (x,))
    patched = nn.Linear(2, 2)
    patched.forward = lambda x, **kw: x  # an instance's own forward is the one called
    assert mk.may_take_keywords(patched, (x,))
    wrapped = nn.Linear(2, 2)
    inner = wrapped.forward
    wrapped.forward = functools.wraps(inner)(lambda *a, **kw: inner(*a))  # (accelerate's hooks)
    assert mk.may_take_keywords(wrapped, (x,))


def test_keyword_tensors_are_recorded_and_positional_calls_skip_the_frame(tmp_path, monkeypatch):
    reads = []
    real = mk.call_kwargs
    monkeypatch.setattr(mk, "call_kwargs", lambda depth=2: (reads.append(depth), real(depth + 1))[1])
    model = Net()
    x, mask = torch.randn(3, 4), torch.tensor([1.0, 0.0, 1.0, 0.0])
    with opscope.dump(tmp_path / "d", level="module") as d:
        model(x, mask)
        d.step()
    rows = opscope.load(tmp_path / "d").records().to_pylist()
    ins = [(r["module"], r["arg"]) for r in rows if r["io"] == "input"]
    assert ("masked", "mask") in ins and ("lin", None) in ins  # the keyword tensor, and the positional one
    assert len(reads) == 1  # the Masked call read the frame; the model's and the Linear's did not
