"""``opscope.compare(target, reference)``: align two dumps, measure, judge, blame."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from opscope.compare import carried, crossframework, decisions, loss_scale, masked_rows, measure, param_moves
from opscope.compare.align import Pair, align_partition, rename_target
from opscope.compare.blame import execution_order
from opscope.compare.crossframework import dump_level, is_cross, manifest_warnings
from opscope.compare.crossframework.levels import level_mismatch
from opscope.compare.graphs import explain_random_graphs
from opscope.compare.mapping import Mapping, load_mapping
from opscope.compare.modules import flatten_modules, records_modules
from opscope.compare.partitioned import WINDOW_PAIRS, PartitionedRun
from opscope.compare.passes import CompareInputs, ResultPass, result_pass
from opscope.compare.result import CompareResult
from opscope.compare.tolerance import NoiseModel
from opscope.errors import NothingToCompareError

WEAKER = ("some pairs were judged from statistics only (no full tensors on both sides): "
          "their error is a lower bound, so a difference the statistics do not show can hide; "
          "dump with data=\"tensor\" for a full verdict")


def compare(target: str | os.PathLike | Any, reference: str | os.PathLike | Any, *,
            mapping: str | os.PathLike | dict[str, Any] | Mapping | None = None,
            workers: int | None = None, progress: Callable[[int, int], None] | None = None,
            precision: str | None = None, noise: NoiseModel | None = None,
            ranks: list[int] | None = None, steps: list[int] | None = None, replay: int = 0,
            then: Sequence[ResultPass] = (), scheduler: Any = None) -> CompareResult:
    """Compare two dumps and name the operator where they start to differ.

    Args:
        target: the dump under test (a path or an :class:`opscope.Dump`).
        reference: the dump taken as right (e.g. the float64 or CPU run).
        mapping: a YAML/JSON file (or dict) renaming the target's modules, ops and
            parameters into the reference's (docs/compare.md).
        workers: tensors measured at a time (threads, or processes where a registered metric
            needs Python per chunk: :mod:`opscope.compare.pool`); default every core, 1 for none.
        progress: called as ``progress(bytes_done, bytes_total)`` while tensors are read.
        precision: force the target's precision when dtypes do not show it (e.g. "tf32").
        noise: thresholds of the verdict (:class:`~opscope.compare.tolerance.NoiseModel`).
        ranks, steps: compare only these.
        replay: re-run the top ``replay`` culprits in float64 on each side's inputs
            (:mod:`opscope.replay`, needs torch and full tensors); each gets ``.replay``.
            It is the result pass registered as ``"replay"`` (:mod:`opscope.compare.passes`).
        then: more passes over the finished result (:data:`~opscope.compare.passes.ResultPass`),
            run in order after ``replay``.
        scheduler: measure on a Dask cluster instead of local processes: a
            ``dask.distributed.Client``, a scheduler address (``tcp://host:8786``) or a
            ``--scheduler-file`` JSON; the workers must see both dumps at the same paths
            (:mod:`opscope.compare.distributed`, needs ``opscope[dask]``).

    Returns:
        A :class:`~opscope.compare.result.CompareResult`.

    Raises:
        DumpFormatError: a path is not a readable dump.
        NothingToCompareError: the dumps share no record that could be compared.
    """
    from opscope.storage.reader import Dump, load

    start = time.perf_counter()
    t_dump = target if isinstance(target, Dump) else load(target)
    r_dump = reference if isinstance(reference, Dump) else load(reference)
    noise = noise or NoiseModel(precision=precision)
    if precision and noise.precision != precision:
        noise = NoiseModel(**{**noise.__dict__, "precision": precision})
    names = load_mapping(mapping)
    problems: list[str] = [*manifest_warnings(t_dump, "target"), *manifest_warnings(r_dump, "reference"),
                           *level_mismatch(t_dump, r_dump)]
    parts = _partitions(t_dump, r_dump, ranks, steps, problems)
    scales = loss_scale.LossScales()
    n_workers = max(1, int(workers or measure.default_workers()))
    with PartitionedRun(t_dump, r_dump, noise, workers=n_workers, scheduler=scheduler, progress=progress) as run:
        window: list[tuple[int, int, list[Pair]]] = []
        for rank, step in parts:  # a window of partitions at a time: the index is never held whole
            window.append((rank, step, _align(t_dump, r_dump, rank, step, names, problems, scales)))
            if sum(len(part) for _, _, part in window) >= WINDOW_PAIRS:
                run.run_window(window)
        run.run_window(window)
    findings, decided = decisions.settle(run.close(), (t_dump, r_dump))
    problems = _unique([*t_dump.problems, *r_dump.problems, *problems, *run.problems])
    counts = run.counts
    measured = counts["identical"] + counts["passed"] + counts["failed"]
    if not measured:
        raise NothingToCompareError(_nothing_message(t_dump, r_dump, counts, problems))
    result = _result(t_dump, r_dump, run, findings, problems, noise, names, n_workers,
                     time.perf_counter() - start)
    result.notes += scales.notes()
    result.notes += carried.notes(run.previous, (t_dump, r_dump))
    result.notes += param_moves.notes(run.previous)
    result.notes += run.notes + decided
    masked_rows.explain(result.culprits, (t_dump, r_dump), noise.ratio)
    passes = [result_pass("replay", replay)] if replay else []
    for finish in [*passes, *then]:
        finish(result, CompareInputs(t_dump, r_dump, noise))
    for given, dump in ((target, t_dump), (reference, r_dump)):
        if dump is not given:  # loaded here: its shards read for the notes are closed
            dump.close()
    return result


def _partitions(t_dump: Any, r_dump: Any, ranks: list[int] | None, steps: list[int] | None,
                problems: list[str]) -> list[tuple[int, int]]:
    t_parts, r_parts = set(t_dump.partitions()), set(r_dump.partitions())
    for side, only in (("target", t_parts - r_parts), ("reference", r_parts - t_parts)):
        for rank, step in sorted(only):
            if (ranks is None or rank in ranks) and (steps is None or step in steps):
                problems.append(f"rank {rank} step {step} is in the {side} only: skipped")
    return sorted((r, s) for r, s in t_parts & r_parts
                  if (ranks is None or r in ranks) and (steps is None or s in steps))


def _align(t_dump: Any, r_dump: Any, rank: int, step: int, names: Mapping, problems: list[str],
           scales: loss_scale.LossScales | None = None) -> list[Pair]:
    t_rows = _rows(t_dump.records(rank=rank, step=step))
    r_rows = _rows(r_dump.records(rank=rank, step=step))
    for side, rows in (("target", t_rows), ("reference", r_rows)):
        if not rows:
            problems.append(f"rank {rank} step {step} has no readable records in the {side}: skipped")
    if not t_rows or not r_rows:
        return []
    for side, rows, dump in (("target", t_rows, t_dump), ("reference", r_rows, r_dump)):
        link_same_bytes(rows)
        _inherit_data(rows)
        phases = (dump.manifest.get("config") or {}).get("phases") or ["optimizer"]
        (scales or loss_scale.LossScales()).read(side, rank, step, rows, optimizer_seen="optimizer" in phases,
                                                 api=dump_level(dump) == "api")
    rename_target(t_rows, names)
    if not (records_modules(t_dump) and records_modules(r_dump)):  # msprobe at L1: pair by API and order
        for rows in (t_rows, r_rows):
            flatten_modules(rows)
    levels = dump_level(t_dump), dump_level(r_dump)
    if is_cross(*levels):  # an ONNX Runtime dump (a framework with an op table): pair through it
        return crossframework.align_partition(t_rows, r_rows, *levels)
    return align_partition(t_rows, r_rows)


def _rows(table: Any) -> list[dict[str, Any]]:
    """The index rows as dicts, each repeated string (phase, module, op, dtype, ...) one object:
    ``to_pylist`` makes a new string per cell, ~50-60 bytes each, held until the verdict."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = table.to_pylist()
    seen: dict[str, str] = {}
    for field in table.schema:
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            name = field.name
            for row in rows:
                value = row[name]
                if value is not None:
                    row[name] = seen.setdefault(value, value)
    return rows


def link_same_bytes(rows: list[dict[str, Any]]) -> None:
    """An input read with no producer whose bytes an earlier output of the step holds (the
    same hash, element count and dtype) takes that output as its producer.

    The capture loses the producer where memory an op wrote through one view is read through
    another: autograd fills a zeroed buffer through a strided view (``copy_``) and reads the
    whole buffer back (``as_strided``). Unlinked, such a gradient looked like a value that
    differed at the start of the step (a root), and a loss scale did not reach it. Constant
    tensors are left alone: the loss's seed gradient (1.0) equals many a scalar by chance."""
    latest: dict[tuple[Any, ...], int] = {}
    for row in rows:
        digest = row.get("hash")
        if digest is None or row.get("min") == row.get("max"):
            continue  # a constant (a zeroed buffer, the loss's seed 1.0) matches by chance
        key = (digest, row.get("numel"), row.get("dtype"))
        io = row.get("io")
        if io == "output":
            latest[key] = row["id"]
        elif io == "input" and row.get("producer") is None and key in latest:
            row["producer"] = latest[key]


def _inherit_data(rows: list[dict[str, Any]]) -> None:
    """An input row without its own tensor reads its producer's (the same tensor)."""
    by_id = {row["id"]: row for row in rows}
    for row in rows:
        if not row.get("data") and row.get("producer") is not None:
            producer = by_id.get(row["producer"])
            if producer is not None and producer.get("data") and producer.get("numel") == row.get("numel"):
                row["data"], row["key"], row["view"] = producer["data"], producer["key"], producer.get("view")


def _verdict(counts: dict[str, int], culprits: int) -> str:
    if culprits:
        return "diverged"
    exact = counts["identical"] == counts["pairs"] and not (
        counts["skipped"] or counts["unpaired_target"] or counts["unpaired_reference"])
    return "identical" if exact else "within_tolerance"


def _result(t_dump: Any, r_dump: Any, run: PartitionedRun, findings: list[Any], problems: list[str],
            noise: NoiseModel, names: Mapping, workers: int, elapsed: float) -> CompareResult:
    explain_random_graphs(findings, (t_dump.manifest, r_dump.manifest))
    firsts: dict[int, Any] = {}
    for f in findings:  # in execution order: each rank's first
        firsts.setdefault(f.rank, f)
    firsts = dict(sorted(firsts.items()))
    first = min(firsts.values(), key=execution_order, default=None)
    stats_only = run.statistics_only
    hints = [h for h in dict.fromkeys(d.manifest.get("tensor_hint") for d in (t_dump, r_dump)) if h]
    weaker = f"{WEAKER} ({'; '.join(hints)})" if hints else WEAKER  # a peer dump: how its tool keeps tensors
    settings = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                for k, v in noise.__dict__.items()}
    settings.update(workers=workers, mapping=names.to_dict() if names else None)
    return CompareResult(
        target=str(t_dump.path), reference=str(r_dump.path), verdict=_verdict(run.counts, len(findings)),
        first_divergence=first, culprits=findings, counts=run.counts, pairs_file=run.pairs_file,
        problems=problems, first_divergence_by_rank=firsts, statistics_only=stats_only,
        weaker=weaker if stats_only else None, settings=settings, elapsed_s=elapsed,
        bytes_compared=run.bytes_compared)


def _nothing_message(t_dump: Any, r_dump: Any, counts: dict[str, int], problems: list[str]) -> str:
    why = "; ".join(problems[:8]) if problems else "no record of one matches a record of the other"
    return (f"nothing could be compared between {str(t_dump.path)!r} and {str(r_dump.path)!r} "
            f"({counts['pairs']} pairs, {counts['skipped']} skipped, {counts['unpaired_target']} target "
            f"and {counts['unpaired_reference']} reference records unpaired): {why}. Check that both "
            "dumps come from the same model and steps, or give a mapping file (--mapping)")


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
