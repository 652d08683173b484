"""Terminal report of a comparison: verdict, first divergence, culprits in execution order, counts.

Pure: :func:`render` returns the text (with ANSI colour when asked); the CLI prints it.
"""

from __future__ import annotations

import io
import math
from typing import Any

from opscope.compare.result import CompareResult, Finding
from opscope.report import register_renderer

VERDICT_STYLE = {"identical": "bold green", "within_tolerance": "bold green", "diverged": "bold red"}
TOP = 5


@register_renderer("CompareResult", "text")
def render(result: CompareResult, *, color: bool = False, width: int = 110) -> str:
    """The report as text."""
    from rich.console import Console

    console = Console(record=True, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, file=_Null())
    for part in renderables(result):
        console.print(part)
    return console.export_text(styles=color)


def renderables(result: CompareResult) -> list[Any]:
    """The rich renderables, in order (for callers that print to their own console)."""
    from rich.text import Text

    out: list[Any] = []
    verdict = Text("verdict: ", style="bold")
    verdict.append(result.verdict.replace("_", " "), style=VERDICT_STYLE.get(result.verdict, "bold"))
    verdict.append(f"   ({result.target} vs reference {result.reference})", style="dim")
    out.append(verdict)
    first = result.first_divergence
    if first is not None:
        out.append(_first(first))
    if result.culprits:
        out.append(_culprits(result.culprits[:TOP], len(result.culprits)))
    ranks = result.ranks
    if len(ranks) > 1:
        out.append(_ranks(result, ranks))
    out.append(_counts(result))
    if result.weaker:
        out.append(Text(f"note: {result.weaker}", style="yellow"))
    for note in result.notes:
        out.append(Text(f"note: {note}", style="yellow"))
    for problem in result.problems[:20]:
        out.append(Text(f"skipped: {problem}", style="yellow"))
    if len(result.problems) > 20:
        out.append(Text(f"... and {len(result.problems) - 20} more (summary.json lists all)", style="yellow"))
    return out


def _first(f: Finding) -> Any:
    from rich.panel import Panel
    from rich.table import Table

    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")  # a long module path folds, never cut
    what = ("root (written by an op only one side ran)" if f.kind == "root" and "ran only in the" in (f.note or "")
            else "root (differs at the start of the step)" if f.kind == "root"
            else "culprit (inputs agree, output does not)")
    grid.add_row("what", what)
    grid.add_row("module", f.module or "(top level)")
    grid.add_row("op", f.op + (f"  [parameter {f.param}]" if f.param else ""))
    what = f.io if f.slot is None else f"{f.io} {f.slot}"
    grid.add_row("where", f"{f.phase}, step {f.step}, rank {f.rank}, call {f.call}, {what}")
    grid.add_row("error", _metrics_line(f.metrics))
    if f.source:
        grid.add_row("source", f.source)
    if f.inputs:
        worst = max((_num(i.get("error")) for i in f.inputs), default=0.0)
        grid.add_row("inputs", f"{len(f.inputs)} tensors, worst input error {_fmt(worst)}")
    if f.note:
        grid.add_row("note", f.note)
    if f.replay:
        grid.add_row("replay", f"{_replay_text(f.replay)}: {f.replay.get('reason', '')}")
    return Panel(grid, title="first divergence", title_align="left", border_style="red", expand=False)


