"""Reading a tensor pair piece by piece, so memory stays the same whatever the dump's size.

A tensor of an opscope dump is one run of bytes in a shard. :class:`PairStream` reads both
sides of a pair with ``pread`` into two buffers of :data:`BLOCK_BYTES` reused for every
pair (no memory map: pages of a map stay in the process's resident set until it is
closed), and hands each block pair to :class:`opscope.compare.accumulate.Accumulator`. The
kernel's read-ahead (``POSIX_FADV_SEQUENTIAL``) fetches the next blocks from disk while this
one is measured.

A view stored as its input's data (``view`` geometry) streams too when both sides have the
same geometry and it covers a run of its data without gaps or repeats (a transpose, a
reshape, a narrow along the first dimension): every metric is a sum or a maximum over
element pairs, so the order in which the pairs come does not matter, only that both sides
pair the same elements. Anything else (another view, a peer dump whose reader decodes the
tensor) is read whole, two tensors at a time, and counted in :data:`READS`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from opscope.compare import kernel
from opscope.compare import metrics as M
from opscope.compare.accumulate import Accumulator, accumulate
from opscope.errors import DumpFormatError
from opscope.storage.safetensors_io import DTYPES, TensorExtent, widen

Side = tuple[int, int, str, str, "str | None"]  # rank, step, data, key, view of one tensor
BLOCK_BYTES = 1 << 18  # per side: two such buffers per process, whatever the tensors' size; read
# and measured while in the core's cache (pread copies ~5 GB/s per core at 256 KB, ~4 at 1 MB)
MAX_OPEN = 32  # shard files kept open at once by one stream



@dataclass(frozen=True)
class Job:
    """One tensor pair to read and measure."""

    rank: int
    step: int
    t_ref: tuple[str, str, str | None]  # data, key, view geometry (a view stored as its input's data)
    r_ref: tuple[str, str, str | None]
    rel_floor: float
    rtol: float
    nbytes: int
    same_dtype: bool
    scales: tuple[float, float] = (1.0, 1.0)  # each side's values divided by (a loss scale)


@dataclass
class ReadCounter:
    """What the reads of this process held in memory at once (the memory bound, checked by tests)."""

    blocks: int = 0  # block pairs measured
    largest_block: int = 0  # bytes of the largest piece of one side read at once
    whole: int = 0  # tensors read whole (not streamable)
    largest_whole: int = 0  # bytes of the largest of those


READS = ReadCounter()


class PairStream:
    """Measures tensor pairs of two dumps block by block; one per batch of jobs."""

    def __init__(self, target: Any, reference: Any, block_bytes: int = BLOCK_BYTES) -> None:
        self.dumps = (target, reference)
        self.block_bytes = block_bytes
        self._buffers = (np.empty(block_bytes, np.uint8), np.empty(block_bytes, np.uint8))
        self._files: dict[str, int] = {}

    def measure(self, job: Job) -> M.PairSums:
        """The sums of one job's pair (target against reference, same rank and step).

        Raises:
            DumpFormatError: a shard is unreadable or cut short, or the sides' sizes differ.
            OSError: a read failed.
        """
        return self.pair((job.rank, job.step, *job.t_ref), (job.rank, job.step, *job.r_ref),
                         rel_floor=job.rel_floor, rtol=job.rtol, scales=job.scales)

    def pair(self, target: Side, reference: Side, *, rel_floor: float, rtol: float,
             scales: tuple[float, float] = (1.0, 1.0)) -> M.PairSums:
        """The sums of any two tensors, each given as ``(rank, step, data, key, view)`` of its
        dump (check-ranks pairs one rank's tensor with another rank's), each side divided by
        its ``scales`` entry (a power of two: exact). Raises as :meth:`measure`."""
        extents = [dump.tensor_extent(*side[:4]) for dump, side in zip(self.dumps, (target, reference))]
        spans = _spans(extents[0], extents[1], target[4], reference[4])
        if spans is None:
            return self._whole(target, reference, rel_floor, rtol, scales)
        return self._stream(extents[0], extents[1], spans, rel_floor, rtol, scales)

    def _stream(self, t: TensorExtent | None, r: TensorExtent | None, spans: tuple[int, int, int],
                rel_floor: float, rtol: float, scales: tuple[float, float]) -> M.PairSums:
        assert t is not None and r is not None  # _spans said so
        t_first, r_first, count = spans
        t_type, r_type = np.dtype(DTYPES[t.dtype][1]), np.dtype(DTYPES[r.dtype][1])
        step = max(1, self.block_bytes // max(t_type.itemsize, r_type.itemsize))
        acc = Accumulator(rel_floor=rel_floor, rtol=rtol)
        in_c = not acc.chunked and kernel.can_stream(t.dtype, r.dtype) and scales == (1.0, 1.0)
        start = 0
        while start < count:
            t_at, r_at = t.start + (t_first + start) * t_type.itemsize, r.start + (r_first + start) * r_type.itemsize
            if in_c:  # every block the kernel can take, read and summed in C without the GIL
                done = self._in_c(acc, t, r, (t_at, r_at), count - start, step)
                start += done
                if start >= count:
                    break
                t_at, r_at = t_at + done * t_type.itemsize, r_at + done * r_type.itemsize
            n = min(step, count - start)  # here, a block the kernel left: not finite, or cut short
            a = self._read(0, t.path, t_at, n * t_type.itemsize)
            b = self._read(1, r.path, r_at, n * r_type.itemsize)
            if scales == (1.0, 1.0):
                acc.add(a.view(t_type), b.view(r_type), t.dtype, r.dtype)
            else:  # widened to float64 and divided: exact for a power of two
                acc.add(_divided(a.view(t_type), t.dtype, scales[0]), _divided(b.view(r_type), r.dtype, scales[1]))
            READS.blocks += 1
            start += n
        return acc.result()

    def _in_c(self, acc: Accumulator, t: TensorExtent, r: TensorExtent, offsets: tuple[int, int], n: int,
              step: int) -> int:
        """``n`` elements from byte ``offsets`` of each side's file, read and summed block by
        block by :func:`opscope.compare.kernel.stream`; returns the elements done (fewer
        where a block is not finite or a file ends first: the caller reads that block)."""
        if len(self._files) >= MAX_OPEN - 1:  # both files open at once
            self.close()
        fds = self._open(t.path), self._open(r.path)
        blocks, done = kernel.stream(fds[0], offsets[0], t.dtype, fds[1], offsets[1], r.dtype, n, step,
                                     *self._buffers, acc.rel_floor, acc.rtol)
        acc.add_sums(blocks, done)
        READS.blocks += len(blocks)
        widest = max(kernel.CODES[t.dtype][1], kernel.CODES[r.dtype][1])
        READS.largest_block = max(READS.largest_block, min(n, step) * widest)
        return done

    def _read(self, side: int, path: str, offset: int, nbytes: int) -> np.ndarray:
        out = self._buffers[side][:nbytes]
        fd = self._open(path)
        done = 0
        while done < nbytes:  # a read may return less than asked
            got = _read_into(fd, out, done, offset + done)
            if got <= 0:
                raise DumpFormatError(f"tensor shard {path!r} ends before its tensor does: it is truncated")
            done += got
        READS.largest_block = max(READS.largest_block, nbytes)
        return out

    def _open(self, path: str) -> int:
        fd = self._files.get(path)
        if fd is None:
            if len(self._files) >= MAX_OPEN:
                self.close()
            flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
            fd = self._files[path] = os.open(path, flags)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger read-ahead
        return fd

    def _whole(self, target: Side, reference: Side, rel_floor: float, rtol: float,
               scales: tuple[float, float]) -> M.PairSums:
        a = self.dumps[0].tensor(*target[:4], view=target[4])
        b = self.dumps[1].tensor(*reference[:4], view=reference[4])
        if scales != (1.0, 1.0):  # decoded already: bfloat16 as float32
            a, b = _divided(a, a.dtype.name, scales[0]), _divided(b, b.dtype.name, scales[1])
        READS.whole += 2
        READS.largest_whole = max(READS.largest_whole, a.nbytes, b.nbytes)
        if a.size != b.size:
            raise DumpFormatError(f"tensor sizes differ on disk ({a.size} vs {b.size})")
        return accumulate(a, b, rel_floor=rel_floor, rtol=rtol)

    def close(self) -> None:
        """Close the shard files (the buffers stay for the next pairs)."""
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


def _divided(block: np.ndarray, dtype: str, scale: float) -> np.ndarray:
    """A block read as stored (bfloat16 as its bits), as float64 divided by ``scale``."""
    wide = widen(block, dtype)
    return np.asarray(wide, np.float64) / scale if scale != 1.0 else wide


def _read_into(fd: int, out: np.ndarray, start: int, offset: int) -> int:
    """Read from byte ``offset`` of the file into ``out[start:]``; returns the bytes read."""
    if hasattr(os, "preadv"):  # Linux, BSD, macOS 11+: straight into the buffer
        return os.preadv(fd, [out.data[start:]], offset)
    os.lseek(fd, offset, os.SEEK_SET)  # elsewhere (Windows): one copy more
    chunk = os.read(fd, out.size - start)
    out[start:start + len(chunk)] = np.frombuffer(chunk, np.uint8)
    return len(chunk)


def _spans(t: TensorExtent | None, r: TensorExtent | None, t_view: str | None,
           r_view: str | None) -> tuple[int, int, int] | None:
    """``(first element on the target's side, first on the reference's, element count)`` of
    a pair that streams, or None. Raises DumpFormatError when the sizes differ."""
    if t is None or r is None or t.dtype not in DTYPES or r.dtype not in DTYPES:
        return None
    sizes = [e.nbytes // np.dtype(DTYPES[e.dtype][1]).itemsize for e in (t, r)]
    if not t_view and not r_view:
        if sizes[0] != sizes[1]:
            raise DumpFormatError(f"tensor sizes differ on disk ({sizes[0]} vs {sizes[1]})")
        return 0, 0, sizes[0]
    if not (t_view and r_view):
        return None  # one side a view, the other its own data: their element orders may differ
    geometries = [_geometry(v) for v in (t_view, r_view)]
    if geometries[0] is None or geometries[1] is None or geometries[0][:2] != geometries[1][:2]:
        return None
    count = int(np.prod(geometries[0][0], dtype=np.int64))
    offsets = geometries[0][2], geometries[1][2]
    if not _covers_a_run(*geometries[0][:2]) or any(o + count > n for o, n in zip(offsets, sizes)):
        return None  # read whole: place_view then checks the geometry and says what is wrong
    return offsets[0], offsets[1], count


def _geometry(view: str) -> tuple[list[int], list[int], int] | None:
    try:
        g = json.loads(view)
        shape, stride, offset = [int(n) for n in g["shape"]], [int(n) for n in g["stride"]], int(g["offset"])
    except (ValueError, TypeError, KeyError):
        return None
    return (shape, stride, offset) if len(shape) == len(stride) and offset >= 0 else None


def _covers_a_run(shape: list[int], stride: list[int]) -> bool:
    """Do these strides place every element once, without gaps, in a run of the data?"""
    if any(n == 0 for n in shape):
        return True
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(shape, stride) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True
