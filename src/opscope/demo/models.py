"""Tiny real models for the demo, tests and benchmarks (no downloads: data is synthetic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm transformer block: attention + GELU MLP."""

    def __init__(self, d: int, heads: int, gelu: str = "none", eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU(approximate=gelu)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Embedding, ``layers`` blocks, final norm and a vocabulary head."""

    def __init__(self, vocab: int = 64, d: int = 128, heads: int = 4, layers: int = 2, seq: int = 64,
                 gelu: str = "none", eps: float = 1e-5) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.layers = nn.ModuleList(Block(d, heads, gelu, eps) for _ in range(layers))
        self.norm = nn.LayerNorm(d, eps=eps)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, hidden: int = 256, d_out: int = 10, depth: int = 3) -> None:
        super().__init__()
        dims = [d_in] + [hidden] * (depth - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.act = nn.ReLU()
        self.out = nn.Linear(dims[-1], d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.act(layer(x))
        return self.out(x)


def transformer_task(seed: int = 0, batch: int = 8, seq: int = 64, vocab: int = 64, **kw: Any
                     ) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A seeded TinyTransformer, AdamW, and ``batch(i) -> (tokens, targets)``."""
    torch.manual_seed(seed)
    model = TinyTransformer(vocab=vocab, seq=seq, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    data = [torch.randint(0, vocab, (batch, seq + 1), generator=gen) for _ in range(16)]

    def batch_at(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = data[i % len(data)]
        return tokens[:, :-1], tokens[:, 1:]
    return model, opt, batch_at


def mlp_task(seed: int = 0, batch: int = 32, **kw: Any
             ) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    model = MLP(**kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    first = model.layers[0]
    assert isinstance(first, nn.Linear)
    data = [(torch.randn(batch, first.in_features, generator=gen),
             torch.randint(0, model.out.out_features, (batch,), generator=gen)) for _ in range(16)]
    return model, opt, lambda i: data[i % len(data)]


def train_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """One step of cross-entropy training; returns the loss."""
    logits = model(inputs)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.detach())
