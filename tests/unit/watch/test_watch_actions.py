"""Actions (warn / raise), masks, hooks after exceptions, config, stacking with dump."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from watch_models import LogRelu, MaskedAttention, ZeroVarNorm, train

import opscope
from opscope.report.overflow_console import render
from opscope.watch.events import ChainLink, OverflowEvent, TensorSummary


def _global_hooks() -> tuple[int, ...]:
    from torch.nn.modules import module as mm
    from torch.optim import optimizer as opt

    return (len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks),
            len(opt._global_optimizer_pre_hooks), len(opt._global_optimizer_post_hooks))


def test_warn_logs_once_per_op_and_training_goes_on(caplog):
    model = ZeroVarNorm()
    with caplog.at_level(logging.WARNING, logger="opscope.watch"), opscope.watch(action="warn") as w:
        losses = train(model, [torch.ones(4, 8)] * 3, w)
    assert len(losses) == 3
    messages = [r.getMessage() for r in caplog.records if "aten.div.Tensor" in r.getMessage().splitlines()[0]]
    assert len(messages) == 1 and "forward, step 0" in messages[0]
    divs = [e for e in w.result.events if e.op == "aten.div.Tensor"]
    assert [e.step for e in divs] == [0]  # later steps: same op, not logged again
    assert not w.result


def test_propagated_nan_is_not_reported_again():
    with opscope.watch(action="warn") as w:
        train(ZeroVarNorm(), [torch.ones(4, 8)], w)
    ops = [e.op for e in w.result.events]
    assert ops[0] == "aten.div.Tensor" and "aten.addmm.default" not in ops


def test_masked_minus_inf_is_not_an_alarm():
    torch.manual_seed(0)
    model = MaskedAttention()
    with opscope.watch(action="raise") as w:
        train(model, [torch.randn(2, 8, 16) for _ in range(3)], w)
    assert w.result.events == []


def test_minus_inf_that_reaches_the_loss_is_an_alarm():
    class LeakyMask(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).masked_fill(x > 0, float("-inf")).sum()

    model = LeakyMask()
    w = opscope.watch(action="raise")
    with pytest.raises(opscope.OverflowDetected) as info, w:
        loss = model(torch.randn(3, 4))
        w.step(loss=loss)
    e = info.value.event
    assert (e.op, e.kind) == ("<loss>", "-inf")


def test_log_of_zero_is_not_mistaken_for_a_mask():
    with pytest.raises(opscope.OverflowDetected), opscope.watch(action="raise") as w:
        train(LogRelu(), [torch.randn(4, 8)], w)


def test_hooks_and_modes_are_removed_after_an_exception():
    before = _global_hooks()
    for level in ("aten", "module"):
        with pytest.raises(opscope.OverflowDetected), opscope.watch(level=level) as w:
            train(ZeroVarNorm(), [torch.ones(4, 8)], w)
        assert _get_current_dispatch_mode_stack() == []
        assert _global_hooks() == before
    with pytest.raises(KeyError), opscope.watch():
        raise KeyError("user error")
    assert _get_current_dispatch_mode_stack() == [] and _global_hooks() == before


def test_config_file_overflow_section(tmp_path):
    cfg = tmp_path / "opscope.json"
    cfg.write_text(json.dumps({"overflow": {"action": "warn", "level": "module", "steps": "1"}}))
    w = opscope.watch(config=cfg)
    assert (w.cfg.action, w.cfg.level) == ("warn", "module")
    with w:
        train(ZeroVarNorm(), [torch.ones(4, 8), torch.ones(4, 8)], w)
    assert {e.step for e in w.result.events} == {1}  # step 0 is not watched
    with pytest.raises(opscope.ConfigError, match="action"):
        opscope.watch(action="explode")


def test_not_on_a_selected_rank_installs_nothing(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    before = _global_hooks()
    with opscope.watch(ranks=[0]) as w:
        assert _global_hooks() == before and _get_current_dispatch_mode_stack() == []
        train(ZeroVarNorm(), [torch.ones(4, 8)], w)
    assert w.result.events == []


def test_watch_and_dump_together(tmp_path):
    from opscope.demo.models import train_step, transformer_task

    def dump_ops(path, with_watch):
        model, opt, batch = transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)
        with opscope.dump(path, steps="0|1") as d:
            if with_watch:
                with opscope.watch() as w:
                    for i in range(2):
                        train_step(model, opt, *batch(i))
                        w.step()
                        d.step()
            else:
                for i in range(2):
                    train_step(model, opt, *batch(i))
                    d.step()
        df = opscope.load(path).records().to_pandas()
        return list(df.sort_values("id").op)

    assert dump_ops(tmp_path / "both", True) == dump_ops(tmp_path / "alone", False)
    assert _get_current_dispatch_mode_stack() == []


def test_watch_entered_before_a_dump_still_catches(tmp_path):
    w = opscope.watch(action="raise")
    with pytest.raises(opscope.OverflowDetected), w, opscope.dump(tmp_path / "d") as d:
        train(ZeroVarNorm(), [torch.ones(4, 8)], w)
        d.step()
    assert opscope.load(tmp_path / "d").status == "crashed"
    assert _get_current_dispatch_mode_stack() == []


def test_loss_and_time_spikes(monkeypatch):
    with opscope.watch(action="warn", loss_spike=3.0) as w:
        for value in (1.0, 1.1, 0.9, 1.0, 9.0):
            w.step(loss=torch.tensor(value))
    spikes = [e for e in w.result.events if e.kind == "loss_spike"]
    assert [e.step for e in spikes] == [4] and "9" in spikes[0].detail

    import opscope.watch.session as watch_module

    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 15.0, 16.0])
    monkeypatch.setattr(watch_module.time, "perf_counter", lambda: next(clock))
    with opscope.watch(action="warn", time_spike=4.0) as w:
        for _ in range(6):
            w.step()
    spikes = [e for e in w.result.events if e.kind == "time_spike"]
    assert [e.step for e in spikes] == [5]


def test_render_names_everything():
    e = OverflowEvent(kind="nan", op="aten.div.Tensor", module="layers.0.norm", phase="forward", step=7, rank=2,
                      dtype="float32", shape=[4, 8], nan=3, inf=0, min=float("nan"), max=float("nan"),
                      source="train.py:42 (forward)",
                      inputs=[TensorSummary(slot=1, name="other", dtype="float32", shape=[4, 1], min=0.0, max=0.0,
                                            mean=0.0, std=0.0, nan=0, inf=0, zeros=4, origin="aten.sqrt.default")],
                      chain=[ChainLink("aten.var.correction", "layers.0.norm", "forward",
                                       "a zero variance feeding sqrt", 0.0, 0.0),
                             ChainLink("aten.div.Tensor", "layers.0.norm", "forward", "NaN")])
    text = render(e)
    first = text.splitlines()[0]
    for part in ("NaN", "aten.div.Tensor", "layers.0.norm", "forward", "step 7", "rank 2"):
        assert part in first
    assert "train.py:42" in text and "zeros 4" in text and "start looking at aten.var.correction" in text
