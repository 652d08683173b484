"""The writer's Arrow builders: the same arrays as ``pyarrow.array``, without its pandas import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from opscope.storage.arrow_build import numbers, texts


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint64, np.float64])
def test_numbers_equal_pyarrow_with_and_without_nulls(dtype) -> None:
    values = (np.arange(70) * 3).astype(dtype)[::2]  # a strided view: copied to contiguous
    mask = values % 7 == 0
    assert numbers(values).equals(pa.array(values))
    got, want = numbers(values, mask), pa.array(values, mask=mask)
    assert got.equals(want) and got.null_count == int(mask.sum()) > 0
    assert numbers(values, np.zeros(len(values), bool)).null_count == 0
    assert len(numbers(np.zeros(0, dtype))) == 0


def test_numbers_refuses_what_it_cannot_build() -> None:
    with pytest.raises(TypeError, match="1-d integer or float"):
        numbers(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="1-d integer or float"):
        numbers(np.array([True, False]))


def test_texts_equal_pyarrow() -> None:
    names = ["aten.mm.default", "", "module.ä/ß", "x" * 300]
    assert texts(names).equals(pa.array(names, type=pa.string()))
    assert texts([]).equals(pa.array([], type=pa.string()))


def test_a_native_dump_imports_no_pandas_and_builds_its_tables_off_the_default_pool() -> None:
    """pyarrow.array's first call imports pandas (~0.3 s); on the writer's thread it took the
    GIL from the training thread in the middle of the run. The writer's tables are built in
    the C library's pool: pyarrow's default gave its huge pages back between rounds."""
    script = (
        "import sys, tempfile, torch, opscope, pyarrow as pa\n"
        "from opscope.capture.torch.native import table\n"
        "from opscope.demo.models import mlp_task, train_step\n"
        "built, pools = table.Columns.batch_table, []\n"
        "def batch_table(parts):\n"
        "    out = built(parts)\n"
        "    pools.append((pa.default_memory_pool().max_memory(), pa.system_memory_pool().max_memory()))\n"
        "    return out\n"
        "table.Columns.batch_table = staticmethod(batch_table)\n"
        "model, opt, batch = mlp_task(batch=8, d_in=16, hidden=16, depth=2)\n"
        "path = tempfile.mkdtemp() + '/d'\n"
        "with opscope.dump(path, level='aten') as d:\n"
        "    for i in range(3):\n"
        "        train_step(model, opt, *batch(i)); d.step()\n"
        "imported = 'pandas' in sys.modules\n"
        "assert opscope.load(path).records().num_rows > 0\n"
        "print(*pools[0], imported)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    default, system, imported = done.stdout.split()[-3:]
    assert imported == "False"
    assert int(default) == 0 and int(system) > 0, done.stdout
