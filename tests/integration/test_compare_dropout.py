"""Dropout on, as most real configs have it (GPT-2's 0.1): a mask is drawn into empty_like's
uninitialized memory by ``bernoulli_``, whose first argument holds whatever that memory held.
Judged as an input, that garbage was a root in every comparison, the same run twice included
(session 21); measured, it kept the same run twice from comparing identical (session 22: it
is recorded unmeasured)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opscope  # noqa: E402


def _train(path, *, train_mode: bool = True, autocast: bool = False, bump: float = 0.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 4))
    model.train(train_mode)
    with torch.no_grad():
        model[0].weight[0] += bump
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))
    with opscope.dump(path, steps=[0, 1]) as d:
        for _ in range(2):
            garbage = torch.empty(1 << 16).uniform_()  # leaves other bytes in the allocator each run
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            del garbage
            d.step()
    return path


def _where(result):
    return [c.where for c in result.culprits]


@pytest.mark.parametrize("autocast", [False, True], ids=["same_run", "bf16_autocast"])
def test_dropout_masks_drawn_into_uninitialized_memory_are_no_root(tmp_path, autocast):
    reference = _train(tmp_path / "r")
    result = opscope.compare(_train(tmp_path / "t", autocast=autocast), reference, workers=1)
    # the same run twice is identical: since session 22 the capture does not measure what
    # bernoulli_ overwrites (nor empty_like's output), so no garbage differs
    assert result.verdict == ("within_tolerance" if autocast else "identical") and not result.culprits, \
        _where(result)
    pairs = result.pairs
    drawn = pairs[(pairs.op == "aten.bernoulli_.float") & (pairs.io == "input")]
    assert len(drawn) == 2 and (drawn.status == "identical").all()
    assert drawn.note.str.contains("no data yet on either side").all()
    rows = opscope.load(reference).records().to_pandas()
    unread = rows[(rows.op == "aten.bernoulli_.float") & (rows.io == "input") & (rows.slot == 0)]
    assert len(unread) == 2 and unread["mean"].isna().all() and unread["hash"].isna().all()


def test_a_fault_is_still_named_with_dropout_on(tmp_path):
    reference = _train(tmp_path / "r")
    result = opscope.compare(_train(tmp_path / "t", bump=0.05), reference, workers=1)
    first = result.first_divergence
    assert first is not None and (first.kind, first.param, first.step) == ("root", "0.weight", 0), _where(result)


def test_a_run_left_in_eval_mode_is_named_at_its_missing_dropout(tmp_path):
    """model.eval() forgotten on one side (or model.train() on the other): the training run's
    dropout is an op the other run does not have, judged as an identity, and named."""
    reference = _train(tmp_path / "r")
    result = opscope.compare(_train(tmp_path / "t", train_mode=False), reference, workers=1)
    first = result.first_divergence
    assert first is not None and (first.module, first.phase, first.step) == ("2", "forward", 0), _where(result)
