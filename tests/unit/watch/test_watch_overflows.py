"""Real overflows caught by opscope.watch: the op, module, phase, step, inputs and chain."""

from __future__ import annotations

import pytest
import torch
from watch_models import ExpHead, LogRelu, PairDistance, ZeroVarNorm, train

import opscope
from opscope.capture.torch.op_kinds import base_name


def _caught(model, inputs, **keys):
    """Train under watch(action="raise"); returns (exception, session)."""
    torch.manual_seed(0)
    w = opscope.watch(action="raise", **keys)
    with pytest.raises(opscope.OverflowDetected) as info, w:
        train(model, inputs, w)
    return info.value, w


def test_fp16_exp_of_large_logits_names_exp_and_the_large_logits():
    torch.manual_seed(0)
    model = ExpHead(scale=40.0)
    exc, _ = _caught(model, [torch.randn(4, 8)])
    e = exc.event
    assert isinstance(exc, RuntimeError)
    assert (e.op, e.kind, e.phase, e.step, e.module) == ("aten.exp.default", "inf", "forward", 0, "")
    assert e.dtype == "float16" and e.inf > 0
    origin = e.chain[0]
    assert "large values" in origin.reason and "exp" in origin.reason
    assert origin.max > 11.09  # log(65504): where fp16 exp overflows
    assert e.chain[-1].op == "aten.exp.default"
    assert e.source and "watch_models.py" in e.source and "torch.exp" not in e.source


def test_division_by_a_zero_variance_leads_back_to_the_variance():
    exc, _ = _caught(ZeroVarNorm(), [torch.randn(4, 8), torch.ones(4, 8)])
    e = exc.event
    assert (e.op, e.kind, e.step) == ("aten.div.Tensor", "nan", 1)
    assert [base_name(link.op) for link in e.chain] == ["var", "sqrt", "div"]  # var.dim natively
    assert "zero variance" in e.chain[0].reason
    denominator = e.inputs[1]
    assert denominator.zeros == 4 and denominator.max == 0 and "aten.sqrt.default" in denominator.origin
    assert "step 1" in str(exc).splitlines()[0]


def test_log_of_zero_is_an_alarm_with_the_relu_zeros_as_origin():
    exc, _ = _caught(LogRelu(), [torch.randn(4, 8)])
    e = exc.event
    assert (e.op, e.kind, e.module, e.phase) == ("aten.log.default", "-inf", "", "forward")
    assert e.chain[0].op == "aten.relu.default" and "zeros feeding log" in e.chain[0].reason
    assert e.inputs[0].zeros > 0 and e.inputs[0].min == 0


def test_nan_only_in_backward_is_attributed_to_the_forward_op_and_module():
    exc, _ = _caught(PairDistance(), [torch.randn(16, 8)])
    e = exc.event
    assert e.phase == "backward" and e.kind in ("inf", "-inf")  # the sign follows the random init
    assert e.fwd_op == "aten.sqrt.default" and e.node.startswith("SqrtBackward")
    assert e.step == 0
    first = str(exc).splitlines()[0]
    assert "backward" in first and "step 0" in first and e.op in first


def test_nan_from_the_data_is_named_as_the_model_input():
    x = torch.randn(4, 8)
    x[1, 3] = float("nan")
    exc, _ = _caught(ZeroVarNorm(), [torch.randn(4, 8), x])
    e = exc.event
    assert (e.op, e.kind, e.step, e.nan) == ("<model input>", "nan", 1, 1)


def test_values_beyond_the_limit_warn_before_the_overflow():
    torch.manual_seed(0)
    exc, _ = _caught(ExpHead(scale=40.0), [torch.randn(4, 8)], limit=20.0)
    e = exc.event
    assert (e.kind, e.limit, e.op) == ("limit", 20.0, "aten.mul.Tensor")  # the scaled logits, before exp
    assert max(abs(e.min), abs(e.max)) > 20.0
    assert "limit" in str(exc).splitlines()[0]


def test_module_level_names_the_module_and_checks_gradients():
    exc, _ = _caught(ZeroVarNorm(), [torch.ones(4, 8)], level="module")
    e = exc.event
    assert (e.op, e.module, e.kind, e.level) == ("Linear", "fc", "nan", "module")

    exc, _ = _caught(PairDistance(), [torch.randn(16, 8)], level="module")
    e = exc.event
    assert e.op == "<grad>" and e.phase == "backward"
    assert e.param in ("fc.weight (grad)", "fc.bias (grad)") and e.kind == "nan" and e.module == "fc"


def test_deferred_reading_raises_at_the_end_of_the_step_with_the_same_chain():
    w = opscope.watch(action="raise")
    w.checker.defer = True  # as on an accelerator: flags read once per step
    model = ZeroVarNorm()
    with pytest.raises(opscope.OverflowDetected) as info, w:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, x in enumerate([torch.randn(4, 8), torch.ones(4, 8)]):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            reached = i
            w.step()
    assert reached == 1  # raised by w.step(), not inside the op
    e = info.value.event
    assert (e.op, e.kind, e.step) == ("aten.div.Tensor", "nan", 1)
    assert [base_name(link.op) for link in e.chain] == ["var", "sqrt", "div"]  # var.dim natively
    assert e.source is None


def test_a_healthy_run_reports_nothing_and_leaves_results_unchanged():
    from opscope.demo.models import train_step, transformer_task

    def run(watched: bool) -> list[float]:
        model, opt, batch = transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)
        if not watched:
            return [train_step(model, opt, *batch(i)) for i in range(3)]
        with opscope.watch():
            losses = [train_step(model, opt, *batch(i)) for i in range(3)]
        return losses

    assert run(True) == run(False)
    with opscope.watch() as w:
        model, opt, batch = transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)
        for i in range(2):
            train_step(model, opt, *batch(i))
    result = w.result
    assert result and result.events == [] and result.steps == 2
