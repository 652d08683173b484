"""Which dump files belong to which op of the execution order.

A file names its op by the op's full scoped name, mangled (``/`` -> ``_``). Usually the
mangled execution-order name is the file's. But MindSpore 2.10 (CPU) can number an op type
within a scope differently in file names than in the execution order and the IR: the
order's ``.../norm1-LayerNorm/AddN-op1`` is written as ``..._norm1-LayerNorm_AddN-op0``; a
second graph (an evaluation ``net(x)`` beside the training step) writes ``BiasAdd-op1`` for
its order's ``BiasAdd-op0``; the casts a float16 net inserts, ``Cast-op15``... are written
as ``Cast-op0``...; and the casts of a float16 GELU's backward keep their names while each
file is another cast's. Per scope and op type (the name without its ``-op<N>``):

- the same names in the files as in the order, the files written in the order the ops
  run: matched by name;
- as many names, every file's number the op's plus one same offset, the files written in
  the order the ops run: matched through that offset (the AddN, the second graph);
- otherwise nothing of that scope and type is matched (the files are reported, those ops
  have no tensors): a name that matches may be another op's.

The reader then checks each matched file against the shape the IR infers and the dtype its
kernel has on the device.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

from opscope.storage.peers.mindspore_files import mangle

_NUMBER = re.compile(r"-op(\d+)$")


def _split(name: str) -> tuple[str, int]:
    """The name without its ``-op<N>`` (the scope and the op type), and N (-1 without one)."""
    m = _NUMBER.search(name)
    return (name[:m.start()], int(m.group(1))) if m else (name, -1)


def _stem(name: str) -> str:
    return _split(name)[0]


def match_files(order: Iterable[str], first_written: Mapping[str, int]) -> tuple[dict[str, str], set[str]]:
    """``full name -> mangled op name of its files``, and the full names left without files
    because their scope and type are numbered otherwise in the files.

    ``first_written``: each mangled op name of the files, with the earliest timestamp of its
    files (the order they were written in)."""
    ops: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for full in order:
        key = mangle(full)
        stem, number = _split(key)
        ops[stem].append((number, key, full))
    files: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name in first_written:
        stem, number = _split(name)
        files[stem].append((number, name))
    matched: dict[str, str] = {}
    renumbered: set[str] = set()
    for stem, group in ops.items():
        pairs = _pairs(group, sorted(files.get(stem, [])))
        if pairs is not None and _written_in_order([full for _, _, full in group], dict(pairs), first_written):
            matched.update(pairs)
        elif stem in files:
            renumbered.update(full for _, _, full in group)
    return matched, renumbered


def _pairs(group: list[tuple[int, str, str]], names: list[tuple[int, str]]) -> list[tuple[str, str]] | None:
    """(full name, file op name) for one scope and type: by name, or by one number offset."""
    by_number = sorted(group)
    if len(names) != len(by_number) or not names:
        return None
    offsets = {number - op_number for (number, _), (op_number, _, _) in zip(names, by_number)}
    if len(offsets) != 1:
        return None
    return [(full, name) for (_, name), (_, _, full) in zip(names, by_number)]


def _written_in_order(run: list[str], files: Mapping[str, str], first_written: Mapping[str, int]) -> bool:
    """The files of the ops in ``run`` (execution order) were written in that order."""
    stamps = [first_written[files[full]] for full in run]
    return stamps == sorted(stamps)
