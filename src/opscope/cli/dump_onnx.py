"""``opscope dump-onnx``: capture every intermediate tensor of an ONNX model under ONNX Runtime.

Nothing heavy is imported before the arguments are parsed; onnx and onnxruntime are
imported only when a model is run.
"""

from __future__ import annotations

import argparse
import sys

USAGE_EXAMPLES = """\
examples:
  opscope dump-onnx model.onnx --inputs inputs.npz -o dumps/ort
  opscope dump-onnx model.onnx --inputs inputs.npz -o dumps/ort-all --opt-level all --data statistics

inputs.npz holds arrays named after the graph inputs (one step), or arrays named
sample<N>/<input> (one step per N): np.savez("inputs.npz", **{"sample0/x": a, "sample1/x": b}).
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opscope dump-onnx", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run an ONNX model under ONNX Runtime and dump every node's inputs and "
                    "outputs (statistics and full tensors) in opscope's dump format.",
        epilog=USAGE_EXAMPLES)
    p.add_argument("model", help="the .onnx file (never modified)")
    p.add_argument("--inputs", "-i", required=True, help=".npz of input arrays (see below)")
    p.add_argument("--output", "-o", required=True, metavar="DUMP", help="dump directory to write")
    p.add_argument("--provider", default=None,
                   help="execution provider: cpu (default), cuda, tensorrt, or a full name "
                        "such as CUDAExecutionProvider")
    p.add_argument("--opt-level", default="disable", choices=("disable", "basic", "extended", "all"),
                   help="ONNX Runtime graph optimisation level to capture (default: disable, "
                        "the graph as written in the file)")
    p.add_argument("--data", default="tensor", choices=("statistics", "tensor"),
                   help="keep full tensors (default) or statistics only")
    p.add_argument("--mode", default="all", choices=("input", "output", "all"),
                   help="rows for node inputs, outputs or both (default)")
    p.add_argument("--ops", action="append", default=None, metavar="GLOB",
                   help="capture only matching ops/node names (onnx::Gemm, MatMul, '/layers.0/*'); "
                        "'!GLOB' excludes; repeatable")
    p.add_argument("--scope", action="append", default=None, metavar="GLOB",
                   help="capture only nodes of matching module paths (layers.0.*); repeatable")
    p.add_argument("--memory-limit-mb", type=float, default=1024,
                   help="captured outputs held at once; above it the graph runs several times")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dump")
    return p


def main(argv: list[str]) -> int:
    """Run ``opscope dump-onnx``; returns the exit code (0 written, 2 could not)."""
    args = _parser().parse_args(argv)
    from pathlib import Path

    from opscope.capture.onnxruntime.capture import dump_onnx
    from opscope.errors import DumpExistsError

    if not args.overwrite and (Path(args.output) / "manifest.json").exists():
        raise DumpExistsError(f"{args.output!r} already holds a dump; choose a new path or pass --overwrite")

    dump = dump_onnx(args.model, args.inputs, args.output, provider=args.provider,
                     opt_level=args.opt_level, data=args.data, mode=args.mode, ops=args.ops,
                     scope=args.scope, overwrite=args.overwrite, memory_limit_mb=args.memory_limit_mb,
                     command=["opscope", "dump-onnx", *argv])
    table = dump.records(columns=["seq", "io"])
    seqs = set(table.column("seq").to_pylist())
    steps = dump.steps()
    print(f"opscope dump-onnx: wrote {table.num_rows} records of {len(seqs)} nodes, "
          f"{len(steps)} step(s), {dump.size_bytes / 1e6:.1f} MB to {dump.path}")
    for problem in [*dump.manifest.get("warnings", []), *dump.problems]:
        print(f"opscope dump-onnx: warning: {problem}", file=sys.stderr)
    return 0
