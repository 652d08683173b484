"""Measuring a comparison's tensor pairs on a Dask cluster: ``compare(..., scheduler=...)``.

Alignment, the noise model and the verdict stay in the calling process. Only the tensor
reads move: the jobs of :func:`opscope.compare.measure.plan` are cut into batches of about
equal bytes (several per worker thread, so a slow or lost worker holds up little), and each
batch is one task, :func:`opscope.compare.measure.measure_batch`, the function the local pool
runs. A task opens both dumps by path on its worker, streams its tensor pairs from the shards
and returns a small dict of metrics per pair: tensors never travel through the scheduler, so
the workers must see the dumps at the same path as this process (a shared file system).

The gathered outcomes are written into the pairs by :func:`opscope.compare.measure.apply_results`
in the order a local run measures them (:func:`~opscope.compare.measure.file_order`), so the
verdict, the pairs table and the reports are those of a local run. A task whose worker dies
is run again by the scheduler (up to Dask's ``distributed.scheduler.allowed-failures``, 3 by
default); one that raises is retried :data:`RETRIES` times. A batch that still fails is not
dropped: each of its pairs falls back to statistics and its shards are named in the problems,
as for a shard the local run cannot read. A cluster left without workers for
:data:`WORKER_WAIT_S` while tasks wait is an error (Dask would keep them waiting for good).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Union

from opscope.compare import measure
from opscope.compare.align import Pair
from opscope.errors import OpscopeError

if TYPE_CHECKING:
    from distributed import Client, Future

RETRIES = 2  # re-runs of a task that raised (a worker's death is re-run by the scheduler itself)
BATCHES_PER_THREAD = 4  # several batches per worker thread: balance, and little lost with a worker
TASK_BYTES = 256 << 20  # a task reads about this much at most (more when that makes over MAX_TASKS)
MAX_TASKS = 1024
WORKER_WAIT_S = 30.0  # how long a scheduler without workers is given to get one
POLL_S = 2.0  # while tasks wait, how often the scheduler is asked for its workers
INSTALL = "pip install 'opscope[dask]'"

Scheduler = Union[str, "os.PathLike[str]", "Client"]


class ClusterError(OpscopeError):
    """The Dask cluster cannot run the comparison: ``distributed`` missing, no scheduler at the
    address, no workers, or workers that do not see the dumps."""


def run(jobs: dict[measure.Job, list[int]], pairs: list[Pair], target: str, reference: str, *,
        scheduler: Scheduler, progress: measure.Progress | None = None,
        trust_hashes: bool = True, exact_std: bool = False) -> list[str]:
    """Measure every job as tasks on the cluster at ``scheduler``; returns the problems met.

    Args:
        jobs, pairs: the plan of :func:`opscope.compare.measure.plan` and its pairs (filled here).
        target, reference: the dumps' paths, as the workers see them (made absolute here).
        scheduler: a ``dask.distributed.Client``, a scheduler address (``tcp://host:8786``)
            or the JSON file written by ``dask scheduler --scheduler-file FILE``.
        progress: called as ``progress(bytes_done, bytes_total)`` as tasks finish.
        trust_hashes, exact_std: as for :func:`opscope.compare.measure.plan`, for a tensor
            that cannot be read (judged from statistics).

    Raises:
        ClusterError: see the class.
    """
    todo = list(jobs)
    if not todo:
        return []
    paths = os.path.abspath(target), os.path.abspath(reference)
    with connect(scheduler) as client:
        threads = check_workers(client, paths)
        total = sum(job.nbytes for job in todo)
        batches = measure._batches(todo, min(MAX_TASKS, max(threads * BATCHES_PER_THREAD, total // TASK_BYTES)))
        results = _gather(client, *paths, batches, progress)
    results.sort(key=lambda outcome: measure.file_order(outcome[0]))  # a local run's order, not the tasks'
    return measure.apply_results(results, jobs, pairs, trust_hashes=trust_hashes, exact_std=exact_std)


def address(scheduler: Scheduler) -> str:
    """Where ``scheduler`` points, in words: its address, or the scheduler file's path."""
    if isinstance(scheduler, (str, os.PathLike)):
        return os.fspath(scheduler)
    rpc = getattr(scheduler, "scheduler", None)  # a Client: its scheduler's connection
    return str(getattr(rpc, "address", None) or "the client's scheduler")


@contextlib.contextmanager
def connect(scheduler: Scheduler) -> Iterator[Client]:
    """A client of ``scheduler``: the one given, or a new one closed on exit."""
    try:
        from distributed import Client
    except ImportError:
        raise ClusterError(f"comparing on a Dask cluster needs the distributed package: {INSTALL} "
                           "(or pip install distributed), here and on every worker") from None
    if isinstance(scheduler, Client):
        yield scheduler
        return
    client = _open(Client, os.fspath(scheduler))
    try:
        yield client
    finally:
        client.close()


def _open(client_class: type[Client], where: str) -> Client:
    start = "start one with `dask scheduler` (it prints its address) and `dask worker ADDRESS` on each node"
    if not where.strip():  # Dask would start a cluster of its own in this process
        raise ClusterError(f"--scheduler needs the scheduler's address (tcp://HOST:8786) or its scheduler file; "
                           f"{start}")
    if "://" not in where and (where.endswith(".json") or os.path.isfile(where)):
        if not os.path.isfile(where):  # Dask would wait for the file to appear
            raise ClusterError(f"scheduler file {where!r} does not exist: start the scheduler with "
                               f"`dask scheduler --scheduler-file {where}` and each worker with "
                               f"`dask worker --scheduler-file {where}` (a path every node sees)")
        kwargs: dict[str, Any] = {"scheduler_file": where}
    else:
        kwargs = {"address": where}
    try:
        return client_class(set_as_default=False, **kwargs)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterError(f"no Dask scheduler answered at {where!r} ({type(exc).__name__}: {exc}); {start}, "
                           "then give its address (tcp://HOST:8786) or its --scheduler-file") from None


def check_workers(client: Client, paths: Sequence[str]) -> int:
    """Wait for a worker, check that every worker sees ``paths``; returns the worker threads.

    Raises:
        ClusterError: no worker came, a worker cannot run opscope, or one cannot see a path.
    """
    where = address(client)
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except TimeoutError:
        raise ClusterError(f"the Dask scheduler at {where} has no workers after {WORKER_WAIT_S:.0f} s: "
                           f"start `dask worker {where}` on each node") from None
    try:
        unseen: dict[str, list[str]] = client.run(missing_paths, list(paths))
    except Exception as exc:  # a worker without opscope cannot even unpickle the check
        raise ClusterError(f"the Dask workers at {where} could not run opscope ({type(exc).__name__}: {exc}): "
                           f"install the same opscope on every worker ({INSTALL})") from None
    blind = {worker: missing for worker, missing in unseen.items() if missing}
    if blind:
        named = "; ".join(f"{worker} does not see {', '.join(map(repr, missing))}"
                          for worker, missing in sorted(blind.items()))
        raise ClusterError(f"Dask workers cannot read the dumps: {named}. The workers read the shards "
                           "themselves, so they need a shared file system that every worker mounts at the "
                           "same path as this machine (or copy the dumps to that path on every node)")
    return max(1, sum(client.nthreads().values()))


def missing_paths(paths: list[str]) -> list[str]:
    """Of ``paths``, those that are not a readable folder here (run on each worker)."""
    return [p for p in paths if not (os.path.isdir(p) and os.access(p, os.R_OK | os.X_OK))]


def _gather(client: Client, target: str, reference: str, batches: list[list[measure.Job]],
            progress: measure.Progress | None) -> list[measure.Outcome]:
    """Run one task per batch and collect the outcomes as tasks finish."""
    from distributed import as_completed

    total = sum(job.nbytes for batch in batches for job in batch)
    done = 0
    token = uuid.uuid4().hex[:12]
    futures: dict[Future, list[measure.Job]] = {
        client.submit(measure.measure_batch, target, reference, batch, key=f"opscope-measure-{token}-{i}",
                      retries=RETRIES, pure=False): batch
        for i, batch in enumerate(batches)}
    results: list[measure.Outcome] = []
    finished = as_completed(futures, loop=client.loop)
    left, asked = len(futures), time.monotonic()
    try:
        while left:
            ready = finished.next_batch(block=False)
            if not ready:
                with finished.thread_condition:  # notified as tasks finish
                    finished.thread_condition.wait(timeout=0.1)
                if time.monotonic() - asked >= POLL_S:
                    _await_workers(client, left, len(futures))
                    asked = time.monotonic()
            for future in ready:
                batch = futures[future]
                results += _outcomes(future, batch, client)
                left -= 1
                done += sum(job.nbytes for job in batch)
                if progress:
                    progress(done, total)
    finally:
        client.cancel(list(futures))  # releases them on the cluster (and stops them on an error here)
    return results


def _await_workers(client: Client, left: int, tasks: int) -> None:
    """While tasks wait: when the cluster has no worker, give it :data:`WORKER_WAIT_S` to get
    one, as at the start (:func:`check_workers`). Dask keeps tasks waiting for a worker for
    good (one started without a nanny, or a batch job's, is not brought back when it dies or
    leaves), and the compare would wait with them.

    Raises:
        ClusterError: no worker came in that time.
    """
    try:
        if client.nthreads():
            return
    except (OSError, TimeoutError):  # the scheduler is gone: its tasks are cancelled (_outcomes says so)
        return
    try:
        client.wait_for_workers(1, timeout=WORKER_WAIT_S)
    except TimeoutError:
        where = address(client)
        raise ClusterError(f"the Dask cluster at {where} has had no workers for {WORKER_WAIT_S:.0f} s with "
                           f"{left} of {tasks} measuring tasks still to run: its workers died or left and "
                           f"none came back (a worker started without a nanny is not restarted); start "
                           f"`dask worker {where}` on each node and run the compare again") from None


def _outcomes(future: Future, batch: list[measure.Job], client: Client) -> list[measure.Outcome]:
    """A finished task's outcomes; a failed task's jobs, each with why it was not measured."""
    from distributed.client import FutureCancelledError

    try:
        outcomes: list[measure.Outcome] = future.result()
        return outcomes
    except FutureCancelledError:
        raise ClusterError(f"the Dask scheduler at {address(client)} dropped the comparison's tasks "
                           "(it restarted or the connection was lost); run the compare again") from None
    except Exception as exc:
        why = f"not measured on the Dask cluster ({type(exc).__name__}: {exc})"
        return [(job, f"rank {job.rank} step {job.step} {job.t_ref[0]}/{job.r_ref[0]}: {why}") for job in batch]
