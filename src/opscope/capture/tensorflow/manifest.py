"""The manifest of a TensorFlow dump, and the set-ups it refuses."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from opscope.capture.tensorflow.stats import BACKEND
from opscope.config import DumpConfig
from opscope.config.env import env, foreign
from opscope.errors import ConfigError
from opscope.model.hashing import ALGORITHM as HASH_ALGORITHM
from opscope.storage.format import STD_METHOD


def manifest(cfg: DumpConfig, level: str, manifest_level: str) -> dict[str, Any]:
    """Common manifest fields (docs/format.md) for a TensorFlow dump."""
    import keras
    import tensorflow as tf

    from opscope._version import __version__

    config = cfg.to_json()
    config["level"] = level
    return {
        "tool": {"name": "opscope", "version": __version__},
        "framework": {"tensorflow": tf.__version__, "keras": keras.__version__, "onednn": onednn()},
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "cwd": os.getcwd(),
        "command": list(sys.argv),
        "config": config,
        "device": "cpu" if not tf.config.list_logical_devices("GPU") else "gpu",
        "world_size": int(foreign("WORLD_SIZE", "1") or 1),
        "run_id": env("RUN_ID"),
        "hash_algorithm": HASH_ALGORITHM,
        "std": STD_METHOD,
        "stats_backend": BACKEND,
        "level": manifest_level,
    }


def onednn() -> bool | None:
    """Whether TensorFlow runs its oneDNN kernels in this process (``TF_ENABLE_ONEDNN_OPTS``,
    on by default on x86 Linux): they round bfloat16 differently from the plain ones, so a
    replay reproduces the recorded bits only with the same setting."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:
        return None
    return bool(_pywrap_util_port.IsMklEnabled())


def check_strategy(model: Any = None) -> None:
    """Refuse a distribution strategy with more than one replica in this process: each
    replica's ops would interleave in one record stream (one process per rank is supported)."""
    import tensorflow as tf

    strategy = getattr(model, "distribute_strategy", None) if model is not None else None
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    if strategy is None:
        return
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1)
    if replicas > 1:
        raise ConfigError(
            f"opscope.tensorflow.dump does not support {type(strategy).__name__} with {replicas} replicas "
            "in one process (their ops would mix in one record stream); dump one replica: run with a "
            "single device (CUDA_VISIBLE_DEVICES) or one worker per process (MultiWorkerMirroredStrategy "
            "with RANK set), or use the default strategy for the dumped steps")
