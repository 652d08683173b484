"""MindSpore's Data Dump (graph mode, e2e dump), read as opscope records.

Layout (MindSpore 2.x, CPU/GPU and Ascend O0/O1)::

    {path}/rank_{R}/{net_name}/{graph_id}/{iteration}/*.npy       tensors (or statistic.csv)
    {path}/rank_{R}/execution_order/ms_execution_order_graph_{G}.csv   full op names, in order
    {path}/rank_{R}/graphs/ms_output_trace_code_graph_{G}.ir          the kernel graph (text IR)
    {path}/rank_{R}/.dump_metadata/                                 MindSpore version, dump config

The dump root, a ``rank_N`` folder, or a net, graph or iteration folder below it may be
given. Iterations are opscope steps and ``rank_N`` folders its ranks. Each op of the
execution order becomes one call: its ``.npy`` files (or ``statistic.csv`` rows) its input
and output records, with ``seq`` its position in the order, ``phase`` from the scope
(``Gradients/...`` backward, ``optimizer-...`` optimizer, else forward), ``module`` the
cells of the scope (``Default/network-WithLossCell/_backbone-Net/b0-Block/fc1-Dense`` ->
``b0.fc1``, the training wrappers and the net itself dropped, so that module paths read like
the net's parameter names), ``op`` ``mindspore.<OpType>`` and ``node`` the full name. Data
flow (``producer``) and parameter names come from the IR (:mod:`.mindspore_ir`); statistics
are computed from the tensors (or read from ``statistic.csv``). Constant inputs that the dump
writes (a MatMul's transpose flags, a LayerNorm's epsilon) are inputs like any other.
``Parameter.*`` files (weights as left at the end of the iteration) are not read: every
weight is already recorded where an op reads it.

The modules doing the work, in the order data flows through them:

- :mod:`.mindspore_files` — tensor file names, ``.npy`` read without unpickling, ``statistic.csv``;
- :mod:`.mindspore_ir` — the kernel graph: each input's producer, weights, inferred shapes,
  device dtypes, the user's source line;
- :mod:`.mindspore_match` — which files are which op's (MindSpore renumbers some);
- :mod:`.mindspore_places` — phase and module (MindSpore scopes reused cells and expanded
  ops elsewhere);
- :mod:`.mindspore_rows` — the records of one (rank, iteration), and the files not compared
  (a dtype the kernel does not have, another op's shape, a device format).
"""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from opscope.errors import DumpFormatError
from opscope.storage import format as fmt
from opscope.storage.peers import register_format
from opscope.storage.peers.base import PeerDump
from opscope.storage.peers.mindspore_files import (
    STATISTIC_CSV,
    digest_column,
    parse_name,
    read_statistics,
)
from opscope.storage.peers.mindspore_ir import KernelGraph, read_graph
from opscope.storage.peers.mindspore_rows import RowBuilder

TOOL = "mindspore-dump"
_RANK = re.compile(r"rank_(\d+)")
_AUX = {"execution_order", "graphs", ".dump_metadata"}
_ORDER = "execution_order/ms_execution_order_graph_{}.csv"
_IR = "graphs/ms_output_trace_code_graph_{}.ir"


@dataclass
class _Layout:
    """Where the dump's tensors are: per (rank, iteration), its (graph id, folder) list."""

    root: Path
    ranks: dict[int, Path]
    folders: dict[tuple[int, int], list[tuple[int, Path]]] = field(default_factory=dict)
    listing: dict[Path, frozenset[str]] = field(default_factory=dict)
    orders: dict[tuple[int, int], tuple[str, ...]] = field(default_factory=dict)  # (rank, graph) ->
    graphs: dict[tuple[int, int], KernelGraph | None] = field(default_factory=dict)

    def order(self, rank: int, graph: int) -> tuple[str, ...]:
        """The execution order of one graph of one rank (read once)."""
        if (rank, graph) not in self.orders:
            self.orders[(rank, graph)] = _execution_order(self.ranks[rank], graph)
        return self.orders[(rank, graph)]

    def graph(self, rank: int, graph: int) -> KernelGraph | None:
        """The kernel graph (data flow) of one graph of one rank, None without its IR (read once)."""
        if (rank, graph) not in self.graphs:
            try:
                self.graphs[(rank, graph)] = read_graph(self.ranks[rank] / _IR.format(graph))
            except OSError:
                self.graphs[(rank, graph)] = None
        return self.graphs[(rank, graph)]


