"""Reading, summarising, diffing and rendering a profile must not import torch."""

from __future__ import annotations

import subprocess
import sys


def test_analysis_and_reports_import_without_torch() -> None:
    code = (
        "import sys\n"
        "import opscope.profile.reader, opscope.profile.diff, opscope.profile.summary\n"
        "import opscope.report.profile_console, opscope.report.profile_html, opscope.cli.profile\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "import opscope\n"
        "assert callable(opscope.profile)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
