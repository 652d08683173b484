"""Failures a user meets: a crash in training, a killed process, a full disk, bad config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pyarrow.parquet as pq
import pytest
import torch
from dump_helpers import train

import opscope
from opscope.errors import ConfigError, DumpExistsError, DumpFormatError, DumpWriteError


def _no_hooks_left() -> None:
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as om
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    assert not mm._global_forward_hooks and not mm._global_forward_pre_hooks
    assert not om._global_optimizer_pre_hooks and not om._global_optimizer_post_hooks
    assert not _get_current_dispatch_mode_stack()


def test_exception_flushes_marks_crashed_and_propagates(tmp_path):
    class Boom(RuntimeError):
        pass

    model = torch.nn.Linear(4, 4)
    with pytest.raises(Boom, match="step 2 failed"), opscope.dump(tmp_path / "d") as d:
        for i in range(3):
            model(torch.randn(2, 4)).sum().backward()
            if i == 2:
                raise Boom("step 2 failed")
            d.step()
    _no_hooks_left()
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and "Boom: step 2 failed" in dump.error
    assert dump.steps() == [0, 1, 2] and dump.records(step=2).num_rows > 0


def test_killed_process_leaves_completed_shards_readable(tmp_path):
    script = textwrap.dedent(f"""
        import os, torch, opscope
        from opscope.demo.models import mlp_task, train_step
        model, opt, batch = mlp_task()
        d = opscope.dump({str(tmp_path / 'd')!r}).start()
        for i in range(3):
            train_step(model, opt, *batch(i)); d.step()
        d.writer.close("running")  # let the writer finish what it has, then die hard
        os._exit(9)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "running" and "still marked running" in dump.problems[0]
    assert dump.steps() == [0, 1, 2] and dump.records().num_rows > 0


