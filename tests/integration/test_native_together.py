"""The native dump and watch observers next to torch's profiler (all three use RecordFunction
callbacks): the run's numbers are unchanged and each tool writes what it should."""

from __future__ import annotations

import torch

import opscope
from opscope.demo.models import train_step, transformer_task


def _task():
    torch.manual_seed(0)
    return transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)


def test_dump_watch_and_profile_together(tmp_path):
    model, opt, batch = _task()
    losses = []
    with opscope.dump(tmp_path / "d", steps="0-2") as d, opscope.watch(action="raise") as w, \
            opscope.profile(tmp_path / "p", task_trace=True) as p:
        for i in range(3):
            losses.append(train_step(model, opt, *batch(i)))
            d.step()
            w.step()
            p.step()
    model, opt, batch = _task()
    assert losses == [train_step(model, opt, *batch(i)) for i in range(3)]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "complete" and dump.manifest["stats_backend"] == "native"
    assert dump.steps() == [0, 1, 2] and all(dump.records(step=s).num_rows > 500 for s in (0, 1, 2))
    assert not w.result().events
    assert (tmp_path / "p" / "steps.parquet").exists() and (tmp_path / "p" / "ops.parquet").exists()
