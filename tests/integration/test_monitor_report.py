"""``opscope monitor show`` as a user runs it, and report.html in real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import opscope

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL = "</script><script>document.body.setAttribute('data-pwned','1')</script>".replace(".", "_")
K, STEPS = 15, 24


def run(path: Path, fault: bool) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module(EVIL, nn.Linear(8, 16))  # a module name that is HTML
    model.add_module("act", nn.Tanh())
    model.add_module("out", nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)) for _ in range(4)]
    try:
        with opscope.monitor(path, targets="all", model=model, optimizer=opt) as m:
            for i in range(STEPS):
                if fault and i == K:
                    model.out.weight.register_hook(lambda g: g * 1e3)
                x, y = data[i % len(data)]
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                m.step(loss=loss)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("monitor")
    out = {"fault": root / "fault", "clean": root / "clean"}
    run(out["fault"], True)
    run(out["clean"], False)
    return out


def test_show_names_the_step_and_tensor_and_exits_1_when_something_moved(runs, run_cli):
    done = run_cli("monitor", "show", runs["fault"])
    assert done.returncode == 1, done.stderr
    assert f"step {K}: " in done.stdout and "    out.weight (grad): norm" in done.stdout.split(f"step {K}:")[1]
    clean = run_cli("monitor", "show", runs["clean"], "--json")
    assert clean.returncode == 0 and json.loads(clean.stdout)["events"] == []
    missing = run_cli("monitor", "show", runs["clean"] / "rank0")
    assert missing.returncode == 2 and "not a monitor folder" in missing.stderr


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed")
def test_report_draws_offline_in_headless_chromium(runs, tmp_path):
    page = runs["fault"] / "report.html"
    text = page.read_text()
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90)
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-chart="ok"' in body, done.stderr[-2000:]
    assert "data-pwned" not in body
    # loss and lr: one point per step each; heat map: 4 gradients x STEPS steps
    assert int(re.search(r'data-points="(\d+)"', body).group(1)) == 2 * STEPS
    assert int(re.search(r'data-cells="(\d+)"', body).group(1)) == 4 * STEPS
    assert int(re.search(r'data-marks="(\d+)"', body).group(1)) == 3  # the event on both lines and the map
    assert "Uncaught" not in done.stderr
    assert f"step {K} (rank 0): out.weight (grad) moved first" in dom
    assert dom.count("&lt;/script&gt;&lt;script&gt;") >= 2  # the heat map's row names, as text


def test_show_needs_no_torch(runs):
    script = f"""
import sys
class NoTorch:
    def find_spec(self, name, *args):
        if name.split(".")[0] == "torch":
            raise ImportError("no torch here")
sys.meta_path.insert(0, NoTorch())
from opscope.cli.main import main
code = main(["monitor", "show", {str(runs["fault"])!r}])
sys.exit(code + 10 * ("torch" in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "out.weight (grad)" in done.stdout
