"""Files of a comparison: summary.json, pairs.parquet, pairs.csv, pairs.xlsx, report.html."""

from __future__ import annotations

import math
import os
from pathlib import Path

from opscope.compare.result import CompareResult
from opscope.errors import OpscopeError

XLSX_MAX_ROWS = 1_048_575


def write_all(result: CompareResult, out: str | os.PathLike, *, xlsx: bool = False,
              html: bool = True) -> list[Path]:
    """Write every file of a comparison into ``out`` (created); returns their paths."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [write_summary(result, directory / "summary.json"),
             write_parquet(result, directory / "pairs.parquet"),
             write_csv(result, directory / "pairs.csv")]
    if xlsx:
        paths.append(write_xlsx(result, directory / "pairs.xlsx"))
    if html:
        from opscope.report import render

        path = directory / "report.html"
        path.write_text(render(result, "html"), encoding="utf-8")
        paths.append(path)
    return paths


def write_summary(result: CompareResult, path: Path) -> Path:
    path.write_text(result.to_json() + "\n", encoding="utf-8")
    return path


def write_parquet(result: CompareResult, path: Path) -> Path:
    import pyarrow.parquet as pq

    pq.write_table(result.pairs_table, path, compression="zstd")
    return path


def write_csv(result: CompareResult, path: Path) -> Path:
    import pyarrow.csv as pcsv

    pcsv.write_csv(result.pairs_table, path)
    return path


def write_xlsx(result: CompareResult, path: Path) -> Path:
    """The pairs as an Excel sheet (needs the optional xlsxwriter: pip install opscope[xlsx])."""
    try:
        import xlsxwriter
    except ImportError:
        raise OpscopeError("--xlsx needs xlsxwriter: pip install 'opscope[xlsx]' (or pip install xlsxwriter)") from None
    table = result.pairs_table
    names = table.schema.names
    with xlsxwriter.Workbook(str(path), {"nan_inf_to_errors": True, "constant_memory": True}) as book:
        sheet = book.add_worksheet("pairs")
        bold = book.add_format({"bold": True})
        for col, name in enumerate(names):
            sheet.write_string(0, col, name, bold)
        columns = [table.column(n).to_pylist() for n in names]
        for i in range(min(table.num_rows, XLSX_MAX_ROWS)):
            for col, values in enumerate(columns):
                value = values[i]
                if value is None:
                    continue
                if isinstance(value, float) and not math.isfinite(value):
                    sheet.write_string(i + 1, col, str(value))
                else:
                    sheet.write(i + 1, col, value)
        sheet.freeze_panes(1, 0)
    return path
