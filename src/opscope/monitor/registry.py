"""Every series of one monitor session, each held once: its kind, its name, its place in the step.

A series (one tensor's statistics, the loss, a learning rate) is known everywhere else by its
id, an int: the training thread hands over arrays of ids with the statistics, the detector
keeps its state in arrays indexed by id, the writer resolves ids to names only when it writes
a chunk. Per id the table holds three numbers (kind code, place in the step, name reference);
the names are held once each:

- a parameter's name (one for its gradient, its optimizer state and its weight) is a slot of
  :class:`Names`, packed UTF-8 in one buffer, which the model hooks fill as they find the
  parameters; its series are found by slot, through one array per kind (slot -> id);
- the other series (the loss, learning rates, inputs, activations, a parameter no hook knows)
  are ``"kind\\tname"`` in another :class:`Names`, found by a scan of its buffer: few series.

Appends happen on the training thread; other threads only read ids handed to them, which
exist by then (an id counts once its name reference is appended, last).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import overload

from opscope.monitor.events import KIND_ORDER

Key = tuple[str, str]
SCALAR_KINDS = ("loss", "lr")  # series looked up by name every step (the others once per call of a hook)
PLACE = 1_000_000  # a series' place: KIND_ORDER[kind] * PLACE + its position within that class


class Names:
    """Strings appended once and read by index, packed in one UTF-8 buffer (~1 byte a
    character instead of a str object's ~50 more); :meth:`find` searches the buffer."""

    __slots__ = ("_text", "_ends")

    def __init__(self) -> None:
        self._text = bytearray(b"\0")  # "\0name0\0name1\0..."
        self._ends = array("I")  # where each name ends (its "\0")

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, name: str) -> int:
        """Append ``name``; its index."""
        self._text += name.encode("utf-8", "surrogatepass") + b"\0"
        self._ends.append(len(self._text) - 1)  # last: a reader that sees the index sees the bytes
        return len(self._ends) - 1

    def __getitem__(self, i: int) -> str:
        end = self._ends[i]
        return self._text[self._ends[i - 1] + 1 if i else 1:end].decode("utf-8", "surrogatepass")

    def find(self, name: str) -> int | None:
        """The index of ``name``, None when it is not here (a scan of the buffer)."""
        raw = name.encode("utf-8", "surrogatepass")
        needle, at = b"\0" + raw + b"\0", 0
        while (at := self._text.find(needle, at)) >= 0:
            end = at + 1 + len(raw)
            i = bisect_left(self._ends, end)
            if i < len(self._ends) and self._ends[i] == end and (self._ends[i - 1] if i else 0) == at:
                return i
            at += 1
        return None


class _SeriesNames:
    """``table.names[i]`` / ``table.names[:n]``: the name of series ``i``, as a str."""

    __slots__ = ("_table",)

    def __init__(self, table: SeriesTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._table.name(j) for j in range(*i.indices(len(self._table)))]
        return self._table.name(i)


