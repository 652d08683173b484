"""Measuring aligned pairs: from hashes, from full tensors (on every core), or from
statistics only.

Tensor reads are cut into batches of about equal bytes, each a run of tensors in the order
they were written, and spread over threads of this process or a process pool (every core;
:mod:`opscope.compare.pool` says which); each batch opens the two dumps itself and streams
one tensor pair at a time through two small buffers (:mod:`opscope.compare.stream`), so
memory stays the same whatever the dump's size.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from opscope.compare import metrics as M
from opscope.compare.align import Pair
from opscope.compare.stream import Job  # noqa: F401  (one tensor pair to measure; defined beside its reader)
from opscope.compare.tolerance import NoiseModel, is_float
from opscope.model.hashing import WEAK
from opscope.model.records import ABSENT_NOTE, NOT_DATA_NOTES
from opscope.storage.format import STD_METHOD

POOL_MIN_BYTES = 64 << 20  # below this a pool costs more than it saves
BATCH_BYTES = 64 << 20  # a pool's task reads about this much (more when that makes over MAX_BATCHES)
MAX_BATCHES = 512
Progress = Callable[[int, int], None]


def hashes_comparable(t_manifest: dict[str, Any], r_manifest: dict[str, Any]) -> bool:
    """Do equal hashes in these two dumps prove equal content? Only for one algorithm on both
    sides and not a weak one (``wsum64-v1``: structured changes such as moved ones of a mask
    collide; docs/format.md)."""
    algorithm = t_manifest.get("hash_algorithm")
    return algorithm is not None and algorithm == r_manifest.get("hash_algorithm") and algorithm not in WEAK


def stds_exact(t_manifest: dict[str, Any], r_manifest: dict[str, Any]) -> bool:
    """Is each dump's std its tensors' own (``std`` = :data:`STD_METHOD` in both manifests), not
    one that may carry the rounding of float32 sums of squares (older dumps, peers' dumps)?"""
    return t_manifest.get("std") == r_manifest.get("std") == STD_METHOD


def plan(pairs: list[Pair], noise: NoiseModel, *, trust_hashes: bool = True,
         exact_std: bool = False) -> dict[Job, list[int]]:
    """Fill what needs no tensor read; return the tensor reads needed, each with its pairs.

    With ``trust_hashes`` false (see :func:`hashes_comparable`), equal hashes are not taken
    as bit-exact: the tensors are read, or the statistics used. ``exact_std``: both dumps' std
    is exact (:func:`stds_exact`), so statistics bound a pair's error by it more closely."""
    jobs: dict[Job, list[int]] = {}
    for index, pair in enumerate(pairs):
        t, r = pair.t, pair.r
        if t is None or r is None:
            continue
        job = _classify(pair, t, r, noise, trust_hashes, exact_std)
        if job is not None:
            jobs.setdefault(job, []).append(index)
    return jobs


def _classify(pair: Pair, t: dict[str, Any], r: dict[str, Any], noise: NoiseModel,
              trust_hashes: bool = True, exact_std: bool = False) -> Job | None:
    n_t, n_r = t.get("numel"), r.get("numel")
    if n_t is not None and n_r is not None and n_t != n_r:
        _skip_shapes(pair, t, r)
        return None
    if {_kind(t.get("dtype")), _kind(r.get("dtype"))} == {"bool", "float"}:
        # a boolean mask against an additive one (sdpa's against eager attention's, made by the
        # model's code for each): two encodings of one thing, whose values do not compare
        pair.mode = "skipped"
        pair.note = _join(pair.note, f"{ENCODINGS_DIFFER}: {t.get('dtype')} vs {r.get('dtype')}")
        return None
    if t.get("note") == r.get("note") == ABSENT_NOTE:  # neither graph that ran has it: nothing differs
        pair.mode, pair.metrics = "absent", M.finish(M.identical(0))
        return None
    if t.get("note") in NOT_DATA_NOTES and r.get("note") in NOT_DATA_NOTES:  # no data on either side yet
        pair.mode, pair.metrics = "absent", M.finish(M.identical(0))
        pair.note = _join(pair.note, "no data yet on either side (" + str(t["note"]).split(":")[0] + ")")
        return None
    for side, row in (("target", t), ("reference", r)):
        if not row.get("data") and row.get("norm") is None and row.get("hash") is None and row.get("numel") != 0:
            # a record with neither statistics nor a tensor (a peer dump's file that could not
            # be trusted): nothing to judge it by, which is not "no difference"
            pair.mode = "skipped"
            pair.note = _join(pair.note, f"the {side} holds no statistics and no tensor here"
                                         + (f" ({row['note']})" if row.get("note") else ""))
            return None
    same_dtype = t.get("dtype") == r.get("dtype")
    empty = n_t == 0 and n_r == 0  # nothing to differ (batch norm's zero-size saved buffers)
    if empty or (trust_hashes and same_dtype and t.get("hash") is not None and t.get("hash") == r.get("hash")):
        s = M.identical(int(n_r or 0))  # the same content (a parameter and its t() view too)
        norm = _float(r.get("norm"))
        s.sum_sq_reference = s.sum_sq_target = s.dot = norm**2 if math.isfinite(norm) else 0.0
        pair.mode, pair.metrics = "hash", M.finish(s)
        return None
    if t.get("data") and t.get("key") and r.get("data") and r.get("key"):
        lower = noise.lower_dtype(t.get("dtype"), r.get("dtype"))
        absmax = _float(r.get("absmax"))
        floor = max(noise.rel_floor * absmax, 1e-300) if math.isfinite(absmax) else 1e-30
        nbytes = int(n_r or 0) * (_itemsize(t.get("dtype")) + _itemsize(r.get("dtype")))
        return Job(int(t["rank"]), int(t["step"]), (t["data"], t["key"], t.get("view")),
                   (r["data"], r["key"], r.get("view")),
                   floor, noise.element_tolerance(lower), nbytes, same_dtype,
                   (float(t.get("scale") or 1.0), float(r.get("scale") or 1.0)))
    by_statistics(pair, t, r, trust_hashes, exact_std)
    return None


def by_statistics(pair: Pair, t: dict[str, Any], r: dict[str, Any], trust_hashes: bool, exact_std: bool) -> None:
    """Judge a pair from its two rows' statistics (no tensor on both sides, or one unreadable)."""
    pair.mode, pair.metrics = "statistics", M.finish(M.from_statistics(t, r, exact_std=exact_std))
    if trust_hashes and t.get("dtype") == r.get("dtype") and t.get("hash") is not None and \
            r.get("hash") is not None and t.get("hash") != r.get("hash") and \
            (t.get("scale") or 1.0) == (r.get("scale") or 1.0):
        # the contents differ, whatever the statistics show: a permutation of labels or
        # indices has the same ones. (Not where a loss scale divided one side's statistics:
        # its bytes are the scaled values, whose hash is another.)
        pair.metrics["hash_differs"] = True


ENCODINGS_DIFFER = "another encoding on each side"


def _kind(dtype: Any) -> str:
    return "bool" if str(dtype) in ("bool", "torch.bool") else "float" if is_float(dtype) else "other"


def _skip_shapes(pair: Pair, t: dict[str, Any], r: dict[str, Any]) -> None:
    pair.mode = "skipped"
    pair.note = _join(pair.note, f"shapes differ: {list(t.get('shape') or [])} vs {list(r.get('shape') or [])}")


def run(jobs: dict[Job, list[int]], pairs: list[Pair], target: str, reference: str, *,
        workers: int = 1, progress: Progress | None = None, pool: str = "auto",
        trust_hashes: bool = True, exact_std: bool = False) -> list[str]:
    """Read and measure every job, ``workers`` batches at a time when worth it (``pool``:
    threads of this process or a process pool, :mod:`opscope.compare.pool`); returns problems met.
    ``trust_hashes``, ``exact_std``: as for :func:`plan`, for a tensor that cannot be read."""
    todo = list(jobs)
    total = sum(j.nbytes for j in todo)
    batches = _batches(todo, min(MAX_BATCHES, max(workers * 4, total // BATCH_BYTES)))  # progress per batch
    done = [0]

    def finished(part: list[Outcome]) -> None:
        done[0] += sum(j.nbytes for j, _ in part)
        if progress:
            progress(done[0], total)

    results: list[Outcome] = []
    if workers > 1 and total >= POOL_MIN_BYTES and len(batches) > 1:
        from opscope.compare import pool as executors

        mode = executors.choose(pool)
        measure = measure_batch if mode == "processes" else functools.partial(measure_batch, pin_blas=False)
        with one_blas_thread() if mode == "threads" else contextlib.nullcontext():  # once for all threads
            for part in executors.run_batches(measure, (target, reference), batches, workers=workers, mode=mode,
                                              done=finished):
                results += part
        results.sort(key=lambda outcome: file_order(outcome[0]))  # as finished: applied (problems) in file order
    else:
        for b in batches:
            part = measure_batch(target, reference, b)
            results += part
            finished(part)
    return apply_results(results, jobs, pairs, trust_hashes=trust_hashes, exact_std=exact_std)


Outcome = tuple[Job, "dict[str, Any] | str"]


def apply_results(results: list[Outcome], jobs: dict[Job, list[int]], pairs: list[Pair], *,
                  trust_hashes: bool = True, exact_std: bool = False) -> list[str]:
    """Write measured metrics into their pairs (any executor's results: local, pool or cluster);
    a tensor that could not be read falls back to statistics, judged as :func:`plan` judges
    a pair without tensors (``trust_hashes``, ``exact_std``), and its problem is returned."""
    problems: list[str] = []
    for job, outcome in results:
        for index in jobs[job]:
            pair = pairs[index]
            if isinstance(outcome, str):
                by_statistics(pair, *pair.rows, trust_hashes, exact_std)
                pair.note = _join(pair.note, f"tensor unreadable, statistics used: {outcome}")
                if outcome not in problems:
                    problems.append(outcome)
            else:
                pair.mode, pair.metrics = "tensor", dict(outcome)
    return problems


def _batches(jobs: list[Job], count: int) -> list[list[Job]]:
    """Runs of jobs in file order (:func:`file_order`) of about equal bytes, ``count`` at most:
    each batch then reads its shards front to back."""
    ordered = sorted(jobs, key=file_order)
    if count <= 1 or len(ordered) <= 1:
        return [ordered] if ordered else []
    share = sum(j.nbytes + 4096 for j in ordered) / count
    batches: list[list[Job]] = [[]]
    load = 0.0
    for job in ordered:
        if load >= share and len(batches) < count:
            batches.append([])
            load = 0.0
        batches[-1].append(job)
        load += job.nbytes + 4096
    return batches


def measure_batch(target: str, reference: str, batch: list[Job], *,
                  pin_blas: bool = True) -> list[tuple[Job, dict[str, Any] | str]]:
    """Measure a batch of jobs in this thread (a pool's thread or process, a cluster's worker
    or the caller), streaming each pair block by block in file order (:mod:`opscope.compare.stream`);
    a pair that cannot be read gives its problem as a sentence instead of metrics. ``pin_blas``:
    numpy's BLAS runs one thread meanwhile (false where the caller pinned it for all threads)."""
    from opscope.compare.stream import PairStream
    from opscope.errors import DumpFormatError
    from opscope.storage.reader import load

    t_dump, r_dump = load(target), load(reference)  # load: a peer dump (msprobe, MindSpore) too
    stream = PairStream(t_dump, r_dump)
    out: list[tuple[Job, dict[str, Any] | str]] = []
    with one_blas_thread() if pin_blas else contextlib.nullcontext():
        try:
            for job in sorted(batch, key=file_order):
                try:
                    s = stream.measure(job)
                    if job.same_dtype and s.bit_exact is None:
                        s.bit_exact = s.sum_sq_diff == 0 and not s.nan_mismatch and not s.inf_mismatch
                    elif s.bit_exact is None:
                        s.bit_exact = False
                    out.append((job, M.finish(s)))
                except (DumpFormatError, OSError, ValueError) as exc:
                    out.append((job, f"rank {job.rank} step {job.step} {job.t_ref[0]}/{job.r_ref[0]}: {exc}"))
        finally:
            stream.close()
            for dump in (t_dump, r_dump):
                with contextlib.suppress(BufferError):
                    dump.close()
    return out


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's OpenBLAS runs one thread meanwhile (best effort): numpy's pass takes 16K-element
    dots, where its threads only oversubscribe the cores, and the sums it returns depend on
    its thread count, so every measurement runs with one."""
    blas = _OpenBlas.find()
    previous = blas.set_threads(1) if blas else None
    try:
        yield
    finally:
        if blas and previous:
            blas.set_threads(previous)


def file_order(job: Job) -> tuple[Any, ...]:
    """Jobs in the order their target tensors were written (keys are ``r<record id>``), so a
    batch reads each shard front to back."""
    data, key = job.t_ref[0], job.t_ref[1]
    return job.rank, job.step, data, len(key), key


class _OpenBlas:
    """numpy's OpenBLAS, found among the loaded libraries, to pin its thread count (best effort)."""

    _cache: Any = False

    def __init__(self, lib: Any, getter: Any, setter: Any) -> None:
        self.lib, self.getter, self.setter = lib, getter, setter

    @classmethod
    def find(cls) -> _OpenBlas | None:
        if cls._cache is not False:
            return cls._cache
        cls._cache = None
        try:
            import ctypes

            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line}
            for path in sorted(paths):
                lib = ctypes.CDLL(path)
                for prefix in ("scipy_openblas", "openblas"):
                    for suffix in ("64_", ""):
                        getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                        setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                        if getter is not None and setter is not None:
                            cls._cache = cls(lib, getter, setter)
                            return cls._cache
        except (OSError, AttributeError):
            pass
        return cls._cache

    def set_threads(self, n: int) -> int:
        """Set the thread count; returns the previous one."""
        previous = int(self.getter())
        self.setter(int(n))
        return previous


def default_workers() -> int:
    """Every core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _itemsize(dtype: str | None) -> int:
    name = str(dtype or "")
    if name.startswith("float8") or name in ("bool", "uint8", "int8"):
        return 1
    digits = "".join(ch for ch in name if ch.isdigit())
    return max(1, int(digits) // 8) if digits else 4


def _float(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
