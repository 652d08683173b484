"""What a culprit's two runs called it with (opscope.compare.call_args): the numbers that differ,
and the dtype constant each is where it is one."""

from __future__ import annotations

import json

from opscope.compare.call_args import args_note, dtype_constant


def _row(dtype: str, *args: object, **kwargs: object) -> dict:
    return {"dtype": dtype, "args": json.dumps({"args": [[i + 1, a] for i, a in enumerate(args)], "kwargs": kwargs})}


def test_a_bound_taken_from_the_dtype_is_named() -> None:
    """Adafactor clamps at finfo(dtype).eps, and then at its square."""
    note = args_note(_row("bfloat16", 2.0**-7), _row("float32", 2.0**-23))
    assert note is not None and "argument 1 is 0.0078125 (finfo(bfloat16).eps) in the target" in note, note
    assert "1.19209e-07 (finfo(float32).eps) in the reference" in note and "by design" in note, note
    assert dtype_constant(2.0**-14, "bfloat16") == "finfo(bfloat16).eps²"
    assert dtype_constant(2.0**-14, "float16") == "finfo(float16).tiny"
    assert dtype_constant(1e-3, "float32") is None


def test_other_numbers_are_said_without_a_reason_and_equal_ones_not_at_all() -> None:
    note = args_note(_row("float32", 0.5, alpha=1e-3), _row("float32", 0.5, alpha=2e-3))
    assert note == ("the two runs called it with other arguments: alpha is 0.001 in the target and 0.002 "
                    "in the reference")
    assert args_note(_row("float32", 0.5, flag=True), _row("float32", 0.5, flag=False)) is None  # (not a number)
    assert args_note({"args": "not json"}, _row("float32", 1.0)) is None
    assert args_note(_row("float32", 1.0), _row("float32", 1.0)) is None
