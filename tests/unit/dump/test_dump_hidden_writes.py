"""Writes that move no version counter of the tensor read next: a dump that links a tensor to
the row that last measured it (same object, same version) must not report, after such a write,
the statistics it held before (both captures, the aten and the API level). Batch norm writes its
running statistics in place without the schema saying so; ``p.data.add_()`` writes ``p``'s
memory through a tensor whose version counter is another."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import opscope


def _update(bn: torch.nn.BatchNorm1d, x: torch.Tensor, how: str) -> None:
    if how == "module":  # native_batch_norm, through the module
        bn(x)
    else:  # the kernel batch norm's CUDA path and SyncBatchNorm use
        torch.ops.aten.batch_norm_update_stats(x, bn.running_mean, bn.running_var, 0.5)


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize(("level", "how"), [("aten", "module"), ("aten", "update_stats"), ("api", "module")])
def test_running_statistics_read_after_an_unmarked_write_are_measured_anew(tmp_path, monkeypatch, backend, level,
                                                                           how):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4)
    x = torch.randn(8, 4) * 3 + 5
    with opscope.dump(tmp_path / "d", level=level) as d:
        before = bn.running_mean.mean().item()
        bn.running_mean * 1
        _update(bn, x, how)
        version_moved = bn.running_mean._version
        after = bn.running_mean.mean().item()
        bn.running_mean * 1
        d.step()
    assert after != pytest.approx(before)  # the kernel did write it
    df = opscope.load(tmp_path / "d").records().to_pandas()
    mul = "aten.mul.Tensor" if level == "aten" else "Tensor.mul"
    reads = df[(df.op == mul) & (df.slot == 0) & df.io.isin(["input", "param"])].sort_values("seq")
    assert reads["mean"].tolist() == pytest.approx([before, after], abs=1e-6), (version_moved, reads.to_string())
    if level == "aten":  # the writing op's outputs end with what it wrote, which the read links to
        op = "aten.native_batch_norm.default" if how == "module" else "aten.batch_norm_update_stats.default"
        outs = df[(df.op == op) & (df.io == "output")].sort_values("slot")
        wrote = outs.iloc[-2]  # running_mean, then running_var
        assert wrote["mean"] == pytest.approx(after, abs=1e-6)
        assert how != "module" or wrote["param"] == "running_mean"  # (a buffer of a module called)
        assert reads.iloc[1]["producer"] == wrote["id"]


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("level", ["aten", "api"])
def test_a_tensor_written_through_data_is_measured_anew(tmp_path, monkeypatch, backend, level):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    p = torch.nn.Parameter(torch.zeros(4))
    with opscope.dump(tmp_path / "d", level=level) as d:
        p * 1
        p.data.add_(1)  # p's version does not move
        p * 1
        with torch.no_grad():
            p.detach().mul_(3)  # (detach shares p's version counter: this one moves it)
        p * 1
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    mul = "aten.mul.Tensor" if level == "aten" else "Tensor.mul"
    reads = df[(df.op == mul) & (df.slot == 0) & df.io.isin(["input", "param"])].sort_values("seq")
    assert reads["mean"].tolist() == [0.0, 1.0, 3.0], reads.to_string()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_api_operators_are_in_place_only_when_they_write(tmp_path, monkeypatch, backend):
    """``Tensor.__getitem__`` ends in ``_`` but writes nothing: its output links to its next
    use; ``Tensor.__setitem__`` writes the tensor, whose next use is measured anew, with the
    write's (unmeasured) output row for its producer."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    x = torch.ones(4)
    with opscope.dump(tmp_path / "d", level="api") as d:
        y = x + 1
        z = y[1:]
        z * 2
        y[0] = 5
        y * 1
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    sliced = df[(df.op == "Tensor.__getitem__") & (df.io == "output")].iloc[0]
    reads = df[(df.op == "Tensor.mul") & (df.io == "input") & (df.slot == 0)].sort_values("seq")
    assert reads["producer"].iloc[0] == sliced["id"] and reads["mean"].iloc[0] == 2.0
    written = df[(df.op == "Tensor.__setitem__") & (df.io == "output")].iloc[0]
    assert reads["mean"].iloc[1] == 2.75 and reads["producer"].iloc[1] == written["id"]
    assert written["note"].startswith("written in place") and pd.isna(written["mean"])


