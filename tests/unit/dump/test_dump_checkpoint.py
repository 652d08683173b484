"""Activation checkpointing (``torch.utils.checkpoint``, Hugging Face's gradient checkpointing):
each checkpointed block's forward runs again inside the backward. Both capture paths, every
level, both checkpoint variants: the recomputation is recorded as phase ``recompute`` under
the forward's module paths, and compare judges it against the other side's forward.

Before session 23 the recomputed ops were backward ops of whatever node asked for them (aten,
api levels), a second forward (module level, whose hooks took the block for a new outermost
call), or missing with the reentrant variant's backward (api level): a checkpointed run
against a plain one was "within tolerance" with hundreds of unpaired rows, and a
recomputation that drew other dropout masks made a LayerNorm's backward the root.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import opscope


class Block(nn.Module):
    """``inside``: the block checkpoints its own forward's code, as Hugging Face's layers do
    (their hooks stay outside the checkpoint); else its caller checkpoints the block's call."""

    def __init__(self, p: float, inside: bool = False) -> None:
        super().__init__()
        self.fc1, self.act, self.drop = nn.Linear(8, 16), nn.GELU(), nn.Dropout(p)
        self.fc2, self.norm = nn.Linear(16, 8), nn.LayerNorm(8)
        self.inside, self.how, self.rng = inside, "", True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inside and self.how:
            return checkpoint(self.code, x, use_reentrant=self.how == "reentrant", preserve_rng_state=self.rng)
        return self.code(x)

    def code(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x + self.fc2(self.drop(self.act(self.fc1(x)))))
        # rows in reverse order, summed into a new tensor in place (Mixtral's experts loop): the
        # recomputation stops inside this op, which saves the last tensor the backward needs,
        # before it wrote anything (recorded as written before session 23: "not remade")
        return torch.zeros_like(y).index_add_(0, torch.arange(y.shape[0] - 1, -1, -1), y)


class Net(nn.Module):
    """Two blocks, each checkpointed or not (``how``: "", "plain" or "reentrant"; ``rng``:
    whether the recomputation draws dropout's masks from the forward's generator state):
    block 0 inside its forward, block 1 by this module's code."""

    def __init__(self, how: str = "", p: float = 0.0, rng: bool = True) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(p, inside=True), Block(p)])
        self.blocks[0].how, self.blocks[0].rng = how, rng
        self.head = nn.Linear(8, 1)
        self.how, self.rng = how, rng

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks[0](self.embed(x))
        if self.how:
            h = checkpoint(self.blocks[1], h, use_reentrant=self.how == "reentrant", preserve_rng_state=self.rng)
        else:
            h = self.blocks[1](h)
        return self.head(h).pow(2).mean()


def run(path: Path | None, how: str = "", steps: int = 2, p: float = 0.0, rng: bool = True,
        fault: str = "", call_step: bool = True, **keys: Any) -> list[float]:
    """Train ``steps`` SGD steps from seed 0 (under a dump at ``path`` unless None); the losses.
    ``fault``: "weight" (a row of block 0's fc2 changed) or "act" (its GELU's tanh formula)."""
    torch.manual_seed(0)
    model = Net(how, p, rng)
    if fault == "weight":
        with torch.no_grad():
            model.blocks[0].fc2.weight[1] += 0.05
    elif fault == "act":
        model.blocks[0].act.approximate = "tanh"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(6, 4, generator=torch.Generator().manual_seed(i)) for i in range(steps)]
    losses = []
    dump = opscope.dump(path, **{"overwrite": True, **keys}) if path is not None else None
    with dump if dump is not None else _nothing() as d:
        for x in batches:
            opt.zero_grad()
            loss = model(x)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if d is not None and call_step:
                d.step()
    return losses


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def rows(path: Path) -> list[dict[str, Any]]:
    return opscope.load(path).records(columns=["step", "phase", "module", "op", "io"]).to_pylist()


def counts(table: list[dict[str, Any]], phase: str) -> int:
    return sum(1 for r in table if r["phase"] == phase)


BACKENDS = ["native", "python"]
LEVELS = ["aten", "api", "module"]
VARIANTS = ["plain", "reentrant"]


