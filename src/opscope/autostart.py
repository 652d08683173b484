"""Start opscope in a process from its configuration alone, with no change to the script.

``opscope run -c config.json -- CMD`` and ``OPSCOPE_CONFIG=config.json python train.py``
both end here, at interpreter startup: the launcher through a ``sitecustomize`` it puts on
``PYTHONPATH``, an installed opscope through its ``opscope-autostart.pth`` (which imports
this module only when ``OPSCOPE_CONFIG`` is set). :func:`activate` then

1. validates the config file (a bad one ends the process at once, with one message);
2. waits, without importing torch, for the process to import torch (a post-import hook);
3. waits for the first ``nn.Module`` call, and only then starts the configured sessions
   (dump, profile, overflow watch), just before that call runs. A process that never
   calls a module — pip, a compiler, torchrun's agent, ``mp.spawn``'s parent, a DataLoader
   worker — starts nothing and writes nothing;
4. stops the sessions at exit: normal exit, an uncaught exception (recorded as the
   error) and SIGTERM (turned into ``SystemExit(143)`` so that everything is flushed).

A script that imports opscope itself keeps control: autostart starts nothing there (the
script's own ``opscope.dump()`` reads the same ``OPSCOPE_CONFIG``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from opscope.autostart_tensorflow import tensorflow_session

ENV_CONFIG = "OPSCOPE_CONFIG"

_autostart: Autostart | None = None


def activate(origin: str = "OPSCOPE_CONFIG") -> Autostart | None:
    """Arm opscope in this process when ``$OPSCOPE_CONFIG`` names a config (idempotent).

    Args:
        origin: who called (``"opscope run"``, ``".pth"``), used in messages only.

    Returns:
        The :class:`Autostart` armed in this process, or None when no config is set.
    """
    global _autostart
    if _autostart is not None:
        return _autostart
    from opscope.config.env import env

    path = env("CONFIG")
    if not path:
        return None
    path = os.path.abspath(path)
    broken: str | None = None
    try:
        sections = validate(path)
    except Exception as exc:  # the config module raises ConfigError; anything else is as fatal
        if origin != ".pth":
            _fail(f"{ENV_CONFIG}={path}: {exc}")
        # Through the .pth every Python process sees the variable (pip too): only a process
        # that starts a model fails, at its first module call, before any training.
        sections, broken = {}, f"{ENV_CONFIG}={path}: {exc}"
    _autostart = Autostart(path, sections, origin)
    _autostart.broken = broken
    _autostart.arm()
    return _autostart


def validate(path: str | os.PathLike) -> dict[str, Any]:
    """Resolve every section of a config file; returns ``{section: resolved config}``.

    Raises:
        ConfigError: a bad key or value in any section, or a file that enables nothing.
    """
    from opscope import config
    from opscope.errors import ConfigError

    data = config.load(path)
    if not data:
        raise ConfigError(f"config file {os.fspath(path)!r} is empty; give a dump, profile, overflow or "
                          "monitor section")
    names = [s for s in config.SECTIONS if s in data] or ["dump"]  # a flat file holds dump keys
    resolve: dict[str, Callable[[str | os.PathLike], Any]] = {
        "dump": config.dump_config, "profile": config.profile_config, "overflow": config.watch_config,
        "monitor": config.monitor_config}
    sections = {name: resolve[name](path) for name in names}
    profile = sections.get("profile")
    if profile is not None and not (profile.training_trace or profile.task_trace):
        raise ConfigError("profile: training_trace and task_trace are both off: nothing to record")
    return sections


def describe(sections: dict[str, Any], framework: str = "torch") -> str:
    """One line saying what a config turns on and where it writes, e.g.
    ``opscope: dump (aten, statistics, steps 0-2) -> dumps/run1; profile -> prof/run1``;
    ``framework="tensorflow"`` names the levels a TensorFlow program gets (op, layer)."""
    from opscope.capture.tensorflow.options import tf_level

    parts = []
    for name, cfg in sections.items():
        if not cfg.enable:
            parts.append(f"{name} off")
            continue
        if name == "profile":
            where = cfg.output
            what = [t for t, on in (("training trace", cfg.training_trace), ("task trace", cfg.task_trace)) if on]
        elif name == "monitor":
            where, what = cfg.path, [", ".join(cfg.targets)]
        else:
            where = cfg.path
            level = cfg.level if framework == "torch" else "op" if name == "overflow" else tf_level(cfg.level)
            what = [level, cfg.data] if name == "dump" else [level, f"action {cfg.action}"]
        every = "every step" if getattr(cfg, "every", 1) == 1 else f"every {cfg.every} steps"
        what.append(every if name == "monitor" else _steps_text(cfg.steps.steps))
        if cfg.ranks is not None:
            what.append("ranks " + ",".join(map(str, cfg.ranks)))
        label = "overflow watch" if name == "overflow" else name
        parts.append(f"{label} ({', '.join(what)})" + (f" -> {_shown_path(where)}" if where else ""))
    return "opscope: " + "; ".join(parts)


def _steps_text(steps: frozenset[int] | None) -> str:
    if steps is None:
        return "every step"
    ordered, runs = sorted(steps), list[list[int]]()
    for s in ordered:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    spans = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    return ("step " if len(ordered) == 1 else "steps ") + ",".join(spans)


def _shown_path(path: str) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def _fail(message: str) -> None:
    # Raising at interpreter startup would end in "Fatal Python error: init_import_site".
    try:
        sys.stderr.write(f"opscope: error: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(2)


class Autostart:
    """The sessions one process runs because of its config. Created by :func:`activate`."""

    def __init__(self, path: str, sections: dict[str, Any], origin: str) -> None:
        self.path = path
        self.sections = sections
        self.origin = origin
        self.state = "armed"  # armed -> started | skipped -> stopped
        self.sessions: list[tuple[str, Any]] = []
        self.error: BaseException | None = None
        self.broken: str | None = None  # a config error waiting for the first module call
        self._excepthook: Any = None
        self.framework = "torch"  # "tensorflow" once a TensorFlow program starts training first

    # -- waiting for torch, then for the first module call ------------------------------
    def arm(self) -> None:
        """Hook the import of torch (or the module call at once, if torch is already here)."""
        if "torch" in sys.modules and hasattr(sys.modules["torch"], "nn"):
            self._on_torch_imported()
        else:
            sys.meta_path.insert(0, _TorchImportHook(self._on_torch_imported))
        # a TensorFlow program: the first fit or tf.function call (capture/tensorflow/autostart.py)
        from opscope.capture.tensorflow import autostart as tf_autostart

        for name in ("tensorflow", "keras"):
            arm = getattr(tf_autostart, f"arm_{name}")
            sys.meta_path.insert(0, _TorchImportHook(lambda arm=arm: arm(self._first_tensorflow_use), name=name))

    def _first_tensorflow_use(self) -> list[tuple[str, Any]]:
        if self.state == "armed":
            if _script_uses_opscope():
                self.state = "skipped"
            else:
                self.framework = "tensorflow"
                self.start()
        return self.sessions

    def _on_torch_imported(self) -> None:
        import torch

        module_cls = torch.nn.Module
        original = module_cls.__dict__["__call__"]
        me = self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if module_cls.__dict__.get("__call__") is __call__:
                # one shot: from here on torch runs unpatched (patching a class is what this does)
                module_cls.__call__ = original  # type: ignore[method-assign]
                me._first_module_call()
            return original(module, *args, **kwargs)

        module_cls.__call__ = __call__  # type: ignore[method-assign]  # undone at the first call

    def _first_module_call(self) -> None:
        if self.state != "armed":
            return
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None or _script_uses_opscope():
            # A DataLoader worker runs transforms, not the model; a script that imports
            # opscope runs its own sessions (which read the same OPSCOPE_CONFIG).
            self.state = "skipped"
            return
        self.start()

    # -- sessions -----------------------------------------------------------------------
    def start(self) -> None:
        """Start every configured session that the script does not run itself."""
        if self.broken:
            _fail(self.broken)
        self.state = "started"
        from opscope.config import env, foreign

        line = describe(self.sections, self.framework)
        # the launcher said it once, in PyTorch's levels: a TensorFlow program says its own
        if foreign("RANK", "0") == "0" and (not env("LAUNCHER") or line != describe(self.sections)):
            sys.stderr.write(line + f" (from {ENV_CONFIG})\n")
        try:
            for name, cfg in self.sections.items():
                session = (_make_session(name, cfg, self.path) if self.framework == "torch"
                           else tensorflow_session(name, cfg, self.path))
                if session is not None:
                    session.start()
                    self.sessions.append((name, session))
        except BaseException as exc:
            self.stop(exc)
            raise
        import atexit

        atexit.register(self._at_exit)  # after the sessions' own: runs before them
        self._excepthook = sys.excepthook
        sys.excepthook = self._record_exception
        _handle_sigterm()

    def stop(self, error: BaseException | None = None) -> None:
        """Stop the sessions, last started first; a session that fails does not stop the others."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        for name, session in reversed(self.sessions):
            try:
                if error is None:
                    session.__exit__(None, None, None)
                else:
                    session.__exit__(type(error), error, error.__traceback__)
            except BaseException as exc:  # report and go on: the other sessions still flush
                sys.stderr.write(f"opscope: could not finish the {name} session: {exc}\n")

    def _record_exception(self, exc_type: Any, exc: BaseException, tb: Any) -> None:
        self.error = exc
        self._excepthook(exc_type, exc, tb)

    def _at_exit(self) -> None:
        error = self.error
        if error is None and _terminated.is_set():
            error = SystemExit(f"terminated by SIGTERM (exit code {128 + signal.SIGTERM})")
        self.stop(error)


