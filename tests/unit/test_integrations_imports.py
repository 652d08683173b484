"""``import opscope`` and ``import opscope.integrations`` import neither transformers nor
Lightning (a fresh interpreter: other tests may have imported them here)."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import sys, opscope, opscope.integrations; "
    "loaded = [m for m in ('transformers', 'lightning', 'pytorch_lightning', 'accelerate') if m in sys.modules]; "
    "print(loaded); sys.exit(1 if loaded else 0)"
)


def test_importing_opscope_leaves_the_frameworks_unimported() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
