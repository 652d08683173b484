"""ReLU's backward where one forward value sits at zero in one run and just above it in the other
(compare/decisions.py): a float32 run against a bfloat16 one, dumped by opscope with full tensors,
at the aten level (``threshold_backward`` reads the forward's values) and at the api level (the
backward's record holds the gradients only: the mask is the forward call's output; since session
43, where a ResNet under float16 AMP had its first ReLU's backward named for one such element)."""

from __future__ import annotations

import pytest
import torch

import opscope

LEVELS = ["aten", "api"]

ROWS, WIDTH = 64, 32


def _dump(path, dtype: torch.dtype, corrupt: bool = False, level: str = "aten"):
    """relu(x @ w) summed, its gradient weighed by c, backward. x's first row is built so that its first
    pre-activation is 0 in bfloat16 and 3e-5 in float32, and c weighs that element 1000 times
    the others: the gradient one run keeps there and the other drops is most of the output.
    ``corrupt``: the target's fault, x[0]'s fifth pre-activation (2, weighed 1000 times too)
    turned round. A second ReLU, of other values, comes after it: at the api level the backward
    calls of ``torch.relu`` are matched to their forward calls from the last."""
    torch.manual_seed(0)
    w = torch.randn(WIDTH, WIDTH)
    x = torch.randn(ROWS, WIDTH)
    x[0] = 0.0
    x[0, 0], x[0, 1] = 1.0 + 2**-7 / 3, -1.0  # bf16 rounds x[0, 0] to 1.0: the sum cancels there
    w[0, 0], w[1, 0] = 1.0, 1.0
    w[0, 5], w[1, 5] = 2.0, 0.0  # x[0]'s fifth pre-activation: 2, far from zero
    c = torch.ones(ROWS, WIDTH)
    c[0, 0] = c[0, 5] = 1000.0
    x, w, c = x.to(dtype).requires_grad_(), w.to(dtype), c.to(dtype)
    with opscope.dump(path, level=level, data="tensor") as d:
        pre = x @ w
        if corrupt:
            turned = (torch.arange(ROWS)[:, None] == 0) & (torch.arange(WIDTH) == 5)
            pre = pre * torch.where(turned, -1.0, 1.0).to(dtype)
        y = torch.relu(pre)
        y.register_hook(lambda g: g * c)  # (weighed in the backward only: the forward's rounding stays small)
        (y.sum() + torch.relu(x[:8] - 0.5).sum()).backward()
        d.step()
    return path


_GATE = {"aten": "aten.threshold_backward.default", "api": "torch.relu"}


def _gates(result, level: str) -> list:
    return [f for f in result.culprits if f.op == _GATE[level] and f.phase == "backward"]


@pytest.mark.parametrize("level", LEVELS)
def test_a_relu_whose_mask_flips_at_a_rounding_is_no_culprit(tmp_path, level) -> None:
    half = _dump(tmp_path / "bf16", torch.bfloat16, level=level)
    full = _dump(tmp_path / "fp32", torch.float32, level=level)
    for target, reference in ((half, full), (full, half)):
        result = opscope.compare(target, reference)
        assert not _gates(result, level), [f.where for f in result.culprits]
        said = [n for n in result.notes if _GATE[level] in n]
        assert len(said) == 1 and " of 2048 elements" in said[0] and "is no culprit" in said[0], said


@pytest.mark.parametrize("level", LEVELS)
def test_a_flip_far_from_the_threshold_stays_a_culprit(tmp_path, level) -> None:
    """One pre-activation of 2048 turned round: the forward's values as a whole still agree
    within bfloat16's tolerance, but the flipped element sits far from zero."""
    full = _dump(tmp_path / "fp32", torch.float32, level=level)
    result = opscope.compare(_dump(tmp_path / "bad", torch.bfloat16, corrupt=True, level=level), full)
    assert result.verdict == "diverged"
    assert [f.step for f in _gates(result, level)] == [0], [f.where for f in result.culprits]
    assert not [n for n in result.notes if "is no culprit" in n], result.notes
