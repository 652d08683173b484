"""The native full-tensor dump (data="tensor" through the C++ observer) against the Python
dispatch mode, on real models: the same tensors byte for byte, views placed in the same data,
in-place ops, tensor_limit_mb and the size said beforehand, a crash, a full disk, convert, and
the path of tensors the kernel does not read (another device), run here on the CPU."""

from __future__ import annotations

import csv
import json
import os
import time

import numpy as np
import pytest
import torch
from dump_helpers import bare, calls, small_mlp, small_transformer, train_with, transformer_task
from safetensors.numpy import load_file

import opscope
from opscope.capture.torch.native import aten as native_aten
from opscope.capture.torch.native import build as native
from opscope.capture.torch.suspects import TensorDumpSize
from opscope.config import dump_config
from opscope.demo.models import train_step
from opscope.errors import DumpWriteError
from opscope.storage import format as fmt


@pytest.fixture(scope="module")
def backend():
    module = native.load("_opscope_dump")
    assert module is not None, f"the native dump observer did not build: {native.error('_opscope_dump')}"
    return module


def _medium_transformer():
    return transformer_task(d=64, heads=2, layers=1, seq=32, batch=4)


def _owners_hold_every_key(dump) -> int:
    """Each row with data names, by its key, the row that measured the tensor (the end of its
    producer chain), whose shard holds exactly those bytes; no shard holds anything else.
    Returns the number of tensors stored."""
    stored = 0
    for rank, step in dump.partitions():
        rows = {r["id"]: r for r in dump.records(rank=rank, step=step).to_pylist()}
        owners = {}
        for r in rows.values():
            if not r["data"]:
                continue
            owner = r
            while owner["producer"] is not None:
                owner = rows[owner["producer"]]
            assert r["key"] == f"r{owner['id']}" and r["data"] == owner["data"], r
            owners[owner["key"]] = owner
        files = {}
        for name in {o["data"] for o in owners.values()}:
            files.update({(name, k): v for k, v in load_file(str(fmt.step_dir(dump.path, rank, step) / name)).items()})
        assert set(files) == {(o["data"], k) for k, o in owners.items()}
        for (name, key), arr in files.items():
            assert arr.tobytes() == dump.tensor(rank, step, name, key, raw=True).tobytes()
            assert list(arr.shape)[: len(owners[key]["shape"])] == owners[key]["shape"]
        stored += len(files)
    return stored


def test_dumping_full_tensors_natively_never_changes_the_losses(tmp_path, monkeypatch):
    losses, dump = train_with("native", monkeypatch, tmp_path / "d", 3, small_transformer, data="tensor")
    assert losses == bare(3, small_transformer)  # bit for bit
    df = dump.records().to_pandas()
    assert df.data.notna().mean() > 0.95 and (df.view.notna() == (df.note == "view")).mean() > 0.8


@pytest.mark.parametrize("task", [small_mlp, small_transformer], ids=["mlp", "transformer"])
def test_native_and_python_tensor_dumps_hold_the_same_bytes(tmp_path, monkeypatch, task):
    _, nat = train_with("native", monkeypatch, tmp_path / "n", 2, task, data="tensor")
    _, py = train_with("python", monkeypatch, tmp_path / "p", 2, task, data="tensor")
    a, b = calls(nat), calls(py)
    common = set(a) & set(b)
    assert len(common) >= 0.95 * len(b), (len(common), len(b))
    views = transposed = 0
    for k in common:
        ra, rb = a[k], b[k]
        assert (ra["data"] is None) == (rb["data"] is None), k
        if ra["data"] is None:
            continue
        xa, xb = nat.row_tensor(ra, raw=True), py.row_tensor(rb, raw=True)
        assert (xa.dtype, xa.shape) == (xb.dtype, xb.shape) and xa.tobytes() == xb.tobytes(), k
        if ra["view"] is not None:  # a view rebuilt from its input's data: the same values
            views += 1
            transposed += json.loads(ra["view"])["stride"] != list(np.asarray(xa).strides)
    assert views > 40 and transposed > 0
    assert _owners_hold_every_key(nat) > 100 and _owners_hold_every_key(py) > 100


