"""ReLU's backward where one forward value sits at zero in one run and just above it in the other
(compare/decisions.py): a float32 run against a bfloat16 one, dumped by opscope with full tensors."""

from __future__ import annotations

import torch

import opscope

ROWS, WIDTH = 64, 32


def _dump(path, dtype: torch.dtype, corrupt: bool = False):
    """relu(x @ w) weighed by c, summed, backward. x's first row is built so that its first
    pre-activation is 0 in bfloat16 and 3e-5 in float32, and c weighs that element 1000 times
    the others: the gradient one run keeps there and the other drops is most of the output.
    ``corrupt``: the target's fault, x[0]'s fifth pre-activation (2, weighed 1000 times too)
    turned round."""
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
    with opscope.dump(path, level="aten", data="tensor") as d:
        pre = x @ w
        if corrupt:
            turned = (torch.arange(ROWS)[:, None] == 0) & (torch.arange(WIDTH) == 5)
            pre = pre * torch.where(turned, -1.0, 1.0).to(dtype)
        (torch.relu(pre) * c).sum().backward()
        d.step()
    return path


def _gates(result) -> list:
    return [f for f in result.culprits if f.op == "aten.threshold_backward.default"]


def test_a_relu_whose_mask_flips_at_a_rounding_is_no_culprit(tmp_path) -> None:
    half, full = _dump(tmp_path / "bf16", torch.bfloat16), _dump(tmp_path / "fp32", torch.float32)
    for target, reference in ((half, full), (full, half)):
        result = opscope.compare(target, reference)
        assert not _gates(result), [f.where for f in result.culprits]
        said = [n for n in result.notes if "aten.threshold_backward.default" in n]
        assert len(said) == 1 and " of 2048 elements" in said[0] and "is no culprit" in said[0], said


def test_a_flip_far_from_the_threshold_stays_a_culprit(tmp_path) -> None:
    """One pre-activation of 2048 turned round: the forward's values as a whole still agree
    within bfloat16's tolerance, but the flipped element sits far from zero."""
    full = _dump(tmp_path / "fp32", torch.float32)
    result = opscope.compare(_dump(tmp_path / "bad", torch.bfloat16, corrupt=True), full)
    assert result.verdict == "diverged"
    assert [f.step for f in _gates(result)] == [0], [f.where for f in result.culprits]
    assert not [n for n in result.notes if "is no culprit" in n], result.notes
