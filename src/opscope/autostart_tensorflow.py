"""The sessions a zero-code TensorFlow program starts (``opscope run``, ``$OPSCOPE_CONFIG``).

:mod:`opscope.autostart` waits for the program's first ``Model.fit`` or ``tf.function``
call and asks :func:`tensorflow_session` for each enabled config section: the TensorFlow
dump, profile or overflow watch. They live at autostart's layer, not in
``capture/tensorflow/``, because the profile and the watch are handed their renderers here.
"""

from __future__ import annotations

import sys
from typing import Any


def tensorflow_session(name: str, cfg: Any, path: str) -> Any:
    """The unstarted TensorFlow session of config section ``name`` (dump, profile,
    overflow), or None when the section is off or the script runs its own."""
    if not cfg.enable:
        return None
    from opscope.capture.tensorflow import real_tf

    real_tf.ensure()
    if name == "profile":
        return tensorflow_profile(cfg)
    if name == "overflow":
        return tensorflow_watch(cfg)
    from opscope.capture.tensorflow.autostart import make_session

    return make_session(name, cfg, path)


def tensorflow_profile(cfg: Any) -> Any:
    """The TensorFlow profile (steps found from fit's train function and custom loops'
    tf.function calls), unless one runs or the script holds its own."""
    from opscope.profile import tensorflow as tf_profile

    main = sys.modules.get("__main__")
    own = main is not None and any(isinstance(v, tf_profile.TFProfileSession) for v in vars(main).values())
    if tf_profile._active is not None or own:
        return None
    from opscope.report import renderer

    return tf_profile.TFProfileSession(cfg, html=renderer("ProfileData", "html"))


def tensorflow_watch(cfg: Any) -> Any:
    """The TensorFlow overflow watch of an ``overflow`` section (op level whatever it says)."""
    from opscope.report import renderer
    from opscope.watch.tensorflow import from_config

    return from_config(cfg, renderer("OverflowEvent", "text"))
