"""Tiny real training runs for replay tests: the bundled transformer, dumped with opscope.

Faults are injected for real: ``wrong_gelu`` replaces the CPU kernel of ``aten::gelu`` with
a wrong algorithm (ReLU) for the duration of the run, as a broken device kernel would be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import opscope
from opscope.demo.models import transformer_task

SIZES = {"d": 32, "heads": 2, "layers": 1, "seq": 8, "batch": 2}


@contextlib.contextmanager
def wrong_gelu_kernel() -> Iterator[None]:
    """aten::gelu on CPU computes ReLU instead (about 45 bfloat16 eps away from GELU)."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("gelu", lambda x, approximate="none": torch.relu(x), "CPU")
    try:
        yield
    finally:
        lib._destroy()


def train(path: Path, *, autocast: bool = False, wrong_gelu: bool = False, dropout: float = 0.0,
          steps: int = 1, **dump_keys: Any) -> Path:
    """One (or a few) AdamW steps of the tiny transformer, dumped at every step."""
    model, opt, batch = transformer_task(**SIZES)
    if dropout:
        for layer in model.layers:
            layer.attn.dropout = dropout
    keys = {"steps": list(range(steps)), "data": "tensor", "overwrite": True, **dump_keys}
    gelu = wrong_gelu_kernel() if wrong_gelu else contextlib.nullcontext()
    with gelu, opscope.dump(path, **keys) as d:
        for i in range(steps):
            x, y = batch(i)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            d.step()
    return path
