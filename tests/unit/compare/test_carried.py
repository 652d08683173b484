"""A value one step makes and the next reads (a generated token), and the choice that made two
runs part (compare/carried.py, compare/near_tie.py), on synthetic two-step dumps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import synth

import opscope

X = np.array([0.5, np.nextafter(np.float32(0.5), np.float32(1)), 0.1], dtype=np.float32)  # a near tie
EMBED = np.arange(12, dtype=np.float32).reshape(3, 4) / 10


def generate(path: Path, w: np.ndarray, *, data: str = "tensor", next_token: int | None = None) -> int:
    """Step 0 scores X * w and picks the best; step 1 reads the picked token (or ``next_token``)
    as a model input and embeds it. Returns the pick."""
    run = synth.Run(path, data=data)
    (logits,) = run.op("aten.mul.Tensor", [run.leaf(X), run.leaf(w, param="w")], [X * w])
    pick = int(np.argmax(logits.value))
    run.op("aten.argmax.default", [logits], [np.array([pick])], dtype="int64")
    run.end_step()
    token = run.leaf(np.array([pick if next_token is None else next_token]), dtype="int64")
    run.op("aten.embedding.default", [run.leaf(EMBED, param="embed"), token], [EMBED[[token.value[0]]]])
    run.close()
    return pick


@pytest.mark.parametrize("data", ["tensor", "statistics"])
def test_a_token_picked_from_a_near_tie_is_carried_into_the_next_step_and_said(tmp_path, data) -> None:
    one_ulp = np.array([1 + 2**-23, 1, 1], dtype=np.float32)  # the target's weight: one rounding apart
    assert generate(tmp_path / "t", one_ulp, data=data) != generate(tmp_path / "r", np.ones(3, np.float32), data=data)
    result = opscope.compare(tmp_path / "t", tmp_path / "r")
    assert result.verdict == "within_tolerance" and not result.culprits, [(f.kind, f.op) for f in result.culprits]
    pairs = result.pairs
    token = pairs[(pairs.step == 1) & (pairs.op == "aten.embedding.default") & (pairs.slot == 1)]
    assert list(token.status) == ["passed"]
    assert "made by aten.argmax.default (top level) in step 0" in token.note.iloc[0]
    (note,) = result.notes
    assert note.startswith("rank 0 step 0: aten.argmax.default (top level, forward, call 0) chose differently")
    assert ("From the full tensors: 1 of 1 rows chose differently" in note) == (data == "tensor"), note


def test_a_token_that_differs_for_no_reason_is_still_a_root(tmp_path) -> None:
    """Step 0 agrees bit for bit; the target's step 1 reads another token than the one it
    picked (a different prompt, a broken cache): nothing of step 0 made it, a root."""
    w = np.ones(3, np.float32)
    generate(tmp_path / "t", w, next_token=2)
    generate(tmp_path / "r", w)
    result = opscope.compare(tmp_path / "t", tmp_path / "r")
    first = result.first_divergence
    assert first is not None and (first.kind, first.step, first.op) == ("root", 1, "aten.embedding.default")
    assert not result.notes
