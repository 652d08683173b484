"""The real CLI in a subprocess, and the HTML report in headless Chromium."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "compare"))
import synth  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def opscope(*args):
    return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    return {"ref": synth.mlp_run(root / "ref", steps=2), "same": synth.mlp_run(root / "same", steps=2),
            "gelu": synth.mlp_run(root / "gelu", steps=2, fault="gelu_tanh"),
            "other": synth.mlp_run(root / "other", steps=1, seed=5, rank=3), "root": root}


def test_exit_codes(dumps):
    same = opscope("compare", dumps["same"], dumps["ref"])
    assert same.returncode == 0, same.stderr
    assert "verdict: identical" in same.stdout
    diverged = opscope("compare", dumps["gelu"], dumps["ref"], "--workers", "2")
    assert diverged.returncode == 1
    assert "aten.gelu.default" in diverged.stdout and "first divergence" in diverged.stdout
    nothing = opscope("compare", dumps["other"], dumps["ref"])
    assert nothing.returncode == 2 and "nothing could be compared" in nothing.stderr
    assert "rank 3 step 0 is in the target only" in nothing.stderr
    missing = opscope("compare", dumps["root"] / "nope", dumps["ref"])
    assert missing.returncode == 2 and "not a directory" in missing.stderr


def test_files_and_quiet(dumps):
    out = dumps["root"] / "out"
    run = opscope("compare", dumps["gelu"], dumps["ref"], "-o", out, "--xlsx", "-q")
    assert run.returncode == 1 and run.stdout.startswith("diverged: act")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["op"] == "aten.gelu.default"
    assert {p.name for p in out.iterdir()} == {"summary.json", "pairs.parquet", "pairs.csv", "pairs.xlsx",
                                               "report.html"}


def test_mapping_file_renames_modules(dumps, tmp_path):
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules:\n  act: activation\n")
    run = opscope("compare", dumps["same"], dumps["ref"], "--mapping", mapping)
    assert run.returncode == 0  # act renamed to a module the reference lacks: unpaired, nothing diverges
    assert "unpaired: " in run.stdout and "verdict: within tolerance" in run.stdout


def _chromium(page: Path, fragment: str, profile: Path) -> tuple[str, str]:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
           "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri() + fragment]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    return done.stdout, done.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_report_loads_draws_and_filters_in_chromium(dumps, tmp_path):
    out = dumps["root"] / "html"
    assert opscope("compare", dumps["gelu"], dumps["ref"], "-o", out).returncode == 1
    page = out / "report.html"
    dom, log = _chromium(page, "", tmp_path / "p1")
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-ready="1"' in body and "data-js-error" not in body
    points = int(body.split('data-chart-points="')[1].split('"')[0])
    rows = int(body.split('data-rows-visible="')[1].split('"')[0])
    assert points > 10 and rows > 10
    assert "CONSOLE" not in log and "Uncaught" not in log, log
    dom, log = _chromium(page, "#filter=gelu&status=culprit", tmp_path / "p2")
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-rows-visible="2"' in body, body  # the gelu output, in steps 0 and 1
    assert "CONSOLE" not in log and "Uncaught" not in log


def _attr(body: str, name: str) -> str:
    return body.split(f'{name}="')[1].split('"')[0]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_error_chart_draws_and_hover_names_the_culprit(dumps, tmp_path):
    out = dumps["root"] / "html_hover"
    assert opscope("compare", dumps["gelu"], dumps["ref"], "-o", out).returncode == 1
    dom, log = _chromium(out / "report.html", "#hover", tmp_path / "p1")
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-ready="1"' in body and "data-js-error" not in body, body
    width, height = map(int, _attr(body, "data-chart-size").split("x"))
    assert width >= 400 and height >= 200
    hover = _attr(body, "data-hover")  # the legend under the cursor: the culprit's op and its error
    assert "aten.gelu.default" in hover and "culprit=" in hover and "culprit=\u2014" not in hover, hover
    assert "CONSOLE" not in log and "Uncaught" not in log, log


EVIL = "</script><script>document.body.setAttribute('data-pwned','1')</script>"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_names_with_script_stay_text_in_the_chart(tmp_path):
    import numpy as np

    def dump(path, scale):
        run = synth.Run(path)
        x = run.leaf(np.linspace(-1, 1, 12).reshape(3, 4))
        (h,) = run.op("aten.mul.Tensor", [x], [x.value * scale], module=EVIL)
        run.op(EVIL, [h], [h.value + 1], module="head")
        run.close()
        return path

    out = tmp_path / "out"
    assert opscope("compare", dump(tmp_path / "t", 1.5), dump(tmp_path / "r", 1.0), "-o", out).returncode == 1
    dom, log = _chromium(out / "report.html", "#hover", tmp_path / "p1")
    body = dom[dom.index("<body"):dom.index(">", dom.index("<body"))]
    assert 'data-ready="1"' in body and 'data-pwned="1"' not in body and "data-js-error" not in body, body
    assert "&lt;/script&gt;&lt;script&gt;" in _attr(body, "data-hover")  # the module name, as text
    assert "CONSOLE" not in log and "Uncaught" not in log, log
