"""The MindSpore Data Dump reader on the committed real dumps (tests/data/mindspore), and on
copies of them with faults injected: a truncated .npy, a pickled object array, a missing
execution order, a file name pointing outside the dump."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import opscope
from opscope.errors import DumpFormatError
from opscope.storage.format import STD_METHOD
from opscope.storage.peers import mindspore as ms_reader
from opscope.storage.peers.mindspore_files import load_array, parse_name, read_statistics
from opscope.storage.peers.mindspore_places import module_of, phase_of

DATA = Path(__file__).resolve().parents[2] / "data" / "mindspore"
ITERATION = Path("rank_0/Net/0/0")


def _rows(path: Path, step: int = 0) -> list[dict]:
    return opscope.load(path).records(step=step).to_pylist()


def _copy(tmp_path: Path, case: str = "fault") -> Path:
    shutil.copytree(DATA / case, tmp_path / case)
    return tmp_path / case


def test_layout_steps_manifest() -> None:
    d = opscope.load(DATA / "reference")
    assert type(d).__name__ == "PeerDump"
    assert d.partitions() == [(0, 0), (0, 1)]
    assert d.manifest["level"] == "mindspore" and d.manifest["framework"] == {"mindspore": "2.10.0"}
    assert d.manifest["device"] == "CPU" and d.manifest["config"]["data"] == "tensor"
    assert d.manifest["std"] == STD_METHOD  # opscope measured the .npy tensors: their std is exact


@pytest.mark.parametrize("below", ["", "rank_0", "rank_0/Net", "rank_0/Net/0", "rank_0/Net/0/1"])
def test_any_folder_of_the_dump_opens(below: str) -> None:
    d = opscope.load(DATA / "reference" / below)
    assert d.partitions() == ([(0, 1)] if below.endswith("/1") else [(0, 0), (0, 1)])


def test_not_a_mindspore_dump(tmp_path: Path) -> None:
    (tmp_path / "rank_0").mkdir()  # a rank_N folder with nothing MindSpore writes
    assert not ms_reader.detect(tmp_path) and not ms_reader.detect(tmp_path / "rank_0")
    with pytest.raises(DumpFormatError, match="msprobe or MindSpore"):
        opscope.load(tmp_path)


def test_records_scopes_phases_data_flow() -> None:
    rows = _rows(DATA / "reference")
    by_id = {r["id"]: r for r in rows}
    fc1 = [r for r in rows if r["module"] == "b0.fc1" and r["op"] == "mindspore.MatMul" and r["phase"] == "forward"]
    assert [(r["io"], r["slot"], r["dtype"], r["param"]) for r in fc1] == [
        ("input", 0, "float32", None), ("param", 1, "float32", "b0.fc1.weight"),
        ("input", 2, "bool", None), ("input", 3, "bool", None), ("output", 0, "float32", None)]
    producer = by_id[fc1[0]["producer"]]  # read through the IR's TupleGetItem to output 0 of the norm
    assert (producer["op"], producer["module"], producer["io"], producer["slot"]) == (
        "mindspore.LayerNorm", "b0.norm1", "output", 0)
    assert fc1[3]["min"] == 1.0  # the transpose_b flag, a constant input like any other
    eps = [r for r in rows if r["module"] == "b1.norm2" and r["op"] == "mindspore.LayerNorm" and r["slot"] == 5
           and r["io"] == "input"]
    assert len(eps) == 1 and eps[0]["max"] == pytest.approx(1e-7)
    assert {r["phase"] for r in rows} == {"forward", "backward", "optimizer"}
    grads = [r for r in rows if r["phase"] == "backward" and r["op"] == "mindspore.LayerNormGrad"]
    assert grads and all(r["fwd_op"] == "mindspore.LayerNorm" for r in grads)
    updated = [r for r in rows if r["phase"] == "optimizer" and r["param"] == "b0.fc1.weight" and r["io"] == "output"]
    assert len(updated) == 1 and updated[0]["slot"] == 100  # SGD's input 0, dumped after the update
    sgd = [r for r in rows if r["op"] == "mindspore.SGD"]  # its own outputs are placeholders: left out
    assert sgd and not [r for r in sgd if r["io"] == "output" and r["slot"] < 100]
    # what the update read: the weight as the step began, i.e. what the forward's MatMul read
    start = next(r for r in sgd if r["io"] == "param" and r["param"] == "b0.fc1.weight")
    assert start["slot"] == 0 and (start["hash"], start["key"]) == (fc1[1]["hash"], fc1[1]["key"])
    assert start["hash"] != updated[0]["hash"]
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs)


def test_statistics_and_tensors_match_the_files() -> None:
    d = opscope.load(DATA / "reference")
    row = next(r for r in d.records(step=1).to_pylist() if r["module"] == "b0.fc1" and r["io"] == "output"
               and r["op"] == "mindspore.MatMul")
    files = [f for f in (DATA / "reference" / "rank_0/Net/0/1").iterdir()
             if f.name.startswith("MatMul.Default_network-WithLossCell__backbone-Net_b0-Block_fc1-Dense_MatMul-op0.")
             and ".output.0." in f.name]
    assert len(files) == 1 and row["key"] == files[0].name
    expected = np.load(files[0], allow_pickle=False)
    np.testing.assert_array_equal(d.row_tensor(row), expected)
    assert row["norm"] == pytest.approx(float(np.linalg.norm(expected.astype(np.float64))))
    assert row["shape"] == list(expected.shape) and row["numel"] == expected.size


def test_expanded_op_placed_by_its_producer() -> None:
    rows = _rows(DATA / "inserted")
    mul = [r for r in rows if r["node"] == "Expand/_Muls/Mul-op2" and r["io"] == "output"]
    assert len(mul) == 1 and (mul[0]["phase"], mul[0]["module"]) == ("forward", "b1.fc2")
    softmax_grad = [r for r in rows if str(r["node"]).startswith("Expand/_SoftmaxBackward/")]
    assert softmax_grad and {r["phase"] for r in softmax_grad} == {"backward"}


def test_renumbered_ops_are_matched_through_their_offset() -> None:
    d = opscope.load(DATA / "reference")
    rows = d.records(step=0).to_pylist()
    addn = [r for r in rows if r["op"] == "mindspore.AddN" and r["io"] == "output"]  # files AddN-op0, order -op1
    assert len(addn) == 3 and all(r["node"].endswith("AddN-op1") and r["key"].split(".")[1].endswith("AddN-op0")
                                  for r in addn)
    assert not any("numbered" in p for p in d.problems)
    fp16 = opscope.load(DATA / "fp16")
    fp16.records(step=0)  # its casts are numbered otherwise, in no one offset: not matched, and said
    assert any("numbered" in p and "differently" in p for p in fp16.problems)


def test_float16_files_the_ir_contradicts_are_not_read() -> None:
    d = opscope.load(DATA / "fp16")
    rows = d.records(step=0).to_pylist()
    gelu = [r for r in rows if r["op"] == "mindspore.GeLU" and r["io"] == "output" and r["phase"] == "forward"]
    assert gelu and all(r["norm"] is None and r["data"] is None and r["shape"] == [4, 16] for r in gelu)
    assert all("float32 on the device" in r["note"] for r in gelu)
    assert any("dtype other than their kernel's" in p for p in d.problems)


def test_statistic_csv() -> None:
    rows = read_statistics(DATA / "statistic_reference" / ITERATION / "statistic.csv")
    first = rows[0]
    assert (first.op_type, first.io, first.slot, first.dtype, first.shape) == ("Add", "input", 0, "float32", [4, 8])
    assert set(first.stats) == {"max", "min", "norm", "absmax"}
    d = opscope.load(DATA / "statistic_reference")
    assert d.manifest["config"]["data"] == "statistics" and d.manifest["std"] is None  # MindSpore's numbers
    recs = d.records(step=0).to_pylist()
    # without the IR, nothing says which inputs are weights: they read as plain inputs
    tensor_recs = {(r["node"], "input" if r["io"] == "param" else r["io"], r["slot"]): r
                   for r in _rows(DATA / "reference")}
    assert not [r for r in recs if r["io"] == "param" or r["producer"] is not None]
    for r in recs[:40]:
        t = tensor_recs[(r["node"], r["io"], r["slot"])]
        assert r["data"] is None and r["max"] == pytest.approx(t["max"], rel=1e-6)
        assert r["norm"] == pytest.approx(t["norm"], rel=1e-6, abs=1e-12)
    assert any("ms_output_trace_code_graph_0.ir is missing" in p for p in d.problems)


def test_statistic_csv_without_its_columns(tmp_path: Path) -> None:
    bad = tmp_path / "statistic.csv"
    bad.write_text("Op Type,Op Name,Task ID\nAdd,Default_Add-op0,0\n")
    with pytest.raises(DumpFormatError, match="no column IO, Slot, Data Type, Shape"):
        read_statistics(bad)


def test_truncated_npy_is_named(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".output.0." in f.name)
    victim.write_bytes(victim.read_bytes()[:-40])
    d = opscope.load(dump)
    row = next(r for r in d.records(step=0).to_pylist() if r["key"] is None and r["module"] == "b0.fc1"
               and r["io"] == "output" and r["op"] == "mindspore.MatMul")
    assert row["note"] == "unreadable tensor file" and row["norm"] is None
    assert any(victim.name in p and "truncated" in p for p in d.problems)


class _Marker:
    """Unpickling this creates a file: proof that something unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))


