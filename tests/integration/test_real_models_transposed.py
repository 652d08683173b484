"""A Linear layer's weight gradient as the api level's backward hook receives it: the gradient
of ``weight.t()``, which autograd lays out as the weight itself (a transposed plane). Since
session 39 such a tensor is read in memory order (``native/_c/fastats_transposed.h``), where
it was copied into row-major order first. On the classifier heads of real image models
(2-d inputs: the head's ``F.linear`` is one ``addmm``) its row must still hold the row-major
hash, the gradient's extremes and counts, and the same statistics on both capture paths."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from real_families import FAMILIES, MORE_FAMILIES  # noqa: E402

import opscope  # noqa: E402
from opscope.model.hashing import content_hash  # noqa: E402

STATS = ["min", "max", "mean", "std", "norm", "absmax", "nan", "inf", "zeros", "hash"]


def _step(family: str, path, backend: str, monkeypatch) -> tuple[torch.nn.Module, object]:
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    fam = {**FAMILIES, **MORE_FAMILIES}[family]
    torch.manual_seed(0)
    model = fam.build("eager")
    batch = fam.batch(torch.Generator().manual_seed(1))
    with opscope.dump(path, level="api") as d:
        model(**batch).loss.backward()
        d.step()
    rows = opscope.load(path).records().to_pandas(integer_object_nulls=True)
    return model, rows[(rows.phase == "backward") & (rows.op == "torch.nn.functional.linear")
                       & (rows.arg == "grad_input")]


@pytest.mark.parametrize("family", ["vit", "convnext", "resnet"])
def test_a_classifier_weight_gradient_read_in_memory_order(tmp_path, monkeypatch, family):
    model, native = _step(family, tmp_path / "native", "native", monkeypatch)
    params = dict(model.named_parameters())
    found = 0
    for _, row in native[native.slot == 2].iterrows():  # addmm's third input: weight.t()
        weight = params[f"{row.module}.weight"]
        assert list(row["shape"]) == list(weight.shape)[::-1]
        found += 1
        grad = weight.grad  # the same values, laid out row-major as the weight
        assert row["hash"] == content_hash(grad.t().contiguous().numpy()) != content_hash(grad.numpy())
        assert (row["min"], row["max"], row["zeros"]) == (grad.min().item(), grad.max().item(),
                                                          int((grad == 0).sum()))
        rms = float(grad.norm()) / math.sqrt(grad.numel())
        assert abs(row["mean"] - grad.double().mean().item()) <= 1e-6 * rms
        assert math.isclose(row["norm"], grad.double().norm().item(), rel_tol=1e-6)
    assert found == 1, native[["module", "slot", "shape"]]
    _, python = _step(family, tmp_path / "python", "python", monkeypatch)
    assert python[STATS].astype(str).values.tolist() == native[STATS].astype(str).values.tolist()
