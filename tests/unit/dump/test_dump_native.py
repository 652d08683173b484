"""The native aten-level statistics dump against the Python dispatch mode, on real models:
the same records, the same statistics, the same data flow; and its failure modes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from dump_helpers import dump_both

import opscope
from opscope.capture.torch.native import build as native
from opscope.capture.torch.op_kinds import base_name
from opscope.capture.torch.stats import transposed_planes
from opscope.demo.models import mlp_task, train_step, transformer_task


@pytest.fixture(scope="module", autouse=True)
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump observer did not build: {native.error('_opscope_dump')}"
    return module


def _dump(path, task, backend_name, monkeypatch, steps=2, **keys):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model, opt, batch = task()
    losses = []
    with opscope.dump(path, steps="all", **keys) as d:
        for i in range(steps):
            losses.append(train_step(model, opt, *batch(i)))
            d.step()
    dump = opscope.load(path)
    assert (dump.manifest["stats_backend"] == "native") == (backend_name == "native")
    df = dump.records().to_pandas(integer_object_nulls=True)  # exact 64-bit hashes
    return losses, df


def _calls(df):
    """(step, phase, op, io, slot) -> hash of every measured or linked tensor, keyed by the
    op's base name and its call count: what a comparison lines up. Autograd's own detach
    calls (seen by a Python mode only) and the opposite spellings add/add_ are normalised."""
    out = {}
    counts: dict = {}
    for row in df.sort_values("id").itertuples():
        name = base_name(row.op).rstrip("_")
        if name == "detach":
            continue
        key = (row.step, row.phase, row.module, name)
        if row.io in ("input", "param") and row.slot == 0:
            counts[key] = counts.get(key, -1) + 1
        out[(*key, counts.get(key, 0), row.io, row.slot)] = row.hash
    return out


@pytest.mark.parametrize("task", [lambda: mlp_task(batch=8, d_in=16, hidden=16, depth=2),
                                  lambda: transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)],
                         ids=["mlp", "transformer"])
def test_native_and_python_dumps_hold_the_same_tensors(tmp_path, monkeypatch, task):
    losses_n, nat = _dump(tmp_path / "n", task, "native", monkeypatch)
    losses_p, py = _dump(tmp_path / "p", task, "python", monkeypatch)
    assert losses_n == losses_p  # neither changes the numbers it observes
    a, b = _calls(nat), _calls(py)
    common = set(a) & set(b)
    assert len(common) >= 0.9 * len(b), (len(common), len(b))
    assert all(a[k] == b[k] for k in common)  # the same content, tensor by tensor
    assert set(nat.phase) == set(py.phase) == {"forward", "backward", "optimizer"}
    # data flow: outputs are measured once and their readers link to them
    linked = nat[nat.producer.notna()]
    assert len(linked) > 0.3 * len(nat)
    by_id = nat.set_index("id")
    assert (by_id.loc[linked.producer.astype(int)].hash.to_numpy() == linked.hash.to_numpy()).all()


def test_backward_ops_name_their_forward_op_and_module(tmp_path, monkeypatch):
    _, df = _dump(tmp_path / "n", lambda: mlp_task(batch=8, d_in=16, hidden=16, depth=2), "native", monkeypatch, 1)
    bwd = df[(df.phase == "backward") & (df.op == "aten.mm.default")]
    assert len(bwd) and set(bwd.fwd_op) == {"aten.addmm.default"} and all(bwd.module.str.len() > 0)
    assert set(bwd.node) <= {"AddmmBackward0"}


def test_random_ops_keep_their_generator_state_and_args(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    with opscope.dump(tmp_path / "d") as d:
        torch.nn.functional.dropout(x, 0.5, training=True).sum()
        x.to(torch.float16).sum(dim=0, keepdim=True)
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    import json

    rand = df[df.op.str.contains("bernoulli|native_dropout")].args.dropna()
    assert len(rand) and all(json.loads(a)["rng"]["state"] for a in rand)
    # the CPU state is taken natively: the bytes torch.get_rng_state() gives before the op, so
    # that restoring it draws the same mask
    import base64

    rng = json.loads(rand.iloc[0])["rng"]
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    before = torch.get_rng_state()
    assert rng["device"] == "cpu" and base64.b64decode(rng["state"]) == before.numpy().tobytes()
    mask = torch.nn.functional.dropout(x, 0.5, training=True) != 0
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(rng["state"])), dtype=torch.uint8))
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=True) != 0, mask)
    cast = json.loads(df[df.op == "aten._to_copy.default"].args.dropna().iloc[0])
    assert cast["kwargs"]["dtype"] == "torch.float16"
    keep = json.loads(df[df.op == "aten.sum.dim_IntList"].args.dropna().iloc[0])
    assert [1, [0]] in keep["args"] and [2, True] in keep["args"]


def test_random_ops_record_the_same_generator_state_as_the_python_path(tmp_path, monkeypatch):
    """The native observer writes the CPU generator's state itself (no Python call in the op):
    the same state text, byte for byte, as the Python path's."""
    def dropout_args(backend: str) -> list[str]:
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
        torch.manual_seed(3)
        x = torch.randn(5, 7)
        with opscope.dump(tmp_path / backend) as d:
            for _ in range(2):
                torch.nn.functional.dropout(x, 0.3, training=True)
            d.step()
        df = opscope.load(tmp_path / backend).records().to_pandas()
        args = df.sort_values("seq").args.dropna().drop_duplicates()
        return [json.loads(a)["rng"] for a in args if '"rng"' in a]

    import json

    native, python = dropout_args("native"), dropout_args("python")
    assert len(native) == 2 and native == python  # two states: the generator moved between the calls
    assert native[0]["state"] != native[1]["state"] and native[0]["device"] == "cpu"


