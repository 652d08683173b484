"""What kind of op an aten overload is, for the checks of ``opscope.watch`` and for the native
observers of both watch and dump (:mod:`~opscope.capture.torch.native.ops` hands it to C++).

One table, asked once per overload: is it a view or a copy of its first input (transparent to
the chain back to a NaN), a cast, an op that only moves or fills values (its -Inf is a mask),
an op whose output is uninitialised memory (never checked).
"""

from __future__ import annotations

from typing import Any

from opscope.capture.torch.dispatch import op_info

# Ops that only move or fill values: -Inf in their output was put there (a mask), not made.
SELECT_OPS = frozenset("""
masked_fill masked_fill_ where full full_like new_full fill fill_ scalar_tensor lift_fresh lift_fresh_copy
index_put index_put_ masked_scatter masked_scatter_ triu triu_ tril tril_ cat stack clone copy copy_
_to_copy expand repeat constant_pad_nd index_select gather scatter scatter_ maximum minimum max min amax amin
unsqueeze_copy view_copy _unsafe_view contiguous narrow_copy slice_scatter select_scatter _reshape_alias
""".split())
# Ops whose output holds copies of their first input's values (checked already): not read
# again, and transparent to the chain, like views. (_to_copy only when the dtype does not narrow.)
PASSTHROUGH = frozenset("""
clone _unsafe_view contiguous alias_copy detach_copy detach_ embedding index_select gather select_backward
slice_backward expand_copy permute_copy transpose_copy t_copy view_copy _reshape_copy _to_copy
""".split())
# Ops through which an additive mask (-Inf where masked, 0 elsewhere) is applied.
ADDITIVE = frozenset("add add_ sub sub_ baddbmm addmm _efficientzerotensor".split())
# Ops whose output is uninitialised memory, filled in place afterwards: never checked.
UNINITIALISED = frozenset("empty empty_like empty_strided new_empty new_empty_strided set_ resize_".split())


def base_name(op: str) -> str:
    """``aten.masked_fill_.Scalar`` -> ``masked_fill_``."""
    parts = op.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "aten" else parts[-1]


class OpKind:
    """The watch rules for one overload (and its :func:`~opscope.capture.torch.dispatch.op_info`)."""

    __slots__ = ("name", "info", "transparent", "cast", "select", "skip")

    def __init__(self, func: Any) -> None:
        info = op_info(func)
        self.name = info.name
        self.info = info
        base = base_name(info.name)
        view = bool(info.view_outputs) and not info.written_outputs
        self.cast = base == "_to_copy"
        self.transparent = view or (base in PASSTHROUGH and not self.cast)
        self.select = base in SELECT_OPS
        self.skip = base in UNINITIALISED


# overload -> its kind, filled on first use (read on the hot path: a plain dict)
KINDS: dict[Any, OpKind] = {}


def kind_of(func: Any) -> OpKind:
    """The :class:`OpKind` of an overload, computed once."""
    kind = KINDS.get(func)
    if kind is None:
        kind = KINDS[func] = OpKind(func)
    return kind
