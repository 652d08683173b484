"""The native aten observer of opscope.watch: its range pass, its place next to the Python
dispatch mode, the fallback when it cannot be built, and concurrent builds."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from watch_models import ExpHead, MaskedAttention, PairDistance, ZeroVarNorm, train

import opscope
from opscope.capture.torch.native import build as native
from opscope.capture.torch.op_kinds import base_name


@pytest.fixture(scope="module")
def backend():
    module = native.load("_opscope_watch")
    assert module is not None, f"the native watch observer did not build: {native.error('_opscope_watch')}"
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_the_native_range_pass_agrees_with_torch_aminmax(backend, dtype):
    torch.manual_seed(0)
    for n in (1, 7, 8, 15, 16, 17, 33, 1000, 4099):
        for inject in (None, "nan", "inf", "-inf"):
            for pos in ((0, n // 2, n - 1) if inject else (None,)):
                t = (torch.randn(n) * 100).to(dtype)
                if inject:
                    t[pos] = float(inject)
                lo, hi = backend.range_of(t)
                ref = torch.aminmax(t)
                if math.isnan(ref.min) or math.isnan(ref.max):
                    assert math.isnan(lo) and math.isnan(hi), (n, inject, pos)
                else:
                    assert (lo, hi) == (float(ref.min), float(ref.max)), (n, inject, pos)
    assert backend.range_of(torch.randn(4, 6).t()) is None  # not contiguous: torch does it


def _event(backend_name, model, inputs, monkeypatch):
    monkeypatch.setenv("OPSCOPE_WATCH_BACKEND", backend_name)
    torch.manual_seed(0)
    w = opscope.watch(action="raise")
    assert w.native == (backend_name == "native")
    with pytest.raises(opscope.OverflowDetected) as info, w:
        train(model, inputs, w)
    return info.value.event


@pytest.mark.parametrize("name", ["native", "python"])
def test_both_backends_name_the_same_overflows(name, monkeypatch):
    torch.manual_seed(0)
    e = _event(name, ExpHead(scale=40.0), [torch.randn(4, 8)], monkeypatch)
    assert (e.op, e.kind, e.phase, e.module) == ("aten.exp.default", "inf", "forward", "")
    assert "large values" in e.chain[0].reason
    e = _event(name, ZeroVarNorm(), [torch.randn(4, 8), torch.ones(4, 8)], monkeypatch)
    assert (base_name(e.op), e.kind, e.step) == ("div", "nan", 1)
    assert [base_name(link.op) for link in e.chain] == ["var", "sqrt", "div"]
    assert e.source and "watch_models.py" in e.source  # the user's line, read inside the op
    e = _event(name, PairDistance(), [torch.randn(16, 8)], monkeypatch)
    assert (e.phase, e.fwd_op, e.step) == ("backward", "aten.sqrt.default", 0)
    assert e.node.startswith("SqrtBackward") and e.inputs[0].origin.startswith("aten.mm")


@pytest.mark.parametrize("name", ["native", "python"])
def test_both_backends_let_masks_pass(name, monkeypatch):
    monkeypatch.setenv("OPSCOPE_WATCH_BACKEND", name)
    torch.manual_seed(0)
    model = MaskedAttention()
    with opscope.watch(action="raise") as w:
        losses = train(model, [torch.randn(2, 8, 16) for _ in range(2)], w)
    assert w.native == (name == "native")
    assert not w.result.events and all(math.isfinite(v) for v in losses)


def test_a_hit_inside_an_op_raises_at_the_next_module_boundary(backend):
    """torch swallows errors of RecordFunction observers: the exception waits for Python."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Identity())
    reached = []
    model[1].register_forward_pre_hook(lambda m, a: reached.append("identity"))
    with torch.no_grad():
        model[0].weight[0] = 1e38  # finite, but the product overflows float32
    with pytest.raises(opscope.OverflowDetected) as info, opscope.watch(action="raise"):
        model(torch.full((2, 4), 1e3))
    assert info.value.event.op == "aten.addmm.default" and info.value.event.module == "0"
    assert reached == []  # raised when module 0 returned, before the next module ran


def test_steps_not_selected_are_not_observed_at_all(backend):
    w = opscope.watch(action="raise", steps="5")
    with w:
        x = torch.randn(3)
        (x / 0).exp()
        assert w.checker.count() == 0  # the callback is not even registered
    assert not w.result.events


def _normalized(names: list[str]) -> list[str]:
    # A dispatch mode changes a few decompositions it observes (linear adds its bias out of
    # place when a Python mode is on) and sees autograd's own detach calls; the rest is equal.
    # (and the optimizer's profiler ranges around its hooks)
    out = [base_name(n).rstrip("_") for n in names if not n.startswith("profiler.")]
    return [n for n in out if n != "detach"]


