"""Mixed precision as GPUs train it, against the float32 run: float16 autocast with
``torch.amp.GradScaler``, whose loss scale (65536 at first) multiplies every gradient of the
backward pass until it unscales them for the optimizer (session 21). Before, the scaler's
``mul`` of the loss was the first culprit and every scaled gradient after it failed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import opscope  # noqa: E402

OPTIMIZERS = {"adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
              "sgd_fused": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, fused=True)}


def _train(path, *, amp: bool, init_scale: float = 2.0**16, bump: float = 0.0, act=nn.functional.gelu,
           data: str = "statistics", level: str = "aten", optimizer: str = "adamw", edit: float = 0.0,
           steps: int = 2, backoff: float = 0.5):
    """``edit``: added to a row of the first weight as step 1 begins (inside the dump).
    ``backoff``: what a skipped step multiplies the scale by (GradScaler's ``backoff_factor``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    model[1].forward = act
    with torch.no_grad():
        model[0].weight[0] += bump
    opt = OPTIMIZERS[optimizer](model.parameters())
    scaler = torch.amp.GradScaler("cpu", enabled=amp, init_scale=init_scale, backoff_factor=backoff)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 4, (8,), generator=torch.Generator().manual_seed(2))
    with opscope.dump(path, steps=list(range(steps)), level=level, data=data) as d:
        for step in range(steps):
            if edit and step == 1:
                with torch.no_grad():
                    model[0].weight[1] += edit
            with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            d.step()
    return path


def _where(result):
    return [c.where for c in result.culprits]


@pytest.mark.parametrize("data", ["statistics", "tensor"])
def test_a_gradscaler_run_is_within_tolerance_of_the_float32_run(tmp_path, data):
    reference = _train(tmp_path / "f32", amp=False, data=data)
    result = opscope.compare(_train(tmp_path / "amp", amp=True, data=data), reference, workers=1)
    assert result.verdict == "within_tolerance", _where(result)
    assert any("loss scale of 65536 in steps 0-1" in n for n in result.notes), result.notes
    pairs = result.pairs
    scaled = pairs[(pairs.kind == "identity") & (pairs.op == "aten.mul.Tensor")]  # loss * 65536, its backward
    assert len(scaled) == 4 and (scaled.error < 1e-4).all() and (scaled.verdict == "").all(), scaled.error


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_module_level_dump_records_the_scaler(tmp_path, monkeypatch, backend):
    """No op is recorded at the module level: the scaler's scale and unscale are, in their
    place, so that its gradients (every one scaled) compare too; the class is put back after."""
    monkeypatch.setenv("OPSCOPE_DUMP_BACKEND", backend)
    methods = torch.amp.GradScaler.scale, torch.amp.GradScaler.unscale_
    reference = _train(tmp_path / "f32", amp=False, level="module")
    amp = _train(tmp_path / "amp", amp=True, level="module")
    assert (torch.amp.GradScaler.scale, torch.amp.GradScaler.unscale_) == methods
    rows = opscope.load(amp).records().to_pandas()
    scale = rows[(rows.op == "GradScaler.scale") & (rows.step == 0)]
    assert scale[scale.io == "input"].sort_values("slot")["max"].tolist()[1] == 65536.0
    unscale = rows[(rows.op == "GradScaler.unscale_") & (rows.step == 0)].set_index("io")
    assert (unscale.loc["input", "max"], unscale.loc["output", "max"]) == (2.0**-16, 0.0)  # found no Inf
    assert not (opscope.load(reference).records().to_pandas().op.str.startswith("GradScaler")).any()
    result = opscope.compare(amp, reference, workers=1)
    assert result.verdict == "within_tolerance", _where(result)
    assert any("loss scale of 65536" in n for n in result.notes), result.notes


def test_the_scale_is_divided_out_on_either_side(tmp_path):
    """The float16 run as the reference: its values are divided as well."""
    amp = _train(tmp_path / "amp", amp=True)
    result = opscope.compare(_train(tmp_path / "f32", amp=False), amp, workers=1)
    assert result.verdict == "within_tolerance", _where(result)
    assert any(n.startswith("the reference's gradients carry a loss scale") for n in result.notes)


def test_faults_are_still_found_under_the_scale(tmp_path):
    reference = _train(tmp_path / "f32", amp=False)
    changed = opscope.compare(_train(tmp_path / "row", amp=True, bump=0.05), reference, workers=1)
    first = changed.first_divergence
    assert first is not None and (first.kind, first.param, first.step) == ("root", "0.weight", 0), _where(changed)
    swapped = opscope.compare(_train(tmp_path / "act", amp=True, act=nn.functional.silu), reference, workers=1)
    first = swapped.first_divergence
    assert first is not None and (first.kind, first.module, first.phase) == ("culprit", "1", "forward"), \
        _where(swapped)


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_a_step_the_scaler_skipped_is_explained_not_blamed(tmp_path, level):
    """At a loss scale of 2^40 the float16 gradients overflow: the scaler skips the update and
    halves the scale, as dynamic loss scaling does in a real run's first steps. The overflows
    are no culprits, and the next step's weights (an update behind) no roots. At the api level
    the unscale call has no ``found_inf`` output and no node of the backward reads the scale:
    before, the skip went unseen and a gradient that overflowed was named."""
    reference = _train(tmp_path / "f32", amp=False, level=level)
    result = opscope.compare(_train(tmp_path / "over", amp=True, init_scale=2.0**40, level=level), reference,
                             workers=1)
    assert not result.culprits, _where(result)
    assert any("2^40 in step 0" in n for n in result.notes), result.notes
    assert any("skipped the optimizer step" in n for n in result.notes), result.notes
    pairs = result.pairs
    overflowed = pairs[pairs.note.fillna("").str.contains("overflowed under the target's loss scale 2\\^40")]
    assert len(overflowed) >= 1 and (overflowed.step == 0).all()
    behind = pairs[(pairs.step == 1) & pairs.note.fillna("").str.contains("an update behind")]
    assert len(behind) >= 1 and (behind.verdict == "inherits").all()


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_a_weight_changed_after_a_skip_is_still_found(tmp_path, level):
    """A skip explains weights an update apart only where one run made that update and the
    other did not. Both runs skipped step 0 here: a row of a weight changed at step 1 in one of
    them is a root (at the module level, where no op records the edit, the scaler's ``scale``
    was named instead). A weight one run sets to NaN after its skip is a root too: a skipped
    update leaves no NaN (before, the float16 run with a NaN weight was within tolerance of the
    float32 one, either way round)."""
    over = {"amp": True, "init_scale": 2.0**40, "level": level}
    skipped = _train(tmp_path / "skipped", **over)
    edited = opscope.compare(_train(tmp_path / "edited", **over, edit=0.05), skipped, workers=1)
    nan = _train(tmp_path / "nan", **over, edit=float("nan"))
    f32 = _train(tmp_path / "f32", amp=False, level=level)
    for result in (edited, opscope.compare(nan, f32, workers=1), opscope.compare(f32, nan, workers=1)):
        first = result.first_divergence
        assert result.verdict == "diverged" and first is not None, _where(result)
        assert (first.kind, first.step) == ("root", 1), _where(result)
        # the edit's own record (aten: its copy_, api: Tensor.__setitem__) or the weight it changed
        assert first.param == "0.weight" or first.op in ("aten.copy_.default", "Tensor.__setitem__"), _where(result)


@pytest.mark.parametrize("level", ["aten", "api", "module"])
def test_fused_sgd_after_a_skipped_first_step_reads_memory_no_op_wrote(tmp_path, monkeypatch, level):
    """SGD(fused=True) makes its momentum buffers with empty_like and fills them in its first
    update. GradScaler skipped that update (a scale of 2^40 overflows, then backs off to 2^10),
    so the second update read uninitialized bytes and the weights took whatever they held (a
    torch 2.13 bug). The aten level records the buffers and names their read; the api and
    module levels record only the update and name the first value that goes out of bounds.
    Before, every level compared within tolerance.

    What the unwritten bytes hold is the allocator's: fresh zeroed pages make the read harmless
    (the runs then agree). Deterministic mode fills every ``empty_like`` with NaN, as a reused
    GPU block may hold, so that the fault is there in every run of the test."""
    kwargs = {"level": level, "optimizer": "sgd_fused", "steps": 3, "backoff": 2.0**-30}
    f32 = _train(tmp_path / "f32", amp=False, **kwargs)
    monkeypatch.setattr(torch.utils.deterministic, "fill_uninitialized_memory", True)
    torch.use_deterministic_algorithms(True)
    try:
        amp = _train(tmp_path / "amp", amp=True, init_scale=2.0**40, **kwargs)
    finally:
        torch.use_deterministic_algorithms(False)
    for target, reference, side in ((amp, f32, "target"), (f32, amp, "reference")):
        result = opscope.compare(target, reference, workers=1)
        first = result.first_divergence
        assert result.verdict == "diverged" and first is not None, (side, _where(result))
        assert any("skipped the optimizer step" in n for n in result.notes), result.notes
        if level == "aten":
            assert (first.kind, first.op, first.step) == ("root", "aten._fused_sgd_.default", 1), _where(result)
            assert f"is, in the {side}, memory no op wrote" in first.note, first.note
            assert "update of step 0 began" in first.note, first.note
