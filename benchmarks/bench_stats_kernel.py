"""Throughput of the one-pass statistics kernel (``_fastats.stats``: statistics + hash), in GB/s.

Per dtype, on a tensor that stays in the L2 cache (``--l2-kb``, the kernel's own speed) and a
large one (``--mb``, from memory, as in a real dump): GB/s of tensor bytes per second of the
thread's CPU time (``time.thread_time``, so other processes on a shared machine count less),
median and range over ``--repeat`` timed loops. ``--against PATH`` loads another build of the
extension (e.g. one built from an older commit) and times the two alternately, loop by loop,
with the ratio new/old; it also checks that both give the same statistics and hash.
With ``OPSCOPE_SIMD=portable`` (or ``avx2``) in the environment the portable loops (at most the
AVX2 ones) run, in both builds where both read it; the first line says which ran.

    python benchmarks/bench_stats_kernel.py [--mb 256] [--l2-kb 256] [--repeat 9] [--against OLD.so]
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import math
import statistics
import time
from typing import Any

import torch

from opscope.capture.torch.stats import CODES, _fastats

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int64, torch.bool)
LOOP_S = 0.02  # CPU seconds per timed loop


def load_other(path: str) -> Any:
    """Another build of ``_fastats`` (its init symbol is PyInit__fastats whatever its path)."""
    loader = importlib.machinery.ExtensionFileLoader("_fastats", path)
    spec = importlib.util.spec_from_file_location("_fastats", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def sample(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return t.to(dtype)
    return (t > 0).to(dtype)


def loop_gbps(kernel: Any, t: torch.Tensor, calls: int) -> float:
    """GB/s of one loop of ``calls`` calls, per second of this thread's CPU time."""
    code, n, ptr = CODES[t.dtype], t.numel(), t.data_ptr()
    start = time.thread_time()
    for _ in range(calls):
        kernel.stats(ptr, n, code)
    return calls * n * t.element_size() / (time.thread_time() - start) / 1e9


def measure(kernels: list[Any], t: torch.Tensor, repeat: int) -> list[list[float]]:
    """GB/s of each kernel over ``repeat`` loops, the kernels alternating loop by loop."""
    code, n, ptr = CODES[t.dtype], t.numel(), t.data_ptr()
    results = [k.stats(ptr, n, code) for k in kernels]  # also warms up: pages touched, clones resolved
    # the first eight: builds before 8 December 2026 return no squared deviations (m2)
    if any(repr(r[:8]) != repr(results[0][:8]) for r in results):
        raise SystemExit(f"{t.dtype} numel {n}: the builds disagree: {results}")
    start = time.thread_time()
    kernels[0].stats(ptr, n, code)
    calls = max(1, math.ceil(LOOP_S / max(time.thread_time() - start, 1e-6)))
    out: list[list[float]] = [[] for _ in kernels]
    for r in range(repeat):
        order = range(len(kernels)) if r % 2 == 0 else reversed(range(len(kernels)))
        for i in order:
            out[i].append(loop_gbps(kernels[i], t, calls))
    return out


def cell(gbps: list[float]) -> str:
    return f"{statistics.median(gbps):5.1f} ({min(gbps):.1f}-{max(gbps):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--l2-kb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--against", help="path of another build of _fastats to compare with")
    parser.add_argument("--dtypes", default=",".join(str(d).removeprefix("torch.") for d in DTYPES))
    args = parser.parse_args()
    if _fastats is None:
        raise SystemExit("the C kernel is not built (python setup.py build_ext --inplace)")
    kernels = [_fastats] + ([load_other(args.against)] if args.against else [])
    paths = " / ".join(getattr(k, "SIMD_PATH", "avx2" if k.SIMD else "portable") for k in kernels)
    print(f"kernels {paths}  GB/s per CPU second: median (range) of {args.repeat} loops"
          + ("; second column of each size: --against, then new/old" if args.against else ""))
    sizes = {f"{args.l2_kb} KB": args.l2_kb << 10, f"{args.mb} MB": args.mb << 20}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        row = [f"{name:9s}"]
        for label, nbytes in sizes.items():
            n = nbytes // torch.empty((), dtype=dtype).element_size()
            t = sample(torch.randn(n, generator=torch.Generator().manual_seed(0)), dtype)
            got = measure(kernels, t, args.repeat)
            row.append(f"{label}: {cell(got[0])}")
            if args.against:
                ratio = statistics.median(got[0]) / statistics.median(got[1])
                row.append(f"{cell(got[1])} x{ratio:.2f}")
        print("  ".join(row), flush=True)


if __name__ == "__main__":
    main()
