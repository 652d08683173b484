"""check-ranks on small dumps written with the storage writer (no torch): what data-parallel
ranks must keep identical, where it first differs, and when there is nothing to check."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opscope.check_ranks import check_ranks
from opscope.cli import check_ranks as cli
from opscope.model.records import COL, STATS, new_row
from opscope.storage.writer import DumpWriter

PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight")


def params(step: int, rank: int, offsets: dict | None = None) -> dict[tuple[str, str], np.ndarray]:
    """Each parameter before the update, its gradient and its value after, for one step.

    ``offsets`` maps (param, io) to a value added on this rank only.
    """
    out = {}
    for i, name in enumerate(PARAMS):
        base = np.linspace(-1, 1, 6, dtype=np.float32) * (i + 1) + step
        for io, value in (("param", base), ("grad", base / 10), ("output", base - base / 100)):
            out[(name, io)] = value + np.float32((offsets or {}).get((name, io), 0))
    return out


def fake_hash(x: np.ndarray) -> int:
    # Any content hash will do for the analysis; this one fills all 64 bits.
    return int.from_bytes(np.frombuffer(x.tobytes(), dtype=np.uint8)[:8].tobytes(), "little") | (1 << 63)


def write_rank(root, rank: int, steps=(0, 1, 2), changes: dict | None = None, tensors: bool = False,
               skip: tuple = (), hashes: dict | None = None) -> None:
    """One rank of a dump holding only optimizer records; ``changes[step]`` as in :func:`params`."""
    writer = DumpWriter(root, rank, {"run_id": "r1", "world_size": 2})
    writer.open()
    rid = 0
    for step in steps:
        values = params(step, rank, (changes or {}).get(step))
        rows, seq = [], 0
        for io in ("param", "grad", "output"):
            for call, name in enumerate(PARAMS):
                if (step, name, io) in skip:
                    continue
                x = values[(name, io)]
                h = (hashes or {}).get((step, name, io), fake_hash(x))
                row = new_row(id=rid, rank=rank, step=step, seq=seq, phase="optimizer", module=name.split(".")[0],
                              op="SGD.step", call=call, io=io, slot=0, dtype="float32", shape=[x.size],
                              numel=x.size, param=None if io == "grad" else name)
                row[STATS] = (float(x.min()), float(x.max()), float(x.mean()), float(x.std()),
                              float(np.linalg.norm(x)), float(abs(x).max()), 0, 0, 0, h)
                if tensors:
                    key = f"r{rid}"
                    row[COL["data"]] = writer.add_tensor(step, key, "float32", [x.size], x.tobytes(), x.nbytes)
                    row[COL["key"]] = key
                rows.append(row)
                rid += 1
                seq += 1
        writer.add_rows(step, rows)
        writer.end_step(step)
    writer.close()


def test_identical_ranks_pass(tmp_path) -> None:
    for rank in (0, 1):
        write_rank(tmp_path, rank)
    check = check_ranks(tmp_path)
    assert check and check.status == "identical" and check.first is None
    assert (check.ranks, check.steps, check.params, check.checked) == ([0, 1], [0, 1, 2], 3, 27)


def test_a_changed_gradient_is_the_first_difference(tmp_path) -> None:
    write_rank(tmp_path, 0)
    # Rank 1's gradient of fc2.weight changed at step 1; its update differs too, then its parameter.
    write_rank(tmp_path, 1, changes={1: {("fc2.weight", "grad"): 0.5, ("fc2.weight", "output"): -0.005},
                                     2: {("fc2.weight", "param"): -0.005, ("fc2.weight", "output"): -0.005}})
    check = check_ranks(tmp_path)
    assert not check and check.status == "differs"
    first = check.first
    assert (first.step, first.param, first.io, first.ranks, first.reference) == (1, "fc2.weight", "grad", (1,), (0,))
    assert [(d.step, d.io) for d in check.differences] == [(1, "grad"), (1, "output"), (2, "param"), (2, "output")]
    grad = params(1, 0)[("fc2.weight", "grad")]
    expected = abs(np.linalg.norm(grad + 0.5) - np.linalg.norm(grad)) / np.linalg.norm(grad + 0.5)
    assert first.rel_l2_lower_bound == pytest.approx(expected, rel=1e-5) and first.rel_l2 is None


def test_distances_come_from_full_tensors_when_dumped(tmp_path) -> None:
    write_rank(tmp_path, 0, tensors=True)
    write_rank(tmp_path, 1, tensors=True, changes={0: {("fc1.bias", "param"): 0.25}})
    first = check_ranks(tmp_path).first
    assert (first.step, first.param, first.io) == (0, "fc1.bias", "param")
    reference = params(0, 0)[("fc1.bias", "param")].astype(np.float64)
    assert first.max_abs_diff == pytest.approx(0.25, rel=1e-6)
    assert first.rel_l2 == pytest.approx(np.linalg.norm(np.full(6, 0.25)) / np.linalg.norm(reference), rel=1e-5)


def test_the_odd_rank_out_is_named_against_the_majority(tmp_path) -> None:
    for rank in (0, 1, 2):
        write_rank(tmp_path, rank, changes={2: {("fc1.weight", "output"): 1.0}} if rank == 1 else None)
    first = check_ranks(tmp_path).first
    assert (first.step, first.io, first.ranks, first.reference) == (2, "output", (1,), (0, 2))


def test_hashes_that_differ_in_their_lowest_bit_differ(tmp_path) -> None:
    write_rank(tmp_path, 0, hashes={(0, "fc1.weight", "param"): 2**64 - 2})
    write_rank(tmp_path, 1, hashes={(0, "fc1.weight", "param"): 2**64 - 1})
    first = check_ranks(tmp_path).first
    assert (first.step, first.param, first.io) == (0, "fc1.weight", "param")
    assert first.rel_l2_lower_bound == 0  # same norms: only the hash tells


def test_a_tensor_recorded_on_one_rank_only(tmp_path) -> None:
    write_rank(tmp_path, 0)
    write_rank(tmp_path, 1, skip=((1, "fc1.bias", "grad"),))
    first = check_ranks(tmp_path).first
    assert (first.step, first.param, first.io, first.ranks, first.missing) == (1, "fc1.bias", "grad", (), (1,))


def test_one_rank_cannot_be_checked(tmp_path) -> None:
    write_rank(tmp_path, 7)
    check = check_ranks(tmp_path)
    assert check.status == "cannot_check" and not check
    assert check.reason.startswith("only rank 7 wrote this dump")


def test_ranks_with_no_common_step_cannot_be_checked(tmp_path) -> None:
    write_rank(tmp_path, 0, steps=(0,))
    write_rank(tmp_path, 1, steps=(1,))
    check = check_ranks(tmp_path)
    assert check.status == "cannot_check" and "different steps" in check.reason


def test_cli_exit_codes_and_messages(tmp_path, capsys) -> None:
    same, diff, one = tmp_path / "same", tmp_path / "diff", tmp_path / "one"
    for rank in (0, 1):
        write_rank(same, rank)
        write_rank(diff, rank, changes={1: {("fc2.weight", "grad"): 0.5}} if rank else None)
    write_rank(one, 1)

    assert cli.main([str(same)]) == 0
    assert capsys.readouterr().out.startswith("identical across ranks 0, 1: 3 parameters in steps 0-2")
    assert cli.main([str(diff)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("ranks differ: first at step 1, parameter 'fc2.weight', grad (gradient at optimizer.step, "
                      "after the all-reduce): rank 1 differs from rank 0")
    assert out[1].startswith("  relative L2 distance >= ")
    assert cli.main([str(one)]) == 2
    assert "only rank 1 wrote" in capsys.readouterr().out
    assert cli.main([str(diff), "--json", "--step", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == [0]
