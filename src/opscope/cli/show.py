"""``opscope show DUMP``: what a dump holds, what its full tensors take per step, and the first
NaN/Inf with where it came from."""

from __future__ import annotations

import argparse

from opscope.report import render
from opscope.storage.reader import load


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opscope show", description=__doc__)
    parser.add_argument("dump", help="path of a dump directory")
    args = parser.parse_args(argv)
    print(render(load(args.dump), "text"))
    return 0
