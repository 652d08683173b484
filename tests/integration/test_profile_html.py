"""report.html in real headless Chromium: no console errors, the charts draw, names stay text."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.reader import ProfileData
from opscope.profile.summary import summarize
from opscope.report import profile_html

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL = "</script><script>document.body.setAttribute('data-pwned','1')</script>"


def sample() -> ProfileData:
    rows, ops = [], []
    for rank in (0, 1):
        for step in range(12):
            phases = dict.fromkeys(PHASES, 0)
            phases.update(forward=2_000_000 + rank * 500_000, backward=3_000_000, optimizer=500_000, other=100_000)
            rows.append(StepRow(rank, step, 0, sum(phases.values()), phases, task_trace=step in (4, 5)))
    ops.append(OpRow(0, 4, "backward", EVIL, "[[2, 2]]", 3, 10.0, 8.0))
    return ProfileData("prof/<run1>", rows, ops, summarize(rows, ops), {0: "complete", 1: "complete"})


@pytest.mark.skipif(not shutil.which("chromium") and not shutil.os.path.exists(CHROMIUM), reason="chromium not installed")
def test_report_draws_in_headless_chromium(tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(profile_html.render(sample()), encoding="utf-8")
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
    done = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'ud'}",
            "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=90,
    )
    dom = done.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-chart="ok"' in body, done.stderr[-2000:]
    assert "data-error" not in body, body
    assert "data-pwned" not in body
    assert int(re.search(r'data-points="(\d+)"', body).group(1)) == 24
    assert int(re.search(r'data-bars="(\d+)"', body).group(1)) == 12 * 4
    assert int(re.search(r'data-ranks="(\d+)"', body).group(1)) == 2
    assert "Uncaught" not in done.stderr and "CONSOLE" not in done.stderr.upper().replace("CONSOLE_", "")
    assert "&lt;/script&gt;&lt;script&gt;" in dom, "the evil op name is shown as text"
