"""Replay beyond aten ops: MindSpore kernels from real MindSpore dumps (committed under
tests/data/mindspore/), opscope's own ``level="api"`` dumps, and the allow-list that keeps
names read from a dump away from anything but pure math functions."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import runs
import torch

import opscope
from opscope.errors import ReplayError
from opscope.replay import api_names
from opscope.replay.engine import CallRef, RowCache, replay_call, replay_side

MINDSPORE = Path(__file__).resolve().parents[2] / "data" / "mindspore"


def _sides(path: Path) -> dict[str, list[str]]:
    """Every call of step 0 replayed on its own: op type -> [status or refusal]."""
    from opscope.compare.tolerance import NoiseModel

    dump, cache, out = opscope.load(path), RowCache(), collections.defaultdict(list)
    for seq in sorted({r["seq"] for r in dump.records(rank=0, step=0, columns=["seq"]).to_pylist()}):
        rows = cache.call_rows(dump, 0, 0, seq)
        op = rows[0]["op"].removeprefix("mindspore.")
        try:
            out[op].append(replay_side(dump, rows, "target", NoiseModel()).status)
        except ReplayError as exc:
            out[op].append(str(exc))
    return out


def test_mindspore_table_reproduces_mindspores_own_kernels() -> None:
    """Each op type of the table, fed the dumped inputs (attribute inputs included), lands
    within 16 eps of MindSpore's own output: the table means what the kernels compute."""
    found = _sides(MINDSPORE / "ops")
    for op, results in _sides(MINDSPORE / "reference").items():
        found[op] += results
    checked = {op for op, results in found.items() if "ok" in results}
    assert {"MatMul", "BatchMatMul", "Add", "Sub", "Mul", "Div", "ReLU", "GeLU", "Sigmoid", "Softmax",
            "LogSoftmax", "LayerNorm", "BiasAdd", "ReduceMean", "ReduceSum", "ReduceMax", "Cast", "Transpose",
            "Exp", "Sqrt", "Square", "Pow", "Maximum", "AddN", "SparseSoftmaxCrossEntropyWithLogits",
            "BiasAddGrad", "GeLUGrad"} <= checked
    for op, results in found.items():
        for status in results:
            if op == "Tanh":  # MindSpore's CPU tanh is a fast approximation: 26 eps off float64
                assert status == "wrong"
            elif status not in ("ok",):
                assert "not replayable" in status or "no full" in status or "gradient form" in status, (op, status)
    assert found["SGD"] and all("updates its inputs in place" in s for s in found["SGD"])
    assert found["LayerNormGrad"] and all("epsilon" in s for s in found["LayerNormGrad"])  # an IR-only attribute


def test_mindspore_tanh_is_further_from_float64_than_torchs() -> None:
    dump = opscope.load(MINDSPORE / "ops")
    rows = next(RowCache().call_rows(dump, 0, 0, r["seq"]) for r in dump.records().to_pylist()
                if r["op"] == "mindspore.Tanh")
    from opscope.compare.tolerance import NoiseModel

    side = replay_side(dump, rows, "target", NoiseModel())
    assert side.units > 16 and side.native_units is not None and side.native_units < 1


