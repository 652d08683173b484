"""``opscope replay TARGET REFERENCE --op ID``: re-run one op in float64 on each side's own
inputs and say which side is wrong. Exit 0 neither side wrong, 1 a side wrong, 2 not
replayable (or nothing found)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys


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
    from opscope.report import render

    result = replay(args.target, args.reference, args.op, summary=args.summary, precision=args.precision)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(render(result, "text"), end="")
    if result.verdict == "not_replayable":
        return 2
    return 1 if result.verdict.endswith("_wrong") else 0


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
