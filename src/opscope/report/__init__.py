"""Every renderer of opscope, reached through one registry keyed by result and output format.

A renderer is pure: ``render(result, **options) -> str | bytes``; it never computes what the
result does not already hold. Each registers itself with :func:`register_renderer` under the
class name of the result it renders and a format::

    @register_renderer("CompareResult", "html")
    def render(result: CompareResult) -> str: ...

and is found by :func:`render` (``report.render(result, "html")``) or :func:`renderer`.
The modules are imported on first use of their result (``_MODULES``), so looking up the
text of a watch event does not load the compare or profile renderers.

================  =====================================  ==================================
result            formats                                module
================  =====================================  ==================================
OverflowEvent     text                                   overflow_console
CompareResult     text, html                             compare_console, compare_html
ProfileData       text, html                             profile_console, profile_html
ProfileDiff       text                                   profile_console
Dump              text (``opscope show``)                dump_console
ReplayResult      text (``opscope replay``)              replay_console
RankCheck         text (``opscope check-ranks``)         ranks_console
MonitorEvent      text                                   monitor_console
MonitorData       text (``opscope monitor show``), html  monitor_console, monitor_html
================  =====================================  ==================================

A new format: a module here with a registered function, and its name in ``_MODULES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

Renderer = Callable[..., Any]
_F = TypeVar("_F", bound=Renderer)

# result class name -> the modules whose import registers its renderers
_MODULES: dict[str, tuple[str, ...]] = {
    "OverflowEvent": ("opscope.report.overflow_console",),
    "CompareResult": ("opscope.report.compare_console", "opscope.report.compare_html"),
    "ProfileData": ("opscope.report.profile_console", "opscope.report.profile_html"),
    "ProfileDiff": ("opscope.report.profile_console",),
    "Dump": ("opscope.report.dump_console",),
    "ReplayResult": ("opscope.report.replay_console",),
    "RankCheck": ("opscope.report.ranks_console",),
    "MonitorEvent": ("opscope.report.monitor_console",),
    "MonitorData": ("opscope.report.monitor_console", "opscope.report.monitor_html"),
}
_RENDERERS: dict[tuple[str, str], Renderer] = {}


def register_renderer(kind: str, fmt: str) -> Callable[[_F], _F]:
    """Register the decorated function as the ``fmt`` renderer of results of class ``kind``.

    Raises:
        ValueError: another renderer is registered for ``(kind, fmt)`` already.
    """

    def add(fn: _F) -> _F:
        key = (kind, fmt)
        if key in _RENDERERS and _RENDERERS[key] is not fn:
            old = _RENDERERS[key]
            raise ValueError(f"a {fmt} renderer of {kind} is registered already ({old.__module__}.{old.__qualname__})")
        _RENDERERS[key] = fn
        return fn

    return add


def renderer(kind: str, fmt: str = "text") -> Renderer:
    """The ``fmt`` renderer of results of class ``kind``.

    Raises:
        KeyError: none is registered (the message lists the formats there are).
    """
    fn = _RENDERERS.get((kind, fmt))
    if fn is None:
        for module in _MODULES.get(kind, ()):
            importlib.import_module(module)
        fn = _RENDERERS.get((kind, fmt))
    if fn is None:
        known = ", ".join(formats(kind)) or "none"
        raise KeyError(f"no {fmt!r} renderer for {kind}; formats: {known}")
    return fn


def formats(kind: str) -> list[str]:
    """The formats that results of class ``kind`` can be rendered to."""
    for module in _MODULES.get(kind, ()):
        importlib.import_module(module)
    return sorted(f for k, f in _RENDERERS if k == kind)


def render(result: Any, fmt: str = "text", **options: Any) -> Any:
    """Render ``result`` (found by its class, or a base class) to ``fmt``; ``options`` go to
    the renderer (``width``, ``top``, ``color``...)."""
    for cls in type(result).__mro__:
        if cls.__name__ in _MODULES or any(k == cls.__name__ for k, _ in _RENDERERS):
            return renderer(cls.__name__, fmt)(result, **options)
    raise KeyError(f"no renderer for {type(result).__name__}")