@pytest.mark.parametrize("how", VARIANTS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_recomputation_is_recorded_under_the_forwards_modules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, level: str, how: str) -> None:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    bare = run(None, how)
    assert run(tmp_path / "ck", how, level=level) == bare == run(tmp_path / "plain", level=level)
    ck, plain = rows(tmp_path / "ck"), rows(tmp_path / "plain")
    recomputed = [r for r in ck if r["phase"] == "recompute"]
    # both blocks, also block 0's own code (its residual sum, the index_add_), recomputed
    # without its module hooks: "" before session 23's last fix
    assert {r["module"] for r in recomputed} >= {"blocks.0", "blocks.0.fc1", "blocks.1", "blocks.1.fc1"} \
        if level != "module" else {r["module"] for r in recomputed} >= {"blocks.0.fc1", "blocks.1", "blocks.1.fc1"}
    assert all(r["module"].startswith("blocks.") for r in recomputed)
    # what it recomputes is what the blocks' forward computed, under the same modules (the
    # Python path also sees the detach calls of autograd's saved-tensor hooks: dump.md)
    forward = {(r["module"], r["op"]) for r in ck if r["phase"] == "forward" or r["op"] == "aten.detach.default"}
    assert {(r["module"], r["op"]) for r in recomputed} <= forward
    # the forward is recorded once: a recomputed module is no second forward call
    assert counts(ck, "forward") == counts(plain, "forward")
    # every block's backward is recorded (the reentrant variant's comes from the recomputation),
    # but for the gradients at module outputs of the reentrant variant (dump.md)
    backward = {r["module"] for r in ck if r["phase"] == "backward"}
    expected = {r["module"] for r in plain if r["phase"] == "backward"}
    if level == "module" and how == "reentrant":
        assert not any(m.startswith("blocks") for m in backward) and backward < expected
    else:
        assert expected <= backward
    assert sorted({r["step"] for r in ck}) == [0, 1]


def test_steps_and_phases_without_a_step_call(tmp_path: Path) -> None:
    """No ``d.step()``: steps come from the model's outermost calls, and a block called again
    inside the backward is none of them."""
    run(tmp_path / "ck", "plain", steps=3, call_step=False, level="module")
    table = rows(tmp_path / "ck")
    assert sorted({r["step"] for r in table}) == [0, 1, 2]
    assert {r["phase"] for r in table} == {"forward", "backward", "optimizer", "recompute"}


@pytest.mark.parametrize("phases, recorded", [(["forward", "backward"], True), (["forward"], False),
                                              (["recompute"], True)])
def test_the_recomputation_goes_with_backward_in_the_phases_filter(
        tmp_path: Path, phases: list[str], recorded: bool) -> None:
    run(tmp_path / "ck", "plain", phases=phases)
    assert bool(counts(rows(tmp_path / "ck"), "recompute")) == recorded


@pytest.mark.parametrize("level", LEVELS)
def test_a_checkpointed_run_is_identical_to_the_plain_run(tmp_path: Path, level: str) -> None:
    run(tmp_path / "ck", "plain", p=0.1, level=level)
    run(tmp_path / "plain", p=0.1, level=level)
    for target, reference in (("ck", "plain"), ("plain", "ck")):
        result = opscope.compare(tmp_path / target, tmp_path / reference)
        assert result.verdict == "identical", (result.counts, [c.where for c in result.culprits[:3]])


@pytest.mark.parametrize("level", LEVELS)
def test_the_reentrant_variant_against_the_plain_run(tmp_path: Path, level: str) -> None:
    """The reentrant checkpoint detaches the saved inputs in the backward before it recomputes
    (at the aten level: ops the plain run lacks, judged as identities); the rest pairs. At the
    module level the gradients at the blocks' module outputs are not recorded (their nested
    backward gives a block's output only its uses outside the block): unpaired, no culprit."""
    run(tmp_path / "ck", "reentrant", level=level)
    run(tmp_path / "plain", level=level)
    result = opscope.compare(tmp_path / "ck", tmp_path / "plain")
    assert result.verdict in ("identical", "within_tolerance") and not result.culprits
    assert result.counts["failed"] == 0
    assert (result.counts["unpaired_reference"] > 0) == (level == "module")
    assert result.verdict == "identical" or level != "api"


DRAWN_BY = {"aten": "aten.bernoulli_.float", "api": "torch.nn.functional.dropout", "module": "Dropout"}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("how", VARIANTS)
def test_a_recomputation_that_draws_other_masks_is_named(tmp_path: Path, level: str, how: str) -> None:
    """``preserve_rng_state=False``: the recomputed dropout draws other masks than the forward
    did, so the backward reads values the forward never made. Named at the recomputed draw,
    on whichever side recomputed (the last block's, recomputed first)."""
    run(tmp_path / "ck", how, p=0.1, rng=False, level=level)
    run(tmp_path / "plain", p=0.1, level=level)
    for target, reference, side in (("ck", "plain", "target"), ("plain", "ck", "reference")):
        result = opscope.compare(tmp_path / target, tmp_path / reference)
        first = result.first_divergence
        assert result.verdict == "diverged" and first is not None
        assert (first.kind, first.phase, first.step, first.module, first.op) == \
            ("culprit", "recompute", 0, "blocks.1.drop", DRAWN_BY[level]), first.where
        assert f"activation checkpointing on the {side}" in first.note and "preserve_rng_state" in first.note


