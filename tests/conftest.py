"""Shared fixtures: tiny real models and a helper that trains a few steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _import_msprobe_keeping_tensorflow() -> None:
    """Import msprobe once, now, and undo what its ``__init__`` does to ``sys.modules``.

    msprobe 26.2's package ``__init__`` puts tensorboard's ``tensorflow_stub`` in
    ``sys.modules["tensorflow"]`` (whether or not TensorFlow was imported), so every later
    ``import tensorflow`` in the same process (another test module of the same xdist worker)
    gets a stub whose ``Variable`` takes no arguments. Python runs that ``__init__`` only
    once; taking the entries back right after it keeps the real TensorFlow for everyone.
    """
    names = ("tensorflow", "tensorflow.python")
    before = {name: sys.modules.get(name) for name in names}
    try:
        import msprobe  # noqa: F401
    except Exception:  # not installed (or broken): its tests skip themselves
        return
    for name, module in before.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


_import_msprobe_keeping_tensorflow()


@pytest.fixture
def run_cli():
    """Run ``opscope ARGS`` in a subprocess, as a user would."""
    import subprocess

    def run(*args: str, env: dict | None = None, cwd: str | None = None, timeout: int = 300):
        import os

        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, "-m", "opscope", *map(str, args)], capture_output=True,
                              text=True, env=full_env, cwd=cwd, timeout=timeout)
    return run
