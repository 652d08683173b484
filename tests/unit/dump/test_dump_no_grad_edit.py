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

import opscope  # noqa: E402


def _train(path: Path | None, level: str) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    dump = opscope.dump(path, level=level, steps="0-2") if path else None
    with dump if dump else torch.enable_grad():
        for i in range(3):
            if i == 1:
                with torch.no_grad():
                    model[0].weight[1] += 0.05
            loss = model(torch.randn(5, 4, generator=torch.Generator().manual_seed(i))).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            if dump:
                dump.step()
    return losses


@pytest.mark.parametrize("level", ["aten", "api", "module"])
@pytest.mark.parametrize("backend", ["native", "python"])
def test_an_edit_under_no_grad_is_captured_and_capture_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                level: str, backend: str) -> None:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    assert _train(tmp_path / "d", level) == _train(None, level)  # the same losses, bit for bit
    dump = opscope.load(tmp_path / "d")
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
