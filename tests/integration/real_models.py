"""Tiny random-config Hugging Face models, trained a few steps under opscope.dump (issue 19).

Nothing is downloaded: every model is built from a config with a fixed seed, so two runs of
one family start from the same weights and see the same batch. A *pair* is a target run that
differs from the plain reference run (fp32, eager attention, two threads) in one way: a benign
change (same run again, threads, bf16 autocast, a bf16 model, sdpa attention, torch.compile with
the eager or the inductor backend, float16 autocast with a GradScaler) or a fault
injected in one place. ``fault_module`` says which module the first divergence should name.

Used by test_real_models.py; ``python real_models.py matrix OUT`` prints the whole matrix
(see real_models_matrix.py). ``python real_models.py train JSON`` trains a list of runs in a fresh
process: torch.compile runs go there, because a crash must not take the caller with it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, BATCH, IMAGE, LABELS, MELS, CTC_VOCAB = 64, 16, 4, 32, 4, 8, 16
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
# ROW 1: ResNet's first bottleneck conv has only 2 output channels
NORM_EPS, ATTN_SCALE, ROW_DELTA, ROW = 1e-1, 1.5, 0.05, 1


@dataclass(frozen=True)
class Family:
    """How to build one family and where its faults go (module paths in layer 1, parameter in layer 0).

    ``act_swap`` replaces the activation's ``forward`` on that instance only, so the module
    keeps its path and class (a swapped class would change what module level records) and
    every other layer keeps the real activation.
    """

    build: Callable[[str], nn.Module]
    batch: Callable[[torch.Generator], dict[str, torch.Tensor]]
    act: str
    act_swap: Callable[[torch.Tensor], torch.Tensor]
    norm: str
    attention: str | None  # None: the family has no attention (no sdpa pair, no attn_scale)
    weight: str
    sdpa: bool = True  # transformers has an sdpa attention for it (Gemma 2's soft-capping: no)
    checkpointing: bool = True  # its model supports activation checkpointing (ResNet, ConvNeXt: no)


def _causal_lm(gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def _masked_lm(gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
    masked = torch.rand(BATCH, SEQ, generator=gen) < 0.3
    masked[:, 0] = True  # every row has a label
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(masked, torch.full_like(ids, 4), ids), "labels": labels}


def _seq2seq(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen),
            "labels": torch.randint(1, VOCAB, (BATCH, SEQ // 2), generator=gen)}


def _images(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen),
            "labels": torch.randint(0, LABELS, (BATCH,), generator=gen)}


def _speech(gen: torch.Generator) -> dict[str, torch.Tensor]:
    # Whisper: log-mel features of 2 * max_source_positions frames (its convs halve them)
    return {"input_features": torch.randn(BATCH, MELS, 2 * SEQ, generator=gen),
            "labels": torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=gen)}


def _audio_ctc(gen: torch.Generator) -> dict[str, torch.Tensor]:
    # Wav2Vec2 for CTC: a raw waveform (its conv stack makes 39 frames of 400 samples) and
    # a transcript of 8 tokens (1..15; 0 is the blank)
    return {"input_values": torch.randn(BATCH, 400, generator=gen),
            "labels": torch.randint(1, CTC_VOCAB, (BATCH, 8), generator=gen)}


def _model(cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[str], nn.Module]:
    def build(attn: str) -> nn.Module:
        import transformers

        config = getattr(transformers, cfg_name)(**cfg)
        config._attn_implementation = attn
        return getattr(transformers, cls_name)(config)
    return build


# The swapped activation must change the function's shape, not only its rounding: with the
# Hugging Face init (std 0.02) pre-activations are ~0.1, where GELU's tanh approximation and
# exact GELU agree to float32 rounding (tried: GPT-2 and BERT losses came out bit-identical).
# SiLU and GELU differ by ~0.15 x^2 there, a few percent of the output.
def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


_LM = {"vocab_size": VOCAB, "max_position_embeddings": 2 * SEQ, "bos_token_id": 1,
       "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
_LLAMA = {**_LM, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2}  # GQA: 2 kv heads for 4 heads

FAMILIES: dict[str, Family] = {
    # gelu_new: the tanh formula in Python ops (pow, mul, tanh, ...); the fault is one SiLU.
    "gpt2": Family(
        _model("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=32,
               n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
               bos_token_id=1, eos_token_id=2),
        _causal_lm, "transformer.h.1.mlp.act", _silu, "transformer.h.1.ln_1",
        "transformer.h.1.attn", "transformer.h.0.mlp.c_fc.weight"),
    "llama": Family(
        _model("LlamaForCausalLM", "LlamaConfig", **_LLAMA),
        _causal_lm, "model.layers.1.mlp.act_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mlp.up_proj.weight"),
    "bert": Family(
        _model("BertForMaskedLM", "BertConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, max_position_embeddings=2 * SEQ,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0),
        _masked_lm, "bert.encoder.layer.1.intermediate.intermediate_act_fn", _silu,
        "bert.encoder.layer.1.attention.output.LayerNorm", "bert.encoder.layer.1.attention.self",
        "bert.encoder.layer.0.intermediate.dense.weight"),
    # T5 over BART: relative position bias made in block 0 and reused by block 1, RMS-style
    # T5LayerNorm, no attention scaling (1.0): shapes of data flow the others do not have.
    # One decoder block (the faults are in the encoder): T5 is the largest graph here.
    "t5": Family(
        _model("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB, d_model=32, d_kv=16,
               d_ff=64, num_layers=2, num_decoder_layers=1, num_heads=2, dropout_rate=0.0,
               relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
               eos_token_id=2, tie_word_embeddings=False),
        _seq2seq, "encoder.block.1.layer.1.DenseReluDense.act", _gelu,
        "encoder.block.1.layer.0.layer_norm", "encoder.block.1.layer.0.SelfAttention",
        "encoder.block.0.layer.1.DenseReluDense.wi.weight"),
    # Bottleneck layers with BatchNorm; hidden_sizes [8, 16] give 2 and 4 reduced channels.
    "resnet": Family(
        _model("ResNetForImageClassification", "ResNetConfig", num_channels=3, embedding_size=8,
               hidden_sizes=[8, 16], depths=[1, 1], num_labels=LABELS),
        _images, "resnet.encoder.stages.1.layers.0.layer.0.activation", _gelu,
        "resnet.encoder.stages.1.layers.0.layer.0.normalization", None,
        "resnet.encoder.stages.0.layers.0.layer.0.convolution.weight", checkpointing=False),
    "vit": Family(
        _model("ViTForImageClassification", "ViTConfig", image_size=IMAGE, patch_size=8,
               hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               num_labels=LABELS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        _images, "vit.layers.1.mlp.activation_fn", _silu, "vit.layers.1.layernorm_before",
        "vit.layers.1.attention", "vit.layers.0.mlp.fc1.weight"),
    # experts_implementation="eager": the reference per-expert loop, which calls the act_fn
    # module once per expert hit (grouped_mm, the default, is a CPU fallback of a GPU kernel).
    "mixtral": Family(
        _model("MixtralForCausalLM", "MixtralConfig", **_LLAMA, num_local_experts=4,
               num_experts_per_tok=2, experts_implementation="eager"),
        _causal_lm, "model.layers.1.mlp.experts.act_fn", _gelu,
        "model.layers.1.input_layernorm", "model.layers.1.self_attn",
        "model.layers.0.self_attn.q_proj.weight"),
}


# Families the matrix script runs beside the seven above (``--families``); the tests run a
# subset of pairs on them (test_real_models.py, "More families"). Each brings data flow the
# seven lack: Qwen3's per-head q/k RMSNorm; Gemma 2's (1 + w) RMSNorm, four norms a layer,
# scaled embeddings and tanh soft-capping of the attention scores and the logits; GPT-NeoX's
# fused qkv, partial rotary and parallel residual; Whisper's conv front end on audio
# features; Swin's shifted windows (roll, a mask of -100); Wav2Vec2's conv feature
# extractor, its weight-normed positional conv (a parametrization: the weight is computed
# from two parameters each forward) and CTC loss; ConvNeXt's depthwise convs,
# channels-last LayerNorm and layer scale; DeBERTa-v2's disentangled relative attention.
_QWEN = {**_LLAMA, "head_dim": 8}
MORE_FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        _model("Qwen3ForCausalLM", "Qwen3Config", **_QWEN),
        _causal_lm, "model.layers.1.mlp.act_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mlp.up_proj.weight"),
    "gemma2": Family(
        _model("Gemma2ForCausalLM", "Gemma2Config", **_QWEN),
        _causal_lm, "model.layers.1.mlp.act_fn", _silu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mlp.up_proj.weight", sdpa=False),
    "gpt_neox": Family(
        _model("GPTNeoXForCausalLM", "GPTNeoXConfig", **_LLAMA, rotary_pct=0.25, hidden_dropout=0.0,
               attention_dropout=0.0),
        _causal_lm, "gpt_neox.layers.1.mlp.act", _silu, "gpt_neox.layers.1.input_layernorm",
        "gpt_neox.layers.1.attention", "gpt_neox.layers.0.mlp.dense_h_to_4h.weight"),
    "whisper": Family(
        _model("WhisperForConditionalGeneration", "WhisperConfig", vocab_size=VOCAB, d_model=32,
               encoder_layers=2, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
               encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=MELS, max_source_positions=SEQ,
               max_target_positions=SEQ, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
        _speech, "model.encoder.layers.1.activation_fn", _silu, "model.encoder.layers.1.self_attn_layer_norm",
        "model.encoder.layers.1.self_attn", "model.encoder.layers.0.fc1.weight"),
    "swin": Family(
        _model("SwinForImageClassification", "SwinConfig", image_size=IMAGE, patch_size=4, embed_dim=16,
               depths=[2, 1], num_heads=[2, 2], window_size=4, num_labels=LABELS, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, drop_path_rate=0.0),
        _images, "swin.encoder.layers.0.blocks.1.mlp.activation_fn", _silu,
        "swin.encoder.layers.0.blocks.1.layernorm_before", "swin.encoder.layers.0.blocks.1.attention",
        "swin.encoder.layers.0.blocks.0.mlp.fc1.weight"),
    "wav2vec2": Family(
        _model("Wav2Vec2ForCTC", "Wav2Vec2Config", vocab_size=CTC_VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
               conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
               pad_token_id=0, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0,
               ctc_loss_reduction="mean"),
        _audio_ctc, "wav2vec2.encoder.layers.1.feed_forward.intermediate_act_fn", _silu,
        "wav2vec2.encoder.layers.1.layer_norm", "wav2vec2.encoder.layers.1.attention",
        "wav2vec2.encoder.layers.0.feed_forward.intermediate_dense.weight"),
    "convnext": Family(
        _model("ConvNextForImageClassification", "ConvNextConfig", num_channels=3, hidden_sizes=[8, 16],
               depths=[1, 1], num_stages=2, num_labels=LABELS, image_size=IMAGE),
        _images, "convnext.encoder.stages.1.layers.0.act", _silu, "convnext.encoder.stages.1.layers.0.layernorm",
        None, "convnext.encoder.stages.0.layers.0.pwconv1.weight", checkpointing=False),
    "deberta": Family(
        _model("DebertaV2ForMaskedLM", "DebertaV2Config", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, max_position_embeddings=2 * SEQ,
               relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0),
        _masked_lm, "deberta.encoder.layer.1.intermediate.intermediate_act_fn", _silu,
        "deberta.encoder.layer.1.attention.output.LayerNorm", None,
        "deberta.encoder.layer.0.intermediate.dense.weight"),
}
ALL_FAMILIES: dict[str, Family] = {**FAMILIES, **MORE_FAMILIES}


def pairs(family: str) -> list[str]:
    """The pairs that make sense for ``family``: benign ones first, then faults."""
    fam = ALL_FAMILIES[family]
    attention = fam.attention is not None
    return [p for p in (*BENIGN, *FAULTS)
            if (attention or p not in ("sdpa", "attn_scale")) and (fam.sdpa or p != "sdpa")
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
    elif fault == "attn_scale" and fam.attention:
        # every attention interface (eager and sdpa) takes scaling=module.scaling
        attention = model.get_submodule(fam.attention)
        attention.scaling = attention.scaling * ATTN_SCALE
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
          accumulate: int = 1, checkpointing: bool | str = False) -> Path:
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
    if fault:
        inject(model, family, fault)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": checkpointing == "reentrant",
                                               "preserve_rng_state": checkpointing != "no_rng"})
    model.to(getattr(torch, dtype))
    batch = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v
             for k, v in fam.batch(torch.Generator().manual_seed(seed)).items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
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
            for _ in range(steps):
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


def _micro_batches(batch: dict[str, torch.Tensor], n: int) -> list[dict[str, torch.Tensor]]:
    if n == 1:
        return [batch]
    return [{k: v.chunk(n)[i] for k, v in batch.items()} for i in range(n)]


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
        done = subprocess.run([sys.executable, __file__, "train", json.dumps(todo, default=str)],
                              capture_output=True, text=True, timeout=timeout)
        todo = [s for s in todo if not Path(f"{s['path']}.run.json").exists()]
        if todo:
            code = done.returncode
            what = f"signal {-code}" if code < 0 else f"exit {code}"
            failures[str(todo[0]["path"])] = f"crash ({what}): {done.stderr[-2000:]}"
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
