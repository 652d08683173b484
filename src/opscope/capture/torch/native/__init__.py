"""The native (C/C++) side of PyTorch capture, in one place.

- ``_c/``: the sources: the one-pass statistics kernel (``fastats*.h``, built by setup.py as
  :mod:`opscope.capture.torch.native._fastats`, optional) and the ``at::RecordFunction``
  observers of dump (``dumpobs*``) and watch (``watchobs.cpp``), built on first use against
  the installed torch.
- :mod:`.build`: that first-use compiler driver (``python -m opscope.capture.torch.native.build``
  builds everything now; the install script runs it).
- :mod:`.ops`: how an op overload is classified for the observers (from ``op_kinds``).
- :mod:`.table`: the column layout the dump observer hands back.
- :mod:`.aten` and :mod:`.module`: the dump session's native levels (aten and module).

Importing this package loads nothing native.
"""
