"""Text of a rank check (``opscope check-ranks``): identical, or where ranks first differ."""

from __future__ import annotations

from collections import Counter

from opscope.check_ranks import RankCheck, RankDifference, explain
from opscope.report import register_renderer


@register_renderer("RankCheck", "text")
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
        assert first is not None, "ranks that differ have a first difference"
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
