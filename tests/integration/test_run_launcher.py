"""`opscope run -c CONFIG -- COMMAND`: the command sees its arguments, streams, signals and
exit code unchanged; a bad config stops it before it starts; Python processes that run a
model dump and profile, the others are left alone; OPSCOPE_CONFIG works without the launcher."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DUMP_AND_PROFILE = {"dump": {"path": "dump", "level": "module"}, "profile": {"output": "prof"}}

ECHO = textwrap.dedent(
    """
    import sys
    print("argv", sys.argv[1:])
    print("stdin", sys.stdin.read())
    print("to stderr", file=sys.stderr)
    print("torch imported:", "torch" in sys.modules)
    sys.exit(3)
    """
)

TRAIN = textwrap.dedent(
    """
    import sys, torch
    from torch import nn
    torch.manual_seed(0)

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            self.transform = nn.Identity()  # a module called in the DataLoader worker
        def __len__(self):
            return 3
        def __getitem__(self, i):
            return self.transform(torch.randn(4)), torch.randn(2)

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    if sys.argv[1] == "train":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in torch.utils.data.DataLoader(Data(), batch_size=1, num_workers=1):
            loss = (model(x) - y).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    else:
        with torch.no_grad():
            for i in range(4):
                model(torch.randn(2, 4))
    print("done")
    """
)


def opscope_run(tmp_path: Path, config: dict | str, *command: str, **kw) -> subprocess.CompletedProcess:
    cfg = tmp_path / "opscope.json"
    cfg.write_text(config if isinstance(config, str) else json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_CONFIG"}
    env.update(kw.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "opscope", "run", "-c", str(cfg), "--", *command],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, **kw)


def test_arguments_streams_and_exit_code_pass_through(tmp_path) -> None:
    (tmp_path / "echo.py").write_text(ECHO)
    done = opscope_run(tmp_path, DUMP_AND_PROFILE, sys.executable, "echo.py", "a b", "-c", "--", "--flag",
                       input="hello")
    assert done.returncode == 3
    assert done.stdout == "argv ['a b', '-c', '--', '--flag']\nstdin hello\ntorch imported: False\n"
    # one line from the launcher says what is on and where it writes; then the command's own
    assert done.stderr == ("opscope: dump (module, statistics, every step) -> dump; "
                           "profile (training trace, every step) -> prof\nto stderr\n")
    # A process that never imports torch (nor runs a model) writes nothing.
    assert not (tmp_path / "dump").exists() and not (tmp_path / "prof").exists()


@pytest.mark.parametrize("config, message", [
    ({"dump": {"path": "dump", "stepz": 1}}, "dump: unknown key 'stepz'"),
    ({"dump": {"path": "dump"}, "profile": {"output": "prof", "steps": "5-2"}}, "steps: '5-2'"),
    ({"overflow": {"action": "explode"}}, "action: 'explode' is not allowed"),
    ('{"dump": {"path": ', "is not valid json"),
])
def test_a_bad_config_fails_before_the_script_starts(tmp_path, config, message) -> None:
    (tmp_path / "mark.py").write_text("open('started', 'w').close()\n")
    done = opscope_run(tmp_path, config, sys.executable, "mark.py")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert done.stderr.startswith("opscope run: error:")
    assert not (tmp_path / "started").exists()


def test_an_existing_dump_is_refused_before_the_script_starts(tmp_path) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "manifest.json").write_text("{}")
    (tmp_path / "mark.py").write_text("open('started', 'w').close()\n")
    done = opscope_run(tmp_path, DUMP_AND_PROFILE, sys.executable, "mark.py")
    assert done.returncode == 2 and "already holds a dump" in done.stderr
    assert not (tmp_path / "started").exists()


def test_usage_errors(tmp_path, run_cli) -> None:
    helped = run_cli("run", "--help")
    assert helped.returncode == 0 and "opscope run [-c CONFIG]" in helped.stdout
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(DUMP_AND_PROFILE))
    no_command = run_cli("run", "-c", cfg, "--")
    assert no_command.returncode == 2 and "no command to run" in no_command.stderr
    missing = run_cli("run", "-c", cfg, "--", "no-such-command-opscope")
    assert missing.returncode == 127 and "command not found: no-such-command-opscope" in missing.stderr
    # Without "--" the command starts at the first word that is not an option.
    plain = run_cli("run", "-c", cfg, sys.executable, "-c", "import sys; sys.exit(5)", cwd=tmp_path)
    assert plain.returncode == 5


def _start_and_wait(tmp_path: Path, script: str, config: dict) -> subprocess.Popen:
    (tmp_path / "child.py").write_text(textwrap.dedent(script))
    (tmp_path / "opscope.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_CONFIG"}
    proc = subprocess.Popen([sys.executable, "-m", "opscope", "run", "-c", "opscope.json", "--", sys.executable,
                             "child.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def test_sigterm_reaches_the_command_and_its_exit_code_comes_back(tmp_path) -> None:
    proc = _start_and_wait(tmp_path, """
        import signal, sys, time
        def bye(signum, frame):
            print("child got", signum, flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        open("ready", "w").close()
        time.sleep(60)
        """, DUMP_AND_PROFILE)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 7 and out == f"child got {int(signal.SIGTERM)}\n", err


def test_a_command_killed_by_a_signal_kills_the_launcher_the_same_way(tmp_path) -> None:
    proc = _start_and_wait(tmp_path, """
        import time
        open("ready", "w").close()
        time.sleep(60)
        """, DUMP_AND_PROFILE)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_sigterm_during_training_flushes_the_dump(tmp_path) -> None:
    pytest.importorskip("torch")
    proc = _start_and_wait(tmp_path, """
        import torch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100000):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 2:
                open("ready", "w").close()
        """, {"dump": {"path": "dump", "level": "module", "steps": "0-1"}})
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM  # SIGTERM became SystemExit(143) so that opscope flushes
    rank = json.loads((tmp_path / "dump" / "rank0" / "rank.json").read_text())
    assert rank["status"] == "crashed" and "terminated by SIGTERM" in rank["error"] and rank["steps"] == [0, 1]


def test_training_and_inference_without_code_change(tmp_path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TRAIN)
    done = opscope_run(tmp_path, DUMP_AND_PROFILE, sys.executable, "train.py", "train")
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert done.stderr.count("opscope: dump (") == 1, done.stderr  # the launcher's line; not again per process
    rank = json.loads((tmp_path / "dump" / "rank0" / "rank.json").read_text())
    assert rank["status"] == "complete" and rank["steps"] == [0, 1, 2]  # one step per optimizer.step()
    assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["manifest.json", "rank0"]  # not the worker
    summary = json.loads((tmp_path / "prof" / "rank0" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"]["recorded"] == 3

    shutil.rmtree(tmp_path / "dump")
    shutil.rmtree(tmp_path / "prof")
    done = opscope_run(tmp_path, DUMP_AND_PROFILE, sys.executable, "train.py", "infer")
    assert done.returncode == 0, done.stderr
    rank = json.loads((tmp_path / "dump" / "rank0" / "rank.json").read_text())
    assert rank["steps"] == [0, 1, 2, 3]  # one step per outermost module call


def test_a_script_that_uses_opscope_itself_keeps_control(tmp_path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "own.py").write_text(textwrap.dedent("""
        import torch
        import opscope
        model = torch.nn.Linear(4, 2)
        model(torch.randn(1, 4))  # a warm-up call before the script's own dump
        with opscope.dump() as d:  # path and keys from OPSCOPE_CONFIG
            for _ in range(2):
                model(torch.randn(1, 4))
        print(opscope.load("dump").steps())
        """))
    done = opscope_run(tmp_path, {"dump": {"path": "dump", "level": "module"}}, sys.executable, "own.py")
    assert done.returncode == 0 and done.stdout == "[0, 1]\n", done.stderr


def test_our_sitecustomize_runs_the_one_it_hides(tmp_path) -> None:
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    done = opscope_run(tmp_path, DUMP_AND_PROFILE, sys.executable, "-c",
                       "import os, sys; print(os.environ.get('USER_SITECUSTOMIZE'), "
                       "'opscope.autostart' in sys.modules)",
                       env={"PYTHONPATH": str(user)})
    assert done.returncode == 0 and done.stdout == "ran True\n", done.stderr


@pytest.fixture(scope="module")
def venvs(tmp_path_factory):
    """Fresh venvs with opscope installed from a copy of this tree, regular and editable.

    They reuse this environment's packages (torch, numpy, setuptools) through a path file
    and install with --no-deps --no-build-isolation: nothing is downloaded.
    """
    base = tmp_path_factory.mktemp("install")
    tree = base / "opscope-src"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src" / "opscope", tree / "src" / "opscope",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    import sysconfig

    out = {}
    for kind, args in (("regular", [str(tree)]), ("editable", ["-e", str(tree)])):
        venv = base / kind
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "_outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                               "--no-build-isolation", *args], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"cannot install into a fresh venv here: {done.stderr[-500:]}")
        out[kind] = (python, Path(site))
    return out


@pytest.mark.parametrize("kind", ["regular", "editable"])
def test_opscope_config_env_without_the_launcher(tmp_path, venvs, kind) -> None:
    pytest.importorskip("torch")
    python, site = venvs[kind]
    assert (site / "opscope-autostart.pth").is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("OPSCOPE_CONFIG", "PYTHONPATH")}
    idle = subprocess.run([python, "-c", "import sys; print(sorted(m for m in sys.modules if 'opscope' in m))"],
                          capture_output=True, text=True, env=env)
    assert idle.stdout == "[]\n", idle.stderr  # without OPSCOPE_CONFIG not even opscope is imported

    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "opscope.json").write_text(json.dumps({"dump": {"path": "dump", "level": "module"}}))
    env["OPSCOPE_CONFIG"] = "opscope.json"
    done = subprocess.run([python, "train.py", "train"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    assert "opscope: dump (module, statistics, every step) -> dump (from OPSCOPE_CONFIG)\n" in done.stderr
    rank = json.loads((tmp_path / "dump" / "rank0" / "rank.json").read_text())
    assert rank["status"] == "complete" and rank["steps"] == [0, 1, 2]

    (tmp_path / "bad.json").write_text(json.dumps({"dump": {"path": "d2", "level": "everything"}}))
    env["OPSCOPE_CONFIG"] = "bad.json"
    # every Python process sees the variable (pip too): one that runs no model is left alone...
    other = subprocess.run([python, "-c", "open('started', 'w').close()"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
    assert other.returncode == 0 and (tmp_path / "started").exists(), other.stderr
    # ...one that trains stops at its first module call, before any step, with one clear line
    bad = subprocess.run([python, "train.py", "train"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert bad.returncode == 2 and "level: 'everything' is not allowed" in bad.stderr
    assert bad.stderr.count("\n") == 1 and "done" not in bad.stdout and not (tmp_path / "d2").exists()
