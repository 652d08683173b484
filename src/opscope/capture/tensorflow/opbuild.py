"""The TensorFlow statistics op (``_c/stats_op.cc``) and the tap passes (``_c/tap_passes.cc``,
which keep the dump's taps out of Grappler's sight), built on first use and loaded.

A TensorFlow custom op must be compiled against the installed TensorFlow's headers and
framework library, so it cannot ship prebuilt. It is compiled (~8 s with g++) into the same
cache as the PyTorch native observers, ``$OPSCOPE_CACHE_DIR`` or ``~/.cache/opscope``,
``native/tf-<version>-py<version>-<hash of the sources, headers and command>/``; concurrent
processes wait for one build under a file lock. Without a compiler, or when the build or the
load fails, :func:`load` returns None and says once why: the dump then measures on the host
(a ``numpy_function`` per graph run), with the same rows, but Grappler sees its taps (dumped
steps may then round differently from steps without the dump: docs/tensorflow.md, session 12).

``python -m opscope.capture.tensorflow.opbuild`` builds it now.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from opscope.config.env import env, foreign

_C = Path(__file__).parent / "_c"
_SOURCES = (_C / "stats_op.cc", _C / "tap_passes.cc")  # the op; the passes that hide the taps from Grappler
_KERNEL = Path(__file__).parents[1] / "torch" / "native" / "_c"  # fastats_kernel.h, fastats_*.h
_SHARED = Path(__file__).parents[2] / "_c"  # opscope_half.h
ENABLED = True  # False: every graph measures on the host, the passes still load (tests compare the two paths)
_STATE: dict[str, Any] = {}  # "module": the loaded op library or None, "error": why not


def cache_dir() -> Path:
    """Where native builds go (the PyTorch observers' folder too)."""
    root = env("CACHE_DIR") or os.path.join(foreign("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opscope")
    return Path(root) / "native"


def command(out: Path) -> list[str]:
    """The compile command: TensorFlow's own flags, the statistics kernel's float flags (the C
    extension's: no contraction into FMA, so the same bits as ``_fastats``)."""
    import tensorflow as tf

    cxx = foreign("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    link = tf.sysconfig.get_link_flags()
    rpath = [f"-Wl,-rpath,{f[2:]}" for f in link if f.startswith("-L")]
    return [cxx, "-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC", "-w",
            "-DNDEBUG", *tf.sysconfig.get_compile_flags(), f"-I{_KERNEL}", f"-I{_SHARED}",
            f"-I{sysconfig.get_paths()['include']}", *map(str, _SOURCES), "-o", str(out), *link, *rpath]


def target() -> Path:
    """The library's path in the cache, keyed by everything that makes it."""
    import tensorflow as tf

    # opscope's own folder is not a flag (its files are hashed): another install of it reuses the build
    flags = " ".join(command(Path("out"))).replace(str(Path(__file__).parents[2]), "<opscope>")
    sources = [*_SOURCES, *sorted(_C.glob("*.h")), *sorted(_KERNEL.glob("fastats*.h")), *sorted(_SHARED.glob("*.h"))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + flags.encode()).hexdigest()[:12]
    tag = f"tf-{tf.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    return cache_dir() / tag / "_opscope_tf_stats.so"


def build() -> Path:
    """Compile the op unless the cache has it; its path. Raises when the compile fails."""
    path = target()
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():  # another process built it while this one waited
            return path
        print("opscope: compiling the TensorFlow statistics op (once per TensorFlow version, ~10 s)",
              file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = Path(tmp) / path.name
            proc = subprocess.run(command(out), capture_output=True, text=True)
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
                names = " and ".join(p.name for p in _SOURCES)
                raise RuntimeError(f"compiling {names} failed (exit {proc.returncode}): {tail[0][:200]}")
            os.replace(out, path)
    return path


def load() -> Any:
    """The op library (``.opscope_stats``), built if needed; None when it cannot be, said once
    on stderr. Loading it registers the tap passes (``_c/tap_passes.cc``) for the process."""
    if "module" not in _STATE:
        module = None
        try:
            import tensorflow as tf

            module = tf.load_op_library(str(build()))
        except Exception as exc:  # no compiler, no headers, a TensorFlow without them: the host path
            _STATE["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            print(f"opscope: the TensorFlow statistics op is not available ({_STATE['error']}); "
                  "statistics are measured by a host callback instead, and Grappler sees the dump's taps: "
                  "dumped steps may compute other bits than steps without the dump", file=sys.stderr, flush=True)
        _STATE["module"] = module
    return _STATE["module"]


def error() -> str | None:
    """Why :func:`load` returned None."""
    return _STATE.get("error")


if __name__ == "__main__":
    lib = load()
    print(f"opscope: TensorFlow statistics op ready: {target()}" if lib is not None else "not built")
    raise SystemExit(0 if lib is not None else 1)
