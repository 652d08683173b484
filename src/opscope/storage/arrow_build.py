"""Arrow arrays from numpy buffers and lists of names, without ``pyarrow.array``.

``pyarrow.array`` asks pyarrow's pandas shim whether its argument is a pandas object, and the
first such question imports pandas (~0.3 s here). The dump writer's thread used to ask it in
its first round, in the middle of the user's run: the import held the GIL in 5 ms slices
against the training thread (two steps of a 27 ms transformer step lost 112 ms, 625 thread
switches). These builders make the same arrays from the buffers themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


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