def test_object_array_is_refused_without_unpickling(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    marker = tmp_path / "unpickled"
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".input.0." in f.name)
    arr = np.empty(1, dtype=object)
    arr[0] = _Marker(marker)
    with open(victim, "wb") as f:
        np.save(f, arr, allow_pickle=True)
    assert pickle.dumps(arr)  # the payload is a real pickle
    with pytest.raises(DumpFormatError, match="Python objects"):
        load_array(victim)
    d = opscope.load(dump)
    d.records(step=0)
    assert not marker.exists()
    assert any("holds Python objects" in p and "refused" in p for p in d.problems)


def test_missing_execution_order(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    shutil.rmtree(dump / "rank_0" / "execution_order")
    with pytest.raises(DumpFormatError, match="ms_execution_order_graph_0.csv is missing.*copy the whole rank_N"):
        opscope.load(dump)


def test_file_names_never_become_paths() -> None:
    d = opscope.load(DATA / "fault")
    with pytest.raises(DumpFormatError, match="not a file of"):
        d.tensor(0, 0, "0", "../../../execution_order/ms_execution_order_graph_0.csv")
    with pytest.raises(DumpFormatError, match="no iteration folder"):
        d.tensor(0, 0, "../0", "x.npy")


def test_scope_names() -> None:
    full = "Default/network-WithLossCell/_backbone-Net/b0-Block/fc1-Dense/MatMul-op0"
    assert (phase_of(full), module_of(full)) == ("forward", "b0.fc1")
    grad = "Gradients/Default/network-WithLossCell/_backbone-Net/head-Dense/Grad_MatMul/MatMul-op5"
    assert (phase_of(grad), module_of(grad)) == ("backward", "head")
    assert (phase_of("Default/optimizer-SGD/SGD-op0"), module_of("Default/optimizer-SGD/SGD-op0")) == (
        "optimizer", "optimizer")
    loss = "Default/network-WithLossCell/_loss_fn-SoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits-op0"
    assert module_of(loss) == "_loss_fn"


def test_file_names() -> None:
    name = ("MatMul.Default_network-WithLossCell__backbone-Net_b0-Block_fc1-Dense_MatMul-op0.0.0."
            "1796168337463883.input.3.DefaultFormat.Bool.npy")
    f = parse_name(name)
    assert f is not None and (f.op_type, f.io, f.slot, f.dtype, f.timestamp) == (
        "MatMul", "input", 3, "bool", 1796168337463883)
    assert f.op_name == "Default_network-WithLossCell__backbone-Net_b0-Block_fc1-Dense_MatMul-op0"
    assert parse_name("statistic.csv") is None and parse_name("a.b.c.d.e.f.g.h.i.npy") is None


def test_ranks_are_rank_folders(tmp_path: Path) -> None:
    for name, (case, rank) in {"ref": ("reference", "rank_0"), "bad": ("fault", "rank_0")}.items():
        for r in (0, 1):  # rank 1 of "bad" is the fault, rank 0 its reference
            source = DATA / (case if (name, r) == ("bad", 1) else "reference") / rank
            shutil.copytree(source, tmp_path / name / f"rank_{r}")
    d = opscope.load(tmp_path / "bad")
    assert d.ranks == [0, 1] and d.partitions() == [(0, 0), (0, 1), (1, 0)]
    assert opscope.load(tmp_path / "bad" / "rank_1").partitions() == [(1, 0)]
    result = opscope.compare(tmp_path / "bad", tmp_path / "ref", workers=1)
    assert sorted(result.first_divergence_by_rank) == [1]
    assert (result.first_divergence.rank, result.first_divergence.module) == (1, "b1.norm2")


def test_device_format_is_not_compared(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".output.0." in f.name)
    victim.rename(victim.with_name(victim.name.replace(".DefaultFormat.", ".NC1HWC0.")))
    row = next(r for r in _rows(dump) if r["module"] == "b0.fc1" and r["io"] == "output"
               and r["op"] == "mindspore.MatMul")
    assert row["norm"] is None and row["data"] is None and "trans_flag" in row["note"]


def _with_md5(source: Path, out: Path, change: str | None = None) -> Path:
    """A copy of a statistic dump whose statistic.csv also has an MD5 column (the digest of
    each row's own text, so equal rows have equal digests); ``change``: an op whose rows get
    another digest."""
    import hashlib

    shutil.copytree(source, out)
    path = out / ITERATION / "statistic.csv"
    lines = path.read_text().splitlines()
    rows = [lines[0] + ",MD5"]
    for line in lines[1:]:
        digest = hashlib.md5(line.split(",", 5)[5].encode() + (b"x" if change and change in line else b""))
        rows.append(f"{line}{digest.hexdigest()},")
    path.write_text("\n".join(rows) + "\n")
    return out


def test_statistic_digests_prove_identity(tmp_path: Path) -> None:
    a = _with_md5(DATA / "statistic_reference", tmp_path / "a")
    b = _with_md5(DATA / "statistic_reference", tmp_path / "b", change="b1-Block_fc1-Dense_BiasAdd-op0")
    assert opscope.load(a).manifest["hash_algorithm"] == "mindspore-md5-64"
    same = opscope.compare(a, _with_md5(DATA / "statistic_reference", tmp_path / "c"), workers=1)
    assert same.verdict == "identical" and same.counts["identical"] == same.counts["pairs"]
    # equal statistics, other digests: not identical; a float tensor shows no difference the
    # statistics could, an integer one must match exactly (BiasAdd's int64 input 2): a root
    other = opscope.compare(b, a, workers=1)
    assert other.counts["identical"] < other.counts["pairs"]
    assert [(f.kind, f.op, f.io, f.slot, f.dtype) for f in other.culprits] == [
        ("root", "mindspore.BiasAdd", "input", 2, "int64")]
    assert opscope.load(DATA / "statistic_reference").manifest["hash_algorithm"] is None


def test_file_of_another_shape_is_not_its_op(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".output.0." in f.name)
    np.save(victim.with_suffix(""), np.zeros((3, 5), np.float32), allow_pickle=False)  # np.save adds .npy
    d = opscope.load(dump)
    row = next(r for r in d.records(step=0).to_pylist() if r["module"] == "b0.fc1" and r["io"] == "output"
               and r["op"] == "mindspore.MatMul")
    assert row["shape"] == [3, 5] and row["norm"] is None and "is not the [4, 16] the IR gives" in row["note"]
    assert any("do not have the shape the IR gives" in p for p in d.problems)


def test_against_a_dump_of_another_framework_says_why_nothing_pairs() -> None:
    from opscope.compare.crossframework.levels import level_mismatch

    ms = opscope.load(DATA / "reference")

    class Torch:
        manifest = {"level": "api"}

    assert level_mismatch(ms, ms) == [] and level_mismatch(Torch(), Torch()) == []
    (why,) = level_mismatch(ms, Torch())
    assert "level 'mindspore'" in why and "level 'api'" in why


def test_two_graphs_numbered_on_from_each_other(tmp_path: Path) -> None:
    """A second graph (an evaluation call beside the training step) writes its ops one number
    on from its execution order (BiasAdd-op1 for BiasAdd-op0): matched through that offset."""
    from opscope.storage.peers.mindspore_rows import RowBuilder

    order = ("Default/net-Net/fc-Dense/MatMul-op0", "Default/net-Net/fc-Dense/BiasAdd-op0")
    folder = tmp_path / "it"
    folder.mkdir()
    names = []
    for k, (op, io) in enumerate((("MatMul", "output"), ("BiasAdd", "output"))):
        name = f"{op}.Default_net-Net_fc-Dense_{op}-op1.0.0.{100 + k}.{io}.0.DefaultFormat.Float32.npy"
        np.save(folder / name[:-4], np.full((2, 3), k, np.float32), allow_pickle=False)
        names.append(parse_name(name))
    files = {n.op_name: [n] for n in names if n is not None}
    builder = RowBuilder(0, 0)
    problems: list[str] = []
    assert builder.add_graph("0", folder, order, None, files, {}, problems) == []
    rows = builder.table().to_pylist()
    assert [(r["op"], r["node"], r["max"]) for r in rows] == [
        ("mindspore.MatMul", order[0], 0.0), ("mindspore.BiasAdd", order[1], 1.0)]


def test_a_link_out_of_the_dump_is_not_read(tmp_path: Path) -> None:
    dump = _copy(tmp_path)
    secret = tmp_path / "secret.npy"
    np.save(secret, np.arange(4, dtype=np.float32), allow_pickle=False)
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".output.0." in f.name)
    victim.unlink()
    victim.symlink_to(secret)
    d = opscope.load(dump)
    rows = [r for r in d.records(step=0).to_pylist() if r["module"] == "b0.fc1" and r["io"] == "output"
            and r["op"] == "mindspore.MatMul"]
    assert rows == []  # the op lost its output file: nothing is read through the link
    with pytest.raises(DumpFormatError, match="not a file of"):
        d.tensor(0, 0, "0", victim.name)


