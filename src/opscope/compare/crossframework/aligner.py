"""The cross-framework aligner: sides, then matched calls, then paired rows (see the package
docstring for the steps)."""

from __future__ import annotations

from typing import Any

from opscope.compare.align import Pair
from opscope.compare.crossframework.layers import match_layers
from opscope.compare.crossframework.layouts import apply_layouts
from opscope.compare.crossframework.matcher import CallMatcher, Claims
from opscope.compare.crossframework.pairing import RowPairing
from opscope.compare.crossframework.sides import Side
from opscope.compare.crossframework.tables import table_for


def align_partition(t_rows: list[dict[str, Any]], r_rows: list[dict[str, Any]],
                    t_level: str | None, r_level: str | None) -> list[Pair]:
    """Align one (rank, step) of two dumps of which at least one is a foreign (non-torch) dump."""
    t_level, r_level = t_level or "aten", r_level or "aten"
    t = Side.build("target", t_level, t_rows, table_for(t_level))
    r = Side.build("reference", r_level, r_rows, table_for(r_level))
    claims = Claims()
    layers = _layer_side(t, r)
    if layers is not None:
        match_layers(t, r, claims)
    else:
        CallMatcher(t, r, claims).run()
    pairing = RowPairing(t, r, claims)
    pairing.pair_leaves()
    for match in sorted(claims.matches, key=lambda m: m.t[-1].seq):
        if pairing.founded(match):
            pairing.pair_outputs(match)
        else:
            claims.unclaim(match)
    for match in claims.matches:
        pairing.pair_inputs(match)
    pairing.pair_params_by_name()
    pairing.identities()
    pairing.absorb(t)
    pairing.absorb(r)
    pairs = pairing.finish()
    if layers is not None:
        apply_layouts(pairs, layers)
    return pairs


def _layer_side(t: Side, r: Side) -> Side | None:
    """The side of a layer-level framework (a Keras dump) against a torch dump, or None."""
    for foreign, other in ((t, r), (r, t)):
        if foreign.table is not None and foreign.table.layers and other.table is None:
            return foreign
    return None
