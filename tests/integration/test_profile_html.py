"""report.html in real headless Chromium: the bundled charts draw with a size, hovering
shows values, no console errors, no network, names stay text, empty sections are left out."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opscope.profile.model import PHASES, OpRow, StepRow
from opscope.profile.reader import ProfileData
from opscope.profile.summary import summarize
from opscope.report import profile_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EVIL = "</script><script>document.body.setAttribute('data-pwned','1')</script>"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")


def sample(ranks=(0, 1), shapes: str = "[[2, 2]]", slow_step: int | None = 9) -> ProfileData:
    rows, ops = [], []
    for rank in ranks:
        for step in range(12):
            phases = dict.fromkeys(PHASES, 0)
            phases.update(forward=2_000_000 + rank * 500_000, backward=3_000_000, optimizer=500_000, other=100_000)
            if step == slow_step and rank == ranks[-1]:
                phases["optimizer"] = 60_000_000  # an outlier step
            rows.append(StepRow(rank, step, 0, sum(phases.values()), phases, task_trace=step in (4, 5)))
    ops.append(OpRow(0, 4, "backward", EVIL, shapes, 3, 10.0, 8.0))
    return ProfileData("prof/<run1>", rows, ops, summarize(rows, ops), dict.fromkeys(ranks, "complete"))


def chromium(page: Path, fragment: str, profile: Path) -> tuple[str, str, str]:
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--window-size=1200,900", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri() + fragment],
        capture_output=True, text=True, timeout=90,
    )
    body = re.search(r"<body[^>]*>", done.stdout)
    assert body, done.stderr[-2000:]
    return done.stdout, body.group(0), done.stderr


def attr(body: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', body)
    assert found, (name, body)
    return found.group(1)


@needs_chromium
def test_report_draws_hovers_and_escapes_in_headless_chromium(tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(profile_html.render(sample()), encoding="utf-8")
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:|url\(\s*["']?https?:|@import""", text), "no network"
    assert "uPlot" in text and "Permission is hereby granted" not in text  # library inlined, license shipped apart
    dom, body, log = chromium(page, "#hover", tmp_path / "ud")
    assert attr(body, "data-chart") == "ok" and "data-error" not in body, body
    assert 'data-pwned="1"' not in body
    assert attr(body, "data-charts") == "3"  # step time, phases per step, phases per rank
    sizes = [tuple(map(int, s.split("x"))) for s in attr(body, "data-canvas").split()]
    assert len(sizes) == 3 and all(w >= 400 and h >= 200 for w, h in sizes), sizes
    assert attr(body, "data-points") == "24" and attr(body, "data-bars") == str(12 * 4)
    hover = attr(body, "data-hover")  # the legend under the cursor at step 6
    assert "step=step 6" in hover and "rank 0=5.600 ms" in hover and "rank 1=6.100 ms" in hover, hover
    assert "CONSOLE" not in log.upper().replace("CONSOLE_", "") and "Uncaught" not in log, log[-2000:]
    assert "&lt;/script&gt;&lt;script&gt;" in dom, "the evil op name is shown as text"
    assert "µs" not in dom and " us" not in dom.replace("status", "")
    assert "outlier steps (marked in red): step 9 (rank 1)" in dom and "Outlier steps" in dom


@needs_chromium
def test_empty_sections_are_left_out(tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(profile_html.render(sample(ranks=(0,), shapes="", slow_step=None)), encoding="utf-8")
    dom, body, log = chromium(page, "", tmp_path / "ud")
    assert attr(body, "data-chart") == "ok" and attr(body, "data-charts") == "2", body
    for absent in ("Slowest ranks", "Phases per rank", "Outlier steps", "<th>shapes</th>", "<td>data_wait</td>"):
        assert absent not in dom, absent
    assert "record_shapes=True" in dom and "not seen in these steps: data_wait, communication, zero_grad" in dom
