"""One msprobe rank folder (``dump.json``, ``construct.json``, ``stack.json``) as opscope records.

Rows follow :data:`opscope.storage.format.SCHEMA` (docs/peer-dumps.md says what maps to what):

- ``seq`` is the entry's place in ``dump.json`` (msprobe writes entries as calls end); at
  L0 a module's inputs are placed before its submodules' calls, its outputs after them.
- ``call`` is rebuilt from that order, per (phase, module, op): msprobe's own counter is
  global per API, so one inserted call shifts every later counter of that API, wherever it
  ran; opscope's alignment then pairs calls by sequence, not by counter.
- ``producer`` (data flow) is rebuilt from the statistics: an input whose dtype, shape and
  Max/Min/Mean/Norm (and md5, when dumped) equal an earlier output's in the same step was
  made by that output's call (the latest such call); views and casts msprobe does not
  record are bridged the same way (``_Builder._link``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from opscope.errors import DumpFormatError
from opscope.model.calls import in_place
from opscope.storage.peers.msprobe_names import api_name, dtype_name, mindspore_name, parse_entry, parse_module

Row = dict[str, Any]
_SIMPLE_TYPES = ("int", "float", "bool", "str")
_FRAME = re.compile(r"^File (?P<file>.+?), line (?P<line>\d+), in (?P<func>[^,]+)")
_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen", "/lib/python3")


def read_json(path: Path, what: str) -> Any:
    """A JSON file of the dump, or a DumpFormatError that names the file and the fix."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DumpFormatError(f"{path} ({what}) is unreadable: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DumpFormatError(f"{path} ({what}) is not valid JSON ({exc}): the file is truncated or was not "
                              "written by msprobe; dump that step again (a run killed while msprobe writes "
                              "leaves it half written)") from None


def read_partition(folder: Path, rank: int, step: int, problems: list[str]) -> list[Row]:
    """The records of one msprobe rank folder, in execution order."""
    dump = read_json(folder / "dump.json", "msprobe's dump.json")
    data = dump.get("data") if isinstance(dump, dict) else None
    if not isinstance(data, dict):
        raise DumpFormatError(f"{folder / 'dump.json'} has no \"data\" object: not an msprobe dump.json "
                              "(give the dump_path msprobe wrote, a step folder or a rank folder)")
    construct = _optional_json(folder / "construct.json", problems)
    stacks = _sources(_optional_json(folder / "stack.json", problems))
    builder = _Builder(rank, step, construct, stacks, str(dump.get("level") or ""), problems)
    if str(dump.get("framework") or "pytorch") == "mindspore":
        builder.name_of = mindspore_name  # kept in MindSpore's namespace (msprobe_names)
    builder.add_all(data)
    return builder.finish()


def _optional_json(path: Path, problems: list[str]) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        found = read_json(path, "msprobe's " + path.name)
    except DumpFormatError as exc:
        problems.append(f"{exc}; read without it")
        return {}
    return found if isinstance(found, dict) else {}


def _sources(stacks: dict[str, Any]) -> dict[str, str]:
    """Entry name -> the user's ``file:line (function)``: the innermost frame outside libraries."""
    out: dict[str, str] = {}
    for value in stacks.values():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)):
            continue
        names, frames = value
        where = next((m for m in (_FRAME.match(str(f)) for f in frames or [])
                      if m and not any(lib in m.group("file") for lib in _LIBRARY)), None)
        if where is not None:
            text = f"{where.group('file')}:{where.group('line')} ({where.group('func').strip()})"
            out.update(dict.fromkeys(map(str, names), text))
    return out