def test_tensor_ops_keep_the_tensors_of_the_named_ops_only(tmp_path, monkeypatch):
    keys = {"tensor_ops": ["aten.gelu*", "aten.addmm*"]}
    _, nat = train_with("native", monkeypatch, tmp_path / "n", 2, small_transformer, **keys)
    _, py = train_with("python", monkeypatch, tmp_path / "p", 2, small_transformer, **keys)
    a, b = calls(nat), calls(py)
    kept = {k for k, r in a.items() if r["data"]}
    stored = {k[3] for k in kept if a[k]["producer"] is None}  # rows of other ops link to these
    assert stored == {"gelu", "gelu_backward", "addmm"}  # the ops named (globs), nothing else
    assert kept == {k for k, r in b.items() if r["data"]}
    for k in kept:
        xa, xb = nat.row_tensor(a[k], raw=True), py.row_tensor(b[k], raw=True)
        assert (xa.shape, xa.tobytes()) == (xb.shape, xb.tobytes()), k
    assert all(a[k]["view"] is None for k in kept)  # as the Python path: views stored as themselves
    assert all(a[k]["hash"] == b[k]["hash"] for k in set(a) & set(b))  # statistics for every call


def test_an_input_is_stored_as_it_was_before_an_in_place_op(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    x = torch.arange(6.0).reshape(2, 3)
    with opscope.dump(tmp_path / "d", data="tensor") as d:
        y = x * 2
        y.add_(100)  # mul's output, already stored, keeps its values
        x.neg_()  # x, first seen as mul's input, too
        y.t()  # a view kept as its input's data (add_'s output)
        y.mul_(2)  # ...which this write does not reach
        d.step()
    dump = opscope.load(tmp_path / "d")
    assert dump.manifest["stats_backend"] == "native"
    rows = {(r["op"], r["io"], r["slot"]): r for r in dump.records().to_pylist()}
    base = np.arange(6.0, dtype=np.float32).reshape(2, 3)

    def value(op: str, io: str, slot: int = 0) -> np.ndarray:
        return dump.row_tensor(rows[(f"aten.{op}", io, slot)])

    assert (value("mul.Tensor", "input") == base).all() and (value("mul.Tensor", "output") == base * 2).all()
    assert (value("add_.Tensor", "input") == base * 2).all()
    assert (value("add_.Tensor", "output") == base * 2 + 100).all()
    assert (value("neg_.default", "input") == base).all() and (value("neg_.default", "output") == -base).all()
    assert rows[("aten.t.default", "output", 0)]["view"] is not None
    assert (value("t.default", "output") == (base * 2 + 100).T).all()
    assert (value("mul_.Tensor", "input") == base * 2 + 100).all()
    assert (value("mul_.Tensor", "output") == (base * 2 + 100) * 2).all()


def test_tensor_limit_stops_where_and_as_the_python_path_says(tmp_path, monkeypatch):
    said, capture = {}, {}
    for name in ("native", "python"):
        with pytest.warns(TensorDumpSize) as record:
            _, dump = train_with(name, monkeypatch, tmp_path / name, 4, data="tensor",
                                 tensor_limit_mb=0.03, steps="1-2")
        said[name] = [str(w.message) for w in record if issubclass(w.category, TensorDumpSize)]
        capture[name] = dump.manifest["tensor_capture"]
        df = dump.records(step=2).to_pandas()
        assert 0 < df.data.notna().sum() < len(df)  # statistics only from the stop on
        assert df.hash.notna().all()
    assert said["native"] == said["python"] and any("stopped at the limit" in m for m in said["native"])
    assert capture["native"] == capture["python"] and capture["native"]["stopped"]["step"] == 2


def test_the_size_said_before_a_window_is_what_is_stored(tmp_path, monkeypatch):
    said = {}
    for name in ("native", "python"):  # a size probe of step 1
        with pytest.warns(TensorDumpSize, match="measured on step 1, just before the window") as record:
            _, dump = train_with(name, monkeypatch, tmp_path / name, 3, data="tensor", steps="2")
        said[name] = [str(w.message) for w in record]
        cap = dump.manifest["tensor_capture"]
        assert cap["estimate"]["bytes_per_step"] == cap["bytes_per_step"]["2"] > 0
    assert said["native"] == said["python"]
    # from an earlier (native) statistics dump of the same model
    train_with("native", monkeypatch, tmp_path / "s", 2, small_transformer, steps="1")
    with pytest.warns(TensorDumpSize, match="from the records of"):
        _, dump = train_with("native", monkeypatch, tmp_path / "e", 2, small_transformer, data="tensor", steps="1",
                             estimate_from=str(tmp_path / "s"))
    cap = dump.manifest["tensor_capture"]
    assert cap["estimate"]["bytes_per_step"] == cap["bytes_per_step"]["1"] > 0


def test_full_shards_reach_the_writer_while_the_step_runs(tmp_path, monkeypatch):
    events = []
    add_shard, end_step = opscope.storage.writer.DumpWriter.add_shard, native_aten.NativeRecorder.end_step

    def spy_shard(self, step, chunks, size, nbytes):
        events.append(("shard", step, nbytes))
        return add_shard(self, step, chunks, size, nbytes)

    def spy_end(self):
        events.append(("end", self.step, 0))
        return end_step(self)

    monkeypatch.setattr(opscope.storage.writer.DumpWriter, "add_shard", spy_shard)
    monkeypatch.setattr(native_aten.NativeRecorder, "end_step", spy_end)
    shard_mb = 1  # the step stores about 15 MB
    _, dump = train_with("native", monkeypatch, tmp_path / "d", 1, _medium_transformer, data="tensor",
                         shard_mb=shard_mb)
    during = [e for e in events[: events.index(("end", 0, 0))] if e[0] == "shard"]
    assert len(during) >= 5  # handed over as they filled, not held until the step's end
    shards = sorted(fmt.step_dir(tmp_path / "d", 0, 0).glob("tensors-*.safetensors"))
    assert len(shards) == len(during) + 1
    for path in shards:  # each within shard_mb, unless one tensor alone is larger
        tensors = load_file(str(path))
        assert sum(a.nbytes for a in tensors.values()) <= shard_mb * 2**20 or len(tensors) == 1
    assert _owners_hold_every_key(dump) > 100


def test_a_crash_mid_step_leaves_readable_shards_and_says_crashed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    model, opt, batch = small_transformer()
    with pytest.raises(RuntimeError, match="lost the batch"), \
            opscope.dump(tmp_path / "d", data="tensor", shard_mb=1) as d:
        train_step(model, opt, *batch(0))
        d.step()
        inputs, _ = batch(1)
        model(inputs).sum().backward()  # step 1 dies before its optimizer step
        raise RuntimeError("lost the batch")
    dump = opscope.load(tmp_path / "d")
    assert dump.status == "crashed" and "lost the batch" in dump.error and dump.steps() == [0, 1]
    assert not list((tmp_path / "d").rglob("*.tmp"))
    step1 = dump.records(step=1).to_pandas()
    assert set(step1.phase) == {"forward", "backward"} and step1.data.notna().all()
    assert _owners_hold_every_key(dump) > 100


def test_an_unwritable_path_is_said_before_capture(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DumpWriteError, match="is a file"):
        opscope.dump(tmp_path / "file", data="tensor").start()


def test_convert_writes_every_stored_tensor_of_a_native_dump(tmp_path, monkeypatch, run_cli):
    _, dump = train_with("native", monkeypatch, tmp_path / "d", 1, small_transformer, data="tensor")
    out = run_cli("convert", tmp_path / "d", "--to", "npy", "-o", tmp_path / "npy")
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in dump.records().to_pylist()}
    with open(tmp_path / "npy" / "index.csv") as f:
        index = list(csv.DictReader(f))
    assert len(index) == sum(1 for r in rows.values() if r["data"])
    for entry in index:
        arr = np.load(tmp_path / "npy" / entry["file"], allow_pickle=False)
        expected = dump.row_tensor(rows[int(entry["id"])])  # convert writes shared data once, in one shape
        assert np.array_equal(arr.ravel(), expected.ravel(), equal_nan=True)


