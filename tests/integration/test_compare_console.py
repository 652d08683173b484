"""What the terminal shows for a comparison with two faults in one step, on a model with the
long module paths of real models (``transformer.h.1.…``), at 80 columns."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
import compare_faults  # noqa: E402

import opscope  # noqa: E402
from opscope.report.compare_console import render  # noqa: E402

LONG = "language_model_backbone"


class Wrapped(torch.nn.Module):
    """Puts ``inner`` one level deeper, under a long name, as pretrained wrappers do."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        setattr(self, LONG, inner)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return getattr(self, LONG)(tokens)


def _table(text: str) -> list[dict[str, str]]:
    """The culprits table's rows, each column's folded lines joined (up to phase; the
    right-justified numbers after it are left in the phase cell)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("#  id"))
    header = lines[top]
    names = ["#", "id", "kind", "module", "op", "phase"]
    starts = [header.index("#"), *(header.index(f" {n} ") + 1 for n in names[1:])]
    rows: list[dict[str, str]] = []
    for line in lines[top + 2:]:
        if not line.strip() or line.startswith("pairs "):
            break
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        if cells[0]:
            rows.append(dict.fromkeys(names, ""))
        for name, cell in zip(names, cells, strict=True):
            rows[-1][name] += cell
    return rows


def test_culprits_are_listed_in_execution_order_with_whole_names_at_80_columns(tmp_path):
    reference = Wrapped(Wrapped(compare_faults.base("transformer")))
    target = Wrapped(Wrapped(compare_faults.variant(getattr(getattr(reference, LONG), LONG), gelu_tanh=True)))
    inner = getattr(getattr(target, LONG), LONG)
    inner.norm.eps = 0.1  # a second fault after the first, far more out of proportion
    t = compare_faults.train(target, tmp_path / "t", steps=1, data="tensor")
    r = compare_faults.train(reference, tmp_path / "r", steps=1, data="tensor")
    result = opscope.compare(t, r, workers=1)
    prefix = f"{LONG}.{LONG}."
    assert [(f.module, f.op) for f in result.culprits] == [
        (prefix + "blocks.1", "aten.gelu.default"), (prefix + "norm", "aten.native_layer_norm.default")]
    assert result.culprits[1].score > result.culprits[0].score  # by score the norm would come first
    assert result.culprits[0] is result.first_divergence

    text = render(result, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    rows = _table(text)
    assert [(row["module"], row["op"], row["kind"], row["phase"].split()[0]) for row in rows] == [
        (prefix + "blocks.1", "aten.gelu.default", "culprit", "forward"),
        (prefix + "norm", "aten.native_layer_norm.default", "culprit", "forward")]
    # the first divergence's panel holds the whole path too
    panel = "".join(line.strip("│ ") for line in text.splitlines() if line.startswith("│"))
    assert prefix + "blocks.1" in panel.replace(" ", "")


def test_a_root_that_must_match_exactly_is_out_of_any_proportion(tmp_path):
    """Different batches of token ids: an integer input is a root whose allowed error is 0. Its
    score was error / 1e-300 (4.6e+298 in the table); it is inf, in the table and in summary.json."""
    paths = []
    for seed in (0, 1):
        torch.manual_seed(0)
        model = torch.nn.Embedding(16, 4)
        x = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(seed))
        with opscope.dump(tmp_path / str(seed), steps=[0]) as d:
            model(x).sum().backward()
            d.step()
        paths.append(tmp_path / str(seed))
    result = opscope.compare(*paths, workers=1)
    first = result.first_divergence
    assert first is not None and first.kind == "root" and first.score == float("inf"), first
    assert result.to_summary()["first_divergence"]["score"] == "inf"
    assert _table(render(result, width=80))[0]["phase"].split()[-1] == "inf"
