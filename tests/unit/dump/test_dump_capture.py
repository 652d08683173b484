"""Capture on real small models: records, data flow, levels, options, bit-exactness."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dump_helpers import bare, small_mlp, small_transformer, train

import opscope
from opscope.capture.torch.stats import cpu_stats, device_stats, materialize_one
from opscope.demo.models import train_step


def test_dumping_never_changes_the_losses(tmp_path):
    expected = bare(3, small_transformer)
    for i, keys in enumerate([{"level": "aten"}, {"level": "aten", "data": "tensor"}, {"level": "api"},
                              {"level": "module"}]):
        losses, _ = train(tmp_path / str(i), 3, small_transformer, **keys)
        assert losses == expected, keys  # bit for bit


def test_aten_records_have_data_flow_params_and_backward_attribution(tmp_path):
    _, dump = train(tmp_path / "d", 1, small_transformer, level="aten")
    df = dump.records(step=0).to_pandas()
    assert set(df.phase) == {"forward", "backward", "optimizer"}
    # parameters appear as inputs of the ops that use them, by name, also through weight.t() views
    fc1 = df[(df.module == "layers.0.fc1") & (df.op == "aten.addmm.default") & (df.phase == "forward")]
    assert set(fc1[fc1.io == "param"].param) == {"layers.0.fc1.weight", "layers.0.fc1.bias"}
    # every input with a producer carries exactly the producer's statistics
    linked = df[df.producer.notna()]
    by_id = df.set_index("id")
    prod = by_id.loc[linked.producer.astype(int)]
    assert np.allclose(linked["norm"].to_numpy(), prod["norm"].to_numpy(), equal_nan=True)
    ha, hb = linked["hash"].to_numpy(), prod["hash"].to_numpy()
    assert ((ha == hb) | (np.isnan(ha.astype(float)) & np.isnan(hb.astype(float)))).all()
    # backward ops are attributed to the forward module and op that created their node
    gb = df[df.op == "aten.gelu_backward.default"]
    assert set(gb.module) == {"layers.0.act"} and set(gb.fwd_op) == {"aten.gelu.default"}
    assert (df[df.io == "grad"].phase == "optimizer").all()


def test_statistics_match_numpy_on_the_stored_tensors(tmp_path):
    _, dump = train(tmp_path / "d", 1, small_transformer, level="aten", data="tensor")
    rows = [r for r in dump.records(step=0).to_pylist() if r["dtype"] == "float32" and r["numel"] > 1][:80]
    assert rows
    for r in rows:
        arr = dump.row_tensor(r).astype(np.float64)
        assert list(arr.shape) == r["shape"]
        assert r["min"] == pytest.approx(arr.min()) and r["max"] == pytest.approx(arr.max())
        assert r["mean"] == pytest.approx(arr.mean(), rel=1e-4, abs=1e-6)
        assert r["norm"] == pytest.approx(np.sqrt((arr ** 2).sum()), rel=1e-5)
        assert r["zeros"] == int((arr == 0).sum())


def test_same_run_twice_gives_identical_hashes(tmp_path):
    _, a = train(tmp_path / "a", 2, small_transformer)
    _, b = train(tmp_path / "b", 2, small_transformer)
    ha, hb = a.records(columns=["hash"]).column(0).to_pylist(), b.records(columns=["hash"]).column(0).to_pylist()
    assert len(ha) == len(hb) > 100 and ha == hb


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64])
def test_c_and_torch_statistics_agree(dtype):
    x = (torch.randn(1000) * 7).to(dtype) if dtype != torch.complex64 else torch.randn(300, dtype=dtype)
    a, b = cpu_stats(x), materialize_one(device_stats(x))
    assert a[9] == b[9]  # hash
    assert a[6:9] == b[6:9]
    assert np.allclose(a[:6], b[:6], rtol=1e-5)
    # a transposed plane is read in memory order: the copy's hash, extremes and counts, its sums' rounding
    got, copy = cpu_stats(x.reshape(-1, 10).t()), cpu_stats(x.reshape(-1, 10).t().contiguous())
    assert got[:2] == copy[:2] and got[5:] == copy[5:] and np.allclose(got[2:5], copy[2:5], rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_mask_of_the_lowest_value_has_finite_statistics(dtype):
    """Attention masks hold torch.finfo(dtype).min (-3.4e38): their squares, and two of them
    summed, overflow float32. Before, such a mask's norm was inf and its mean -inf, with no Inf
    element in it; both paths now sum such blocks in float64."""
    lowest = torch.finfo(dtype).min
    x = torch.where(torch.ones(64, 64, dtype=torch.bool).triu(1), torch.tensor(lowest, dtype=dtype),
                    torch.zeros((), dtype=dtype))
    ones = int(torch.ones(64, 64).triu(1).sum())
    for s in (cpu_stats(x), materialize_one(device_stats(x))):
        assert s[7] == 0 and math.isclose(s[4], abs(float(lowest)) * ones**0.5, rel_tol=1e-6)
        assert math.isclose(s[2], float(lowest) * ones / x.numel(), rel_tol=1e-6)
        assert math.isfinite(s[3])


def test_nan_and_inf_are_counted_and_propagate():
    x = torch.tensor([1.0, float("nan"), float("inf"), 0.0])
    s = cpu_stats(x)
    assert s[6:9] == (1, 1, 1) and all(v != v for v in s[:6])


@pytest.mark.parametrize("level,ops", [("module", {"Linear", "ReLU", "MLP"}), ("api", {"torch.nn.functional.linear"})])
def test_levels_name_their_ops(tmp_path, level, ops):
    _, dump = train(tmp_path / "d", 1, level=level)
    df = dump.records(step=0).to_pandas()
    assert ops <= set(df.op)
    assert {"forward", "backward", "optimizer"} <= set(df.phase)


def test_mode_phases_scope_ops_and_tensor_ops(tmp_path):
    _, d = train(tmp_path / "a", 1, mode="output", phases=["forward"], scope=["layers.*", "!layers.1"],
                 ops=["aten.addmm*"], tensor_ops=["aten.addmm*"])
    df = d.records().to_pandas()
    assert set(df.io) == {"output"} and set(df.phase) == {"forward"}
    assert set(df.module) == {"layers.0"} and set(df.op) == {"aten.addmm.default"}
    assert df.data.notna().all()
    _, d = train(tmp_path / "b", 1, mode="input", ops=["aten.relu*"])
    assert set(d.records().to_pandas().io) <= {"input", "param"}


def test_steps_selection_and_automatic_step_detection(tmp_path):
    _, d = train(tmp_path / "a", 4, steps="1|3")
    assert d.steps() == [1, 3]
    _, d = train(tmp_path / "b", 4, steps="1-2", call_step=False)  # steps from optimizer.step()
    assert d.steps() == [1, 2]
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    with opscope.dump(tmp_path / "c", steps="all") as dd, torch.inference_mode():
        for _ in range(3):
            model(torch.randn(2, 4))  # no optimizer: each outermost call is a step
    assert opscope.load(tmp_path / "c").steps() == [0, 1, 2]
    assert dd.step_index == 2


@pytest.mark.parametrize("level", ["aten", "module"])
def test_steps_not_selected_run_nothing_of_opscope(tmp_path, level):
    """With d.step() ending the steps, a step not selected has no global hook installed and no
    observer registered; the next selected step records what a step of a dump of every step
    records (its phases included: the optimizer's hooks come back at its boundary)."""
    from torch.optim import optimizer as optim

    mm = torch.nn.modules.module

    def hooks() -> int:
        return (len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks)
                + len(optim._global_optimizer_pre_hooks) + len(optim._global_optimizer_post_hooks))

    before = hooks()
    model, opt, batch = small_mlp()
    seen = []
    with opscope.dump(tmp_path / "some", level=level, steps="0|3") as d:
        for i in range(5):
            train_step(model, opt, *batch(i))
            d.step()
            seen.append((hooks() - before, d.level.on))
    assert seen == [(0, False), (0, False), (4, True), (0, False), (0, False)]
    assert hooks() == before
    every = train(tmp_path / "every", 5, small_mlp, level=level)[1]
    some = opscope.load(tmp_path / "some")
    assert some.steps() == [0, 3]
    keys = ["phase", "module", "op", "io", "slot", "shape", "hash"]
    for step in (0, 3):
        want = every.records(step=step).select(keys).to_pylist()
        assert some.records(step=step).select(keys).to_pylist() == want
        assert {r["phase"] for r in want} == {"forward", "backward", "optimizer"}


