"""Train a tiny model for two steps under msprobe (mindstudio-probe) or opscope, with a fault
on request. Run as a script, one dump per process (msprobe's debugger is a process-wide
singleton that wraps torch's APIs):

    python msprobe_runs.py OUT [--tool msprobe|opscope] [--task statistics|tensor]
        [--level L1|mix|L0] [--summary statistics|md5] [--fault none|act|weight] [--insert]
        [--bf16] [--model block|gpt2]
    python msprobe_runs.py --many CASES.json   # [[OUT, [ARGS...]], ...]: torch and msprobe
                                               # imported once, one forked process per dump

``--fault act``: layer 1's GELU uses the tanh approximation (the same API, other numbers;
with ``--model gpt2``, layer 1's second layer norm another epsilon);
``--fault weight``: layer 1's fc weight is off by 1% before training; ``--insert``: layer 1
runs an extra ``h * 1.0`` (msprobe's counter of ``Tensor.__mul__`` shifts by one).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, index: int, args: argparse.Namespace) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.faulty = index == 1 and args.fault == "act"
        self.insert = index == 1 and args.insert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x), approximate="tanh" if self.faulty else "none")
        if self.insert:
            h = h * 1.0
        h = h * 0.5
        return self.norm(h + x)


class Net(nn.Module):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(i, args) for i in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(args: argparse.Namespace) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model: nn.Module = GPT2LMHeadModel(cfg)
        if args.fault == "act":  # layer 1's second layer norm: another epsilon, the same API
            model.transformer.h[1].ln_2.eps = 1e-2
        def batch() -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 64, (2, 12))
            return {"input_ids": ids, "labels": ids}
        return model, batch
    model = Net(args)
    if args.fault == "weight":
        with torch.no_grad():
            model.layers[1].fc.weight.mul_(1.01)
    def simple() -> dict[str, torch.Tensor]:
        return {"x": torch.randn(8, 16), "y": torch.randint(0, 4, (8,))}
    return model, simple


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor], args: argparse.Namespace) -> torch.Tensor:
    if args.model == "gpt2":
        return model(**batch).loss
    x = batch["x"].to(torch.bfloat16) if args.bf16 else batch["x"]
    return F.cross_entropy(model(x).float(), batch["y"])


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tool", default="msprobe", choices=["msprobe", "opscope"])
    parser.add_argument("--task", default="statistics", choices=["statistics", "tensor"])
    parser.add_argument("--level", default="mix", choices=["L0", "L1", "mix"])
    parser.add_argument("--summary", default="statistics", choices=["statistics", "md5"])
    parser.add_argument("--fault", default="none", choices=["none", "act", "weight"])
    parser.add_argument("--insert", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--model", default="block", choices=["block", "gpt2"])
    parser.add_argument("--steps", type=int, default=2)
    return parser.parse_args(argv)


def many(cases: list[tuple[str, list[str]]], parallel: int = 2) -> int:
    """Each case in a child forked after the imports (msprobe's debugger is created in the
    child, so every dump starts from a clean debugger); returns how many failed."""
    import os

    import msprobe.pytorch  # noqa: F401 - imported once, before the forks

    import opscope  # noqa: F401

    failed, running = 0, set()
    for out, argv in cases:
        if len(running) >= parallel:
            pid, status = os.wait()
            running.discard(pid)
            failed += status != 0
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                run(parse([out, *argv]))
                code = 0
            finally:
                os._exit(code)
        running.add(pid)
    for pid in running:
        failed += os.waitpid(pid, 0)[1] != 0
    return failed


def main() -> None:
    import sys

    if sys.argv[1:2] == ["--many"]:
        sys.exit(many(json.loads(Path(sys.argv[2]).read_text())))
    run(parse(sys.argv[1:]))


def run(args: argparse.Namespace) -> None:
    model, batches = build(args)
    if args.bf16:
        model = model.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [batches() for _ in range(args.steps)]
    if args.tool == "opscope":
        import opscope

        with opscope.dump(args.out, level="api", data=args.task, overwrite=True) as d:
            for batch in data:
                loss_of(model, batch, args).backward()
                opt.step()
                opt.zero_grad()
                d.step()
        return
    from msprobe.pytorch import PrecisionDebugger

    config = Path(args.out + ".config.json")
    config.write_text(json.dumps({
        "task": args.task, "dump_path": args.out, "rank": [], "step": [], "level": args.level,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": args.summary},
        "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}))
    debugger = PrecisionDebugger(config_path=str(config))
    for batch in data:
        debugger.start(model=model)
        loss_of(model, batch, args).backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()


if __name__ == "__main__":
    main()