@pytest.mark.parametrize("backend", ["native", "python"])
def test_full_disk_raises_a_clear_error_without_hanging(tmp_path, backend):
    script = textwrap.dedent(f"""
        import resource, signal, sys, torch, opscope
        from opscope.demo.models import mlp_task, train_step
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))  # files over 200 kB fail: EFBIG
        model, opt, batch = mlp_task()
        try:
            with opscope.dump({str(tmp_path / 'd')!r}, data="tensor", shard_mb=1) as d:
                for i in range(50):
                    train_step(model, opt, *batch(i)); d.step()
        except opscope.DumpWriteError as exc:
            print("ERROR:", exc); sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OPSCOPE_DUMP_BACKEND": backend})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "disk is full" in proc.stdout and "free space" in proc.stdout
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and (dump.manifest["stats_backend"] == "native") == (backend == "native")
    if backend == "native":  # native shards are written whole or not at all
        assert not list((tmp_path / "d").rglob("tensors-*.safetensors"))


def test_unwritable_path_and_existing_dump(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DumpWriteError, match="is a file"):
        opscope.dump(tmp_path / "file").start()
    train(tmp_path / "d", 1)
    with pytest.raises(DumpExistsError, match="overwrite=True"):
        opscope.dump(tmp_path / "d").start()
    _no_hooks_left()
    _, dump = train(tmp_path / "d", 2, overwrite=True)
    assert dump.steps() == [0, 1]


@pytest.mark.parametrize("keys,message", [
    ({"mode": "outputs"}, "mode: 'outputs' is not allowed; allowed: input, output, all"),
    ({"steps": "0|x"}, "steps: 'x'"),
    ({"level": "kernel"}, "allowed: module, api, aten"),
    ({"phases": ["forward", "update"]}, "allowed: forward, backward, optimizer"),
    ({"ranks": "seven"}, "ranks:"),
    ({"scope": 3}, "scope:"),
])
def test_bad_values_fail_before_training(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|").replace("(", r"\(")):
        opscope.dump(tmp_path / "d", **keys)
    assert not (tmp_path / "d").exists()


def test_config_files_ascend_keys_and_environment(tmp_path, monkeypatch):
    (tmp_path / "c.json").write_text(json.dumps({"dump": {"dump_path": str(tmp_path / "j"), "dump_step": "1",
                                                          "dump_mode": "output", "kernels": ["aten.addmm*"]}}))
    (tmp_path / "c.yaml").write_text(f"dump:\n  path: {tmp_path / 'y'}\n  steps: [0]\n  level: module\n")
    (tmp_path / "c.toml").write_text(f'[dump]\npath = "{tmp_path / "t"}"\nsteps = "0"\ninput_output = 1\n')
    (tmp_path / "bad.json").write_text('{"dump": {"stepz": 1}}')
    (tmp_path / "broken.yaml").write_text("dump: [unclosed")
    _, d = train(None, 2, config=tmp_path / "c.json")
    assert d.steps() == [1] and set(d.records().to_pandas().op) == {"aten.addmm.default"}
    _, d = train(None, 1, config=str(tmp_path / "c.yaml"))
    assert "Linear" in set(d.records().to_pandas().op)
    monkeypatch.setenv("OPSCOPE_CONFIG", str(tmp_path / "c.toml"))
    _, d = train(None, 1)
    assert set(d.records().to_pandas().io) <= {"input", "param", "grad"}
    with pytest.raises(ConfigError, match="unknown key 'stepz'"):
        opscope.dump(config=tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="not valid yaml"):
        opscope.dump(config=tmp_path / "broken.yaml")


def test_reader_refuses_newer_format_and_reports_corrupt_shards(tmp_path):
    train(tmp_path / "d", 2)
    before = {s: opscope.load(tmp_path / "d").records(step=s).num_rows for s in (0, 1)}
    # small steps' rows are written together, in files of the rank's folder named by their steps
    files = sorted((tmp_path / "d" / "rank0").glob("records-*.parquet"))
    assert files and not list((tmp_path / "d" / "rank0" / "step1").glob("records-*.parquet"))
    target = next(f for f in files if int(f.name.split("-")[1]) <= 1 <= int(f.name.split("-")[2]))
    held = set(pq.read_table(target, columns=["step"]).column("step").to_pylist())
    target.write_bytes(target.read_bytes()[:100])  # truncated
    dump = opscope.load(tmp_path / "d")
    # what other files hold stays readable; the steps of the truncated one lose its rows
    for s in (0, 1):
        assert dump.records(step=s).num_rows == (0 if s in held else before[s])
    assert any(target.name in p and "unreadable" in p for p in dump.problems)
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert manifest["format_version"] == "3.0"
    manifest["format_version"] = "4.0"
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DumpFormatError, match="newer than this opscope reads"):
        opscope.load(tmp_path / "d")


def test_dump_is_readable_without_opscope(tmp_path):
    import pyarrow.parquet as pq
    from safetensors.numpy import load_file

    _, dump = train(tmp_path / "d", 1, data="tensor")
    table = pq.read_table(next((tmp_path / "d" / "rank0").glob("**/records-*.parquet")))
    row = next(r for r in table.to_pylist() if r["data"] and r["dtype"] == "float32")
    tensors = load_file(str(tmp_path / "d" / "rank0" / f"step{row['step']}" / row["data"]))
    assert list(tensors[row["key"]].shape) == row["shape"]
    assert float(tensors[row["key"]].max()) == pytest.approx(row["max"])


def test_show_names_the_first_nan_and_convert_writes_npy(tmp_path, run_cli):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with opscope.dump(tmp_path / "d", data="tensor"):
        h = model[0](torch.randn(2, 4))
        torch.log(h - h.max() - 1).sum()  # log of negatives: NaN
    out = run_cli("show", tmp_path / "d")
    assert out.returncode == 0
    assert "first NaN/Inf  step 0 rank 0 forward: aten.log.default" in out.stdout
    assert "its inputs are finite" in out.stdout
    conv = run_cli("convert", tmp_path / "d", "--to", "npy", "-o", tmp_path / "npy")
    assert conv.returncode == 0 and "index.csv" in conv.stdout
    import csv

    import numpy as np
    with open(tmp_path / "npy" / "index.csv") as f:
        rows = list(csv.DictReader(f))
    arr = np.load(tmp_path / "npy" / rows[0]["file"], allow_pickle=False)
    assert "x".join(map(str, arr.shape)) == rows[0]["shape"]
    bad = run_cli("show", tmp_path / "nowhere")
    assert bad.returncode == 2 and "is not a directory" in bad.stderr


def test_an_internal_error_stops_capture_not_the_run(tmp_path, monkeypatch):
    from dump_helpers import bare

    from opscope.capture.torch import recorder as recorder_module
    from opscope.capture.torch.native import aten as native_aten

    calls = {"n": 0}

    def flaky(real):
        def record_params(self, *args, **kwargs):  # opscope's own code failing in step 1
            calls["n"] += 1
            if self.step == 1 and calls["n"] > 2:
                raise KeyError("simulated opscope bug")
            return real(self, *args, **kwargs)
        return record_params

    for cls in (recorder_module.Recorder, native_aten.NativeRecorder):
        monkeypatch.setattr(cls, "record_params", flaky(cls.record_params))
    # the native recorder takes plain parameters as cached, gradients read natively
    native = native_aten.NativeRecorder
    monkeypatch.setattr(native, "record_selected", flaky(native.record_selected))
    with pytest.warns(RuntimeWarning, match="stopped capturing at step 1 after an internal error"):
        losses, dump = train(tmp_path / "d", 3)
    assert losses == bare(3)  # the run went on, bit for bit
    _no_hooks_left()
    assert dump.status == "crashed" and "internal error" in dump.error
    assert 0 in dump.steps() and dump.records(step=0).num_rows > 0
