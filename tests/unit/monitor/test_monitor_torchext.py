"""The gradients handed to the batched kernel by the monitor's torch extension (one call, no
Python per tensor) give the Python path's statistics bit for bit, stay alive until they are
read, and anything the kernel does not read goes back to the Python path."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

import opscope
from opscope.monitor import stats, torchext


@pytest.fixture(scope="module")
def ext():
    if not (stats.NATIVE and stats.BATCHED):
        pytest.skip("the batched kernel is not built here")
    module = torchext.load()
    if module is None:
        pytest.skip("the monitor's torch extension cannot be built here")
    return module


def params_with_grads() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    shapes = [((300, 7), torch.float32), ((64,), torch.bfloat16), ((50,), torch.float16),
              ((5000,), torch.float64), ((4097,), torch.float16), ((3,), torch.float32)]
    params = [torch.nn.Parameter(torch.zeros(shape, dtype=dtype)) for shape, dtype in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 10
    params[2].grad[0] = math.inf
    params[3].grad[5] = math.nan
    return params


def test_the_extensions_batch_is_the_python_paths_bit_for_bit(ext):
    params = params_with_grads()
    expected = stats.Pending([p.grad for p in params], background=True)
    want = expected.values()
    pending = stats.background_grads(params, ext)
    assert pending is not None and ext.held() == len(params)
    got = pending.values()
    assert ext.held() == 0  # released once joined
    assert got.tobytes() == want.tobytes()
    assert got[0][0] == pytest.approx(float(params[0].grad.double().norm()), rel=1e-6)
    assert pending.finite is expected.finite is False  # an Inf and a NaN: counted
    for p in params[2:4]:
        p.grad.nan_to_num_(0.0, 0.0, 0.0)
    clean = stats.background_grads(params, ext)
    assert clean is not None
    clean.values()
    assert clean.finite


def test_the_gradients_stay_alive_until_the_batch_is_joined(ext):
    params = params_with_grads()
    want = stats.Pending([p.grad for p in params]).values()
    refs = [weakref.ref(p.grad) for p in params]
    pending = stats.background_grads(params, ext)
    for p in params:  # as zero_grad(set_to_none=True) would: the parameters let them go
        p.grad = None
    gc.collect()
    litter = [torch.full((5000,), 7.0, dtype=torch.float64) for _ in range(20)]  # would take freed memory
    assert all(r() is not None for r in refs)  # the extension holds them
    got = pending.values()
    assert got.tobytes() == want.tobytes()
    assert all(r() is None for r in refs) and litter  # and lets them go once read


def _cases() -> dict[str, list[torch.nn.Parameter]]:
    def made(change):
        params = params_with_grads()
        change(params)
        return params

    def subclass(params):
        class Tagged(torch.Tensor):
            pass
        params[1] = torch.zeros(3).as_subclass(Tagged).requires_grad_()
        params[1].grad = torch.ones(3).as_subclass(Tagged)

    return {
        "no gradient": made(lambda ps: setattr(ps[4], "grad", None)),
        "an empty gradient": made(lambda ps: ps.append(torch.nn.Parameter(torch.zeros(0)))
                                  or setattr(ps[-1], "grad", torch.zeros(0))),
        "not contiguous": made(lambda ps: setattr(ps[0], "grad", torch.randn(7, 300).t())),
        "an integer tensor": made(lambda ps: ps.insert(0, torch.zeros(4, dtype=torch.int64))),
        "a subclass": made(subclass),
        "not a tensor": made(lambda ps: ps.append(3.0)),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_what_the_kernel_does_not_read_goes_back_to_python(ext, case):
    params = _cases()[case]
    assert stats.background_grads(params, ext) is None
    assert ext.held() == 0  # nothing held, nothing in flight
    assert not stats._RELEASE and not stats._INFLIGHT


def test_a_monitor_records_the_same_gradients_with_and_without_the_extension(ext, tmp_path, monkeypatch):
    """Every step's gradient statistics, the extension's path against the Python path on the same
    run; a step where a parameter has no gradient (frozen for it) goes through Python and back."""
    runs = []
    calls = []
    background_grads = stats.background_grads

    def counted(params, extension):
        pending = background_grads(params, extension)
        calls.append(pending is not None)
        return pending

    monkeypatch.setattr(stats, "background_grads", counted)
    for path in ("extension", "python"):
        if path == "python":
            monkeypatch.setattr(torchext, "load", lambda: None)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        opt = torch.optim.Adam([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 1e-3}])
        with opscope.monitor(tmp_path / path, targets=["grads", "lr"], report=False) as m:
            for i in range(6):
                model[0].weight.requires_grad_(i != 3)
                model(torch.randn(4, 8)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                m.step()
        runs.append(m.result.ranks[0].values)
    assert calls == [True, True, False, True, True]  # not at the first step (ids found there), nor with a grad missing
    assert runs[0].keys() == runs[1].keys()
    for key, (steps, values) in runs[0].items():
        assert (steps, values) == runs[1][key], key
    assert runs[0][("grad", "0.weight", "norm")][0] == [0, 1, 2, 4, 5]
    assert runs[0][("lr", "lr.group1", "value")][1] == [1e-3] * 6