@pytest.fixture(scope="module")
def ms_fault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference dump with one kernel's result off by 0.1%: b1.fc2's MatMul output file."""
    target = tmp_path_factory.mktemp("ms") / "fault"
    shutil.copytree(MINDSPORE / "reference", target)
    (out,) = target.glob("rank_0/Net/0/0/MatMul.*_b1-Block_fc2-Dense_MatMul-op0.*.output.0.*.npy")
    out.chmod(0o644)
    values = np.load(out, allow_pickle=False)
    np.save(out, (values * np.float32(1.001)).astype(values.dtype))
    return target


def test_mindspore_faulty_kernel_is_wrong_on_its_side_only(ms_fault: Path) -> None:
    result = opscope.compare(ms_fault, MINDSPORE / "reference", workers=1, steps=[0], replay=2)
    first = result.first_divergence
    assert (first.module, first.op) == ("b1.fc2", "mindspore.MatMul")
    assert first.replay["verdict"] == "target_wrong", first.replay["reason"]
    assert first.replay["reference"]["status"] == "ok" and first.replay["target"]["units"] > 1000
    seqs = {side: first.calls[other]["seq"] for side, other in (("target", "reference"), ("reference", "target"))}
    swapped = replay_call(opscope.load(MINDSPORE / "reference"), opscope.load(ms_fault),
                          CallRef(id=first.id, rank=0, step=0, seqs=seqs))  # the fault on the reference side
    assert swapped.verdict == "reference_wrong" and swapped.target is not None and swapped.target.status == "ok"


@pytest.fixture(scope="module")
def api_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """opscope level="api" dumps of the bundled transformer: bfloat16 with a wrong aten::gelu
    CPU kernel (F.gelu is wrong inside), and float32."""
    root = tmp_path_factory.mktemp("api")
    return (runs.train(root / "bf16-wrong-gelu", autocast=True, wrong_gelu=True, level="api"),
            runs.train(root / "fp32", level="api"))


@pytest.fixture(scope="module")
def api_result(api_dumps: tuple[Path, Path]) -> Any:
    return opscope.compare(*api_dumps, workers=1, replay=1)


def test_api_level_culprit_is_replayed(api_result: Any) -> None:
    first = api_result.first_divergence
    assert (first.module, first.op) == ("layers.0.act", "torch.nn.functional.gelu")
    assert first.replay["verdict"] == "target_wrong", first.replay["reason"]
    assert first.replay["target"]["dtype"] == "bfloat16" and first.replay["reference"]["status"] == "ok"


def test_api_level_calls_replay_or_say_why(api_dumps: tuple[Path, Path], api_result: Any) -> None:
    """Every paired forward call (arguments, keywords, lists, slices, dtypes rebuilt) is right on
    both sides but the faulty GELU; backward, in-place and unlisted calls are named."""
    t_dump, r_dump = map(opscope.load, api_dumps)
    verdicts: dict[str, set[str]] = collections.defaultdict(set)
    cache = RowCache()
    seen = set()
    for row in api_result.pairs_table.to_pylist():
        if row["io"] != "output" or row["kind"] not in ("exact", "aligned") or row["seq_target"] in seen:
            continue
        seen.add(row["seq_target"])
        ref = CallRef(id="", rank=0, step=0, seqs={"target": row["seq_target"], "reference": row["seq_reference"]})
        out = replay_call(t_dump, r_dump, ref, cache=cache)
        verdicts[f"{row['phase']} {row['op']}"].add(out.verdict if out.verdict != "not_replayable" else out.reason)
    assert verdicts["forward torch.nn.functional.gelu"] == {"target_wrong"}
    for name in ("linear", "layer_norm", "embedding", "cross_entropy"):
        assert verdicts[f"forward torch.nn.functional.{name}"] == {"both_within"}, verdicts
    assert verdicts["forward Tensor.__getitem__"] == {"both_within"}
    assert all("backward" in v for k, vs in verdicts.items() if k.startswith("backward") for v in vs)
    assert all("in place" in v for v in verdicts["optimizer Tensor.add_"])


def test_different_ops_or_arguments_on_the_two_sides_are_named() -> None:
    """A paired call that ran another op on each side (MindSpore's GeLU swapped for a ReLU), or
    the same op with another argument: each is right for its inputs, and the reason names what
    differs, not the inputs."""
    from opscope.replay.engine import judge
    from opscope.replay.result import SideReplay

    sides = {side: SideReplay(side=side, seq=1, op=op, module="b1.act", dtype="float32", error=0.0, units=0.3,
                              allowed_units=16.0, status="ok")
             for side, op in (("target", "mindspore.ReLU"), ("reference", "mindspore.GeLU"))}
    ref = CallRef(id="0:0:1", rank=0, step=0, seqs={"target": 1, "reference": 1})
    verdict, reason = judge(sides, {}, ref)
    assert verdict == "both_within" and "ran different ops (mindspore.ReLU on the target" in reason
    for side in sides.values():  # msprobe's GELU fault: the same op, another approximate= argument
        side.op = "torch.nn.functional.gelu"
    sides["target"].args, sides["reference"].args = {"approximate": "'tanh'"}, {"approximate": "'none'"}
    verdict, reason = judge(sides, {}, ref)
    assert "passed different arguments (approximate: 'tanh' on the target, 'none' on the reference)" in reason


MALICIOUS = ["torch.load", "torch.save", "torch.nn.functional.__import__", "Tensor.__reduce_ex__",
             "Tensor.__class__", "torch.nn.functional.linear.__globals__", "torch.ops.aten.mm", "os.system",
             "builtins.eval", "torch.__builtins__", "Tensor.register_hook", "torch.set_default_dtype",
             "torch.manual_seed", "torch.from_file", "Tensor.__setitem__", "torch.nn.functional.dropout"]


def test_names_off_the_allow_list_are_never_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            looked_up.append(name)
            return getattr(torch, name)

    for prefix, (allowed, _) in list(api_names.NAMESPACES.items()):
        monkeypatch.setitem(api_names.NAMESPACES, prefix, (allowed, Spy))
    for name in MALICIOUS:
        with pytest.raises(ReplayError, match="not replayable"):
            api_names.resolve_api(name)
    assert looked_up == []
    assert api_names.resolve_api("torch.matmul") is torch.matmul and looked_up == ["matmul"]


@pytest.mark.parametrize("name", ["__dict__.get.__call__", "aten.mm.__call__", "aten.mm.overloads",
                                  "builtins.eval.default"])
def test_aten_names_resolve_to_dispatcher_operators_only(name: str) -> None:
    from opscope.replay.calls import resolve_op

    with pytest.raises(ReplayError):
        resolve_op(name)
    assert resolve_op("aten._to_copy.default") is torch.ops.aten._to_copy.default
