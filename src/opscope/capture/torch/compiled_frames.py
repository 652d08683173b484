"""Where a graph of ``torch.compile`` runs, in the model's module paths: the module each FX
node came from (dynamo's ``nn_module_stack``), and the modules around a graph's call read
from the Python frames that call it (used by :mod:`~opscope.capture.torch.compiled`)."""

from __future__ import annotations

import functools
import os
import re
import sys
from types import FrameType
from typing import Any

import torch

from opscope.capture.torch.modules import strip_wrapped, unwrap

# the frame's local or global a module path starts from, with the items taken of it:
# L['self'], G['model'], L['args'][0] (a wrapper called as func(*args): the module is its first)
_ROOT = re.compile(r"^[LG]\['[^']*'\](?:\[\d+\])*")
_INDEX = re.compile(r"\._modules\['([^']*)'\]|\[['\"]?([^\]'\"]*)['\"]?\]")
_NAME = re.compile(r"^([LG])\['([^']*)'\]((?:\[\d+\])*)$")
_ITEM = re.compile(r"\[(\d+)\]")


def source_of(node: Any) -> tuple[str, str]:
    """The root (``L['self']``, ``G['model']``) and the path from it of the module an FX
    node of dynamo's graph came from (``("", "")``: none)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", ""
    fqn = str(list(stack.values())[-1][0])
    root = _ROOT.match(fqn)
    fqn = _INDEX.sub(lambda m: "." + (m.group(1) or m.group(2)), fqn[root.end():] if root else fqn)
    return (root.group(0) if root else ""), strip_wrapped(fqn.lstrip("."))


def module_of(node: Any) -> str:
    """The module an FX node of dynamo's graph came from, as ``named_modules()`` names it
    from the graph's root (``L['self'].layers.0`` or ``L['self']._modules['layers']...``)."""
    return source_of(node)[1]


def _item(obj: Any, items: str) -> Any:
    """``obj[i][j]`` for ``items`` "[i][j]" (None where it has no such item)."""
    for index in _ITEM.findall(items):
        try:
            obj = obj[int(index)]
        except (TypeError, IndexError, KeyError):
            return None
    return obj


class Scope:
    """A running graph: the tracker's depth below it, the module of the frame that called
    it (``frame``), and what the roots of its module paths are at this call."""

    __slots__ = ("depth", "frame", "roots")

    def __init__(self, depth: int, frame: str, roots: dict[str, str]) -> None:
        self.depth, self.frame, self.roots = depth, frame, roots


# the frames of the graph call itself (compiled.py) and of dynamo are not the model's
_SKIP_FILES = (os.path.join(os.path.dirname(__file__), "compiled.py"), f"{os.sep}torch{os.sep}_dynamo{os.sep}")


def frames(tracker: Any, roots: frozenset[str]) -> tuple[str | None, str | None, dict[str, str]]:
    """Where a compiled graph runs, read from the Python frames that called it: the module
    whose frame made the graph, the module that frame returns to, and the module each root
    of the graph's module paths is at this call.

    Dynamo turns a frame that graph-breaks into code without its module hooks (they were
    traced), so the modules between the innermost call the hooks saw and the graph are
    known only from the frames: each one's ``self``. One walk per graph call, never per op.
    """
    depth = tracker.hooked()
    top = tracker._callers[depth - 1] if depth else None
    stop = (id(top), id(unwrap(top))) if top is not None else ()
    frame: str | None = None
    called: str | None = None
    found: dict[str, str] = {}
    own = True
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_filename == _SKIP_FILES[0] or _SKIP_FILES[1] in code.co_filename:
            f = f.f_back
            continue
        if own:  # the graph's own frame: its locals and globals are the roots
            own = False
            for root in roots:
                match = _NAME.match(root)
                if match:
                    scope = f.f_locals if match.group(1) == "L" else f.f_globals
                    name = tracker.name_of(_item(scope.get(match.group(2)), match.group(3)))
                    if name is not None:
                        found[root] = name
        if "self" in code.co_varnames:
            obj = f.f_locals.get("self")
            if obj is not None and id(obj) in stop:
                break
            name = tracker.name_of(obj)
            if name is not None and name != frame:
                if frame is not None:
                    called = name
                    break
                frame = name
        f = f.f_back
    return frame, called, found


@functools.cache
def _seeded(name: str) -> bool:
    """Is ``name`` (``randn``, ``dropout``, ``uniform_``) an aten op that draws random numbers?"""
    packet = getattr(torch.ops.aten, name, None) if name and not name.startswith("_") else None
    try:
        return packet is not None and any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags
                                          for o in packet.overloads())
    except (AttributeError, RuntimeError):
        return False


def random_draws(gm: Any) -> list[str]:
    """The random ops of dynamo's graph ``gm`` (``randn``, ``dropout`` with p > 0 in training),
    by name: a backend that generates its own kernels (inductor) draws them from its own
    generator, unlike eager PyTorch."""
    found: set[str] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if not _seeded(name):
            continue
        if "dropout" in name:  # F.dropout(x, p, training): no draw at p = 0 or in evaluation
            p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
            training = node.args[2] if len(node.args) > 2 else node.kwargs.get("training", True)
            if p == 0 or training is False:
                continue
        found.add(name)
    return sorted(found)
