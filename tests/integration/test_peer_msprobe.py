"""msprobe dumps written by the real msprobe (mindstudio-probe, the ``peers`` test extra) on a
small model, read and judged by opscope: faults named at the right API and layer, benign
pairs clean, an inserted op that does not shift the pairing, tensors read without pickle."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("msprobe")
torch = pytest.importorskip("torch")

import opscope  # noqa: E402
from opscope.compare.result import CompareResult  # noqa: E402
from opscope.errors import DumpFormatError  # noqa: E402

RUNS = Path(__file__).with_name("msprobe_runs.py")
CASES = {
    "ref": ["--summary", "md5"], "same": ["--summary", "md5"], "act": ["--fault", "act"],
    "insert": ["--insert"], "bf16": ["--bf16"], "t_ref": ["--task", "tensor", "--level", "L1"],
    "t_act": ["--task", "tensor", "--level", "L1", "--fault", "act"], "ops": ["--tool", "opscope"],
    "l0_ref": ["--level", "L0"], "l0_act": ["--level", "L0", "--fault", "act"],
    "g_ref": ["--model", "gpt2"], "g_eps": ["--model", "gpt2", "--fault", "act"],
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every case dumped by its own process, forked after torch and msprobe are imported."""
    root = tmp_path_factory.mktemp("msprobe")
    cases = root / "cases.json"
    cases.write_text(json.dumps([[str(root / name), extra] for name, extra in CASES.items()]))
    run = subprocess.run([sys.executable, str(RUNS), "--many", str(cases)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return {name: root / name for name in CASES} | {"root": root}


def _findings(result: CompareResult) -> list[tuple[str, str, str]]:
    return [(f.phase, f.module, f.op) for f in result.culprits]


def test_records_follow_opscope_api_level(dumps: dict[str, Path]) -> None:
    d = opscope.load(dumps["ref"])
    assert d.manifest["level"] == "api" and d.manifest["tool"]["name"] == "msprobe"
    assert d.partitions() == [(0, 0), (0, 1)]  # proc<PID> read as rank 0, step<N> as step N
    rows = d.records(step=0).to_pylist()
    first = next(r for r in rows if r["op"] == "torch.nn.functional.linear" and r["module"] == "layers.1.fc")
    call = [r for r in rows if r["seq"] == first["seq"]]
    assert [(r["io"], r["slot"], r["param"]) for r in call] == [
        ("input", 0, None), ("param", 1, "layers.1.fc.weight"), ("param", 2, "layers.1.fc.bias"), ("output", 0, None)]
    producer = next(r for r in rows if r["id"] == call[0]["producer"])  # data flow rebuilt from statistics
    assert (producer["op"], producer["module"], producer["io"]) == ("torch.nn.functional.layer_norm", "layers.0.norm",
                                                                     "output")
    assert {r["phase"] for r in rows} == {"forward", "backward", "optimizer"}
    assert {r["op"] for r in rows if r["phase"] == "optimizer"} == {"Tensor.add_"}  # construct.json's "optimizer"
    assert any(r["op"] == "Tensor.mul" and r["module"] == "layers.2" for r in rows)  # Tensor.__mul__
    grads = [r for r in rows if r["io"] == "grad"]
    assert {r["param"] for r in grads} >= {"layers.0.fc.weight", "head.bias"}
    target = next(r for r in rows if r["op"] == "torch.nn.functional.cross_entropy" and r["slot"] == 1)
    assert target["dtype"] == "int64" and target["mean"] is None and 0 <= target["max"] <= 3  # Mean: null
    written = [r["op"].endswith("_") and r["slot"] == 0 and r["io"] != "output" for r in rows]
    hashed = [r["hash"] is not None for r, w in zip(rows, written) if not w]
    assert all(hashed) and len(hashed) > 100  # summary_mode md5 (not on what an in-place op writes: it races)
    assert d.manifest["hash_algorithm"] == "msprobe-crc32"
    step_folder = opscope.load(dumps["ref"] / "step1")
    rank_folder = opscope.load(next((dumps["ref"] / "step1").iterdir()))
    assert step_folder.partitions() == rank_folder.partitions() == [(0, 1)]
    assert step_folder.records().num_rows == d.records(step=1).num_rows


def test_activation_fault_named_at_its_api_and_layer(dumps: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "opscope", "compare", dumps["act"], dumps["ref"], "-o", out],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    summary = json.loads((out / "summary.json").read_text())
    first = summary["first_divergence"]
    assert (first["op"], first["module"], first["phase"], first["step"]) == (
        "torch.nn.functional.gelu", "layers.1", "forward", 0)
    assert first["kind"] == "culprit"
    assert {(c["module"], c["op"]) for c in summary["culprits"]} == {("layers.1", "torch.nn.functional.gelu")}
    assert "statistics only" in run.stdout  # Max/Min/Mean/Norm bound the error from below: said so,
    assert 'msprobe: "task": "tensor"' in summary["weaker"]  # and how msprobe keeps full tensors
    assert {p.name for p in out.iterdir()} >= {"summary.json", "pairs.csv", "pairs.parquet", "report.html"}


def test_tensor_dump_at_l1_names_the_call(dumps: dict[str, Path]) -> None:
    result = opscope.compare(dumps["t_act"], dumps["t_ref"], workers=1)
    first = result.first_divergence
    assert first is not None and (first.op, first.step, first.kind) == ("torch.nn.functional.gelu", 0, "culprit")
    assert first.module == "" and first.call == 1  # L1 has no modules: the second GELU call, layer 1's
    assert result.pairs_table.to_pandas()["mode"].eq("tensor").any()
    assert not result.statistics_only


def test_benign_pairs_are_clean(dumps: dict[str, Path]) -> None:
    same = opscope.compare(dumps["same"], dumps["ref"], workers=1)
    assert same.verdict != "diverged" and not same.culprits
    assert same.counts["identical"] >= 0.9 * same.counts["pairs"]  # equal md5 on both sides
    pairs = same.pairs_table.to_pandas()
    rest = pairs[pairs.status != "identical"]  # in-place ops' written inputs: msprobe's md5 races the write
    assert set(zip(rest.op, rest.slot, rest["mode"])) <= {("Tensor.add_", 0, "statistics")} and rest.error.eq(0).all()
    bf16 = opscope.compare(dumps["bf16"], dumps["ref"], workers=1)
    assert bf16.verdict == "within_tolerance", _findings(bf16)
    assert bf16.counts["pairs"] > 250 and bf16.counts["failed"] == 0


def test_inserted_op_does_not_shift_the_pairing(dumps: dict[str, Path]) -> None:
    def counters(path: Path) -> int:
        data = json.loads(next((path / "step0").glob("*/dump.json")).read_text())["data"]
        return sum(1 for name in data if name.startswith("Tensor.__mul__.") and name.endswith(".forward"))
    assert counters(dumps["insert"]) == counters(dumps["ref"]) + 1  # msprobe's counters shift after it
    result = opscope.compare(dumps["insert"], dumps["ref"], workers=1)
    assert result.verdict == "within_tolerance", _findings(result)
    pairs = result.pairs_table.to_pandas()
    unpaired = pairs[pairs.kind.isin(["unpaired", "identity"])]
    assert set(zip(unpaired.module, unpaired.op)) == {("layers.1", "Tensor.mul")}
    later = pairs[(pairs.module == "layers.2") & (pairs.op == "Tensor.mul") & (pairs.phase == "forward")]
    assert len(later) and later.kind.eq("exact").all()
    faulty = opscope.compare(dumps["act"], dumps["insert"], workers=1)  # the extra op in the reference
    assert (faulty.first_divergence.op, faulty.first_divergence.module) == ("torch.nn.functional.gelu", "layers.1")


def test_msprobe_against_opscope_api_dump(dumps: dict[str, Path]) -> None:
    clean = opscope.compare(dumps["ref"], dumps["ops"], workers=1)
    pairs = clean.pairs_table.to_pandas()
    paired = pairs[pairs.kind.isin(["exact", "aligned"])]
    assert len(paired[paired.phase == "forward"]) >= 60 and len(paired[paired.phase == "backward"]) >= 60
    assert not {(f.phase, f.module, f.op) for f in clean.culprits if f.phase != "optimizer"}
    fault = opscope.compare(dumps["act"], dumps["ops"], workers=1)
    first = fault.first_divergence
    assert (first.op, first.module, first.phase, first.step) == ("torch.nn.functional.gelu", "layers.1", "forward", 0)
    # L1 records no modules: both sides are paired by API name and call order alone
    flat = opscope.compare(dumps["t_act"], dumps["ops"], workers=1)
    pairs = flat.pairs_table.to_pandas()
    assert len(pairs[(pairs.phase != "optimizer") & pairs.kind.isin(["exact", "aligned"])]) >= 150
    first = flat.first_divergence
    assert (first.op, first.call, first.phase, first.step) == ("torch.nn.functional.gelu", 1, "forward", 0)
    assert not [f for f in flat.culprits if f.phase != "optimizer" and f.op != "torch.nn.functional.gelu"]


def test_gpt2_layer_norm_fault(dumps: dict[str, Path]) -> None:
    """transformers' GPT-2: its Conv1D reshapes before torch.addmm (a view msprobe does not
    record); the epsilon of one layer norm is the first divergence, not the reshaped input."""
    result = opscope.compare(dumps["g_eps"], dumps["g_ref"], workers=1)
    first = result.first_divergence
    assert (first.kind, first.op, first.module, first.phase, first.step) == (
        "culprit", "torch.nn.functional.layer_norm", "transformer.h.1.ln_2", "forward", 0)
    assert not [f for f in result.culprits if f.kind == "root"]


def test_module_level_l0(dumps: dict[str, Path]) -> None:
    d = opscope.load(dumps["l0_ref"])
    assert d.manifest["level"] == "module"
    rows = d.records(step=0).to_pylist()
    block = [r for r in rows if r["op"] == "Block" and r["module"] == "layers.1" and r["phase"] == "forward"]
    inner = [r for r in rows if r["module"] == "layers.1.fc" and r["phase"] == "forward"]
    assert min(r["seq"] for r in block) < min(r["seq"] for r in inner) < max(r["seq"] for r in block)
    result = opscope.compare(dumps["l0_act"], dumps["l0_ref"], workers=1)
    assert result.first_divergence.module == "layers.1" and result.first_divergence.op == "Block"


def test_convert_to_opscope_and_show(dumps: dict[str, Path], run_cli, tmp_path: Path) -> None:
    out = tmp_path / "converted"
    run = run_cli("convert", dumps["t_ref"], "--to", "opscope", "-o", out)
    assert run.returncode == 0, run.stderr
    assert (out / "manifest.json").is_file() and list(out.glob("rank0/step0/tensors-*.safetensors"))
    again = opscope.compare(out, dumps["t_ref"], workers=1)
    assert again.verdict == "identical" and again.counts["identical"] == again.counts["pairs"] > 250
    busy = run_cli("convert", dumps["t_ref"], "--to", "opscope", "-o", out)
    assert busy.returncode != 0 and "not empty" in busy.stderr
    show = run_cli("show", dumps["t_ref"])
    assert show.returncode == 0 and "written by msprobe" in show.stdout and "steps 0-1" in show.stdout


def test_rank_folders(dumps: dict[str, Path], tmp_path: Path) -> None:
    """torch.distributed runs write rank<R> folders: each is its rank, compared rank by rank."""
    for name, source in (("a", dumps["act"]), ("b", dumps["ref"])):
        for step in (0, 1):
            proc = next((source / f"step{step}").iterdir())
            for rank in (0, 3):
                shutil.copytree(proc, tmp_path / name / f"step{step}" / f"rank{rank}")
    d = opscope.load(tmp_path / "a")
    assert d.partitions() == [(0, 0), (0, 1), (3, 0), (3, 1)] and d.ranks == [0, 3]
    result = opscope.compare(tmp_path / "a", tmp_path / "b", workers=1)
    assert set(result.first_divergence_by_rank) == {0, 3}
    assert {(f.module, f.op) for f in result.first_divergence_by_rank.values()} == {
        ("layers.1", "torch.nn.functional.gelu")}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return next((dst / "step0").iterdir())


def test_poisoned_pt_runs_no_code(dumps: dict[str, Path], tmp_path: Path) -> None:
    rank = _copy(dumps["t_ref"], tmp_path / "poisoned")
    marker = tmp_path / "pwned"
    victim = rank / "dump_tensor_data" / "Functional.linear.1.forward.output.0.pt"
    code = ("import os, torch, sys\nclass Evil:\n    def __reduce__(self):\n"
            f"        return (os.system, ('touch {marker}',))\ntorch.save(Evil(), sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", code, str(victim)], check=True, timeout=120)
    d = opscope.load(tmp_path / "poisoned")
    row = next(r for r in d.records(step=0).to_pylist() if r["data"] == victim.name)
    with pytest.raises(DumpFormatError, match="not a plain tensor file"):
        d.row_tensor(row)
    result = opscope.compare(tmp_path / "poisoned", dumps["t_ref"], workers=1)
    assert any(victim.name in p for p in result.problems)
    assert not marker.exists()
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(victim)!r}, weights_only=False)"],
                   timeout=120, capture_output=True)
    assert marker.exists()  # the file was a real exploit: unpickling it runs code


