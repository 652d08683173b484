"""Throughput of the one-pass statistics kernel (``_fastats.stats``: statistics + hash), in GB/s.

Prints, per dtype, the best of ``--repeat`` timed calls on one tensor of ``--mb`` megabytes
(large: memory-bound, as in a real dump) and of 1 MB (in cache: the kernel's own speed),
for the AVX2 path and, with ``OPSCOPE_NO_SIMD=1`` in the environment, the portable loops.

    python benchmarks/bench_stats_kernel.py [--mb 256] [--repeat 15]
"""

from __future__ import annotations

import argparse
import time

import torch

from opscope.capture.torch.stats import CODES, _fastats

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.bool)


def gbps(t: torch.Tensor, repeat: int) -> float:
    """Best throughput of ``repeat`` calls on ``t``, in GB/s of tensor bytes read."""
    code, n, ptr = CODES[t.dtype], t.numel(), t.data_ptr()
    _fastats.stats(ptr, n, code)  # warm up: pages touched, clones resolved
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        _fastats.stats(ptr, n, code)
        best = min(best, time.perf_counter() - start)
    return t.numel() * t.element_size() / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    if _fastats is None:
        raise SystemExit("the C kernel is not built (python setup.py build_ext --inplace)")
    print(f"SIMD={_fastats.SIMD}  (GB/s, best of {args.repeat})")
    print(f"{'dtype':10s} {args.mb:>6d} MB {1:>8d} MB")
    for dtype in DTYPES:
        row = []
        for mb in (args.mb, 1):
            n = (mb << 20) // torch.empty((), dtype=dtype).element_size()
            t = torch.randn(n).to(dtype) if dtype.is_floating_point else torch.randint(0, 2, (n,)).to(dtype)
            row.append(gbps(t, args.repeat))
        print(f"{str(dtype).removeprefix('torch.'):10s} {row[0]:9.1f} {row[1]:11.1f}")


if __name__ == "__main__":
    main()
