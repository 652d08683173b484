"""`opscope run -- torchrun --nproc_per_node 2`: gloo, DDP on CPU, a script that never imports opscope.

Only the ranks in the dump's ``ranks`` dump, every rank profiles, torchrun's agent writes
nothing, and ``opscope check-ranks`` passes on a healthy run and names the parameter whose
gradient one rank changed after the all-reduce.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

TRAIN = textwrap.dedent(
    """
    import os, time, torch, torch.distributed as dist
    from torch import nn
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    perturb = os.environ.get("PERTURB_GRAD")  # a parameter name: rank 1 changes its gradient at step 1
    data = torch.Generator().manual_seed(rank)
    for step in range(3):
        loss = model(torch.randn(16, 8, generator=data)).square().mean()
        opt.zero_grad()
        loss.backward()
        if perturb and rank == 1 and step == 1:
            with torch.no_grad():
                dict(model.named_parameters())[perturb].grad.mul_(1.01)
        opt.step()
    print(f"rank {rank}: trained", flush=True)
    time.sleep(0.2)  # gloo's threads free their works first (test_monitor_ddp.gloo_settle: torch 2.13)
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path, config: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "ddp_train.py"
    script.write_text(TRAIN)
    cfg = tmp_path / "opscope.json"
    cfg.write_text(json.dumps(config))
    cmd = [sys.executable, "-m", "opscope", "run", "-c", str(cfg), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script)]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("OPSCOPE_CONFIG", None)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=full_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def check_ranks(dump) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opscope", "check-ranks", str(dump)], capture_output=True,
                          text=True, timeout=120)


def test_only_the_chosen_rank_dumps_and_every_rank_profiles(tmp_path) -> None:
    config = {"dump": {"path": "dump", "ranks": [1], "level": "module"},
              "profile": {"output": "prof", "merge_timeout": 60}}
    done = torchrun(tmp_path, config)
    assert "opscope" not in TRAIN and "rank 0: trained" in done.stdout and "rank 1: trained" in done.stdout
    dump = tmp_path / "dump"
    assert sorted(p.name for p in dump.glob("rank*")) == ["rank1"]  # neither rank 0 nor the agent
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["run_id"]
    rank1 = json.loads((dump / "rank1" / "rank.json").read_text())
    assert rank1["status"] == "complete" and rank1["steps"] == [0, 1, 2]
    for rank in (0, 1):
        summary = json.loads((tmp_path / "prof" / f"rank{rank}" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["steps"]["recorded"] == 3
    assert json.loads((tmp_path / "prof" / "summary.json").read_text())["ranks"] == [0, 1]

    one_rank = check_ranks(dump)
    assert one_rank.returncode == 2, one_rank.stdout + one_rank.stderr
    assert "only rank 1 wrote" in one_rank.stdout


def test_check_ranks_passes_on_a_healthy_run(tmp_path) -> None:
    torchrun(tmp_path, {"dump": {"path": "dump", "level": "module"}})
    done = check_ranks(tmp_path / "dump")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical across ranks 0, 1: 4 parameters in steps 0-2" in done.stdout


def test_check_ranks_names_the_parameter_whose_gradient_one_rank_changed(tmp_path) -> None:
    torchrun(tmp_path, {"dump": {"path": "dump", "level": "module"}}, env={"PERTURB_GRAD": "module.2.weight"})
    done = check_ranks(tmp_path / "dump")
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first == ("ranks differ: first at step 1, parameter 'module.2.weight', grad (gradient at "
                     "optimizer.step, after the all-reduce): rank 1 differs from rank 0"), done.stdout
    assert "relative L2 distance >= 0.0099" in done.stdout  # the gradient was scaled by 1.01
