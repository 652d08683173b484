import json
import zipfile

import numpy as np
import pyarrow.parquet as pq
import synth

import opscope
from opscope.report.compare_console import render as console
from opscope.report.compare_files import write_all
from opscope.report.compare_html import render as page
from opscope.report.compare_html import safe_json

EVIL = "</script><script>alert(1)</script>&<b>"


def _evil_dump(path, scale):
    run = synth.Run(path)
    x = run.leaf(np.linspace(-1, 1, 12).reshape(3, 4))
    (h,) = run.op("aten.mul.Tensor", [x], [x.value * scale], module=EVIL, source=EVIL)
    run.op(EVIL, [h], [h.value + 1], module="head")
    run.close()
    return path


def test_files_and_summary_schema(tmp_path):
    result = opscope.compare(_evil_dump(tmp_path / "t", 1.5), _evil_dump(tmp_path / "r", 1.0))
    paths = write_all(result, tmp_path / "out", xlsx=True)
    assert sorted(p.name for p in paths) == ["pairs.csv", "pairs.parquet", "pairs.xlsx", "report.html", "summary.json"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["verdict"] == "diverged"
    first = summary["first_divergence"]
    for key in ("rank", "step", "phase", "module", "op", "call", "io", "slot", "metrics"):
        assert key in first
    assert first["module"] == EVIL and first["op"] == "aten.mul.Tensor"
    assert set(summary["counts"]) >= {"pairs", "identical", "passed", "failed", "unpaired_target", "unpaired_reference"}
    assert summary["culprits"][0]["module"] == EVIL
    rows = pq.read_table(tmp_path / "out" / "pairs.parquet").num_rows
    assert rows == result.pairs_table.num_rows
    assert len((tmp_path / "out" / "pairs.csv").read_text().strip().splitlines()) == rows + 1
    assert zipfile.is_zipfile(tmp_path / "out" / "pairs.xlsx")


def test_every_name_in_html_is_escaped(tmp_path):
    result = opscope.compare(_evil_dump(tmp_path / "t", 1.5), _evil_dump(tmp_path / "r", 1.0))
    html = page(result)
    assert "alert(1)</script>" not in html and "<b>" not in html
    assert html.count("</script>") == 3  # the chart library, the data block and the code block, nothing else
    assert "\\u003c/script\\u003e" in safe_json({"m": "</script>"})


def test_console_report_names_the_first_divergence(tmp_path):
    result = opscope.compare(_evil_dump(tmp_path / "t", 1.5), _evil_dump(tmp_path / "r", 1.0))
    text = console(result)
    assert "verdict: diverged" in text and "first divergence" in text and "aten.mul.Tensor" in text
    assert EVIL in text  # shown literally, not interpreted as rich markup
