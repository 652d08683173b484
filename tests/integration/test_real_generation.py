"""Text generation with Hugging Face models, dumped a model step at a time (real_generation.py).

Inference carries a step into the next through data: the token a step chose is the next
step's model input, and the KV cache grows. Before session 24 a bf16 generation against its
float32 run, where a near tie of two logits picks another token (Qwen3 at step 3, GPT-NeoX at
step 6, Gemma 2 at step 9), came out diverged: the next step's input_ids a "root" (aten, api),
a slice of the KV cache a culprit (step 8), and at the module level the model's own code (its
keyword inputs were not recorded). Now the choice is named in a note and nothing is blamed;
a real fault is still named at its step, also one that only the decoding steps have.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import real_generation as rg  # noqa: E402
import real_models as rm  # noqa: E402

import opscope  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {"reference": {}, "same": {}, "bf16": {"dtype": "bfloat16"},
                                       "sdpa": {"attn": "sdpa"}}


class Generations:
    """Each (family, variant, level) generated once per module, its dump and ids kept."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ids: dict[tuple[str, str, str], list[list[int]]] = {}

    def path(self, family: str, variant: str, level: str) -> Path:
        """A variant ending in ``+SEARCH`` decodes so (real_generation.SEARCHES; the reference
        too, as ``reference+SEARCH``)."""
        key = (family, variant, level)
        path = self.root / f"{family}-{variant}-{level}"
        if key not in self.ids:
            name, _, search = variant.partition("+")
            kwargs = VARIANTS.get(name, {"fault": name})
            self.ids[key] = rg.generate(family, path, level=level, search=search or "greedy", **kwargs)
        return path

    def compare(self, family: str, variant: str, level: str = "aten") -> Any:
        search = variant.partition("+")[2]
        reference = f"reference+{search}" if search else "reference"
        return opscope.compare(self.path(family, variant, level), self.path(family, reference, level))


@pytest.fixture(scope="module")
def gens(tmp_path_factory: pytest.TempPathFactory) -> Generations:
    return Generations(tmp_path_factory.mktemp("generation"))


def _found(result: Any) -> list[tuple[str, int, str, str]]:
    return [(f.kind, f.step, f.module, f.op) for f in result.culprits[:5]]


@pytest.mark.parametrize("family", ["gpt2", "llama", "mixtral"])
def test_dumping_changes_no_token_and_the_same_run_twice_is_identical(gens: Generations, family: str) -> None:
    gens.compare(family, "same")
    bare = rg.generate(family, None)
    assert gens.ids[(family, "reference", "aten")] == gens.ids[(family, "same", "aten")] == bare
    result = gens.compare(family, "same")
    assert result.verdict == "identical", result.counts
    steps = opscope.load(gens.path(family, "same", "aten")).partitions()
    assert sorted(s for _, s in steps) == list(range(rg.NEW)), "a step per model call: prompt, then a token each"


@pytest.mark.parametrize("family, level", [("qwen3", "aten"), ("qwen3", "api"), ("gpt_neox", "aten"),
                                           ("gemma2", "aten")])
def test_a_token_chosen_from_a_near_tie_is_said_not_blamed(gens: Generations, family: str, level: str) -> None:
    """bf16 weights against float32: the logits agree within bf16's rounding, and greedy
    decoding picks another token where two of them are closer than that."""
    result = gens.compare(family, "bf16", level)
    apart = rg.first_step_apart(gens.ids[(family, "bf16", level)], gens.ids[(family, "reference", level)])
    assert apart is not None, "the case needs tokens that part"
    assert result.verdict == "within_tolerance", _found(result)
    assert not result.culprits
    choices = [n for n in result.notes if "chose differently" in n]
    assert len(choices) == 1 and f"step {apart}:" in choices[0] and "argmax" in choices[0], result.notes


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen3", "gpt_neox", "mixtral"])
def test_sdpa_generation_against_eager_is_within_tolerance(gens: Generations, family: str) -> None:
    result = gens.compare(family, "sdpa")
    assert result.verdict == "within_tolerance" and not result.culprits, _found(result)


