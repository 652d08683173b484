"""Tensors on another device (CUDA, NPU) measured by the native observer: torch reductions
issued from C++ and read back at the step's end (native/_c/dumpobs_device.h), run here on CPU
tensors routed as if they lay on another device (``route_device``)."""

from __future__ import annotations

import math

import pytest
import torch
from dump_helpers import small_transformer, train_with

import opscope
from opscope.capture.torch.native import aten as native_aten
from opscope.capture.torch.native import build as native
from opscope.capture.torch.stats import cpu_stats, device_stats, materialize_one
from opscope.errors import ConfigError

STATS = ["min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash"]


@pytest.fixture
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump observer did not build: {native.error('_opscope_dump')}"
    return module


def _cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 19, generator=g)
    weird = x.clone()
    weird[3, 4], weird[5, 6], weird[0, 0] = math.nan, math.inf, 0.0
    return [
        x,  # float32, 703 elements
        x.t(),  # non-contiguous: its elements in row-major order
        x.to(torch.bfloat16)[1:, 2:],  # 16-bit elements from an offset of no whole word (21)
        x.to(torch.float16).flatten()[1:-1],  # ditto (1), and an odd count (701): a padded word
        x.double() * 1e200,  # float64: squares past float64's range
        weird,  # NaN, Inf and a zero
        torch.full((5,), torch.finfo(torch.float32).max),  # a sum past float32's range
        torch.tensor(2.5),  # 0-d
        torch.empty(0, 3),  # no element
        torch.randint(-2**40, 2**40, (33,), generator=g),  # int64
        torch.randint(-2**31, 2**31 - 1, (17,), generator=g, dtype=torch.int32),
        torch.randint(-128, 127, (13,), generator=g, dtype=torch.int8),
        torch.randint(0, 255, (7, 3), generator=g, dtype=torch.uint8),
        x[:, :3] > 0,  # bool, non-contiguous
        torch.complex(x[:4], x[4:8]),  # complex64: its real view
    ]


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _clone_inputs(path) -> list[dict]:
    rows = opscope.load(path).records().to_pylist()
    return [r for r in rows if ".clone." in r["op"] and r["io"] == "input"]


def _route(backend, monkeypatch, staging: int, mode: int = 1) -> None:
    """Every tensor through the device path, with ``staging`` bytes of buffer (0: each alone);
    mode 2: as on a device where a buffer's reduction fails (its tensors then reduced alone)."""
    monkeypatch.setenv("OPSCOPE_DEVICE_STAGING_MB", str(staging / (1 << 20)))  # (read as the dump starts)
    backend.route_device(mode)


@pytest.mark.parametrize(("staging", "mode"), [(0, 1), (1 << 20, 1), (512, 1), (1 << 20, 2)])
def test_device_statistics_are_those_of_the_python_device_path(tmp_path, monkeypatch, backend, staging, mode):
    """Alone (staging 0), a tensor's statistics are device_stats' bit for bit; in a buffer (all
    of them in one, or a buffer of 512 bytes: some alone, the others over several buffers), or
    from a buffer whose reduction failed, its sums are taken in another order: the same but for
    the last bits of mean, std and norm."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    cases = _cases()
    _route(backend, monkeypatch, staging, mode)
    try:
        with opscope.dump(tmp_path / "d", level="aten") as d:
            for t in cases:
                t.clone()
            d.step()
    finally:
        backend.route_device(0)
    rows = _clone_inputs(tmp_path / "d")
    assert len(rows) == len(cases)
    for t, row in zip(cases, rows, strict=True):
        want = dict(zip(STATS, materialize_one(device_stats(t)), strict=True))
        got = {k: row[k] for k in STATS}
        exact = STATS if staging == 0 else ["min", "max", "absmax", "nan", "inf", "zeros", "hash"]
        assert all(_same(got[k], want[k]) for k in exact), (t.dtype, tuple(t.shape), got, want)
        for k in set(STATS) - set(exact):
            assert _same(got[k], want[k]) or got[k] == pytest.approx(want[k], rel=1e-12), (k, t.dtype, got, want)
        kernel = dict(zip(STATS, cpu_stats(t), strict=True))  # the C kernel: the same hash and counts
        assert all(_same(got[k], kernel[k]) for k in ("min", "max", "nan", "inf", "zeros", "hash")), (t.dtype, got)


def test_device_statistics_call_no_python_per_tensor(tmp_path, monkeypatch, backend):
    calls = []
    real = native_aten._Hooks.slow
    monkeypatch.setattr(native_aten._Hooks, "slow", lambda self, i, t: (calls.append(i), real(self, i, t)))
    for route in ("route_slow", "route_device"):
        calls.clear()
        getattr(backend, route)(True)
        try:
            losses, dump = train_with("native", monkeypatch, tmp_path / route, 2, small_transformer)
        finally:
            getattr(backend, route)(False)
        rows = dump.records().to_pylist()
        assert all(r["hash"] is not None for r in rows if r["numel"])
        if route == "route_slow":
            assert len(calls) > 100  # the Python path: one call a tensor
        else:
            assert calls == []


def test_a_training_run_through_the_device_path_matches_the_kernels_rows(tmp_path, monkeypatch, backend):
    losses, kernel = train_with("native", monkeypatch, tmp_path / "k", 2, small_transformer, data="tensor")
    _route(backend, monkeypatch, 4096)  # many buffers a step, beside the tensors reduced alone
    try:
        device_losses, device = train_with("native", monkeypatch, tmp_path / "d", 2, small_transformer,
                                           data="tensor")
    finally:
        backend.route_device(0)
    assert device_losses == losses  # the numbers observed are not changed
    a, b = kernel.records().to_pylist(), device.records().to_pylist()
    assert len(a) == len(b) > 500
    for ra, rb in zip(a, b, strict=True):
        assert (ra["op"], ra["io"], ra["key"]) == (rb["op"], rb["io"], rb["key"])
        assert all(_same(ra[k], rb[k]) for k in ("min", "max", "nan", "inf", "zeros", "hash")), (ra, rb)
        for k in ("mean", "norm"):  # float sums in another order
            assert ra[k] is None and rb[k] is None or rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-6), (k, ra, rb)
        # the device path's spread is its float64 sums' (sumsq - sum^2 / n): off by ~2^-26 |mean|
        # where the values are constant (a loss), the kernel's exact there (fastats_spread.h)
        assert ra["std"] is None and rb["std"] is None or abs(ra["std"] - rb["std"]) <= (
            1e-6 * ra["std"] + 1e-7 * ra["absmax"]), ra
        if ra["data"] and ra["producer"] is None:
            assert kernel.row_tensor(ra, raw=True).tobytes() == device.row_tensor(rb, raw=True).tobytes()



def test_tensors_python_reduces_on_their_device_reach_their_rows(tmp_path, monkeypatch, backend):
    """What the native path leaves to Python on another device (a dtype or view it does not
    reduce) is reduced there and read at the step's end; the pending reductions (a tuple) were
    once taken for finished statistics, and the step's end failed."""
    losses, kernel = train_with("native", monkeypatch, tmp_path / "k", 2, small_transformer)
    monkeypatch.setattr(native_aten, "on_host", lambda t: False)
    backend.route_slow(True)
    try:
        slow_losses, slow = train_with("native", monkeypatch, tmp_path / "s", 2, small_transformer)
    finally:
        backend.route_slow(False)
    assert slow_losses == losses and slow.status == "complete"
    a, b = kernel.records().to_pylist(), slow.records().to_pylist()
    assert len(a) == len(b) > 500
    assert all(all(_same(ra[k], rb[k]) for k in ("min", "max", "nan", "inf", "zeros", "hash")) for ra, rb in zip(a, b))