class _FillsABuffer(torch.nn.Module):
    """Writes one column of a buffer through a view of it, then reads the whole buffer (beam
    search's running sequences, a logits processor's mask)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x) * self.scale
        buf = torch.full((4, 6), 0.5)
        buf[:, 2] = h.sum(1)  # copy_ into a select view of buf
        return (buf * 3).sum()


def _fill(path, scale: float) -> None:
    torch.manual_seed(0)
    model, x = _FillsABuffer(scale), torch.randn(4, 8)
    with opscope.dump(path) as d:
        model(x)
        d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_base_written_through_a_view_has_that_write_for_its_producer(tmp_path, monkeypatch, backend):
    """The base's next read was a row with no producer: compare took it for a value that
    differed at the start of the step, a root listed before the fault that changed what was
    written (beam search: the fault's step named a top-level slice)."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _fill(tmp_path / "ref", 1.0)
    _fill(tmp_path / "bad", 1.5)
    dump = opscope.load(tmp_path / "ref")
    assert (dump.manifest["stats_backend"] == "native") == (backend == "native")
    rows = dump.records().to_pandas()
    copy = rows[(rows.op == "aten.copy_.default") & (rows.io == "output")]
    read = rows[(rows.op == "aten.mul.Tensor") & (rows.io == "input") & rows["shape"].map(lambda s: list(s) == [4, 6])]
    assert len(copy) == 1 and len(read) == 1
    assert read.iloc[0]["producer"] == copy.iloc[0]["id"]
    expected = torch.full((4, 6), 0.5)
    torch.manual_seed(0)
    model, x = _FillsABuffer(), torch.randn(4, 8)
    with torch.no_grad():
        expected[:, 2] = (model.lin(x)).sum(1)
    assert read.iloc[0]["mean"] == pytest.approx(expected.mean().item(), rel=1e-6), "measured anew, not the view's"
    result = opscope.compare(tmp_path / "bad", tmp_path / "ref")
    assert [(f.kind, f.op) for f in result.culprits] == [("culprit", "aten.mul.Tensor")]
    assert result.first_divergence.seq < read.iloc[0]["seq"], "the scale, not the read of the buffer"


def _fill_by_halves(path, garbage: float, data: str, level: str = "aten") -> None:
    """DeepSeek-V3's query: an empty filled a part at a time through views (`q[..., :n] = a`,
    then `q[..., n:].copy_(b)`); the memory it reuses held ``garbage`` before."""
    import numpy as np

    torch.manual_seed(0)
    w, x = torch.randn(8, 8, requires_grad=True), torch.randn(4, 8)
    with opscope.dump(path, data=data, level=level) as d:
        for _ in range(2):
            junk = np.full((4, 24), garbage, dtype=np.float32)  # (numpy: no op of the dump)
            del junk
            h = x @ w
            q = h.new_empty(4, 24)
            q[:, :8] = h
            q[:, 8:16].copy_(h * 2)  # (at the API level: Tensor.__getitem__, then copy_)
            q[:, 16:].copy_(h * 3)
            q.sum().backward()
            d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("data", ["statistics", "tensor"])
def test_an_empty_viewed_while_half_written_is_not_measured(tmp_path, monkeypatch, backend, data):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _fill_by_halves(tmp_path / "a", 1.0, data)
    _fill_by_halves(tmp_path / "b", 7.0, data)
    rows = opscope.load(tmp_path / "a").records(step=0).to_pandas()
    slices = rows[(rows.op == "aten.slice.Tensor") & (rows.io == "input")]
    assert list(slices.note) == ["uninitialized memory (empty): not measured"] * 3, "then: written in part"
    whole = rows[(rows.op == "aten.sum.default") & (rows.io == "input")].iloc[0]
    assert math.isfinite(whole["norm"]), "read whole once both halves are written: measured"
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "identical", result.counts  # before: the unwritten half's bytes differed


@pytest.mark.parametrize("backend", ["native", "python"])
def test_at_the_api_level_an_empty_and_its_parts_written_are_not_measured(tmp_path, monkeypatch, backend):
    # Tensor.new_empty's output, Tensor.__setitem__ writing half of it, and the other half taken
    # by Tensor.__getitem__: before, each measured the memory's old bytes (DeepSeek-V3's
    # new_empty named in the same run twice)
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _fill_by_halves(tmp_path / "a", 1.0, "statistics", "api")
    _fill_by_halves(tmp_path / "b", 7.0, "statistics", "api")
    rows = opscope.load(tmp_path / "a").records(step=0).to_pandas()
    empty = "uninitialized memory (empty): not measured"
    assert list(rows[(rows.op == "Tensor.new_empty") & (rows.io == "output")].note) == [empty]
    setitem = rows[rows.op == "Tensor.__setitem__"]
    assert list(setitem[(setitem.slot == 0) & (setitem.io == "input")].note) == [empty], "what it finds"
    getitem = rows[rows.op == "Tensor.__getitem__"]
    assert list(getitem.note) == [empty] * 4, "parts of memory that holds no data yet, written in part"
    whole = rows[(rows.op == "Tensor.sum") & (rows.io == "input") & (rows.phase == "forward")].iloc[0]
    assert math.isfinite(whole["norm"]), "read whole once both halves are written: measured"
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "identical", result.counts


def _inverse_permutation(path, garbage: float, level: str) -> None:
    # Reformer's LSH attention and MoE routers: the inverse of a sort's permutation, scattered
    # into memory that Tensor.new(*size) (aten.empty) left uninitialized
    import numpy as np

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0), requires_grad=True)
    with opscope.dump(path, level=level) as d:
        for _ in range(2):
            junk = np.full((4, 16), garbage, dtype=np.float64).view(np.int64)  # (numpy: no op of the dump)
            del junk
            order = x.detach().argsort(dim=-1)
            undo = order.new(*order.size())
            undo.scatter_(-1, order, torch.arange(16).expand(4, 16))
            x.gather(-1, order).gather(-1, undo).sum().backward()
            d.step()


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("level", ["aten", "api"])
def test_an_empty_written_in_place_is_not_measured_where_it_is_read(tmp_path, monkeypatch, backend, level):
    """scatter_ reads its first argument (what it leaves unwritten stays): in an empty that is
    memory's old bytes. Before, both levels measured them there, and two runs of Reformer named
    that read a root. What it leaves may still hold some (another write may fill the rest): it
    is measured at its next read, as the API level's ``__setitem__`` into an empty is."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _inverse_permutation(tmp_path / "a", 1.0, level)
    _inverse_permutation(tmp_path / "b", 7.0, level)
    rows = opscope.load(tmp_path / "a").records(step=0).to_pandas()
    scatter = rows[rows.op.str.contains("scatter_")]
    first = scatter[(scatter.io == "input") & (scatter.slot == 0)].iloc[0]
    assert first["note"] == "uninitialized memory (empty): not measured" and math.isnan(first["norm"])
    left = scatter[scatter.io == "output"].iloc[0]
    assert left["note"] == "uninitialized memory (empty): not measured"
    gather = rows[rows.op.str.contains("gather") & (rows.io == "input") & (rows.phase == "forward")]
    read = gather[gather.dtype == "int64"].iloc[-1]  # the next read: gather's index
    assert (read["min"], read["max"]) == (0, 15), "measured where it is read"
    result = opscope.compare(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "identical", result.counts
