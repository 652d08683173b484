"""``opscope demo`` end to end: it names the fault, and says how much disk it leaves."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def test_the_demo_names_the_fault_and_says_what_it_leaves_on_disk(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "opscope", "demo", "-o", str(out), "--steps", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "layers.1.act" in done.stdout and "aten.gelu.default" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    said = re.search(r"holds (\d+) MB \(remove it when done: rm -r (.+)\)$", last)
    assert said and said.group(2) == str(out), last
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
    assert abs(int(said.group(1)) - on_disk) <= 1
    # full tensors of the first step only (each run's dump: one step of tensors)
    assert all(sorted(p.name for p in (out / "dumps" / run / "rank0").iterdir() if p.is_dir()) == ["step0"]
               for run in ("reference", "fault", "bf16"))
    assert on_disk < 300
