"""compare across frameworks, on tiny real models exported with torch.onnx: a PyTorch dump
against an ONNX Runtime dump (aten, api and module level, both directions), faults edited
into the ONNX graph, and an fp16 copy against its fp32 original."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

import opscope  # noqa: E402
from opscope.capture.onnxruntime import convert_to_float16, dump_onnx  # noqa: E402

nn = torch.nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: LayerNorm, attention, GELU MLP, residuals."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.norm1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        with torch.no_grad():  # distinct norms: the exporter would share equal initializers
            for norm in (self.norm1, self.norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.proj(a @ v)
        return x + self.mlp(self.norm2(x))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.relu(self.bn(self.conv(x)))), 1))


class WideNorm(nn.Module):
    """Large pre-norm activations: LayerNorm's x² overflows float16 when decomposed (opset 14)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 4)
        with torch.no_grad():
            self.fc1.weight.mul_(scale)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)))


INPUTS = {"mlp": (3, 8), "block": (2, 5, 16), "cnn": (2, 3, 6, 6)}
MODELS = {"mlp": MLP, "block": Block, "cnn": CNN}
# (model, opset, dynamo): opset 20 has one Gelu node, 14 decomposes GELU and LayerNorm;
# the TorchScript exporter folds eval-mode BatchNorm into the Conv, the dynamo one too
EXPORTS = [("mlp", 20, False), ("block", 14, False), ("block", 17, False), ("cnn", 17, False), ("cnn", 18, True)]


def _export(model, x, path, opset, dynamo=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = {} if dynamo else {"opset_version": opset}
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["x"], output_names=["y"], **kwargs)
    return path


def _tag(name, opset, dynamo):
    return f"{name}{opset}{'dyn' if dynamo else ''}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Per model: torch dumps at each level, and an ORT dump per export."""
    d = tmp_path_factory.mktemp("xf")
    out = {"dir": d}
    for name, cls in MODELS.items():
        torch.manual_seed(0)
        model, x = cls().eval(), torch.randn(*INPUTS[name])
        out[name] = (model, x)
        for level in ("aten", "api", "module") if name == "block" else ("aten", "module"):
            with torch.no_grad(), opscope.dump(d / f"{name}-{level}", level=level, data="tensor"):
                model(x)
    for name, opset, dynamo in EXPORTS:
        model, x = out[name]
        path = _export(model, x, d / f"{_tag(name, opset, dynamo)}.onnx", opset, dynamo)
        dump_onnx(str(path), {"x": x.numpy()}, str(d / f"ort-{_tag(name, opset, dynamo)}"), modules=model)
    return out


def _compare(target, reference):
    return opscope.compare(str(target), str(reference), workers=1)


def _rows(result, **where):
    df = result.pairs
    for col, value in where.items():
        df = df[df[col] == value]
    return df


def _edited(runs, tag, edit, name):
    """Dump a copy of an exported model with ``edit(model)`` applied."""
    model = onnx.load(str(runs["dir"] / f"{tag}.onnx"))
    edit(model)
    path = runs["dir"] / f"{tag}-{edit.__name__}.onnx"
    onnx.save(model, str(path))
    torch_model, x = runs[name]
    out = runs["dir"] / f"ort-{tag}-{edit.__name__}"
    if not out.exists():
        dump_onnx(str(path), {"x": x.numpy()}, str(out), modules=torch_model)
    return out


def _scale_row(model, name, factor=1.05):
    from onnx import numpy_helper

    for i, init in enumerate(model.graph.initializer):
        if init.name == name:
            arr = numpy_helper.to_array(init).copy()
            arr[0] *= factor
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, name))
            return
    raise KeyError(name)


# -- healthy models: every direction and level, no culprit -------------------------------------
# the api level is dumped for the transformer block only
HEALTHY = [(*export, level) for export in EXPORTS for level in ("aten", "api", "module")
           if level != "api" or export[0] == "block"]


@pytest.mark.parametrize(("name", "opset", "dynamo", "level"), HEALTHY)
def test_healthy_model_has_no_culprit_against_pytorch(runs, name, opset, dynamo, level):
    ort = runs["dir"] / f"ort-{_tag(name, opset, dynamo)}"
    torch_dump = runs["dir"] / f"{name}-{level}"
    for target, reference in ((ort, torch_dump), (torch_dump, ort)):
        result = _compare(target, reference)
        assert result.verdict == "within_tolerance", (target, [(c.module, c.op, c.score) for c in result.culprits])
        assert not result.culprits and result.first_divergence is None
        assert result.counts["failed"] == 0
    # the model's input and final output pair (ORT as target)
    result = _compare(ort, torch_dump)
    final = _rows(result, io="output", arg="y")  # the graph output
    assert set(final.kind) == {"aligned"} and set(final.status) == {"passed"}, final.to_dict()
    x = _rows(result, note="model input")
    assert len(x) == 1 and x.iloc[0].status == "identical"


