"""Two ranks under torchrun with gloo on CPU: per-rank folders, merged summary, slowest rank."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

TRAIN = textwrap.dedent(
    '''
    import sys, time, torch, torch.distributed as dist
    from torch import nn
    import opscope
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
        def forward(self, x):
            if rank == 1:
                time.sleep(0.02)  # rank 1 is the straggler
            return self.body(x)

    model = nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=0.05)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with opscope.profile(sys.argv[1], steps="3-4", task_trace=True) as p:
        for i in range(10):
            loss = model(torch.randn(32, 64)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            p.step()
    time.sleep(0.2)  # gloo's threads free their works first (test_monitor_ddp.gloo_settle: torch 2.13)
    dist.destroy_process_group()
    '''
)

def read_trace(path):
    with gzip.open(path, "rt") as handle:
        return json.load(handle)



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_gloo(tmp_path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(TRAIN)
    out = tmp_path / "prof"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}" / "summary.json").read_text())["status"] == "complete"
    merged = json.loads((out / "summary.json").read_text())
    assert merged["ranks"] == [0, 1] and merged["status"] == "complete"
    slow = merged["slowest_ranks"]
    assert slow["counts"].get("1", 0) >= 8, slow
    per_rank = {r: json.loads((out / f"rank{r}" / "summary.json").read_text()) for r in (0, 1)}
    # Rank 0 waits for the straggler in DDP's bucket all-reduce: exposed communication.
    assert per_rank[0]["phases"]["communication"]["median_ms"] > 10
    assert per_rank[1]["phases"]["forward"]["median_ms"] > 18
    show = subprocess.run([sys.executable, "-m", "opscope", "profile", "show", str(out)], capture_output=True,
                          text=True, timeout=60)
    assert show.returncode == 0 and "slowest rank per step: rank 1" in show.stdout

    trace = read_trace(out / "trace.json.gz")
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
