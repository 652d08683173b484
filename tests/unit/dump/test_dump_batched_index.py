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
from opscope.storage import format as fmt
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


def test_batched_steps_have_no_folder_and_are_listed_by_their_files(tmp_path):
    _, dump = _run(tmp_path / "a", True, steps=4)
    rank = tmp_path / "a" / "rank0"
    assert not [p for p in rank.iterdir() if p.is_dir()]  # format 3.0: no folder per step
    files = sorted(rank.glob("records-*.parquet"))
    listed = [fmt.steps_of_runs(pq.read_metadata(f).metadata[fmt.BATCH_STEPS.encode()]) for f in files]
    assert sorted(s for steps in listed for s in steps) == dump.steps() == [0, 1, 2, 3]
    assert dump.records(step=2).schema.metadata is None  # the list stays in the file


def test_a_format_2_dump_reads_as_before(tmp_path):
    """2.0 wrote a folder for every step and no list of steps in its files: the steps come from
    the folders (a file without the list is read for its steps as well)."""
    _, new = _run(tmp_path / "a", True, steps=4)
    expected = {step: new.records(step=step) for step in new.steps()}
    rank = tmp_path / "a" / "rank0"
    for f in rank.glob("records-*.parquet"):
        pq.write_table(pq.read_table(f), f)  # written again without the list
        assert fmt.BATCH_STEPS.encode() not in (pq.read_metadata(f).metadata or {})
    (rank / "step1").mkdir()
    old = opscope.load(tmp_path / "a")
    assert old.steps() == [0, 1, 2, 3]
    for step, table in expected.items():
        assert old.records(step=step).equals(table), step


def test_step_runs():
    assert fmt.step_runs([5, 0, 1, 2, 7, 6, 1]) == "[[0,2],[5,7]]"
    assert fmt.steps_of_runs(fmt.step_runs([9, 3, 4])) == [3, 4, 9]
    assert fmt.steps_of_runs(fmt.step_runs([])) == []
