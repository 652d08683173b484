"""The data-flow helpers of :class:`~opscope.capture.torch.recorder.Recorder`: where a
tensor's elements are (to find a view again by its geometry), a view's place in its input's
data (kept as geometry with full tensors), and the tag on an autograd node that names the
forward module and op behind it (backward attribution)."""

from __future__ import annotations

from typing import Any

import torch

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


def annotate(t: torch.Tensor, producer: list[Any]) -> None:
    """Tag the autograd node that made ``t`` with the forward module and op, for backward
    attribution; a custom autograd Function's node with the Function (its forward ran in
    the module that called ``apply``)."""
    if t.requires_grad:
        node = t.grad_fn
        if node is not None:
            function = getattr(node, "_forward_cls", None)
            tag = (producer[_MODULE], function.__name__ if function else producer[_OP])
            # torch's stub declares Node.metadata a method; autograd's C++ nodes make it a dict property
            node.metadata.setdefault("opscope", tag)  # type: ignore[attr-defined]
