"""Random ops replay only with their recorded generator state; ops that cannot run on CPU,
or are not registered, say so; a registered replay rule makes them replayable."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
import runs
import torch

import opscope
from opscope.replay import register_replay, replay
from opscope.replay.rules import RULES


def _seq(dump, op):
    return next(r["seq"] for r in opscope.load(dump).records(step=0).to_pylist() if r["op"] == op)


@pytest.fixture(scope="module")
def dropout_dump(tmp_path_factory):
    return runs.train(tmp_path_factory.mktemp("dropout") / "d", dropout=0.25)


def test_dropout_replays_with_its_generator_state(dropout_dump):
    seq = _seq(dropout_dump, "aten.bernoulli_.float")
    out = replay(dropout_dump, dropout_dump, f"0:0:{seq}")
    assert out.verdict == "both_within", out.reason
    assert out.target.units == 0 and out.target.reproduced  # the same mask, bit for bit


def test_dropout_without_generator_state_cannot_replay_deterministically(dropout_dump, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(dropout_dump, old)
    for f in old.rglob("records-*.parquet"):  # as written before opscope recorded generator states
        table = pq.read_table(f)
        args = [None if a is None else json.dumps({k: v for k, v in json.loads(a).items() if k != "rng"})
                for a in table.column("args").to_pylist()]
        i = table.schema.get_field_index("args")
        pq.write_table(table.set_column(i, table.schema.field(i), [args]), f)
    seq = _seq(old, "aten.bernoulli_.float")
    out = replay(old, old, f"0:0:{seq}")
    assert out.verdict == "not_replayable"
    assert out.reason.startswith("cannot replay deterministically: aten.bernoulli_.float is a random op")


class Doubler(torch.nn.Module):
    def forward(self, x):
        return torch.ops.opscope_rt.double_it.default(x * 3)


def test_custom_op_not_registered_or_without_cpu_kernel(tmp_path):
    lib = torch.library.Library("opscope_rt", "DEF")
    lib.define("double_it(Tensor x) -> Tensor")
    lib.impl("double_it", lambda x: x * 2, "CPU")
    try:
        with opscope.dump(tmp_path / "d", data="tensor") as d:
            Doubler()(torch.ones(4))
            d.step()
    finally:
        lib._destroy()
    op_id = f"0:0:{_seq(tmp_path / 'd', 'opscope_rt.double_it.default')}"
    out = replay(tmp_path / "d", tmp_path / "d", op_id)
    assert out.verdict == "not_replayable" and "not registered in this process" in out.reason
    meta_only = torch.library.Library("opscope_rt", "DEF")  # e.g. a library built for the accelerator only
    meta_only.define("double_it(Tensor x) -> Tensor")
    meta_only.impl("double_it", lambda x: torch.empty_like(x), "Meta")
    try:
        out = replay(tmp_path / "d", tmp_path / "d", op_id)
        assert out.verdict == "not_replayable"
        assert "cannot run on CPU" in out.reason and "register_replay('opscope_rt.double_it.default')" in out.reason
        register_replay("opscope_rt.double_it.default")(lambda x: x * 2)
        with pytest.raises(ValueError, match="already registered"):
            register_replay("opscope_rt.double_it.default")(lambda x: x * 2)
        out = replay(tmp_path / "d", tmp_path / "d", op_id)
        assert out.verdict == "both_within", out.reason
    finally:
        RULES.pop("opscope_rt.double_it.default", None)
        meta_only._destroy()
