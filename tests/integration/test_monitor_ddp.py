"""opscope.monitor under a real two-process DistributedDataParallel (gloo, CPU): each rank's own
gradients before the all-reduce and the reduced ones after it; a gradient scaled by 1e3 in one
rank's backward from step K is named at step K as that rank's, before the all-reduce."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from opscope.monitor.series import read
from opscope.report import render

K = 20
STEPS = 28


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(rank: int, world: int, port: int, path: str, monitored: bool) -> None:
    import opscope

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
        data = [(torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen)) for _ in range(8)]
        with opscope.monitor(path, targets=["grads", "loss"], report=False, enable=monitored) as m:
            for i in range(STEPS):
                if rank == 1 and i == K:  # a backward bug on rank 1 only
                    model[2].register_full_backward_pre_hook(lambda mod, g: tuple(x * 1e3 for x in g))
                x, y = data[i % 8]
                loss = nn.functional.cross_entropy(ddp(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                m.step(loss=loss)
        torch.save(model.state_dict(), f"{path}.{rank}.{int(monitored)}.pt")
    finally:
        gloo_settle()
        dist.destroy_process_group()


def gloo_settle() -> None:
    """Let gloo's threads free their last works before the process group goes (torch 2.13).

    A gloo work started in backward (DDP's all-reduce) keeps backward's thread-local state,
    which holds a Python object (the contextvars context that ``_engine_run_backward`` stashes);
    the gloo thread that frees it needs the GIL. ``~ProcessGroupGloo`` joins that thread while
    the main thread holds the GIL: when the work is still being freed then, the rank never
    exits (one teardown in 18 to 44 on this 2-CPU machine under load). A sleep releases the GIL.
    """
    time.sleep(0.2)


@pytest.mark.skipif(not dist.is_available(), reason="torch without distributed support")
def test_a_fault_in_one_ranks_backward_is_named_as_that_ranks_before_the_all_reduce(tmp_path):
    import torch._dynamo  # noqa: F401  what DDP's constructor imports (seconds), once here, not in each fork
    import torch.multiprocessing as mp

    from opscope.monitor import series
    series._warm_pyarrow()  # the writer's first conversion imports pandas: once here too
    for monitored in (True, False):
        ranks = mp.start_processes(_train, args=(2, _free_port(), str(tmp_path / "m"), monitored), nprocs=2,
                                   start_method="fork", join=False)
        deadline = time.monotonic() + 240
        while not ranks.join(timeout=1):  # (raises when a rank failed)
            if time.monotonic() > deadline:
                for proc in ranks.processes:
                    proc.kill()
                pytest.fail(f"the ranks (monitored={monitored}) did not end within 240 s")
    for rank in (0, 1):  # the hook reduces as DDP does: the same weights, bit for bit
        with_monitor, without = (torch.load(tmp_path / f"m.{rank}.{on}.pt", weights_only=True) for on in (1, 0))
        assert all(torch.equal(with_monitor[k], without[k]) for k in without)
    data = read(tmp_path / "m")
    r0, r1 = data.ranks[0], data.ranks[1]
    assert r0.status == r1.status == "complete" and r0.steps == r1.steps == STEPS
    # before the all-reduce each rank has its own gradients; after it, the same average
    local0 = r0.values[("grad_local", "module.0.weight", "norm")][1]
    local1 = r1.values[("grad_local", "module.0.weight", "norm")][1]
    assert len(local0) == STEPS and all(abs(a - b) > 1e-6 * a for a, b in zip(local0, local1, strict=True))
    reduced0 = r0.values[("grad", "module.0.weight", "norm")][1]
    assert reduced0 == pytest.approx(r1.values[("grad", "module.0.weight", "norm")][1], rel=1e-6)
    assert all(r <= (a + b) / 2 * (1 + 1e-5) for r, a, b in zip(reduced0, local0, local1, strict=True))
    # rank 1 names its own gradient of the layer, before the all-reduce; rank 0 only the reduced one
    first1 = r1.events[0]
    assert first1.step == K and first1.first.kind == "grad_local", first1.first
    assert first1.first.name.startswith("module.2."), first1.first
    first0 = r0.events[0]
    assert first0.step == K and first0.first.kind == "grad" and first0.first.name.startswith("module.2.")
    assert not any(d.kind == "grad_local" for e in r0.events for d in e.departures)
    assert f"step {K}: own gradients moved before the all-reduce on rank 1 (module.2." in render(data, "text")
