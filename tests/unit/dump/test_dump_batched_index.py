"""Small steps' index rows written together (one Parquet file per writer round, in the rank's
folder): read back step by step, they are the rows a file per step holds."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import torch

import opscope
from opscope.capture.torch.session import DumpSession
from opscope.config import dump_config
from opscope.demo.models import mlp_task, train_step
from opscope.storage import writer as writer_module
from opscope.storage.writer import DumpWriter


def _run(path, batch: bool, steps: int = 6, **keys):
    """A tiny MLP's steps (step 3 also runs a tanh and a float64 cast: names and dtypes the
    other steps lack) dumped through a writer with or without batching."""
    session = DumpSession(dump_config(None, path=str(path), **keys))
    session.open_writer = lambda: _opened(DumpWriter(path, session.rank, session.manifest(), batch=batch))
    torch.manual_seed(0)
    model, opt, batch_at = mlp_task(batch=4, d_in=8, hidden=8, depth=2)
    losses = []
    with session as d:
        for i in range(steps):
            x, y = batch_at(i)
            if i == 3:
                x = torch.tanh(x).double().float()
            losses.append(train_step(model, opt, x, y))
            d.step()
    return losses, opscope.load(path)


def _opened(writer: DumpWriter) -> DumpWriter:
    writer.open()
    return writer


def test_batched_steps_read_back_as_the_files_of_each_step(tmp_path):
    losses_a, batched = _run(tmp_path / "a", True)
    losses_b, per_step = _run(tmp_path / "b", False)
    assert losses_a == losses_b
    rank = tmp_path / "a" / "rank0"
    files = sorted(rank.glob("records-*.parquet"))
    assert files and not list(rank.glob("step*/records-*.parquet"))
    assert any(len(set(pq.read_table(f, columns=["step"]).column("step").to_pylist())) > 1 for f in files)
    assert batched.steps() == per_step.steps() == list(range(6))
    for step in range(6):
        a, b = batched.records(step=step), per_step.records(step=step)
        assert a.num_rows > 0 and a.equals(b), step
    assert batched.records(step=3, columns=["op", "dtype"]).equals(per_step.records(step=3, columns=["op", "dtype"]))
    assert "aten.tanh.default" in batched.records(step=3, columns=["op"]).column("op").to_pylist()
    assert batched.records().num_rows == per_step.records().num_rows
    assert not batched.problems


def test_a_step_over_the_batch_size_keeps_its_own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "BATCH_STEP_ROWS", 60)  # the MLP's steps hold more rows than this
    _, dump = _run(tmp_path / "d", True, steps=2)
    assert not list((tmp_path / "d" / "rank0").glob("records-*.parquet"))
    assert len(list((tmp_path / "d" / "rank0").glob("step*/records-*.parquet"))) == 2
    assert dump.records(step=1).num_rows > 60


def test_the_python_rows_of_several_steps_batch_too(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "python")
    _, batched = _run(tmp_path / "a", True, steps=3)
    _, per_step = _run(tmp_path / "b", False, steps=3)
    for step in range(3):
        a, b = batched.records(step=step), per_step.records(step=step)
        assert a.num_rows > 0 and a.equals(b.cast(a.schema) if a.schema != b.schema else b)
    assert isinstance(batched.records(), pa.Table)
