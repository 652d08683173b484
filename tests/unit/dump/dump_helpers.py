from __future__ import annotations

import torch

import opscope
from opscope.demo.models import mlp_task, train_step, transformer_task


def train(path, n: int = 3, task=mlp_task, call_step: bool = True, **keys):
    """Train ``n`` steps of ``task`` under ``opscope.dump(path, **keys)``; returns (losses, Dump)."""
    model, opt, batch = task()
    losses = []
    session = opscope.dump(path, **keys)
    with session as d:
        for i in range(n):
            losses.append(train_step(model, opt, *batch(i)))
            if call_step:
                d.step()
    return losses, opscope.load(session.cfg.path)


def bare(steps: int = 3, task=mlp_task):
    model, opt, batch = task()
    return [train_step(model, opt, *batch(i)) for i in range(steps)]


def small_transformer():
    return transformer_task(d=32, heads=2, layers=1, seq=8, batch=2)


__all__ = ["bare", "small_transformer", "torch", "train", "transformer_task"]
