"""Minimal safetensors writer and reader (no torch, no pickle).

Files follow the safetensors layout (8-byte little-endian header length, JSON header,
raw little-endian data), so ``safetensors.numpy.load_file`` and
``safetensors.torch.load_file`` read them too. Our own reader memory-maps the file and
also decodes bfloat16 and float8, which numpy lacks, into float32.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from opscope.errors import DumpFormatError

# opscope dtype name -> (safetensors dtype, numpy storage dtype)
DTYPES: dict[str, tuple[str, str]] = {
    "float64": ("F64", "<f8"),
    "float32": ("F32", "<f4"),
    "float16": ("F16", "<f2"),
    "bfloat16": ("BF16", "<u2"),
    "float8_e4m3fn": ("F8_E4M3", "u1"),
    "float8_e5m2": ("F8_E5M2", "u1"),
    "int64": ("I64", "<i8"),
    "int32": ("I32", "<i4"),
    "int16": ("I16", "<i2"),
    "int8": ("I8", "i1"),
    "uint8": ("U8", "u1"),
    "uint16": ("U16", "<u2"),
    "uint32": ("U32", "<u4"),
    "uint64": ("U64", "<u8"),
    "bool": ("BOOL", "?"),
}
_BY_ST = {st: name for name, (st, _) in DTYPES.items()}
_BLOCK = 4096  # O_DIRECT's alignment of memory, lengths and file offsets (any device's block size)


def write_shard(path: str | os.PathLike, tensors: Iterable[tuple[str, str, list[int], Any]]) -> int:
    """Write ``(key, dtype, shape, buffer)`` entries as one safetensors file, atomically.

    ``buffer`` is any object exposing the buffer protocol with the raw little-endian
    bytes. Returns the number of bytes written. The file appears under its final name
    only when complete.
    """
    header: dict[str, Any] = {}
    buffers: list[memoryview] = []
    offset = 0
    for key, dtype, shape, buf in tensors:
        view = memoryview(buf).cast("B")
        header[key] = {"dtype": DTYPES[dtype][0], "shape": list(shape), "data_offsets": [offset, offset + view.nbytes]}
        buffers.append(view)
        offset += view.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data aligned to 8 bytes, as the reference writer does
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for view in buffers:
            f.write(view)
    os.replace(tmp, path)
    return 8 + len(raw) + offset


def write_chunks(path: str | os.PathLike, chunks: Sequence[Any], size: int) -> None:
    """Write a file built elsewhere (a native dump's tensor shard, header included): the
    buffers ``chunks`` one after the other, cut to ``size`` bytes, atomically.

    When every chunk is 4096-aligned in memory and a multiple of 4096 bytes long (as the
    native dump makes them), the file is written with ``O_DIRECT`` where the file system
    allows: the data goes to the disk without a copy into the page cache, a copy that costs
    a CPU core as long as the write lasts. Otherwise, and where ``O_DIRECT`` is refused,
    ordinary writes.
    """
    tmp = f"{os.fspath(path)}.tmp"
    views = [memoryview(c).cast("B") for c in chunks]
    direct = getattr(os, "O_DIRECT", 0) if all(_aligned(v) for v in views) else 0
    try:
        _write_file(tmp, views, size, direct)
    except OSError as exc:
        if not direct or exc.errno != errno.EINVAL:
            raise
        _write_file(tmp, views, size, 0)  # this file system takes no O_DIRECT
    os.replace(tmp, path)


def _aligned(view: memoryview) -> bool:
    if view.nbytes % _BLOCK:
        return False
    return not view.nbytes or np.frombuffer(view, dtype=np.uint8).ctypes.data % _BLOCK == 0


def _write_file(path: str, views: list[memoryview], size: int, flags: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | flags, 0o666)
    try:
        for view in views:
            done = 0
            while done < view.nbytes:  # a write may write less than asked
                done += os.write(fd, view[done:])
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


class TensorExtent(NamedTuple):
    """A tensor's bytes in a shard: ``nbytes`` from byte ``start`` of the file at ``path``,
    little-endian ``dtype`` (an opscope dtype name; bfloat16 and float8 as their bits)."""

    path: str
    start: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


class ShardReader:
    """Random access to the tensors of one safetensors file, memory-mapped."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")  # noqa: SIM115 (kept open for the mmap)
            size = os.fstat(self._file.fileno()).st_size
            (n,) = struct.unpack("<Q", self._file.read(8))
            if n > size - 8:
                raise ValueError(f"header length {n} exceeds file size {size}")
            self.header: dict[str, Any] = json.loads(self._file.read(n))
            self.header.pop("__metadata__", None)
            self._base = 8 + n
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            self._size = size
        except (OSError, ValueError, struct.error) as exc:
            raise DumpFormatError(f"tensor shard {str(self.path)!r} is unreadable ({exc}); "
                                  "it may be truncated") from None

    def keys(self) -> list[str]:
        return list(self.header)

    def extent(self, key: str) -> TensorExtent:
        """Where the tensor ``key`` lies in the file, checked against the file's size."""
        try:
            meta = self.header[key]
        except KeyError:
            raise DumpFormatError(f"tensor {key!r} is not in shard {str(self.path)!r}") from None
        start, end = meta["data_offsets"]
        if self._base + end > self._size:
            raise DumpFormatError(f"tensor {key!r} in {str(self.path)!r} is cut off: the shard is truncated")
        if self._map is None:  # an empty file has no header: opening it failed already
            raise DumpFormatError(f"tensor shard {str(self.path)!r} is empty")
        return TensorExtent(str(self.path), self._base + start, end - start, _BY_ST[meta["dtype"]],
                            tuple(meta["shape"]))

    def raw(self, key: str) -> tuple[str, np.ndarray]:
        """The stored array (bfloat16 kept as uint16 bits) and its opscope dtype name."""
        where = self.extent(key)
        numpy_dtype = DTYPES[where.dtype][1]
        assert self._map is not None  # extent() refused an empty file
        arr = np.frombuffer(self._map, dtype=numpy_dtype, count=where.nbytes // np.dtype(numpy_dtype).itemsize,
                            offset=where.start)
        return where.dtype, arr.reshape(where.shape)

    def array(self, key: str) -> np.ndarray:
        """The tensor as numpy; bfloat16 and float8 are widened to float32 exactly."""
        dtype, arr = self.raw(key)
        return widen(arr, dtype)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._file.close()


def widen(arr: np.ndarray, dtype: str) -> np.ndarray:
    """Decode dtypes numpy lacks (bfloat16, float8) into float32; others returned as they are."""
    if dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if dtype.startswith("float8"):
        return _FP8_TABLES[dtype][arr]
    return arr


def _fp8_table(exp_bits: int, man_bits: int, bias: int, finite_only: bool) -> np.ndarray:
    out = np.zeros(256, dtype=np.float32)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> man_bits) & ((1 << exp_bits) - 1)
        m = code & ((1 << man_bits) - 1)
        if finite_only and e == (1 << exp_bits) - 1 and m == (1 << man_bits) - 1:
            out[code] = np.nan
        elif not finite_only and e == (1 << exp_bits) - 1:
            out[code] = sign * np.inf if m == 0 else np.nan
        elif e == 0:
            out[code] = sign * m / (1 << man_bits) * 2.0 ** (1 - bias)
        else:
            out[code] = sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)
    return out


_FP8_TABLES = {
    "float8_e4m3fn": _fp8_table(4, 3, 7, True),
    "float8_e5m2": _fp8_table(5, 2, 15, False),
}
