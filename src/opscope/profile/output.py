"""Where a profile goes on disk: preparing the folder, writing a rank, merging the ranks."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opscope.config import ProfileConfig
from opscope.errors import ProfileError
from opscope.profile import chrome_trace, writers
from opscope.profile.model import FORMAT, FORMAT_VERSION, ProfileResult
from opscope.profile.summary import summarize


def merger_rank(config: ProfileConfig, world: int) -> int:
    """The rank that writes the merged files: the lowest profiled rank."""
    ranks = [r for r in (config.ranks or range(world)) if r < world]
    return min(ranks) if ranks else 0


def expected_ranks(config: ProfileConfig, world: int) -> list[int]:
    """Ranks whose folders the merge waits for."""
    return [r for r in (config.ranks or range(world)) if r < world]


def meta(config: ProfileConfig, rank: int, world: int, status: str) -> dict[str, Any]:
    """The descriptive part of ``summary.json``."""
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "status": status,
        "rank": rank,
        "world_size": world,
        "config": config.to_json(),
        "host": platform.node(),
        "pid": os.getpid(),
        **_framework_versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _framework_versions() -> dict[str, str | None]:
    """``torch`` (None when it does not import: a TensorFlow-only install) and
    ``tensorflow`` when the program imported it."""
    try:
        import torch

        versions: dict[str, str | None] = {"torch": torch.__version__}
    except ImportError:
        versions = {"torch": None}
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        versions["tensorflow"] = getattr(tf, "__version__", None)
    return versions


def prepare(root: Path, rank: int, config: ProfileConfig) -> Path:
    """Create ``root/rank<R>``, refuse to overwrite a profile unless asked, mark it running."""
    from opscope.capture.torch.dist import world_size

    if root.exists() and not root.is_dir():
        raise ProfileError(f"profile output {root} is a file; give a folder")
    folder = root / f"rank{rank}"
    if (folder / "summary.json").exists() and not config.overwrite:
        raise ProfileError(f"{folder} already holds a profile; pass overwrite=True or choose another output folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfileError(f"cannot create profile folder {folder}: {exc.strerror or exc}") from exc
    world = world_size()
    writers.clear(folder, writers.RANK_FILES)
    if rank == merger_rank(config, world):
        writers.clear(root, writers.TOP_FILES)
        for stale in root.glob("rank*"):
            suffix = stale.name[4:]
            if suffix.isdigit() and int(suffix) >= world and stale.is_dir():
                shutil.rmtree(stale)
    writers.write_json(folder / "summary.json", meta(config, rank, world, "running"))
    return folder


def _window_warnings(session: Any) -> list[str]:
    cfg, task = session.config, session.task
    if task is None:
        return []
    last = session.rows[-1].step if session.rows else None
    spec = cfg.steps.spec
    if not task.steps:
        stopped = "before any step finished" if last is None else f"after step {last}"
        return [f"task trace: the run stopped {stopped}, before the window steps={spec!r} began; "
                "no operator trace was recorded"]
    wanted = cfg.steps.steps
    if wanted is not None and max(task.steps) < max(wanted):
        return [f"task trace covered steps {task.steps} of steps={spec!r}: the run stopped after step {last}"]
    return []


def finish(session: Any, error: BaseException | None) -> ProfileResult:
    """Write this rank's files, then (on the merging rank) the merged ones."""
    cfg, folder = session.config, session.folder
    rows = session.rows
    ops = session.task.op_rows if session.task is not None else []
    warnings = list(session.timers.notes) + _window_warnings(session)
    status, message = "complete", None
    if error is not None:
        status = "failed"
        step = rows[-1].step if rows else 0
        message = f"step {step} raised {type(error).__name__}: {error}"
    files: list[Path] = []
    info = meta(cfg, session.rank, session.world, status)
    try:
        session.write_spans()
        files += writers.write_steps(folder, rows)
        files += writers.write_ops(folder, ops)
        files.append(session.trace.finish({"rank": session.rank, "status": status}))
    except BaseException as exc:
        session.trace.abort(f"writing failed: {exc}")
        info.update(status="write_failed", error=f"{message + '; ' if message else ''}{exc}")
        with contextlib.suppress(ProfileError):  # the disk that failed may refuse this too
            writers.write_json(folder / "summary.json", info)
        if isinstance(exc, ProfileError):
            raise ProfileError(f"the profile in {folder} is incomplete: {exc}") from exc
        raise
    measured = summarize(rows, ops, warmup=cfg.warmup)
    measured["task_trace"].update(_task_numbers(session))
    info.update(measured, error=message, warnings=warnings, files=[p.name for p in files] + ["summary.json"])
    if getattr(session, "calibration", None) is not None:
        info["calibration"] = session.calibration.to_json()
    files.append(writers.write_json(folder / "summary.json", info))
    if session.rank == merger_rank(cfg, session.world):
        files += merge(Path(cfg.output), expected_ranks(cfg, session.world), cfg.merge_timeout, session.html)
    return ProfileResult(str(cfg.output), session.rank, status, rows, info, [str(p) for p in files], warnings, message)


def _task_numbers(session: Any) -> dict[str, Any]:
    task = session.task
    if task is None:
        return {"enabled": False}
    n = max(len(task.steps), 1)
    return {
        "enabled": True,
        "steps_traced": task.steps,
        "export_ms_per_step": round(task.export_ns / 1e6 / n, 3),
        "trace_events": session.trace.events,
        "trace_mb_per_step": round(session.trace.raw_bytes / 1e6 / n, 4),
    }


def wait_for_ranks(root: Path, ranks: list[int], timeout: float) -> list[int]:
    """Wait until every rank's summary.json has a final status; returns the ranks still missing."""
    from opscope.profile.reader import read_summary

    deadline = time.monotonic() + timeout
    while True:
        missing = []
        for rank in ranks:
            try:
                if read_summary(root / f"rank{rank}").get("status") in (None, "running"):
                    missing.append(rank)
            except ProfileError:
                missing.append(rank)
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.2)


def merge(root: Path, ranks: list[int], timeout: float = 0, html: Callable[[Any], str] | None = None) -> list[Path]:
    """Write the merged files of every rank into ``root``; returns their paths.

    ``html`` renders the merged :class:`~opscope.profile.reader.ProfileData` as ``report.html``
    (the caller hands it: a renderer of :mod:`opscope.report`); None writes no page."""
    from opscope.profile.reader import load, read_summary

    missing = wait_for_ranks(root, ranks, timeout)
    data = load(root)
    first = read_summary(root / f"rank{min(data.rank_status)}")
    kept = ("format", "version", "world_size", "config", "host", "torch", "tensorflow", "started")
    info: dict[str, Any] = {k: first[k] for k in kept if k in first}
    info.update(data.summary, status=data.status, rank_status={str(k): v for k, v in data.rank_status.items()})
    info["warnings"] = data.warnings + [f"rank {r}: no finished profile after waiting {timeout:g} s; merged without it"
                                        for r in missing]
    files = writers.write_steps(root, data.steps) + writers.write_ops(root, data.ops)
    traces = [root / f"rank{r}" / "trace.json.gz" for r in sorted(data.rank_status)]
    traces = [t for t in traces if t.exists()]
    if traces:
        files.append(chrome_trace.merge(traces, root / "trace.json.gz", {"ranks": sorted(data.rank_status)}))
    if html is not None:
        files.append(writers.atomic_write(root / "report.html", html(data)))
    info["files"] = [p.name for p in files] + ["summary.json"]
    files.append(writers.write_json(root / "summary.json", info))
    return files
