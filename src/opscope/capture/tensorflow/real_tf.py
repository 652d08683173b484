"""The real TensorFlow in ``sys.modules``, where another package left tensorboard's stub.

msprobe 26.2 (Ascend's accuracy tool, which a user of this project may well import in the
same script) puts tensorboard's ``tensorflow_stub`` in ``sys.modules["tensorflow"]`` and
``["tensorflow.python"]`` when it is imported, TensorFlow imported before or not. Every later
``import tensorflow`` then gets the stub, and a dump fails deep inside with an AttributeError
(``... tensorflow_stub has no attribute 'distribute'``). :func:`ensure` takes the stub's
entries out and imports the real package again (its submodules stay loaded, so this is quick
and keeps every TensorFlow object the program already holds valid), saying so once.
"""

from __future__ import annotations

import sys


def ensure() -> None:
    """Put the real TensorFlow back in ``sys.modules`` if a stub took its place (and a real
    TensorFlow is installed: else the stub stays, as its owner put it)."""
    import importlib.machinery

    stubs = {name: module for name, module in list(sys.modules.items())
             if (name == "tensorflow" or name.startswith("tensorflow."))
             and str(getattr(module, "__name__", "")).startswith("tensorboard.")}
    if not stubs or importlib.machinery.PathFinder.find_spec("tensorflow") is None:
        return
    for name in stubs:
        del sys.modules[name]
    try:
        import tensorflow  # noqa: F401 - the real package, imported again
    except Exception:  # noqa: BLE001 - a broken TensorFlow: leave things as they were
        sys.modules.update(stubs)
        return
    print("opscope: sys.modules['tensorflow'] was tensorboard's stub (importing msprobe puts it there); "
          "opscope put the real TensorFlow back", file=sys.stderr, flush=True)
