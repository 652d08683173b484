"""Attention rows a mask leaves without any key (compare/masked_rows.py): a small attention run
eagerly and under SDPA on a left-padded batch with a causal mask, dumped by opscope."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import opscope
from opscope.compare.masked_rows import empty_rows, rows_of

BATCH, SEQ, HEADS, WIDTH = 3, 6, 2, 4
PADS = [0, 2, 4]  # left pads per row: 6 queries with no key in all


class Attention(torch.nn.Module):
    def __init__(self, impl: str, scale: float | None = None) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HEADS * WIDTH, 3 * HEADS * WIDTH)
        self.out = torch.nn.Linear(HEADS * WIDTH, HEADS * WIDTH)
        self.impl, self.scale = impl, scale

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(BATCH, SEQ, 3, HEADS, WIDTH).permute(2, 0, 3, 1, 4)
        scale = self.scale or WIDTH**-0.5
        if self.impl == "sdpa":
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        else:  # eager attention: the masked scores filled with finfo.min
            scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, torch.finfo(torch.float32).min)
            a = torch.softmax(scores, dim=-1) @ v
        return self.out(a.transpose(1, 2).reshape(BATCH, SEQ, HEADS * WIDTH))


def _mask() -> torch.Tensor:
    real = torch.arange(SEQ)[None] >= torch.tensor(PADS)[:, None]
    return (torch.ones(SEQ, SEQ, dtype=torch.bool).tril() & real[:, None, :])[:, None]


def _dump(path, impl: str, data: str, scale: float | None = None):
    torch.manual_seed(0)
    model, x = Attention(impl, scale), torch.randn(BATCH, SEQ, HEADS * WIDTH)
    with opscope.dump(path, level="aten", data=data) as d:
        model(x, _mask()).square().mean().backward()
        d.step()
    return path


def test_the_rows_a_mask_leaves_empty_are_found_in_either_encoding() -> None:
    mask = _mask().numpy()
    assert empty_rows(mask).sum() == sum(PADS)
    additive = np.where(mask, 0.0, np.float32(np.finfo(np.float32).min))
    for fill in (additive, np.where(mask, 0.0, -np.inf), np.where(mask, 0.0, -10000.0)):
        assert (empty_rows(fill) == empty_rows(mask)).all()
    assert not empty_rows(np.where(mask, 0.0, -100.0)).any()  # a bias, not a mask
    per_head = rows_of(empty_rows(mask), [BATCH, HEADS, SEQ, WIDTH])
    merged = rows_of(empty_rows(mask), [BATCH, SEQ, HEADS * WIDTH])
    assert per_head is not None and per_head.sum() == HEADS * sum(PADS)
    assert merged is not None and merged.sum() == sum(PADS)
    assert rows_of(empty_rows(mask), [BATCH, SEQ + 1, WIDTH]) is None  # another length: not these rows


@pytest.mark.parametrize("data", ["tensor", "statistics"])
def test_sdpa_against_eager_on_a_left_padded_batch_names_the_empty_rows(tmp_path, data) -> None:
    sdpa, eager = _dump(tmp_path / "sdpa", "sdpa", data), _dump(tmp_path / "eager", "eager", data)
    for target, reference, zeros in ((sdpa, eager, "target"), (eager, sdpa, "reference")):
        first = opscope.compare(target, reference).first_divergence
        assert first is not None and first.step == 0 and first.phase == "forward", first
        if data == "tensor":
            assert f"only the {HEADS * sum(PADS)} of {BATCH * HEADS * SEQ} query rows" in first.note, first.note
            assert f"the {zeros} writes zeros there" in first.note, first.note
        else:
            assert f"{HEADS * sum(PADS)} rows of zeros more in the {zeros}" in first.note, first.note
        assert "padded on the right" in first.note, first.note


def test_a_scale_that_differs_as_well_is_not_put_down_to_the_empty_rows(tmp_path) -> None:
    sdpa = _dump(tmp_path / "sdpa", "sdpa", "tensor")
    wrong = _dump(tmp_path / "eager", "eager", "tensor", scale=0.7)
    first = opscope.compare(wrong, sdpa).first_divergence
    assert first is not None and first.step == 0 and first.phase == "forward", first
    assert "query rows" not in first.note, first.note
