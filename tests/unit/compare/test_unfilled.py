"""Memory an op left holding no data, read later (compare/unfilled.py), and random draws from
another generator state (blame.draw_note), on real dumps of small runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opscope


def _scatter_half(path, garbage: float, *, seed: int = 0) -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(16, 16))
    x = torch.randn(4, 16)
    with opscope.dump(path, level="aten") as d:
        junk = np.full((4, 16), garbage, dtype=np.float32)  # (numpy: no op of the dump)
        del junk
        torch.manual_seed(seed)
        noise = torch.rand(4, 16)  # a draw: its generator state is recorded
        order = (x + noise).argsort(dim=-1)[:, :8]  # half the positions
        buf = x.new(4, 16)  # uninitialized
        buf.scatter_(-1, order, torch.ones(4, 8))  # the other half stays what memory held
        (buf.nan_to_num() @ w).sum().backward()
        d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_memory_an_op_left_unwritten_names_that_op(tmp_path, monkeypatch, backend):
    """The half scatter_ left unwritten is old bytes, other in each run: the read that measures
    them (nan_to_num's) has scatter_'s output for its producer, whose inputs agree, so scatter_
    is named; before, the read was a root ('already differs at the start of the step')."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _scatter_half(tmp_path / "a", 1.0)
    _scatter_half(tmp_path / "b", 7.0)
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op) == ("culprit", "aten.scatter_.src"), result.culprits
    assert "left memory that holds no data" in first.note and "aten.nan_to_num" in first.note


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_draw_from_another_seed_is_named_before_what_it_feeds(tmp_path, monkeypatch, backend):
    """Another seed before torch.rand: the draw differs while its inputs agree, and what reads
    the memory scatter_ filled from its order inherits (scatter_'s index carries the draw)."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _scatter_half(tmp_path / "a", 1.0, seed=0)
    _scatter_half(tmp_path / "b", 1.0, seed=1)
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and (first.kind, first.op) == ("culprit", "aten.rand.default"), result.culprits
    assert first.note.startswith("a random draw from another generator state")
    assert not [c for c in result.culprits if c.op == "aten.scatter_.src"]
    pairs = result.pairs
    read = pairs[(pairs.op == "aten.nan_to_num.default") & (pairs.io == "input")]
    assert list(read.verdict) == ["inherits"] and "whose inputs carry a divergence" in read.note.iloc[0]