class _Builder:
    """Turns entries into rows; holds the per-step counters and the data-flow index."""

    def __init__(self, rank: int, step: int, construct: dict[str, Any], sources: dict[str, str],
                 level: str, problems: list[str]) -> None:
        self.rank, self.step, self.construct, self.sources = rank, step, construct, sources
        self.level, self.problems = level, problems
        self.rows: list[Row] = []
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.made_by: dict[tuple[Any, ...], int] = {}
        self.params: dict[tuple[str, tuple[Any, ...]], str] = {}
        self.optimized: set[tuple[Any, ...]] = set()
        self.start = 0.0  # where the entry being read began (L0 modules: before their submodules)
        self.name_of = api_name

    def add_all(self, data: dict[str, Any]) -> None:
        self._index_parameters(data)
        last_backward = max((i for i, n in enumerate(data) if n.endswith(".backward")
                             or ".backward." in n), default=-1)
        optimizer = {n for i, n in enumerate(data) if self._under_optimizer(n)
                     or (not self.construct and i > last_backward >= 0)}
        self._index_optimized(data, optimizer)
        starts = _starts(data, self.construct) if self.level == "L0" else {}
        for position, name in enumerate(data):
            entry, seq = data[name], float(position)
            self.start = starts.get(name, seq)
            if not isinstance(entry, dict):
                self.problems.append(f"msprobe entry {name!r} is not an object: skipped")
                continue
            api = parse_entry(name)
            if api is not None:
                self._api(name, api, entry, seq, name in optimizer)
            elif parse_module(name) is not None:
                self._module(name, parse_module(name), entry, seq)  # type: ignore[arg-type]
            else:
                self.problems.append(f"msprobe entry {name!r} has a name opscope does not know: skipped")

    def finish(self) -> list[Row]:
        self.rows.sort(key=lambda r: (r["seq"], r["io"] == "output", r["slot"]))
        places = {seq: i for i, seq in enumerate(sorted({r["seq"] for r in self.rows}))}
        for i, row in enumerate(self.rows):
            row["id"] = self.step * 100_000_000 + i
            row["seq"] = places[row["seq"]]
        self._link()
        return self.rows

    # -- entries ---------------------------------------------------------------------
    def _api(self, name: str, api: tuple[str, str, int, str], entry: Row, seq: float, optimizer: bool) -> None:
        prefix, raw, _, direction = api
        op = self.name_of(prefix, raw)
        if direction == "forward":
            phase = "optimizer" if optimizer else "forward"
            module = self._module_of(name)
            call = self._call(seq, phase, module, op, self.sources.get(name))
            self._forward_rows(call, entry, module)
        else:
            module = self._module_of(name[: -len("backward")] + "forward")
            call = self._call(seq, "backward", module, op, self.sources.get(name), fwd_op=op)
            self._grad_rows(call, entry.get("input"), "input", "grad_output")
            self._grad_rows(call, entry.get("output"), "output", "grad_input")

    def _module(self, name: str, parsed: tuple[str, str, str, int], entry: Row, seq: float) -> None:
        path, cls, direction, _ = parsed
        if direction == "parameters_grad":
            call = self._call(seq, "backward", path, "parameters_grad", None)
            for slot, (param, value) in enumerate(entry.items()):
                stat = value[0] if isinstance(value, list) and value else value
                self._row(call, "grad", slot, None, stat, param=_join(path, param))
            return
        if self.level != "L0":
            return  # at mix the API calls inside carry the data; the module names their module
        if direction == "forward":
            call = self._call(seq, "forward", path, cls, self.sources.get(name))
            self._forward_rows(call, entry, path)
            for slot, (param, stat) in enumerate((entry.get("parameters") or {}).items()):
                self._row(call, "param", slot, param, stat, param=_join(path, param))
        else:
            call = self._call(seq, "backward", path, cls, self.sources.get(name), fwd_op=cls)
            self._grad_rows(call, entry.get("input"), "input", "grad_output")
            self._grad_rows(call, entry.get("output"), "output", "grad_input")

    def _forward_rows(self, call: Row, entry: Row, module: str) -> None:
        slot, positional = 0, []
        in_place = _writes_input(str(call["op"]))
        for i, value in enumerate(entry.get("input_args") or []):
            for stat in _tensors(value):
                identity = _identity(stat)
                param = self.params.get((module, identity)) or self.params.get(("*", identity))
                known = param is not None or identity in self.optimized
                self._row(call, "param" if known else "input", slot, None, stat, param=param)
                if in_place and slot == 0:
                    # msprobe hashes on a thread: the tensor an in-place op writes may be hashed
                    # before or after the write (measured: the same run twice gave both)
                    self.rows[-1]["hash"] = None
                slot += 1
            if not _has_tensor(value):
                positional.append([i, _plain(value)])
        keywords = {}
        for key, value in (entry.get("input_kwargs") or {}).items():
            for stat in _tensors(value):
                self._row(call, "input", slot, str(key), stat)
                slot += 1
            if not _has_tensor(value):
                keywords[str(key)] = _plain(value)
        if positional or keywords:
            call["args"] = json.dumps([positional, keywords])
        for out_slot, stat in enumerate(_tensors(entry.get("output"))):
            self._row(call, "output", out_slot, None, stat)

    def _grad_rows(self, call: Row, values: Any, io: str, arg: str) -> None:
        items = values if isinstance(values, list) else [values]
        for slot, value in enumerate(items):  # positions kept: a None is an input without a gradient
            for stat in _tensors(value):
                self._row(call, io, slot, arg, stat)

    # -- rows ------------------------------------------------------------------------
    def _call(self, seq: float, phase: str, module: str, op: str, source: str | None,
              fwd_op: str | None = None) -> Row:
        key = (phase, module, op)
        index = self.calls[key]
        self.calls[key] += 1
        return {"seq": seq, "phase": phase, "module": module, "op": op, "call": index, "source": source,
                "fwd_op": fwd_op, "args": None}

    def _row(self, call: Row, io: str, slot: int, arg: str | None, stat: Row, param: str | None = None) -> None:
        row = {**call, **tensor_columns(stat, self.problems), "rank": self.rank, "step": self.step,
               "io": io, "slot": slot, "arg": arg, "param": param}
        if io != "output" and call["phase"] == "forward":
            row["seq"] = min(row["seq"], self.start)  # L0: a module's inputs before its submodules
        self.rows.append(row)

    def _module_of(self, name: str) -> str:
        parent = self.construct.get(name)
        parsed = parse_module(str(parent)) if parent else None
        return parsed[0] if parsed else ""

    def _under_optimizer(self, name: str) -> bool:
        seen: set[str] = set()
        parent = self.construct.get(name)
        while isinstance(parent, str) and parent not in seen:
            if parent == "optimizer":
                return True
            seen.add(parent)
            parent = self.construct.get(parent)
        return False

    def _index_parameters(self, data: dict[str, Any]) -> None:
        """Parameters a module entry lists (mix, L0), by module and content, to name the API
        inputs that are those parameters."""
        for name, entry in data.items():
            parsed = parse_module(name)
            if parsed is None or parsed[2] != "forward" or not isinstance(entry, dict):
                continue
            for param, stat in (entry.get("parameters") or {}).items():
                if isinstance(stat, dict):
                    self.params[(parsed[0], _identity(stat))] = _join(parsed[0], param)
                    self.params.setdefault(("*", _identity(stat)), _join(parsed[0], param))

    def _index_optimized(self, data: dict[str, Any], optimizer: set[str]) -> None:
        """Tensors the optimizer reads that require grad: the parameters (msprobe's L1 names
        none), so the API inputs holding them are ``param`` rows, as at opscope's api level."""
        for name in optimizer:
            entry = data.get(name)
            for value in (entry.get("input_args") or []) if isinstance(entry, dict) else []:
                for stat in _tensors(value):
                    if stat.get("requires_grad"):
                        self.optimized.add(_identity(stat))

    def _link(self) -> None:
        """Data flow from equal statistics: an input's producer is the latest earlier output
        holding the same tensor (see the module docstring). Failing that, one with the same
        elements in another shape (a view msprobe does not record: ``x.view(-1, n)`` before
        ``torch.addmm``), then one of the same size and extremes in another float dtype (an
        unrecorded cast, ``.float()``: exact on the extremes)."""
        tiers: list[dict[tuple[Any, ...], Row]] = [{}, {}, {}]
        for row in self.rows:
            keys = _flow_keys(row)
            if keys is None:
                continue
            if row["io"] == "output":
                for tier, key in zip(tiers, keys):
                    tier[key] = row
                continue
            for level, (tier, key) in enumerate(zip(tiers, keys)):
                found = tier.get(key)
                if found is not None and (level < 2 or (_floating(row) and _floating(found)
                                                        and found["dtype"] != row["dtype"])):
                    row["producer"] = found["id"]
                    break


