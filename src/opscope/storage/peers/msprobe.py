"""msprobe (mindstudio-probe) dumps of PyTorch runs, read as opscope records.

msprobe writes ``dump_path/step{N}/rank{R}/`` (``proc{PID}/`` without torch.distributed),
each with ``dump.json`` (statistics of every call's inputs and outputs), ``construct.json``
(the module tree, at ``mix`` level), ``stack.json`` and, for the ``tensor`` task,
``dump_tensor_data/*.pt``. Give opscope the dump root, a step folder or a rank folder.

Levels: ``L1`` and ``mix`` become opscope's ``api`` level (op names as opscope's api level
writes them, :mod:`~opscope.storage.peers.msprobe_names`), ``L0`` its ``module`` level.
md5 values (msprobe's ``summary_mode: md5``, a CRC-32 of the tensor's bytes) become hashes
of algorithm ``msprobe-crc32``: compare trusts them only against another such dump.

Tensors are read with ``torch.load(..., weights_only=True)``: no pickled code runs, and a
file that is not a plain tensor is refused. File names from ``dump.json`` never leave
``dump_tensor_data``.

msprobe's MindSpore side (``"framework": "mindspore"``) writes the same layout with
``Cell.`` entries for modules, MindSpore dtype spellings (``Float32``) and ``.npy`` tensors:
its op names stay in MindSpore's namespace (:func:`~opscope.storage.peers.msprobe_names.mindspore_name`)
and its tensors are read with ``np.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.storage import format as fmt
from opscope.storage.peers import register_format
from opscope.storage.peers.base import PeerDump
from opscope.storage.peers.msprobe_records import read_json, read_partition, safe_name

TOOL = "msprobe"
HASH_ALGORITHM = "msprobe-crc32"
_LEVELS = {"L0": "module", "L1": "api", "mix": "api"}


def partitions(path: Path) -> dict[tuple[int, int], Path]:
    """(rank, step) -> rank folder, for a dump root, a step folder or a rank folder."""
    path = Path(path)
    if (path / "dump.json").is_file():
        return {(_rank_of(path, [path]), _number(path.parent.name, "step")): path}
    found: dict[tuple[int, int], Path] = {}
    ranks = _rank_folders(path)
    if ranks:
        step = _number(path.name, "step")
        return {(_rank_of(r, ranks), step): r for r in ranks}
    for step_dir in sorted(path.glob("step*")):
        if re.fullmatch(r"step\d+", step_dir.name) and step_dir.is_dir():
            folders = _rank_folders(step_dir)
            for r in folders:
                found[(_rank_of(r, folders), int(step_dir.name[4:]))] = r
    return found


def _rank_folders(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return sorted((d for d in path.iterdir() if re.fullmatch(r"(rank|proc)\d+", d.name)
                   and (d / "dump.json").is_file()), key=lambda d: (d.name[:4], int(d.name[4:])))


def _rank_of(folder: Path, siblings: list[Path]) -> int:
    """rank{R} is rank R; proc{PID} folders (no torch.distributed) are ranks 0, 1, ... in PID order."""
    if folder.name.startswith("rank") and folder.name[4:].isdigit():
        return int(folder.name[4:])
    procs = [s for s in siblings if s.name.startswith("proc")]
    return procs.index(folder) if folder in procs else 0


def _number(name: str, prefix: str) -> int:
    m = re.fullmatch(prefix + r"(\d+)", name)
    return int(m.group(1)) if m else 0


def detect(path: Path) -> bool:
    """An msprobe dump: a ``dump.json`` beside msprobe's other files, or one that says so."""
    found = partitions(path)
    if not found:
        return False
    folder = next(iter(found.values()))
    if (folder / "construct.json").is_file() or (folder / "stack.json").is_file():
        return True
    try:
        with open(folder / "dump.json", encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return '"task"' in head or '"framework"' in head


@register_format(TOOL, detect)
def open_msprobe(path: Path) -> PeerDump:
    """An msprobe dump as a :class:`~opscope.storage.peers.base.PeerDump`."""
    found = partitions(path)
    if not found:
        raise DumpFormatError(f"{path} holds no msprobe dump.json (give the dump_path, a step folder or a rank folder)")
    first = read_json(next(iter(found.values())) / "dump.json", "msprobe's dump.json")
    if not isinstance(first, dict):
        raise DumpFormatError(f"{next(iter(found.values())) / 'dump.json'} is not an msprobe dump.json (not an object)")
    problems: list[str] = []
    manifest = _manifest(first, found)
    if str(first.get("framework") or "pytorch") not in ("pytorch", "mindspore"):
        problems.append(f"msprobe dump of framework {first.get('framework')!r}: read as PyTorch names "
                        "(only PyTorch and MindSpore dumps are tested)")

    def build(rank: int, step: int) -> pa.Table:
        rows = read_partition(found[(rank, step)], rank, step, peer.problems)  # what it meets: the dump's problems
        return pa.Table.from_pylist(rows, schema=fmt.SCHEMA)

    def open_tensor(rank: int, step: int, data: str, key: str) -> tuple[str, np.ndarray]:
        return load_tensor(found[(rank, step)], data)

    peer = PeerDump(path, manifest, list(found), build, open_tensor, problems)
    return peer


def _manifest(first: dict[str, Any], found: dict[tuple[int, int], Path]) -> dict[str, Any]:
    level = str(first.get("level") or "L1")
    data = "tensor" if str(first.get("task")) == "tensor" else "statistics"
    md5 = '"md5"' in _head(next(iter(found.values())) / "dump.json")
    return {
        "format_version": fmt.FORMAT_VERSION,
        "tool": {"name": TOOL, "version": "(not recorded)", "task": first.get("task"), "level": level},
        "framework": {str(first.get("framework") or "pytorch"): "(not recorded)"},
        "level": _LEVELS.get(level, "api"),
        "config": {"level": _LEVELS.get(level, "api"), "mode": "all", "data": data},
        "hash_algorithm": HASH_ALGORITHM if md5 else None,
        "modules": level != "L1",  # L1 records no module tree: compare pairs by API and call order
        "tensor_hint": 'msprobe: "task": "tensor" in its config.json keeps full tensors',  # in compare's note
        "stats_backend": TOOL,
        "world_size": len({r for r, _ in found}),
        "notes": [f"read from an msprobe dump (task {first.get('task')}, level {level})"],
    }


def _head(path: Path, size: int = 65536) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(size)
    except OSError:
        return ""


def load_tensor(folder: Path, name: str) -> tuple[str, np.ndarray]:
    """One ``dump_tensor_data`` file as (torch dtype name, numpy array); bfloat16 as its
    uint16 bits, float8 as uint8 (the dump widens them). Never unpickles code."""
    if not safe_name(name):
        raise DumpFormatError(f"refusing tensor file name {name!r}: not a file of dump_tensor_data")
    path = folder / "dump_tensor_data" / name
    if name.endswith(".npy"):
        return load_npy(path)
    try:
        import torch
    except ImportError:
        raise DumpFormatError("reading msprobe's .pt tensors needs torch (pip install torch); "
                              "statistics work without it") from None
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DumpFormatError(f"{path} is missing (dump_tensor_data incomplete)") from None
    except Exception as exc:  # the safe unpickler refuses anything but tensors and plain containers
        raise DumpFormatError(f"refusing {path}: not a plain tensor file ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(value, torch.Tensor):
        raise DumpFormatError(f"refusing {path}: holds a {type(value).__name__}, not a tensor")
    return _to_numpy(value)


def _to_numpy(t: Any) -> tuple[str, np.ndarray]:
    import torch

    t = t.detach().cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        return dtype, t.view(torch.int16).numpy().view(np.uint16)
    if dtype.startswith("float8"):
        return dtype, t.view(torch.uint8).numpy()
    if t.is_complex():
        return dtype, torch.view_as_real(t).numpy()
    return dtype, t.numpy()


def load_npy(path: Path) -> tuple[str, np.ndarray]:
    """One ``.npy`` tensor of msprobe's MindSpore side, read without unpickling (a file that
    holds Python objects is refused); its dtype is the array's own (msprobe writes a
    bfloat16 tensor widened to float32)."""
    try:
        value = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DumpFormatError(f"{path} is missing (dump_tensor_data incomplete)") from None
    except ValueError as exc:  # allow_pickle=False: an object array is refused before any unpickling
        raise DumpFormatError(f"refusing {path}: not a plain numeric .npy file ({exc}); opscope never "
                              "unpickles dump files: dump the tensor again with msprobe") from None
    except OSError as exc:
        raise DumpFormatError(f"refusing {path}: not a readable .npy file ({exc})") from None
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc":
        raise DumpFormatError(f"refusing {path}: holds {type(value).__name__} of dtype "
                              f"{getattr(value, 'dtype', '?')}, not a numeric tensor")
    return str(value.dtype), value
