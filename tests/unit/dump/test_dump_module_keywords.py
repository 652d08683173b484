"""Module level: the keyword tensors of every module call, not only the outermost one.

Hugging Face's layers are called by keyword (``self_attn(hidden_states=..., attention_mask=...,
position_embeddings=(cos, sin))``); a global forward pre-hook gets positional arguments only,
so an attention call had no inputs recorded, and a mask its model's code made wrong came out
as the attention's own code."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import opscope
from opscope.capture.torch.modules import SKIPPED

_SAME = ["step", "phase", "module", "op", "call", "io", "slot", "arg", "dtype", "numel", "param",
         "min", "max", "mean", "std", "norm", "hash"]


class _Cache:
    """An object no pytree walk enters (a Hugging Face cache): never a tensor of the call."""

    def __init__(self) -> None:
        self.keys = [torch.ones(2)]


class _Extra(NamedTuple):
    scale: torch.Tensor
    unused: Any


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                cache: _Cache | None = None, extra: _Extra | None = None) -> torch.Tensor:
        assert position_embeddings is not None and extra is not None
        cos, sin = position_embeddings
        h = self.proj(hidden_states) * cos + sin
        return (h + attention_mask if attention_mask is not None else h) * extra.scale


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attn = _Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        mask = torch.triu(torch.full((h.shape[0], 8), -1.0), 1)
        cos, sin = torch.cos(h.detach()), torch.sin(h.detach())
        return self.attn(hidden_states=h, attention_mask=mask, position_embeddings=(cos, sin), cache=_Cache(),
                         extra=_Extra(torch.full((8,), 2.0), None)).sum()


def _dump(path: Any, backend_name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend_name)
    torch.manual_seed(0)
    model, x = _Model(), torch.randn(3, 4)
    with opscope.dump(path, level="module") as d:
        for _ in range(2):
            model(x).backward()
            d.step()
    return opscope.load(path).records().to_pandas()


@pytest.mark.parametrize("backend_name", ["native", "python"])
def test_an_inner_calls_keyword_tensors_are_its_inputs(tmp_path, monkeypatch, backend_name):
    rows = _dump(tmp_path / "d", backend_name, monkeypatch)
    attn = rows[(rows.module == "attn") & (rows.io == "input") & (rows.phase == "forward") & (rows.step == 1)]
    assert list(attn.arg) == ["hidden_states", "attention_mask", "position_embeddings", "position_embeddings",
                              "extra"], "each tensor by its keyword; the cache and the None hold none"
    assert list(attn.slot) == [0, 1, 2, 3, 4]
    embed_out = rows[(rows.module == "embed") & (rows.io == "output") & (rows.phase == "forward") & (rows.step == 1)]
    assert attn.iloc[0]["producer"] == embed_out.iloc[0]["id"], "the hidden states link to what made them"
    mask = attn.iloc[1]
    assert (mask["min"], mask["max"], mask["numel"]) == (-1.0, 0.0, 24)
    assert attn.iloc[4]["min"] == attn.iloc[4]["max"] == 2.0, "a namedtuple's tensor, under its keyword"
    assert _Cache in SKIPPED, "an object no walk enters is skipped without a tree walk from then on"


def test_both_paths_record_the_same_keyword_rows(tmp_path, monkeypatch):
    native = _dump(tmp_path / "n", "native", monkeypatch)
    python = _dump(tmp_path / "p", "python", monkeypatch)
    assert len(native) == len(python)
    for column in _SAME:
        assert native[column].tolist() == python[column].tolist() or \
            native[column].fillna(-1).tolist() == python[column].fillna(-1).tolist(), column
