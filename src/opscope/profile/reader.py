"""Open a profile folder written by :func:`opscope.profile`: every rank, merged on read."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opscope.errors import ProfileError
from opscope.profile.model import FORMAT, FORMAT_VERSION, OpRow, StepRow
from opscope.profile.summary import summarize
from opscope.profile.writers import read_ops, read_steps

_RANK_DIR = re.compile(r"^rank(\d+)$")


@dataclass
class ProfileData:
    """A profile on disk, all ranks: rows, op rows, a fresh summary and each rank's status.

    ``calibration`` holds each rank's machine calibration (see
    :mod:`opscope.profile.calibration`); it is empty for profiles of older opscope versions.
    """

    path: str
    steps: list[StepRow]
    ops: list[OpRow]
    summary: dict[str, Any]
    rank_status: dict[int, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    calibration: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """``complete`` when every rank finished cleanly, else the first other status."""
        bad = [s for s in self.rank_status.values() if s != "complete"]
        return bad[0] if bad else "complete"


def rank_dirs(path: Path) -> dict[int, Path]:
    """Rank folders of a profile; a rank folder given directly counts as its own."""
    match = _RANK_DIR.match(path.name)
    if match and (path / "summary.json").exists():
        return {int(match.group(1)): path}
    found = {}
    for child in path.iterdir():
        match = _RANK_DIR.match(child.name)
        if match and child.is_dir():
            found[int(match.group(1))] = child
    return dict(sorted(found.items()))


def read_summary(folder: Path) -> dict[str, Any]:
    """A ``summary.json``, checked for format and version."""
    try:
        data = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"{folder} has no summary.json: not an opscope profile, or its run died "
                           "before it started") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{folder / 'summary.json'} is not valid JSON ({exc}); the file is damaged") from None
    if data.get("format") != FORMAT:
        raise ProfileError(f"{folder / 'summary.json'} is not an opscope profile summary")
    major = int(str(data.get("version", 0)).split(".")[0])
    if major > FORMAT_VERSION:
        raise ProfileError(f"{folder} was written by a newer opscope (profile format {major}); upgrade "
                           "opscope to read it")
    return data


def load(path: str | Path) -> ProfileData:
    """Read every rank of the profile at ``path`` and summarise them together."""
    root = Path(path)
    if not root.is_dir():
        raise ProfileError(f"{root} is not a folder; give the output folder of opscope.profile(...)")
    dirs = rank_dirs(root)
    if not dirs:
        raise ProfileError(f"{root} holds no rank<N>/ folder: not an opscope profile folder")
    steps: list[StepRow] = []
    ops: list[OpRow] = []
    status: dict[int, str] = {}
    warnings: list[str] = []
    calibration: dict[int, dict[str, Any]] = {}
    warmup = 1
    for rank, folder in dirs.items():
        meta = read_summary(folder)
        status[rank] = meta.get("status", "unknown")
        warmup = int(meta.get("config", {}).get("warmup", warmup))
        warnings += [f"rank {rank}: {w}" for w in meta.get("warnings", [])]
        if isinstance(meta.get("calibration"), dict):
            calibration[rank] = meta["calibration"]
        if status[rank] == "running":
            warnings.append(f"rank {rank}: the run did not finish (status 'running'): its steps were never written")
        if (folder / "steps.parquet").exists():
            steps += read_steps(folder / "steps.parquet")
        if (folder / "ops.parquet").exists():
            ops += read_ops(folder / "ops.parquet")
    summary = summarize(steps, ops, warmup=warmup)
    if calibration:
        summary["calibration"] = {str(rank): block for rank, block in calibration.items()}
    return ProfileData(str(root), steps, ops, summary, status, warnings, calibration)
