"""What the native observers learn about an op overload, once, from the same rules as the
Python capture (:mod:`~opscope.capture.torch.dispatch` for dumps,
:mod:`~opscope.capture.torch.op_kinds` for watch): see ``_c/observer.h``."""

from __future__ import annotations

from typing import Any

import torch

from opscope.capture.torch.dispatch import UNMARKED_WRITES
from opscope.capture.torch.op_kinds import ADDITIVE, base_name, kind_of
from opscope.model.calls import overwrites_first

# schema argument types the native side turns into torch's spelling (str(value) in Python)
_ARG_KINDS = {"ScalarType": 1, "Layout": 2, "MemoryFormat": 3}
# Ops whose output holds their first input's values (_unsafe_view: its very memory, undeclared
# as a view): with the same dtype, the native dump takes the output's statistics from the input's
# row instead of reading it again, where that row was measured on the input's own elements in
# row-major order. _unsafe_view needs both contiguous; those that copy the elements in that order
# (_COPIES_ELEMENTS) any strides.
_COPIES = frozenset(("clone", "_to_copy", "_unsafe_view"))
_COPIES_ELEMENTS = frozenset(("clone", "_to_copy"))


def _arg_kind(type_name: str) -> int:
    if type_name.startswith("Optional[") and type_name.endswith("]"):
        type_name = type_name[len("Optional["):-1]
    return _ARG_KINDS.get(type_name, 0)


# Dense backends whose own kernel, where an op has one, runs instead of its
# CompositeImplicitAutograd decomposition (PrivateUse1: an out-of-tree device, Ascend's NPU)
_BACKENDS = ("CPU", "CUDA", "XPU", "MPS", "HIP", "PrivateUse1")


def decomposes(name: str) -> bool:
    """Does the op ``name`` (``aten::silu_backward``) run as its CompositeImplicitAutograd
    decomposition, whose parts are then recorded instead of it?

    The dispatcher takes the decomposition only where no kernel of the tensor's backend (nor
    a CompositeExplicitAutograd one) is registered: ``silu_backward`` has one too, and on CPU
    runs its own kernel, with no parts to record. Where an op has a kernel for any backend it
    counts as not decomposed: recorded whole, which is also right where it decomposes after all
    (its parts are inside it)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys = torch._C.DispatchKey
    if not has(name, keys.CompositeImplicitAutograd) or has(name, keys.CompositeExplicitAutograd):
        return False
    return not any(has(name, getattr(keys, b)) for b in _BACKENDS if hasattr(keys, b))


def classify_op(qualname: str) -> dict[str, Any] | None:
    """What an overload named like ``aten.add_.Tensor`` is, or None when it is not a
    dispatcher op (a profiler range, a manual record).

    ``composite``: a CompositeImplicitAutograd op, which a dispatch mode never sees (its
    decomposition is seen instead). Watch: ``transparent``, ``cast``, ``select``, ``skip``,
    ``additive``. Dump: ``view_outputs``, ``written_outputs``, ``uninitialized``,
    ``copies`` (the output holds the first input's values), ``random``, ``args`` (name,
    keyword-only, kind), ``unread`` (argument positions filled without being read),
    ``collective``, ``unfilled`` (outputs that hold no data yet). Both: ``written`` argument
    positions, :data:`UNMARKED_WRITES` and a collective's unmarked writes included.
    """
    ns, _, rest = qualname.partition(".")
    op, _, overload = rest.rpartition(".")
    try:
        func = getattr(getattr(getattr(torch.ops, ns), op), overload)
        kind = kind_of(func)
        # the dispatcher's own kernels: OpOverload.has_kernel_for_dispatch_key also counts the
        # Python decompositions that tracing registers (native_batch_norm has one), which eager
        # dispatch, and so a dispatch mode, never runs
        composite = decomposes(func.name())
    except Exception:  # not a registered overload
        return None
    info = kind.info
    written, written_outputs, view_outputs = tuple(info.written), tuple(info.written_outputs), tuple(info.view_outputs)
    if base_name(kind.name) == "detach_":  # writes metadata only: its output holds its input's values
        written, written_outputs, view_outputs = (), (), (0,)
    written = tuple(sorted({*written, *UNMARKED_WRITES.get(base_name(kind.name), ())}))
    args = tuple((a.name, bool(a.kwarg_only), _arg_kind(str(a.real_type))) for a in func._schema.arguments)
    return {"composite": bool(composite), "transparent": kind.transparent, "cast": kind.cast,
            "select": kind.select, "skip": kind.skip, "additive": base_name(kind.name) in ADDITIVE,
            "written": written, "view_outputs": view_outputs, "written_outputs": written_outputs,
            "uninitialized": info.uninitialized, "copies": base_name(kind.name) in _COPIES,
            "copies_elements": base_name(kind.name) in _COPIES_ELEMENTS,
            "unread": tuple(i for i, a in enumerate(func._schema.arguments)
                            if a.name in info.unread or (i == 0 and overwrites_first(kind.name))),
            "collective": info.collective, "unfilled": info.unfilled,
            "random": info.random, "args": args}
