"""The TensorFlow profile's pure parts, without TensorFlow: pairing phase marks into
intervals, and reading TensorFlow profiler names and nesting."""

from __future__ import annotations

from opscope.profile.breakdown import breakdown
from opscope.profile.task_trace import phase_at, self_times
from opscope.profile.tensorflow_phases import SLOT, pair_marks
from opscope.profile.tensorflow_trace import _CALL_PREFIX


def marks(*pairs: tuple[int, str]) -> list[tuple[int, int]]:
    return sorted((t, SLOT[name]) for t, name in pairs)


def test_a_graph_step_pairs_into_the_four_phases_and_adds_up() -> None:
    step = marks(
        (10, "data_start"),
        (30, "data_end"),
        (35, "forward_start"),
        (60, "forward_end"),
        (70, "backward_start"),
        (150, "backward_end"),
        (155, "optimizer_start"),
        (190, "optimizer_end"),
    )
    phases = pair_marks(step, end=200)
    assert phases == {
        "data_wait": [(10, 30)],
        "forward": [(35, 70)],
        "backward": [(70, 150)],
        "optimizer": [(155, 190)],
    }
    split, _, _ = breakdown(0, 200, phases)
    assert split["forward"] == 35 and split["other"] == 10 + 5 + 5 + 10
    assert sum(split.values()) == 200


def test_forward_without_backward_ends_at_the_last_outer_call() -> None:
    phases = pair_marks(marks((5, "forward_start"), (25, "forward_end")), end=100)
    assert phases["forward"] == [(5, 25)] and phases["backward"] == []


def test_an_end_without_its_start_is_dropped_and_an_open_forward_runs_to_the_step_end() -> None:
    phases = pair_marks(marks((5, "backward_end"), (10, "optimizer_end"), (20, "forward_start")), end=90)
    assert phases["backward"] == [] and phases["optimizer"] == [] and phases["forward"] == [(20, 90)]


def test_two_forward_backward_passes_in_one_step_are_both_counted() -> None:
    step = marks(
        (0, "forward_start"),
        (10, "backward_start"),
        (20, "backward_end"),
        (30, "forward_start"),
        (40, "backward_start"),
        (50, "backward_end"),
    )
    phases = pair_marks(step, end=60)
    assert phases["forward"] == [(0, 10), (30, 40)] and phases["backward"] == [(10, 20), (40, 50)]


def test_profiler_names_lose_their_function_call_prefixes_only() -> None:
    assert (
        _CALL_PREFIX.sub("", "StatefulPartitionedCall/functional_1/dense/MatMul:MatMul")
        == "functional_1/dense/MatMul:MatMul"
    )
    assert (
        _CALL_PREFIX.sub("", "cond/then/_5/cond/StatefulPartitionedCall/gradient_tape/x/Mul:Mul")
        == "gradient_tape/x/Mul:Mul"
    )
    assert _CALL_PREFIX.sub("", "Iterator::Root::Prefetch") == "Iterator::Root::Prefetch"


def test_self_time_subtracts_nested_events_on_one_thread() -> None:
    items = [[0, 100, "outer", 0], [10, 40, "inner", 0], [50, 60, "inner2", 0], [120, 130, "next", 0]]
    self_times(items)
    assert [it[3] for it in items] == [40, 0, 0, 0]
    assert phase_at(15, {"backward": [(10, 20)], "forward": [(0, 30)]}) == "backward"
    assert phase_at(40, {"backward": [(10, 20)]}) == "other"
