"""Every series of one monitor session, each held once: its kind, its name, its place in the step.

A series (one tensor's statistics, the loss, a learning rate) is known everywhere else by its
id, an int: the training thread hands over arrays of ids with the statistics, the detector
keeps its state in arrays indexed by id, the writer resolves ids to names only when it writes
a chunk. The names are the strings the session found (a parameter's name is one string for
its gradient, its optimizer state and its weight); kinds are a few codes; the place in the
step is one int64 per series. Lookups by (kind, name) go through one ``{name: id}`` dict per
kind, used when a step's layout is not cached yet. Appends happen on the training thread;
other threads only read ids handed to them, which exist by then.
"""

from __future__ import annotations

from array import array

from opscope.monitor.events import KIND_ORDER

Key = tuple[str, str]
PLACE = 1_000_000  # a series' place: KIND_ORDER[kind] * PLACE + its position within that class


class SeriesTable:
    """Ids of the series of one session (see the module docstring)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []  # kind code -> kind
        self.names: list[str] = []  # id -> name
        self.kind_of = array("B")  # id -> kind code
        self.order = array("i")  # id -> place in the step (earliest first; below 2**31: PLACE x 8)
        self._ids: dict[str, dict[str, int]] = {}  # kind -> name -> id
        self._counts: dict[int, int] = {}  # a KIND_ORDER class -> series placed there without a position

    def __len__(self) -> int:
        return len(self.names)

    def id(self, kind: str, name: str, position: int | None = None) -> int:
        """The id of series ``(kind, name)``, added when new: at ``position`` within its kind's
        class of the step (KIND_ORDER), else after the others of the class placed so."""
        ids = self._ids.get(kind)
        if ids is None:
            ids = self._ids[kind] = {}
            self.kinds.append(kind)
        i = ids.get(name)
        if i is not None:
            return i
        rank = KIND_ORDER.get(kind, 6)
        if position is None:
            position = self._counts.get(rank, 0)
            self._counts[rank] = position + 1
        i = ids[name] = len(self.names)
        self.kind_of.append(self.kinds.index(kind))
        self.order.append(rank * PLACE + position)
        self.names.append(name)  # last: a reader that sees the name sees the rest
        return i

    def find(self, kind: str, name: str) -> int | None:
        """The id of ``(kind, name)``, None when there is no such series."""
        ids = self._ids.get(kind)
        return None if ids is None else ids.get(name)

    def key(self, i: int) -> Key:
        """``(kind, name)`` of series ``i``."""
        return self.kinds[self.kind_of[i]], self.names[i]

    def places(self, count: int | None = None) -> dict[str, int]:
        """``{"kind\\tname": place}`` of the first ``count`` series (all): index.json's ``order``."""
        n = len(self.names) if count is None else count
        return {f"{self.kinds[self.kind_of[i]]}\t{self.names[i]}": self.order[i] for i in range(n)}
