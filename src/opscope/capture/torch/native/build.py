"""Native extensions built against the installed torch, on first use, once per torch version.

A C++ extension that links libtorch must match the exact torch it runs with, so it cannot
ship prebuilt with opscope. It is compiled (a few seconds with g++) into a cache folder,
``$OPSCOPE_CACHE_DIR`` or ``~/.cache/opscope``, keyed by the torch version, the Python
version and the source's hash; concurrent processes (torchrun ranks) wait for one build
under a file lock. Without a compiler the callers fall back to their Python path and say
why once.

``python -m opscope.capture.torch.native.build`` builds everything now (the install script does it).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from opscope.config.env import env, foreign

log = logging.getLogger(__name__)
_C = Path(__file__).parent / "_c"
_SHARED = Path(__file__).parents[3] / "_c"  # src/opscope/_c: headers shared with the C kernels (opscope_half.h)
_SOURCES = {"_opscope_watch": _C / "watchobs.cpp", "_opscope_dump": _C / "dumpobs.cpp",
            "_opscope_monitor": _SHARED.parent / "monitor" / "_c" / "montorch.cpp"}  # (opscope.monitor.torchext)
_LOADED: dict[str, ModuleType | None] = {}
_ERRORS: dict[str, str] = {}


def cache_dir() -> Path:
    root = env("CACHE_DIR") or os.path.join(
        foreign("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opscope")
    return Path(root) / "native"


def _target(name: str) -> Path:
    import torch

    # a change of flags is a new build too; opscope's own folder is not a flag (its headers are
    # hashed), so a second install of the same opscope (another venv, an editable checkout) reuses the build
    flags = " ".join(_command(Path("src"), Path("out"))).replace(str(Path(__file__).parents[3]), "<opscope>")
    sources = [_SOURCES[name], *sorted(_SOURCES[name].parent.glob("*.h")), *sorted(_SHARED.glob("*.h"))]  # and headers
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + flags.encode()).hexdigest()[:12]
    tag = f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / tag / f"{name}{suffix}"


def torch_paths() -> tuple[list[str], list[str]]:
    """torch's include and library folders, as ``torch.utils.cpp_extension``'s ``include_paths()``
    and ``library_paths()`` give them for the CPU. Made here: importing cpp_extension imports
    setuptools, ~0.1 s at each process's first dump only to find the build in the cache."""
    import torch

    root = os.path.dirname(os.path.abspath(torch.__file__))
    include = os.path.join(root, "include")
    return [include, os.path.join(include, "torch", "csrc", "api", "include")], [os.path.join(root, "lib")]


def _command(source: Path, out: Path, compiling: bool = False) -> list[str]:
    """The compiler's command; ``compiling``: with torch's folders as cpp_extension gives them
    (the cache key is made with :func:`torch_paths`, the same strings for the torch tested)."""
    import torch

    cxx = foreign("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    if compiling:
        from torch.utils import cpp_extension as ce

        headers, libs = ce.include_paths(), ce.library_paths()
    else:
        headers, libs = torch_paths()
    includes = [f"-I{p}" for p in [*headers, sysconfig.get_paths()["include"]]]
    # local-dynamic: the observers' thread-locals (internal) reached from one __tls_get_addr of the
    # module per function, not one each (the initial-exec model would need glibc's static-TLS reserve)
    return [cxx, "-O3", "-std=c++20", "-shared", "-fPIC", "-ftls-model=local-dynamic", "-w", "-DNDEBUG",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            str(source), "-o", str(out), f"-I{source.parent}", f"-I{_SHARED}", *includes, *[f"-L{p}" for p in libs],
            *[f"-Wl,-rpath,{p}" for p in libs], "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]


def build(name: str) -> Path:
    """Compile extension ``name`` for the installed torch unless the cache has it; its path."""
    target = _target(name)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while this one waited
            return target
        log.info("opscope: building the native %s for torch (once per torch version)", name)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            proc = subprocess.run(_command(_SOURCES[name], out, compiling=True), capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {_SOURCES[name].name} failed:\n{proc.stderr[-2000:]}")
            os.replace(out, target)
    return target


def load(name: str) -> ModuleType | None:
    """The extension, built if needed; None (and :func:`error` says why) when it cannot be."""
    if name in _LOADED:
        return _LOADED[name]
    module = None
    try:
        path = build(name)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # no compiler, no headers, a torch without them: Python path
        _ERRORS[name] = f"{type(exc).__name__}: {exc}"
        module = None
    _LOADED[name] = module
    return module


def error(name: str) -> str | None:
    """Why :func:`load` returned None for ``name``."""
    return _ERRORS.get(name)


def main() -> int:
    status = 0
    for name in _SOURCES:
        if load(name) is None:
            print(f"opscope: native {name} not built ({error(name)}); the Python path will be used",
                  file=sys.stderr)
            status = 1
        else:
            print(f"opscope: native {name} ready in {_target(name).parent}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
