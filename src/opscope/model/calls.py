"""What an API call's name says about it: the rule the capture's api level, the readers of
peers' dumps and replay share."""

from __future__ import annotations

# in-place operators: they write the tensor they read first (`x += y`, `x[i] = v`)
_IN_PLACE_OPERATORS = frozenset(f"__i{op}__" for op in "add sub mul truediv div floordiv mod pow matmul and or xor "
                                                         "lshift rshift".split()) | {"__setitem__"}


def in_place(func: str) -> bool:
    """``add_``, ``__iadd__``, ``__setitem__``: the call writes the tensor it reads first (not
    ``__add__`` or ``__getitem__``, whose names end in ``_`` too). ``func`` is the bare name."""
    if func.startswith("__") and func.endswith("__"):
        return func in _IN_PLACE_OPERATORS
    return func.endswith("_")