def test_run_ending_before_the_window_is_said(tmp_path, run_cli):
    train(tmp_path / "d", 2, steps="5|10")
    d = opscope.load(tmp_path / "d")
    assert d.steps() == [] and "never reached" in " ".join(d.manifest["notes"])
    assert "never reached" in run_cli("show", tmp_path / "d").stdout


def test_unselected_rank_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    session = opscope.dump(tmp_path / "d", ranks=[0]).start()
    assert bare(1) and session.stop() is None
    assert not (tmp_path / "d").exists()
    train(tmp_path / "e", 1, ranks="3")
    assert opscope.load(tmp_path / "e").ranks == [3]


def test_awkward_tensors(tmp_path):
    def fn():
        x = torch.arange(12.0).reshape(3, 4)
        y = x.t()[1:]  # non-contiguous view
        y.add_(1)  # in place through a view
        z = torch.zeros(0, 5) * 2
        torch.empty(3)  # uninitialized memory: recorded, not measured
        c = torch.randn(3, dtype=torch.complex64) * 2
        i = torch.arange(5) * 3
        b = (i > 4) & (i < 10)
        m = torch.empty(4, 4, device="meta") + 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.nn.functional.linear(torch.randn(2, 3), torch.randn(4, 3))
        return x, y, z, c, i, b, m, h

    with opscope.dump(tmp_path / "d", data="tensor"), torch.no_grad():
        fn()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    assert {"complex64", "int64", "bool", "bfloat16"} <= set(df.dtype)
    assert (df[df.numel == 0].norm == 0).all()
    assert df[df.op == "aten.empty.memory_format"].note.str.contains("uninitialized").all()
    meta = df[df.device == "meta"]
    assert len(meta) and meta.note.notna().all() and meta["norm"].isna().all()
    assert meta.note.str.contains("meta tensor").any()
    add_ = df[(df.op == "aten.add_.Tensor") & (df.io == "output")].iloc[0]
    assert add_["min"] == 2.0  # the in-place output is recorded with its new values


