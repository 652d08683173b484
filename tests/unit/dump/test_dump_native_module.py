"""The module level of a statistics dump through the native dump module, against the Python
path: the same rows and statistics, tensors measured as they were when their module returned,
and opscope's own failures kept away from the user's run."""

from __future__ import annotations

import collections
import math
from typing import Any

import pytest
import torch
from dump_helpers import small_mlp, small_transformer
from torch import nn

import opscope
from opscope.capture.torch.native import build as native
from opscope.demo.models import train_step, transformer_task

_SAME = ["step", "phase", "module", "op", "call", "io", "slot", "arg", "dtype", "numel", "param", "note",
         "min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash"]


@pytest.fixture(scope="module", autouse=True)
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump module did not build: {native.error('_opscope_dump')}"
    return module


def _dump(path, task, backend_name, monkeypatch, steps=3):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model, opt, batch = task()
    losses = []
    with opscope.dump(path, level="module") as d:
        for i in range(steps):
            losses.append(train_step(model, opt, *batch(i)))
            d.step()
    dump = opscope.load(path)
    assert (dump.manifest["stats_backend"] == "native") == (backend_name == "native")
    return losses, dump.records().to_pandas(integer_object_nulls=True).sort_values(["step", "id"])


def _cell(v):
    return "null" if v is None or (isinstance(v, float) and math.isnan(v)) else repr(v)


@pytest.mark.parametrize("task", [small_mlp, small_transformer], ids=["mlp", "transformer"])
def test_native_module_level_writes_the_rows_of_the_python_path(tmp_path, monkeypatch, task):
    losses, native_rows = _dump(tmp_path / "n", task, "native", monkeypatch)
    python_losses, python_rows = _dump(tmp_path / "p", task, "python", monkeypatch)
    torch.manual_seed(0)
    model, opt, batch = task()
    assert losses == python_losses == [train_step(model, opt, *batch(i)) for i in range(3)]  # bit for bit
    assert len(native_rows) == len(python_rows) > 20
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column
    # data flow: a module's input that an earlier module returned is linked, not measured again
    assert list(native_rows["producer"].isna()) == list(python_rows["producer"].isna())
    assert native_rows["producer"].notna().sum() > 5


