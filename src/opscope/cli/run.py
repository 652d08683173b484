"""``opscope run -c CONFIG -- COMMAND [ARGS...]``: run any command with opscope on, no code change.

Every Python process the command starts (``python train.py``, ``torchrun``'s workers,
``mp.spawn`` children) reads CONFIG at startup; the ones that run a model start the dump,
profile and overflow sections of CONFIG at their first module call and stop them at exit.
Steps come from ``optimizer.step()`` (training) or the outermost module call (inference).

The command gets its arguments, standard streams and signals unchanged, and its exit code
is returned. A bad config fails here, before the command starts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from opscope.config.env import env
from opscope.errors import DumpExistsError, OpscopeError, ProfileError

USAGE = "opscope run [-c CONFIG] [--run-id ID] -- COMMAND [ARGS...]"
EPILOG = """examples:
  opscope run -c opscope.json -- python train.py --epochs 1
  opscope run -c opscope.yaml -- torchrun --nproc_per_node 2 train.py

CONFIG holds "dump", "profile" and/or "overflow" sections (see docs/run.md); without -c,
$OPSCOPE_CONFIG is used. Without the launcher (opscope installed by pip): OPSCOPE_CONFIG=CONFIG python train.py"""

# Written to a temporary folder that goes first on PYTHONPATH.
SITECUSTOMIZE = '''\
"""Written by `opscope run`: arms opscope in this Python process, then runs the
sitecustomize this one hides (if any)."""


def _opscope_chain():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    this = sys.modules.pop("sitecustomize", None)
    # This folder only holds this file: it can leave sys.path (PYTHONPATH keeps it for children).
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  the next one on the path
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this


def _opscope_activate():
    try:
        import opscope.autostart
    except ImportError as exc:
        import sys

        sys.stderr.write(f"opscope run: {sys.executable} cannot import opscope ({exc}); "
                         "this process runs without it\\n")
        return
    opscope.autostart.activate("opscope run")


try:
    _opscope_chain()
finally:
    _opscope_activate()
'''

# Signals passed to the command. SIGINT, SIGHUP and SIGQUIT from a terminal already reach
# the whole foreground process group; those are passed on only when they came otherwise.
FORWARD = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH")
TERMINAL_SIGNALS = ("SIGINT", "SIGHUP", "SIGQUIT", "SIGWINCH")


def main(argv: list[str]) -> int:
    args, command = parse(argv)
    config = resolve_config(args.config)
    from opscope.autostart import describe

    print(describe(check_config(config)), file=sys.stderr, flush=True)  # once, from the launcher
    run_id = args.run_id or env("RUN_ID") or uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="opscope-run-") as boot:
        (Path(boot) / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        code = launch(command, child_env(os.environ, boot, config, run_id))
    if code < 0:  # killed by a signal: die the same way, so the caller sees what it would have seen
        _die_like(-code)
        return 128 - code
    return code


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``opscope run`` options from the command (after ``--``, or the first non-option)."""
    parser = argparse.ArgumentParser(prog="opscope run", usage=USAGE, description=__doc__.replace("``", ""),
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", help="config file (JSON, YAML or TOML); default: $OPSCOPE_CONFIG")
    parser.add_argument("--run-id", help="launch id shared by all ranks (default: $OPSCOPE_RUN_ID, else a new "
                                         "one); give every node of a multi-node job the same one")
    options, command = _split_at_command(argv)
    args = parser.parse_args(options)
    if not command:
        raise OpscopeError(f"no command to run; usage: {USAGE}\n"
                           "e.g. opscope run -c opscope.json -- python train.py")
    return args, command


def _split_at_command(argv: list[str]) -> tuple[list[str], list[str]]:
    # The first "--" or the first word that is not an option starts the command; a "--"
    # further on belongs to the command.
    takes_value = ("-c", "--config", "--run-id")
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--":
            return argv[:i], argv[i + 1:]
        i += 2 if argv[i] in takes_value else 1
    return argv[:i], argv[i:]


def resolve_config(path: str | None) -> Path:
    """The config file as an absolute path (children may change directory)."""
    path = path or env("CONFIG")
    if not path:
        raise OpscopeError(f"no config; pass -c CONFIG (a JSON, YAML or TOML file) or set OPSCOPE_CONFIG\n"
                           f"usage: {USAGE}")
    return Path(path).resolve()


def check_config(path: Path) -> dict[str, Any]:
    """Validate every section now, and refuse outputs that the run would refuse later.

    Raises:
        ConfigError, DumpExistsError, ProfileError: before anything is started.
    """
    from opscope.autostart import validate

    sections = validate(path)
    dump = sections.get("dump")
    if dump is not None and dump.enable and not dump.overwrite and (Path(dump.path) / "manifest.json").exists():
        raise DumpExistsError(f"{dump.path!r} already holds a dump; choose a new path or set \"overwrite\": true "
                              f"in the dump section of {path}")
    prof = sections.get("profile")
    if prof is not None and prof.enable and not prof.overwrite:
        old = sorted(Path(prof.output).glob("rank*/summary.json"))
        if old:
            raise ProfileError(f"{prof.output!r} already holds a profile ({old[0].parent.name}); choose another "
                               f"output or set \"overwrite\": true in the profile section of {path}")
    return sections


def child_env(environ: Any, boot: str, config: Path, run_id: str) -> dict[str, str]:
    """The command's environment: the launcher's, plus the bootstrap folder and the config."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join([boot, *[p for p in [env.get("PYTHONPATH")] if p]])
    env["OPSCOPE_CONFIG"] = str(config)
    env["OPSCOPE_RUN_ID"] = run_id
    env["OPSCOPE_LAUNCHER"] = "opscope run"  # it said what is on: the processes do not
    return env


def launch(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` with inherited streams and file descriptors, pass signals on.

    Returns:
        The command's exit status as ``subprocess`` gives it (``-N``: killed by signal N).
    """
    try:
        child = subprocess.Popen(command, env=env, close_fds=False)
    except FileNotFoundError:
        print(f"opscope run: command not found: {command[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"opscope run: permission denied: {command[0]}", file=sys.stderr)
        return 126
    previous = _forward_signals(child)
    try:
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # SIGINT when no handler could be installed
                continue
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code


def _forward_signals(child: subprocess.Popen) -> dict[int, Any]:
    previous: dict[int, Any] = {}
    terminal = {getattr(signal, n) for n in TERMINAL_SIGNALS if hasattr(signal, n)}

    def forward(signum: int, frame: Any) -> None:
        if signum in terminal and _foreground():
            return  # the terminal sent it to the command too
        child.send_signal(signum)  # a no-op once the command has exited

    for name in FORWARD:
        signum = getattr(signal, name, None)
        if signum is None:
            continue
        try:
            previous[signum] = signal.signal(signum, forward)
        except (OSError, ValueError):
            continue
    return previous


def _foreground() -> bool:
    """Whether this process group is a terminal's foreground group (terminal signals reach it all)."""
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        try:
            if os.tcgetpgrp(stream.fileno()) == os.getpgrp():
                return True
        except (OSError, AttributeError, ValueError):
            continue
    return False


def _die_like(signum: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signum)
