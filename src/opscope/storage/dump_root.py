"""A dump's folder before the writer starts: refused when it holds another dump (unless
``overwrite``), emptied of an earlier run's ranks, checked writable; and the write errors
said as what happened and what to do."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

from opscope.errors import DumpExistsError, DumpWriteError
from opscope.storage import format as fmt


def prepare(root: Path, rank: int, run_id: str | None, overwrite: bool) -> None:
    """Make ``rank``'s folder under ``root`` ready to write.

    Raises:
        DumpExistsError: ``root`` holds a dump of another run and ``overwrite`` is False.
        DumpWriteError: ``root`` is a file, or cannot be written.
    """
    rdir = fmt.rank_dir(root, rank)
    if root.exists() and not root.is_dir():
        raise DumpWriteError(f"dump path {str(root)!r} is a file; give a directory path")
    manifest = root / fmt.MANIFEST
    if overwrite:
        shutil.rmtree(rdir, ignore_errors=True)
        _remove_other_runs(root, run_id)
    elif rdir.exists() or (manifest.exists() and not _same_run(manifest, run_id)):
        raise DumpExistsError(
            f"{str(root)!r} already holds a dump; choose a new path or pass overwrite=True "
            "(config key \"overwrite\": true) to replace it")
    try:
        rdir.mkdir(parents=True, exist_ok=True)
        probe = rdir / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise write_error(exc, root) from None


def write_error(exc: OSError, root: Path) -> DumpWriteError:
    """The error the training thread sees for a failed write: what happened and the fix."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = "the disk is full (or a file-size limit was hit)"
        fix = "free space or point the dump to a larger disk; narrow it with steps, scope or ops"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        what = "permission denied"
        fix = "choose a directory you can write to"
    else:
        what = exc.strerror or str(exc)
        fix = "check the dump path"
    return DumpWriteError(f"cannot write the dump at {str(root)!r}: {what} ({exc.filename or root}); {fix}. "
                          "Steps completed before this stay readable.")


def _remove_other_runs(root: Path, run_id: str | None) -> None:
    """With overwrite, rank folders an earlier run left must not mix with this run's."""
    for d in root.glob("rank*"):
        try:
            other = json.loads((d / fmt.RANK_STATUS).read_text()).get("run_id")
        except (OSError, ValueError):
            continue  # being created right now by another rank of this run
        if not run_id or other != run_id:
            shutil.rmtree(d, ignore_errors=True)


def _same_run(manifest: Path, run_id: str | None) -> bool:
    if not run_id:
        return False
    try:
        return json.loads(manifest.read_text()).get("run_id") == run_id
    except (OSError, ValueError):
        return False
