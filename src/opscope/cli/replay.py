"""``opscope replay TARGET REFERENCE --op ID``: re-run one op in float64 on each side's own
inputs and say which side is wrong. Exit 0 neither side wrong, 1 a side wrong, 2 not
replayable (or nothing found)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opscope replay",
        description="Re-run an op (aten level) on each side's own recorded inputs in float64 on CPU and "
                    "report each side's local error in eps of its dtype: target wrong, reference wrong, "
                    "both within their precision, or both off (ill-conditioned). Needs full tensors. "
                    "Exit code: 0 neither side wrong, 1 a side wrong, 2 not replayable.")
    p.add_argument("target", help="the dump under test")
    p.add_argument("reference", help="the dump taken as right")
    p.add_argument("--op", default="first",
                   help="first (default), a culprit number, or an id rank:step:seq from the compare output")
    p.add_argument("--summary", help="a compare -o directory (or its summary.json): find the op there "
                                     "instead of comparing again")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (a library defining custom ops or replay rules); repeatable")
    p.add_argument("--precision", default=None, help="precision the target ran in when dtypes do not say (tf32)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def main(argv: list[str]) -> int:
    """Replay one op; returns the exit code."""
    args = _parser().parse_args(argv)
    for name in args.imports:
        _import(name)
    from opscope.replay import replay

    result = replay(args.target, args.reference, args.op, summary=args.summary, precision=args.precision)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(render(result), end="")
    if result.verdict == "not_replayable":
        return 2
    return 1 if result.verdict.endswith("_wrong") else 0


def render(result: Any) -> str:
    """The replay as plain text: where, verdict, reason, one line per side."""
    lines = [f"replay {result.id}: {result.where}",
             f"verdict: {result.verdict_text}",
             f"  {result.reason}"]
    sides = [s for s in (result.target, result.reference) if s is not None]
    if sides:
        lines.append(f"  {'side':<10} {'dtype':<9} {'local error':>12} {'eps':>9} {'allowed':>8} "
                     f"{'CPU kernel':>11}  status")
        for s in sides:
            repro = " (same bits)" if s.reproduced else ""
            lines.append(f"  {s.side:<10} {s.dtype:<9} {_fmt(s.error):>12} {_fmt(s.units):>9} "
                         f"{_fmt(s.allowed_units):>8} {_fmt(s.native_units):>11}  {s.status.replace('_', '-')}{repro}")
        lines.append("  (local error: against the op re-run in float64 on that side's own inputs; "
                     "CPU kernel: torch's, in the recorded dtypes, in eps)")
    return "\n".join(lines) + "\n"


def _import(name: str) -> None:
    from opscope.errors import ReplayError

    try:
        if name.endswith(".so"):
            import torch

            torch.ops.load_library(name)
        else:
            sys.path.insert(0, ".")
            importlib.import_module(name)
    except Exception as exc:  # any import failure is the user's module: say which
        raise ReplayError(f"--import {name}: {type(exc).__name__}: {exc}") from None


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.3g}" if 0.01 <= abs(v) < 1e5 else f"{v:.2e}"
