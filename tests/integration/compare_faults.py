"""Small real models with faults injected for real, dumped with opscope.dump.

Used by test_compare_faults.py and benchmarks; ``python compare_faults.py OUT NAME...``
writes dumps for the named cases (target and reference) under OUT.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class WrongGradSiLU(torch.autograd.Function):
    """x * sigmoid(x), with a gradient scaled by ``scale`` (1.0 is the correct gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s))) * ctx.scale, None


class Block(nn.Module):
    def __init__(self, d: int, heads: int, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg, self.heads = cfg, heads
        self.ln1 = nn.LayerNorm(d, eps=cfg.get("ln_eps", 1e-5))
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        h = self.fc1(self.ln2(x))
        if self.cfg.get("insert_scale"):
            h = h * 1.01
        h = F.gelu(h, approximate="tanh" if self.cfg.get("gelu_tanh") else "none")
        return x + self.fc2(h)


class TinyTransformer(nn.Module):
    """Two pre-norm blocks, d=32, 2 heads, over token embeddings; mean-pooled regression head."""

    def __init__(self, cfg: dict[str, Any] | None = None, vocab: int = 40, d: int = 32) -> None:
        super().__init__()
        cfg = cfg or {}
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, 2, cfg if i == 1 else {}) for i in range(2)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)).mean(dim=1)


class MLP(nn.Module):
    """Linear → SiLU (custom autograd) → Linear → [overflow-prone gain] → LayerNorm → Linear."""

    def __init__(self, cfg: dict[str, Any] | None = None, d: int = 16) -> None:
        super().__init__()
        self.cfg = cfg or {}
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = WrongGradSiLU.apply(self.fc1(x), self.cfg.get("grad_scale", 1.0))
        h = self.fc2(h)
        # fp16_gain overflows float16: inf, then NaN downstream
        h = (h.half() * 1e6).float() / 1e6 if self.cfg.get("fp16_gain") else (h * 1e6) / 1e6
        return self.out(self.norm(h))


def train(model: nn.Module, path: Path, *, steps: int = 2, dtype: torch.dtype = torch.float32,
          lr: float = 1e-3, autocast: bool = False, threads: int | None = None, level: str = "aten",
          data: str = "tensor", transformer: bool = True) -> Path:
    """A few AdamW steps on fixed data, dumped at every step."""
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, 40, (2, 8), generator=gen) if transformer else torch.randn(8, 16, generator=gen).to(dtype)
    target = torch.randn(inputs.shape[0], 1, generator=gen).to(dtype)
    model = model.to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with __import__("opscope").dump(path, steps=list(range(steps)), level=level, data=data,
                                        overwrite=True) as d:
            for _ in range(steps):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    out = model(inputs)
                loss = F.mse_loss(out.float(), target.float())
                loss.backward()
                opt.step()
                d.step()
    finally:
        torch.set_num_threads(old_threads)
    return path


def base(kind: str) -> nn.Module:
    torch.manual_seed(0)
    return TinyTransformer() if kind == "transformer" else MLP()


def variant(model: nn.Module, **cfg: Any) -> nn.Module:
    """The same weights, with ``cfg`` switched on (a fault, or nothing)."""
    other = copy.deepcopy(model)
    for m in other.modules():
        if hasattr(m, "cfg"):
            m.cfg = {**m.cfg, **cfg} if not isinstance(m, Block) or m is other.blocks[1] else m.cfg
        if isinstance(m, Block) and m is other.blocks[1] and "ln_eps" in cfg:
            m.ln1.eps = cfg["ln_eps"]
    return other


# name -> (model kind, target changes, train kwargs for target, train kwargs for reference)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "gelu_tanh": ("transformer", {"gelu_tanh": True}, {}, {}),
    "ln_eps": ("transformer", {"ln_eps": 1e-1}, {}, {}),
    "insert_op": ("transformer", {"insert_scale": True}, {}, {}),
    "backward_grad": ("mlp", {"grad_scale": 1.5}, {"transformer": False}, {"transformer": False}),
    "optimizer_lr": ("transformer", {}, {"lr": 2e-3}, {}),
    "param_row": ("transformer", {"param_row": True}, {}, {}),
    "overflow_nan": ("mlp", {"fp16_gain": True}, {"transformer": False}, {"transformer": False}),
    "same_twice": ("transformer", {}, {}, {}),
    "fp64_reference": ("transformer", {}, {}, {"dtype": torch.float64}),
    "fp64_reference_mlp": ("mlp", {}, {"transformer": False}, {"transformer": False, "dtype": torch.float64}),
    "threads": ("transformer", {}, {"threads": 1}, {"threads": 2}),
    "bf16_autocast": ("transformer", {}, {"autocast": True}, {}),
}


def make_case(name: str, out: Path, **extra: Any) -> tuple[Path, Path]:
    """Write the target and reference dumps of one case; returns their paths."""
    kind, cfg, t_kw, r_kw = CASES[name]
    reference = base(kind)
    target = variant(reference, **{k: v for k, v in cfg.items() if k != "param_row"})
    if cfg.get("param_row"):
        with torch.no_grad():
            target.blocks[0].fc1.weight[3] += 0.05
    t_path = train(target, out / f"{name}-target", **{**t_kw, **extra})
    r_path = train(reference, out / f"{name}-reference", **{**r_kw, **extra})
    return t_path, r_path


if __name__ == "__main__":
    for case in sys.argv[2:]:
        print(*make_case(case, Path(sys.argv[1])))
