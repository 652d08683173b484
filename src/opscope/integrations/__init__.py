"""Callbacks that drive opscope's sessions from a training framework's own loop.

- :mod:`opscope.integrations.huggingface`: ``OpscopeCallback`` for ``transformers.Trainer``.
- :mod:`opscope.integrations.lightning`: ``OpscopeCallback`` for Lightning's ``Trainer``.

Each submodule imports its framework; this package imports neither, so ``import opscope``
and ``import opscope.integrations`` stay free of transformers and Lightning. See
docs/integrations.md.
"""

from __future__ import annotations
