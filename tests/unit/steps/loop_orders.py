"""Real torch training loops in the orders users write them, for step detection tests.

Iteration ``i`` feeds a batch of ``i + 1`` rows (``k`` micro-batches of that size under
gradient accumulation), so a recorded op's shape says which iteration it ran in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ORDERS = {
    # name: (zero_grad "first"/"last", set_to_none, micro-batches per step, user step(), DataLoader)
    "zero_grad_first": ("first", False, 1, False, False),
    "zero_grad_first_pstep": ("first", False, 1, True, False),
    "zero_grad_last": ("last", False, 1, False, False),
    "zero_grad_last_pstep": ("last", False, 1, True, False),
    "set_to_none_pstep": ("last", True, 1, True, False),
    "set_to_none": ("last", True, 1, False, False),
    "loader_zero_grad_last_pstep": ("last", False, 1, True, True),
    "loader_zero_grad_first": ("first", False, 1, False, True),
    "accumulate_3": ("last", True, 3, False, False),
    "accumulate_3_pstep": ("last", True, 3, True, False),
    "accumulate_3_zero_grad_first_pstep": ("first", False, 3, True, False),
    "loader_accumulate_2": ("last", False, 2, False, True),
}


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


class _Rows(torch.utils.data.Dataset):
    """Item j of a DataLoader with batch_size=1 that collates to (rows, 8): fixed per iteration."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(self.sizes[j], 8), torch.randn(self.sizes[j], 8)


def _batches(iterations: int, micro: int, loader: bool) -> Any:
    sizes = [i + 1 for i in range(iterations) for _ in range(micro)]
    if loader:
        return torch.utils.data.DataLoader(_Rows(sizes), batch_size=None)
    return [(torch.randn(n, 8), torch.randn(n, 8)) for n in sizes]


def run(order: str, session: Any, iterations: int = 5, loss_module: bool = True) -> int:
    """Train ``iterations`` optimizer steps in ``order`` under ``session``; returns the
    number of forward calls. ``loss_module``: the loss is an ``nn.MSELoss`` module (an
    outermost module call of its own) rather than a function."""
    zero, to_none, micro, user_step, loader = ORDERS[order]
    model, opt = model_and_optimizer()
    loss_fn: Any = nn.MSELoss() if loss_module else nn.functional.mse_loss
    forwards = 0
    for j, (x, y) in enumerate(_batches(iterations, micro, loader)):
        if zero == "first" and j % micro == 0:
            opt.zero_grad(set_to_none=to_none)
        loss = loss_fn(model(x), y) / micro
        forwards += 1
        loss.backward()
        if (j + 1) % micro:
            continue
        opt.step()
        if zero == "last":
            opt.zero_grad(set_to_none=to_none)
        if user_step:
            session.step()
    return forwards
