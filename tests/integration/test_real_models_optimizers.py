"""Real models trained with the optimizers GPU users run: AdamW over ``_foreach_`` ops (torch's
default on CUDA) and fused AdamW (``fused=True``: one kernel updates every parameter), under
float16 AMP with a GradScaler.

The matrices trained with AdamW as CPUs run it by default, one parameter at a time. Session 32
ran them with the other two (``real_models.py matrix --base '{"optimizer": ...}'``) and found,
for the fused one:

- GradScaler does not unscale the gradients for a fused optimizer: it only checks them
  (``_amp_foreach_non_finite_check_and_unscale_`` by 1) and hands the scale to the optimizer's
  kernel (``grad_scale``), which divides by it. The loss scale was not found (compare looked
  for an unscale by 1/S), so the scaled loss was named at the api and module levels (every
  family) and an overflowed gradient of a skipped step at the aten level (T5); with the
  float16 run as the reference, the aten level named the optimizer's updated parameters.
- The fused kernel moves no parameter's version counter: a module-level dump took the
  parameters after the step for the very tensors measured before it, and recorded their old
  values (tests/unit/dump/test_dump_fused_optimizer.py); the next step then named a parameter
  as a root.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import real_models as rm  # noqa: E402
from real_models_matrix import expected  # noqa: E402
from test_real_models import Runs, _culprits  # noqa: E402

import opscope  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("real_models_optimizers"))


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_fused_adamw_under_float16_amp_is_clean_and_a_fault_under_it_named(runs: Runs, level: str) -> None:
    plain = runs.dump("t5", "reference", "statistics", level, recipe="fused")
    amp = runs.dump("t5", "fp16_amp", "statistics", level, recipe="fused")
    for target, reference, side in ((amp, plain, "target"), (plain, amp, "reference")):
        result = opscope.compare(target, reference)
        assert result.verdict == "within_tolerance" and not result.culprits, (side, _culprits(result))
        notes = " ".join(result.notes)
        # T5's float16 gradients overflow under the first scale: the scaler skipped that update
        assert f"the {side}'s gradients carry a loss scale of 65536 in step 0" in notes, notes
        assert f"the {side}'s GradScaler found Inf/NaN gradients in step" in notes, notes
    result = runs.compare("t5", "fp16_amp+act", "statistics", level, recipe="fused")
    assert expected("t5", "fp16_amp+act", result.verdict, result.first_divergence), _culprits(result)


@pytest.mark.parametrize("recipe", ["foreach", "fused"])
def test_the_gpu_optimizers_leave_a_thread_count_clean_and_name_a_changed_weight(runs: Runs, recipe: str) -> None:
    """At the module level, where only the optimizer's own records show the update (the key
    bias, zero in truth, moves by Adam's bound from rounding noise)."""
    result = runs.compare("vit", "threads", "statistics", "module", recipe=recipe)
    assert result.verdict in ("identical", "within_tolerance") and not result.culprits, _culprits(result)
    result = runs.compare("vit", "weight_row", "statistics", "module", recipe=recipe)
    assert expected("vit", "weight_row", result.verdict, result.first_divergence), _culprits(result)


@pytest.mark.parametrize("level", ["api", "module"])
def test_a_fused_step_the_scaler_skipped_is_no_culprit_either_way_round(runs: Runs, level: str) -> None:
    """The fused kernel runs in a step GradScaler skips and records an update that leaves the
    parameters as they were; with the float16 run as the reference, Wav2Vec2's key bias after
    its skipped first step was named at its optimizer record (the other run updated it)."""
    plain = runs.dump("wav2vec2", "reference", "statistics", level, recipe="fused")
    amp = runs.dump("wav2vec2", "fp16_amp", "statistics", level, recipe="fused")
    for target, reference in ((amp, plain), (plain, amp)):
        result = opscope.compare(target, reference)
        assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
        assert "GradScaler found Inf/NaN gradients in step 0" in " ".join(result.notes), result.notes


def test_fused_sgd_reading_the_buffers_a_skipped_first_step_left_is_named(tmp_path: Path) -> None:
    """T5 under float16 AMP with SGD(fused=True): GradScaler skips the first update (float16
    overflows at 65536), the fused kernel then writes none of the momentum buffers it made with
    empty_like, and the second update reads uninitialized bytes (torch 2.13): the loss is NaN a
    step later. Before, the run compared within tolerance of its float32 run either way round."""
    spec = {**rm.REFERENCE, "level": "aten", "steps": 3, "optimizer": "sgd_fused"}
    plain = rm.train("t5", tmp_path / "plain", **spec)
    amp = tmp_path / "amp"
    try:
        rm.train("t5", amp, **spec, autocast="float16")
    except RuntimeError as e:  # what the bytes held decides whether the loss turns NaN
        assert "non-finite loss" in str(e), e
    for target, reference, side in ((amp, plain, "target"), (plain, amp, "reference")):
        result = opscope.compare(target, reference)
        first = result.first_divergence
        assert first is not None and (first.kind, first.op, first.step) == ("root", "aten._fused_sgd_.default", 1), \
            _culprits(result)
        assert f"(momentum_buffer_list) of aten._fused_sgd_.default is, in the {side}, memory no op wrote" \
            in first.note, first.note


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_sgd_under_float16_amp_is_clean_with_either_run_as_the_reference(runs: Runs, family: str) -> None:
    """SGD moves a bias that is zero in truth (BERT's and ViT's query and key biases: softmax
    ignores a shift) by its learning rate times a gradient of rounding noise: to 2e-8 and 1e-15.
    The float16 run reads them cast to float16, where such values round to a multiple of 6e-8
    or to zero: with the float16 run as the reference, the float32 biases were roots at step 1
    (0.35 and an infinite relative error), though no float16 op can see the difference."""
    plain = runs.dump(family, "reference", "statistics", "aten", recipe="sgd")
    amp = runs.dump(family, "fp16_amp", "statistics", "aten", recipe="sgd")
    for target, reference in ((amp, plain), (plain, amp)):
        result = opscope.compare(target, reference)
        assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
    result = opscope.compare(plain, amp)
    pairs = result.pairs
    below = pairs[(pairs.step == 1) & pairs.note.fillna("").str.contains("float16 cast's rounding of values below")]
    assert len(below) >= 2 and below.param.str.contains("bias").all(), below[["param", "error"]]


