"""``opscope profile show DIR`` and ``opscope profile diff A B``.

Exit codes: ``show`` 0; ``diff`` 0 when nothing got slower beyond noise, 1 when something
did; 2 for a profile that cannot be read (raised as :class:`~opscope.errors.ProfileError`).
"""

from __future__ import annotations

import argparse
import json
import sys

from opscope.errors import ProfileError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opscope profile",
                                     description="show or diff profiles written by opscope.profile(...)")
    sub = parser.add_subparsers(dest="action", metavar="{show,diff}")
    show = sub.add_parser("show", help="terminal summary of a profile folder")
    show.add_argument("dir", help="the output folder given to opscope.profile")
    show.add_argument("--top", type=int, default=10, help="operators to list (default 10)")
    show.add_argument("--json", action="store_true", help="print the merged summary as JSON")
    show.add_argument("--html", metavar="PATH", help="also write the HTML report to PATH")
    diff = sub.add_parser("diff", help="compare profile B against profile A, phase by phase and op by op")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--k", type=float, default=3.0, help="noise band width in robust standard deviations (default 3)")
    diff.add_argument("--min-change", type=float, default=0.1,
                      help="smallest relative change to flag (default 0.1 = 10%%)")
    diff.add_argument("--top", type=int, default=10, help="operator changes to list (default 10)")
    diff.add_argument("--json", action="store_true", help="print the diff as JSON")
    diff.add_argument("--ignore-machine", action="store_true",
                      help="do not account for a machine that was busier or slower during one run (its calibration)")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``opscope profile``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 2
    from opscope.profile.reader import load
    from opscope.report import render

    if args.action == "show":
        data = load(args.dir)
        if not data.steps:
            raise ProfileError(f"{args.dir} holds no recorded step: "
                               f"{'; '.join(data.warnings) or 'the run stopped before its first step ended'}")
        if args.html:
            from opscope.profile.writers import atomic_write

            atomic_write(args.html, render(data, "html"))
        if args.json:
            print(json.dumps({"status": data.status, "warnings": data.warnings, **data.summary}, indent=2))
        else:
            sys.stdout.write(render(data, "text", top=args.top))
        return 0
    from opscope.profile.diff import diff

    a, b = load(args.a), load(args.b)
    for data in (a, b):
        if not data.steps:
            raise ProfileError(f"{data.path} holds no recorded step; nothing to compare")
    result = diff(a, b, k=args.k, min_change=args.min_change, machine=not args.ignore_machine)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        sys.stdout.write(render(result, "text", top=args.top))
    return 0 if result else 1
