"""Tiny models that overflow for real, for the watch tests."""

from __future__ import annotations

import torch
from torch import nn


class ExpHead(nn.Module):
    """fp16 softmax-free exp of logits: large logits overflow exp in float16 (max 65504)."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = (self.proj(x) * self.scale).half()
        return torch.exp(logits).float().mean(-1)


class ZeroVarNorm(nn.Module):
    """A layer norm without eps: a constant row has zero variance, and 0 / sqrt(0) is NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return self.fc((x - mean) / var.sqrt())


class LogRelu(nn.Module):
    """log(relu(x)): negative inputs give log(0) = -Inf."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(torch.relu(self.fc(x)))


class PairDistance(nn.Module):
    """Euclidean distance written by hand, of two identical points: sqrt(0) = 0 in forward,
    but its backward divides by 2*sqrt(0): Inf, then 0 * Inf = NaN in the gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc(x), self.fc(x)
        return self.out(torch.sqrt(((a - b) ** 2).sum(-1, keepdim=True)))


class MaskedAttention(nn.Module):
    """Causal attention written three ways that all put -Inf in on purpose."""

    def __init__(self, d: int = 16, seq: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.mha = nn.MultiheadAttention(d, 2, batch_first=True)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).triu(1))
        self.additive = torch.full((seq, seq), float("-inf")).triu(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 4.0
        a = torch.softmax(scores.masked_fill(self.causal, float("-inf")), dim=-1) @ v
        b = torch.softmax(torch.where(self.causal, torch.tensor(float("-inf")), scores), dim=-1) @ v
        c = torch.softmax(scores + self.additive, dim=-1) @ v
        d = self.mha(x, x, x, attn_mask=self.causal, need_weights=False)[0]
        e = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=~self.causal)
        return a + b + c + d + e


def train(model: nn.Module, inputs: list[torch.Tensor], w=None, lr: float = 0.01) -> list[float]:
    """A few SGD steps of ``model(x).pow(2).mean()``; calls ``w.step(loss=...)`` when given."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x in inputs:
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if w is not None:
            w.step(loss=loss)
        losses.append(float(loss.detach()))
    return losses
