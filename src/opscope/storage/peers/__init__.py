"""Dumps written by other tools (msprobe, MindSpore's Data Dump), read as opscope records.

A peer format is one module here that registers itself with :func:`register_format`: a
``detect(path)`` that says whether ``path`` (the dump root, a step folder or a rank folder)
holds a dump of that tool, and an ``open(path)`` that returns a :class:`PeerDump`.
:func:`opscope.storage.reader.load` tries them, in :data:`BUILT_IN` order, on any folder
without an opscope ``manifest.json``; compare, show, convert and replay then work unchanged.

Readers never unpickle (``torch.load(..., weights_only=True)``, ``np.load(...,
allow_pickle=False)``) and never turn a name read from a file into a path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opscope.storage import reader
from opscope.storage.peers.base import PeerDump

__all__ = ["BUILT_IN", "PeerDump", "PeerFormat", "formats", "open_peer", "register_format"]

# Modules that register the built-in peer formats, imported on first use.
BUILT_IN: tuple[str, ...] = ("opscope.storage.peers.msprobe", "opscope.storage.peers.mindspore")


@dataclass(frozen=True)
class PeerFormat:
    """One tool's dump layout: ``detect(path)`` is true when ``path`` holds such a dump."""

    name: str
    detect: Callable[[Path], bool]
    open: Callable[[Path], PeerDump]


_FORMATS: dict[str, PeerFormat] = {}


def register_format(name: str, detect: Callable[[Path], bool]) -> Callable[[Callable[[Path], PeerDump]],
                                                                          Callable[[Path], PeerDump]]:
    """Register ``open`` (the decorated function) for dumps that ``detect`` recognises."""
    def wrap(open_fn: Callable[[Path], PeerDump]) -> Callable[[Path], PeerDump]:
        _FORMATS[name] = PeerFormat(name, detect, open_fn)
        return open_fn
    return wrap


def formats() -> list[PeerFormat]:
    """Every registered peer format (the built-in ones imported first)."""
    for module in BUILT_IN:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a built-in reader whose own import failed: a real bug
                raise
    return list(_FORMATS.values())


def open_peer(path: str | Path) -> PeerDump | None:
    """The peer dump at ``path``, or None when no registered format recognises it."""
    p = Path(path)
    for peer in formats():
        if peer.detect(p):
            return peer.open(p)
    return None


reader.PEER_OPENERS.append(open_peer)
