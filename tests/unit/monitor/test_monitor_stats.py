"""The statistics engines agree, NaN/Inf are counted on each, and nothing read is changed."""

from __future__ import annotations

import math

import numpy as np
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
    f = torch.randn(5000, dtype=torch.float64) * 1e3
    g = torch.randn(4097).half()  # more than a block, a tail
    return [a, b, c, d, e, f, g]


ENGINES = {"batched": (True, True), "per-tensor": (True, False), "torch-ops": (False, False)}


@pytest.mark.parametrize("background", [False, True], ids=["now", "background"])
@pytest.mark.parametrize("engine", list(ENGINES))
def test_norm_max_and_counts(engine, background, monkeypatch):
    native, batched = ENGINES[engine]
    if batched and not stats.BATCHED:
        pytest.skip("the batched kernel is not built here")
    monkeypatch.setattr(stats, "NATIVE", native)
    monkeypatch.setattr(stats, "BATCHED", batched)
    ts = tensors()
    before = [t.clone() for t in ts]
    got = Pending(ts, background=background).values()
    for t, (norm, mx, nan, inf) in zip(ts[:3] + ts[5:], np.concatenate([got[:3], got[5:]]), strict=True):
        ref = t.double()
        assert norm == pytest.approx(float(ref.norm()), rel=1e-5)
        assert mx == pytest.approx(float(ref.abs().max()), rel=1e-6)
        assert (nan, inf) == (0, 0)
    assert math.isnan(got[3][0]) and list(got[3][2:]) == [1, 2]
    assert got[4][0] == math.inf and list(got[4][2:]) == [0, 1]
    assert all(torch.equal(x, y) or (x.isnan() == y.isnan()).all() for x, y in zip(ts, before, strict=True))


def test_the_batched_kernel_sums_squares_that_overflow_float32_in_double():
    if not stats.BATCHED:
        pytest.skip("the batched kernel is not built here")
    big = torch.full((3000,), 3e25)  # finite, its squares are not in float32 (the other engines say inf)
    norm, mx, nan, inf = Pending([big, big[::2]]).values()[0]
    assert norm == pytest.approx(3e25 * math.sqrt(3000), rel=1e-6) and mx == pytest.approx(3e25)
    assert (nan, inf) == (0, 0)


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


def test_a_background_batch_joined_at_any_point_gives_the_same_bits():
    """join() reduces the tensors the kernel's thread has not taken yet (on a loaded machine it
    may not have run at all) and waits for the one it is reading: whoever takes a tensor, its
    statistics are the synchronous call's, bit for bit, and every tensor is reduced once."""
    if not stats.BATCHED:
        pytest.skip("the batched kernel is not built here")
    import time

    kernel = stats._monstats
    torch.manual_seed(1)
    ts = [torch.randn(n) * s for n, s in [(40_000, 1.0), (3, 1e20), (70_000, 1e-3), (2048, 1.0), (9_001, 5.0)] * 8]
    ts += [torch.randn(5000).half(), torch.randn(3000).bfloat16(), torch.randn(777, dtype=torch.float64)]
    codes = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
    meta = np.array([t.data_ptr() for t in ts] + [t.numel() for t in ts] + [codes[t.dtype] for t in ts], np.int64)
    ref = np.empty((len(ts), 4))
    kernel.norms(meta, ref)
    for delay in [0.0, 0.0, 1e-5, 1e-4, 1e-3, 0.0, 5e-5] * 10:
        out = np.full((len(ts), 4), -1.0)
        kernel.start(meta, out)
        if delay:
            time.sleep(delay)
        kernel.join()
        assert out.tobytes() == ref.tobytes()
    kernel.join()  # nothing in flight: returns at once


@pytest.mark.parametrize("background", [False, True], ids=["now", "background"])
def test_finite_says_whether_the_kernel_saw_a_nan_or_inf(background):
    """The session skips the Adam-eps check (numpy calls on the training thread) on ``finite``:
    it must be False whenever any tensor read holds a NaN or an Inf, or was not the kernel's."""
    if not stats.BATCHED:
        pytest.skip("the batched kernel is not built here")
    clean = [torch.randn(3000), torch.randn(10).half()]
    nan, inf = torch.randn(50), torch.randn(5000).bfloat16()
    nan[7], inf[4999] = math.nan, -math.inf
    cases = [(clean, True), ([*clean, nan], False), ([inf, *clean], False), ([*clean, torch.randn(4, 4).t()], False)]
    for ts, finite in cases:
        pending = Pending(ts, background=background)
        assert not pending.finite  # known only once read
        pending.values()
        assert pending.finite is finite
    first = Pending(clean, background=True)
    second = Pending(clean, background=True)  # joins the first: its count is not the first's to claim
    first.values()
    assert not first.finite  # joined by the second's start: its count is not known, so not claimed
    second.values()
    assert second.finite


@pytest.mark.parametrize("pattern", [(0.006,), (0.001, 0.007)], ids=["one-a-step", "two-a-step"])
def test_batches_at_a_steady_pace_meet_the_worker_woken_on_its_own(pattern):
    """At a steady pace the kernel's thread wakes on its own (a timed wait) before the next batch
    is expected, then waits again (monstats.c, PREWAKE_NS); a batch that comes before, during or
    after that wake is reduced whole, the same bits as the synchronous call's."""
    if not stats.BATCHED:
        pytest.skip("the batched kernel is not built here")
    import time

    kernel = stats._monstats
    ts = [torch.randn(50_000), torch.randn(3000).bfloat16(), torch.randn(10, dtype=torch.float64)]
    codes = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 3}
    meta = np.array([t.data_ptr() for t in ts] + [t.numel() for t in ts] + [codes[t.dtype] for t in ts], np.int64)
    ref = np.empty((len(ts), 4))
    kernel.norms(meta, ref)
    for i in range(24):
        time.sleep(pattern[i % len(pattern)] * (3.0 if i == 15 else 1.0))  # and once late
        out = np.full((len(ts), 4), -1.0)
        kernel.start(meta, out)
        time.sleep(0.0005)
        kernel.join()
        assert out.tobytes() == ref.tobytes()
