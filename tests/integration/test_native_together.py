"""The native dump and watch observers next to torch's profiler (all three use RecordFunction
callbacks): the run's numbers are unchanged and each tool writes what it should."""

from __future__ import annotations

import json

import pytest
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
    assert not w.result.events
    assert (tmp_path / "p" / "steps.parquet").exists() and (tmp_path / "p" / "ops.parquet").exists()


def _dump_rows(path, backend, monkeypatch, profile_path=None):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    model, opt, batch = _task()
    with opscope.dump(path, steps="0-1") as d:
        profile = opscope.profile(profile_path).start() if profile_path else None
        for i in range(2):
            train_step(model, opt, *batch(i))
            d.step()
            if profile:
                profile.step()
        if profile:
            profile.stop()  # its closing calibration too, inside the dump's last step
    return [opscope.load(path).records(step=s).to_pylist() for s in (0, 1)]


@pytest.mark.parametrize("backend", ["native", "python"])
def test_the_profiles_calibration_stays_out_of_a_dump(tmp_path, monkeypatch, backend):
    alone = _dump_rows(tmp_path / "alone", backend, monkeypatch)
    together = _dump_rows(tmp_path / "together", backend, monkeypatch, tmp_path / "p")
    summary = json.loads((tmp_path / "p" / "rank0" / "summary.json").read_text())
    assert summary["calibration"]["rounds_ms"]["matmul"]["start"]  # it did run its matmuls
    for rows_alone, rows_together in zip(alone, together, strict=True):
        assert not [r for r in rows_together if r["shape"] == [48, 48]]
        assert [(r["op"], r["module"], r["io"]) for r in rows_together] == \
            [(r["op"], r["module"], r["io"]) for r in rows_alone]