def _script_uses_opscope() -> bool:
    """Whether the main script holds opscope or something from it (``import opscope``,
    ``from opscope import dump``)."""
    import types

    main = sys.modules.get("__main__")
    for value in list(vars(main).values()) if main is not None else []:
        try:
            name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        except Exception:  # an object with a strange __getattr__ is not opscope's
            continue
        if isinstance(name, str) and (name == "opscope" or name.startswith("opscope.")):
            return True
    return False


def _make_session(name: str, cfg: Any, path: str) -> Any:
    if not cfg.enable:
        return None
    if name == "dump":
        if "opscope.capture.torch.session" in sys.modules:
            return None  # the script called opscope.dump itself
        from opscope.capture.torch.session import DumpSession

        return DumpSession(cfg)
    if name == "profile":
        from opscope.profile import session as profile_session

        if profile_session._active is not None:
            return None
        from opscope.report import renderer

        return profile_session.ProfileSession(cfg, html=renderer("ProfileData", "html"))
    if name == "monitor":
        if "opscope.monitor.session" in sys.modules:
            return None  # the script called opscope.monitor itself
        from opscope import ENTRY_POINTS

        return ENTRY_POINTS["monitor"](config=path)
    return _watch_session(path)


def _watch_session(path: str) -> Any:
    if "opscope.watch.session" in sys.modules:
        return None  # the script called opscope.watch itself
    try:
        import opscope.watch.session  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name in ("opscope.watch", "opscope.watch.session"):
            return None  # this opscope has no overflow watch
        raise
    from opscope import ENTRY_POINTS

    return ENTRY_POINTS["watch"](config=path)


