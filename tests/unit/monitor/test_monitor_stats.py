"""The two statistics engines agree, NaN/Inf are counted on both, and nothing read is changed."""

from __future__ import annotations

import math

import pytest
import torch

from opscope.monitor import stats
from opscope.monitor.stats import Pending


def tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    a = torch.randn(300, 7)
    b = torch.randn(64).bfloat16()
    c = torch.randn(5, 9).t()  # not contiguous
    d = torch.randn(1000)
    d[3], d[10], d[11] = math.nan, math.inf, -math.inf
    e = torch.randn(50).half()
    e[0] = math.inf
    return [a, b, c, d, e]


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch-ops"])
def test_norm_max_and_counts(native, monkeypatch):
    monkeypatch.setattr(stats, "NATIVE", native)
    ts = tensors()
    before = [t.clone() for t in ts]
    got = Pending(ts).values()
    for t, (norm, mx, nan, inf) in zip(ts[:3], got[:3], strict=True):
        ref = t.double()
        assert norm == pytest.approx(float(ref.norm()), rel=1e-5)
        assert mx == pytest.approx(float(ref.abs().max()), rel=1e-6)
        assert (nan, inf) == (0, 0)
    assert math.isnan(got[3][0]) and list(got[3][2:]) == [1, 2]
    assert got[4][0] == math.inf and list(got[4][2:]) == [0, 1]
    assert all(torch.equal(x, y) or (x.isnan() == y.isnan()).all() for x, y in zip(ts, before, strict=True))


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch-ops"])
def test_activations_are_not_kept_alive(native, monkeypatch):
    import weakref

    monkeypatch.setattr(stats, "NATIVE", native)
    t = torch.randn(100)
    t[5] = math.nan
    gone = weakref.ref(t)
    pending = Pending([t], keep=False)
    del t
    assert gone() is None  # freed before the statistics are read
    norm, mx, nan, inf = pending.values()[0]
    assert math.isnan(norm) and math.isnan(mx)
    assert (nan, inf) == (1, 0) if native else math.isnan(nan)  # the CPU kernel counts at once
