"""Arrow arrays from numpy buffers and lists of names, without ``pyarrow.array``.

``pyarrow.array`` asks pyarrow's pandas shim whether its argument is a pandas object, and the
first such question imports pandas (~0.3 s here). The dump writer's thread used to ask it in
its first round, in the middle of the user's run: the import held the GIL in 5 ms slices
against the training thread (two steps of a 27 ms transformer step lost 112 ms, 625 thread
switches). These builders make the same arrays from the buffers themselves.

:data:`POOL` is the memory pool of the writer's Arrow work. pyarrow's default (mimalloc here)
asks for huge pages on its 1 GiB arenas and gives idle ones back (``MADV_DONTNEED`` on 4 MB
at a time), so each round of the writer faulted its buffers in again, 2 MB pages zeroed by the
kernel: 1.7 ms of system time a 24 ms transformer step in the Parquet writes alone. The
C library's allocator keeps what a round freed for the next. (Some of the Parquet writer's
own buffers stay in the default pool whatever it is given: ~3 MB at the peak there.) The
writer thread's CPU a transformer step: 4.5-5.3 -> 2.2-3.7 ms (3 alternating runs each).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

POOL = pa.system_memory_pool()


def numbers(values: np.ndarray, mask: np.ndarray | None = None) -> pa.Array:
    """A 1-d numeric numpy array as an Arrow array of its dtype (no copy when contiguous),
    null where ``mask`` (booleans) is true."""
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise TypeError(f"numbers(): a 1-d integer or float array is expected, not {values.dtype} {values.shape}")
    validity, nulls = None, 0
    if mask is not None:
        nulls = int(np.count_nonzero(mask))
        if nulls:
            validity = pa.py_buffer(np.packbits(~np.asarray(mask, dtype=bool), bitorder="little"))
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [validity, pa.py_buffer(values)],
                                 null_count=nulls)


def texts(names: Sequence[str]) -> pa.Array:
    """A list of ``str`` as an Arrow string array (no nulls)."""
    encoded = [s.encode() for s in names]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(b"".join(encoded))])


def convert_ready() -> None:
    """Make ``pyarrow.array``'s first call (its pandas import) now, on the calling thread: the
    Python capture's writer converts lists of values with it, in the middle of the run otherwise."""
    pa.array([0])
