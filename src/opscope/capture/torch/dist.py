"""Rank and world size: from torch.distributed when initialised, else RANK / LOCAL_RANK."""

from __future__ import annotations

from opscope.config.env import foreign


def current_rank() -> int:
    """This process's global rank (0 when not distributed)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a broken or absent distributed backend means "not distributed"
        pass
    for name in ("RANK", "LOCAL_RANK"):
        value = foreign(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def world_size() -> int:
    """Number of ranks (1 when not distributed)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:
        pass
    value = foreign("WORLD_SIZE") or "1"
    return int(value) if value.isdigit() else 1
