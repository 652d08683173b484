"""Which tensors an API-level call writes, for the data flow of both API modes.

The API level links a tensor's next read to the row that last measured it while its version
counter stays the same. Most writes move that counter; these do not, and are told apart here:

- the first argument of an in-place call (``Tensor.add_``, ``__setitem__``): :func:`writes_first`,
  registered again after the call as its output (torch moved its version already);
- arguments a call writes without moving their version counters: :func:`unmarked_writes`.
  Batch norm's running statistics (its schema does not even mark them written), and every
  argument other than an in-place first tensor that the aten schema of the call's name marks
  written (``Tensor(a!)``): GradScaler's ``torch._amp_foreach_non_finite_check_and_unscale_``
  writes the gradients and ``found_inf`` with no version moved, ``torch._amp_update_scale_``
  its growth tracker, the fused optimizers (``torch._fused_adamw_``) the parameters and their
  states. Before, the next read of ``found_inf`` carried the 0 it held before the check (a
  skipped step read as not skipped) and the optimizer's gradients the statistics from before
  the unscaling.
"""

from __future__ import annotations

from typing import Any

import torch

from opscope.model.calls import in_place, makes_empty

_WRITES_FIRST: dict[str, bool] = {}


def writes_first(name: str) -> bool:
    """An in-place API call, which writes the tensor it reads first: ``Tensor.add_``,
    ``Tensor.__iadd__``, ``Tensor.__setitem__``; not ``Tensor.__add__`` or ``__getitem__``."""
    hit = _WRITES_FIRST.get(name)
    if hit is None:
        hit = _WRITES_FIRST[name] = in_place(name.rpartition(".")[2])
    return hit


# Calls whose schemas do not mark what they write (dispatch.UNMARKED_WRITES at the aten level):
# name -> (position, keyword, a list of tensors) of each written argument.
Written = tuple[tuple[int, str, bool], ...]
API_UNMARKED_WRITES: dict[str, Written] = {
    "torch.nn.functional.batch_norm": ((1, "running_mean", False), (2, "running_var", False)),
    "torch.nn.functional.instance_norm": ((1, "running_mean", False), (2, "running_var", False)),
    "torch.batch_norm": ((3, "running_mean", False), (4, "running_var", False)),
    "torch.instance_norm": ((3, "running_mean", False), (4, "running_var", False)),
}
WRITTEN: dict[str, Written] = dict(API_UNMARKED_WRITES)  # name -> its written arguments, looked up once
_TENSORS = frozenset(("Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]"))


def written_args(name: str) -> Written:
    """(position, keyword, a list) of each argument API call ``name`` writes besides an in-place first
    tensor: ``API_UNMARKED_WRITES``, else what the aten schemas of the name say (looked up once
    a name; ``out=`` arguments are left out: writing them moves their version)."""
    hit = WRITTEN.get(name)
    if hit is None:
        hit = WRITTEN[name] = _schema_writes(name)
    return hit


def _schema_writes(name: str) -> Written:
    owner, _, base = name.rpartition(".")
    if owner not in ("torch", "Tensor") or base.startswith("__"):
        return ()
    try:
        packet = getattr(torch.ops.aten, base)
        schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    except (AttributeError, RuntimeError):  # no aten op of that name
        return ()
    found: dict[tuple[int, bool], str] = {}
    for schema in schemas:
        for i, arg in enumerate(schema.arguments):
            kind = str(arg.type)  # (not TorchScript's list ops, aten.add_.t: a t[] written)
            written = arg.alias_info is not None and arg.alias_info.is_write and not arg.kwarg_only
            if written and kind in _TENSORS and not (i == 0 and kind == "Tensor"):
                found.setdefault((i, kind.startswith("List")), arg.name)
    return tuple((i, key, listed) for (i, listed), key in sorted(found.items()))


def unmarked_writes(written: Written, args: tuple, kwargs: dict[str, Any]) -> list[tuple[int, None, torch.Tensor]]:
    """The tensors at ``written`` (:func:`written_args`) of a call's arguments, as call items;
    a list argument (``Tensor(a!)[]``) gives each of its tensors. Where the schemas of a name
    disagree (``torch.sort``'s TorchScript overload sorts a written ``Tensor[]``; its tensor
    one writes nothing) the argument's own type picks."""
    found: list[torch.Tensor] = []
    for i, key, listed in written:
        value = args[i] if i < len(args) else kwargs.get(key)
        if not listed and isinstance(value, torch.Tensor):
            found.append(value)
        elif listed and isinstance(value, (list, tuple)):
            found += [t for t in value if isinstance(t, torch.Tensor)]
    return [(i, None, t) for i, t in enumerate(found)]


def makes_empty_call(name: str, args: tuple) -> bool:
    """Does this call return memory that holds no data yet? ``makes_empty(name)``, or the legacy
    constructor ``Tensor.new`` given sizes (``x.new(4, 16)``, ``x.new(torch.Size)``: aten.empty;
    Reformer's inverse permutation is scattered into one). Given data (``x.new([1, 2])``) it
    copies them."""
    if name != "Tensor.new":
        return makes_empty(name)
    sizes = args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], torch.Size):
        return True
    return bool(sizes) and all(isinstance(n, (int, torch.SymInt)) and not isinstance(n, bool) for n in sizes)
