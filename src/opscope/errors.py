"""Typed errors. Each carries the exit code the CLI returns for it.

Every message names the problem and the fix; the CLI prints ``str(error)`` as is.
"""

from __future__ import annotations


class OpscopeError(Exception):
    """Base class of every error opscope raises on purpose."""

    exit_code = 2


class ConfigError(OpscopeError, ValueError):
    """A configuration key or value is not valid. Raised before any capture starts."""


class DumpExistsError(OpscopeError, FileExistsError):
    """The dump path already holds a dump and ``overwrite`` was not set."""


class DumpWriteError(OpscopeError, OSError):
    """The dump could not be written (disk full, permissions, path is a file)."""


class DumpFormatError(OpscopeError):
    """A dump on disk cannot be read: unknown major format version, missing manifest, corrupt shard."""


class NothingToCompareError(OpscopeError):
    """Two dumps share no record that could be compared."""


class ReplayError(OpscopeError):
    """An operator cannot be replayed (no full inputs, random op without generator state, ...)."""


class ProfileError(OpscopeError):
    """A profile could not be produced or read."""


class OverflowDetected(RuntimeError):
    """A NaN or Inf was produced by an operator while ``opscope.watch(action="raise")`` was on."""

    def __init__(self, message: str, event: object | None = None) -> None:
        super().__init__(message)
        self.event = event
