"""The content hash ``wsum64-v1`` in numpy: the reference definition (docs/format.md).

The C kernel (capture/torch/_c/fastats.c) and the torch reductions (capture/torch/stats.py)
compute the same value; a test holds the three to it.

Let w_i be the tensor's elements in row-major order as unsigned integers of their own width
(16-bit dtypes: 16 bits; 8-bit: 8 bits; 64-bit dtypes: two little-endian 32-bit words each):
``h1 = Σ w_i·(2i+1) mod 2^32``, ``h2 = Σ (w_i XOR (i·0x9E3779B9 mod 2^32))·0x85EBCA6B mod 2^32``,
``hash = h1·2^32 + h2``.
"""

from __future__ import annotations

import numpy as np

GOLD, MIX, M32 = 0x9E3779B9, 0x85EBCA6B, 0xFFFFFFFF
CHUNK = 1 << 16


def words(arr: np.ndarray) -> np.ndarray:
    """The elements as the unsigned words the hash runs over (row-major, little-endian)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype.byteorder == ">":
        flat = flat.astype(flat.dtype.newbyteorder("<"))
    size = flat.dtype.itemsize
    if size >= 4:
        return flat.view("<u4")
    return flat.view("<u2") if size == 2 else flat.view(np.uint8)


def content_hash(arr: np.ndarray) -> int:
    """``wsum64-v1`` of ``arr``, in bounded memory (chunks of 64K words)."""
    w = words(arr)
    h1 = h2 = 0
    for start in range(0, w.size, CHUNK):
        part = w[start:start + CHUNK].astype(np.uint64)
        idx = np.arange(start, start + part.size, dtype=np.uint64)
        h1 += int(np.sum(part * (np.uint64(2) * idx + np.uint64(1)), dtype=np.uint64)) & M32
        mixed = (part ^ ((idx * np.uint64(GOLD)) & np.uint64(M32))) * np.uint64(MIX)
        h2 += int(np.sum(mixed, dtype=np.uint64)) & M32
    return ((h1 & M32) << 32) | (h2 & M32)
