"""The flight recorder: statistics of the last steps in memory, written as a dump when a
trigger fires, the next step with full tensors for the ops on the chain; the dump opens
with ``opscope show`` and compares like any other dump."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import opscope

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "watch"))
from watch_models import ZeroVarNorm  # noqa: E402


def _inputs(n: int, bad: int | None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 8, generator=gen) for _ in range(n)]
    if bad is not None:
        xs[bad] = torch.ones(4, 8)  # constant rows: zero variance
    return xs


def _train(xs, session=None, dump=None):
    torch.manual_seed(0)
    model = ZeroVarNorm()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in xs:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if session is not None:
            session.step(loss=loss)
        if dump is not None:
            dump.step()


@pytest.fixture(scope="module")
def flight(tmp_path_factory):
    root = tmp_path_factory.mktemp("flight")
    path = root / "flight"
    with opscope.watch(action="record", path=str(path), history=3) as w:
        _train(_inputs(8, bad=5), w)
    return root, path, w.result


def test_trigger_writes_the_ring_and_the_next_step_with_tensors(flight):
    _, path, result = flight
    assert result.dumps == [str(path)] and result.events[0].op == "aten.div.Tensor"
    dump = opscope.load(path)
    assert dump.status == "complete" and dump.steps() == [3, 4, 5, 6]
    df = dump.records().to_pandas()
    assert df[df.step < 6].data.isna().all()  # ring steps: statistics only
    tensors = df[(df.step == 6) & df.data.notna() & (df.io == "output")]
    assert set(tensors.op) <= set(result.events[0].chain_ops) and "aten.div.Tensor" in set(tensors.op)
    row = tensors[tensors.op == "aten.div.Tensor"].iloc[0].to_dict()
    assert dump.row_tensor(row).shape == (4, 8)
    nan_steps = set(df[(df.io == "output") & (df.nan > 0)].step)
    assert min(nan_steps) == 5
    fr = dump.manifest["flight_recorder"]
    assert fr["step"] == 5 and fr["history_steps"] == [3, 4, 5] and fr["event"]["op"] == "aten.div.Tensor"


def test_flight_dump_opens_with_opscope_show(flight, run_cli):
    _, path, _ = flight
    proc = run_cli("show", path)
    assert proc.returncode == 0, proc.stderr
    assert "first NaN/Inf  step 5" in proc.stdout and "aten.div.Tensor" in proc.stdout
    assert "flight recorder" in proc.stdout


def test_flight_dump_compares_with_a_plain_dump(flight):
    root, path, _ = flight
    plain = root / "plain"
    with opscope.dump(str(plain), steps="3-6") as d:
        _train(_inputs(8, bad=None), dump=d)
    result = opscope.compare(str(path), str(plain), workers=1)
    first = result.first_divergence
    assert first is not None and first.step == 5  # steps 3 and 4 agree; step 5's data differs


def test_no_trigger_writes_nothing(tmp_path):
    with opscope.watch(action="record", path=str(tmp_path / "none"), history=2) as w:
        _train(_inputs(4, bad=None), w)
    assert w.result.dumps == [] and not (tmp_path / "none").exists()


def test_an_exception_writes_the_ring(tmp_path):
    with pytest.raises(ZeroDivisionError), opscope.watch(action="record", path=str(tmp_path / "crash"), history=2) as w:
        _train(_inputs(3, bad=None), w)
        raise ZeroDivisionError("user code failed")
    dump = opscope.load(tmp_path / "crash")
    assert dump.steps() == [1, 2]
    assert "ZeroDivisionError" in dump.manifest["flight_recorder"]["trigger"]


@pytest.mark.parametrize("backend", ["native", "python"])
def test_module_level_flight_dump_holds_the_chain_modules_tensors(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    path = tmp_path / "flight"
    with opscope.watch(action="record", level="module", path=str(path), history=2) as w:
        _train(_inputs(6, bad=3), w)
    event = w.result.events[0]
    assert (event.op, event.module, event.step) == ("Linear", "fc", 3)
    dump = opscope.load(path)
    assert dump.steps() == [2, 3, 4] and (dump.manifest["stats_backend"] == "native") == (backend == "native")
    df = dump.records().to_pandas()
    assert df[df.step < 4].data.isna().all()
    stored = df[(df.step == 4) & df.data.notna() & df.producer.isna()]  # other rows link to these
    assert set(stored.op) == {"Linear"} and "output" in set(stored.io)
    out = stored[stored.io == "output"].iloc[0].to_dict()
    assert dump.row_tensor(out).shape == (4, 8)
