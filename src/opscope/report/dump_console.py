"""The text of ``opscope show DUMP``: what a dump holds, what its full tensors take per step,
and the first NaN/Inf with where it came from. ``render(dump) -> str``."""

from __future__ import annotations

from typing import Any

from opscope.config import PHASES
from opscope.model.calls import draws
from opscope.model.recompute import forward_index, remakes
from opscope.report import register_renderer
from opscope.storage.reader import Dump


@register_renderer("Dump", "text")
def render(dump: Dump) -> str:
    """The plain-text summary of a dump."""
    m = dump.manifest
    lines = [
        f"dump       {dump.path}",
        f"status     {dump.status}" + (f" ({dump.error})" if dump.error else ""),
        f"format     {m.get('format_version')}, written by {m.get('tool', {}).get('name', 'opscope')} "
        f"{m.get('tool', {}).get('version')}, "
        f"{', '.join(f'{k} {v}' for k, v in m.get('framework', {}).items())}",
        f"command    {' '.join(m.get('command', [])) or '-'}",
        f"config     level={m.get('config', {}).get('level', '-')} mode={m.get('config', {}).get('mode', '-')} "
        f"data={m.get('config', {}).get('data', '-')}",
        f"size       {_size(dump.size_bytes)}",
    ]
    table = dump.records(columns=["rank", "step", "seq", "phase", "io", "nan", "inf"])
    for rank in dump.ranks:
        lines.append(f"rank {rank}     steps {_ranges(dump.steps(rank))}")
    seen: set[str] = set()  # the phases recorded
    if table.num_rows:
        df = table.to_pandas()
        ops = df.drop_duplicates(["rank", "step", "seq"]).groupby("phase").size()
        rows = df.groupby("phase").size()
        seen = set(rows.index)
        lines.append("ops        " + ", ".join(f"{p}: {int(ops.get(p, 0))} calls / {int(rows.get(p, 0))} tensors"
                                               for p in PHASES if p in rows))
    lines += _tensor_sizes(dump)
    if "recompute" in seen:  # (the records read again only where a recomputation was recorded)
        lines += _recomputation(dump)
    lines += _first_nonfinite(dump)
    for note in dump.manifest.get("notes", []):
        lines.append(f"note       {note}")
    for problem in dump.problems:
        lines.append(f"warning    {problem}")
    return "\n".join(lines)


def _tensor_sizes(dump: Dump) -> list[str]:
    """Per rank, at its first step: what full tensors of every op take (estimated from the
    records by the rule a tensor dump stores them), or what this dump stored there."""
    from opscope.capture.torch.tensor_size import human

    lines = []
    for rank in dump.ranks:
        steps = dump.steps(rank)
        if not steps:
            continue
        nbytes, count, stored, kept = _step_tensor_size(dump, rank, steps[0])
        if kept:
            lines.append(f"full tensors  {human(stored)} stored at step {steps[0]} (rank {rank}; {kept} tensors)"
                         + ("" if stored >= nbytes else f"; of every op about {human(nbytes)} per step"))
        elif count:
            lines.append(f"full tensors  about {human(nbytes)} per step (rank {rank}, step {steps[0]}; "
                         f"{count} tensors)")
    return lines


def _step_tensor_size(dump: Dump, rank: int, step: int) -> tuple[int, int, int, int]:
    """(bytes, tensors) that full tensors of every op take at this step, by the rule a tensor
    dump stores them (``tensor_bytes``), and (bytes, tensors) this dump stored there."""
    from opscope.capture.torch.tensor_size import ITEMSIZE, places_views, table_rows, tensor_bytes
    from opscope.model.records import COL

    table = dump.records(rank=rank, step=step, columns=["id", "phase", "module", "op", "call", "dtype", "shape",
                                                         "numel", "producer", "note", "view", "data", "key"])
    rows = table_rows(table)
    nbytes, count = tensor_bytes(rows, lambda *_: True, place_views=True,
                                 views_known=places_views(dump.manifest))
    stored = {(row[COL["data"]], row[COL["key"]]): int(row[COL["numel"]] or 0) * ITEMSIZE.get(row[COL["dtype"]], 4)
              for row in rows if row[COL["key"]] is not None}
    return nbytes, count, sum(stored.values()), len(stored)


def _recomputation(dump: Dump) -> list[str]:
    """Activation checkpointing: does each recomputed output hold what the forward call it
    repeats made (the same content hash)? One that does not means the backward read values
    the forward never made; a comparison against a run with the same checkpointing (or the
    same bug) cannot show it, this one dump can."""
    cols = ["rank", "step", "seq", "phase", "module", "op", "call", "io", "slot", "hash", "numel", "dtype"]
    rows = [r for r in dump.records(columns=cols).to_pylist() if r["io"] == "output"]
    forward = forward_index(rows)
    checked = [(row, remakes(forward, row)) for row in rows if row["phase"] == "recompute"]
    differ = [row for row, same in checked if same is False]
    compared = sum(1 for _, same in checked if same is not None)
    if not compared:
        return []
    if not differ:
        return [f"recompute  {compared} recomputed outputs (activation checkpointing), each equal to the "
                f"forward output it repeats"]
    first = min(differ, key=lambda r: (r["step"], r["rank"], r["seq"]))
    why = ("a random op drawn again without the forward's generator state: checkpoint(..., "
           "preserve_rng_state=False)?" if draws(str(first["op"])) else "a nondeterministic op, or state changed "
           "between them")
    where = f"{first['op']} in module {first['module'] or '(top level)'} (call {first['call']}, output {first['slot']})"
    return [f"recompute  {len(differ)} of {compared} recomputed outputs (activation checkpointing) differ from the "
            f"forward output they repeat, so the backward read values the forward did not make",
            f"  first: step {first['step']} rank {first['rank']}: {where}; {why}"]


def _first_nonfinite(dump: Dump) -> list[str]:
    cols = ["id", "rank", "step", "seq", "phase", "module", "op", "call", "io", "slot", "nan", "inf",
            "min", "max", "norm", "source", "producer"]
    for rank, step in sorted(dump.partitions(), key=lambda p: (p[1], p[0])):
        df = dump.records(rank=rank, step=step, columns=cols).to_pandas()
        bad = df[(df.io == "output") & ((df.nan > 0) | (df.inf > 0))]
        if bad.empty:
            continue
        first = bad.sort_values("seq").iloc[0]
        inputs = df[(df.seq == first.seq) & (df.io != "output")]
        lines = [f"first NaN/Inf  step {step} rank {rank} {first.phase}: {first.op} in "
                 f"module {first.module or '(top level)'} (call {first['call']}): "
                 f"{int(first.nan)} NaN, {int(first.inf)} Inf"]
        if isinstance(first.source, str):
            lines.append(f"  at {first.source}")
        for _, row in inputs.iterrows():
            state = "already non-finite" if (row.nan or row.inf) else "finite"
            lines.append(f"  input {row.io} {row.slot}: {state}, min {_num(row['min'])} max {_num(row['max'])}"
                         f" norm {_num(row.norm)}")
        if not inputs.empty and not ((inputs.nan > 0) | (inputs.inf > 0)).any():
            lines.append("  -> its inputs are finite: this op is where the NaN/Inf starts")
        return lines
    return ["first NaN/Inf  none"]


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _ranges(steps: list[int]) -> str:
    if not steps:
        return "none"
    parts, start, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)