class _Residual(nn.Module):
    """`out = fc(x); out += x; out.relu_()`: a module's output changed in place after it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        out += x
        out.relu_()
        return self.head(out)


def test_an_output_changed_in_place_keeps_its_value_at_return(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    torch.manual_seed(0)
    model, x = _Residual(), torch.randn(4, 8) - 1.0
    with torch.no_grad():
        fc_out = model.fc(x)
        head_in = torch.relu(fc_out + x)
    with opscope.dump(tmp_path / "d", level="module") as d:
        model(x).sum().backward()
        d.step()
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    returned = rows[(rows.module == "fc") & (rows.io == "output")].iloc[0]
    assert (returned["min"], returned["max"]) == (fc_out.min().item(), fc_out.max().item())
    assert returned["min"] < 0  # the relu_ that came later is not in it
    given = rows[(rows.module == "head") & (rows.io == "input")].iloc[0]
    assert given["min"] == 0.0 and given["max"] == head_in.max().item()
    assert math.isnan(given["producer"])  # measured anew: its version moved on since fc returned


def test_a_failure_inside_opscope_stops_capture_not_the_run(tmp_path, monkeypatch):
    from opscope.capture.torch.recorder import Recorder

    real = Recorder.selected

    def flaky(self, *args):
        if self.step >= 1:  # the first module call of step 1 asks
            raise KeyError("simulated opscope bug")
        return real(self, *args)

    monkeypatch.setattr(Recorder, "selected", flaky)
    task = small_mlp
    with pytest.warns(RuntimeWarning, match="stopped capturing"):
        losses, rows = _dump(tmp_path / "d", task, "native", monkeypatch)
    monkeypatch.setattr(Recorder, "selected", real)
    torch.manual_seed(0)
    model, opt, batch = task()
    assert losses == [train_step(model, opt, *batch(i)) for i in range(3)]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and "simulated opscope bug" in dump.error
    assert set(rows.step) == {0} and len(rows) > 20  # the steps completed before are kept


def test_tensors_on_another_device_take_the_batched_path_with_the_same_results(tmp_path, monkeypatch, backend):
    """Accelerator tensors are reduced on their device and read once per step; the same code
    runs here with every CPU tensor routed through it."""
    task = small_transformer
    _, fast = _dump(tmp_path / "f", task, "native", monkeypatch, steps=2)
    backend.route_device(1)  # (route_slow(True) routes them to Python's statistics instead)
    try:
        _, slow = _dump(tmp_path / "s", task, "native", monkeypatch, steps=2)
    finally:
        backend.route_device(0)
    assert len(fast) == len(slow) > 20
    for column in ("hash", "nan", "inf", "zeros", "min", "max", "producer"):
        assert [_cell(v) for v in fast[column]] == [_cell(v) for v in slow[column]], column
    for column in ("mean", "norm"):  # torch's reductions round in their own order
        assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(fast[column], slow[column]))
    # and the kernel's float32 squares leave ~2.4e-4 |mean| of std where the values are constant
    assert all(abs(a - b) <= 1e-3 * m + 1e-6 for a, b, m in zip(fast["std"], slow["std"], fast["absmax"]))


@pytest.mark.parametrize("name", ["native", "python"])
def test_a_gradient_hook_left_by_an_earlier_dump_writes_nothing(tmp_path, monkeypatch, name):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
    torch.manual_seed(0)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    with opscope.dump(tmp_path / "a", level="module"):
        kept = model(x)  # its gradient hook belongs to dump a
    with opscope.dump(tmp_path / "b", level="module") as d:
        model(x).sum().backward()
        kept.sum().backward()  # runs in dump b's time, on dump a's graph
        d.step()
    rows = opscope.load(tmp_path / "b").records().to_pandas()
    assert list(rows[rows.phase == "backward"].arg) == ["grad_output"]


class _Awkward(nn.Module):
    """A module whose inputs and outputs are of every awkward kind."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.fc(x)
        i = torch.arange(5) * 3
        return (h, x.t()[1:], torch.zeros(0, 5), torch.randn(3, dtype=torch.complex64) * 2, i, (i > 4) & (i < 10),
                torch.empty(4, 4, device="meta") + 1, torch.full((2,), float("nan")))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode, torch.enable_grad])
def test_awkward_tensors_give_the_rows_of_the_python_path(tmp_path, monkeypatch, context):
    tables = {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        torch.manual_seed(0)
        model = _Awkward()
        with opscope.dump(tmp_path / name, level="module") as d, context():
            model(torch.randn(2, 3))
            d.step()
        tables[name] = opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True)
    native_rows, python_rows = tables["native"], tables["python"]
    assert {"bfloat16", "complex64", "int64", "bool"} <= set(native_rows.dtype)
    assert native_rows[native_rows.device == "meta"].note.str.contains("meta tensor").all()
    assert (native_rows[native_rows.numel == 0].norm == 0).all()
    assert native_rows.nan.max() == 2  # the NaN output is counted, not an error
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column


@pytest.mark.parametrize("keys", [{"mode": "input"}, {"mode": "output"}, {"phases": ["forward"]},
                                  {"phases": ["backward", "optimizer"]}, {"scope": ["layers.0*"]},
                                  {"ops": {"exclude": ["Linear"]}}],
                         ids=["inputs", "outputs", "forward", "backward+optimizer", "scope", "ops"])
def test_filters_select_the_rows_of_the_python_path(tmp_path, monkeypatch, keys):
    task = lambda: transformer_task(d=32, heads=2, layers=2, seq=8, batch=2)  # noqa: E731
    tables = {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        torch.manual_seed(0)
        model, opt, batch = task()
        with opscope.dump(tmp_path / name, level="module", **keys) as d:
            for i in range(2):
                train_step(model, opt, *batch(i))
                d.step()
        tables[name] = opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True)
    native_rows, python_rows = tables["native"], tables["python"]
    assert 0 < len(native_rows) == len(python_rows)
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column


_Pair = collections.namedtuple("_Pair", "a b")


class _Sub(torch.Tensor):
    """A tensor subclass: walked in Python, as tensors_of walks it."""


