"""Replay on msprobe tensor dumps written by the real msprobe (the ``peers`` test extra): a
``Functional.linear`` whose result is off by 0.1% is judged wrong on its side, every other
forward call right, backward entries refused with the reason, and names a dump should never
make replay run (``Torch.load``, ``Functional.__import__``, ``Tensor.__reduce_ex__``) refused
before anything is called."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("msprobe")
torch = pytest.importorskip("torch")

import opscope  # noqa: E402
from opscope.replay import replay  # noqa: E402
from opscope.replay.engine import CallRef, RowCache, replay_call  # noqa: E402

RUNS = Path(__file__).with_name("replay_peer_runs.py")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(fault, ref): msprobe L1 tensor dumps of one step each, one faulty linear apart."""
    root = tmp_path_factory.mktemp("msprobe_replay")
    run = subprocess.run([sys.executable, str(RUNS), str(root)], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return root / "fault", root / "ref"


def test_compare_replay_names_the_faulty_linear(dumps: tuple[Path, Path], run_cli, tmp_path: Path) -> None:
    proc = run_cli("compare", *dumps, "--replay", "2", "--workers", "1", "-o", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    first = json.loads((tmp_path / "out" / "summary.json").read_text())["first_divergence"]
    assert first["op"] == "torch.nn.functional.linear" and first["phase"] == "forward"
    assert first["replay"]["verdict"] == "target_wrong", first["replay"]["reason"]
    assert first["replay"]["target"]["units"] > 1000 and first["replay"]["reference"]["status"] == "ok"
    assert first["replay"]["reference"]["reproduced"]  # torch's float32 linear gives msprobe's bits
    again = replay(*dumps, first["id"], summary=tmp_path / "out")  # the id from the output, no new compare
    assert again.verdict == "target_wrong" and again.op == "torch.nn.functional.linear"
    swapped = replay(dumps[1], dumps[0], "first")
    assert swapped.verdict == "reference_wrong", swapped.reason


def test_every_forward_call_replays_and_backward_says_why(dumps: tuple[Path, Path]) -> None:
    dump = opscope.load(dumps[1])
    rows = dump.records(rank=0, step=0).to_pylist()
    verdicts: dict[str, set[str]] = {}
    cache = RowCache()
    for seq in sorted({r["seq"] for r in rows}):
        row = cache.call_rows(dump, 0, 0, seq)[0]
        out = replay_call(dump, dump, CallRef(id="", rank=0, step=0, seqs={"target": seq, "reference": seq}),
                          cache=cache)
        verdicts.setdefault(f"{row['phase']} {row['op']}", set()).add(out.verdict)
        if row["phase"] == "backward":
            assert "records a backward call's gradients only" in out.reason
    assert verdicts["forward torch.nn.functional.linear"] == {"both_within"}
    assert verdicts["forward torch.nn.functional.gelu"] == {"both_within"}  # approximate="tanh" passed through
    assert verdicts["forward torch.nn.functional.softmax"] == {"both_within"}  # dim=-1 as a keyword
    assert verdicts["forward Tensor.mul"] == {"both_within"}  # h * 0.5: a scalar argument
    assert verdicts["backward torch.nn.functional.linear"] == {"not_replayable"}


@pytest.mark.parametrize("name", ["Torch.load", "Functional.__import__", "Tensor.__reduce_ex__"])
def test_malicious_names_run_nothing(dumps: tuple[Path, Path], tmp_path: Path, name: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    evil = tmp_path / "evil"
    shutil.copytree(dumps[1], evil)
    (dump_json,) = evil.glob("step0/*/dump.json")
    text = dump_json.read_text()
    assert '"Functional.linear.0.forward"' in text
    dump_json.write_text(text.replace('"Functional.linear.0.forward"', f'"{name}.0.forward"'))
    dump = opscope.load(evil)
    seq = next(r["seq"] for r in dump.records().to_pylist() if r["op"].endswith(name.split(".")[1]))
    called: list[str] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: called.append("torch.load"))
    monkeypatch.setattr(torch.Tensor, "__reduce_ex__", lambda *a, **k: called.append("__reduce_ex__"))
    out = replay_call(dump, dump, CallRef(id="", rank=0, step=0, seqs={"target": seq, "reference": seq}))
    assert out.verdict == "not_replayable" and "allow-list" in out.reason, out.reason
    assert called == []  # refused before any tensor was read or any function called


def test_msprobe_fault_against_an_opscope_api_reference(dumps: tuple[Path, Path], tmp_path: Path) -> None:
    """Cross-tool: the msprobe dump with the faulty linear against opscope's level="api" tensor
    dump of the same model and input; both sides replay, each from its own tool's record."""
    sys.path.insert(0, str(RUNS.parent))
    import replay_peer_runs

    torch.manual_seed(0)
    net = replay_peer_runs.Net()
    x = torch.randn(8, 16)
    with opscope.dump(tmp_path / "ops", level="api", data="tensor", overwrite=True) as d:
        net(x).sum().backward()
        d.step()
    result = opscope.compare(dumps[0], tmp_path / "ops", workers=1, replay=1)
    first = result.first_divergence
    assert first.op == "torch.nn.functional.linear" and first.replay["verdict"] == "target_wrong"
    assert first.replay["reference"]["status"] == "ok" and first.replay["reference"]["reproduced"]


def test_poisoned_pt_is_not_unpickled_by_replay(dumps: tuple[Path, Path], tmp_path: Path) -> None:
    """A .pt holding a pickle that runs code: replay reads it as the reader does (weights_only)
    and says the side cannot be replayed; the code never runs."""
    poisoned = tmp_path / "poisoned"
    shutil.copytree(dumps[1], poisoned)
    (victim,) = poisoned.glob("step0/*/dump_tensor_data/Functional.linear.1.forward.input.0.pt")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (os.system, (f"touch {marker}",))  # runs when unpickled, not when saved

    torch.save(Evil(), victim)
    dump = opscope.load(poisoned)
    seq = next(r["seq"] for r in dump.records().to_pylist() if r["data"] == victim.name)
    out = replay_call(dump, opscope.load(dumps[1]), CallRef(id="", rank=0, step=0,
                                                             seqs={"target": seq, "reference": seq}))
    assert out.verdict == "not_replayable" and "not a plain tensor file" in out.reason, out.reason
    assert out.reference is not None and out.reference.status == "ok"  # the clean side still replays
    assert not marker.exists()