def _writes_input(op: str) -> bool:
    """An in-place call: it writes the tensor it reads first (``add_``, ``x[i] = v``, ``x **= 2``)."""
    return in_place(op.rsplit(".", 1)[-1])


def _floating(row: Row) -> bool:
    return str(row.get("dtype")).startswith(("float", "bfloat"))


def _starts(data: dict[str, Any], construct: dict[str, Any]) -> dict[str, float]:
    """L0: where each module call began. msprobe writes an entry when its call ends, so a
    module's entry comes after its submodules'; its inputs are placed before the first of
    them (outer modules before inner ones), its outputs where the entry was written."""
    start = {n: float(i) for i, n in enumerate(data)}
    for i, name in enumerate(data):
        parent, seen = construct.get(name), set()
        while isinstance(parent, str) and parent in start and parent not in seen:
            seen.add(parent)
            parent_start = i - 0.5 - 0.001 * len(seen)
            start[parent] = min(start[parent], parent_start)
            parent = construct.get(parent)
    return start


def tensor_columns(stat: Row, problems: list[str]) -> Row:
    """The schema columns of one msprobe tensor description."""
    shape = [int(x) for x in stat.get("shape") or []]
    dtype = dtype_name(str(stat.get("dtype") or ""))
    values = {k: _num(stat.get(v)) for k, v in (("min", "Min"), ("max", "Max"), ("mean", "Mean"), ("norm", "Norm"))}
    cols: Row = {**values, "dtype": dtype, "shape": shape, "numel": math.prod(shape), "producer": None}
    lo, hi = values["min"], values["max"]
    if lo is not None and hi is not None and not (math.isnan(lo) or math.isnan(hi)):
        cols["absmax"] = max(abs(lo), abs(hi))
    known = [v for v in values.values() if v is not None]
    if known:  # a NaN or Inf shows in the extremes or sums: at least one such element
        cols["nan"] = int(any(math.isnan(v) for v in known))
        cols["inf"] = int(any(math.isinf(v) for v in (lo, hi) if v is not None))
    md5 = stat.get("md5")
    if isinstance(md5, str) and re.fullmatch(r"[0-9a-fA-F]{1,16}", md5):
        cols["hash"] = int(md5, 16)
    data_name = stat.get("data_name")
    if isinstance(data_name, str) and data_name:
        if safe_name(data_name):
            cols["data"], cols["key"] = data_name, "tensor"
        else:
            problems.append(f"refused tensor file name {data_name!r} from dump.json: not a file of "
                            "dump_tensor_data (statistics used for it)")
    return cols