class SeriesTable:
    """Ids of the series of one session (see the module docstring)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []  # kind code -> kind
        self.kind_of = array("B")  # id -> kind code
        self.order = array("i")  # id -> place in the step (earliest first; below 2**31: PLACE x 8)
        self.params = Names()  # a parameter's name by its slot (the model hooks add them)
        # the series not found by slot: "kind\tname" packed (found by a scan: a few series, the loss,
        # learning rates, inputs, activations; a dict with a str key each held ~100 B a series more)
        self._others = Names()
        self._other_ids = array("i")  # their ids, in that order
        self._scalars: dict[Key, int] = {}  # the loss's and learning rates' ids: looked up a few times a step
        self._name = array("i")  # id -> its parameter's slot (>= 0), or ~ its index in _others
        # kind -> its series by slot: an int f when each is id f + slot (the usual case: a kind's
        # series are added in the slots' order), else an array slot -> id + 1 (0: none)
        self._by_slot: dict[str, int | array[int]] = {}
        self._counts = array("i", bytes(4 * 8))  # a KIND_ORDER class -> series placed there without a position

    def __len__(self) -> int:
        return len(self._name)

    @property
    def names(self) -> _SeriesNames:
        """Names by id: ``names[i]``, ``names[:count]``."""
        return _SeriesNames(self)

    def name(self, i: int) -> str:
        """The name of series ``i``."""
        ref = self._name[i]
        return self.params[ref] if ref >= 0 else self._others[~ref].split("\t", 1)[1]

    def key(self, i: int) -> Key:
        """``(kind, name)`` of series ``i``."""
        return self.kinds[self.kind_of[i]], self.name(i)

    def id(self, kind: str, name: str, position: int | None = None) -> int:
        """The id of series ``(kind, name)``, added when new: at ``position`` within its kind's
        class of the step (KIND_ORDER), else after the others of the class placed so."""
        i = self.find(kind, name)
        if i is not None:
            return i
        slot = self.params.find(name)
        if slot is not None:  # a parameter's: its slot holds the name
            return self.slot_id(kind, slot, position)
        i = self._add(kind, ~self._others.add(f"{kind}\t{name}"), position)
        self._other_ids.append(i)
        return i

    def scalar(self, kind: str, name: str) -> int:
        """:meth:`id` of a series looked up every step (the loss, a learning rate): a dict look-up."""
        i = self._scalars.get((kind, name))
        return i if i is not None else self.id(kind, name)

    def slot_id(self, kind: str, slot: int, position: int | None = None) -> int:
        """The id of series ``(kind, name of parameter slot)``, added when new (see :meth:`id`)."""
        i = self._of_slot(kind, slot)
        if i is None:
            i = self._other(kind, self.params[slot])  # added by name before the slot was
            i = self._slotted(kind, slot, i if i is not None else self._add(kind, slot, position))
        return i

    def _of_slot(self, kind: str, slot: int) -> int | None:
        ids = self._by_slot.get(kind)
        if isinstance(ids, int):  # as placed: each id of the kind is ids + its slot, so this or none
            i = ids + slot
            ok = 0 <= i < len(self._name) and self._name[i] == slot and self.kinds[self.kind_of[i]] == kind
            return i if ok else None
        return ids[slot] - 1 if ids is not None and slot < len(ids) and ids[slot] else None

    def _slotted(self, kind: str, slot: int, i: int) -> int:
        """Series ``i`` is ``kind`` of ``slot``: found by slot from now on."""
        ids = self._by_slot.get(kind)
        if ids is None and self._name[i] == slot or isinstance(ids, int) and ids + slot == i == ids + self._name[i]:
            self._by_slot[kind] = i - slot
            return i
        if not isinstance(ids, array):  # an array of the kind's series so far
            ids = self._by_slot[kind] = array("i")
            for j, ref in enumerate(self._name):
                if ref >= 0 and self.kinds[self.kind_of[j]] == kind:
                    ids.frombytes(bytes(4 * max(0, ref + 1 - len(ids))))
                    ids[ref] = j + 1
        ids.frombytes(bytes(4 * max(0, slot + 1 - len(ids))))
        ids[slot] = i + 1
        return i

    def find(self, kind: str, name: str) -> int | None:
        """The id of ``(kind, name)``, None when there is no such series."""
        i = self._other(kind, name)
        if i is not None or kind not in self._by_slot:
            return i
        slot = self.params.find(name)
        return None if slot is None else self._of_slot(kind, slot)

    def _other(self, kind: str, name: str) -> int | None:
        """The id of ``(kind, name)`` among the series not found by slot, None if not there."""
        scalar = kind in SCALAR_KINDS
        if scalar and (i := self._scalars.get((kind, name))) is not None:
            return i
        j = self._others.find(f"{kind}\t{name}")
        if j is None:
            return None
        if scalar:  # (a scan of the buffer cost ~5 us a look-up on the training thread)
            self._scalars[kind, name] = self._other_ids[j]
        return self._other_ids[j]

    def _add(self, kind: str, ref: int, position: int | None) -> int:
        if kind not in self.kinds:
            self.kinds.append(kind)
        rank = KIND_ORDER.get(kind, 6)
        if position is None:
            position = self._counts[rank]
            self._counts[rank] = position + 1
        self.kind_of.append(self.kinds.index(kind))
        self.order.append(rank * PLACE + position)
        self._name.append(ref)  # last: a reader that sees the id sees the rest
        return len(self._name) - 1

    def places(self, count: int | None = None) -> dict[str, int]:
        """``{"kind\\tname": place}`` of the first ``count`` series (all): index.json's ``order``."""
        n = len(self) if count is None else count
        return {f"{self.kinds[self.kind_of[i]]}\t{self.name(i)}": self.order[i] for i in range(n)}
