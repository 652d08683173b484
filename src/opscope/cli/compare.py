"""``opscope compare TARGET REFERENCE [-o OUT]``: exit 0 when nothing diverged, 1 when
something did, 2 when nothing could be compared."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opscope compare",
        description="Compare two dumps and name the operator where they start to differ. "
                    "Exit code: 0 nothing diverged, 1 something diverged, 2 nothing could be compared.")
    p.add_argument("target", help="the dump under test")
    p.add_argument("reference", help="the dump taken as right (e.g. the float64 or CPU run)")
    p.add_argument("-o", "--out", help="write summary.json, pairs.parquet, pairs.csv and report.html here")
    p.add_argument("--mapping", help="YAML or JSON file renaming the target's modules/ops/params (docs/compare.md)")
    p.add_argument("--xlsx", action="store_true", help="also write pairs.xlsx (needs xlsxwriter)")
    p.add_argument("--workers", type=int, default=None,
                   help="tensors measured this many at a time, each streamed shard by shard: threads of this "
                        "process (a process pool when a registered metric needs Python per chunk; default: every "
                        "core)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="measure on a Dask cluster: its scheduler's address (tcp://host:8786) or --scheduler-file "
                        "JSON; every worker must see both dumps at the same path (needs opscope[dask]; "
                        "docs/compare.md)")
    p.add_argument("--precision", default=None, help="precision the target ran in when dtypes do not say (e.g. tf32)")
    p.add_argument("--steps", default=None, help="compare only these steps, e.g. 0,5,10 (default: every step in both)")
    p.add_argument("--ranks", default=None, help="compare only these ranks, e.g. 0,7; rank N of the target is "
                                                 "paired with rank N of the reference (default: every rank in both)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--replay", type=int, default=0, metavar="N",
                   help="re-run the top N culprits in float64 on each side's own inputs and say which side "
                        "is wrong (needs torch and full tensors; docs/replay.md)")
    return p


def main(argv: list[str]) -> int:
    """Run the comparison; returns the exit code."""
    args = _parser().parse_args(argv)
    from opscope.compare.api import compare
    from opscope.compare.pool import while_measuring

    while_measuring(_import_what_follows)

    progress, stop = _progress(args.quiet)
    try:
        result = compare(args.target, args.reference, mapping=args.mapping, workers=args.workers,
                         progress=progress, precision=args.precision,
                         steps=_ints(args.steps, "--steps"), ranks=_ints(args.ranks, "--ranks"),
                         replay=max(0, args.replay), scheduler=args.scheduler)
    finally:
        stop()
    if args.quiet:  # the verdict first; the files after it
        first = result.first_divergence
        print(f"{result.verdict}" + (f": {first.where}" if first else ""), flush=True)
    else:
        from opscope.report import render

        print(render(result, "text", color=sys.stdout.isatty()), end="", flush=True)
    if args.out:
        from opscope.report.compare_files import write_all

        write_all(result, args.out, xlsx=args.xlsx)
        if not args.quiet:
            print(f"files: {args.out}/summary.json, pairs.parquet, pairs.csv, report.html"
                  + (", pairs.xlsx" if args.xlsx else ""))
    return 1 if result.verdict == "diverged" else 0


# What judging, printing and writing a result imports (~60 ms): imported while the tensors are
# measured (threads in C, without the GIL), not after. A name missing is imported where needed.
AFTER_MEASURING = ("opscope.compare.verdict", "opscope.compare.table", "opscope.report.compare_console",
                   "opscope.report.compare_html", "opscope.report.compare_files", "rich.console", "rich.table",
                   "rich.panel", "rich.text", "rich.box", "rich._emoji_codes", "pyarrow.csv", "pyarrow.parquet",
                   "importlib.readers")


def _import_what_follows() -> None:
    import contextlib
    import importlib

    for name in AFTER_MEASURING:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _ints(text: str | None, flag: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.replace("|", ",").split(",") if x.strip()]
    except ValueError:
        from opscope.errors import ConfigError

        raise ConfigError(f"{flag} takes integers separated by commas, e.g. 0,5,10; got {text!r}") from None


def _progress(quiet: bool) -> tuple[Any, Any]:
    """A transient progress bar on stderr for long compares (a terminal, not --quiet); rich is
    imported at the first progress report, not before the compare starts."""
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
    state: dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        if "task" not in state:
            if total < (256 << 20):  # short compares finish before a bar helps
                return
            state["bar"] = bar = _bar()
            bar.start()
            state["task"] = bar.add_task("compare", total=total)
        state["bar"].update(state["task"], completed=done, total=total)  # a compare in windows learns its total

    def stop() -> None:
        if "task" in state:
            state["bar"].stop()

    return update, stop


def _bar() -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    return Progress("comparing", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                    console=Console(stderr=True), transient=True)
