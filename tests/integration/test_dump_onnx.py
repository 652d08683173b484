"""dump-onnx on tiny real PyTorch models exported with torch.onnx: module paths, data flow,
statistics and tensors, optimisation levels, fp16, the CLI and its failures."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from opscope.capture.onnxruntime import convert_to_float16, dump_onnx  # noqa: E402
from opscope.capture.onnxruntime.stats import tensor_stats  # noqa: E402

nn = torch.nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.proj(a @ v)
        return x + self.mlp(self.norm2(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _export(model, x, path, opset=17, dynamo=False):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {} if dynamo else {"opset_version": opset}
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["x"], output_names=["y"], **kwargs)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("onnx")
    mlp, net = MLP().eval(), Net().eval()
    x_mlp, x_net = torch.randn(3, 8), torch.randn(2, 5, 16)
    return {
        "dir": d, "mlp": mlp, "net": net, "x_mlp": x_mlp.numpy(), "x_net": x_net.numpy(),
        "mlp.onnx": _export(mlp, x_mlp, d / "mlp.onnx", opset=20),  # Gelu is one node from opset 20
        "net14.onnx": _export(net, x_net, d / "net14.onnx", opset=14),  # LayerNorm, GELU decomposed
        "net17.onnx": _export(net, x_net, d / "net17.onnx", opset=17),
    }


def _records(dump):
    return dump.records().to_pylist()


def _module_outputs(model, x):
    """Each named module's forward output, from PyTorch hooks."""
    out, handles = {}, []

    def hook(name):
        def save(module, args, output):
            out[name] = output.detach().numpy()
        return save

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(hook(name)))
    with torch.no_grad():
        model(torch.from_numpy(x))
    for h in handles:
        h.remove()
    return out


def test_mlp_records_line_up_with_the_pytorch_model(models, tmp_path):
    dump = dump_onnx(models["mlp.onnx"], {"x": models["x_mlp"]}, tmp_path / "d")
    rows = _records(dump)
    assert dump.status == "complete" and not dump.problems
    assert [(r["module"], r["op"]) for r in rows if r["io"] == "output"] == [
        ("fc1", "onnx::Gemm"), ("act", "onnx::Gelu"), ("fc2", "onnx::Gemm")]
    params = {r["param"] for r in rows if r["io"] == "param"}
    assert params == {n for n, _ in models["mlp"].named_parameters()}
    # every tensor equals what PyTorch computes in the module of the same path
    expected = _module_outputs(models["mlp"], models["x_mlp"])
    for r in (r for r in rows if r["io"] == "output"):
        np.testing.assert_allclose(dump.row_tensor(r), expected[r["module"]], rtol=1e-5, atol=1e-6)
    # the final output is bit-exact with a plain ONNX Runtime session on the untouched file
    plain = ort.InferenceSession(str(models["mlp.onnx"]), providers=["CPUExecutionProvider"])
    (y,) = plain.run(["y"], {"x": models["x_mlp"]})
    last = rows[-1]
    assert last["arg"] == "y" and np.array_equal(dump.row_tensor(last), y)


@pytest.mark.parametrize("name", ["net14.onnx", "net17.onnx"])
def test_transformer_paths_flow_and_statistics(models, tmp_path, name):
    dump = dump_onnx(models[name], {"x": models["x_net"]}, tmp_path / "d", modules=models["net"])
    rows = _records(dump)
    by_id = {r["id"]: r for r in rows}
    known = {n for n, _ in models["net"].named_modules()}
    assert {r["module"] for r in rows} <= known
    leaf_modules = {n for n, m in models["net"].named_modules() if not list(m.children())}
    assert leaf_modules <= {r["module"] for r in rows}
    if name == "net14.onnx":  # the decomposed LayerNorm stays inside its module
        ops = [r["op"] for r in rows if r["module"] == "layers.0.norm1" and r["io"] == "output"
               and r["op"] != "onnx::Constant"]
        assert ops[:3] == ["onnx::ReduceMean", "onnx::Sub", "onnx::Pow"] and "onnx::Sqrt" in ops
    linked = [r for r in rows if r["producer"] is not None]
    assert len(linked) > 50
    for r in linked:
        producer = by_id[r["producer"]]
        assert producer["io"] == "output" and producer["arg"] == r["arg"] and producer["seq"] < r["seq"]
        assert (producer["hash"], producer["data"], producer["key"]) == (r["hash"], r["data"], r["key"])
    for r in rows[::7]:
        stats = tensor_stats(dump.row_tensor(r))
        got = tuple(r[k] for k in ("min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash"))
        assert got == stats
    assert {r["dtype"] for r in rows} >= {"float32", "int64"}


