"""Where the batches of a local measurement run: threads of this process, or a process pool.

The C kernel (:mod:`opscope.compare.kernel`) and ``preadv`` release the GIL, so while one
thread measures a block, the others read and measure theirs: threads in this process share
the imports already made, start in microseconds and need no fork or pickling, which on a
small compare is most of what a process pool costs (forking a process that holds numpy and
pyarrow, each worker's first imports, the pool's shutdown). Threads are used when every
block can take the kernel (it is built, and no metric registered ``per_chunk=True`` needs
Python for every chunk); otherwise numpy's chunked pass holds the GIL much of the time, and
a process pool (forked on Linux, spawned elsewhere) measures in parallel instead.

What a batch returns does not depend on where it ran: each batch is measured by the same
function, on its own :class:`~opscope.compare.stream.PairStream`, and the outcomes are put
back in file order by the caller.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Executor

Item = TypeVar("Item")
Result = TypeVar("Result")
MODES = ("auto", "threads", "processes")

_lock = threading.Lock()
_meanwhile: list[Callable[[], object]] = []


def while_measuring(task: Callable[[], object]) -> None:
    """Have ``task()`` run once, in the thread that started the measurement, while the next
    parallel measurement runs (that thread only waits then). The CLI imports there what
    judging, printing and writing the result will need. An exception it raises cancels the
    measurement and propagates, as the measurement's own would. A task already waiting is
    not added again (a compare too small for a pool leaves it waiting for the next one)."""
    with _lock:
        if task not in _meanwhile:
            _meanwhile.append(task)


def threads_can_measure() -> bool:
    """Does every block of a local measurement release the GIL? (the C kernel is built and
    no registered metric is computed per chunk in Python)."""
    from opscope.compare import kernel
    from opscope.compare.metrics import METRICS

    return kernel.native is not None and not any(m.per_chunk for m in METRICS.values())


def choose(mode: str = "auto") -> str:
    """``"threads"`` or ``"processes"`` for ``mode`` (:data:`MODES`; ``"auto"``: threads when
    :func:`threads_can_measure`).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"measurement pool {mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        return "threads" if threads_can_measure() else "processes"
    return mode


def run_batches(measure: Callable[..., Result], args: Sequence[Any], batches: Sequence[Item], *, workers: int,
                mode: str = "auto", done: Callable[[Result], None] | None = None) -> list[Result]:
    """``measure(*args, batch)`` for every batch, ``workers`` at a time; returns the results
    in the order they finished, after calling ``done(result)`` for each (in this thread).
    Tasks given to :func:`while_measuring` run in this thread once the batches are submitted.

    The pool is shut down before returning (no thread or process outlives the call, so a
    later fork copies no idle pool). On an exception (or Ctrl-C) the batches not yet
    started are cancelled before it propagates.
    """
    from concurrent.futures import as_completed

    executor = _thread_pool(workers) if choose(mode) == "threads" else _process_pool(workers)
    futures = [executor.submit(measure, *args, batch) for batch in batches]
    results: list[Result] = []
    try:
        while _meanwhile:
            with _lock:
                task = _meanwhile.pop(0) if _meanwhile else None
            if task is not None:
                task()
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            if done is not None:
                done(result)
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return results


def _thread_pool(workers: int) -> Executor:
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opscope-measure")


def _process_pool(workers: int) -> Executor:
    """Forked workers on Linux: they start at once and only read shards with ``pread`` and
    measure with numpy (no pyarrow, no threads of their own), which is what makes fork safe
    here; spawn elsewhere."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context(method))
