"""Shared fixtures: tiny real models and a helper that trains a few steps."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