def test_dynamo_export_metadata(models, tmp_path):
    pytest.importorskip("onnxscript")
    path = _export(models["net"], torch.from_numpy(models["x_net"]), models["dir"] / "net_dynamo.onnx", dynamo=True)
    rows = _records(dump_onnx(path, {"x": models["x_net"]}, tmp_path / "d", data="statistics"))
    known = {n for n, _ in models["net"].named_modules()}
    assert {r["module"] for r in rows} <= known
    norms = [r for r in rows if r["op"] == "onnx::LayerNormalization" and r["io"] == "output"]
    assert [r["module"] for r in norms] == ["layers.0.norm1", "layers.0.norm2", "layers.1.norm1", "layers.1.norm2"]
    assert '"torch_op":"aten.layer_norm.default"' in norms[0]["args"]
    assert all(r["data"] is None for r in rows)


def test_steps_filters_and_statistics_mode(models, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", **{f"sample{i}/x": rng.standard_normal((3, 8)).astype(np.float32) for i in range(3)})
    dump = dump_onnx(models["mlp.onnx"], tmp_path / "in.npz", tmp_path / "d", data="statistics",
                     mode="output", ops=["onnx::Gemm"])
    rows = _records(dump)
    assert dump.steps() == [0, 1, 2]
    assert {(r["op"], r["io"]) for r in rows} == {("onnx::Gemm", "output")}
    assert all(r["data"] is None and r["producer"] is None for r in rows)
    assert len({r["id"] for r in rows}) == len(rows) == 6
    assert len({r["hash"] for r in rows if r["module"] == "fc2"}) == 3  # three different samples


def test_memory_limit_splits_the_capture_into_runs_with_the_same_result(models, tmp_path):
    one = _records(dump_onnx(models["net17.onnx"], {"x": models["x_net"]}, tmp_path / "a", data="statistics"))
    many = _records(dump_onnx(models["net17.onnx"], {"x": models["x_net"]}, tmp_path / "b", data="statistics",
                              memory_limit_mb=0.001))
    assert [(r["id"], r["hash"], r["producer"]) for r in one] == [(r["id"], r["hash"], r["producer"]) for r in many]


def test_optimised_graph_keeps_module_paths(models, tmp_path):
    rows = _records(dump_onnx(models["net14.onnx"], {"x": models["x_net"]}, tmp_path / "d", opt_level="extended",
                              data="statistics"))
    outputs = [r for r in rows if r["io"] == "output"]
    fused = [r["module"] for r in outputs if r["op"] == "onnx::LayerNormalization"]
    assert fused == ["layers.0.norm1", "layers.0.norm2", "layers.1.norm1", "layers.1.norm2"]
    assert "layers.0.qkv" in {r["module"] for r in outputs if r["op"] == "onnx::Gemm"}


def _overflowing_mlp(models):
    model = MLP().eval()
    model.load_state_dict(models["mlp"].state_dict())
    with torch.no_grad():
        model.fc2.weight.mul_(1e5)  # weights < 65504, but fc2's output is beyond float16's range
    return model


def test_fp16_model_overflow_shows_first_at_the_faulty_node(models, tmp_path):
    x = (models["x_mlp"] * 4).astype(np.float32)
    healthy16 = models["dir"] / "mlp16.onnx"
    onnx.save(convert_to_float16(onnx.load(str(models["mlp.onnx"]))), str(healthy16))
    rows = _records(dump_onnx(healthy16, {"x": x}, tmp_path / "h16", data="statistics"))
    assert not any(r["inf"] or r["nan"] for r in rows)
    assert {r["dtype"] for r in rows if r["op"] == "onnx::Gemm"} == {"float16"}
    fp32_nodes = {r["node"] for r in _records(dump_onnx(models["mlp.onnx"], {"x": x}, tmp_path / "h32"))}
    assert fp32_nodes <= {r["node"] for r in rows}  # nodes keep their names: the dumps line up

    bad = _export(_overflowing_mlp(models), torch.from_numpy(x), models["dir"] / "bad32.onnx")
    bad16 = models["dir"] / "bad16.onnx"
    onnx.save(convert_to_float16(onnx.load(str(bad))), str(bad16))
    rows32 = _records(dump_onnx(bad, {"x": x}, tmp_path / "b32", data="statistics"))
    dump16 = dump_onnx(bad16, {"x": x}, tmp_path / "b16", data="statistics")
    rows16 = _records(dump16)
    # ORT's CPU provider runs these float16 ops in float32 and only rounds captured values:
    # the dump says so instead of silently differing from a plain session
    assert "capture perturbed the run" in rows16[-1]["note"]
    assert any("differs from a plain ONNX Runtime session" in w for w in dump16.manifest["warnings"])
    assert not any(r["inf"] for r in rows32)
    first = next(r for r in rows16 if r["inf"] and r["io"] == "output")
    assert (first["module"], first["op"]) == ("fc2", "onnx::Gemm")
    assert not any(r["inf"] for r in rows16 if r["seq"] < first["seq"])


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    return subprocess.run([sys.executable, "-m", "opscope", "dump-onnx", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_cli_end_to_end_and_faults(models, tmp_path):
    np.savez(tmp_path / "in.npz", x=models["x_mlp"])
    ok = _cli(models["mlp.onnx"], "--inputs", tmp_path / "in.npz", "-o", tmp_path / "d", "--opt-level", "basic")
    assert ok.returncode == 0, ok.stderr
    assert "wrote 10 records of 3 nodes, 1 step(s)" in ok.stdout

    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(Path(models["mlp.onnx"]).read_bytes()[:200])
    bad = _cli(corrupt, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "d2")
    assert bad.returncode == 2 and "is not a readable ONNX model" in bad.stderr and "Traceback" not in bad.stderr

    np.savez(tmp_path / "wrong.npz", input=models["x_mlp"])
    missing = _cli(models["mlp.onnx"], "--inputs", tmp_path / "wrong.npz", "-o", tmp_path / "d3")
    assert missing.returncode == 2
    assert "missing ['x']; unknown ['input']. The model's inputs are: x tensor(float) [3, 8]" in missing.stderr

    provider = _cli(models["mlp.onnx"], "--inputs", tmp_path / "in.npz", "-o", tmp_path / "d4", "--provider", "nope")
    assert provider.returncode == 2 and "available: " in provider.stderr and "CPUExecutionProvider" in provider.stderr

    again = _cli(models["mlp.onnx"], "--inputs", tmp_path / "in.npz", "-o", tmp_path / "d")
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_core_imports_without_onnx(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['onnx'] = None\nsys.modules['onnxruntime'] = None\n"
        "import opscope.cli.dump_onnx, opscope.capture.onnxruntime.capture\n"
        "from opscope.capture.onnxruntime import scopes, plan, fp16\n"
        "from opscope.capture.onnxruntime import dump_onnx\n"
        "from opscope.errors import OpscopeError\n"
        "try:\n    dump_onnx('m.onnx', {}, 'd')\nexcept OpscopeError as e:\n    print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "pip install 'opscope[onnx]'" in out.stdout
