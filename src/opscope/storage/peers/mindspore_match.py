"""Which dump files belong to which op of the execution order.

A file names its op by the op's full scoped name, mangled (``/`` -> ``_``). Usually the
mangled execution-order name is the file's. But MindSpore 2.10 (CPU) can number an op type
within a scope differently in file names than in the execution order and the IR (the
order's ``.../norm1-LayerNorm/AddN-op1`` is written as ``..._norm1-LayerNorm_AddN-op0``; the
casts a float16 net inserts, ``Cast-op15``... against files ``Cast-op0``...), so an equal
name can even be another op. Per scope and op type (the name without its ``-op<N>``):

- the same names in the files as in the order, written in the order they execute: matched
  by name (the reader still checks each file against the shapes and dtypes the IR gives);
- otherwise the numbering differs, and a name that matches may be another op: nothing of
  that scope and type is matched (the files are reported, those ops have no tensors).
  Matching by number order instead was tried on a float16 net's casts: it paired files
  with other casts of equal shape and dtype, which no check could tell apart.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from opscope.storage.peers.mindspore_files import mangle

_NUMBER = re.compile(r"-op(\d+)$")


def _stem(name: str) -> str:
    """The name without its ``-op<N>`` (the scope and the op type)."""
    m = _NUMBER.search(name)
    return name[:m.start()] if m else name


def match_files(order: Iterable[str], first_written: Mapping[str, int]) -> tuple[dict[str, str], set[str]]:
    """``full name -> mangled op name of its files`` for the ops whose scope and type are
    numbered alike in both, and the full names left without files because they are not.

    ``first_written``: each mangled op name of the files, with the earliest timestamp of its
    files. Ops of one scope and type written in another order than they execute are not
    matched either (MindSpore 2.10's casts of a float16 GELU's backward: same names, each
    file another cast's)."""
    ops: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for full in order:
        key = mangle(full)
        ops[_stem(key)].append((key, full))
    files: dict[str, set[str]] = defaultdict(set)
    for name in first_written:
        files[_stem(name)].add(name)
    matched: dict[str, str] = {}
    renumbered: set[str] = set()
    for stem, group in ops.items():
        names = files.get(stem, set())
        written = sorted((first_written[key], key) for key, _ in group) if names == {k for k, _ in group} else []
        if written and [key for _, key in written] == [key for key, _ in group]:
            matched.update((full, key) for key, full in group)
        elif names:
            renumbered.update(full for _, full in group)
    return matched, renumbered
