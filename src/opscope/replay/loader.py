"""Which loader rebuilds a recorded call: aten ops run as recorded (:mod:`opscope.replay.calls`),
API-level calls and MindSpore kernels are rebuilt by :mod:`opscope.replay.api_calls`, TensorFlow
ops re-run through TensorFlow by :mod:`opscope.replay.tf_ops`."""

from __future__ import annotations

from typing import Any

from opscope.errors import ReplayError
from opscope.replay.api_calls import load_api_call, load_mindspore_call
from opscope.replay.calls import Call, head_of, is_aten, load_aten_call
from opscope.replay.rules import RULES
from opscope.replay.tf_ops import load_tf_call


def load_call(dump: Any, rows: list[dict[str, Any]], side: str) -> Call:
    """Read one call's rows and tensors; raises ReplayError when it cannot be replayed."""
    name = str(head_of(rows).get("op") or "")
    if name.startswith("mindspore.") and (dump.manifest or {}).get("tool", {}).get("name") == "msprobe" \
            and name not in RULES:
        raise ReplayError(f"not replayable: {name} is a MindSpore API call as msprobe records it, without the "
                          "attributes its primitive was built with (a MatMul's transpose flags, a LayerNorm's "
                          "axes and epsilon), so opscope's MindSpore kernel table cannot rebuild it; register a "
                          f"torch equivalent with opscope.replay.register_replay({name!r})")
    if name.startswith("mindspore."):
        return load_mindspore_call(dump, rows, side)
    level = (dump.manifest or {}).get("level")
    if level == "tf-op" and name.startswith("tf."):
        return load_tf_call(dump, rows, side)
    if level == "tf-layer":
        raise ReplayError(f"not replayable: {name} is a Keras layer's call (level=\"layer\"); replay re-runs "
                          "TensorFlow ops: dump with level=\"op\"")
    if (dump.manifest or {}).get("level") == "module":
        raise ReplayError(f"not replayable: {name} is a module-level record (a whole module's call); replay "
                          "re-runs operators: dump with level=\"api\" or \"aten\" (msprobe: level L1 or mix)")
    if not is_aten(name):
        return load_api_call(dump, rows, side)
    return load_aten_call(dump, rows, side)
