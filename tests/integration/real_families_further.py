"""A fourth group of Hugging Face families for the matrix script (``--families``), none of them
in the tests' default run: each brings data flow that the 23 of real_families.py lack.

ALBERT shares one layer's weights across its layers (one module path called twice a forward);
BLOOM adds ALiBi biases through ``baddbmm``; XLNet's two-stream relative attention is written
in ``einsum``; GPT-BigCode's multi-query attention shares one key/value head; Longformer's
sliding-window attention cuts its sequence into overlapping chunks through ``as_strided``;
Funnel pools its sequence between blocks and upsamples it again in a decoder; Jamba mixes
Mamba layers, attention and mixture-of-experts layers; RWKV's time mixing is a recurrence over
the sequence with no attention; DINOv2 adds layer scale and interpolates its position
embeddings; SegFormer reduces keys and values with a strided conv and mixes its MLP with a
depthwise conv; Reformer's reversible layers recompute their forward inside a custom autograd
function's backward, and its LSH attention sorts tokens by random-rotation buckets
(``hash_seed`` fixed: without it every forward draws a new seed with ``torch.seed()``).
"""

from __future__ import annotations

from real_families import IMAGE, LABELS, SEQ, VOCAB, Family, _causal_lm, _gelu, _images, _masked_lm, _model, _silu

_ALBERT = "albert.encoder.albert_layer_groups.0.albert_layers.0"
_BERTLIKE = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": 0}
_TOKENS = {"bos_token_id": 1, "eos_token_id": 2}


FURTHER_FAMILIES: dict[str, Family] = {
    "albert": Family(
        _model("AlbertForMaskedLM", "AlbertConfig", vocab_size=VOCAB, embedding_size=16, hidden_size=32,
               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=2 * SEQ,
               classifier_dropout_prob=0.0, **_BERTLIKE),
        _masked_lm, f"{_ALBERT}.activation", _silu, f"{_ALBERT}.attention.LayerNorm", f"{_ALBERT}.attention",
        f"{_ALBERT}.ffn.weight", checkpointing=False),
    "bloom": Family(
        _model("BloomForCausalLM", "BloomConfig", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4,
               hidden_dropout=0.0, attention_dropout=0.0, pad_token_id=0, **_TOKENS),
        _causal_lm, "transformer.h.1.mlp.gelu_impl", _silu, "transformer.h.1.input_layernorm",
        "transformer.h.1.self_attention", "transformer.h.0.mlp.dense_h_to_4h.weight", sdpa=False,
        scale="inv_norm_factor"),
    "xlnet": Family(
        _model("XLNetLMHeadModel", "XLNetConfig", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64,
               dropout=0.0, pad_token_id=0, **_TOKENS),
        _causal_lm, "transformer.layer.1.ff.activation_function", _silu, "transformer.layer.1.rel_attn.layer_norm",
        "transformer.layer.1.rel_attn", "transformer.layer.0.ff.layer_1.weight", sdpa=False, scale="scale",
        checkpointing=False),
    "gpt_bigcode": Family(
        _model("GPTBigCodeForCausalLM", "GPTBigCodeConfig", vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=32,
               n_layer=2, n_head=4, multi_query=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **_TOKENS),
        _causal_lm, "transformer.h.1.mlp.act", _silu, "transformer.h.1.ln_1", "transformer.h.1.attn",
        "transformer.h.0.mlp.c_fc.weight"),
    "longformer": Family(
        _model("LongformerForMaskedLM", "LongformerConfig", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, max_position_embeddings=2 * SEQ + 2,
               attention_window=[4, 4], **_BERTLIKE),
        _masked_lm, "longformer.encoder.layer.1.intermediate.intermediate_act_fn", _silu,
        "longformer.encoder.layer.1.attention.output.LayerNorm", "longformer.encoder.layer.1.attention.self",
        "longformer.encoder.layer.0.intermediate.dense.weight", sdpa=False, scale=None),
    "funnel": Family(
        _model("FunnelForMaskedLM", "FunnelConfig", vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=2,
               d_head=16, d_inner=64, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
               pad_token_id=0),
        _masked_lm, "funnel.encoder.blocks.1.0.ffn.activation_function", _silu,
        "funnel.encoder.blocks.1.0.attention.layer_norm", "funnel.encoder.blocks.1.0.attention",
        "funnel.encoder.blocks.0.0.ffn.linear_1.weight", sdpa=False, scale="scale", checkpointing=False),
    "jamba": Family(
        _model("JambaForCausalLM", "JambaConfig", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
               num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
               attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, pad_token_id=0,
               tie_word_embeddings=False, **_TOKENS),
        _causal_lm, "model.layers.1.feed_forward.experts.act_fn", _gelu, "model.layers.1.input_layernorm",
        "model.layers.1.self_attn", "model.layers.0.mamba.in_proj.weight"),
    "rwkv": Family(
        _model("RwkvForCausalLM", "RwkvConfig", vocab_size=VOCAB, context_length=2 * SEQ, hidden_size=32,
               num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, **_TOKENS),
        _causal_lm, "", _gelu, "rwkv.blocks.1.ln1", None,  # relu(x)**2 written inline: no act module
        "rwkv.blocks.0.feed_forward.key.weight"),
    "dinov2": Family(
        _model("Dinov2ForImageClassification", "Dinov2Config", image_size=IMAGE, patch_size=8, hidden_size=32,
               num_hidden_layers=2, num_attention_heads=2, mlp_ratio=2, num_labels=LABELS,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
        _images, "dinov2.encoder.layer.1.mlp.activation_fn", _silu, "dinov2.encoder.layer.1.norm1",
        "dinov2.encoder.layer.1.attention", "dinov2.encoder.layer.0.mlp.fc1.weight"),
    "segformer": Family(
        _model("SegformerForImageClassification", "SegformerConfig", num_channels=3, num_encoder_blocks=2,
               depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
               num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=LABELS, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, drop_path_rate=0.0, classifier_dropout_prob=0.0),
        _images, "segformer.stages.1.blocks.0.mlp.activation_fn", _silu,
        "segformer.stages.1.blocks.0.layernorm_before", "segformer.stages.1.blocks.0.attention",
        "segformer.stages.0.blocks.0.mlp.fc1.weight"),
    "reformer": Family(
        _model("ReformerModelWithLMHead", "ReformerConfig", vocab_size=VOCAB, hidden_size=32, attention_head_size=16,
               num_attention_heads=2, feed_forward_size=64, attn_layers=["local", "lsh"], axial_pos_shape=[4, 4],
               axial_pos_embds_dim=[16, 16], max_position_embeddings=SEQ, is_decoder=True,
               local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1, hash_seed=0,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
               lsh_attention_probs_dropout_prob=0.0, pad_token_id=0, eos_token_id=2),
        _causal_lm, "reformer.encoder.layers.1.feed_forward.dense.act_fn", _gelu,
        "reformer.encoder.layers.1.attention.layer_norm", "reformer.encoder.layers.1.attention.self_attention",
        "reformer.encoder.layers.0.feed_forward.dense.dense.weight", sdpa=False, scale=None, checkpointing=False),
}
