"""Files of a comparison: summary.json, pairs.parquet, pairs.csv, pairs.xlsx, report.html."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

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
    """The pairs table as Parquet (zstd); a table that went to a file is copied from it."""
    import pyarrow.parquet as pq

    pairs = result.pairs_file
    pairs.close()
    if pairs.path is not None:
        shutil.copyfile(pairs.path, path)
    else:
        pq.write_table(pairs.table(), path, compression="zstd")
    return path


def write_csv(result: CompareResult, path: Path) -> Path:
    """The pairs table as CSV, a slice at a time."""
    import pyarrow.csv as pcsv

    pairs = result.pairs_file
    if pairs.path is None:
        pcsv.write_csv(pairs.table(), path)
        return path
    with pcsv.CSVWriter(path, pairs.schema) as writer:
        for batch in pairs.batches():
            writer.write_batch(batch)
    return path


def write_xlsx(result: CompareResult, path: Path) -> Path:
    """The pairs as an Excel sheet, its first :data:`XLSX_MAX_ROWS` rows (a sheet holds no
    more; pairs.csv has them all); needs the optional xlsxwriter: pip install opscope[xlsx]."""
    try:
        import xlsxwriter
    except ImportError:
        raise OpscopeError("--xlsx needs xlsxwriter: pip install 'opscope[xlsx]' (or pip install xlsxwriter)") from None
    pairs = result.pairs_file
    names = pairs.schema.names if pairs.schema is not None else pairs.table().schema.names
    with xlsxwriter.Workbook(str(path), {"nan_inf_to_errors": True, "constant_memory": True}) as book:
        sheet = book.add_worksheet("pairs")
        bold = book.add_format({"bold": True})
        for col, name in enumerate(names):
            sheet.write_string(0, col, name, bold)
        row = 1
        for batch in pairs.batches():  # converted a slice at a time, and only up to the cap
            batch = batch.slice(0, XLSX_MAX_ROWS + 1 - row)
            _write_rows(sheet, row, [batch.column(i).to_pylist() for i in range(batch.num_columns)])
            row += batch.num_rows
            if row > XLSX_MAX_ROWS:
                break
        sheet.freeze_panes(1, 0)
    return path


def _write_rows(sheet: Any, first: int, columns: list[list[Any]]) -> None:
    for i in range(len(columns[0]) if columns else 0):
        for col, values in enumerate(columns):
            value = values[i]
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                sheet.write_string(first + i, col, str(value))
            else:
                sheet.write(first + i, col, value)
