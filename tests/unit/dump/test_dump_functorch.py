"""torch.func transforms under a dump: ``torch.vmap`` (ensembles, per-sample gradients, Mamba's
scan under torch.compile) and ``torch.func.grad``.

Their tensors wrap others and hold no storage: before, the first op on a batched tensor stopped
an aten-level dump (natively: "Cannot access data pointer of Tensor that doesn't have
storage"), and on the Python capture path any level raised that error inside the user's call.
Now an op on a wrapped tensor is looked through (the op its batching rule runs on the whole
batch is recorded), and a module or API call's wrapped tensors are rows without statistics."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

import opscope
from opscope.model.records import WRAPPED_NOTE


def _train(path: Any, level: str, scale: float = 1.0) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    x = torch.randn(5, 3, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []

    def per_sample(w: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(row @ w) * scale).sum()

    with opscope.dump(path, level=level) if path else contextlib.nullcontext() as d:
        for _ in range(2):
            opt.zero_grad()
            w = model[0].weight.detach().t()
            grads = torch.vmap(torch.func.grad(per_sample), in_dims=(None, 0))(w, x[0])  # per-sample gradients
            loss = torch.vmap(model)(x).square().mean()  # a model under vmap
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()) + float(grads.sum()))
            if d is not None:
                d.step()
    return losses


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_vmap_and_grad_are_dumped_and_the_run_goes_on(tmp_path, monkeypatch, backend, level):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    bare = _train(None, level)
    with_dump = _train(tmp_path / "d", level)
    assert with_dump == bare, "the numbers the dump observes are unchanged"
    dump = opscope.load(tmp_path / "d")
    assert dump.manifest["status"] == "complete", dump.manifest.get("notes")
    rows = dump.records().to_pandas()
    assert set(rows.step) == {0, 1}
    if level == "aten":
        # the batched forward's matmul, as its batching rule runs it: the whole batch, measured
        mm = rows[(rows.op == "aten.mm.default") & (rows.io == "output") & (rows.phase == "forward")]
        assert [15, 8] in mm["shape"].map(list).tolist()
        assert mm["norm"].notna().all()
    else:
        wrapped = rows[rows.note == WRAPPED_NOTE]
        assert len(wrapped) > 0 and wrapped["norm"].isna().all()
        assert rows[rows.io == "param"]["norm"].notna().all(), "the parameters are plain tensors: measured"


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_changed_op_inside_vmap_is_named(tmp_path, monkeypatch, backend):
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    _train(tmp_path / "ref", "aten")
    _train(tmp_path / "same", "aten")
    _train(tmp_path / "fault", "aten", scale=1.01)
    assert opscope.compare(tmp_path / "same", tmp_path / "ref").verdict == "identical"
    first = opscope.compare(tmp_path / "fault", tmp_path / "ref").first_divergence
    assert first is not None and (first.step, first.phase) == (0, "forward")
    assert first.op == "aten.mul.Tensor", first  # tanh(row @ w) * scale, run on the whole batch