@pytest.mark.parametrize("text", ["eight", "-1"])
def test_a_staging_size_that_is_no_size_is_refused_with_what_to_set(tmp_path, monkeypatch, text):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    monkeypatch.setenv("OPSCOPE_DEVICE_STAGING_MB", text)
    refused = pytest.raises(ConfigError, match=f"OPSCOPE_DEVICE_STAGING_MB='{text}'.*0 reduces each tensor alone")
    with refused, opscope.dump(tmp_path / "d", level="aten"):
        torch.ones(2).clone()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device (run where one is lent)")
@pytest.mark.parametrize("staging", [0, 1 << 20, 512])
def test_cuda_tensors_get_the_kernels_hash_and_counts(tmp_path, monkeypatch, staging):
    """The real device: each CUDA tensor's row holds the hash, min, max and counts the C kernel
    gives for the same values on the host, and sums within rounding of the host's."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    monkeypatch.setenv("OPSCOPE_DEVICE_STAGING_MB", str(staging / (1 << 20)))
    cases = [t.cuda() for t in _cases()]
    with opscope.dump(tmp_path / "d", level="aten") as d:
        for t in cases:
            t.clone()
        d.step()
    rows = _clone_inputs(tmp_path / "d")
    assert len(rows) == len(cases)
    for t, row in zip(cases, rows, strict=True):
        kernel = dict(zip(STATS, cpu_stats(t.cpu()), strict=True))
        assert all(_same(row[k], kernel[k]) for k in ("min", "max", "nan", "inf", "zeros", "hash")), (t.dtype, row)
        for k in ("mean", "norm"):
            assert _same(row[k], kernel[k]) or row[k] == pytest.approx(kernel[k], rel=1e-5, abs=1e-6), (k, row)


def test_a_crash_mid_step_leaves_the_steps_device_statistics_in_the_dump(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5))
    _route(backend, monkeypatch, 8 << 20)
    try:
        with pytest.raises(RuntimeError, match="the user's training crashed"), \
                opscope.dump(tmp_path / "d", level="aten") as d:
            (x @ x).sum()
            d.step()
            (x * 2).relu()  # pending in the buffer when the step is cut short
            raise RuntimeError("the user's training crashed")
    finally:
        backend.route_device(0)
    dump = opscope.load(tmp_path / "d")
    rows = dump.records().to_pylist()
    assert dump.status == "crashed" and {r["step"] for r in rows} == {0, 1}
    relu = [r for r in rows if ".relu." in r["op"] and r["io"] == "output"]
    assert len(relu) == 1 and relu[0]["hash"] == cpu_stats((x * 2).relu())[9]


def test_a_read_taken_back_keeps_no_device_statistics(tmp_path, monkeypatch, backend):
    """A view read of memory that an op then fills unread measured nothing (FSDP's unsharded
    parameters): taken back, its row holds no statistics, though its reduction was pending."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    flat, x = torch.randn(64), torch.randn(2, 32)
    _route(backend, monkeypatch, 8 << 20)
    try:
        with opscope.dump(tmp_path / "d", level="aten") as d:
            torch.mul(x, 3, out=flat.view(2, 32))
            d.step()
    finally:
        backend.route_device(0)
    rows = opscope.load(tmp_path / "d").records().to_pylist()
    view_in = next(r for r in rows if ".view." in r["op"] and r["io"] == "input")
    assert view_in["note"].startswith("uninitialized memory") and view_in["mean"] is None
