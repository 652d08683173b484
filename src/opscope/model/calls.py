"""What an API call's name says about it: the rule the capture's api level, the readers of
peers' dumps and replay share."""

from __future__ import annotations

import functools

# in-place operators: they write the tensor they read first (`x += y`, `x[i] = v`)
_IN_PLACE_OPERATORS = frozenset(f"__i{op}__" for op in "add sub mul truediv div floordiv mod pow matmul and or xor "
                                                         "lshift rshift".split()) | {"__setitem__"}


def in_place(func: str) -> bool:
    """``add_``, ``__iadd__``, ``__setitem__``: the call writes the tensor it reads first (not
    ``__add__`` or ``__getitem__``, whose names end in ``_`` too). ``func`` is the bare name."""
    if func.startswith("__") and func.endswith("__"):
        return func in _IN_PLACE_OPERATORS
    return func.endswith("_")


# In-place ops that fill their first argument without reading it: a random draw into
# empty_like's uninitialized memory (dropout's bernoulli_), a fill, the destination of a copy.
OVERWRITES_FIRST = frozenset({"bernoulli_", "uniform_", "normal_", "random_", "exponential_", "geometric_",
                              "cauchy_", "log_normal_", "fill_", "zero_", "copy_"})


# Random draws, as parts of op names at every level (aten.bernoulli_, torch.nn.functional.dropout,
# Dropout, torch.randn_like): a draw made again from another generator state differs although
# its inputs agree (activation checkpointing without the forward's generator state).
DRAWS = ("bernoulli", "dropout", "rand", "normal", "uniform", "multinomial", "exponential")


def draws(op: str) -> bool:
    """Is op ``op`` (any level's name) a random draw?"""
    name = op.lower()
    return any(d in name for d in DRAWS)


def empty_base(base: str) -> bool:
    """Is ``base`` (an op's base name: ``empty_like``, ``new_empty_strided``) an op whose output
    holds no data yet? The aten level's rule (capture/torch/dispatch.py), the API level's too."""
    return base.startswith(("empty", "new_empty")) or base.endswith("empty_like")


@functools.cache
def makes_empty(op: str) -> bool:
    """Does API call ``op`` (``torch.empty_like``, ``Tensor.new_empty``) return memory that holds
    no data yet? Its output is recorded unmeasured, as the aten level's empties are (before
    session 27 the API level measured what the memory held: DeepSeek-V3's `new_empty` named in
    the same run twice)."""
    return empty_base(op.rsplit(".", 1)[-1])


# API calls that rearrange their first argument's elements (a view, or a copy of some of them):
# where it holds no data yet, neither does what they return (DeepSeek-V3's `q[..., :n]` of an
# empty, to be written, measured its old bytes at the API level before session 27).
REARRANGING = frozenset("""
__getitem__ view view_as reshape reshape_as transpose permute narrow select split chunk unbind t T mT
expand expand_as unsqueeze squeeze flatten unflatten movedim swapaxes as_strided diagonal unfold
""".split())


@functools.cache
def rearranges(op: str) -> bool:
    """Does API call ``op`` (``Tensor.__getitem__``, ``torch.transpose``) only rearrange its
    first argument's elements?"""
    return op.rsplit(".", 1)[-1] in REARRANGING


# Of those, the calls whose output, where it is a view of the first argument with as many elements
# of its dtype, holds that argument's elements (as_strided, diagonal and unfold may repeat some):
# its row is linked to the argument's, not read again (since session 43; the aten level links
# view ops by their schemas).
_SOME_ELEMENTS = frozenset({"as_strided", "diagonal", "unfold"})


@functools.cache
def views_first(op: str) -> bool:
    """Does API call ``op`` (``Tensor.view``, ``torch.transpose``) return views that hold its
    first argument's elements where they are as many (capture checks each output)?"""
    base = op.rsplit(".", 1)[-1]
    return base in REARRANGING and base not in _SOME_ELEMENTS


@functools.cache  # asked once per recorded call (capture's Python paths): a name is looked up once
def overwrites_first(op: str) -> bool:
    """Does op ``op`` (``aten.copy_.default``, ``Tensor.fill_``, ``fill_``) write its first
    argument without reading it? Its value there is never measured nor judged."""
    parts = op.split(".")
    base = parts[1] if len(parts) > 2 and parts[0] == "aten" else parts[-1]
    return base in OVERWRITES_FIRST