def test_sdpa_generation_against_eager_at_the_module_level(gens: Generations) -> None:
    """Each layer gets its attention mask by keyword (recorded since session 26): a boolean
    mask under sdpa, an additive float one in eager mode, each made by the model's own code.
    Two encodings of one mask, not compared: before, the model's own code was the culprit."""
    result = gens.compare("llama", "sdpa", "module")
    assert result.verdict == "within_tolerance" and not result.culprits, _found(result)
    table = result.pairs_table.to_pandas()
    masks = table[(table.arg == "attention_mask") & (table.dtype_target == "bool")]
    assert len(masks) and (masks.dtype_reference == "float32").all()
    assert masks.note.str.contains("another encoding on each side: bool vs float32").all()


@pytest.mark.parametrize("family, fault", [("gpt2", "act"), ("llama", "norm_eps"), ("qwen3", "attn_scale"),
                                           ("gpt_neox", "weight_row"), ("mixtral", "act"), ("gemma2", "norm_eps")])
def test_a_fault_is_named_at_the_prompt_step(gens: Generations, family: str, fault: str) -> None:
    result = gens.compare(family, fault)
    first = result.first_divergence
    assert first is not None, result.counts
    assert (first.kind, first.step) == ("root" if fault == "weight_row" else "culprit", 0), _found(result)
    assert first.module == rm.fault_module(family, fault), _found(result)
    assert not [n for n in result.notes if "chose differently" in n], "after a fault, a choice is no near tie"


@pytest.mark.parametrize("level", ["aten", "api", "module"])
@pytest.mark.parametrize("family", ["gpt2", "qwen3"])
def test_a_fault_of_the_decoding_steps_is_named_at_the_first_one(gens: Generations, family: str, level: str) -> None:
    """The attention's scale is off only for one query against the cache: step 0 (the
    prompt) agrees, and step 1 is named, in the attention, as a culprit (not its cache, a
    value the step before made, as a root)."""
    result = gens.compare(family, "decode_scale", level)
    first = result.first_divergence
    assert first is not None and (first.kind, first.step) == ("culprit", 1), _found(result)
    assert first.module == rm.ALL_FAMILIES[family].attention, _found(result)


def test_at_the_module_level_the_chosen_token_is_the_models_input_and_the_note_says_why(
        gens: Generations) -> None:
    """A module-level dump records no op outside the modules, so the choice is not seen:
    the model's input_ids (a keyword argument, recorded since session 24) is the root of
    the step after, and the note says where to look."""
    result = gens.compare("qwen3", "bf16", "module")
    apart = rg.first_step_apart(gens.ids[("qwen3", "bf16", "module")], gens.ids[("qwen3", "reference", "module")])
    first = result.first_divergence
    assert apart is not None and first is not None
    assert (first.kind, first.step, first.module, first.io) == ("root", apart + 1, "", "input"), _found(result)
    assert "(input_ids)" in first.note and "api or aten level" in first.note
    assert len(result.culprits) == 1, "the steps after it carry it: no root again"
    same = gens.compare("qwen3", "same", "module")
    assert same.verdict == "identical", same.counts


@pytest.mark.parametrize("family, encoder", [("t5", "encoder."), ("whisper", "model.encoder.")])
def test_an_encoder_decoder_generates_a_step_per_token_under_the_models_paths(
        gens: Generations, family: str, encoder: str) -> None:
    """generate runs the encoder first (step 0), then the whole model per token. Before session
    24 the generation was one step (the model's calls were not calls of the encoder that began
    it) and the encoder's modules were named from it (``block.0``, not ``encoder.block.0``)."""
    rows = opscope.load(gens.path(family, "same", "aten")).records(columns=["step", "module"]).to_pandas()
    assert sorted(rows.step.unique()) == list(range(rg.NEW + 1))
    step0 = set(rows[rows.step == 0].module) - {""}
    assert step0 and all(f"{m}.".startswith(encoder) for m in step0), sorted(step0)[:5]
    assert gens.compare(family, "same").verdict == "identical"
    assert gens.ids[(family, "same", "aten")] == rg.generate(family, None)


