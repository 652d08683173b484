"""A culprit's scalar arguments, where the two runs called it with different ones.

An op whose inputs agree and whose output does not may simply have been called otherwise: a
learning rate, a clamp's bound, an epsilon. Code often takes such a constant from the dtype
(``torch.finfo(x.dtype).eps``): Adafactor's ``eps1`` defaults to it, so a bfloat16 model clamps
its variance estimates at 0.0078 where the float32 run clamps at 1.2e-7, and the updates part
there by design. The capture records each call's numbers (``args``: positional ``[position,
value]`` pairs and keywords); :func:`args_note` says which differ and, where a value is its
side's ``finfo`` constant, which one.
"""

from __future__ import annotations

import json
from typing import Any

from opscope.compare.tolerance import epsilon, tiny


def scalars(row: dict[str, Any] | None) -> dict[str, float]:
    """The call's numeric arguments by position ("1") or keyword ("min")."""
    try:
        args = json.loads((row or {}).get("args") or "{}")
    except (ValueError, TypeError):
        return {}
    if not isinstance(args, dict):
        return {}
    out: dict[str, float] = {}
    for item in args.get("args") or []:
        if isinstance(item, list) and len(item) == 2 and _number(item[1]):
            out[str(item[0])] = float(item[1])
    for key, value in (args.get("kwargs") or {}).items():
        if _number(value):
            out[str(key)] = float(value)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def dtype_constant(value: float, dtype: str | None) -> str | None:
    """``finfo(bfloat16).eps`` (or its square, or ``.tiny``) where ``value`` is that of ``dtype``."""
    eps = epsilon(dtype)
    for constant, said in ((eps, "eps"), (eps * eps, "eps²"), (tiny(dtype), "tiny")):
        if constant and value == constant:
            return f"finfo({str(dtype).replace('torch.', '')}).{said}"
    return None


def args_note(t: dict[str, Any] | None, r: dict[str, Any] | None) -> str | None:
    """The arguments a call's two sides (rows ``t`` and ``r``) differ in, or None."""
    ts, rs = scalars(t), scalars(r)
    differ = [k for k in sorted(set(ts) & set(rs)) if ts[k] != rs[k]]
    if not differ:
        return None
    said, by_dtype = [], False
    for key in differ[:3]:
        shown = []
        for side, row, value in (("target", t, ts[key]), ("reference", r, rs[key])):
            constant = dtype_constant(value, (row or {}).get("dtype"))
            by_dtype = by_dtype or constant is not None
            shown.append(f"{value:.6g}{f' ({constant})' if constant else ''} in the {side}")
        what = f"argument {key}" if key.isdigit() else key
        said.append(f"{what} is {' and '.join(shown)}")
    why = ": a constant the code takes from each run's dtype, so the runs compute otherwise here by design" \
        if by_dtype else ""
    return f"the two runs called it with other arguments: {'; '.join(said)}{why}"