def _is_rank_dir(d: Path) -> bool:
    return bool(_RANK.fullmatch(d.name)) and d.is_dir() and any((d / a).is_dir() for a in _AUX)


def _locate(path: Path) -> tuple[dict[int, Path], list[str]] | None:
    """The rank folders of the dump at ``path``, and the net/graph/iteration folders it names."""
    if not path.is_dir():
        return None
    if _is_rank_dir(path):
        return {int(_RANK.fullmatch(path.name).group(1)): path}, []  # type: ignore[union-attr]
    ranks = {int(m.group(1)): d for d in path.iterdir() if (m := _RANK.fullmatch(d.name)) and _is_rank_dir(d)}
    if ranks:
        return dict(sorted(ranks.items())), []
    below, up = [path.name], path.parent
    for _ in range(3):
        if _is_rank_dir(up):
            return {int(_RANK.fullmatch(up.name).group(1)): up}, below  # type: ignore[union-attr]
        below, up = [up.name, *below], up.parent
    return None


def detect(path: Path) -> bool:
    """True when ``path`` is a MindSpore Data Dump: its root, a ``rank_N`` folder or one below."""
    try:
        return _locate(path) is not None
    except OSError:
        return False


def _layout(path: Path) -> _Layout:
    found = _locate(path)
    if found is None:
        raise DumpFormatError(f"{str(path)!r} is not a MindSpore Data Dump")
    ranks, below = found
    layout = _Layout(path, ranks)
    for rank, rank_dir in ranks.items():
        for net in sorted(d for d in rank_dir.iterdir() if d.is_dir() and d.name not in _AUX):
            if below and net.name != below[0]:
                continue
            graphs = (d for d in net.iterdir() if d.is_dir() and d.name.isdigit())
            for graph in sorted(graphs, key=lambda d: int(d.name)):
                if len(below) > 1 and graph.name != below[1]:
                    continue
                for it in (d for d in graph.iterdir() if d.is_dir() and d.name.isdigit()):
                    if len(below) > 2 and it.name != below[2]:
                        continue
                    layout.folders.setdefault((rank, int(it.name)), []).append((int(graph.name), it))
                    layout.listing[it] = frozenset(f.name for f in it.iterdir() if _inside(f, rank_dir))
    if not layout.folders:
        raise DumpFormatError(f"{str(path)!r} looks like a MindSpore Data Dump but holds no iteration "
                              "folder (rank_N/<net>/<graph>/<iteration>/): the run dumped nothing, or "
                              "the dump config's 'iteration' selected none that ran")
    return layout


def _inside(file: Path, rank_dir: Path) -> bool:
    """A regular file of the dump: a link to a file outside its rank folder is not read."""
    try:
        return file.is_file() and file.resolve().is_relative_to(rank_dir.resolve())
    except OSError:
        return False


@register_format(TOOL, detect)
def open_dump(path: Path) -> PeerDump:
    """Open the MindSpore Data Dump at ``path`` (root, rank, net, graph or iteration folder)."""
    layout = _layout(path)
    for (rank, _), folders in layout.folders.items():
        for graph_id, _ in folders:
            layout.order(rank, graph_id)  # missing: say so now, not mid-compare
    meta = _metadata(next(iter(layout.ranks.values())))
    opened: list[PeerDump] = []

    data, algorithm = _content(layout)

    def build(rank: int, step: int) -> pa.Table:  # what it cannot read goes to the dump's problems
        return _build(layout, rank, step, opened[0].problems, digests=data == "statistics")

    def open_tensor(rank: int, step: int, data: str, key: str) -> tuple[str, np.ndarray]:
        return _open_tensor(layout, rank, step, data, key)

    manifest = {
        "format_version": fmt.FORMAT_VERSION, "tool": {"name": TOOL, "version": meta.get("ms_version", "?")},
        "framework": {"mindspore": meta.get("ms_version", "?")}, "level": "mindspore",
        "device": meta.get("device_target"), "world_size": len(layout.ranks),
        "config": {"level": "mindspore", "mode": "all", "data": data, "mindspore": meta.get("config")},
        "hash_algorithm": algorithm,
        # statistics of .npy tensors are opscope's (numpy, two-pass): their std is exact
        "std": fmt.STD_METHOD if data == "tensor" else None,
    }
    opened.append(PeerDump(path, manifest, list(layout.folders), build, open_tensor))
    return opened[0]


