"""A parameter edited in place under no_grad between steps, through a view (``w[1] += d``:
pruning masks, weight clipping, hand edits), at every level and on both capture paths.

A view that no_grad made of a tensor that requires grad, once written in place, raises on
any read of its ``grad_fn``. The api level read it to hook the call's backward, and the
Python path's aten level to tag the node that made it: capture stopped at that step with an
internal error (session 31). Both now take that error as "no node".
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dump_helpers import bare, small_mlp, train_with  # noqa: E402


def edited_mlp():
    """:func:`small_mlp` with a row of its first weight edited under no_grad before step 1
    (when step 1's batch is taken, inside the dumped loop)."""
    model, opt, batch = small_mlp()

    def edit_then_batch(i: int):
        if i == 1:
            with torch.no_grad():
                model.layers[0].weight[1] += 0.05
        return batch(i)
    return model, opt, edit_then_batch


@pytest.mark.parametrize("level", ["aten", "api", "module"])
@pytest.mark.parametrize("backend", ["native", "python"])
def test_an_edit_under_no_grad_is_captured_and_capture_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                level: str, backend: str) -> None:
    losses, dump = train_with(backend, monkeypatch, tmp_path / "d", 3, edited_mlp, level=level, steps="0-2")
    assert losses == bare(3, edited_mlp)  # the same losses, bit for bit
    assert dump.status == "complete", dump.status
    rows = dump.records().to_pandas()
    assert set(rows.step) == {0, 1, 2}
    for step in (1, 2):  # the forward and the update of each step after the edit
        ops = set(rows[rows.step == step].op)
        assert "AdamW.step" in ops and (level == "module" or len(ops) > 5), (step, sorted(ops))
    if level != "module":  # the edit itself, an in-place write before step 1's forward
        edits = rows[(rows.step == 1) & rows.op.str.contains("add_|iadd", regex=True)
                     & (rows.phase == "forward")]
        assert len(edits), sorted(set(rows[rows.step == 1].op))[:20]