@pytest.mark.parametrize("level", ["aten", "api"])
def test_device_statistics_path_gives_the_same_records_on_cpu(tmp_path, monkeypatch, level):
    """The CUDA path (reductions left on the device, one transfer per step) runs on CPU too. At
    the api level its torch calls made in the optimizer's hooks were recorded as the user's
    before session 43 (4x the rows: the hash's bitwise_xor_, stack, sums)."""
    monkeypatch.setenv("OPSCOPE_STATS_BACKEND", "async")  # the dispatch mode's C engine, same records
    _, native = train(tmp_path / "native", 2, small_transformer, level=level, data="tensor")
    monkeypatch.setenv("OPSCOPE_STATS_BACKEND", "torch")
    _, device = train(tmp_path / "device", 2, small_transformer, level=level, data="tensor")
    assert device.manifest["stats_backend"] == "torch" and native.manifest["stats_backend"] == "async"
    a, b = native.records().to_pandas(), device.records().to_pandas()
    assert len(a) == len(b) > 100
    assert list(a.op) == list(b.op)
    assert (a.hash.fillna(-1) == b.hash.fillna(-1)).all()
    for col in ("min", "max", "mean", "norm"):
        assert np.allclose(a[col], b[col], rtol=1e-5, atol=1e-7, equal_nan=True), col
    monkeypatch.setenv("OPSCOPE_STATS_BACKEND", "gpu")
    with pytest.raises(opscope.ConfigError, match="OPSCOPE_STATS_BACKEND"):
        train(tmp_path / "bad", 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.bool, torch.complex64])
