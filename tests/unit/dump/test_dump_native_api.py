"""The API level of a statistics dump through the native dump module, against the Python
path: the same rows, links and statistics (backward rows per autograd node included), and
opscope's own failures kept away from the user's run."""

from __future__ import annotations

import math

import pytest
import torch
from dump_helpers import small_mlp, small_transformer

import opscope
from opscope.capture.torch.native import build as native
from opscope.demo.models import train_step

_SAME = ["step", "seq", "phase", "module", "op", "call", "io", "slot", "arg", "dtype", "shape", "numel", "param",
         "fwd_op", "node", "args", "note", "min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash"]


@pytest.fixture(scope="module", autouse=True)
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump module did not build: {native.error('_opscope_dump')}"
    return module


def _dump(path, task, backend_name, monkeypatch, steps=3, **keys):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    model, opt, batch = task()
    losses = []
    with opscope.dump(path, level="api", **keys) as d:
        for i in range(steps):
            losses.append(train_step(model, opt, *batch(i)))
            d.step()
    dump = opscope.load(path)
    assert (dump.manifest["stats_backend"] == "native") == (backend_name == "native")
    return losses, dump.records().to_pandas(integer_object_nulls=True).sort_values(["step", "id"])


def _cell(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "null"
    return repr(list(v)) if hasattr(v, "tolist") else repr(v)


@pytest.mark.parametrize("task", [small_mlp, small_transformer], ids=["mlp", "transformer"])
def test_native_api_level_writes_the_rows_of_the_python_path(tmp_path, monkeypatch, task):
    losses, native_rows = _dump(tmp_path / "n", task, "native", monkeypatch)
    python_losses, python_rows = _dump(tmp_path / "p", task, "python", monkeypatch)
    model, opt, batch = task()
    assert losses == python_losses == [train_step(model, opt, *batch(i)) for i in range(3)]  # bit for bit
    assert len(native_rows) == len(python_rows) > 50
    for column in _SAME:
        assert [_cell(v) for v in native_rows[column]] == [_cell(v) for v in python_rows[column]], column
    # the same data flow: an input an earlier call returned links to its record, not measured
    # again; natively also a gradient the optimizer reads to the backward row that made it (the
    # Python path loses it with the Python object autograd's hook saw)
    by_id = native_rows.set_index("id")
    native_link, python_link = native_rows["producer"].notna().to_numpy(), python_rows["producer"].notna().to_numpy()
    assert (native_link | ~python_link).all()
    extra = native_rows[native_link & ~python_link]
    assert set(zip(extra.op, extra.io)) <= {("AdamW.step", "grad")}
    for _, row in native_rows[native_link].iterrows():
        source = by_id.loc[row["producer"]]
        assert (source["hash"], source["numel"]) == (row["hash"], row["numel"])
    assert native_link.sum() > 10
    assert {"forward", "backward", "optimizer"} <= set(native_rows["phase"])
    assert native_rows[native_rows.phase == "backward"]["node"].notna().all()


def _walked_in_python():
    """A step whose calls api_call does not walk itself: a namedtuple argument (the two-call
    path), results that are torch's structseqs (topk, max: walked by tensors_of) and a batch
    norm, whose running statistics it writes unmarked (the two-call path with write_unmarked)."""
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    torch.manual_seed(0)
    w = torch.randn(6, 8, requires_grad=True)
    mean, var = torch.zeros(8), torch.ones(8)
    opt = torch.optim.SGD([w], lr=0.1)
    xs = [torch.randn(5, 6) for _ in range(2)]

    def step(i):
        h = xs[i] @ w
        stacked = torch.stack(Pair(h, h * 2.0))
        top = torch.topk(stacked.sum(0), 3, dim=1)
        peak = torch.max(h, dim=0)
        normed = torch.nn.functional.batch_norm(h, mean, var, training=True)
        loss = top.values.sum() + peak.values.sum() + normed.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return float(loss.detach())
    return step


def test_calls_walked_in_python_write_the_rows_of_the_python_path(tmp_path, monkeypatch):
    rows, losses = {}, {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        step = _walked_in_python()
        with opscope.dump(tmp_path / name, level="api") as d:
            losses[name] = []
            for i in range(2):
                losses[name].append(step(i))
                d.step()
        dump = opscope.load(tmp_path / name)
        assert (dump.manifest["stats_backend"] == "native") == (name == "native")
        rows[name] = dump.records().to_pandas(integer_object_nulls=True).sort_values(["step", "id"])
    step = _walked_in_python()
    assert losses["native"] == losses["python"] == [step(i) for i in range(2)]
    native, python = rows["native"], rows["python"]
    assert {"torch.stack", "torch.topk", "torch.max", "torch.nn.functional.batch_norm"} <= set(native.op)
    assert len(native) == len(python)
    for column in _SAME:
        assert [_cell(v) for v in native[column]] == [_cell(v) for v in python[column]], column
    topk = native[(native.op == "torch.topk") & (native.io == "output") & (native.phase == "forward")]
    assert len(topk) == 4  # values and indices, each step


def test_an_in_place_call_keeps_the_input_it_received(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    h = torch.full((4,), 3.0)
    with opscope.dump(tmp_path / "d", level="api", phases=["forward"]) as d:
        h.mul_(2)
        d.step()
    rows = opscope.load(tmp_path / "d").records().to_pandas()
    mul = rows[rows.op == "Tensor.mul_"].set_index("io")
    assert mul.loc["input", "max"] == 3.0 and mul.loc["output", "max"] == 6.0
    assert mul.loc["input", "args"] == '{"args": [[1, 2]], "kwargs": {}}'


def test_a_failure_inside_opscope_stops_capture_not_the_run(tmp_path, monkeypatch, backend):
    from opscope.capture.torch.native import api

    real, calls = api.args_text, {"n": 0}

    def flaky(*args):  # (asked for texts not seen before: 30 in the first step, then AdamW's new
        calls["n"] += 1  # bias corrections, ~4 a step; its failure is met inside the native api_call)
        if calls["n"] > 32:
            raise KeyError("simulated opscope bug")
        return real(*args)

    monkeypatch.setattr(api, "args_text", flaky)
    with pytest.warns(RuntimeWarning, match="stopped capturing"):
        losses, rows = _dump(tmp_path / "d", small_mlp, "native", monkeypatch)
    model, opt, batch = small_mlp()
    assert losses == [train_step(model, opt, *batch(i)) for i in range(3)]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and "simulated opscope bug" in dump.error


def test_argument_texts_kept_between_calls_are_those_of_the_writer():
    from opscope.capture.torch.native.api import args_text
    from opscope.storage.table import _encode_args

    t = torch.zeros(2)
    from opscope.capture.torch.dispatch import args_of

    calls = [((t, 1), {}), ((t, 1.0), {}), ((t, True), {}), ((t, 0.0), {}), ((t, -0.0), {}), ((t, float("nan")), {}),
             ((t, [1, 2]), {}), ((t,), {"value": 1}), ((t,), {"value": 1.0}), ((t, torch.float32), {}), ((t,), {})]
    for _ in range(2):  # the second time from what was kept
        assert [args_text(a, k) for a, k in calls] == _encode_args([args_of(a, k) for a, k in calls])


def test_argument_texts_kept_natively_are_those_of_each_call(tmp_path, monkeypatch, backend):
    """api_call keeps each call's args text under a key of its non-tensor arguments: values that
    Python's dict takes as equal (1, 1.0 and True; 0.0 and -0.0), positions against keywords,
    values it does not key (a list, a dtype, a list of tensors as a keyword) and a text-less call,
    each twice (the second from what was kept), are written as the Python path writes them."""
    from opscope.capture.torch.dispatch import args_of
    from opscope.storage.table import _encode_args

    t = torch.ones(3)
    calls = [(torch.add, (t, 1), {}), (torch.add, (t, 1.0), {}), (torch.add, (t, True), {}),
             (torch.mul, (t, 0.0), {}), (torch.mul, (t, -0.0), {}), (torch.mul, (t, float("nan")), {}),
             (torch.add, (t, t), {"alpha": 2}), (torch.add, (t, t), {"alpha": 2.0}), (torch.add, (t, 2), {}),
             (torch.sum, (t, [0]), {}), (torch.sum, (t,), {"dtype": torch.float64}), (torch.cat, ([t, t], 0), {}),
             (torch.cat, ([t, t],), {"dim": 0}), (torch.neg, (t,), {}), (torch.clamp, (t,), {"min": None, "max": 0.5}),
             (torch.add, (t, -2**62), {}), (torch.div, (t, 2), {"rounding_mode": "floor"})]
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    with opscope.dump(tmp_path / "d", level="api") as d:
        for _ in range(2):
            for f, a, k in calls:
                f(*a, **k)
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    got = [a if isinstance(a, str) else None for a in df.drop_duplicates("seq").sort_values("seq")["args"]]
    want = _encode_args([args_of(a, k) for _, a, k in calls]) * 2
    assert got == want


def test_an_in_place_output_used_again_links_to_its_row_and_is_not_read_again(tmp_path, monkeypatch, backend):
    """An in-place call's output, used again, is read through the data flow: its next use links
    to the output's row (a producer), on both paths. Before session 21 neither linked it (the
    version was taken one ahead), so at the api level AdamW's ``sqrt`` of the second moment had
    no producer, and compare judged it as a value from before the step: a root under bf16."""
    rows, read = {}, {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        h = torch.arange(1024, dtype=torch.float32)
        with opscope.dump(tmp_path / name, level="api", phases=["forward"]) as d:
            before = backend.read_bytes()
            h.mul_(2)
            h.add_(1)
            h.add_(1)
            d.step()
            read[name] = backend.read_bytes() - before
        rows[name] = opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True).sort_values("id")
    for column in _SAME + ["producer"]:
        assert [_cell(v) for v in rows["native"][column]] == [_cell(v) for v in rows["python"][column]], column
    df = rows["native"]
    outputs = list(df[df.io == "output"].id)
    assert [_cell(v) for v in df[df.io == "input"].producer] == ["null", repr(outputs[0]), repr(outputs[1])]
    assert read == {"native": 4 * 1024 * 4, "python": 0}  # h before the calls, and each output once
    add = df[df.op == "Tensor.add_"]
    assert list(add["max"]) == [2046.0, 2047.0, 2047.0, 2048.0]


def test_a_write_through_another_tensor_of_the_storage_is_read_anew(tmp_path, monkeypatch, backend):
    """`h.data.mul_()` writes h's elements without moving h's version: the next use of h reads them
    again natively too (as the Python path does), not the statistics of its earlier row."""
    rows = {}
    for name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        h = torch.arange(1024, dtype=torch.float32)
        with opscope.dump(tmp_path / name, level="api", phases=["forward"]) as d:
            h.add_(1)
            h.data.mul_(3)
            h.sum()
            d.step()
        rows[name] = opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True).sort_values("id")
    for column in _SAME + ["producer"]:
        assert [_cell(v) for v in rows["native"][column]] == [_cell(v) for v in rows["python"][column]], column
    summed = rows["native"][(rows["native"].op == "Tensor.sum") & (rows["native"].io == "input")]
    assert list(summed["max"]) == [3072.0]
