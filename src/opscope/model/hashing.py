"""The content hash ``wsum64-v2`` in numpy: the reference definition (docs/format.md).

The C kernel (capture/torch/native/_c/fastats_kernel.h) and the torch reductions
(capture/torch/stats.py) compute the same value; tests hold the three to it.

The tensor's bytes (elements in row-major order, each little-endian) are read as
little-endian 32-bit words ``w_i``, the last one zero-padded; with ``i`` taken mod 2^32 and
all arithmetic mod 2^32::

    s_i = i·0x9E3779B9
    x_i = lowbias32(w_i XOR s_i)
    lowbias32(x): x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16
    h1 = Σ (x_i XOR s_i),  h2 = Σ x_i,  hash = h1·2^32 + h2

A sum of per-word terms, so any split of the words into blocks adds up to the same hash.
``x_i`` is a bijection of ``w_i``: any single changed word changes both halves.
``wsum64-v1`` (dumps written before it) summed terms linear in ``w_i`` over elements of
their own width; equal v1 hashes do not prove equal content (see :data:`WEAK`).
"""

from __future__ import annotations

import numpy as np

ALGORITHM = "wsum64-v2"
WEAK = frozenset({"wsum64-v1"})  # linear: a one-hot mask whose ones swap places can collide
GOLD, MIX1, MIX2, M32 = 0x9E3779B9, 0x7FEB352D, 0x846CA68B, 0xFFFFFFFF
CHUNK = 1 << 16


def words(arr: np.ndarray) -> np.ndarray:
    """The 32-bit words the hash runs over: the array's little-endian bytes, zero-padded."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype.byteorder == ">":
        flat = flat.astype(flat.dtype.newbyteorder("<"))
    raw = flat.view(np.uint8)
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, dtype=np.uint8)])
    return raw.view("<u4")


def lowbias32(x: np.ndarray) -> np.ndarray:
    """The xorshift-multiply mix of uint32 words (a new array; arithmetic wraps mod 2^32)."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(MIX1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(MIX2)
    x ^= x >> np.uint32(16)
    return x


def content_hash(arr: np.ndarray) -> int:
    """``wsum64-v2`` of ``arr``, in bounded memory (chunks of 64K words)."""
    w = words(arr)
    h1 = h2 = 0
    for start in range(0, w.size, CHUNK):
        part = w[start:start + CHUNK].astype(np.uint32)
        idx = (np.arange(start, start + part.size, dtype=np.uint64) & np.uint64(M32)).astype(np.uint32)
        salt = idx * np.uint32(GOLD)
        x = lowbias32(part ^ salt)
        h1 += int(np.sum(x ^ salt, dtype=np.uint64))
        h2 += int(np.sum(x, dtype=np.uint64))
    return ((h1 & M32) << 32) | (h2 & M32)


def wsum64_v1(arr: np.ndarray) -> int:
    """The old ``wsum64-v1`` of ``arr`` (dumps written before v2): over elements of their own
    width (16- and 8-bit dtypes at their width, others as 32-bit words),
    ``h1 = Σ w_i·(2i+1)``, ``h2 = Σ (w_i XOR i·0x9E3779B9)·0x85EBCA6B``, both mod 2^32."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    w = flat.view({1: np.uint8, 2: np.uint16}.get(flat.itemsize, np.uint32)).astype(np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    h1 = int(np.sum(w * (2 * i + 1), dtype=np.uint64)) & M32
    h2 = int(np.sum(((w ^ ((i * np.uint64(GOLD)) & np.uint64(M32))) * np.uint64(0x85EBCA6B))
                    & np.uint64(M32), dtype=np.uint64)) & M32
    return (h1 << 32) | h2