def test_gemm_pairs_with_addmm_and_with_the_linear_module(runs):
    aten = _compare(runs["dir"] / "ort-mlp20", runs["dir"] / "mlp-aten")
    outs = _rows(aten, io="output", kind="aligned")
    assert set(zip(outs.module, outs.op, outs.op_reference)) == {
        ("fc1", "onnx::Gemm", "aten.addmm.default"), ("act", "onnx::Gelu", "aten.gelu.default"),
        ("fc2", "onnx::Gemm", "aten.addmm.default")}
    params = _rows(aten, io="param", kind="aligned")
    assert set(params.param) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert set(params.status) == {"identical"}
    module = _compare(runs["dir"] / "ort-mlp20", runs["dir"] / "mlp-module")
    outs = _rows(module, io="output", kind="aligned")
    assert ("fc1", "onnx::Gemm", "Linear") in set(zip(outs.module, outs.op, outs.op_reference))
    assert ("fc2", "onnx::Gemm", "MLP") in set(zip(outs.module, outs.op, outs.op_reference))  # the model output


def test_decomposed_gelu_and_layer_norm_pair_their_last_node_and_leave_the_rest_unpaired(runs):
    result = _compare(runs["dir"] / "ort-block14", runs["dir"] / "block-aten")
    outs = _rows(result, io="output", kind="aligned")
    pairs = set(zip(outs.module, outs.op, outs.op_reference))
    assert ("mlp.1", "onnx::Mul", "aten.gelu.default") in pairs            # Div, Erf, Add, Mul, Mul
    assert ("norm1", "onnx::Add", "aten.native_layer_norm.default") in pairs  # ReduceMean ... Add
    assert ("qkv", "onnx::Add", "aten.addmm.default") in pairs               # MatMul + Add
    assert ("", "onnx::Softmax", "aten._softmax.default") in pairs
    assert ("", "onnx::MatMul", "aten.bmm.default") in pairs
    internal = result.pairs[result.pairs.op.isin(["onnx::Erf", "onnx::Pow", "onnx::Sqrt", "onnx::ReduceMean",
                                                  "onnx::Constant", "onnx::Shape"])]
    assert len(internal) > 20
    inner = internal[internal.io == "output"]  # (the first node's input is the torch op's input)
    assert len(inner) > 10 and set(inner.kind) == {"unpaired"} and set(inner.status) == {"unpaired"}
    assert result.counts["unpaired_target"] >= len(internal)
    note = outs[outs.op_reference == "aten.gelu.default"].iloc[0].note
    assert "Erf" in note and "no counterpart" in note


def test_batch_norm_folded_into_conv_pairs_with_the_conv(runs):
    for tag in ("cnn17", "cnn18dyn"):
        result = _compare(runs["dir"] / f"ort-{tag}", runs["dir"] / "cnn-aten")
        conv = _rows(result, op="onnx::Conv", io="output").iloc[0]
        assert conv.op_reference.startswith("aten.native_batch_norm") and conv.status == "passed"
        torch_conv = _rows(result, op="aten.convolution.default", io="output").iloc[0]
        assert torch_conv.kind == "unpaired"
        # the folded Conv's weights are not the convolution's: never paired, never a root
        assert _rows(result, op="onnx::Conv", io="param", kind="aligned").empty
    module = _compare(runs["dir"] / "ort-cnn17", runs["dir"] / "cnn-module")
    outs = _rows(module, io="output", kind="aligned")
    assert ("conv", "onnx::Conv", "BatchNorm2d") in set(zip(outs.module, outs.op, outs.op_reference))


# -- faults edited into the ONNX graph ----------------------------------------------------------
def gelu_tanh(model):
    node = next(n for n in model.graph.node if n.op_type == "Gelu")
    kept = [a for a in node.attribute if a.name != "approximate"]
    del node.attribute[:]
    node.attribute.extend([*kept, onnx.helper.make_attribute("approximate", "tanh")])


@pytest.mark.parametrize("level", ["aten", "module"])
def test_changed_gelu_is_blamed_on_the_gelu(runs, level):
    bad = _edited(runs, "mlp20", gelu_tanh, "mlp")
    result = _compare(bad, runs["dir"] / f"mlp-{level}")
    first = result.first_divergence
    assert result.verdict == "diverged" and (first.kind, first.module, first.op) == ("culprit", "act", "onnx::Gelu")
    assert len(result.culprits) == 1
    back = _compare(runs["dir"] / f"mlp-{level}", bad).first_divergence  # PyTorch as the target
    assert (back.module, back.op) == ("act", "aten.gelu.default" if level == "aten" else "GELU")


