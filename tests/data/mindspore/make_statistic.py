"""Write the hand-made ``statistic`` dumps under tests/data/mindspore/ (no MindSpore needed).

MindSpore writes ``statistic.csv`` (``"saved_data": "statistic"``) on GPU and Ascend only,
so these fixtures are made here, from the tensor dumps of the same runs, following the
format MindSpore documents and its dump code writes: in the iteration folder, a header
``Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape`` followed
by the columns of ``statistic_category`` (default ``max, min, l2norm``: ``Max Value,Min
Value,L2Norm Value``), one row per tensor, the op name mangled as in file names, the dtype in
lower case, the shape quoted as ``"(4,8)"``, each row ending in a comma. The execution order
and ``.dump_metadata`` are copied; the IR is left out (size), so these dumps also show the
reader without one (no data flow, no parameter names).

    .venv/bin/python tests/data/mindspore/make_statistic.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from opscope.storage.peers.mindspore_files import parse_name

HERE = Path(__file__).resolve().parent
HEADER = ("Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape,"
          "Max Value,Min Value,L2Norm Value")


def convert(case: str) -> None:
    source, out = HERE / case / "rank_0", HERE / f"statistic_{case}" / "rank_0"
    if out.parent.exists():
        shutil.rmtree(out.parent)
    for aux in ("execution_order", ".dump_metadata"):
        shutil.copytree(source / aux, out / aux)
    folder = source / "Net" / "0" / "0"
    lines = [HEADER]
    for name in sorted(f.name for f in folder.iterdir()):
        parsed = parse_name(name)
        if parsed is None or parsed.op_type == "Parameter":
            continue
        task, stream = name.split(".")[-8:-6]
        arr = np.load(folder / name, allow_pickle=False)
        values = arr.astype(np.float64).ravel()
        stats = (values.max(), values.min(), np.sqrt(np.dot(values, values))) if values.size else (0, 0, 0)
        shape = "(" + ",".join(str(n) for n in arr.shape) + ")"
        lines.append(f"{parsed.op_type},{name.split('.')[1]},{task},{stream},{parsed.timestamp},{parsed.io},"
                     f"{parsed.slot},{arr.nbytes},{parsed.dtype},\"{shape}\","
                     + ",".join(f"{float(v):.9g}" for v in stats) + ",")
    target = out / "Net" / "0" / "0"
    target.mkdir(parents=True)
    (target / "statistic.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    for case in ("reference", "fault"):
        convert(case)
