"""Tiny random-config Hugging Face models, trained a few steps under opscope.dump (issue 19).

Nothing is downloaded: every model is built from a config with a fixed seed, so two runs of
one family start from the same weights and see the same batch. A *pair* is a target run that
differs from the plain reference run (fp32, eager attention, two threads) in one way: a benign
change (same run again, threads, bf16 autocast, a bf16 model, sdpa attention, torch.compile with
the eager or the inductor backend, float16 autocast with a GradScaler) or a fault
injected in one place. ``fault_module`` says which module the first divergence should name.

Used by test_real_models.py; ``python real_models.py matrix OUT`` prints the whole matrix
(see real_models_matrix.py); the families are in real_families.py. ``python real_models.py
train JSON`` trains a list of runs in a fresh process: torch.compile runs go there, because a
crash must not take the caller with it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from real_families import FAMILIES, MORE_FAMILIES, VOCAB, WIDER_FAMILIES, Family  # noqa: F401 (the tests read them here)
from real_families_further import FURTHER_FAMILIES
from torch import nn

ALL_FAMILIES: dict[str, Family] = {**FAMILIES, **MORE_FAMILIES, **WIDER_FAMILIES, **FURTHER_FAMILIES}
FAULTS = ("act", "norm_eps", "attn_scale", "weight_row")
# target-run kwargs of each benign pair; every run starts from REFERENCE
BENIGN: dict[str, dict[str, Any]] = {
    "same_twice": {},
    "threads": {"threads": 1},
    "bf16_autocast": {"autocast": True},
    "fp16_amp": {"autocast": "float16"},
    "bf16_model": {"dtype": "bfloat16"},
    "sdpa": {"attn": "sdpa"},
    "compiled": {"compile": True},
    "inductor": {"compile": "inductor"},
    "checkpointing": {"checkpointing": True},
    "checkpointing_reentrant": {"checkpointing": "reentrant"},
}
# A recomputation that does not remake its forward: activation checkpointing without the
# forward's generator state (with dropout on, the recomputed masks differ). Not in the matrix.
RECOMPUTE_FAULTS: dict[str, dict[str, Any]] = {"checkpointing_no_rng": {"checkpointing": "no_rng"}}
# Two threads pinned (not the machine's count) so that "threads 1 vs 2" means the same on
# every machine and the other pairs differ from the reference in one thing only.
REFERENCE: dict[str, Any] = {"attn": "eager", "threads": 2}
# the optimizers a run can train with (train's ``optimizer``)
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
    "adamw_foreach": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True),
    "adamw_fused": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
    "sgd_fused": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True),
    "adafactor": lambda params: torch.optim.Adafactor(params, lr=1e-2),
    "rmsprop": lambda params: torch.optim.RMSprop(params, lr=1e-3),
}
# ROW 1: ResNet's first bottleneck conv has only 2 output channels
NORM_EPS, ATTN_SCALE, ROW_DELTA, ROW = 1e-1, 1.5, 0.05, 1




def pairs(family: str) -> list[str]:
    """The pairs that make sense for ``family``: benign ones first, then faults."""
    fam = ALL_FAMILIES[family]
    attention = fam.attention is not None
    return [p for p in (*BENIGN, *FAULTS)
            if (attention or p not in ("sdpa", "attn_scale")) and (fam.sdpa or p != "sdpa")
            and (fam.scale or p != "attn_scale") and (fam.act or p != "act")
            and (fam.checkpointing or not p.startswith("checkpointing"))]


def fault_module(family: str, fault: str) -> str:
    """The module the first divergence should name for ``fault``.

    act, norm_eps: the swapped activation / the norm itself (its inputs agree, its output not).
    attn_scale: the attention module; the scaled matmul (eager) or the sdpa call happens in a
    function it calls, not in a submodule, and its q/k/v projections still agree.
    weight_row: the module that owns the changed parameter (a root: a parameter that differs
    before any op ran).
    """
    fam = ALL_FAMILIES[family]
    return {"act": fam.act, "norm_eps": fam.norm, "attn_scale": fam.attention or "",
            "weight_row": fam.weight.rsplit(".", 1)[0]}[fault]


def inject(model: nn.Module, family: str, fault: str) -> None:
    """Put ``fault`` into ``model`` in one place (see ``Family``)."""
    fam = ALL_FAMILIES[family]
    if fault == "act":
        model.get_submodule(fam.act).forward = fam.act_swap
    elif fault == "norm_eps":
        norm = model.get_submodule(fam.norm)
        setattr(norm, "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps", NORM_EPS)
    elif fault == "attn_scale" and fam.attention and fam.scale:
        # every attention interface (eager and sdpa) takes scaling=module.scaling (CLIP: .scale)
        attention = model.get_submodule(fam.attention)
        setattr(attention, fam.scale, getattr(attention, fam.scale) * ATTN_SCALE)
    elif fault == "weight_row":
        with torch.no_grad():
            model.get_parameter(fam.weight)[ROW] += ROW_DELTA
    else:
        raise ValueError(f"no fault {fault!r} for {family}")


def run_record(path: Path) -> dict[str, Any]:
    """What ``train`` recorded beside the dump: losses (float.hex, for bit-identity), seconds."""
    return json.loads(Path(f"{path}.run.json").read_text())


def train(family: str, path: Path, *, steps: int = 3, attn: str = "eager", autocast: bool | str = False,
          threads: int | None = None, compile: bool | str = False, level: str = "aten",
          data: str = "statistics", fault: str | None = None, seed: int = 0,
          dtype: str = "float32", dropout: float = 0.0, clip: float | None = None,
          accumulate: int = 1, checkpointing: bool | str = False, fault_at: int = 0,
          optimizer: str = "adamw", pad: str | None = None) -> Path:
    """Build ``family`` from seed, train ``steps`` AdamW steps under opscope.dump, return the dump.

    ``dtype`` other than float32 casts the model (after a fault went in) and the batch's
    floating tensors to it, as a user training a bf16 model does. ``autocast``: True runs
    the forward under bf16 autocast; "float16" under float16 autocast with a
    ``torch.amp.GradScaler`` (its default scale, 65536), the mixed-precision recipe of GPUs.
    ``dropout`` sets every ``nn.Dropout`` of the model to that probability (the configs here
    set 0; real ones mostly 0.1). ``clip``: gradients clipped to that total norm before the
    step (``clip_grad_norm_``, after the scaler unscales them), as Hugging Face's Trainer does
    by default (1.0). ``accumulate``: micro-batches a step (gradient accumulation: the batch
    split in that many, each loss divided by it). ``checkpointing``: activation checkpointing of
    every layer (``activation_checkpointing_enable``: the layers' forward runs again inside the
    backward), non-reentrant as transformers' default; "reentrant" for ``use_reentrant=True``;
    "no_rng" without the forward's generator state (``preserve_rng_state=False``).
    ``fault_at``: the step before which ``fault`` goes in (0: into the model as built).
    ``optimizer``: a key of ``OPTIMIZERS`` (AdamW as CPUs run it by default, one parameter at a
    time; ``adamw_foreach`` as GPUs do, ``_foreach_`` ops over every parameter; ``adamw_fused``
    one op for the whole update; ``sgd``: momentum 0.9, ``sgd_fused`` the same fused).
    ``pad``: "right" or "left" pads the batch's texts as a tokenizer pads texts of unequal
    length (``padded``); families that read no ``input_ids`` train as without it.

    The losses and the run's wall time go to ``PATH.run.json`` (``run_record``).
    """
    import opscope

    start = time.perf_counter()
    fam = ALL_FAMILIES[family]
    torch.manual_seed(seed)
    model = fam.build(attn)
    model.train()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = dropout
    if fault and not fault_at:
        inject(model, family, fault)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing == "reentrant",
                                               "preserve_rng_state": checkpointing != "no_rng"})
    model.to(getattr(torch, dtype))
    batch = {k: v.to(getattr(torch, dtype)) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
             for k, v in padded(fam.batch(torch.Generator().manual_seed(seed)), pad).items()}
    opt = OPTIMIZERS[optimizer](model.parameters())
    # compile=True: backend="eager" (every aten op recorded); a name: that backend
    runner = torch.compile(model, backend="eager" if compile is True else compile) if compile else model
    half = autocast == "float16"
    scaler = torch.amp.GradScaler("cpu", enabled=half)
    old_threads = torch.get_num_threads()
    losses: list[torch.Tensor] = []
    if threads:
        torch.set_num_threads(threads)
    try:
        with opscope.dump(path, steps=list(range(steps)), level=level, data=data,
                          overwrite=True) as d:
            for step in range(steps):
                if fault and fault_at and step == fault_at:  # a fault that begins mid-run
                    inject(model, family, fault)
                opt.zero_grad()
                for part in _micro_batches(batch, accumulate):
                    with torch.autocast("cpu", dtype=torch.float16 if half else torch.bfloat16,
                                        enabled=bool(autocast)):
                        loss = runner(**part).loss / accumulate
                    scaler.scale(loss).backward()
                    losses.append(loss.detach())
                if clip:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                scaler.step(opt)  # opt.step(), unless the scaler found Inf/NaN gradients
                scaler.update()
                d.step()
    finally:
        torch.set_num_threads(old_threads)
    values = [float(v) for v in losses]
    if not all(math.isfinite(v) for v in values):
        raise RuntimeError(f"{family}: non-finite loss {values}")
    seconds = time.perf_counter() - start
    Path(f"{path}.run.json").write_text(json.dumps({
        "family": family, "losses": [v.hex() for v in values], "seconds": round(seconds, 3)}))
    print(f"[real_models] {Path(path).name}: {seconds:.2f}s", file=sys.stderr)
    return Path(path)


def padded(batch: dict[str, Any], side: str | None) -> dict[str, Any]:
    """``batch`` as a tokenizer pads texts of unequal length on ``side``: row i keeps SEQ - 3i
    tokens, the rest are the pad token (0), masked out by an ``attention_mask`` and, where the
    labels follow the input, left out of the loss (-100). ``side`` None: the batch as it is."""
    ids = batch.get("input_ids")
    if side is None or ids is None:
        return batch
    rows, seq = ids.shape
    keep = torch.tensor([seq - 3 * i for i in range(rows)])[:, None]
    pos = torch.arange(seq)[None]
    real = pos < keep if side == "right" else pos >= seq - keep
    out = {**batch, "input_ids": ids.masked_fill(~real, 0), "attention_mask": real.long()}
    labels = batch.get("labels")
    if labels is not None and labels.shape == ids.shape:
        out["labels"] = labels.masked_fill(~real, -100)
    return out


def _micro_batches(batch: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    if n == 1:
        return [batch]
    return [{k: v.chunk(n)[i] if isinstance(v, torch.Tensor) else v for k, v in batch.items()} for i in range(n)]


def train_in_subprocesses(specs: list[dict[str, Any]], *, timeout: float = 900) -> dict[str, str]:
    """``train(**spec)`` for each spec, in order, in fresh interpreters; returns {path: why} of failures.

    One interpreter runs them all (importing torch and transformers once); when one run kills
    it (torch.compile under capture can die of SIGSEGV), that run is reported and the rest go
    on in a new interpreter.
    """
    for spec in specs:
        Path(f"{spec['path']}.run.json").unlink(missing_ok=True)
    failures: dict[str, str] = {}
    todo = list(specs)
    while todo:
        try:
            done = subprocess.run([sys.executable, __file__, "train", json.dumps(todo, default=str)],
                                  capture_output=True, text=True, timeout=timeout)
            what, stderr = (f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}",
                            done.stderr)
        except subprocess.TimeoutExpired as exc:  # (Funnel under inductor: its compile runs for hours)
            what, stderr = f"timed out after {timeout:.0f} s", str(exc.stderr or "")
        todo = [s for s in todo if not Path(f"{s['path']}.run.json").exists()]
        if todo:
            failures[str(todo[0]["path"])] = f"crash ({what}): {stderr[-2000:]}"
            todo = todo[1:]
    return failures


def pair_spec(family: str, pair: str, path: Path, **kwargs: Any) -> dict[str, Any]:
    """The ``train`` kwargs of the target run of ``pair`` (family and path included).

    ``kwargs`` change the base run (data mode, level, sdpa on both sides); the pair's own change
    is applied last. ``a+b`` makes both changes (``bf16_model+weight_row``: a fault in a bf16
    model, against the float32 reference).
    """
    spec = {**REFERENCE, **kwargs, "family": family, "path": path}
    for part in pair.split("+"):
        spec.update(BENIGN.get(part, RECOMPUTE_FAULTS.get(part, {})))
        if part in FAULTS:
            spec["fault"] = part
    return spec


def run_pair(family: str, pair: str, path: Path, **kwargs: Any) -> Path:
    """The target run of ``pair``; compiled runs go to a subprocess (RuntimeError if it fails)."""
    spec = pair_spec(family, pair, path, **kwargs)
    if not spec.get("compile"):
        return train(spec.pop("family"), spec.pop("path"), **spec)
    failures = train_in_subprocesses([spec])
    if failures:
        raise RuntimeError(failures[str(path)])
    return Path(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        for spec in json.loads(sys.argv[2]):
            train(spec.pop("family"), Path(spec.pop("path")), **spec)
    elif sys.argv[1:2] == ["matrix"]:
        sys.path.insert(0, str(Path(__file__).parent))
        from real_models_matrix import main

        sys.exit(main(sys.argv[2:]))
    else:
        sys.exit(f"usage: {sys.argv[0]} train JSON | matrix OUT [--families ...] [--modes ...]")
