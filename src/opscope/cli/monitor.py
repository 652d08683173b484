"""``opscope monitor show PATH``: what a training monitor recorded, and which tensor moved first.

Exit codes: 0 when nothing moved out of its band, 1 when something did (as compare exits 1
on a divergence), 2 for a folder that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opscope monitor", description="read what opscope.monitor(...) wrote")
    sub = parser.add_subparsers(dest="action", metavar="{show}")
    show = sub.add_parser("show", help="terminal summary: the series that moved, when, how much")
    show.add_argument("path", help="the folder given to opscope.monitor (or the monitor section's path)")
    show.add_argument("--top", type=int, default=8, help="series listed per event (default 8)")
    show.add_argument("--json", action="store_true", help="print the events as JSON")
    show.add_argument("--html", metavar="FILE", help="also write the HTML report to FILE")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of ``opscope monitor``."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.action is None:
        parser.print_help()
        return 2
    from opscope.monitor.series import read
    from opscope.report import render

    data = read(args.path)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(render(data, "html"))
    if args.json:
        print(json.dumps({"path": data.path, "events": [e.to_json() for e in data.events]}, indent=1))
    else:
        sys.stdout.write(render(data, "text", top=args.top) + "\n")
    return 0 if data else 1
