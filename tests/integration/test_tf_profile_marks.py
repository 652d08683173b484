"""The TensorFlow profile's pure parts, without TensorFlow: pairing phase marks into
intervals, and reading TensorFlow profiler names and nesting."""

from __future__ import annotations

from opscope.profile.breakdown import breakdown
from opscope.profile.task_trace import phase_at, self_times
from opscope.profile.tensorflow_phases import SLOT, pair_marks, per_batch_runs, split_batches
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


def batch(t0: int, optimizers: int = 1) -> list[tuple[int, str]]:
    """One batch of a train step from ``t0``: forward 10, backward 20, each optimizer 10 (5 apart)."""
    out = [(t0, "forward_start"), (t0 + 10, "backward_start"), (t0 + 30, "backward_end")]
    for k in range(optimizers):
        out += [(t0 + 30 + 15 * k, "optimizer_start"), (t0 + 40 + 15 * k, "optimizer_end")]
    return out


def test_a_call_of_three_batches_is_a_window_per_batch() -> None:
    """steps_per_execution=3: the loop fetches batch 2 while batch 1 computes (data start at
    25, end at 120, after batch 1's optimizer ends at 110); only 110-120 is batch 2's wait."""
    call = marks((5, "data_start"), (20, "data_end"), *batch(30), (85, "data_start"), (120, "data_end"),
                 *batch(125), (170, "data_start"), (172, "data_end"), *batch(175))
    windows = split_batches(0, 300, pair_marks(call, end=300))
    assert [(lo, hi) for lo, hi, _ in windows] == [(0, 70), (70, 165), (165, 300)]
    first, second, third = (w[2] for w in windows)
    assert first == {"data_wait": [(5, 20)], "forward": [(30, 40)], "backward": [(40, 60)], "optimizer": [(60, 70)]}
    assert second["data_wait"] == [(85, 120)] and second["forward"] == [(125, 135)]
    assert third["data_wait"] == [(170, 172)]
    split, _, _ = breakdown(70, 165, second)
    assert split["data_wait"] == 35 and sum(split.values()) == 95


def test_a_prefetch_that_ended_before_its_batch_began_is_no_wait() -> None:
    call = marks(*batch(10), (20, "data_start"), (30, "data_end"), *batch(60))
    windows = split_batches(0, 120, pair_marks(call, end=120))
    assert [(lo, hi) for lo, hi, _ in windows] == [(0, 50), (50, 120)]
    assert windows[0][2]["data_wait"] == [] and windows[1][2]["data_wait"] == []


def test_two_optimizers_a_batch_and_the_runs_per_batch() -> None:
    call = marks(*batch(0, optimizers=2), *batch(100, optimizers=2))
    assert len(split_batches(0, 200, pair_marks(call, end=200), per_batch=1)) == 4
    windows = split_batches(0, 200, pair_marks(call, end=200), per_batch=2)
    assert [(lo, hi) for lo, hi, _ in windows] == [(0, 55), (55, 200)]
    assert per_batch_runs(8, 4, None) == 2  # a full call: 4 batches, 2 optimizers each
    assert per_batch_runs(4, 4, 2) == 1  # as the call says: it ran 4 runs in 4 batches
    assert per_batch_runs(6, 4, 2) == 2  # an epoch's last call: 3 batches of 2
    assert per_batch_runs(2, 4, None) == 1  # a short first call: one run a batch
    assert per_batch_runs(7, 4, 2) is None  # neither: not split, and said so
    assert split_batches(0, 50, pair_marks(marks(*batch(0)), end=50)) == [(0, 50, pair_marks(marks(*batch(0)), 50))]


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