def _culprits(findings: list[Finding], total: int) -> Any:
    """The first culprits in execution order (the first divergence first). Module and op
    fold onto more lines rather than being cut: they are what the user looks for; the
    step and rank are in the id (``rank:step:seq``), to leave them room."""
    from rich import box
    from rich.table import Table

    table = Table(title=f"culprits in execution order ({min(len(findings), TOP)} of {total}; id = rank:step:seq)",
                  title_justify="left", show_edge=False, pad_edge=False, box=box.SIMPLE_HEAD, collapse_padding=True)
    replayed = any(f.replay for f in findings)
    for col, just in (("#", "right"), ("id", "left"), ("kind", "left"), ("module", "left"), ("op", "left"),
                      ("phase", "left"), ("error", "right"), ("x allowed", "right"),
                      *((("replay", "left"),) if replayed else ())):
        whole = col in ("module", "op")
        table.add_column(col, justify=just, overflow="fold" if whole else "ellipsis", no_wrap=not whole)
    for i, f in enumerate(findings, 1):
        cells = [str(i), f.id, f.kind, f.module or "(top level)", f.param if f.kind == "root" and f.param else f.op,
                 f.phase, _fmt(f.metrics.get("error")), _fmt(f.score)]
        table.add_row(*cells, *((_replay_text(f.replay, short=True) if f.replay else "-",) if replayed else ()))
    return table


def _ranks(result: CompareResult, ranks: list[int]) -> Any:
    """Which ranks diverged first: each rank's earliest divergence, earliest first."""
    from rich.text import Text

    from opscope.compare.blame import execution_order

    firsts = sorted(result.first_divergence_by_rank.values(), key=execution_order)
    text = Text("ranks ", style="bold")
    text.append(f"{len(ranks)} compared ({_span(ranks)}), steps {_span(result.steps)}: ")
    if not firsts:
        return text.append("none diverged")
    text.append(f"{len(firsts)} diverged", style="red")
    text.append(", earliest first:")
    for f in firsts[:TOP]:
        text.append(f"\n  rank {f.rank} at step {f.step}: {f.phase}, {f.op}" + (f" ({f.module})" if f.module else ""))
    if len(firsts) > TOP:
        text.append(f"\n  and {len(firsts) - TOP} more (summary.json: first_divergence_by_rank)")
    return text


def _span(values: list[int]) -> str:
    """``0-3, 8`` for 0, 1, 2, 3, 8."""
    from opscope.compare.result import spans

    return spans(values)


def _replay_text(replay: dict[str, Any], short: bool = False) -> str:
    """``target wrong (812 eps bfloat16 / 0.4 eps float32)``: the verdict and each side's local error."""
    from opscope.replay.result import VERDICT_TEXT

    text = VERDICT_TEXT.get(replay.get("verdict", ""), str(replay.get("verdict")))
    sides = [side for s in ("target", "reference") if (side := replay.get(s))]
    if short:
        return text
    if sides:
        text += " (" + " / ".join(f"{_fmt(s.get('units'))} eps {s.get('dtype')}" for s in sides) + ")"
    return text


def _counts(result: CompareResult) -> Any:
    from rich.text import Text

    c = result.counts
    text = Text("pairs ", style="bold")
    text.append(f"{c['pairs']}: {c['identical']} identical, {c['passed']} passed, ")
    text.append(f"{c['failed']} failed", style="red" if c["failed"] else "")
    text.append(f", {c['skipped']} skipped; unpaired: {c['unpaired_target']} target, "
                f"{c['unpaired_reference']} reference")
    text.append(f"   ({_bytes(result.bytes_compared)} of tensors in {result.elapsed_s:.2f} s)", style="dim")
    return text


def _metrics_line(m: dict[str, Any]) -> str:
    parts = [f"rel. error {_fmt(m.get('error'))} (allowed {_fmt(m.get('tolerance'))})"]
    if m.get("input_error") is not None:
        parts.append(f"inputs {_fmt(m.get('input_error'))}")
    for name, label in (("cosine", "cosine"), ("max_abs", "max abs"), ("snr_db", "SNR dB")):
        if m.get(name) is not None:
            parts.append(f"{label} {_fmt(m.get(name))}")
    if m.get("nan_mismatch") or m.get("inf_mismatch"):
        parts.append(f"NaN/Inf mismatches {int(_num(m.get('nan_mismatch')))}/{int(_num(m.get('inf_mismatch')))}")
    return ", ".join(parts)


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _fmt(x: Any) -> str:
    v = _num(x)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.4g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _Null(io.StringIO):
    """A text file that keeps nothing (the console records what it prints)."""

    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass
