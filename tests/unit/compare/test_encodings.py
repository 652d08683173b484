"""A boolean tensor against a float one is another encoding of the same thing (sdpa's boolean
attention mask against eager attention's additive one, each made by the model's own code and
passed to every layer by keyword): their values do not compare. Judged by value, the mask
differed by its whole size and the model's own code was named at the module level (sdpa
generation against eager, four families, before session 26)."""

from __future__ import annotations

from opscope.compare.align import Pair
from opscope.compare.measure import ENCODINGS_DIFFER, plan
from opscope.compare.tolerance import NoiseModel


def _row(dtype: str, norm: float, hash_: int) -> dict:
    return dict(id=0, rank=0, step=0, seq=0, phase="forward", module="model.layers.0", op="LlamaDecoderLayer",
                call=0, io="input", slot=1, arg="attention_mask", dtype=dtype, shape=[1, 1, 4, 4], numel=16,
                norm=norm, min=0.0, max=1.0, mean=0.5, std=0.5, absmax=1.0, hash=hash_, data=None, key=None)


def test_a_boolean_mask_against_an_additive_one_is_not_compared():
    pair = Pair(_row("bool", 3.2, 1), _row("float32", 1.3e39, 2), "exact")
    assert plan([pair], NoiseModel()) == {}
    assert pair.mode == "skipped" and pair.note == f"{ENCODINGS_DIFFER}: bool vs float32"


def test_masks_of_one_encoding_are_compared():
    for dtype in ("bool", "float32"):
        pair = Pair(_row(dtype, 3.2, 1), _row(dtype, 3.3, 2), "exact")
        plan([pair], NoiseModel())
        assert pair.mode == "statistics" and ENCODINGS_DIFFER not in (pair.note or "")


def test_a_mask_filled_with_minus_inf_against_one_filled_with_the_lowest_float_is_one_mask():
    from opscope.compare.tolerance import dtype_extremes

    lowest = -3.4028234663852886e38
    inf_fill, min_fill = dict(dtype="float32", min=-float("inf"), max=0.0), dict(dtype="float32", min=lowest, max=0.0)
    assert dtype_extremes(inf_fill, min_fill) and dtype_extremes(min_fill, inf_fill)  # Falcon: sdpa's, eager's
    assert dtype_extremes(dict(dtype="float16", min=-65504.0, max=0.0), min_fill), "each dtype's own lowest"
    assert not dtype_extremes(min_fill, dict(min_fill)), "the same fill is no other encoding"
    assert not dtype_extremes(inf_fill, dict(dtype="float32", min=-1e30, max=0.0)), "a finite value is computed"


def test_a_side_divided_by_a_loss_scale_is_not_judged_by_its_hash():
    # a GradScaler's scaled gradient: its statistics divided by the scale match the other side's,
    # its bytes (and hash) are the scaled values'
    t, r = _row("float32", 3.2, 1), _row("float32", 3.2, 2)
    t["scale"] = 65536.0
    pair = Pair(t, r, "exact")
    plan([pair], NoiseModel())
    assert pair.mode == "statistics" and not pair.metrics.get("hash_differs")
    same_scale = Pair(_row("float32", 3.2, 1), _row("float32", 3.2, 2), "exact")
    plan([same_scale], NoiseModel())
    assert same_scale.metrics.get("hash_differs"), "unscaled: equal statistics, other bytes"
