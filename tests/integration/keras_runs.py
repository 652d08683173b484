"""Several Keras training runs in one process (``--runs RUNS.json``), for tf_train.py and
tf_keras_app.py: TensorFlow's import (~6 s) once instead of once a run."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable


def main_or_many(main: Callable[[list[str] | None], None]) -> None:
    """``main()`` on the command line's arguments; with ``--runs FILE``, ``main(argv)`` for each
    argument list of the JSON file, in turn, each from a cleared Keras session and the float32
    policy, as if run alone."""
    if sys.argv[1:2] != ["--runs"]:
        main(None)
        return
    import keras

    with open(sys.argv[2]) as f:
        runs = json.load(f)
    for argv in runs:
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("float32")
        main(argv)
