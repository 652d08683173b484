"""``opscope convert DUMP --to npy -o DIR``: one .npy per tensor plus index.csv, for numpy users.

``--to opscope`` writes a peer dump (msprobe, MindSpore's Data Dump) in opscope's own format
(Parquet records, safetensors tensors), for speed on repeated compares."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from opscope.errors import DumpFormatError, OpscopeError
from opscope.storage.reader import Dump, load

INDEX_COLUMNS = ["file", "id", "rank", "step", "phase", "module", "op", "call", "io", "slot", "arg",
                 "dtype", "stored_dtype", "shape", "param"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opscope convert", description=__doc__)
    parser.add_argument("dump", help="path of a dump directory")
    parser.add_argument("--to", choices=["npy", "opscope"], default="npy",
                        help="output format: npy (one .npy per tensor), or opscope (a peer dump in opscope's format)")
    parser.add_argument("-o", "--output", required=True, help="directory to write into")
    args = parser.parse_args(argv)
    if args.to == "opscope":
        return _to_opscope(args.dump, Path(args.output))
    count, skipped = convert(load(args.dump), Path(args.output))
    print(f"wrote {count} .npy files and index.csv to {args.output}")
    if skipped:
        print(f"{skipped} records hold statistics only (dump with data=\"tensor\" to keep their tensors)")
    return 0 if count else 2


def _to_opscope(path: str, out: Path) -> int:
    from opscope.storage.peers.export import write_opscope

    dump = load(path)
    if (Path(path) / "manifest.json").is_file():
        raise OpscopeError(f"{path} is already an opscope dump; --to opscope converts msprobe and MindSpore dumps")
    records, tensors = write_opscope(dump, out)
    print(f"wrote {records} records and {tensors} tensors to {out} (opscope format)")
    return 0 if records else 2


def convert(dump: Dump, out: Path) -> tuple[int, int]:
    """Write every stored tensor of ``dump`` as ``out/rank<R>/step<S>/<id>.npy``; returns (written, skipped).

    File names are record ids, never op or module names, so nothing can escape ``out``.
    bfloat16 and float8 are written as float32 (exact); index.csv says which.
    """
    out.mkdir(parents=True, exist_ok=True)
    written: dict[tuple, str] = {}
    skipped = 0
    with open(out / "index.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=INDEX_COLUMNS)
        writer.writeheader()
        for rank, step in dump.partitions():
            for row in dump.records(rank=rank, step=step).to_pylist():
                if not row["data"]:
                    skipped += 1
                    continue
                key = (rank, step, row["data"], row["key"], row.get("view"))
                if key not in written:
                    written[key] = _write(dump, row, out)
                arr_dtype = "float32" if row["dtype"] in ("bfloat16", "float8_e4m3fn", "float8_e5m2") else row["dtype"]
                writer.writerow({**{c: row.get(c) for c in INDEX_COLUMNS}, "file": written[key],
                                 "stored_dtype": arr_dtype, "shape": "x".join(map(str, row["shape"]))})
    if not written and not skipped:
        raise OpscopeError(f"{dump.path} holds no records")
    return len(written), skipped


def _write(dump: Dump, row: dict, out: Path) -> str:
    rel = Path(f"rank{int(row['rank'])}") / f"step{int(row['step'])}" / f"{int(row['id'])}.npy"
    (out / rel.parent).mkdir(parents=True, exist_ok=True)
    try:
        arr = dump.row_tensor(row)
    except DumpFormatError as exc:
        raise OpscopeError(f"cannot convert record {row['id']}: {exc}") from None
    np.save(out / rel, np.ascontiguousarray(arr), allow_pickle=False)
    return rel.as_posix()
