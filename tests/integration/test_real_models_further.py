"""Families of real_families_further.FURTHER_FAMILIES (the matrix script runs them whole,
session 28): the cases where they found wrong verdicts or capture bugs, each fixed.

- Longformer reads its chunked attention scores whole, masked with -inf: infinite norms on both
  sides were judged against a norm of 0, and a bf16 model named the read a root.
- Reformer draws its LSH rotations after ``torch.seed()`` unless its config sets ``hash_seed``:
  two identical runs differ. The first difference named was the old bytes of
  ``Tensor.new(*size)``'s memory that ``scatter_`` read (a root), not the draw.
- CLIP under float16 AMP overflows at the scaler's first scales: at the api level the skipped
  steps went unseen and an overflowed ``Tensor.mul`` backward was named.
- Reformer's reversible layers rebuild each layer's input from its outputs inside a custom
  autograd Function's backward and call their feed-forward again. At the module level those
  calls were ``forward`` rows, their rebuilt input (made by code no module brackets) a root
  under bf16 autocast at 2.2x a float32 tolerance (session 29: ``recompute`` rows, judged as
  values the backward made out of sight).
- RWKV under bf16 autocast, statistics: AdamW's first step moves each element of its tiny
  embedding and its time-mix vectors by ±lr, by the sign of a gradient that bf16 rounding
  flips where it is near zero. The embedding then differs by 7.7%, its statistics by 1.7e-4:
  every level named an op of step 1 (session 30: the update's bound, from the optimizer's
  recorded settings, docs/compare.md "Parameters after an update"). Funnel as a bf16 model, at
  the module level: the gradient of ``r_r_bias`` that AdamW reads at step 2, which no recorded
  op made, was a root at 1.5x a bf16 tolerance; it is judged against that bound too.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import real_models as rm  # noqa: E402
from real_families import SEQ, VOCAB, _model  # noqa: E402
from test_real_models import Runs, _culprits  # noqa: E402

import opscope  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("real_models_further"))


def test_scores_masked_with_minus_inf_are_no_root_under_bf16(runs: Runs) -> None:
    result = runs.compare("longformer", "bf16_model", "statistics")
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)


def test_float16_amp_at_the_api_level_sees_the_skipped_steps(runs: Runs) -> None:
    result = runs.compare("clip", "fp16_amp", "statistics", level="api")
    assert not result.culprits, _culprits(result)
    assert any("skipped the optimizer step" in n for n in result.notes), result.notes


def test_two_runs_of_an_unseeded_reformer_name_the_draw(tmp_path: Path) -> None:
    seeded = rm.ALL_FAMILIES["reformer"]
    config = {"vocab_size": VOCAB, "hidden_size": 32, "attention_head_size": 16, "num_attention_heads": 2,
              "feed_forward_size": 64, "attn_layers": ["local", "lsh"], "axial_pos_shape": [4, 4],
              "axial_pos_embds_dim": [16, 16], "max_position_embeddings": SEQ, "is_decoder": True,
              "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 2, "num_hashes": 1,
              "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": 0,
              "eos_token_id": 2, "local_attention_probs_dropout_prob": 0.0, "lsh_attention_probs_dropout_prob": 0.0}
    rm.ALL_FAMILIES["reformer_unseeded"] = dataclasses.replace(
        seeded, build=_model("ReformerModelWithLMHead", "ReformerConfig", **config))  # no hash_seed
    try:
        first = rm.train("reformer_unseeded", tmp_path / "a", steps=1, **rm.REFERENCE)
        second = rm.train("reformer_unseeded", tmp_path / "b", steps=1, **rm.REFERENCE)
    finally:
        del rm.ALL_FAMILIES["reformer_unseeded"]
    result = opscope.compare(first, second)
    found = result.first_divergence
    assert found is not None and (found.kind, found.op) == ("culprit", "aten.randn.default"), _culprits(result)
    assert found.module == seeded.attention and "another generator state" in found.note


def test_module_calls_inside_a_custom_backward_are_recomputations(runs: Runs) -> None:
    result = runs.compare("reformer", "bf16_autocast", "statistics", level="module")
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
    rows = opscope.load(runs.dump("reformer", "bf16_autocast", "statistics", "module")).records().to_pandas()
    feed_forward = rows[rows.module == "reformer.encoder.layers.0.feed_forward"]
    assert set(feed_forward.phase) >= {"forward", "recompute"}, set(feed_forward.phase)
    # a changed weight is still named where it is read
    weight = runs.compare("reformer", "weight_row", "statistics", level="module")
    assert weight.first_divergence is not None and weight.first_divergence.kind == "root", _culprits(weight)


@pytest.mark.parametrize("family, pair, level", [
    ("rwkv", "bf16_autocast", "aten"), ("rwkv", "bf16_autocast", "api"), ("rwkv", "bf16_autocast", "module"),
    ("funnel", "bf16_model", "module")])
def test_reads_after_an_adam_step_are_judged_against_its_bound(runs: Runs, family: str, pair: str, level: str) -> None:
    result = runs.compare(family, pair, "statistics", level=level)
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
    said = [n for n in result.notes if "AdamW updated" in n]
    assert said and "in step 0" in said[0] and "From step 1 on" in said[0], result.notes
    # the bound is the update's: a weight changed before the first step is still a root there
    weight = runs.compare(family, "weight_row", "statistics", level=level)
    found = weight.first_divergence
    assert found is not None and (found.kind, found.step) == ("root", 0), _culprits(weight)
    assert not any("AdamW updated" in n for n in runs.compare(family, "same_twice", "statistics", level=level).notes)


@pytest.mark.parametrize("benign, fault, module", [
    ({"threads": 1}, "act", "transformer.h.1.mlp.act"), ({"autocast": True}, "norm_eps", "transformer.h.1.ln_1")])
def test_a_fault_that_begins_after_an_adam_step_is_still_named(
        runs: Runs, tmp_path: Path, benign: dict, fault: str, module: str) -> None:
    """The update's bound weakens what statistics can tell from step 1 on, not so far that a
    fault beginning there goes unseen: GPT-2 with its activation swapped (or its norm's eps
    changed) before step 1, in a run apart from the reference by a thread count (bf16 autocast)."""
    target = rm.train("gpt2", tmp_path / "late", **{**rm.REFERENCE, **benign}, fault=fault, fault_at=1)
    result = opscope.compare(target, runs.dump("gpt2", "reference", "statistics"))
    found = result.first_divergence
    assert found is not None and (found.kind, found.module, found.step) == ("culprit", module, 1), _culprits(result)
    assert any("AdamW updated" in n for n in result.notes), result.notes


def test_a_weight_edited_in_one_run_between_steps_is_named_where_it_was_written(runs: Runs, tmp_path: Path) -> None:
    """GPT-2 with a row of one weight changed before step 1 (``weight[1] += 0.05`` under
    no_grad, inside the dumped loop: select, add_, copy_ at the aten level), against a run
    apart by a thread count. Those ops ran only in the target; the next read of the weight
    passed "in proportion" to its own difference and the comparison came out within tolerance."""
    target = rm.train("gpt2", tmp_path / "edit", **{**rm.REFERENCE, "threads": 1}, fault="weight_row", fault_at=1)
    result = opscope.compare(target, runs.dump("gpt2", "reference", "statistics"))
    found = result.first_divergence
    assert found is not None and (found.kind, found.op, found.step) == ("root", "aten.copy_.default", 1), \
        _culprits(result)
    assert f"ran only in the target and wrote parameter {rm.ALL_FAMILIES['gpt2'].weight}" in found.note
    # a cast one side makes of a weight is no edit: the bf16 autocast pair stays within tolerance
    assert runs.compare("gpt2", "bf16_autocast", "statistics").verdict == "within_tolerance"


@pytest.mark.parametrize("level, op", [("aten", "aten.copy_.default"), ("api", "Tensor.__setitem__"), ("module", None)])
def test_a_weight_edited_under_bf16_autocast_is_named_where_it_was_written(
        runs: Runs, tmp_path: Path, level: str, op: str | None) -> None:
    """The same edit in a Llama run under bf16 autocast. At the aten level its next read is
    autocast's cast of the weight, which only that run makes and which pairs with nothing, and
    the cast's output differs from the float32 run's weight by 5%, within bf16's tolerance
    (0.1): the comparison came out within tolerance (session 30). The edited weight is now
    paired with the weight the reference reads (by name) and held to how far apart the two were
    before the edit. At the api level ``__setitem__``'s partial write was judged as memory it
    left "in proportion" to the edit's inputs; before session 31 that dump stopped at the edit
    (an internal error: the no_grad view's ``grad_fn``). The module level sees no op of the
    edit: the weight is the root."""
    weight = rm.ALL_FAMILIES["llama"].weight
    target = rm.train("llama", tmp_path / "edit", **{**rm.REFERENCE, "autocast": True}, level=level,
                      fault="weight_row", fault_at=1)
    result = opscope.compare(target, runs.dump("llama", "reference", "statistics", level=level))
    found = result.first_divergence
    assert len(result.culprits) == 1 and found is not None and (found.kind, found.step) == ("root", 1), \
        _culprits(result)
    if op:
        assert found.op == op and f"wrote parameter {weight}" in found.note, found.where
    else:
        assert found.param == weight, found.where
