"""A bf16 model against its float32 run, on the two things that set them apart in real models
(session 20): attention masks filled with the dtype's lowest value, and a norm that casts to
float32 and back, so that autograd sums a residual's gradients in another grouping."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opscope  # noqa: E402


class Norm(nn.Module):
    """RMS norm computed in float32, as Llama's: in a float32 model the casts are no-ops."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Block(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp, self.norm = nn.Linear(width, width), Norm(width)
        self.mix, self.out = nn.Linear(width, width), nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, seq = self.inp(x), x.shape[1]
        lowest = torch.finfo(x.dtype).min  # an additive causal mask, as Hugging Face builds it
        mask = torch.full((seq, seq), lowest, dtype=x.dtype).triu(1)
        scores = (x @ x.transpose(1, 2)) / x.shape[-1] + mask
        x = x + torch.softmax(scores, -1) @ x
        x = x + self.mix(self.norm(x))  # x read by the norm and by the residual
        return self.out(x).mean(1)


def _train(path, dtype, *, bump: float = 0.0, sgd: bool = False):
    torch.manual_seed(0)
    model = Block().to(dtype)
    with torch.no_grad():
        model.mix.weight[0] += bump
    opt = (torch.optim.SGD if sgd else torch.optim.AdamW)(model.parameters(), lr=1e-3)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = torch.tensor([1, 3])
    with opscope.dump(path, steps=[0, 1], level="aten") as d:
        for _ in range(2):
            nn.functional.cross_entropy(model(x).float(), y).backward()
            opt.step()
            opt.zero_grad()
            d.step()
    return path


def test_a_bf16_model_is_within_tolerance_of_its_float32_run(tmp_path):
    reference = _train(tmp_path / "f32", torch.float32)
    result = opscope.compare(_train(tmp_path / "bf16", torch.bfloat16), reference, workers=1)
    assert result.verdict == "within_tolerance", [c.where for c in result.culprits]
    assert result.counts.get("failed", 0) == 0, result.counts


def test_a_changed_weight_is_the_root_though_under_bf16_tolerance(tmp_path):
    """Both sides start from the same weights, the bf16 ones rounded once (within eps/2 each),
    so a weight beyond a rounding is a root even below an op's bf16 tolerance (0.1)."""
    reference = _train(tmp_path / "f32", torch.float32)
    result = opscope.compare(_train(tmp_path / "bf16", torch.bfloat16, bump=0.02), reference, workers=1)
    first = result.first_divergence
    assert result.verdict == "diverged" and first is not None
    assert (first.kind, first.param, first.step) == ("root", "mix.weight", 0), first.where
    assert first.metrics["rel_l2"] < 0.1  # what an op's tolerance would have let through


def test_a_float16_mask_is_not_a_culprit(tmp_path):
    """float16's lowest value is -65504, float32's -3.4e38: a mask's fill differs by the
    dtypes, not by a rounding. Each side holding its own dtype's extreme is no culprit, and
    what reads the mask is judged against it (SGD: float16 AdamW's eps of 1e-8 is 0 in float16,
    a real difference that compare names in the optimizer)."""
    reference = _train(tmp_path / "f32", torch.float32, sgd=True)
    result = opscope.compare(_train(tmp_path / "f16", torch.float16, sgd=True), reference, workers=1)
    assert result.verdict == "within_tolerance", [c.where for c in result.culprits]
    mask = result.pairs_table.to_pandas()
    mask = mask[(mask.op == "aten.full.default") & (mask.io == "output")]
    assert len(mask) == 2 and (mask.status == "passed").all() and (mask.rel_l2 > 0.99).all()