class _DictIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4, bias=False)  # its `bias` is a None parameter
        self.scale = nn.Parameter(torch.full((4,), 0.5))
        self.again = self.scale  # the same parameter under a second name: listed once

    def forward(self, d: dict) -> dict:
        return {"y": self.fc(d["x"]) * d["n"] * self.again, "none": None}


class _PairOut(nn.Module):
    def forward(self, y: torch.Tensor, rest: list) -> _Pair:
        return _Pair(y + rest[0], y * rest[1])


class _Reversed(nn.Linear):
    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:  # overridden: its own order is honoured
        return iter(reversed(list(super().named_parameters(*args, **kwargs))))


class _Shapes(nn.Module):
    """Module calls that take each way of the hooks' native walk: a dict, a list, None and
    numbers (walked natively); a namedtuple, a tensor subclass and an overridden
    ``named_parameters`` (walked in Python)."""

    def __init__(self) -> None:
        super().__init__()
        self.dict_in, self.pair, self.act, self.rev = _DictIn(), _PairOut(), nn.Tanh(), _Reversed(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dict_in({"x": x, "n": 3, "none": None})
        p = self.pair(h["y"], [x, 2.0])
        # (a fresh tensor each time: an alias of a recorded one links natively, not in Python)
        z = (self.act((p.a * 1).as_subclass(_Sub)) * 1).as_subclass(torch.Tensor)
        return self.rev(z + p.b)


def test_module_calls_walked_natively_or_in_python_give_the_rows_of_the_python_path(tmp_path, monkeypatch, backend):
    walked: list[bool] = []
    real = backend.record_module

    def counting(*args: Any) -> Any:
        call = real(*args)
        walked.append(call is not None)
        return call

    monkeypatch.setattr(backend, "record_module", counting)
    tables, losses = {}, {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        torch.manual_seed(0)
        model, x = _Shapes(), torch.randn(3, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with opscope.dump(tmp_path / name, level="module") as d:
            losses[name] = []
            for _ in range(2):
                loss = model(x).square().sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses[name].append(loss.item())
                d.step()
        tables[name] = opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True)
    assert losses["native"] == losses["python"]
    assert True in walked and False in walked  # both ways were taken
    native_rows, python_rows = tables["native"], tables["python"]
    assert len(native_rows) == len(python_rows) > 30
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column
    assert list(native_rows["producer"].isna()) == list(python_rows["producer"].isna())
    forward = native_rows[(native_rows.phase == "forward") & (native_rows.io == "param") & (native_rows.step == 0)]
    assert list(forward[forward.module == "dict_in.fc"].arg) == ["weight"]  # no row for the None bias
    assert list(forward[forward.module == "dict_in"].arg) == ["scale"]
    assert list(forward[forward.module == "rev"].arg) == ["bias", "weight"]


class _Keywords(nn.Module):
    """A model called the way Hugging Face models are: every tensor by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        return self.head(h)


@pytest.mark.parametrize("backend_name", ["native", "python"])
def test_the_outermost_calls_keyword_tensors_are_its_inputs(tmp_path, monkeypatch, backend_name):
    """model(input_ids=..., attention_mask=...): a global pre-hook gets no keywords, and the
    model's inputs were missing from module-level dumps (a different batch on the two sides
    came out as the top module's own code). Inner calls keep their positional inputs."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model = _Keywords()
    ids, mask = torch.randint(0, 16, (2, 5)), torch.ones(2, 5)
    with opscope.dump(tmp_path / "d", level="module") as d:
        for _ in range(2):
            model(input_ids=ids, attention_mask=mask)
            d.step()
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    top = rows[(rows.module == "") & (rows.io == "input") & (rows.step == 1)]
    assert list(top.arg) == ["input_ids", "attention_mask"]
    assert list(top.slot) == [0, 1] and list(top.dtype) == ["int64", "float32"]
    assert int(top.iloc[0]["max"]) == int(ids.max())
    embed = rows[(rows.module == "embed") & (rows.io == "input") & (rows.step == 1)]
    assert list(embed.arg.isna()) == [True], "an inner call's inputs are unchanged"
