"""Dumps across processes: ranks in the manifest, runs never mixed, forked workers quiet."""

from __future__ import annotations

import json

import torch
from dump_helpers import train

import opscope
from opscope.storage.reader import load


def test_manifest_lists_ranks_and_overwrite_drops_other_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_RUN_ID", "run-a")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        train(tmp_path / "d", 1)
    dump = load(tmp_path / "d")
    assert dump.manifest["ranks"] == [0, 1] and dump.ranks == [0, 1] and not dump.problems
    assert json.loads((tmp_path / "d" / "rank1" / "rank.json").read_text())["run_id"] == "run-a"
    # a later run of rank 0 alone, with overwrite: rank 1's old folder must not stay behind
    monkeypatch.setenv("OPSCOPE_RUN_ID", "run-b")
    monkeypatch.setenv("RANK", "0")
    train(tmp_path / "d", 1, overwrite=True)
    assert load(tmp_path / "d").ranks == [0]


def test_mixed_runs_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_RUN_ID", "run-a")
    train(tmp_path / "d", 1)
    status = tmp_path / "d" / "rank0" / "rank.json"
    (tmp_path / "d" / "rank1").mkdir()
    (tmp_path / "d" / "rank1" / "rank.json").write_text(status.read_text().replace("run-a", "run-old"))
    assert any("different runs" in p for p in load(tmp_path / "d").problems)


def test_gradient_rows_name_their_parameter(tmp_path):
    _, dump = train(tmp_path / "d", 1, level="module")
    grads = dump.records().to_pandas().query("io == 'grad'")
    assert len(grads) and grads.param.notna().all()
    assert grads.param.str.endswith(("weight", "bias")).all()


class _Probe(torch.utils.data.Dataset):
    def __init__(self, session):
        self.session = session

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        # runs in a forked worker: it must not be capturing there
        return torch.tensor([float(self.session.capturing), float(self.session.active)]) + torch.zeros(2)


def test_forked_dataloader_workers_do_not_capture(tmp_path):
    model = torch.nn.Linear(2, 1)
    with opscope.dump(tmp_path / "d") as d:
        model(torch.zeros(1, 2))  # capturing in the parent
        loader = torch.utils.data.DataLoader(_Probe(d), batch_size=2, num_workers=2,
                                             multiprocessing_context="fork")
        seen = torch.cat(list(loader))
        assert d.capturing
    assert seen.sum().item() == 0.0
    assert load(tmp_path / "d").status == "complete"


def test_a_mode_pushed_after_the_dump_is_never_popped_by_it(tmp_path):
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    class Counting(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    model = torch.nn.Linear(2, 2)
    d = opscope.dump(tmp_path / "d", steps="0").start()
    mine = Counting()
    mine.__enter__()
    model(torch.zeros(1, 2))
    d.step()  # step 1 is not selected: the dump leaves capture, but must not pop `mine`
    assert _get_current_dispatch_mode() is mine
    before = Counting.calls
    model(torch.zeros(1, 2))
    assert Counting.calls > before
    d.stop()  # takes its own mode out from under `mine`
    assert _get_current_dispatch_mode() is mine
    mine.__exit__(None, None, None)
    assert _get_current_dispatch_mode() is None
    assert load(tmp_path / "d").steps() == [0]
