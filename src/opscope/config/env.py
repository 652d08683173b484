"""Every environment variable opscope reads, read here and nowhere else.

:data:`OPTIONS` are opscope's own (``OPSCOPE_<name>``), read with :func:`env`; :data:`FOREIGN`
are set by others (launchers, the shell) and read with :func:`foreign`. Reading a name that
is not in these tables is a bug (a ``KeyError``), so this module stays the one list a user
(and docs/run.md) can trust.
"""

from __future__ import annotations

import os

# OPSCOPE_<name> -> what it does.
OPTIONS: dict[str, str] = {
    "CONFIG": "path of a config file used when no config= is given (and what makes `opscope run` and the "
              ".pth hook start capture)",
    "RUN_ID": "identifies one launch across its ranks (set by `opscope run`)",
    "LAUNCHER": "set by `opscope run` for its command, which said what is on (a process started with "
                "OPSCOPE_CONFIG alone says it on rank 0)",
    "STATS_BACKEND": "auto/c (one C pass on the training thread, default), async (the C pass on a worker "
                     "thread) or torch (torch reductions, the device path): the Python path's engine",
    "STATS_THREAD": "1: the native aten observer measures statistics on a worker thread while the step goes on "
                    "(opt-in: an op whose schema hides an in-place write would be measured after it)",
    "DEVICE_STAGING_MB": "the native dump's staging buffer for the statistics of tensors on a GPU or NPU, per "
                         "device and dtype, in MB (default 8): tensors are copied into it and reduced a buffer "
                         "at a time; 0 reduces each tensor alone (~22 kernel launches a tensor)",
    "DUMP_BACKEND": "native (default: the C++ observer where it applies) or python (the Python dispatch mode)",
    "WATCH_BACKEND": "native (default: the C++ observer) or python (the Python dispatch mode)",
    "SIMD": "the statistics kernel's vector code (read by the C kernel, native/_c/fastats_avx2.h): avx2 stops "
            "at AVX2 on a CPU with AVX-512, portable runs the plain loops (the tests compare the three); "
            "default: the best the CPU has",
    "NO_SIMD": "1: the statistics kernel runs its plain loops (as OPSCOPE_SIMD=portable)",
    "CACHE_DIR": "where native extensions are built (default $XDG_CACHE_HOME/opscope or ~/.cache/opscope)",
}

# Variables set by launchers or the shell that opscope reads.
FOREIGN: dict[str, str] = {
    "RANK": "this process's rank (torchrun, mpirun wrappers)",
    "LOCAL_RANK": "this process's rank on its machine (torchrun)",
    "WORLD_SIZE": "number of ranks (torchrun)",
    "TORCHELASTIC_RUN_ID": "torchrun's id of one launch, the run id when opscope run did not set one",
    "XDG_CACHE_HOME": "the user's cache folder (native builds go under it)",
    "CXX": "the C++ compiler for native extensions (default g++ or c++ on PATH)",
}


def env(name: str, default: str | None = None) -> str | None:
    """Read the opscope option ``OPSCOPE_<name>`` (``name`` must be in :data:`OPTIONS`)."""
    if name not in OPTIONS:
        raise KeyError(f"OPSCOPE_{name} is not an opscope environment option; add it to config/env.py OPTIONS")
    return os.environ.get(f"OPSCOPE_{name}", default)


def foreign(name: str, default: str | None = None) -> str | None:
    """Read a variable set by a launcher or the shell (``name`` must be in :data:`FOREIGN`)."""
    if name not in FOREIGN:
        raise KeyError(f"{name} is not an environment variable opscope reads; add it to config/env.py FOREIGN")
    return os.environ.get(name, default)