def scale_derived_weight(model):
    names = [i.name for i in model.graph.initializer if i.name.startswith("onnx::MatMul")]
    _scale_row(model, names[2])  # mlp.0's pre-transposed weight (no PyTorch name)


def scale_bias(model):
    _scale_row(model, "qkv.bias")


def scale_folded_conv(model):
    _scale_row(model, next(i.name for i in model.graph.initializer if i.name.startswith("onnx::Conv")))


@pytest.mark.parametrize(("tag", "name", "edit", "expected"), [
    ("block14", "block", scale_derived_weight, ("culprit", "mlp.0", "onnx::Add")),  # MatMul+Add = addmm
    ("block14", "block", scale_bias, ("root", "qkv", "onnx::Add")),
    ("cnn17", "cnn", scale_folded_conv, ("culprit", "conv", "onnx::Conv")),
])
def test_scaled_initializer_row_is_blamed_on_its_node(runs, tag, name, edit, expected):
    bad = _edited(runs, tag, edit, name)
    result = _compare(bad, runs["dir"] / f"{name}-aten")
    first = result.first_divergence
    assert (first.kind, first.module, first.op) == expected
    assert len(result.culprits) == 1, [(c.kind, c.module, c.op) for c in result.culprits]
    if first.kind == "root":
        assert first.param == "qkv.bias"


# -- fp16 copy against its fp32 original --------------------------------------------------------
@pytest.fixture(scope="module")
def fp16_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp16")
    out = {}
    for scale in (1.0, 300.0):
        torch.manual_seed(0)
        model, x = WideNorm(scale).eval(), torch.randn(4, 8)
        fp32 = onnx.load(str(_export(model, x, d / f"wide{scale}.onnx", opset=14)))
        for tag, proto in (("fp32", fp32), ("fp16", convert_to_float16(fp32))):
            out[(scale, tag)] = dump_onnx(proto, {"x": x.numpy()}, str(d / f"{tag}-{scale}"))
    return out


def test_fp16_copy_of_a_healthy_model_is_within_tolerance(fp16_runs):
    result = _compare(fp16_runs[(1.0, "fp16")].path, fp16_runs[(1.0, "fp32")].path)
    assert result.verdict == "within_tolerance" and not result.culprits
    assert result.counts["failed"] == 0 and result.counts["pairs"] > 30
    outs = _rows(result, io="output")
    assert set(outs[outs.kind == "unpaired"].op) <= {"onnx::Cast"}  # the converter's input/output casts
    warned = fp16_runs[(1.0, "fp16")].manifest.get("warnings") or []
    assert all(any(w in p for p in result.problems) for w in warned)  # manifest warnings surface


def test_fp16_overflow_names_the_op_that_overflowed(fp16_runs):
    result = _compare(fp16_runs[(300.0, "fp16")].path, fp16_runs[(300.0, "fp32")].path)
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.kind, first.module, first.op) == ("culprit", "norm", "onnx::Pow")  # x² > 65504
    assert first.metrics["inf_mismatch"] > 0
    assert len(result.culprits) == 1
    fc1 = _rows(result, module="fc1", io="output", kind="aligned")
    assert set(fc1.status) == {"passed"}  # the values that overflow when squared are fine themselves
    assert np.isfinite(fc1.error).all()


@pytest.mark.parametrize(("tag", "name"), [("block17", "block"), ("cnn17", "cnn")])
@pytest.mark.parametrize("opt_level", ["basic", "extended"])
def test_graph_optimised_by_onnx_runtime_has_no_culprit(runs, tag, name, opt_level):
    """ORT's rewrites (Gemm from MatMul+Add, FusedMatMul, Conv+BatchNorm+Relu as FusedConv,
    Reshapes without a scope) leave what they cannot pair unpaired, never mis-paired."""
    model, x = runs[name]
    out = runs["dir"] / f"ort-{tag}-{opt_level}"
    dump_onnx(str(runs["dir"] / f"{tag}.onnx"), {"x": x.numpy()}, str(out), modules=model, opt_level=opt_level)
    for level in ("aten", "module"):
        result = _compare(out, runs["dir"] / f"{name}-{level}")
        assert not result.culprits, [(c.module, c.op, c.score) for c in result.culprits]
        assert set(_rows(result, io="output", arg="y").kind) == {"aligned"}
