"""A tiny random-config Hugging Face Llama trained data-parallel on 2 CPU ranks (gloo) under
opscope.dump: ``python -m torch.distributed.run --nproc_per_node 2 real_distributed.py ROOT
NAME=WRAP[,FAULT[,LEVEL[,BACKEND]]] ...``: each run in turn, in one process group (a launch
costs ~10 s of imports and start-up, a run ~1 s of training).

WRAP: ``ddp`` (DistributedDataParallel), ``fsdp`` (FSDP2's ``fully_shard`` on every decoder
layer and the model), ``manual`` (each gradient all-reduced by hand after backward, then
divided by the world size), ``tp`` (tensor parallelism: every layer's projections split
across the ranks with DTensor plans; one batch, the same on every rank). FAULT: ``act`` swaps
layer 1's activation on rank 1 only (real_models.inject); ``max_reduce`` all-reduces the
gradients with MAX instead of SUM (manual only): the collective itself changes the values while
every rank's inputs agree; ``none`` or empty: no fault. LEVEL: the dump's level (``aten``
unless given). BACKEND: ``OPSCOPE_DUMP_BACKEND`` for that run (``python``: the Python capture
path); unset unless given.

Each rank trains on its own batch (seed = rank; tp: one batch), from the same weights, two AdamW steps dumped
at the aten level (or LEVEL) into ``ROOT/NAME``; rank r's losses go to ``ROOT/NAME.losses.r.json``
(float.hex, for bit-identity).
Used by test_real_distributed.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import real_models  # noqa: E402

STEPS = 2


def wrap(model: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    if how == "tp":
        tensor_parallel(model)
    return model


def tensor_parallel(model: torch.nn.Module) -> None:
    """Megatron-style tensor parallelism with torch's DTensor plans: each layer's q/k/v and
    gate/up projections split by output features, o/down projections by input features (their
    partial sums all-reduced)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)


def sync(model: torch.nn.Module, op: dist.ReduceOp) -> None:
    """Data parallelism by hand: every gradient all-reduced, then averaged."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=op)
            p.grad.div_(dist.get_world_size())


def run(out: str, how: str, fault: str | None, level: str = "aten") -> None:
    """One run: a model built from seed 0, wrapped, trained and dumped into ``out``."""
    import opscope

    rank = dist.get_rank()
    torch.manual_seed(0)
    fam = real_models.ALL_FAMILIES["llama"]
    model = fam.build("eager")
    if fault == "act" and rank == 1:
        real_models.inject(model, "llama", "act")
    model = wrap(model, how)
    batch = fam.batch(torch.Generator().manual_seed(0 if how == "tp" else rank))  # TP: one batch, split weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    op = dist.ReduceOp.MAX if fault == "max_reduce" else dist.ReduceOp.SUM
    losses = []
    with opscope.dump(out, steps=list(range(STEPS)), level=level, overwrite=True) as d:
        for _ in range(STEPS):
            opt.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            if how == "manual":
                sync(model, op)
            opt.step()
            losses.append(float(loss.detach()).hex())
            d.step()
    Path(f"{out}.losses.{rank}.json").write_text(json.dumps(losses))


def main(root: str, plans: list[str]) -> None:
    """Each ``NAME=WRAP,...`` plan of ``plans`` in turn, dumped into ``root/NAME``."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for plan in plans:
        name, _, spec = plan.partition("=")
        how, fault, level, backend = (spec.split(",") + ["", "", ""])[:4]
        if backend:
            os.environ["OPSCOPE_DUMP_BACKEND"] = backend
        else:
            os.environ.pop("OPSCOPE_DUMP_BACKEND", None)
        run(str(Path(root) / name), how, fault if fault not in ("", "none") else None, level or "aten")
        dist.barrier()
    time.sleep(0.2)  # gloo's threads free their works first (test_monitor_ddp.gloo_settle: torch 2.13)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
