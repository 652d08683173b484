"""Ids: ``first``, a culprit number, ``rank:step:seq``; errors name what to give instead."""

from __future__ import annotations

import pytest

from opscope.errors import ReplayError
from opscope.replay.locate import locate

SUMMARY = {"first_divergence": None, "culprits": [
    {"id": "0:1:57", "kind": "culprit", "rank": 0, "step": 1, "phase": "forward", "module": "m",
     "op": "aten.mm.default",
     "calls": {"target": {"seq": 57, "capture": []}, "reference": {"seq": 60, "capture": []}}},
    {"id": "0:1:3", "kind": "root", "rank": 0, "step": 1, "phase": "forward", "module": "", "op": "x", "calls": {}},
]}


def test_culprit_by_number_and_by_id():
    for op_id in ("1", "0:1:57"):
        ref = locate(SUMMARY, op_id)
        assert (ref.rank, ref.step, ref.seqs) == (0, 1, {"target": 57, "reference": 60})


@pytest.mark.parametrize("op_id, message", [
    ("first", "no divergence"), ("3", "lists 2 culprits"), ("2", "is a root"), ("gelu", "is not an id"),
    ("0:1:99", "not one of the culprits"),
])
def test_bad_ids_say_what_to_give(op_id, message):
    with pytest.raises(ReplayError, match=message):
        locate(SUMMARY, op_id)
