"""The data flow of :class:`~opscope.capture.torch.recorder.Recorder` (:class:`DataFlow`: the
row that last measured each tensor) and its helpers: where a tensor's elements are (to find a
view again by its geometry), a view's place in its input's data (kept as geometry with full
tensors), and the tag on an autograd node that names the forward module and op behind it
(backward attribution)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from opscope.model.records import COL

_MODULE, _OP = COL["module"], COL["op"]


def view_geometry(view: torch.Tensor, base: torch.Tensor | None) -> str | None:
    """JSON ``{"shape", "stride", "offset"}`` placing ``view`` in the contiguous data of
    ``base`` (in elements), or None when ``view`` cannot be read back that way: complex
    data is stored as real pairs, and a conjugate or negative view's values are not its
    base's, so those are stored as themselves."""
    if base is None or not base.is_contiguous() or base.dtype != view.dtype or base.device != view.device:
        return None
    if view.is_complex() or view.is_conj() or view.is_neg():
        return None
    offset, size = view.data_ptr() - base.data_ptr(), view.element_size()
    if offset < 0 or offset % size:
        return None
    import json

    return json.dumps({"shape": list(view.shape), "stride": list(view.stride()), "offset": offset // size})


def version_of(t: torch.Tensor) -> int:
    """The tensor's version counter (torch bumps it on every in-place write), -1 for an
    inference tensor, which has none."""
    try:
        return t._version
    except RuntimeError:
        return -1


def storage_of(t: torch.Tensor) -> Any:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def storage_key(t: torch.Tensor) -> int:
    """The address of a tensor's storage (-1 for one without: sparse, a wrapper subclass)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


def geometry(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor's elements: storage, offset, shape, strides, dtype."""
    try:
        offset = t.storage_offset()
        return (t.data_ptr() - offset * t.element_size(), offset, tuple(t.shape), t.stride(), t.dtype)
    except (RuntimeError, NotImplementedError):
        return (id(t),)


def holds_elements_of(view: torch.Tensor, base: torch.Tensor | None) -> bool:
    """Is ``view`` a view of ``base``'s storage with as many elements of its dtype, its signs and
    conjugation, so that a call known to keep its argument's elements (``views_first``) returned
    them all? (dumpobs_api.h ``holds_elements_of``, natively.)"""
    if base is None or not view._is_view() or view.dtype != base.dtype or view.numel() != base.numel():
        return False
    if view.is_conj() != base.is_conj() or view.is_neg() != base.is_neg():
        return False
    a, b = storage_of(view), storage_of(base)
    return a is not None and b is not None and a._cdata == b._cdata


def _on_storage(ref: StorageWeakRef | None, t: torch.Tensor) -> bool:
    """Is ``t``'s storage the one ``ref`` holds weakly? (The weak reference keeps that
    storage's address from being taken by another while it is held.)"""
    storage = storage_of(t)
    return ref is not None and storage is not None and storage._cdata == ref.cdata


def grad_fn_of(t: torch.Tensor) -> Any:
    """The autograd node that made ``t``, or None: none, or a view that no_grad made of a tensor
    that requires grad and that was written in place since (``w[1] += d`` under no_grad), whose
    ``grad_fn`` raises (the user's code never reads it; opscope must not fail on it)."""
    if not t.requires_grad:
        return None
    try:
        return t.grad_fn
    except RuntimeError:
        return None


def annotate(t: torch.Tensor, producer: list[Any]) -> None:
    """Tag the autograd node that made ``t`` with the forward module and op, for backward
    attribution; a custom autograd Function's node with the Function (its forward ran in
    the module that called ``apply``)."""
    node = grad_fn_of(t)
    if node is not None:
        function = getattr(node, "_forward_cls", None)
        tag = (producer[_MODULE], function.__name__ if function else producer[_OP])
        # torch's stub declares Node.metadata a method; autograd's C++ nodes make it a dict property
        node.metadata.setdefault("opscope", tag)


class DataFlow:
    """One step's map from tensors to the rows that last measured them (the Python path of
    what the native dump keeps in C++: dumpobs.cpp's ``flow``, ``geo``, ``g_writes`` and
    ``g_written``).

    An entry is ``[weakref, row, version, param name, tagged, writes]``: it holds while the
    tensor is the same object at the same version and no in-place write was seen on its
    storage since (``writes``, counted by :meth:`before_write`). Views are also kept by
    geometry (autograd wraps view outputs in new tensor objects), forgotten when their
    storage is written. A tensor written in place through a view of it (``buf[:, 2] = x``)
    is kept apart: its next read is measured anew, with that write for its producer."""

    def __init__(self) -> None:
        self.entries: dict[Any, list[Any]] = {}
        self.views: dict[int, list[tuple[Any, ...]]] = {}
        self.writes: dict[int, int] = {}  # storage address -> in-place writes seen on it this step
        # id(base) -> (weakref, write's row, version, a collective's result: its version moves on as it arrives)
        self.written: dict[int, tuple[Any, list[Any], int, bool]] = {}

    def same(self, t: torch.Tensor, version: int) -> list[Any] | None:
        """The entry of this very tensor, unchanged since, or None."""
        entry = self.entries.get(id(t))
        if entry is not None and entry[0]() is t and entry[2] == version and entry[5] == self.writes_to(t):
            return entry
        return None

    def find(self, t: torch.Tensor) -> list[Any] | None:
        """The entry of ``t`` as it is now: the same tensor, or a view found by its geometry."""
        entry = self.same(t, version_of(t))
        if entry is None and self.views:
            entry = self.entries.get(geometry(t))
            if entry is not None and not _on_storage(entry[5], t):
                return None  # another storage that took the recorded one's freed memory
        return entry

    def stale(self, t: torch.Tensor) -> list[Any] | None:
        """The row this very tensor last had, changed since or not (None: none, or another
        tensor's at a reused id)."""
        entry = self.entries.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def register(self, t: torch.Tensor, row: list[Any], version: int, pname: str | None,
                 view: bool = False) -> None:
        self.entries[id(t)] = [weakref.ref(t), row, version, pname, False, self.writes_to(t)]
        if view:  # its storage held weakly: no other storage takes its address, its memory is freed as without us
            key = geometry(t)
            storage = storage_of(t)
            self.entries[key] = [None, row, version, pname, False, None if storage is None else StorageWeakRef(storage)]
            self.views.setdefault(key[0], []).append(key)

    def wrote_through(self, view: torch.Tensor, row: list[Any], version: int) -> None:
        """``view`` was written in place (its row ``row``): if it is a view, its base's next read
        has that row for its producer."""
        base = view._base if view._is_view() else None
        if base is not None:
            self.written[id(base)] = (weakref.ref(base), row, version, False)

    def written_here(self, t: torch.Tensor, row: list[Any], collective: bool = False) -> None:
        """The next read of ``t``, and of its base, is measured with output row ``row`` for its
        producer: a tensor an API call wrote in place and did not return (``Tensor.__setitem__``),
        or (``collective``) the result of a collective, filled after its op returned."""
        base = t._base if t._is_view() else None
        for x in (t,) if base is None else (t, base):
            self.written[id(x)] = (weakref.ref(x), row, version_of(x), collective)

    def holds_result(self, t: torch.Tensor, row: list[Any]) -> None:
        """``t`` holds the result of the collective whose output row is ``row``."""
        self.written_here(t, row, collective=True)

    def result_of(self, t: torch.Tensor) -> list[Any] | None:
        """The output row of the collective whose result ``t`` holds, or None."""
        found = self.written.get(id(t)) if self.written else None
        return found[1] if found is not None and found[3] and found[0]() is t else None

    def written_by(self, t: torch.Tensor) -> int | None:
        """The id of the row of the write that last made part of ``t`` through a view (or of the
        collective whose result it holds), or None."""
        found = self.written.get(id(t)) if self.written else None
        if found is None or found[0]() is not t or (not found[3] and found[2] != version_of(t)):
            return None
        return int(found[1][COL["id"]])

    def before_write(self, t: torch.Tensor) -> None:
        """``t`` is about to be written in place: the write counted on its storage, and views
        registered on that storage forgotten."""
        key = storage_key(t)
        self.writes[key] = self.writes.get(key, 0) + 1
        if self.views:
            for geo in self.views.pop(geometry(t)[0], None) or ():
                self.entries.pop(geo, None)

    def writes_to(self, t: torch.Tensor) -> int:
        return self.writes.get(storage_key(t), 0) if self.writes else 0