# -- SIGTERM -------------------------------------------------------------------------------
_terminated = threading.Event()


def _handle_sigterm() -> None:
    """Turn SIGTERM into SystemExit so that the sessions flush; leave a user's handler alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no SIGTERM on this platform
        pass


def _on_sigterm(signum: int, frame: Any) -> None:
    if _terminated.is_set():
        return  # a second SIGTERM while flushing: let the flush finish
    _terminated.set()
    raise SystemExit(128 + signum)


# -- post-import hook ------------------------------------------------------------------------
class _TorchImportHook:
    """A ``sys.meta_path`` finder that runs ``callback`` right after ``import torch`` (or the
    module ``name``) completes.

    It never imports torch itself, and costs nothing in processes that do not import it.
    """

    def __init__(self, callback: Any, name: str = "torch") -> None:
        self.callback = callback
        self.name = name
        self._finding = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        # Stays armed until the module is executed: a probe such as TensorFlow's
        # importlib.util.find_spec("keras") asks for a spec it never loads.
        if fullname != self.name or self._finding:
            return None
        import importlib.util

        self._finding = True  # find_spec below must not find us
        try:
            spec = importlib.util.find_spec(self.name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback
        hook = self

        def exec_then_arm(module: Any) -> None:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)  # one shot
            exec_module(module)
            try:
                callback()
            except Exception as exc:  # never break `import torch` for the user
                sys.stderr.write(f"opscope: could not arm capture after importing {self.name}: {exc}\n")

        spec.loader.exec_module = exec_then_arm  # type: ignore[method-assign]  # this spec's loader only
        return spec