@pytest.mark.parametrize("family, variant", [("t5", "act"), ("t5", "bf16"), ("t5", "decode_scale"),
                                             ("whisper", "norm_eps"), ("whisper", "sdpa"),
                                             ("whisper", "decode_scale")])
def test_an_encoder_decoders_fault_is_named_at_its_step(gens: Generations, family: str, variant: str) -> None:
    """A fault in the encoder is named in step 0, one of the decoding steps alone in step 1 (the
    decoder's self-attention); bf16 and sdpa are clean."""
    result = gens.compare(family, variant)
    first = result.first_divergence
    if variant in ("bf16", "sdpa"):
        assert result.verdict == "within_tolerance" and not result.culprits, _found(result)
    elif variant == "decode_scale":
        assert first is not None and (first.kind, first.step, first.module) == (
            "culprit", 1, rg.decode_attention(family)), _found(result)
    else:
        assert first is not None and (first.kind, first.step, first.module) == (
            "culprit", 0, rm.fault_module(family, variant)), _found(result)


@pytest.mark.parametrize("family", ["gpt2", "qwen3", "t5"])
def test_beam_search(gens: Generations, family: str) -> None:
    """Beam search writes its running sequences a column at a time through a view and reorders
    the cache by beam. Before session 24 the sequences' next read had no producer: a root
    (named before the fault itself, and under bf16 where a beam's topk chose from a near tie)."""
    assert gens.compare(family, "same+beams").verdict == "identical"
    bf16 = gens.compare(family, "bf16+beams")
    assert bf16.verdict == "within_tolerance" and not bf16.culprits, _found(bf16)
    assert any("aten.topk.default" in n and "chose differently" in n for n in bf16.notes), bf16.notes
    fault = gens.compare(family, "act+beams")
    first = fault.first_divergence
    assert first is not None and (first.kind, first.step, first.module) == (
        "culprit", 0, rm.fault_module(family, "act")), _found(fault)


@pytest.mark.parametrize("search, decision", [("sample", "aten.topk.default"), ("penalty", "aten.lt.Scalar")])
def test_sampling_and_logits_processors(gens: Generations, search: str, decision: str) -> None:
    """Seeded top-k / top-p sampling, and the repetition penalty with an n-gram ban (logits
    processed in place, by scatter and by mask): the same run twice identical; bf16 clean,
    its first choice said (a top-k from a near tie; the penalty's test of a logit's sign at
    zero); the fault named at step 0."""
    assert gens.compare("gpt2", f"same+{search}").verdict == "identical"
    bf16 = gens.compare("gpt2", f"bf16+{search}")
    assert bf16.verdict == "within_tolerance" and not bf16.culprits, _found(bf16)
    assert any(decision in n and "chose differently" in n for n in bf16.notes), bf16.notes
    first = gens.compare("gpt2", f"act+{search}").first_divergence
    assert first is not None and (first.kind, first.step, first.module) == (
        "culprit", 0, rm.fault_module("gpt2", "act"))


def test_the_cli_and_the_report_say_the_choice(gens: Generations, tmp_path: Path) -> None:
    """What the user runs: `opscope compare` exits 0 (nothing diverged) and prints the choice;
    the HTML report shows it (in Chromium, where installed)."""
    import subprocess

    from test_compare_cli import CHROMIUM, _chromium

    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "opscope", "compare", str(gens.path("qwen3", "bf16", "aten")),
                          str(gens.path("qwen3", "reference", "aten")), "-o", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())
    assert "verdict: within tolerance" in text and "step 3: aten.argmax.default (top level" in text, text
    if CHROMIUM is None:
        pytest.skip("chromium not installed (apt-get install chromium): the page is not checked")
    dom, log = _chromium(out / "report.html", "", tmp_path / "profile")
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-ready="1"' in body and "data-js-error" not in body, body
    assert "CONSOLE" not in log and "Uncaught" not in log, log
    assert '<p class="note">Note: rank 0 step 3: aten.argmax.default' in dom, dom[:2000]