def safe_name(name: str) -> bool:
    """A file name inside dump_tensor_data: no folder part, no parent, nothing hidden."""
    return bool(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name)) and ".." not in name and len(name) < 512


def _tensors(value: Any) -> list[Row]:
    """Tensor descriptions in a (nested) argument or output, in order."""
    if isinstance(value, dict):
        return [value] if _is_tensor(value) else []
    if isinstance(value, list):
        return [t for v in value for t in _tensors(v)]
    return []


def _is_tensor(value: Row) -> bool:
    kind = str(value.get("type") or "")
    return kind.endswith("Tensor") or kind.endswith("Parameter") or ("dtype" in value and "shape" in value
                                                                       and "value" not in value)


def _has_tensor(value: Any) -> bool:
    return bool(_tensors(value))


def _plain(value: Any) -> Any:
    """A non-tensor argument as replay reads it (numbers, strings, lists; others as text)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        inner = value.get("value")
        return inner if str(value.get("type")) in _SIMPLE_TYPES else str(inner)
    return value


def _identity(stat: Row) -> tuple[Any, ...]:
    return (str(stat.get("dtype")), tuple(stat.get("shape") or []), stat.get("Max"), stat.get("Min"),
            stat.get("Mean"), stat.get("Norm"), stat.get("md5"))


def _flow_keys(row: Row) -> tuple[tuple[Any, ...], ...] | None:
    """Keys of a tensor's content: exact (dtype, shape, statistics, md5); the same without
    the shape (a view); size and extremes only (a cast)."""
    stats = (row.get("max"), row.get("min"), row.get("mean"), row.get("norm"))
    if all(v is None for v in stats) or any(v is not None and math.isnan(v) for v in stats):
        return None
    shape = tuple(row.get("shape") or [])
    dtype, digest = row.get("dtype"), row.get("hash")
    return ((dtype, shape, *stats, digest), (dtype, row.get("numel"), *stats, digest),
            (row.get("numel"), row.get("max"), row.get("min")))


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else str(name)
