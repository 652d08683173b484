"""Real models trained on padded batches: texts of unequal length padded as a tokenizer pads
them, with an ``attention_mask`` (``real_models.padded``).

Padded on the right, every pair of the first seven families comes out as expected. Padded on
the left, the causal LMs (GPT-2, Llama, Mixtral) diverge between eager attention and SDPA:
under a causal mask a left pad sees no key at all, SDPA writes zeros for such a query where
the eager softmax writes the mean of the values, and the loss reads the pad before each row's
first real token. compare names the attention of the first layer either way; the note says
that only those rows differ (full tensors) or that one side holds those rows as zeros
(statistics), and that a fault further on can hide behind them (compare/masked_rows.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import real_families as rf  # noqa: E402
import real_models as rm  # noqa: E402
from test_real_models import Runs, _culprits  # noqa: E402

import opscope  # noqa: E402

PADS = sum(3 * row for row in range(rf.BATCH))  # real_models.padded: row i pads 3i tokens
HEADS = {"gpt2": 2, "llama": 4}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("real_models_padding"))


@pytest.mark.parametrize("family,data,level", [("gpt2", "tensor", "aten"), ("llama", "tensor", "aten"),
                                               ("gpt2", "tensor", "module"), ("gpt2", "statistics", "api")])
def test_eager_against_sdpa_on_left_padded_texts_names_the_rows_no_key_is_left_to(
        runs: Runs, family: str, data: str, level: str) -> None:
    eager = runs.dump(family, "reference", data, level, recipe="left_pad")
    sdpa = runs.dump(family, "sdpa", data, level, recipe="left_pad")
    attention = rf.FAMILIES[family].attention.replace(".1.", ".0.")  # the first layer's
    heads = 1 if level == "module" else HEADS[family]  # the module level compares merged heads
    for target, reference, zeros in ((sdpa, eager, "target"), (eager, sdpa, "reference")):
        result = opscope.compare(target, reference)
        first = result.first_divergence
        assert result.verdict == "diverged" and first is not None, (zeros, _culprits(result))
        assert (first.module, first.step, first.phase) == (attention, 0, "forward"), (zeros, _culprits(result))
        if data == "tensor":
            rows = f"only the {PADS * heads} of {rf.BATCH * rf.SEQ * heads} query rows"
            assert rows in first.note and f"the {zeros} writes zeros there" in first.note, (zeros, first.note)
        else:
            assert f"{PADS * heads} rows of zeros more in the {zeros}" in first.note, (zeros, first.note)
        assert "padded on the right" in first.note, first.note


def test_a_fault_behind_the_empty_rows_is_named_once_the_texts_are_padded_on_the_right(runs: Runs) -> None:
    """GPT-2's second attention scaled otherwise, under SDPA against eager: padded on the left
    the first layer's empty rows come first (and their note says what they can hide); padded
    on the right, where no row is empty, the fault is named."""
    left = runs.compare("gpt2", "sdpa+attn_scale", "tensor", recipe="left_pad")
    assert left.first_divergence is not None and left.first_divergence.module == "transformer.h.0.attn"
    assert "padded on the right" in left.first_divergence.note, left.first_divergence.note
    right = runs.compare("gpt2", "sdpa+attn_scale", "tensor", recipe="right_pad")
    first = right.first_divergence
    assert first is not None and (first.module, first.step) == ("transformer.h.1.attn", 0), _culprits(right)
    assert "query rows" not in first.note, first.note


@pytest.mark.parametrize("family,recipe", [("gpt2", "right_pad"), ("llama", "right_pad"), ("bert", "left_pad")])
def test_padding_that_leaves_every_query_a_key_keeps_eager_and_sdpa_within_tolerance(
        runs: Runs, family: str, recipe: str) -> None:
    """Right padding under a causal mask, and any padding without one (BERT attends both ways):
    every query sees a real key, so the two implementations agree."""
    padded = rm.padded(rf.FAMILIES[family].batch(torch.Generator().manual_seed(0)), recipe.split("_")[0])
    assert int((padded["attention_mask"] == 0).sum()) == PADS  # the batch is padded indeed
    result = runs.compare(family, "sdpa", "statistics", recipe=recipe)
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)


def test_generation_from_left_padded_prompts_under_sdpa_and_eager_names_the_empty_rows(tmp_path: Path) -> None:
    """Batched generation pads its prompts on the left. The tokens come out the same (no real
    position reads a pad), but the prompt's step differs in the pads' rows: named, and said."""
    import real_generation as rg

    ids = {attn: rg.generate("gpt2", tmp_path / attn, attn=attn, data="tensor", pad="left")
           for attn in ("eager", "sdpa")}
    assert ids["eager"] == ids["sdpa"]
    first = opscope.compare(tmp_path / "sdpa", tmp_path / "eager").first_divergence
    assert first is not None and (first.module, first.step) == ("transformer.h.0.attn", 0), first
    assert f"only the {PADS * HEADS['gpt2']} of" in first.note and "one attention implementation" in first.note
