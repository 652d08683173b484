"""What bounds the statistics kernel, the floor of every statistics dump (issue 18).

Compiles ``kernel_floor.c`` (the loops of ``fastats_avx512.h`` on float32, each alone) with the
system's C compiler and prints GB/s per CPU second for a tensor in L2 (``--kb``, 256 by default:
a tensor the op has just written) and one from memory (``--mb``): a plain read, the statistics
without the hash, the ``wsum64-v2`` hash alone, the two fused (what the dump runs), and two
cheaper hashes that opscope does not use (one 64-bit multiply-mix per 8 bytes; two AES rounds
per 16 bytes), fused with the statistics, to show what a cheaper hash would buy. Then the
shipped kernel (``_fastats.stats``) on the same sizes, which should read like ``fused``.

x86 with AVX-512 and VAES only (it says so and stops elsewhere). One thread.

    python benchmarks/bench_kernel_floor.py [--kb 256] [--mb 64] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile

import bench_stats_kernel  # this script's folder is on sys.path
import torch

from opscope.capture.torch.stats import _fastats

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = {
    "read": "a plain read (sum)",
    "stats": "statistics, no hash",
    "hash": "wsum64-v2 hash alone",
    "fused": "statistics + wsum64-v2 (the dump's pass)",
    "mix64": "64-bit multiply-mix hash alone (not used)",
    "fused64": "statistics + 64-bit mix (not used)",
    "aes": "2-round AES hash alone (not used)",
    "fusedaes": "statistics + 2-round AES (not used)",
}


def build(tmp: str) -> str | None:
    """The compiled ``kernel_floor`` in ``tmp``, or None without a C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = os.path.join(tmp, "kernel_floor")
    subprocess.run([cc, "-O2", "-o", exe, os.path.join(HERE, "kernel_floor.c")], check=True)
    return exe


def loops(exe: str, kb: int, repeat: int) -> dict[str, float] | None:
    """GB/s of each loop of ``kernel_floor`` on ``kb`` KB of float32; None where unsupported."""
    out = subprocess.run([exe, str(kb), str(repeat)], capture_output=True, text=True, check=True).stdout
    if out.strip() == "unsupported":
        return None
    return {line.split()[0]: float(line.split()[1]) for line in out.splitlines()}


def shipped(kb: int, repeat: int) -> float:
    """GB/s of the shipped kernel (``_fastats.stats``) on ``kb`` KB of float32 (bench_stats_kernel's loops)."""
    return statistics.median(bench_stats_kernel.measure([_fastats], torch.randn(kb * 256), repeat)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=256, help="the in-cache size (KB)")
    parser.add_argument("--mb", type=int, default=64, help="the from-memory size (MB)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        if exe is None:
            print("no C compiler (cc, gcc or $CC): nothing measured")
            return
        small, large = loops(exe, args.kb, args.repeat), loops(exe, args.mb << 10, args.repeat)
    if small is None or large is None:
        print("this CPU lacks AVX-512 (F, BW, DQ, VL) or VAES: nothing measured")
        return
    print(f"float32, GB/s per CPU second, median of {args.repeat}: {args.kb} KB (in L2) / {args.mb} MB")
    for key, label in ROWS.items():
        print(f"  {label:44s} {small[key]:6.1f}  / {large[key]:6.1f}")
    if _fastats is not None:
        print(f"  {'the shipped kernel (_fastats.stats)':44s} {shipped(args.kb, args.repeat):6.1f}  / "
              f"{shipped(args.mb << 10, max(1, args.repeat // 2)):6.1f}")
    print(f"  the hash's share of the dump's pass in L2: {1 - small['fused'] / small['stats']:.0%} of its time "
          f"(fused {small['fused']:.1f} against statistics alone {small['stats']:.1f} GB/s)")


if __name__ == "__main__":
    main()
