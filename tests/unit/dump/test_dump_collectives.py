"""What data-parallel training does to memory, recorded as it is (both captures, aten level):

- an out= argument is filled, not read: what it held (a DDP bucket's old bytes) is not measured;
- a view of an empty-like op's memory, filled through an out= argument, holds no data until then;
- a view read of memory given back without an op (FSDP's ``storage().resize_()``) is taken back
  when the memory is then overwritten unread, and kept when an op reads its data;
- a collective's output is measured at its next read, which has the collective for its producer.

A process group of one rank (gloo) runs the collectives in-process; the two-rank runs are in
tests/integration/test_real_distributed.py.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.distributed as dist

import opscope
from opscope.model.records import COLLECTIVE_NOTE, UNINITIALIZED_NOTE, UNREAD_NOTE

BACKENDS = ["native", "python"]


def _rows(path):
    return opscope.load(path).records().to_pandas().sort_values(["seq", "id"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_out_argument_is_not_measured(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    x = torch.randn(64)
    buf = torch.full((64,), float("nan"))  # what a reused buffer holds: not data
    with opscope.dump(tmp_path / "d", level="aten") as d:
        torch.mul(x, 2, out=buf)
        buf.sum()
        d.step()
    rows = _rows(tmp_path / "d")
    mul = rows[rows.op == "aten.mul.out"]
    out_arg = mul[(mul.io == "input") & (mul.arg == "out")]
    assert out_arg.note.tolist() == [UNREAD_NOTE] and out_arg["nan"].isna().all()
    read = rows[(rows.op == "aten.sum.default") & (rows.io == "input")].iloc[0]
    assert read["nan"] == 0 and read["producer"] == mul[mul.io == "output"].iloc[0]["id"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_of_an_empty_filled_through_out_hold_no_data_until_then(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    x = torch.randn(4, 8)
    with opscope.dump(tmp_path / "d", level="aten") as d:
        bucket = torch.empty(32)  # DDP's bucket: views of it become the gradients' places
        place = bucket.as_strided((4, 8), (8, 1), 0)
        torch.mul(x, 0.5, out=place)
        bucket.sum()
        d.step()
    rows = _rows(tmp_path / "d")
    view = rows[rows.op == "aten.as_strided.default"]
    assert set(view.note) == {UNINITIALIZED_NOTE}
    assert view["mean"].isna().all()  # nothing was measured of memory no op had written
    read = rows[(rows.op == "aten.sum.default") & (rows.io == "input")].iloc[0]
    assert not pd.isna(read["mean"]) and pd.isna(read.note)  # the bucket, once written, is measured


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("then", ["overwritten", "read"])
def test_a_view_read_of_memory_overwritten_unread_is_taken_back(tmp_path, monkeypatch, backend, then):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    flat = torch.randn(64)  # made before the dump: its memory, to the dump, may hold anything
    x = torch.randn(2, 32)
    with opscope.dump(tmp_path / "d", level="aten") as d:
        halves = flat.view(2, 32)
        if then == "overwritten":
            torch.mul(x, 3, out=halves)  # FSDP's split_with_sizes_copy(out=views of the parameters)
        else:
            halves.sum()
        d.step()
    rows = _rows(tmp_path / "d")
    view_in = rows[(rows.op == "aten.view.default") & (rows.io == "input")].iloc[0]
    if then == "overwritten":
        assert view_in.note == UNINITIALIZED_NOTE and pd.isna(view_in["mean"])
    else:
        assert pd.isna(view_in.note) and view_in["mean"] == pytest.approx(flat.mean().item(), abs=1e-6)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_collective_output_is_measured_at_its_next_read(tmp_path, monkeypatch, backend, one_rank):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    grad = torch.randn(32)
    gathered = torch.full((32,), float("nan"))
    with opscope.dump(tmp_path / "d", level="aten") as d:
        dist.all_reduce(grad)
        grad.mul(2)
        dist.all_gather_into_tensor(gathered, grad)
        gathered.sum()
        d.step()
    assert (opscope.load(tmp_path / "d").manifest.get("stats_backend") == "native") == (backend == "native")
    rows = _rows(tmp_path / "d")
    for op, reader in (("c10d.allreduce_.default", "aten.mul.Tensor"), ("c10d._allgather_base_.default",
                                                                      "aten.sum.default")):
        call = rows[rows.op == op]
        made = call[call.io == "output"]
        assert made.note.tolist() == [COLLECTIVE_NOTE] and made["mean"].isna().all()
        read = rows[(rows.op == reader) & (rows.io == "input")].iloc[0]
        assert read["producer"] == made.iloc[0]["id"] and read["nan"] == 0
    destination = rows[(rows.op == "c10d._allgather_base_.default") & (rows.arg == "output_tensor")]
    assert destination.note.tolist() == [UNREAD_NOTE]  # its NaNs were never data
