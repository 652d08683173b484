"""Families of real_models.WIDER_FAMILIES (the matrix script runs them whole: 216 pairs at the
aten level, session 27): the cases where they found wrong verdicts, each fixed.

- DeepSeek-V3 fills its query a half at a time into an empty (``q[..., :n] = a``); the slice
  that takes the other half measured its unwritten bytes: the same run twice was "within
  tolerance", not identical.
- Falcon's sdpa path fills its mask with -inf where its eager path takes finfo.min:
  ``aten.where`` was named at every step.
- ModernBERT's rotary module, compiled, makes the global attention's frequencies before the
  local one's: each buffer's read paired with the other's, a root at the start of step 0.

(Mamba under torch.compile, which stopped the dump on vmap's batched tensors, takes ~30 s to
train the first time: its cases are unit tests, test_dump_functorch.py and
test_dump_attribution.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
import real_models as rm  # noqa: E402
from test_real_models import Runs, _assert_fault_named, _culprits  # noqa: E402

import opscope  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("real_models_wider"))


def test_an_empty_filled_by_halves_is_identical_in_the_same_run_twice(runs: Runs) -> None:
    result = runs.compare("deepseek_v3", "same_twice", "tensor")
    assert result.verdict == "identical", (result.counts, _culprits(result))


@pytest.mark.parametrize("data", ["statistics", "tensor"])
def test_a_mask_of_minus_inf_against_one_of_finfo_min_is_no_culprit(runs: Runs, data: str) -> None:
    result = runs.compare("falcon", "sdpa", data)
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)


@pytest.mark.parametrize("family", ["deepseek_v3", "falcon"])
def test_a_swapped_activation_is_named(runs: Runs, family: str) -> None:
    _assert_fault_named(runs, runs.compare(family, "act", "statistics"), family, "act", "statistics")


def test_buffers_read_in_another_order_under_compile_pair_by_name(tmp_path: Path) -> None:
    reference = rm.train("modernbert", tmp_path / "reference", steps=2, **rm.REFERENCE)
    target = tmp_path / "compiled"
    failures = rm.train_in_subprocesses([rm.pair_spec("modernbert", "compiled", target, steps=2)])
    assert not failures, failures
    result = opscope.compare(target, reference)
    assert result.verdict == "within_tolerance" and not result.culprits, _culprits(result)