@pytest.mark.parametrize("level", LEVELS)
def test_a_fault_inside_a_checkpointed_block_is_named_in_the_forward(tmp_path: Path, level: str) -> None:
    run(tmp_path / "ck", "plain", level=level, fault="weight")
    run(tmp_path / "plain", level=level)
    result = opscope.compare(tmp_path / "ck", tmp_path / "plain")
    first = result.first_divergence
    assert first is not None
    assert (first.kind, first.param, first.phase, first.step) == ("root", "blocks.0.fc2.weight", "forward", 0)
    # its recomputation repeats the forward bit for bit: it inherits, it is no culprit of its own
    assert result.culprits and all(c.phase != "recompute" for c in result.culprits), \
        [c.where for c in result.culprits]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("how", VARIANTS)
def test_both_sides_checkpointed(tmp_path: Path, level: str, how: str) -> None:
    """Recomputations pair with each other; a fault's recomputation, which repeats its own
    side's forward bit for bit, is no second culprit."""
    run(tmp_path / "a", how, level=level)
    run(tmp_path / "b", how, level=level)
    run(tmp_path / "fault", how, level=level, fault="act")
    assert opscope.compare(tmp_path / "a", tmp_path / "b").verdict == "identical"
    result = opscope.compare(tmp_path / "fault", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.module, first.phase) == ("culprit", "blocks.0.act", "forward")
    assert all(c.phase != "recompute" for c in result.culprits), [c.where for c in result.culprits]


def _show(path: Path) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "opscope", "show", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("level", LEVELS)
def test_show_checks_each_recomputation_against_its_forward(tmp_path: Path, level: str) -> None:
    """One dump on its own: ``opscope show`` says whether every recomputed output holds what
    the forward call it repeats made. A comparison cannot see it where both runs recompute
    alike (the same bug on both sides compares identical)."""
    run(tmp_path / "good", "plain", p=0.1, level=level)
    run(tmp_path / "bad", "plain", p=0.1, rng=False, level=level)
    run(tmp_path / "bad2", "plain", p=0.1, rng=False, level=level)
    assert opscope.compare(tmp_path / "bad", tmp_path / "bad2").verdict == "identical"
    good, bad = _show(tmp_path / "good"), _show(tmp_path / "bad")
    assert "recomputed outputs (activation checkpointing), each equal to the forward output it repeats" in good
    line = next(x for x in bad.splitlines() if x.startswith("  first:"))
    assert "differ from the forward output they repeat" in bad and "preserve_rng_state=False" in line
    assert f"{DRAWN_BY[level]} in module blocks.1.drop" in line, line
    run(tmp_path / "plain", p=0.1, level=level)
    assert not any(x.startswith("recompute") for x in _show(tmp_path / "plain").splitlines())


class _Reversible(torch.autograd.Function):
    """y = x + f(x), whose backward rebuilds x from y and calls ``f`` again (Reformer's
    reversible layers: no activation is kept, and no checkpoint is involved)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, f: nn.Module) -> torch.Tensor:
        ctx.f = f
        with torch.no_grad():
            y = x + f(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        with torch.enable_grad():
            x = (y - ctx.f(y)).detach().requires_grad_()  # (rebuilt by code no module brackets)
            out = x + ctx.f(x)
            torch.autograd.backward(out, grad)
        return x.grad, None


class _ReversibleNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(_Reversible.apply(x, self.f))


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_calls_inside_a_custom_backward_are_recomputations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """A module call the autograd engine makes in its backward, outside a checkpoint, is phase
    ``recompute`` at the module level (it was ``forward``: more forward calls of the layer,
    whose rebuilt input compare named a root under bf16)."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)

    def train(path: Path | None) -> list[float]:
        torch.manual_seed(0)
        net = _ReversibleNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        x = torch.randn(4, 8, requires_grad=True)
        losses = []
        with opscope.dump(path, level="module") if path else contextlib.nullcontext() as d:
            for _ in range(2):
                loss = net(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(float(loss))
                if d is not None:
                    d.step()
        return losses

    assert train(tmp_path / "d") == train(None)
    got = opscope.load(tmp_path / "d").records(columns=["step", "phase", "module", "call", "io"]).to_pylist()
    f = [r for r in got if r["module"] == "f" and r["io"] == "output" and r["phase"] != "optimizer"]
    # per step: its call in the Function's forward, then its two in the backward
    assert [(r["step"], r["phase"], r["call"]) for r in f] == [
        (step, phase, call) for step in (0, 1) for phase, call in (("forward", 0), ("recompute", 0), ("recompute", 1))]