def test_native_and_python_backends_see_the_same_ops(monkeypatch):
    """The observer records what a dispatch mode sees: composite ops by their decomposition."""
    from opscope.demo.models import train_step, transformer_task

    seen = {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_WATCH_BACKEND", name)
        torch.manual_seed(0)
        model, opt, batch = transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)
        w = opscope.watch(action="raise", steps="0")
        names = []
        w.checker.resolve = lambda names=names, w=w: names.extend(e[0] for e in w.checker.entries)
        with w:
            train_step(model, opt, *batch(0))
            w.step()
        seen[name] = names
    assert len(seen["native"]) > 100 and _normalized(seen["native"]) == _normalized(seen["python"])


def test_hits_in_backward_leave_no_observer_behind():
    """A warning raised inside backward, then a new watch: nothing stale is observed."""
    code = f"""
        import sys, torch, opscope
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from watch_models import PairDistance, train
        with opscope.watch(action="warn") as w:
            train(PairDistance(), [torch.randn(16, 8) for _ in range(3)], w)
        assert any(e.phase == "backward" for e in w.result.events)
        with opscope.watch(action="raise") as w2:
            for _ in range(3):
                train(torch.nn.Sequential(torch.nn.Linear(8, 8)), [torch.randn(4, 8)], w2)
        print("events", len(w2.result.events))
    """
    proc = _run(code, {})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "events 0" in proc.stdout and "callback is not found" not in proc.stderr


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def test_without_a_compiler_watch_falls_back_to_the_python_mode_and_says_why(tmp_path):
    code = """
        import logging, torch, opscope
        logging.basicConfig(level=logging.WARNING)
        w = opscope.watch(action="warn")
        with w:
            torch.log(torch.zeros(3))
        print("native", w.native, "events", [e.op for e in w.result.events])
    """
    proc = _run(code, {"OPSCOPE_CACHE_DIR": str(tmp_path), "CXX": "/bin/false", "OPSCOPE_WATCH_BACKEND": "native"})
    assert proc.returncode == 0, proc.stderr
    assert "native False events ['aten.log.default']" in proc.stdout
    assert "native aten observer is not available" in proc.stderr and "Install a C++ compiler" in proc.stderr
    assert proc.stderr.count("not available") == 1


@pytest.mark.slow
def test_concurrent_first_builds_wait_for_one_another(tmp_path):
    code = """
        from opscope.capture.torch.native import build as native
        assert native.load("_opscope_watch") is not None, native.error("_opscope_watch")
        print("ok")
    """
    env = {"OPSCOPE_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, **env}) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 and out.strip() == "ok" for p, (out, _) in zip(procs, outs)), outs
    built = list(tmp_path.rglob("_opscope_watch*.so"))
    assert len(built) == 1  # one build, the other process waited for it and loaded it


def test_a_forked_child_checks_nothing(backend):
    """A DataLoader worker forked while watching inherits the observer; it must not check
    (nor raise on) the worker's own ops."""
    with opscope.watch(action="raise") as w:
        pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                torch.log(torch.zeros(4))  # -Inf: a hit, were the child watching
                w.step()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        with pytest.raises(opscope.OverflowDetected):  # the parent still watches
            torch.log(torch.zeros(4))
            w.step()


@pytest.mark.parametrize("name", ["native", "python"])
def test_module_level_names_the_same_hits_on_both_backends(name, monkeypatch):
    """Module level keeps its entries natively (no per-op observer): same module, kind, chain."""
    monkeypatch.setenv("OPSCOPE_WATCH_BACKEND", name)
    torch.manual_seed(0)
    w = opscope.watch(action="raise", level="module")
    assert w.native == (name == "native") and not w.ops_native
    with pytest.raises(opscope.OverflowDetected) as info, w:
        train(ZeroVarNorm(), [torch.randn(4, 8), torch.ones(4, 8)], w)
    e = info.value.event
    assert (e.op, e.module, e.kind, e.step, e.level) == ("Linear", "fc", "nan", 1, "module")
    assert e.source and "watch_models.py" in e.source
    assert [link.module for link in e.chain][-1] == "fc"
    (x,) = e.inputs  # fc's input, made NaN by the normalisation code between modules
    assert (x.dtype, x.shape, x.nan) == ("float32", [4, 8], 32) and "between modules" in x.origin
    torch.manual_seed(0)
    with opscope.watch(action="warn", level="module") as w:
        losses = train(MaskedAttention(), [torch.randn(2, 8, 16) for _ in range(2)], w)
    assert not w.result.events and all(math.isfinite(v) for v in losses)