def test_hash_matches_the_numpy_reference_definition(dtype):
    from opscope.capture.torch.worker import tensor_buffer
    from opscope.model.hashing import content_hash

    x = (torch.randn(70001) * 9).to(dtype) if dtype != torch.complex64 else torch.randn(333, dtype=dtype)
    _, _, raw, _ = tensor_buffer(x.contiguous())
    assert cpu_stats(x)[9] == content_hash(raw) == materialize_one(device_stats(x))[9]


def test_tensor_dump_size_is_said_before_the_window_opens(tmp_path):
    import warnings

    from opscope.capture.torch.suspects import TensorDumpSize
    from opscope.demo.models import train_step

    model, opt, batch = small_transformer()
    seen_before_window = []
    with warnings.catch_warnings(record=True) as caught, opscope.dump(tmp_path / "d", data="tensor", steps="3|4") as d:
        warnings.simplefilter("always")
        for i in range(5):
            train_step(model, opt, *batch(i))
            d.step()
            if i == 2:  # step 3, the first tensor step, has not started yet
                seen_before_window = [str(w.message) for w in caught if issubclass(w.category, TensorDumpSize)]
    assert len(seen_before_window) == 1 and "measured on step 2, just before the window" in seen_before_window[0]
    capture = opscope.load(tmp_path / "d").manifest["tensor_capture"]
    assert capture["estimate"]["bytes_per_step"] == capture["bytes_per_step"]["3"] > 0  # the estimate was exact


def test_full_tensor_views_share_their_inputs_data_and_read_back_as_views(tmp_path):
    model = torch.nn.Linear(3, 5)
    x = torch.randn(4, 3)
    with opscope.dump(tmp_path / "d", data="tensor"), torch.no_grad():
        model(x)
        x.t()[1:].contiguous()
    dump = opscope.load(tmp_path / "d")
    rows = dump.records().to_pylist()
    t_out = next(r for r in rows if r["op"] == "aten.t.default" and r["io"] == "output")
    weight = next(r for r in rows if r["op"] == "aten.t.default" and r["io"] == "param")
    assert t_out["view"] and (t_out["data"], t_out["key"]) == (weight["data"], weight["key"])  # no second copy
    assert np.array_equal(dump.row_tensor(t_out), model.weight.detach().numpy().T)
    sliced = next(r for r in rows if r["op"] == "aten.slice.Tensor" and r["io"] == "output")
    got = dump.row_tensor(sliced)  # a view of a view: strides and offset into x's data
    assert np.array_equal(got, x.t()[1:].numpy())


def test_api_level_takes_an_in_place_ops_inputs_before_it_writes_them(tmp_path):
    """``h.mul_(2)``: the input row holds h as it was, the output row h doubled (as the aten
    level does, and as msprobe records API calls)."""

    class Doubling(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            h.mul_(2.0)
            return h

    torch.manual_seed(0)
    model, x = Doubling(), torch.randn(4, 8)
    with opscope.dump(tmp_path / "d", level="api", steps="0", phases=["forward"]):
        model(x).sum().backward()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    mul = df[df.op == "Tensor.mul_"]
    before = float(mul[(mul.io == "input") & (mul.slot == 0)].norm.iloc[0])
    after = float(mul[mul.io == "output"].norm.iloc[0])
    assert after == pytest.approx(2 * before, rel=1e-6)
