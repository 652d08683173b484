"""The session on tiny real models: phases, hooks removed, failures, windows, config."""

from __future__ import annotations

import gzip
import json
import time
import warnings

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opscope  # noqa: E402
from opscope.errors import ConfigError, ProfileError  # noqa: E402
from opscope.profile.session import ProfileWarning  # noqa: E402

torch.set_num_threads(1)

def read_trace(path):
    with gzip.open(path, "rt") as handle:
        return json.load(handle)



class Slow(nn.Module):
    """A linear layer that can sleep in forward."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.sleep_s = sleep_s

    def forward(self, x):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.inner(x)


class SleepyData(torch.utils.data.Dataset):
    def __init__(self, n: int, sleep_s: float = 0.0) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.randn(8), torch.randn(8)


def train(p, steps=6, model=None, data_sleep=0.0, opt_sleep=0.0, raise_at=None, user_step=True):
    model = model or nn.Sequential(Slow(), nn.ReLU(), nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SleepyData(steps * 4, data_sleep), batch_size=4)
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if raise_at == i:
            raise ValueError("boom in step")
        if opt_sleep:
            time.sleep(opt_sleep)
        opt.step()
        if user_step and p is not None:
            p.step()
    return model


def _hook_state():
    from torch.nn.modules import module as m
    from torch.optim import optimizer as o
    from torch.utils.data import dataloader

    return (
        len(m._global_forward_pre_hooks),
        len(m._global_forward_hooks),
        len(o._global_optimizer_pre_hooks),
        len(o._global_optimizer_post_hooks),
        torch.autograd.backward,
        dataloader._BaseDataLoaderIter.__next__,
        torch.optim.Optimizer.zero_grad,
        torch.nn.Module.zero_grad,
        torch.distributed.all_reduce,
    )


def test_phases_add_up_and_injected_sleep_lands_in_its_phase(tmp_path) -> None:
    model = nn.Sequential(Slow(0.03), nn.ReLU(), nn.Linear(8, 8))
    with opscope.profile(tmp_path / "p", warmup=0) as p:
        train(p, steps=4, model=model, data_sleep=0.005)
    rows = p.result.steps
    assert [r.step for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert sum(row.phases.values()) == row.wall_ns
        assert row.phases["forward"] >= 30e6
        assert row.phases["data_wait"] >= 4 * 5e6
        assert row.phases["forward"] > 3 * max(row.phases["backward"], row.phases["optimizer"])


def test_optimizer_sleep_counts_as_optimizer_not_other(tmp_path) -> None:
    class SleepySGD(torch.optim.SGD):
        def step(self, closure=None):
            time.sleep(0.03)
            return super().step(closure)

    model = nn.Sequential(nn.Linear(8, 8))
    opt = SleepySGD(model.parameters(), lr=0.1)
    with opscope.profile(tmp_path / "p") as p:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    rows = p.result.steps
    assert len(rows) == 3, "optimizer.step() ends a step when p.step() is never called"
    assert all(r.phases["optimizer"] >= 30e6 and r.phases["other"] < 30e6 for r in rows)


def test_every_hook_is_removed_also_when_the_step_raises(tmp_path) -> None:
    before = _hook_state()
    session = opscope.profile(tmp_path / "p", steps="1-3", task_trace=True)
    with pytest.raises(ValueError, match="boom"), pytest.warns(ProfileWarning, match="covered steps"), session as p:
        train(p, steps=6, raise_at=2)
    assert _hook_state() == before
    summary = json.loads((tmp_path / "p" / "rank0" / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "step 2 raised ValueError: boom in step" in summary["error"]
    rows = p.result.steps
    assert rows[-1].step == 2 and not rows[-1].complete and not rows[-1].task_trace
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["status"] == "failed"


def test_run_ending_before_the_window_warns_and_records_no_ops(tmp_path) -> None:
    with pytest.warns(ProfileWarning, match="before the window"), opscope.profile(tmp_path / "p", steps="50-60",
                                                                                  task_trace=True) as p:
        train(p, steps=3)
    assert p.result.status == "complete"
    assert any("before the window" in w for w in p.result.summary["warnings"])
    assert p.result.summary["top_ops"] == []


def test_task_trace_only_on_window_steps_with_phases_and_ops(tmp_path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        with opscope.profile(tmp_path / "p", steps="2-3", task_trace=True, record_shapes=True) as p:
            train(p, steps=6)
    assert [r.step for r in p.result.steps if r.task_trace] == [2, 3]
    import pyarrow.parquet as pq

    ops = pq.read_table(tmp_path / "p" / "ops.parquet").to_pylist()
    assert {o["step"] for o in ops} == {2, 3}
    assert any(o["phase"] == "backward" and o["name"] == "aten::mm" for o in ops)
    assert any(o["phase"] == "forward" and o["name"] == "aten::addmm" and "[4, 8]" in o["shapes"] for o in ops)
    trace = read_trace(tmp_path / "p" / "trace.json.gz")
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"forward", "backward", "optimizer", "step 2", "aten::addmm"} <= names
    assert "step 0" not in names


def test_fp_and_bp_points_by_module_path(tmp_path) -> None:
    model = nn.Sequential(Slow(0.02), nn.ReLU(), nn.Linear(8, 8))
    with opscope.profile(tmp_path / "a", fp_point="2", warmup=0) as p:
        train(p, steps=3, model=model)
    # forward starts at module "2": the sleeping module "0" runs before it and is not forward.
    assert all(r.phases["forward"] < 20e6 <= r.phases["other"] for r in p.result.steps)
    with pytest.raises(ConfigError, match="matched no module"), opscope.profile(tmp_path / "b",
                                                                                bp_point="encoder.nope") as p:
        train(p, steps=3)


def test_auto_steps_without_user_step_and_trailing_idle_dropped(tmp_path) -> None:
    with opscope.profile(tmp_path / "p") as p:
        train(p, steps=5, user_step=False)
    assert [r.step for r in p.result.steps] == [0, 1, 2, 3, 4]


def test_config_file_profile_section_with_ascend_switches(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"profile:\n  output: {tmp_path / 'p'}\n  task_trace: 'on'\n  training_trace: 'off'\n  steps: '1'\n")
    with opscope.profile(config=cfg) as p:
        train(p, steps=3)
    rows = p.result.steps
    assert all(r.phases["other"] == r.wall_ns for r in rows), "training_trace off: wall time only"
    assert [r.step for r in rows if r.task_trace] == [1]


def test_existing_profile_is_not_overwritten_without_asking(tmp_path) -> None:
    with opscope.profile(tmp_path / "p") as p:
        train(p, steps=2)
    with pytest.raises(ProfileError, match="overwrite=True"), opscope.profile(tmp_path / "p"):
        pass
    with opscope.profile(tmp_path / "p", overwrite=True) as p:
        train(p, steps=2)
    assert p.result.status == "complete"


def test_skipped_rank_and_disabled_do_nothing(tmp_path) -> None:
    with opscope.profile(tmp_path / "p", ranks=[3]) as p:
        train(p, steps=2)
    assert p.result.status == "skipped" and not (tmp_path / "p").exists()
