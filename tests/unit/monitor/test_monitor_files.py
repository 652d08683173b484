"""The monitor's config and files: bad keys named, chunks whole after a crash, names never paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import opscope
from opscope.config import monitor_config
from opscope.errors import ConfigError, DumpExistsError, DumpFormatError, DumpWriteError
from opscope.monitor.series import SeriesWriter, read


@pytest.mark.parametrize(("keys", "message"), [
    ({"targets": ["grads", "gradz"]}, "targets: 'gradz' is not a target"),
    ({"every": 0}, "every: 0 is not a number >= 1"),
    ({"every": 2.5}, "every: 2.5 is not an integer >= 1"),
    ({"warmup": 40}, "warmup 40 must be below window 32"),
    ({"treshold": 3}, "monitor: unknown key 'treshold'; allowed keys:"),
])
def test_bad_keys_are_named_before_anything_runs(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        opscope.monitor("unused", **keys)


def test_a_config_file_section_and_aliases(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"monitor": {"output": "runs/m", "interval": 5, "targets": "all",
                                            "module_patterns": ["layers.*", "!*.drop"]}}))
    cfg = monitor_config(path)
    assert (cfg.path, cfg.every, cfg.targets[0], cfg.modules.exclude) == ("runs/m", 5, "inputs", ("*.drop",))


def test_a_crash_leaves_every_written_chunk_readable(tmp_path):
    script = f"""
import os, time, torch, opscope
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
m = opscope.monitor({str(tmp_path / "m")!r}, chunk=5).start()
for i in range(13):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    m.step(loss=loss)
time.sleep(0.5)  # a chunk is written on a background thread: let the one begun at step 10 end
os._exit(3)  # killed: no stop(), no atexit
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    data = read(tmp_path / "m")
    rank = data.ranks[0]
    assert rank.status == "running" and rank.steps == 10  # two chunks of 5; steps 10-12 were in memory
    steps, values = rank.values[("grad", "0.weight", "norm")]
    assert steps == list(range(10)) and all(v > 0 for v in values)
    assert not list((tmp_path / "m" / "rank0").glob("*.tmp"))


def test_a_cut_events_line_and_a_stray_temporary_file_are_ignored(tmp_path):
    writer = SeriesWriter(str(tmp_path), 0, 2, {}, overwrite=False)
    loss = writer.series.id("loss", "loss")
    writer.add(0, [], {loss: 1.0})
    writer.add(1, [], {loss: 1.5})
    writer.wait()  # the chunk of steps 0-1 is written on a background thread
    (tmp_path / "rank0" / "series-000000002.parquet.tmp").write_bytes(b"PAR1 half a file")
    with open(tmp_path / "rank0" / "events.jsonl", "a") as f:
        f.write('{"step": 3, "rank": 0, "depar')
    rank = read(tmp_path).ranks[0]
    assert rank.values[("loss", "loss", "value")] == ([0, 1], [1.0, 1.5]) and rank.events == []
    with pytest.raises(DumpExistsError, match="overwrite=True"):
        SeriesWriter(str(tmp_path), 0, 2, {}, overwrite=False)


def test_a_tensor_name_never_becomes_a_path(tmp_path):
    writer = SeriesWriter(str(tmp_path), 0, 1, {}, overwrite=False)
    evil = "../../../etc/passwd"
    writer.add(0, [(np.array([writer.series.id("grad", evil)]), np.array([[1.0, 2.0, 0.0, 0.0]]))], {})
    writer.close("complete")
    files = {os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs}
    assert files == {"monitor.json", "rank0/index.json", "rank0/events.jsonl", "rank0/series-000000000.parquet"}
    assert read(tmp_path).ranks[0].values[("grad", evil, "norm")] == ([0], [1.0])


def test_every_row_of_a_chunk_reads_back_as_written(tmp_path):
    # blocks of several kinds, a series that appears at step 1, a step without blocks, scalars:
    # the rows are built from ids and codes (no string per row), each must land under its own key
    writer = SeriesWriter(str(tmp_path), 0, 3, {}, overwrite=False)
    ids = writer.series.id
    grads = np.array([ids("grad", "a"), ids("grad", "b")])
    given: dict = {}
    for step in range(3):
        blocks = [(grads, np.arange(8.0).reshape(2, 4) + 10 * step)]
        if step == 1:
            blocks.append((np.array([ids("exp_avg", "a")]), np.array([[7.0, 8.0, 0.0, 1.0]])))
        scalars = {ids("loss", "loss"): 3.0 - step, ids("lr", "lr"): 1e-3}
        writer.add(step, blocks if step != 2 else [], scalars)
        for block_ids, stats in blocks if step != 2 else []:
            for i, row in zip(block_ids, stats, strict=True):
                for stat, v in zip(("norm", "max", "nan", "inf"), row, strict=True):
                    given.setdefault((*writer.series.key(int(i)), stat), ([], []))[0].append(step)
                    given[(*writer.series.key(int(i)), stat)][1].append(float(v))
        for i, v in scalars.items():
            given.setdefault((*writer.series.key(i), "value"), ([], []))[0].append(step)
            given[(*writer.series.key(i), "value")][1].append(v)
    writer.close("complete")
    assert read(tmp_path).ranks[0].values == given
    import pyarrow.parquet as pq

    schema = pq.read_schema(tmp_path / "rank0" / "series-000000000.parquet")
    assert [str(schema.field(c).type) for c in ("step", "kind", "name", "stat", "value")] == [
        "int64", "dictionary<values=string, indices=int32, ordered=0>", "string",
        "dictionary<values=string, indices=int32, ordered=0>", "double"]


def test_not_a_monitor_folder(tmp_path):
    with pytest.raises(DumpFormatError, match="not a monitor folder"):
        read(tmp_path)
    (tmp_path / "monitor.json").write_text(json.dumps({"format": "opscope-monitor/9"}))
    with pytest.raises(DumpFormatError, match="upgrade opscope"):
        read(tmp_path)


def _train(path, steps: int = 7, **keys):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with opscope.monitor(path, **keys) as m:
        for _ in range(steps):
            model(torch.randn(16, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()  # no m.step(): steps end at optimizer.step()
    return m


def test_every_nth_step_and_ranks(tmp_path):
    m = _train(tmp_path / "m", every=3)
    steps, _ = m.result.ranks[0].values[("grad", "1.weight", "norm")]
    assert steps == [0, 3, 6] and m.result.ranks[0].values[("lr", "lr", "value")][0] == [0, 3, 6]
    off = _train(tmp_path / "off", ranks=[1])  # this process is rank 0
    assert not (tmp_path / "off").exists() and not off.result.ranks


def test_a_chunk_that_cannot_be_written_is_an_error_on_the_training_thread(tmp_path):
    import shutil

    writer = SeriesWriter(str(tmp_path), 0, 1, {}, overwrite=False)
    shutil.rmtree(tmp_path / "rank0")  # the folder is gone (a cleaned scratch disk)
    writer.add(0, [], {writer.series.id("loss", "loss"): 1.0})
    with pytest.raises(DumpWriteError, match="monitor: could not write .*rank0"):
        writer.close("complete")


def test_a_write_failing_mid_run_reaches_the_training_loop(tmp_path):
    import shutil

    import torch

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(DumpWriteError, match="could not write"), opscope.monitor(tmp_path / "m", chunk=1) as m:
        for i in range(6):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            m.step()
            while i == 1 and (tmp_path / "m" / "rank0").exists():  # the writer thread may be adding a file
                shutil.rmtree(tmp_path / "m" / "rank0", ignore_errors=True)
