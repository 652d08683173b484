"""Dump overhead on Hugging Face models, against the bare training loop, in one invocation.

``bench_dump.py`` measures issue 18's rows on opscope's own models (a 2-layer transformer and an
MLP). Users dump third-party models, whose steps hold what those two lack: SDPA attention with
its permuted outputs, rotary embeddings, grouped-query attention, ``ModelOutput`` and cache
objects passed between modules, bf16 autocast. This script builds tiny random configs of real
families (nothing is downloaded: hidden size 256, 2 layers, batch 4 x 128 tokens, AdamW) and
prints, for each, the ratio of a dumped step to the bare one for statistics at the aten, api and
module levels and at the aten level under bf16 autocast, with the floor under each row (the
statistics kernel's own time in the dumped steps, ``timing.floor_text``), and whether the losses
of the dumped runs are bit-identical to the bare ones. The demo transformer of ``bench_dump.py``
runs first, as the reference in the same invocation.

Runs are interleaved (bare then dumped, dumped then bare, ...) and each side's median step is
taken; the first two steps of each run are dropped. One thread (``torch.set_num_threads(1)``).

    python benchmarks/bench_dump_real.py [--steps 12] [--rounds 4] [--families llama gpt2 bert]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from timing import KernelSteps, floor_text, host_text

import opscope
from opscope.demo.models import train_step, transformer_task

VOCAB, BATCH, SEQ = 1024, 4, 128
_LM = {"vocab_size": VOCAB, "max_position_embeddings": 2 * SEQ, "tie_word_embeddings": False}
# family -> (model class, config class, config, batch kind); the configs' dropout off, as the
# real-model tests set it, so that a bare and a dumped run see the same numbers
MODELS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              {**_LM, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2}, "causal"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             {"vocab_size": VOCAB, "n_positions": 2 * SEQ, "n_embd": 256, "n_layer": 2, "n_head": 4,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 1, "eos_token_id": 2},
             "causal"),
    "bert": ("BertForMaskedLM", "BertConfig",
             {"vocab_size": VOCAB, "max_position_embeddings": 2 * SEQ, "hidden_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 1024,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}, "masked"),
}
CASES: list[tuple[str, dict[str, Any], bool]] = [  # (label, dump keys, bf16 autocast)
    ("statistics, aten level", {"level": "aten"}, False),
    ("statistics, api level", {"level": "api"}, False),
    ("statistics, module level", {"level": "module"}, False),
    ("statistics, aten level, bf16 autocast", {"level": "aten"}, True),
]

# a task: () -> (a step function of the step index returning its loss, the model's size in parameters)
Task = Callable[[], tuple[Callable[[int], float], int]]


def hf_task(family: str) -> Task:
    """A Hugging Face model of ``family`` (SDPA attention) with AdamW, the same weights at each call."""
    import transformers

    cls, cfg_cls, cfg, kind = MODELS[family]

    def make() -> tuple[Callable[[int], float], int]:
        torch.manual_seed(0)
        config = getattr(transformers, cfg_cls)(**cfg)
        config._attn_implementation = "sdpa"
        model = getattr(transformers, cls)(config).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(1)
        batches = [_batch(kind, gen) for _ in range(4)]

        def step(i: int) -> float:
            loss = model(**batches[i % len(batches)]).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return float(loss.detach())  # (as demo.models.train_step returns it)
        return step, sum(p.numel() for p in model.parameters())
    return make


def _batch(kind: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
    if kind == "causal":
        return {"input_ids": ids, "labels": ids.clone()}
    masked = torch.rand(BATCH, SEQ, generator=gen) < 0.15
    masked[:, 0] = True
    return {"input_ids": torch.where(masked, torch.full_like(ids, 4), ids),
            "labels": torch.where(masked, ids, torch.full_like(ids, -100))}


def demo_task() -> tuple[Callable[[int], float], int]:
    """bench_dump.py's transformer step (``demo.models.train_step``), as the reference."""
    torch.manual_seed(0)
    model, opt, batch = transformer_task()
    return (lambda i: train_step(model, opt, *batch(i))), sum(p.numel() for p in model.parameters())


def _run(task: Task, n: int, keys: dict[str, Any] | None, bf16: bool, root: str) -> dict[str, Any]:
    """One loop of ``n`` steps: each step's training-thread CPU and wall seconds, its loss, and
    with a dump the statistics kernel's (seconds, bytes) of each step."""
    step, _ = task()
    got: dict[str, Any] = {"cpu": [], "wall": [], "loss": []}
    clock = KernelSteps(on=keys is not None)
    dump = opscope.dump(os.path.join(root, "dump"), overwrite=True, **keys) if keys is not None else None
    with dump if dump is not None else contextlib.nullcontext() as d, clock:
        for i in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            clock.begin()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                got["loss"].append(step(i))
            if d is not None:
                d.step()
            got["wall"].append(time.perf_counter() - t0)
            got["cpu"].append(time.thread_time() - c0)
            clock.end()
    got["kernel"] = clock.steps
    return got


def measure(task: Task, n: int, keys: dict[str, Any], bf16: bool, root: str, rounds: int) -> str:
    """The row of one case: dumped over bare (training thread's CPU, then wall), the rounds'
    spread, whether the losses are bit-identical, and the floor line."""
    side: dict[bool, dict[str, list[Any]]] = {s: {"cpu": [], "wall": [], "kernel": []} for s in (False, True)}
    pairs, same = [], True
    for r in range(rounds):
        runs = {}
        for dumping in ((False, True) if r % 2 == 0 else (True, False)):
            runs[dumping] = _run(task, n, keys if dumping else None, bf16, root)
            for key in ("cpu", "wall", "kernel"):
                side[dumping][key] += runs[dumping][key][2:]
        same = same and runs[True]["loss"] == runs[False]["loss"]
        pairs.append(statistics.median(runs[True]["cpu"][2:]) / statistics.median(runs[False]["cpu"][2:]))
    cpu = statistics.median(side[True]["cpu"]) / statistics.median(side[False]["cpu"])
    wall = statistics.median(side[True]["wall"]) / statistics.median(side[False]["wall"])
    bare_ms = statistics.median(side[False]["cpu"]) * 1e3
    return (f"{cpu:5.2f}x  (rounds {min(pairs):.2f}..{max(pairs):.2f}; wall {wall:.2f}x; bare step "
            f"{bare_ms:.1f} ms of CPU; losses {'identical' if same else 'DIFFER'})\n"
            f"{'':42s}{floor_text(side[True]['kernel'], statistics.median(side[False]['wall']))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved runs per side (even: both orders)")
    parser.add_argument("--families", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()  # (the tiny configs' notices)
    print(f"torch {torch.__version__}, torch.set_num_threads(1); {host_text()}; {args.steps} steps x "
          f"{args.rounds} rounds, order alternating; load average {os.getloadavg()[0]:.1f} at the start")
    tasks: dict[str, Task] = {"demo": demo_task, **{f: hf_task(f) for f in args.families}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("OPSCOPE_BENCH_DIR")) as root:
        for name, task in tasks.items():
            print(f"{name} ({task()[1] / 1e6:.2f}M parameters)")
            for label, keys, bf16 in CASES:
                print(f"  {label:40s}{measure(task, args.steps, keys, bf16, root, args.rounds)}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