def _content(layout: _Layout) -> tuple[str, str | None]:
    """``tensor`` or ``statistics``, and the algorithm of the records' hashes: opscope's own
    (computed from the tensors), a statistic.csv digest's first 64 bits, or none."""
    if any(n.endswith(".npy") for names in layout.listing.values() for n in names):
        return "tensor", fmt.HASH_ALGORITHM
    csvs = [folder / STATISTIC_CSV for folder, names in layout.listing.items() if STATISTIC_CSV in names]
    digest = digest_column(csvs[0]) if csvs else None
    return "statistics", (f"mindspore-{digest.lower()}-64" if digest else None)


def _metadata(rank_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for name, key in (("config.json", None), ("data_dump.json", "config")):
        try:
            value = json.loads((rank_dir / ".dump_metadata" / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if key is None and isinstance(value, dict):
            meta.update(value)
        else:
            meta[key or name] = value
    return meta


def _execution_order(rank_dir: Path, graph: int) -> tuple[str, ...]:
    path = rank_dir / _ORDER.format(graph)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = [r[0].strip() for r in csv.reader(f) if r and r[0].strip()]
    except OSError as exc:
        raise DumpFormatError(
            f"{path} is missing or unreadable ({exc.strerror or exc}): the dump's file names cannot be "
            "mapped back to ops without it (their scope names are mangled); copy the whole rank_N "
            "folder, execution_order/ and graphs/ included") from None
    return tuple(r for r in rows if not r.startswith("NodeExecutionOrder"))


def _build(layout: _Layout, rank: int, step: int, problems: list[str], digests: bool) -> pa.Table:
    """One partition's records; ``digests``: keep statistic.csv digests as hashes (a dump of
    statistics only: with tensors, hashes are opscope's own, computed from them)."""
    rank_dir = layout.ranks[rank]
    builder = RowBuilder(rank, step, digests)
    for index, (graph_id, folder) in enumerate(layout.folders[(rank, step)]):
        order, graph = layout.order(rank, graph_id), layout.graph(rank, graph_id)
        if graph is None:
            _note(problems, f"{rank_dir / _IR.format(graph_id)} is missing: no data flow (producers) and "
                            f"no parameter names for graph {graph_id}; compare pairs ops by order only")
        files = defaultdict(list)
        for name in sorted(layout.listing[folder]):
            parsed = parse_name(name)
            if parsed is not None:
                files[parsed.op_name].append(parsed)
        statistics = defaultdict(list)
        if STATISTIC_CSV in layout.listing[folder]:
            for row in read_statistics(folder / STATISTIC_CSV):
                statistics[row.op_name].append(row)
        unmatched = builder.add_graph(str(index), folder, order, graph, files, statistics, problems)
        if unmatched:
            _note(problems, f"{len(unmatched)} tensor files in {folder} name no op of {_ORDER.format(graph_id)} "
                            f"(e.g. {unmatched[0]}): skipped")
    return builder.table()


def _note(problems: list[str], message: str) -> None:
    if message not in problems:
        problems.append(message)


def _open_tensor(layout: _Layout, rank: int, step: int, data: str, key: str) -> tuple[str, np.ndarray]:
    from opscope.storage.peers.mindspore_files import load_array

    folders = layout.folders.get((rank, step), [])
    if not data.isdigit() or int(data) >= len(folders):
        raise DumpFormatError(f"no iteration folder {data!r} for rank {rank} step {step} in {layout.root}")
    folder = folders[int(data)][1]
    if key not in layout.listing[folder]:  # only files listed from the folder: a name never becomes a path
        raise DumpFormatError(f"refusing tensor file name {key!r}: not a file of {folder}")
    parsed = parse_name(key)
    arr = load_array(folder / key)
    dtype = parsed.dtype if parsed is not None else str(arr.dtype)
    if dtype == "bfloat16" and arr.dtype != np.uint16:  # written as float32 values, not bf16 bits
        dtype = arr.dtype.name
    return dtype, arr
