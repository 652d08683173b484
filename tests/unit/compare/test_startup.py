"""What a compare's start-up imports, and the index reader that spares it pyarrow.parquet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_pool import write

from opscope.storage import index_file


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(0)
    ref = {f"r{i}": ("float32", rng.standard_normal(1000).astype(np.float32)) for i in range(3)}
    tgt = {key: (dtype, value + np.float32(1e-3)) for key, (dtype, value) in ref.items()}
    write(root / "t", tgt)
    write(root / "r", ref)
    return root / "t", root / "r"


COLUMN_CHOICES = [None, ["id", "data", "key"], ["shape", "id"], ["view", "id", "not_in_the_file"], []]


@pytest.mark.parametrize("columns", COLUMN_CHOICES)
@pytest.mark.parametrize("reader", ["cython", "parquet_file"])
def test_an_index_file_reads_as_parquet_file_reads_it(small_pair, columns, reader, monkeypatch) -> None:
    """The same table (columns, order, types, metadata) as ``ParquetFile.read``, through the
    Cython reader and through the fallback a pyarrow without it takes."""
    if reader == "parquet_file":
        monkeypatch.setattr(index_file, "READER", None)
    elif index_file.READER is None:
        pytest.skip("this pyarrow has no pyarrow._parquet.ParquetReader as expected")
    [path] = sorted((small_pair[0] / "rank0" / "step0").glob("records-*.parquet"))
    with pq.ParquetFile(path) as f:
        expected = f.read(columns=columns)
    table = index_file.read(path, columns)
    assert table.column_names == expected.column_names and table.equals(expected)
    assert table.schema.equals(expected.schema, check_metadata=True)


def test_a_corrupt_index_file_raises_what_parquet_file_raises(tmp_path) -> None:
    bad = tmp_path / "records-00000.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    with pytest.raises(Exception) as public:
        pq.ParquetFile(bad).read()
    with pytest.raises(type(public.value)) as ours:
        index_file.read(bad)
    assert str(ours.value) == str(public.value)


def test_a_compare_of_two_torch_dumps_imports_no_cross_framework_aligner_nor_parquet_module(small_pair) -> None:
    probe = ("import sys, opscope\nopscope.compare(sys.argv[1], sys.argv[2], workers=1)\n"
             "print(sorted(m for m in ('opscope.compare.crossframework.aligner', 'pyarrow.parquet', 'pyarrow.fs', "
             "'pyarrow.dataset', 'pandas', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, *map(str, small_pair)], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip().splitlines()[-1] == "[]"
