from __future__ import annotations

import random

from opscope.profile.breakdown import breakdown, union_length
from opscope.profile.model import PHASES


def test_phases_plus_other_add_up_to_wall_exactly_random() -> None:
    rng = random.Random(7)
    for _ in range(300):
        start, end = rng.randrange(0, 1000), rng.randrange(1000, 5000)
        intervals = {}
        for phase in ("data_wait", "forward", "backward", "communication", "optimizer", "zero_grad"):
            ivs = []
            for _ in range(rng.randrange(0, 4)):
                lo = rng.randrange(-200, 5200)
                ivs.append((lo, lo + rng.randrange(1, 900)))
            intervals[phase] = ivs
        phases, comm_total, overlap = breakdown(start, end, intervals)
        assert set(phases) == set(PHASES)
        assert sum(phases.values()) == end - start
        assert all(v >= 0 for v in phases.values())
        assert phases["communication"] + overlap == comm_total


def test_comm_under_backward_is_overlap_not_extra_time() -> None:
    phases, comm_total, overlap = breakdown(0, 100,
                                            {"forward": [(0, 40)], "backward": [(40, 80)], "communication": [(60, 90)]})
    assert phases["backward"] == 40
    assert phases["communication"] == 10  # only the tail after backward is exposed
    assert overlap == 20 and comm_total == 30
    assert phases["other"] == 10


def test_disjoint_fast_path_matches_general_rule() -> None:
    phases, _, _ = breakdown(0, 50,
                             {"data_wait": [(0, 5)], "forward": [(5, 20)], "backward": [(20, 40)],
                              "optimizer": [(42, 48)]})
    assert phases == {"data_wait": 5, "forward": 15, "backward": 20, "communication": 0, "optimizer": 6,
                      "zero_grad": 0, "other": 4}


def test_union_length_merges_overlaps() -> None:
    assert union_length([(0, 10), (5, 15), (20, 30)]) == 25
