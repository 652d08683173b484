import subprocess
import sys


def test_compare_and_report_never_import_torch():
    code = ("import sys, opscope; import opscope.compare.api, opscope.compare.blame, opscope.report.compare_html, "
            "opscope.report.compare_console, opscope.report.compare_files, opscope.cli.compare; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_opscope_compare_is_callable_whichever_import_came_first():
    code = "import opscope.compare.metrics, opscope; assert callable(opscope.compare)"
    subprocess.run([sys.executable, "-c", code], check=True)