def test_outputs_only_dump_reads_inputs_from_their_producers(tmp_path: Path) -> None:
    """``"input_output": 2`` writes outputs only (made here by deleting the input files of
    real dumps): each input is its producer's output, so the fault still has one culprit."""
    dumps = {}
    for case in ("fault", "reference"):
        dumps[case] = _copy(tmp_path, case)
        for f in (dumps[case] / ITERATION).iterdir():
            if ".input." in f.name:
                f.unlink()
    rows = _rows(dumps["fault"])
    mul = [r for r in rows if r["module"] == "b0.fc1" and r["op"] == "mindspore.BiasAdd" and r["io"] == "input"]
    producer = next(r for r in rows if r["id"] == mul[0]["producer"])
    assert producer["op"] == "mindspore.MatMul" and mul[0]["hash"] == producer["hash"]
    assert mul[0]["note"] == "not in the dump: the output of its producer"
    result = opscope.compare(dumps["fault"], dumps["reference"], workers=1)
    assert len(result.culprits) == 1
    first = result.first_divergence
    assert (first.kind, first.module, first.op, first.io) == ("culprit", "b1.norm2", "mindspore.LayerNorm", "output")


def test_bfloat16_file_holding_float32_values(tmp_path: Path) -> None:
    """A file named BFloat16 may hold the bits (uint16) or float32 values: both read as values.
    (The IR is removed: it says this MatMul is float32 on the device, and the reader would
    rightly refuse a file named otherwise.)"""
    dump = _copy(tmp_path)
    shutil.rmtree(dump / "rank_0" / "graphs")
    victim = next(f for f in (dump / ITERATION).iterdir() if "b0-Block_fc1-Dense_MatMul-op0" in f.name
                  and ".output.0." in f.name)
    values = np.load(victim, allow_pickle=False)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # truncated to bfloat16
    for name, stored in (("bits", bits), ("values", values)):
        renamed = victim.with_name(victim.name.replace(".Float32.", ".BFloat16."))
        for f in (victim, renamed):
            f.unlink(missing_ok=True)
        np.save(renamed, stored, allow_pickle=False)
        d = opscope.load(dump)
        row = next(r for r in d.records(step=0).to_pylist() if r["module"] == "b0.fc1" and r["io"] == "output"
                   and r["op"] == "mindspore.MatMul")
        expected = (bits.astype(np.uint32) << 16).view(np.float32) if name == "bits" else values
        assert row["dtype"] == "bfloat16"
        np.testing.assert_array_equal(d.row_tensor(row), expected)
        assert row["max"] == pytest.approx(float(expected.max()))
