"""Text generation (``model.generate``) of the real-model families under opscope.dump.

Decoding of NEW tokens with the KV cache (greedy, beam search, sampling), every model step
dumped (a step per call of the model: the prompt's, then one per token; an encoder-decoder's
encoder first). The same families and faults as training
(real_models.py), plus a fault of the decoding steps only: an attention whose scale is off
when it reads one query against the cache (a kernel wrong for the decode shape alone).

``generate`` writes the generated ids beside the dump (``PATH.run.json``, ``ids``), so a test
knows at which step the two runs' tokens part.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import real_models as rm
import torch

NEW = 12  # tokens generated (the configs' 2 * SEQ positions hold the 16-token prompt and these)
DECODERS = ("gpt2", "llama", "qwen3", "gemma2", "gpt_neox", "mixtral")
# encoder-decoders: step 0 is the encoder, each later step one call of the whole model; the
# decode-only fault goes into the decoder's self-attention (the training faults are in the encoder)
DECODER_ATTENTION = {"t5": "decoder.block.0.layer.0.SelfAttention", "whisper": "model.decoder.layers.0.self_attn"}
SEARCHES: dict[str, dict[str, Any]] = {
    "greedy": {}, "beams": {"num_beams": 3},
    "sample": {"do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 0.7},
    "penalty": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}}


def prompt(family: str, pad: str | None = None) -> dict[str, torch.Tensor]:
    """The family's training batch without its labels: the prompt (or the encoder input),
    padded on the ``pad`` side as real_models.padded pads it (batched generation pads left)."""
    batch = rm.padded(rm.ALL_FAMILIES[family].batch(torch.Generator().manual_seed(0)), pad)
    batch.pop("labels", None)
    return batch


def generate(family: str, path: Path | None, *, level: str = "aten", dtype: str = "float32",
             attn: str = "eager", fault: str | None = None, data: str = "statistics",
             search: str = "greedy", pad: str | None = None) -> list[list[int]]:
    """Build ``family`` (seed 0), generate NEW tokens (greedy unless ``search``), dumped to ``path``
    (None: no dump).

    ``fault``: one of real_models.FAULTS, or "decode_scale" (the attention module's scale
    times 1.5 in the decoding steps only). ``search``: a key of SEARCHES (beam search writes its
    running sequences a column at a time through views and reorders the cache by beam;
    sampling draws from the processed logits, seeded; the repetition penalty and the n-gram
    ban process the logits in place). ``pad``: the prompts padded on that side (``prompt``).
    Returns the generated ids, also written to ``PATH.run.json``."""
    import opscope

    fam = rm.ALL_FAMILIES[family]
    torch.manual_seed(0)
    model = fam.build(attn).eval()
    if fault == "decode_scale":
        _scale_when_decoding(model.get_submodule(decode_attention(family)))
    elif fault:
        rm.inject(model, family, fault)
    model.to(getattr(torch, dtype))
    batch = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in prompt(family, pad).items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        kwargs: dict[str, Any] = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False,
                                  **SEARCHES[search]}
        torch.manual_seed(1)  # sampling's draws
        if path is None:
            ids = model.generate(**batch, **kwargs)
        else:
            with opscope.dump(path, level=level, data=data, overwrite=True):
                ids = model.generate(**batch, **kwargs)
    finally:
        torch.set_num_threads(threads)
    out = ids.tolist()
    if path is not None:
        Path(f"{path}.run.json").write_text(json.dumps({"family": family, "ids": out}))
    return out


def decode_attention(family: str) -> str:
    """The attention module the decode-only fault goes into."""
    return DECODER_ATTENTION.get(family) or rm.ALL_FAMILIES[family].attention or ""


def _scale_when_decoding(attention: torch.nn.Module) -> None:
    """Scale the attention's scores by 1.5 more when it runs on one new token (decoding)."""
    plain = attention.scaling

    def pre(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        module.scaling = plain * (rm.ATTN_SCALE if hidden.shape[1] == 1 else 1.0)
    attention.register_forward_pre_hook(pre, with_kwargs=True)


def first_step_apart(a: list[list[int]], b: list[list[int]], family: str = "") -> int | None:
    """The model step whose chosen token first differs (a decoder's step 0 chooses the first
    new token; an encoder-decoder's step 1 does, after its encoder's step 0)."""
    start, offset = len(a[0]) - NEW, 1 if family in DECODER_ATTENTION else 0
    for i in range(NEW):
        if any(ra[start + i] != rb[start + i] for ra, rb in zip(a, b, strict=True)):
            return i + offset
    return None
