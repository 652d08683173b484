"""The native dump's kernel clock (``kernel_clock``, ``kernel_seconds``): the statistics kernel's
own time in a step, which ``benchmarks/bench_dump.py`` prints as the floor under each ratio. It
counts only while on, at every level that measures natively, and never more than the time the
measuring thread spent."""

from __future__ import annotations

import time

import pytest
import torch

import opscope
from opscope.capture.torch.native import build as native


@pytest.fixture(scope="module", autouse=True)
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump module did not build: {native.error('_opscope_dump')}"
    return module


@pytest.fixture(autouse=True)
def clock_off(backend):
    yield
    backend.kernel_clock(False)


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_the_clock_counts_the_kernels_passes_while_on(tmp_path, monkeypatch, backend, level):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU())
    x = torch.randn(256, 512)
    with opscope.dump(tmp_path / level, level=level) as d:
        model(x)  # the first step builds what the dump keeps between steps
        d.step()
        backend.kernel_clock(True)
        assert backend.kernel_seconds() == 0.0
        read, start = backend.read_bytes(), time.thread_time()
        model(x)
        d.step()
        spent, seconds = time.thread_time() - start, backend.kernel_seconds()
        read = backend.read_bytes() - read
        off = backend.kernel_clock(False)
        model(x)
        d.step()
        assert backend.kernel_seconds() == off
    # the input, the weight and the output at least (0.5 + 1 + 0.5 MB), each read once
    assert read >= 2 * 2**20
    assert 0.0 < seconds <= spent
    assert off == seconds  # what kernel_seconds said, returned as the clock stops
    assert backend.kernel_clock(True) == off  # turned on again: the count so far, then a new one
    assert backend.kernel_seconds() == 0.0


def test_a_dump_without_the_clock_reads_no_clock(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    backend.kernel_clock(True)
    backend.kernel_clock(False)
    with opscope.dump(tmp_path / "d", level="aten") as d:
        torch.randn(1 << 16).mul(2)
        d.step()
    assert backend.kernel_seconds() == 0.0
