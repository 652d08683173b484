"""What a PyTorch dump says about its run: the manifest it starts with (versions, host,
command, configuration) and the statistics engine of the Python path."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

import torch

from opscope._version import __version__
from opscope.capture.torch.dist import world_size
from opscope.config import DumpConfig, env, foreign
from opscope.errors import ConfigError
from opscope.storage import format as fmt


def manifest(cfg: DumpConfig) -> dict[str, Any]:
    """The manifest a dump of ``cfg`` starts with (its status is written at the end)."""
    device = "cpu"
    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name()})"
    return {
        "tool": {"name": "opscope", "version": __version__},
        "framework": {"torch": torch.__version__},
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "command": list(sys.argv),
        "cwd": os.getcwd(),
        "device": device,
        "world_size": world_size(),
        "run_id": env("RUN_ID") or foreign("TORCHELASTIC_RUN_ID"),
        "hash_algorithm": fmt.HASH_ALGORITHM,
        "std": fmt.STD_METHOD,
        "stats_backend": engine(cfg.level),
        "config": cfg.to_json(),
    }


def engine(level: str) -> str:
    """The statistics engine of the Python path for ``level`` (``OPSCOPE_STATS_BACKEND``)."""
    from opscope.capture.torch import stats

    choice = (env("STATS_BACKEND", "auto") or "auto").lower()
    if choice not in ("auto", "sync", "async", "torch"):
        raise ConfigError(f"OPSCOPE_STATS_BACKEND={choice!r} is not allowed; allowed: auto, sync, async, torch")
    if choice == "torch" or stats._fastats is None:
        return "torch"
    # module level sees few tensors and cannot see in-place ops between module calls, so
    # it reduces at once; finer levels hand tensors to the native thread.
    return "sync" if choice == "sync" or level == "module" else "async"
