"""msprobe's MindSpore dumps (framework "mindspore") on the committed real dumps
(tests/data/msprobe_mindspore, written by msprobe 26.2.0 on MindSpore 2.10 CPU): names kept in
MindSpore's namespace, Cell names as modules, .npy tensors read without pickle, the fault
named at its layer, the same run twice clean, show and convert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import opscope
from opscope.compare.flow import base_op
from opscope.errors import DumpFormatError, ReplayError
from opscope.replay.loader import load_call
from opscope.storage.peers.msprobe import load_tensor
from opscope.storage.peers.msprobe_names import dtype_name, mindspore_name

DATA = Path(__file__).resolve().parents[2] / "data" / "msprobe_mindspore"


@pytest.fixture(scope="module")
def ref_rows() -> list[dict]:
    return opscope.load(DATA / "ref").records(step=0).to_pylist()


def _folder(case: str, step: int = 0) -> Path:
    return next((DATA / case / f"step{step}").iterdir())


def test_names_dtypes_modules_phases(ref_rows: list[dict]) -> None:
    d = opscope.load(DATA / "ref")
    assert d.manifest["framework"] == {"mindspore": "(not recorded)"} and d.partitions() == [(0, 0), (0, 1)]
    assert not d.problems  # framework "mindspore" is read as itself, not as PyTorch names
    ops = {r["op"] for r in ref_rows}
    assert ops >= {"mindspore.MatMul", "mindspore.BiasAdd", "mindspore.LayerNorm", "mindspore.ops.gelu",
                   "mindspore.Tensor.mul", "mindspore.Tensor.add"}
    assert not any(o.startswith(("torch.", "Tensor.", "Primitive.")) for o in ops)
    assert [base_op(o) for o in ("mindspore.MatMul", "mindspore.BiasAdd", "mindspore.Tensor.to")] == [
        "mm", "add", "to"]  # compare's per-op rules apply through the MindSpore vocabulary
    matmul = [r for r in ref_rows if r["op"] == "mindspore.MatMul" and r["phase"] == "forward"
              and r["module"] == "layers.1.fc"]
    assert [(r["io"], r["slot"], r["dtype"], r["param"]) for r in matmul] == [
        ("input", 0, "float32", None), ("param", 1, "float32", "layers.1.fc.weight"), ("output", 0, "float32", None)]
    assert {r["phase"] for r in ref_rows} == {"forward", "backward"}
    assert {r["module"] for r in ref_rows if r["op"] == "mindspore.Tensor.mul"} == {"layers.0", "layers.1", "layers.2"}
    grads = {r["param"] for r in ref_rows if r["io"] == "grad"}
    assert {"layers.1.fc.weight", "head.bias"} <= grads
    row = matmul[-1]
    array = d.tensor(0, 0, row["data"], row["key"])  # a .npy of dump_tensor_data
    assert array.dtype == np.float32 and list(array.shape) == row["shape"]
    assert array.max() == pytest.approx(row["max"]) and np.linalg.norm(array) == pytest.approx(row["norm"], rel=1e-5)


@pytest.mark.parametrize(("written", "ours"), [("Float32", "float32"), ("BFloat16", "bfloat16"), ("Float16", "float16"),
                                               ("Int64", "int64"), ("UInt8", "uint8"), ("Bool", "bool"),
                                               ("torch.float32", "float32")])
def test_dtype_spellings(written: str, ours: str) -> None:
    assert dtype_name(written) == ours


def test_api_names() -> None:
    assert mindspore_name("Primitive", "matmul.MatMul") == "mindspore.MatMul"
    assert mindspore_name("Tensor", "__mul__") == "mindspore.Tensor.mul"
    assert mindspore_name("Functional", "gelu") == "mindspore.ops.gelu"
    assert mindspore_name("Mint", "add") == "mindspore.mint.add"
    assert mindspore_name("Jit", "Net") == "mindspore.Jit.Net"


def test_same_run_twice_is_identical() -> None:
    result = opscope.compare(DATA / "rerun", DATA / "ref", workers=1)
    assert result.verdict == "identical" and result.counts["identical"] == result.counts["pairs"] > 300


@pytest.mark.parametrize(("target", "reference"), [("fault", "ref"), ("stat_fault", "stat_ref")])
def test_fault_named_at_layer_1_forward(target: str, reference: str) -> None:
    """Layer 1 scales its Dense output by 1.01 (an inserted Tensor.__mul__): named there, in
    the forward pass of each step, not at a backward op and not in another layer. (From
    statistics alone, step 1's backward adds findings: its weights already differ, and
    msprobe lists a backward call's gradients only, docs/peer-dumps.md.)"""
    result = opscope.compare(DATA / target, DATA / reference, workers=1)
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.step, first.phase, first.module, first.op) == (0, "forward", "layers.1", "mindspore.Tensor.mul")
    assert [(f.step, f.phase, f.module, f.op) for f in result.culprits if f.step == 0 or f.phase == "forward"] == [
        (0, "forward", "layers.1", "mindspore.Tensor.mul"), (1, "forward", "layers.1", "mindspore.Tensor.mul")]
    if target == "fault":  # full tensors: nothing else
        assert len(result.culprits) == 2


def test_pickled_npy_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    dump = tmp_path / "ref"
    shutil.copytree(DATA / "ref", dump)
    folder = next((dump / "step0").iterdir())
    row = next(r for r in opscope.load(dump).records(step=0).to_pylist() if r["op"] == "mindspore.ops.gelu")
    marker = tmp_path / "ran"
    np.save(folder / "dump_tensor_data" / row["data"], np.array([_Payload(marker)], dtype=object),
            allow_pickle=True)
    with pytest.raises(DumpFormatError, match=f"refusing .*{row['data']}.*never unpickles"):
        opscope.load(dump).tensor(0, 0, row["data"], row["key"])
    with pytest.raises(DumpFormatError, match="refusing tensor file name"):
        load_tensor(folder, "../../ref/step0/x.npy")  # names from dump.json stay in dump_tensor_data
    result = opscope.compare(dump, DATA / "ref", workers=1)  # that pair falls back to statistics
    assert result.verdict == "within_tolerance" and result.counts["passed"] == 1 and result.statistics_only
    assert any(row["data"] in p and "never unpickles" in p for p in result.problems)
    assert not marker.exists()


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_replay_says_why_not(ref_rows: list[dict]) -> None:
    d = opscope.load(DATA / "ref")
    call = [r for r in ref_rows if r["op"] == "mindspore.MatMul" and r["phase"] == "forward"][:3]
    with pytest.raises(ReplayError, match="not replayable: mindspore.MatMul .*msprobe.*transpose"):
        load_call(d, call, "target")


def test_show_and_convert(run_cli, tmp_path: Path) -> None:
    show = run_cli("show", DATA / "fault")
    assert show.returncode == 0 and "msprobe" in show.stdout, show.stderr
    out = tmp_path / "converted"
    run = run_cli("convert", DATA / "fault", "--to", "opscope", "-o", out)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "manifest.json").read_text())["framework"] == {"mindspore": "(not recorded)"}
    again = opscope.compare(out, DATA / "fault", workers=1)
    assert again.verdict == "identical" and again.counts["identical"] == again.counts["pairs"] > 300