def test_the_path_of_tensors_on_another_device_stores_the_same_bytes(tmp_path, monkeypatch, backend):
    _, fast = train_with("native", monkeypatch, tmp_path / "f", 2, small_transformer, data="tensor")
    backend.route_slow(True)  # Python statistics and torch's copy to the host, tensor by tensor
    try:
        _, slow = train_with("native", monkeypatch, tmp_path / "s", 2, small_transformer, data="tensor")
    finally:
        backend.route_slow(False)
    a, b = fast.records().to_pylist(), slow.records().to_pylist()
    assert [(r["key"], r["view"], r["hash"]) for r in a] == [(r["key"], r["view"], r["hash"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        if ra["data"] and ra["producer"] is None:
            assert fast.row_tensor(ra, raw=True).tobytes() == slow.row_tensor(rb, raw=True).tobytes()


def test_dtypes_the_kernel_does_not_read_are_stored_as_the_python_path_stores_them(tmp_path, monkeypatch):
    a = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def run(name):
        monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", name)
        with opscope.dump(tmp_path / name, data="tensor") as d:
            c = torch.complex(a, a.flip(0))
            (c.conj() * 2).abs()  # a conjugate view
            a.to(torch.float8_e4m3fn).float()
            (a * 100).to(torch.int16).to(torch.uint16).to(torch.int32)
            a.to(torch.bfloat16).t().contiguous()
            d.step()
        return opscope.load(tmp_path / name)

    nat, py = run("native"), run("python")
    a_rows, b_rows = _by_content(nat), _by_content(py)  # the mode sees a clone resolving the conjugate too
    common = [k for k in a_rows if k in b_rows and a_rows[k]["data"]]
    assert {"complex64", "float8_e4m3fn", "uint16", "bfloat16"} <= {a_rows[k]["dtype"] for k in common}
    for k in common:
        ra, rb = a_rows[k], b_rows[k]
        assert rb["data"] and nat.row_tensor(ra, raw=True).tobytes() == py.row_tensor(rb, raw=True).tobytes(), k
    # the conjugate view holds its own values (not its input's, placed), on both paths
    for dump in (nat, py):
        conj = next(r for r in dump.records().to_pylist() if r["op"] == "aten._conj.default" and r["io"] == "output")
        assert conj["view"] is None and dump.row_tensor(conj).tolist() == torch.complex(a, -a.flip(0)).tolist()


def _by_content(dump) -> dict:
    """Rows keyed by (op, io, slot, dtype, shape) and their count so far."""
    out, seen = {}, {}
    for r in dump.records().to_pylist():
        key = (r["op"], r["io"], r["slot"], r["dtype"], tuple(r["shape"]))
        seen[key] = seen.get(key, -1) + 1
        out[(*key, seen[key])] = r
    return out


def test_which_dumps_run_natively(monkeypatch):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")

    def config(**keys):
        return dump_config(None, path="x", **keys)

    assert native_aten.backend_for(config(data="tensor")) is not None
    assert native_aten.backend_for(config(data="tensor", tensor_limit_mb=1)) is not None
    assert native_aten.backend_for(config(tensor_ops=["aten.mm*"])) is not None
    assert native_aten.backend_for(config(level="module")) is not None
    for keys in ({"data": "tensor", "source": True}, {"level": "api", "data": "tensor"},
                 {"level": "module", "data": "tensor"}, {"level": "module", "tensor_ops": ["Linear"]}):
        assert native_aten.backend_for(config(**keys)) is None, keys
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "python")
    assert native_aten.backend_for(config(data="tensor")) is None


def test_a_shard_written_directly_or_through_the_page_cache_is_the_same_file(tmp_path):
    import mmap

    from opscope.storage.safetensors_io import write_chunks

    data = os.urandom(3 * 4096 + 100)
    aligned = [mmap.mmap(-1, 8192), mmap.mmap(-1, 8192)]  # page-aligned, whole blocks: O_DIRECT
    aligned[0][:] = data[:8192]
    aligned[1][: len(data) - 8192] = data[8192:]
    write_chunks(tmp_path / "direct", aligned, len(data))
    write_chunks(tmp_path / "cached", [data[:5000], data[5000:]], len(data))  # unaligned: ordinary writes
    assert (tmp_path / "direct").read_bytes() == (tmp_path / "cached").read_bytes() == data
    assert not list(tmp_path.glob("*.tmp"))


def test_a_file_system_that_refuses_direct_writes_gets_ordinary_ones(tmp_path, monkeypatch):
    """Every file system here takes O_DIRECT; one that refuses it (EINVAL at open, as some
    network and FUSE file systems do) is stood in for by an open() that refuses the flag."""
    import errno
    import mmap

    from opscope.storage import safetensors_io

    real_open, refused = os.open, []

    def open_without_direct(path, flags, mode=0o777, **kw):
        if flags & getattr(os, "O_DIRECT", 0):
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(safetensors_io.os, "open", open_without_direct)
    data = os.urandom(2 * 4096 + 7)
    chunk = mmap.mmap(-1, 3 * 4096)
    chunk[: len(data)] = data
    safetensors_io.write_chunks(tmp_path / "shard", [chunk], len(data))
    assert refused and (tmp_path / "shard").read_bytes() == data and not list(tmp_path.glob("*.tmp"))


def test_the_chunk_pool_is_returned_between_tensor_steps(tmp_path, monkeypatch, backend):
    """Between two tensor windows the chunks of the pool (full tensors' memory) go back to the
    system; between two tensor steps of one window they are kept for the next."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    model, opt, batch = small_transformer()
    held = []
    with opscope.dump(tmp_path / "d", level="aten", data="tensor", steps="0|1|3") as d:
        for i in range(4):
            train_step(model, opt, *batch(i))
            d.step()
            deadline = time.monotonic() + 10
            while (d.writer._queue or d.writer._pending) and time.monotonic() < deadline:
                time.sleep(0.01)  # the writer writes the step's shards and lets go of their chunks
            time.sleep(0.05)
            held.append(backend.pool_bytes())  # (bytes of chunks allocated, idle in the pool)
    assert held[0][1] > 0 and held[0][0] == held[0][1]  # step 1 is a tensor step: kept for it
    assert held[1] == held[2] == held[3] == (0, 0)  # steps 2 and 4 are not captured: returned
    assert {s for _, s in opscope.load(tmp_path / "d").partitions()} == {0, 1, 3}
