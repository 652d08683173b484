"""``opscope check-ranks DUMP``: did data-parallel ranks keep parameters and gradients identical?

Compares, across the ranks of one dump, each parameter before and after the optimizer
update and its gradient at ``optimizer.step()`` (after the all-reduce), and names where
they first differ. Exit code: 0 identical, 1 differ, 2 cannot check (fewer than two ranks,
no optimizer records, or no readable dump).
"""

from __future__ import annotations

import argparse
import json

from opscope.check_ranks import check_ranks
from opscope.report import render


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opscope check-ranks", description=__doc__.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="a dump written by two or more ranks of one run")
    parser.add_argument("--step", type=int, action="append", help="check only this step (repeatable)")
    parser.add_argument("--all", action="store_true", help="list every difference, not only the first ones")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    check = check_ranks(args.dump, steps=args.step)
    if args.json:
        print(json.dumps(check.to_json(), indent=1))
    else:
        print(render(check, "text", limit=None if args.all else 10))
    return {"identical": 0, "differs": 1}.get(check.status, 2)
