"""Op names of other frameworks, read as the torch op whose per-op rules apply to them.

Compare keys several rules by op (:func:`opscope.compare.flow.base_op`): which ops only
reshape, move or cast values (:data:`~opscope.compare.flow.PASS_THROUGH`), how much a
reduction or a normalization may magnify its inputs' error
(:mod:`opscope.compare.conditioning`). A dump read from another framework's tool names its
ops ``<namespace>.<OpType>`` (``mindspore.MatMul``, ``mindspore.ReduceMean``); a
*vocabulary* registered for that namespace says which torch op each type behaves as
(``mm``, ``mean``), so those rules apply unchanged. Types a vocabulary does not list keep
their own name (no rule applies to them).

A vocabulary is one module of data listed in :data:`BUILT_IN` (imported on first use), or
:func:`register_vocabulary` from outside opscope. Alignment never uses it: two dumps of one
framework pair by their own op names.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

__all__ = ["BUILT_IN", "register_vocabulary", "torch_base", "vocabulary"]

# namespace -> module holding its vocabulary (``VOCABULARY``), imported when first needed
BUILT_IN: dict[str, str] = {"mindspore": "opscope.compare.opnames.mindspore",
                             "tf": "opscope.compare.opnames.tensorflow"}

_VOCABULARIES: dict[str, Mapping[str, str]] = {}


def register_vocabulary(namespace: str, names: Mapping[str, str]) -> None:
    """Read ops named ``<namespace>.<OpType>`` as ``names[OpType]`` (a torch base op name,
    ``mm``, ``native_layer_norm``); refuses a second vocabulary for one namespace."""
    if namespace in _VOCABULARIES:
        raise ValueError(f"an op vocabulary for {namespace!r} is already registered")
    _VOCABULARIES[namespace] = dict(names)


def vocabulary(namespace: str) -> Mapping[str, str] | None:
    """The vocabulary of ``namespace`` (a built-in one is imported here), or None."""
    found = _VOCABULARIES.get(namespace)
    if found is None and namespace in BUILT_IN:
        module = importlib.import_module(BUILT_IN[namespace])
        if namespace not in _VOCABULARIES:
            register_vocabulary(namespace, module.VOCABULARY)
        found = _VOCABULARIES[namespace]
    return found


def torch_base(namespace: str, op_type: str) -> str | None:
    """The torch base op ``<namespace>.<op_type>`` behaves as; None when the namespace has
    no vocabulary (then the name is not a foreign op)."""
    names = vocabulary(namespace)
    if names is None:
        return None
    return names.get(op_type, op_type)
