"""The Hugging Face families that real_models.py trains: tiny random configs (nothing is
downloaded), each with where its faults go. ``FAMILIES``: the seven the verdict rules were
first measured on; ``MORE_FAMILIES`` and ``WIDER_FAMILIES``: the matrix script's others, each
bringing data flow the first seven lack."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, BATCH, IMAGE, LABELS, MELS, CTC_VOCAB = 64, 16, 4, 32, 4, 8, 16


@dataclass(frozen=True)
class Family:
    """How to build one family and where its faults go (module paths in layer 1, parameter in layer 0).

    ``act_swap`` replaces the activation's ``forward`` on that instance only, so the module
    keeps its path and class (a swapped class would change what module level records) and
    every other layer keeps the real activation.
    """

    build: Callable[[str], nn.Module]
    batch: Callable[[torch.Generator], dict[str, Any]]
    act: str  # "": none that the model calls (Mamba's kernels call F.silu): no "act" pair
    act_swap: Callable[[torch.Tensor], torch.Tensor]
    norm: str
    attention: str | None  # None: the family has no attention (no sdpa pair, no attn_scale)
    weight: str
    sdpa: bool = True  # transformers has an sdpa attention for it (Gemma 2's soft-capping: no)
    scale: str | None = "scaling"  # the attention's scale attribute (attn_scale); None: written inline
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
def _seq2seq_bart(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen),
            "labels": torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=gen)}


def _image_text(gen: torch.Generator) -> dict[str, Any]:
    # CLIP: captions and images, its contrastive loss over the batch
    return {"input_ids": torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen),
            "pixel_values": torch.randn(BATCH, 3, IMAGE, IMAGE, generator=gen), "return_loss": True}


# Families of the matrix script beside those above (``--families``), none of them in the tests:
# Mamba's selective scan (no attention: the reference PyTorch loop over the sequence, its
# causal depthwise conv, softplus); DeepSeek-V3's multi-head latent attention (low-rank
# q/kv with their own norms, a rotary part split off) and group-limited routing with a
# shared expert and a dense first layer; Qwen2-MoE's shared expert gated by a sigmoid;
# Phi-3's fused qkv and gate_up projections; Falcon's parallel attention and MLP from one
# norm; ModernBERT's alternating local (sliding window) and global attention with its own
# unpadded masks; BART's learned positions and encoder-decoder; CLIP's two towers and its
# contrastive loss (logits of every caption against every image, a learnt temperature).
_MOE = {"moe_intermediate_size": 32, "num_experts_per_tok": 2, "experts_implementation": "eager"}
WIDER_FAMILIES: dict[str, Family] = {
    "mamba": Family(
        _model("MambaForCausalLM", "MambaConfig", vocab_size=VOCAB, hidden_size=32, state_size=8,
               num_hidden_layers=2, expand=2, conv_kernel=4, bos_token_id=1, eos_token_id=2, pad_token_id=0,
               use_cache=False),
        _causal_lm, "", _gelu, "backbone.layers.1.norm", None,  # (its act module: unused, F.silu)
        "backbone.layers.0.mixer.in_proj.weight"),
    "deepseek_v3": Family(
        _model("DeepseekV3ForCausalLM", "DeepseekV3Config", **{**_LLAMA, "num_key_value_heads": 4}, **_MOE,
               n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
               kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8),
        _causal_lm, "model.layers.1.mlp.experts.act_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mlp.up_proj.weight"),
    "qwen2_moe": Family(
        _model("Qwen2MoeForCausalLM", "Qwen2MoeConfig", **_LLAMA, **_MOE, shared_expert_intermediate_size=32,
               num_experts=4, decoder_sparse_step=1),
        _causal_lm, "model.layers.1.mlp.experts.act_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.self_attn.q_proj.weight"),
    "phi3": Family(
        _model("Phi3ForCausalLM", "Phi3Config", **_LLAMA, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
        _causal_lm, "model.layers.1.mlp.activation_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mlp.gate_up_proj.weight"),
    "falcon": Family(
        _model("FalconForCausalLM", "FalconConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=4, new_decoder_architecture=False, parallel_attn=True, alibi=False,
               hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=1, eos_token_id=2),
        _causal_lm, "transformer.h.1.mlp.act", _silu, "transformer.h.1.input_layernorm",
        "transformer.h.1.self_attention", "transformer.h.0.mlp.dense_h_to_4h.weight", scale=None),
    "modernbert": Family(
        _model("ModernBertForMaskedLM", "ModernBertConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
               num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=2 * SEQ, local_attention=8,
               global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
               sep_token_id=2, mask_token_id=4),
        _masked_lm, "model.layers.1.mlp.act", _silu, "model.layers.1.attn_norm", "model.layers.1.attn",
        "model.layers.0.mlp.Wi.weight", scale=None),
    "bart": Family(
        _model("BartForConditionalGeneration", "BartConfig", vocab_size=VOCAB, d_model=32, encoder_layers=2,
               decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
               decoder_ffn_dim=64, max_position_embeddings=2 * SEQ, dropout=0.0, attention_dropout=0.0,
               activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2),
        _seq2seq_bart, "model.encoder.layers.1.activation_fn", _silu, "model.encoder.layers.1.self_attn_layer_norm",
        "model.encoder.layers.1.self_attn", "model.encoder.layers.0.fc1.weight"),
    "clip": Family(
        _model("CLIPModel", "CLIPConfig", projection_dim=16,
               text_config={"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 2, "max_position_embeddings": SEQ, "pad_token_id": 0,
                            "bos_token_id": 1, "eos_token_id": 2},
               vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "image_size": IMAGE, "patch_size": 8}),
        _image_text, "text_model.encoder.layers.1.mlp.activation_fn", _silu,
        "text_model.encoder.layers.1.layer_norm1", "text_model.encoder.layers.1.self_attn",
        "vision_model.encoder.layers.0.mlp.fc1.weight", scale="scale"),
}
