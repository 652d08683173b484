"""DTensor (tensor parallelism, FSDP2) at the aten level: its ops are looked through.

A DTensor op runs in Python (``__torch_dispatch__``) the same op on the plain tensor each rank
holds (or a redistribution's collectives first). Recorded as itself, it was a row with no data
("tensor subclass dispatched to Python: not measured") and the ops on the shards were not
recorded at all: a tensor-parallel Llama compared its down projection's partial sums as roots,
and FSDP2's optimizer was opaque. The native capture records the ops on the shards; the
optimizer's parameters and gradients are recorded as their shards on both paths. A process
group of one rank (gloo) runs it in-process; two ranks are in test_real_distributed.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import opscope
from opscope.model.records import SUBCLASS_NOTE


@pytest.fixture
def mesh(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _rows(path):
    return opscope.load(path).records().to_pandas().sort_values(["seq", "id"])


def test_the_ops_a_dtensor_runs_on_its_shard_are_recorded(tmp_path, monkeypatch, mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", "native")
    torch.manual_seed(0)
    w = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    x = distribute_tensor(torch.randn(4, 3), mesh, [Shard(1)])
    with opscope.dump(tmp_path / "d", level="aten") as d:
        y = torch.mm(w, x).relu()
        d.step()
    rows = _rows(tmp_path / "d")
    assert not (rows.note == SUBCLASS_NOTE).any(), rows[rows.note == SUBCLASS_NOTE][["op", "io"]]
    mm = rows[rows.op == "aten.mm.default"]
    assert len(mm[mm.io == "output"]) == 1, "the shard's mm, once: the DTensor's own call is looked through"
    out = mm[mm.io == "output"].iloc[0]
    assert out["norm"] == pytest.approx(float(torch.mm(w.to_local(), x.to_local()).norm()), rel=1e-6)
    relu_in = rows[(rows.op == "aten.relu.default") & (rows.io == "input")].iloc[0]
    assert relu_in["producer"] == out["id"], "the next op on the DTensor reads the shard the mm made"
    assert float(y.to_local().sum()) >= 0


@pytest.mark.parametrize("backend", ["native", "python"])
def test_the_optimizer_records_a_dtensor_parameters_shard(tmp_path, monkeypatch, backend, mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    torch.manual_seed(0)
    p = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]))
    opt = torch.optim.SGD([p], lr=0.1)
    with opscope.dump(tmp_path / "d", level="aten") as d:
        p.sum().backward()
        before = p.to_local().detach().clone()
        opt.step()
        d.step()
    rows = _rows(tmp_path / "d")
    step = rows[rows.op == "SGD.step"]
    param = step[(step.arg == "param") & (step.io != "output")].iloc[0]  # (no module owns it: io "input")
    assert pd_isna(param.note) and param["norm"] == pytest.approx(float(before.norm()), rel=1e-6)
    grad = step[step.io == "grad"].iloc[0]
    assert grad["min"] == grad["max"] == 1.0, "the gradient's shard: d(sum)/dp"
    after = step[step.io == "output"].iloc[0]
    assert after["norm"] == pytest.approx(float(p.to_local().detach().norm()), rel=1e-6)


def pd_isna(value) -> bool:
    return value is None or value != value


def test_the_module_level_says_it_does_not_see_a_tensor_parallel_plans_outputs(tmp_path, mesh):
    """A module's global hook runs before the plan's own forward hook, which all-reduces a
    row-parallel projection's partial sums: the module level records them unreduced. The dump
    says so, and which level records tensor parallelism; a model with no plan gets no such note."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from opscope.capture.torch.modules import TENSOR_PARALLEL_NOTE

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    parallel = parallelize_module(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)),
                                  mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(2, 4)
    with opscope.dump(tmp_path / "plain", level="module") as d:
        plain(x).sum().backward()
        d.step()
    assert TENSOR_PARALLEL_NOTE not in opscope.load(tmp_path / "plain").manifest["notes"]
    with pytest.warns(RuntimeWarning, match="under tensor parallelism"), \
            opscope.dump(tmp_path / "parallel", level="module") as d:
        for _ in range(2):
            parallel(x).sum().backward()
            d.step()
    assert opscope.load(tmp_path / "parallel").manifest["notes"].count(TENSOR_PARALLEL_NOTE) == 1
    with opscope.dump(tmp_path / "aten", level="aten") as d:
        parallel(x).sum().backward()
        d.step()
    assert TENSOR_PARALLEL_NOTE not in opscope.load(tmp_path / "aten").manifest["notes"]
