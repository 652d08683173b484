"""``opscope`` entry point: dispatches to ``opscope.cli.<command>.main(argv)`` lazily.

Nothing heavy is imported here so that ``opscope --help`` answers at once.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module under opscope.cli, one-line description)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "train a bundled tiny model with faults; dump, compare and profile it"),
    "run": ("run", "run any training script with opscope on, no code change"),
    "show": ("show", "summarise a dump: steps, ranks, ops per phase, size, first NaN/Inf"),
    "convert": ("convert", "convert a dump's tensors to .npy files plus an index CSV"),
    "compare": ("compare", "compare two dumps and name the operator where they start to differ"),
    "replay": ("replay", "re-run an operator in float64 on each side's inputs: which side is wrong"),
    "profile": ("profile", "show or diff profiles (training trace and task trace)"),
    "monitor": ("monitor", "show what a training monitor recorded and which tensor moved first"),
    "dump-onnx": ("dump_onnx", "capture every intermediate tensor of an ONNX model under ONNX Runtime"),
    "check-ranks": ("check_ranks", "check that data-parallel ranks kept parameters and gradients identical"),
}


def _usage() -> str:
    from opscope import __version__

    width = max(len(c) for c in COMMANDS)
    lines = [
        f"opscope {__version__}: find where a model's numbers go wrong and where its time goes",
        "",
        "usage: opscope COMMAND [ARGS...]      (opscope COMMAND --help for details)",
        "",
        "commands:",
    ]
    lines += [f"  {name.ljust(width)}  {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run one opscope command; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from opscope import __version__

        print(f"opscope {__version__}")
        return 0
    command = argv[0]
    if command not in COMMANDS:
        print(f"opscope: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"opscope.cli.{COMMANDS[command][0]}")
    from opscope.errors import OpscopeError

    try:
        return int(module.main(argv[1:]) or 0)
    except OpscopeError as exc:
        print(f"opscope {command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"opscope {command}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script entry point."""
    code = main()
    # The command is done and has closed its files; what is left is the interpreter's exit,
    # whose garbage collections walk every object it made and imported (~60-90 ms of CPU
    # after a compare). Frozen, they are not walked; the memory goes back all the same.
    import gc

    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