def test_a_failing_hook_stops_capture_not_the_run(tmp_path, monkeypatch):
    from opscope.capture.torch.native import aten as native_aten

    real = native_aten._Hooks.selected
    calls = {"n": 0}

    def flaky(self, module, op, phase):
        calls["n"] += 1
        if calls["n"] > 20:
            raise KeyError("simulated opscope bug")
        return real(self, module, op, phase)

    monkeypatch.setattr(native_aten._Hooks, "selected", flaky)
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    task = lambda: mlp_task(batch=8, d_in=16, hidden=16, depth=2)  # noqa: E731
    torch.manual_seed(0)
    model, opt, batch = task()
    losses = []
    with pytest.warns(RuntimeWarning, match="stopped capturing"), opscope.dump(tmp_path / "d") as d:
        for i in range(3):
            losses.append(train_step(model, opt, *batch(i)))
            d.step()
    torch.manual_seed(0)
    model, opt, batch = task()
    assert losses == [train_step(model, opt, *batch(i)) for i in range(3)]
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and "simulated opscope bug" in dump.error


def test_without_a_compiler_the_python_mode_dumps_the_same(tmp_path):
    code = textwrap.dedent("""
        import torch, opscope
        from opscope.capture.torch.native import aten as native_aten
        assert native_aten.backend_for(opscope.config.dump_config(None, path="x")) is None
        torch.manual_seed(0)
        x = torch.randn(3, 3, requires_grad=True)
        with opscope.dump({!r}) as d:
            (x * 2).sum().backward()
            d.step()
        print(sorted(set(opscope.load({!r}).records().to_pandas().op)))
    """.format(str(tmp_path / "d"), str(tmp_path / "d")))
    env = {**os.environ, "OPSCOPE_CACHE_DIR": str(tmp_path / "cache"), "CXX": "/bin/false",
           "OPSCOPE_DUMP_BACKEND": "native"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "aten.mul.Tensor" in proc.stdout and "aten.sum.default" in proc.stdout


def test_statistics_taken_off_the_training_thread_are_those_before_an_in_place_write(tmp_path, monkeypatch):
    """The native worker thread measures an output while the step goes on; an op that writes it
    in place right after waits for that measurement (else it would see the written values)."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    monkeypatch.setenv("OPSCOPE_STATS_THREAD", "1")  # the worker is opt-in
    big, small = torch.ones(1 << 22), torch.ones(1 << 16)
    with opscope.dump(tmp_path / "d", level="aten", ops=["aten.mul*", "aten.add_*"]) as d:
        for k in range(8):
            backlog = [big * 0.5 for _ in range(3)]  # 48 MB queued for the worker
            y = small * float(k + 1)  # measured after the backlog...
            y.add_(100.0)  # ...and written at once
            del backlog
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    df = df[df.numel == 1 << 16]
    muls = df[(df.op == "aten.mul.Tensor") & (df.io == "output")]
    adds = df[(df.op == "aten.add_.Tensor") & (df.io == "input") & (df.slot == 0)]
    assert sorted(muls["max"]) == [float(k + 1) for k in range(8)]  # the values before the write
    assert sorted(adds["max"]) == sorted(muls["max"])  # the in-place op's input: the same


def test_steps_not_selected_watch_no_module_call(tmp_path):
    """With d.step() ending the steps, a step outside `steps` runs without opscope's global module
    hooks (each module call would take torch's slower path); a captured step has them again."""
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = len(hooks)
    model, opt, batch = mlp_task(batch=8, d_in=16, hidden=16, depth=2)
    seen = []
    with opscope.dump(tmp_path / "d", steps="0|3") as d:
        for i in range(5):
            seen.append(len(hooks) - before)
            train_step(model, opt, *batch(i))
            d.step()
    assert seen == [1, 0, 0, 1, 0] and len(hooks) == before
    df = opscope.load(tmp_path / "d").records().to_pandas()
    assert set(df.step) == {0, 3}
    assert (df[df.step == 3].module == "layers.0").sum() == (df[df.step == 0].module == "layers.0").sum() > 0


def test_outputs_holding_their_inputs_bytes_take_their_statistics_unread(tmp_path, monkeypatch, backend):
    """An output that holds an input's very bytes (clone, a copying `to`, the `_unsafe_view` a
    reshape of a non-contiguous tensor returns) is not read again: its statistics are the input's,
    and the rows are those of the Python path, which reads it. Changed values are read anew."""
    x = torch.randn(64, 32)

    def work():
        a = x * 2
        b = a.clone()  # a's bytes
        c = a.t().reshape(-1)  # clone of a transposed view (read) and _unsafe_view of that clone (not)
        d = b.to(torch.float32, copy=True)  # a's bytes again
        e = b.to(torch.float64)  # other bytes
        b.add_(1)  # written in place: read
        f = b.clone()  # b's new bytes
        return c, d, e, f

    rows, read = dump_both(tmp_path, monkeypatch, backend, work)
    columns = ["op", "call", "io", "slot", "numel", "producer", "note", "min", "max", "mean", "std", "norm", "nan",
               "zeros", "hash"]
    native_rows, python_rows = (rows[n].sort_values("id")[columns].astype(str).values.tolist() for n in rows)
    assert native_rows == python_rows
    elements = x.numel()
    # x, a, the transposed clone, add_'s output; the float64 copy (the Python path has its own kernel)
    assert read == {"native": 4 * elements * 4 + 8 * elements, "python": 0}
    out = rows["native"][rows["native"].io == "output"].set_index(["op", "call"])
    assert out.loc[("aten.clone.default", 0), "hash"] == out.loc[("aten.mul.Tensor", 0), "hash"]
    assert out.loc[("aten.clone.default", 2), "hash"] == out.loc[("aten.add_.Tensor", 0), "hash"]
    assert out.loc[("aten.clone.default", 2), "hash"] != out.loc[("aten.clone.default", 0), "hash"]


def test_number_arguments_keep_their_exact_value(tmp_path, monkeypatch):
    """Doubles in the argument JSON are written natively (std::to_chars): each reads back as the
    very same float, an integral one still a float (2.0, not 2), in the text json.dumps (Python's
    repr) gives it, as the Python capture writes it: 0.7, not 0.69999999999999996."""
    import json
    import math

    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    values = [0.1, 1e-05, 2.0, -1e300, 1e16, 123456789012345680.0, 5e-324, 1 / 3, -0.0, 0.7, 0.0001, 1e15,
              1e22, -2.5e-07, 1.7976931348623157e308, 0.1 + 0.2]
    x = torch.randn(4, dtype=torch.float64)  # holds every alpha below
    with opscope.dump(tmp_path / "d") as d:
        for v in values:
            torch.add(x, x, alpha=v)
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    calls = df[df.op == "aten.add.Tensor"].drop_duplicates("seq").sort_values("seq")
    got = [json.loads(a)["kwargs"]["alpha"] for a in calls.args]
    assert len(got) == len(values)
    for v, g, text in zip(values, got, calls.args, strict=True):
        assert isinstance(g, float) and g == v and math.copysign(1, g) == math.copysign(1, v), (v, g)
        assert f'"alpha": {json.dumps(v)}' in text, (v, text)


def test_non_contiguous_inputs_are_measured_as_their_contiguous_copy(tmp_path, monkeypatch):
    """A non-contiguous tensor is read natively in row-major order (no torch op): every statistic
    and the hash are those of the same values laid out contiguously. Planes stored transposed
    (``transposed_planes``) are read in memory order instead: the hash, min, max and counts are
    still the copy's, the sums differ from its at most in their rounding."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    torch.manual_seed(0)
    base = torch.randn(6, 10, 4, dtype=torch.float64)
    strided = [base.transpose(0, 2), base[:, ::3, 1:], base.permute(1, 2, 0)[2:], base[0, :1].expand(5, 4),
               base.float().transpose(0, 1), base.half()[::2, :, ::2], base.bfloat16().mT, (base > 0).transpose(1, 2),
               (base * 100).to(torch.int64)[:, :, ::2], (base * 50).to(torch.int8).transpose(0, 1)]
    # transposed planes, read in tiles (native/_c/gather.h): every element size, sizes that no
    # tile or block divides, planes under outer dimensions, a broadcast column (stride 0)
    big = torch.randn(3, 133, 70)
    strided += [big.mT, big.double()[1].t(), big.half().mT[::2], (big * 50).to(torch.int8).mT,
                torch.randn(300, 260).t(), torch.randn(133)[:, None].expand(133, 9), torch.randn(2, 5, 8).mT[:, 1:]]
    assert not any(t.is_contiguous() for t in strided)
    copies = [t.contiguous().clone() for t in strided]
    with opscope.dump(tmp_path / "d") as d:
        for t in strided + copies:
            t.sum()
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas(integer_object_nulls=True)
    rows = df[(df.op.str.startswith("aten.sum")) & (df.io == "input")].sort_values("seq")
    assert len(rows) == 2 * len(strided)
    cols = [c for c in ("hash", "min", "max", "mean", "std", "norm", "nan_count", "inf_count", "zero_count")
            if c in rows.columns]
    assert "hash" in cols and "mean" in cols
    got, want = rows.iloc[:len(strided)], rows.iloc[len(strided):]
    in_memory_order = [transposed_planes(t) is not None and t.element_size() > 1 for t in strided]
    assert sum(in_memory_order) == 4, in_memory_order  # bfloat16 .mT, big.mT, two .t()
    for i in range(len(strided)):
        for c in cols:
            a, b = got.iloc[i][c], want.iloc[i][c]
            if in_memory_order[i] and c in ("mean", "std", "norm"):
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7 * float(want.iloc[i]["norm"])), (i, c, a, b)
            else:
                assert (a == b) or (a != a and b != b), (i, c, a, b)


def _intra_op_task():
    """Ops whose kernels run on ATen's intra-op pool with 2 threads: a float64 3-d convolution
    (slow_conv3d: no oneDNN for float64, the batch split over threads), a batched float64
    matrix product and elementwise ops over more elements than one thread's grain."""
    conv = torch.nn.Conv3d(2, 3, 3).double()
    w = torch.randn(4, 16, 16, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([*conv.parameters(), w], lr=0.01)

    def step(i):
        torch.manual_seed(i)
        x = torch.randn(8, 2, 6, 6, 6, dtype=torch.float64)
        m = torch.baddbmm(torch.randn(4, 16, 16, dtype=torch.float64), torch.randn(4, 16, 16, dtype=torch.float64), w)
        big = torch.randn(200_000, dtype=torch.float64)
        loss = conv(x).relu().mean() + m.square().mean() + (big * 2.0).exp().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def test_ops_run_by_intra_op_workers_are_not_recorded_as_the_users(tmp_path, monkeypatch):
    """With 2 intra-op threads the native observer records what the Python mode sees, op for
    op: ATen's parallel_for does not carry the thread-local callback to its workers, so an op
    a kernel calls there is not taken for a top-level op (the worker's own open-op count is 0)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = {}
        for name in ("native", "python"):
            monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
            torch.manual_seed(0)
            step = _intra_op_task()
            with opscope.dump(tmp_path / name, steps="all") as d:
                losses = []
                for i in range(2):
                    losses.append(step(i))
                    d.step()
            got[name] = (losses, _calls(opscope.load(tmp_path / name).records().to_pandas(integer_object_nulls=True)))
    finally:
        torch.set_num_threads(threads)
    (losses_n, nat), (losses_p, py) = got["native"], got["python"]
    assert losses_n == losses_p
    assert set(nat) == set(py)  # not one row more: no op of a worker recorded
    assert all(nat[k] == py[k] for k in nat)
    ops = {k[3] for k in nat}
    assert {"convolution", "baddbmm", "exp"} <= ops and not ops & {"select", "slow_conv3d_forward", "addmm"}


def _call_args(root, backend: str, monkeypatch) -> dict[str, str]:
    """The ``args`` text of each op of a few calls dumped by ``backend``: {op: args}."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    x = torch.randn(4, 6, dtype=torch.float64)
    with opscope.dump(root) as d:
        torch.nn.functional.gelu(x, approximate="tanh")
        torch.zeros(3, 2, dtype=torch.bfloat16, layout=torch.strided)
        torch.empty(1, 2, 3, 3, memory_format=torch.channels_last)
        x.sum(dim=[0, 1], keepdim=True)
        x.clamp(min=-0.5, max=None)
        x.masked_fill(x > 0, float("-inf"))
        torch.div(x, 3, rounding_mode="floor")
        torch.ops.aten.convolution_backward(torch.ones(1, 3, 3, 3), torch.ones(1, 2, 5, 5), torch.ones(3, 2, 3, 3),
                                            [3], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, False, True])
        x + True
        torch.add(x, x, alpha=2)
        torch.addmm(x[:, :4], x, x.T[:, :4])
        torch.ones_like(x, dtype=torch.float32)
        d.step()
    df = opscope.load(root).records().to_pandas()
    return {r.op: r.args if isinstance(r.args, str) else None for r in df.drop_duplicates("seq").itertuples()}


def test_arguments_are_written_as_json_by_the_writer(tmp_path, monkeypatch):
    """The observer keeps each call's arguments as a binary record and the writer's thread
    writes the JSON: dtypes, layouts and memory formats by name, strings, int and bool lists,
    None, infinities, Python numbers passed as tensors, keyword arguments by name. The
    arguments are those a dispatch mode is given, so the very text of the Python capture:
    keyword-only ones at their default left out (addmm's beta and alpha, add's alpha of 1, sum's
    dtype), and positional ones at theirs from the last back."""
    got = _call_args(tmp_path / "n", "native", monkeypatch)
    assert got == _call_args(tmp_path / "p", "python", monkeypatch)
    pin = '"device": "cpu", "pin_memory": false'
    want = {
        "aten.gelu.default": '{"args": [], "kwargs": {"approximate": "tanh"}}',
        "aten.zeros.default":
            '{"args": [[0, [3, 2]]], "kwargs": {"dtype": "torch.bfloat16", "layout": "torch.strided", ' + pin + '}}',
        "aten.empty.memory_format": '{"args": [[0, [1, 2, 3, 3]]], "kwargs": {' + pin
                                    + ', "memory_format": "torch.channels_last"}}',
        "aten.sum.dim_IntList": '{"args": [[1, [0, 1]], [2, true]], "kwargs": {}}',
        "aten.clamp.default": '{"args": [[1, -0.5]], "kwargs": {}}',
        "aten.masked_fill.Scalar": '{"args": [[2, -Infinity]], "kwargs": {}}',
        "aten.div.Tensor_mode": '{"args": [[1, 3]], "kwargs": {"rounding_mode": "floor"}}',
        "aten.convolution_backward.default": '{"args": [[3, [3]], [4, [1, 1]], [5, [0, 0]], [6, [1, 1]], [7, false], '
                                             '[8, [0, 0]], [9, 1], [10, [true, false, true]]], "kwargs": {}}',
        "aten.addmm.default": None,
    }
    assert {op: got.get(op) for op in want} == want
    assert '"alpha": 2' in got["aten.add.Tensor"] or got["aten.add.Tensor"] == '{"args": [[1, true]], "kwargs": {}}'


def test_build_flags_name_torchs_own_folders_without_importing_cpp_extension() -> None:
    """The cache key is computed at each process's first dump; torch.utils.cpp_extension (which
    imports setuptools, ~0.1 s) is needed only to compare against here."""
    import subprocess
    import sys

    from torch.utils import cpp_extension as ce

    from opscope.capture.torch.native import build

    assert build.torch_paths() == (ce.include_paths(), ce.library_paths())
    script = ("import sys; from pathlib import Path; from opscope.capture.torch.native import build\n"
              "build._target('_opscope_dump')\n"
              "print('torch.utils.cpp_extension' in sys.modules, 'setuptools' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False"]


def test_a_second_copy_of_opscope_reuses_the_build(tmp_path) -> None:
    """The cache key hashes the sources, not where they lie: opscope installed again (another
    venv, an editable checkout) found no build and compiled its three extensions anew (~30 s)."""
    import importlib.util
    import shutil
    from pathlib import Path

    copy = tmp_path / "elsewhere" / "opscope"
    shutil.copytree(Path(native.__file__).parents[3], copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    names = sorted(native._SOURCES)

    def targets() -> list[Path]:  # build.py of the copy, run from there
        spec = importlib.util.spec_from_file_location("build_copy", copy / "capture" / "torch" / "native" / "build.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert str(module._SOURCES["_opscope_dump"]).startswith(str(copy))
        return [module._target(n) for n in names]

    assert targets() == [native._target(n) for n in names]
    (copy / "_c" / "opscope_half.h").write_text("// changed\n")  # a changed header: a new build of each
    assert all(a != b for a, b in zip(targets(), [native._target(n) for n in names]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_of_the_lowest_value_has_the_same_finite_statistics_natively(tmp_path, monkeypatch, dtype):
    """Blocks whose float32 sums overflow (an additive mask of finfo.min) are summed in double
    by the native observer exactly as by the Python module's kernel, on every block size."""
    rows = {}
    scores = torch.randn(3, 70, 70, generator=torch.Generator().manual_seed(0)).to(dtype)
    for backend_name in ("native", "python"):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
        with opscope.dump(tmp_path / backend_name, steps="all") as d:
            mask = torch.full((70, 70), torch.finfo(dtype).min, dtype=dtype).triu(1)
            (scores + mask).softmax(-1)
            d.step()
        df = opscope.load(tmp_path / backend_name).records().to_pandas()
        rows[backend_name] = df[df.io == "output"].set_index("op")[["norm", "mean", "std", "inf"]]
    native, python = rows["native"], rows["python"]
    masked = native.loc[["aten.full.default", "aten.triu.default", "aten.add.Tensor"]]
    assert np.isfinite(masked[["norm", "mean", "std"]].to_numpy()).all() and (masked["inf"] == 0).all()
    assert native.equals(python)


@pytest.mark.parametrize("backend_name", ["native", "python"])
def test_ops_with_a_kernel_beside_their_decomposition_are_recorded(tmp_path, monkeypatch, backend_name):
    """silu_backward and mish_backward register a CompositeImplicitAutograd decomposition and
    a CPU kernel; on CPU the kernel runs, so there are no parts to record in their place. The
    native observer took them for decomposed ops and recorded nothing: the gradient they make
    (Llama's MLP, every SiLU network's backward) had no producer."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    with opscope.dump(tmp_path / "d", steps=[0], level="aten") as d:
        (torch.nn.functional.silu(lin(x)) + torch.nn.functional.mish(lin(x))).sum().backward()
        opt.step()
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    back = df[df.phase == "backward"]
    ops = set(back.op.map(base_name))
    assert {"silu_backward", "mish_backward"} <= ops, sorted(ops)
    made = back[back.io == "output"]
    for name in ("silu_backward", "mish_backward"):
        out = made[made.op.map(base_name) == name]
        readers = back[(back.io == "input") & back.producer.isin(out.id)]
        assert len(readers) >= 1, f"nothing reads {name}'s output through the data flow"


@pytest.mark.parametrize("backend_name", ["native", "python"])
@pytest.mark.parametrize("level", ["aten", "api"])
def test_what_an_op_overwrites_unread_is_recorded_unmeasured(tmp_path, monkeypatch, backend_name, level):
    """Dropout's bernoulli_ draws into empty_like's memory, copy_ and zero_ fill theirs: the
    bytes there before are not data (they differed from run to run, and a compare of the same
    run twice came out "within tolerance", not "identical"). Their first argument is recorded
    with a note and no statistics; the other arguments and the outputs are measured."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    with opscope.dump(tmp_path / "d", steps=[0], level=level) as d:
        model(torch.randn(4, 8)).sum().backward()
        buf = torch.empty(3)
        buf.copy_(torch.full((3,), 2.0))
        buf.zero_()
        d.step()
    df = opscope.load(tmp_path / "d").records().to_pandas()
    names = {"aten": ("bernoulli_", "copy_", "zero_"), "api": ("copy_", "zero_")}[level]
    for name in names:
        rows = df[df.op.map(base_name) == name]
        first = rows[(rows.io == "input") & (rows.slot == 0)]
        assert len(first) == 1, (name, rows[["io", "slot"]].values.tolist())
        assert first.note.iloc[0] == "overwritten without being read: not measured"
        assert first["mean"].isna().all() and first["hash"].isna().all() and first.producer.isna().all()
        assert rows[rows.io == "output"]["hash"].notna().all(), name
    copied = df[(df.op.map(base_name) == "copy_") & (df.io == "output")]
    assert copied["mean"].tolist() == [2.0]
