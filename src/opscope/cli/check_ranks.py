"""``opscope check-ranks DUMP``: did data-parallel ranks keep parameters and gradients identical?

Compares, across the ranks of one dump, each parameter before and after the optimizer
update and its gradient at ``optimizer.step()`` (after the all-reduce), and names where
they first differ. Exit code: 0 identical, 1 differ, 2 cannot check (fewer than two ranks,
no optimizer records, or no readable dump).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from opscope.check_ranks import RankCheck, RankDifference, check_ranks, explain


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
        print(render(check, limit=None if args.all else 10))
    return {"identical": 0, "differs": 1}.get(check.status, 2)


def render(check: RankCheck, limit: int | None = 10) -> str:
    """The plain-text report of a :class:`RankCheck`."""
    ranks = ", ".join(map(str, check.ranks))
    lines: list[str] = []
    if check.status == "cannot_check":
        lines.append(f"cannot check {check.path} (ranks: {ranks or 'none'}): {check.reason}")
    elif check.status == "identical":
        lines.append(f"identical across ranks {ranks}: {check.params} parameters in steps {_ranges(check.steps)}, "
                     "before and after each update and their gradients after the all-reduce "
                     f"({check.checked} tensors per rank, bit-exact)")
    else:
        first = check.first
        lines.append(f"ranks differ: first at step {first.step}, parameter {first.param!r}, {first.io} "
                     f"({first.what}): {_who(first)}")
        lines += [f"  {line}" for line in _details(first)]
        lines.append(f"  likely cause: {explain(first)}")
        lines.append(_tally(check))
        shown = check.differences[1:] if limit is None else check.differences[1:limit]
        lines += [f"  step {d.step:<4} {d.io:<6} {d.param}: {_who(d)}" for d in shown]
        hidden = len(check.differences) - 1 - len(shown)
        if hidden > 0:
            lines.append(f"  ... {hidden} more (--all lists them)")
    lines += [f"warning: {w}" for w in check.warnings]
    return "\n".join(lines)


def _who(diff: RankDifference) -> str:
    parts = []
    if diff.ranks:
        parts.append(f"{_ranks_word(diff.ranks)} {'differs' if len(diff.ranks) == 1 else 'differ'} "
                     f"from {_ranks_word(diff.reference)}")
    if diff.missing:
        parts.append(f"missing on {_ranks_word(diff.missing)}")
    return "; ".join(parts)


def _details(diff: RankDifference) -> list[str]:
    out = []
    if diff.rel_l2 is not None:
        out.append(f"relative L2 distance {diff.rel_l2:.3g}, max |difference| {diff.max_abs_diff:.3g} "
                   "(from the full tensors)")
    elif diff.rel_l2_lower_bound is not None:
        norms = ", ".join(f"rank {r}: {n:.6g}" for r, n in diff.norms.items() if n is not None)
        out.append(f"relative L2 distance >= {diff.rel_l2_lower_bound:.3g} (from the norms: {norms}; "
                   "dump with data=\"tensor\" for the exact distance)")
    if diff.note:
        out.append(diff.note)
    return out


def _tally(check: RankCheck) -> str:
    counts = Counter(d.io for d in check.differences)
    kinds = ", ".join(f"{counts[io]} {io}" for io in ("param", "grad", "output") if counts[io])
    steps = sorted({d.step for d in check.differences})
    return (f"{len(check.differences)} of {check.checked} tensors differ ({kinds}) in steps {_ranges(steps)}, "
            f"ranks {', '.join(map(str, check.ranks))}")


def _ranks_word(ranks: tuple[int, ...]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _ranges(values: list[int]) -> str:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "-"