def test_names_from_dump_json_never_become_paths(dumps: dict[str, Path], tmp_path: Path) -> None:
    rank = _copy(dumps["t_ref"], tmp_path / "escape")
    (tmp_path / "secret.pt").write_bytes(b"not for you")
    path = rank / "dump.json"
    dump = json.loads(path.read_text())
    dump["data"]["Functional.linear.0.forward"]["output"][0]["data_name"] = "../../../secret.pt"
    path.write_text(json.dumps(dump))
    d = opscope.load(tmp_path / "escape")
    rows = d.records(step=0).to_pylist()
    assert any("refused tensor file name '../../../secret.pt'" in p for p in d.problems)
    assert all(".." not in (r["data"] or "") for r in rows)
    with pytest.raises(DumpFormatError, match="refusing tensor file name"):
        d.tensor(0, 0, "../../../secret.pt", "tensor")


def test_truncated_dump_json_is_a_clear_error(dumps: dict[str, Path], tmp_path: Path, run_cli) -> None:
    rank = _copy(dumps["ref"], tmp_path / "cut")
    path = rank / "dump.json"
    path.write_bytes(path.read_bytes()[:5000])
    run = run_cli("compare", tmp_path / "cut", dumps["same"])
    assert run.returncode == 2
    assert "dump.json" in run.stderr and "not valid JSON" in run.stderr and "truncated" in run.stderr
    path.write_text(json.dumps({"task": "statistics", "level": "mix", "data": [1, 2]}))
    with pytest.raises(DumpFormatError, match='no "data" object'):
        opscope.load(tmp_path / "cut").records(step=0)