def test_adafactor_in_bfloat16_is_told_apart_by_its_dtype_constant(runs: Runs) -> None:
    """Adafactor clamps its variance estimates at ``eps1``, which defaults to the dtype's
    epsilon: a bf16 model clamps at 0.0078 where the float32 run clamps at 1.2e-7, and the
    updates part there by design. The clamp is the culprit, and the note says why: the two
    runs called it with each dtype's constant. Under bf16 autocast the optimizer runs in
    float32 on both sides: ResNet's ``rsqrt_`` of the variance estimates magnifies their
    rounding where they are smallest, as ``rsqrt`` does (it was named: the in-place op had no
    conditioning rule)."""
    result = runs.compare("gpt2", "bf16_model", "statistics", "aten", recipe="adafactor")
    first = result.first_divergence
    assert first is not None and (first.op, first.phase, first.step) == ("aten.clamp_.default", "optimizer", 0), \
        _culprits(result)
    assert "(finfo(bfloat16).eps) in the target" in first.note and "(finfo(float32).eps) in the reference" \
        in first.note, first.note
    # the other way round the clamp is 0.95 off (against the bf16 value) and passes as in
    # proportion: the div_ it feeds is named, with what made its input
    result = opscope.compare(runs.dump("gpt2", "reference", "statistics", "aten", recipe="adafactor"),
                             runs.dump("gpt2", "bf16_model", "statistics", "aten", recipe="adafactor"))
    first = result.first_divergence
    assert first is not None and (first.phase, first.step) == ("optimizer", 0), _culprits(result)
    assert "(finfo(float32).eps) in the target" in first.note, first.note
    result = runs.compare("resnet", "bf16_autocast", "statistics", "aten", recipe="adafactor")
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)


def test_an_expert_given_other_tokens_after_a_near_tie_is_no_culprit(runs: Runs) -> None:
    """Mixtral under float16 AMP, trained with RMSprop: at step 1 the router's top-k meets a near
    tie and sends other tokens to an expert. That expert's ops run on other rows on each side
    (unpaired), and a ``split`` of its output paired by position was named a culprit though
    what it read has no partner. So was a ``view`` that read only what eager attention's
    backward made, against SDPA's backward (RMSprop, ViT, the SDPA run as the reference)."""
    amp = runs.dump("mixtral", "fp16_amp", "statistics", "aten", recipe="rmsprop")
    plain = runs.dump("mixtral", "reference", "statistics", "aten", recipe="rmsprop")
    for target, reference in ((amp, plain), (plain, amp)):  # (judged in float16 either way round)
        result = opscope.compare(target, reference)
        assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
    # likewise a view in the backward of ViT's eager attention, where the reference ran SDPA's
    result = opscope.compare(runs.dump("vit", "reference", "statistics", "aten", recipe="rmsprop"),
                             runs.dump("vit", "sdpa", "statistics", "aten", recipe="rmsprop"))
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)


def test_a_weight_turned_nan_after_a_skipped_step_is_a_root_at_the_module_level(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """T5 under float16 AMP with fused AdamW: GradScaler skips step 0, and a row of a weight is
    set to NaN as step 1 begins (outside any module, so no record makes it). The skipped update
    tainted step 0 (the runs are an update apart) and the NaN weight was read as inheriting
    that: the NaN run compared within tolerance of the float32 one. A skip leaves no NaN."""
    monkeypatch.setattr(rm, "ROW_DELTA", float("nan"))
    spec = {**rm.REFERENCE, "level": "module", "steps": 2, "optimizer": "adamw_fused"}
    plain = rm.train("t5", tmp_path / "plain", **spec)
    nan = tmp_path / "nan"
    with pytest.raises(RuntimeError, match="non-finite loss"):
        rm.train("t5", nan, **spec, autocast="float16", fault="weight_row", fault_at=1)
    for target, reference in ((nan, plain), (plain, nan)):
        result = opscope.compare(target, reference)
        first = result.first_divergence
        assert first is not None and (first.kind, first.step, first.param) == (
            "root", 1, rm.ALL_FAMILIES["t5"].weight), _culprits(result)


def test_a_swapped_activation_in_the_float16_reference_is_still_named(runs: Runs) -> None:
    """With the faulty float16 run as the reference, the clean run's activation is ops the
    reference does not run: its last op reads only those. Judged as if they were off by the
    float16 tolerance (the lower dtype of the two runs), GPT-2's swapped activation passed;
    by its own dtype's, it is named."""
    result = opscope.compare(runs.dump("gpt2", "reference", "statistics", "aten", recipe="sgd"),
                             runs.dump("gpt2", "fp16_amp+act", "statistics", "aten", recipe="sgd"))
    first = result.first_divergence
    assert first is not None and (first.kind, first.module) == ("culprit", rm.ALL_FAMILIES["gpt2"].act), \
        _culprits(result)
