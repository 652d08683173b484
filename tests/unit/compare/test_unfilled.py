"""Memory an op left holding no data, read later (compare/unfilled.py), and random draws from
another generator state (blame.draw_note), on real dumps of small runs."""

from __future__ import annotations

import pytest
import torch

import opscope


def _scatter(path, garbage: float, *, seed: int = 0, half: bool = True) -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 16))
    x = torch.randn(4, 16)
    with opscope.dump(path, level="aten") as d:
        torch.manual_seed(seed)
        noise = torch.rand(4, 16)  # a draw: its generator state is recorded
        order = (x + noise).argsort(dim=-1)
        buf = x.new(4, 16)  # uninitialized (aten.empty)
        buf.numpy()[:] = garbage  # what code no op records leaves there (numpy: no op of the dump)
        if half:  # the other half stays what the memory held
            buf.scatter_(-1, order[:, :8], torch.ones(4, 8))
        else:  # an inverse permutation, as Reformer's: every element written
            buf.scatter_(-1, order, torch.arange(16.0).expand(4, 16))
        (buf @ w).sum().backward()
        d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_memory_an_op_left_unwritten_names_that_op(tmp_path, monkeypatch, backend):
    """The half scatter_ left unwritten holds what no op wrote, other in each run: the read that
    measures it (mm's) has scatter_'s output for its producer, whose inputs agree, so scatter_
    is named; before, the read was a root ('already differs at the start of the step')."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _scatter(tmp_path / "a", 1.0)
    _scatter(tmp_path / "b", 7.0)
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op) == ("culprit", "aten.scatter_.src"), result.culprits
    assert "left memory that holds no data" in first.note and "aten.mm" in first.note


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_draw_from_another_seed_is_named_before_what_it_feeds(tmp_path, monkeypatch, backend):
    """Another seed before torch.rand: the draw differs while its inputs agree, and what reads
    the memory scatter_ filled from its order inherits (scatter_'s index carries the draw)."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _scatter(tmp_path / "a", 1.0, seed=0, half=False)
    _scatter(tmp_path / "b", 1.0, seed=1, half=False)
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op) == ("culprit", "aten.rand.default"), result.culprits
    assert first.note.startswith("a random draw from another generator state")
    assert not [c for c in result.culprits if c.op == "aten.scatter_.src"]
    pairs = result.pairs
    read = pairs[(pairs.op == "aten.mm.default") & (pairs.io == "input") & (pairs.slot == 0)].iloc[0]
    assert read.verdict == "inherits" and "whose inputs carry a divergence" in read.note


def _fill_by_position(path, eps: float) -> None:
    # RWKV's CPU kernel: an output made by zeros_like, written a position at a time
    # (Tensor.__setitem__ returns nothing), then read whole
    torch.manual_seed(0)
    norm, fc = torch.nn.LayerNorm(8, eps=eps), torch.nn.Linear(8, 8)
    x = torch.randn(4, 6, 8) * 1e-2  # small: the norm's eps shows
    with opscope.dump(path, level="api") as d:
        h = norm(x)
        out = torch.zeros_like(h)
        for i in range(h.shape[1]):
            out[:, i] = h[:, i] * 2
        fc(out).sum().backward()
        d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_tensor_written_in_place_by_a_call_that_returns_nothing_has_that_call_for_producer(
        tmp_path, monkeypatch, backend):
    """At the api level ``out[:, i] = v`` returns nothing: the next read of ``out`` measured it
    with no producer, and compare named it a root, ahead of the norm whose eps changed."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _fill_by_position(tmp_path / "a", 1e-1)
    _fill_by_position(tmp_path / "b", 1e-5)
    rows = opscope.load(tmp_path / "a").records().to_pandas()
    written = rows[(rows.op == "Tensor.__setitem__") & (rows.io == "output")]
    assert len(written) == 6 and written.note.str.startswith("written in place").all()
    read = rows[(rows.op == "torch.nn.functional.linear") & (rows.io == "input") & (rows.slot == 0)].iloc[0]
    assert read["producer"] == written.iloc[-1]["id"]
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op) == ("culprit", "torch.nn.functional.layer_norm"), \
        result.culprits
    assert not [c for c in result.culprits if c.kind == "root"]
