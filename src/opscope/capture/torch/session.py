"""``opscope.dump``: the public entry point of PyTorch capture."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

from opscope.capture.steps import StepClock
from opscope.capture.torch import levels, run_info
from opscope.capture.torch.checkpointing import Recomputations
from opscope.capture.torch.collectives import CollectiveCalls
from opscope.capture.torch.compiled import CompileWatch
from opscope.capture.torch.dist import current_rank
from opscope.capture.torch.grad_scaler import ScalerHooks
from opscope.capture.torch.modules import ModuleTracker
from opscope.capture.torch.native import aten as native_aten
from opscope.capture.torch.optimizer_hooks import OptimizerHooks
from opscope.capture.torch.optimizers import has_optimizer
from opscope.capture.torch.recorder import Recorder
from opscope.config import TF_LEVELS, DumpConfig, dump_config
from opscope.errors import ConfigError, OpscopeError
from opscope.storage.arrow_build import convert_ready
from opscope.storage.writer import DumpWriter

if TYPE_CHECKING:
    from opscope.storage.reader import Dump


def dump(path: str | os.PathLike | None = None, *, config: Any = None, **keys: Any) -> DumpSession:
    """Record what every operator receives and produces, at the chosen steps and ranks.

    Use as a context manager around the training loop (call ``d.step()`` at each step's
    end, or let opscope find steps from ``optimizer.step()``), or ``start()``/``stop()``.

    Args:
        path: the dump directory (or ``path`` in the config).
        config: a config file path (JSON, YAML, TOML) or mapping; ``$OPSCOPE_CONFIG`` if None.
        **keys: any dump key: steps, ranks, mode, level, data, scope, ops, tensor_ops,
            phases, source, overwrite, queue_limit_mb, shard_mb, suspects, tensor_limit_mb,
            estimate_from (see docs/dump.md).

    Returns:
        A :class:`DumpSession`; its ``stop()`` returns the written :class:`opscope.Dump`.

    Raises:
        ConfigError: a bad key or value, before anything is captured.
    """
    return DumpSession(dump_config(config, path=path, **keys))


class DumpSession:
    """A running (or ready) dump. See :func:`dump`."""

    recorder: Recorder
    """Where captured calls go. Set by :meth:`start` on a rank that captures: the attribute
    does not exist before, so the per-op paths that read it pay no None check."""

    def __init__(self, cfg: DumpConfig, open_writer: Callable[[], Any] | None = None) -> None:
        """``open_writer`` gives where rows and tensors go when the session starts (the watch's
        flight recorder hands a ring buffer); by default a :class:`DumpWriter` at ``cfg.path``."""
        if cfg.level in TF_LEVELS:
            raise ConfigError(f"level: {cfg.level!r} is a TensorFlow level (opscope.tensorflow.dump); for PyTorch "
                              "give aten (every op), api (torch functions) or module")
        self.cfg = cfg
        self.open_writer = open_writer or self._open_dump_writer
        self.rank = current_rank()
        self.active = cfg.enable and (cfg.ranks is None or self.rank in cfg.ranks)
        self.capturing = False
        self.phase = "forward"
        self.started = False
        self.notes: list[str] = []
        self.failure: BaseException | None = None
        self.clock = StepClock(self._boundary, has_optimizer=has_optimizer)
        self.modules = ModuleTracker(self._outer_module_call)
        self.recompute_node: Any = None  # the autograd node activation checkpointing recomputes inside
        self.recomputations = Recomputations(self)  # marked while the dump runs
        self.compiled = CompileWatch(self)  # torch.compile: what runs is recorded, not what is traced
        self.writer: DumpWriter | None = None
        self._result: Dump | None = None
        self._level: levels.Level | None = None
        self._handles: list[Any] = []
        self._modules_on = False  # the module hooks are installed
        self.optimizer_hooks = OptimizerHooks(self)
        self.scaler_hooks = ScalerHooks(self)  # module level: GradScaler's scale, recorded in place of its ops
        self.collective_depth = 0  # inside a torch.distributed collective's call (collectives.py)
        self.collective_calls: CollectiveCalls | None = None  # aten level: those calls, marked

    @property
    def level(self) -> levels.Level | None:
        """The capture level (None before :meth:`start`); ``compiled`` records graphs through it."""
        return self._level

    @property
    def step_index(self) -> int:
        """The step being executed (0-based)."""
        return self.clock.step

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> DumpSession:
        """Install the capture hooks. A rank not in ``ranks`` installs nothing."""
        if self.started:
            raise ConfigError("this dump was already started; create a new opscope.dump(...) to dump again")
        self.started = True
        if not self.active:
            return self
        cfg = self.cfg
        source = None  # the records estimate_from names, read before anything is written
        if cfg.estimate_from and (cfg.data == "tensor" or cfg.tensor_ops):
            from opscope.capture.torch.suspects import read_source

            source = read_source(cfg, self.rank)
        self.writer = self.open_writer()
        backend = native_aten.backend_for(cfg)
        if backend is not None:  # the aten, api or module level through the native dump module
            self.recorder = native_aten.NativeRecorder(cfg, self.writer, self.rank, self.modules.param_names, backend)
        else:
            self.recorder = Recorder(cfg, self.writer, self.rank, self.modules.param_names, run_info.engine(cfg.level))
            convert_ready()  # this path's writer converts lists: pyarrow's first conversion imports pandas
        if self.recorder.plan is not None:  # the tensor size, said before any tensor is written
            self.recorder.plan.before_start(source, self.recorder.selected)
        if backend is not None:
            from opscope.capture.torch.native.api import NativeApiLevel
            from opscope.capture.torch.native.module import NativeModuleLevel

            native_level = {"module": NativeModuleLevel, "api": NativeApiLevel}.get(
                cfg.level, native_aten.NativeAtenLevel)
            self._level = native_level(self, backend)
            with self.writer.editing_manifest() as manifest:  # written with the status at the end
                manifest["stats_backend"] = "native"
        else:
            self._level = levels.make(cfg.level, self)
        self._watch_modules(True)
        self.compiled.poll()
        self._watch_optimizers(True)
        if cfg.level == "module":
            self.scaler_hooks.install()
        if cfg.level == "aten":
            self.collective_calls = CollectiveCalls(backend.collective if backend is not None else self._collective)
            self.collective_calls.install()
        self.recomputations.install()
        atexit.register(self._atexit)
        # a process forked while capturing (a DataLoader worker) inherits the hooks and
        # the dispatch mode; it must not capture, nor pay for capturing
        os.register_at_fork(after_in_child=self._forked)
        self._enter_step(0)
        return self

    def _open_dump_writer(self) -> DumpWriter:
        return self.new_writer(self.cfg.path, self.manifest(), self.cfg.overwrite)

    def new_writer(self, path: str, manifest: dict[str, Any], overwrite: bool = False) -> DumpWriter:
        """An open :class:`DumpWriter` for this session's rank at ``path``."""
        cfg = self.cfg
        writer = DumpWriter(path, self.rank, manifest, queue_limit=int(cfg.queue_limit_mb * 2**20),
                            shard_bytes=int(cfg.shard_mb * 2**20), overwrite=overwrite, batch=True)
        writer.open()
        return writer

    def step(self) -> None:
        """End the current step (call once per training iteration)."""
        if self.active and self.started:
            self.clock.user_step()

    def stop(self) -> Dump | None:
        """Flush everything, remove every hook, mark the dump complete; returns :attr:`result`."""
        self.finish("complete")
        return self.result

    @property
    def result(self) -> Dump | None:
        """The finished dump (an :class:`opscope.Dump`, as ``stop()`` returns it), also after
        a ``with`` block; None while it runs and on a rank that dumps nothing."""
        if self._result is None and self.writer is not None and not self.started:
            from opscope.storage.reader import load

            self._result = load(self.cfg.path)
        return self._result

    def __enter__(self) -> DumpSession:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.finish("complete")
        else:
            self.finish("crashed", f"{exc_type.__name__}: {exc}")

    def finish(self, status: str, error: str | None = None) -> None:
        """Flush, remove every hook and close the writer with ``status`` (``stop()`` without loading)."""
        if not self.started or not self.active or self.writer is None:
            self.started = False
            return
        self.started = False
        atexit.unregister(self._atexit)
        failure: BaseException | None = None
        try:
            if self.capturing:
                self.capturing = False
                self.recorder.end_step()
        except BaseException as exc:  # the writer or worker failed: still remove every hook
            failure, status, error = exc, "crashed", error or str(exc)
        finally:
            self._remove_hooks()
            with contextlib.suppress(Exception):  # already reported above; the status must still be written
                self.recorder.close()
            if status == "complete":
                self._note_unreached()
            self._note_disk_wait()
            if self.failure is not None and status == "complete":
                status, error = "crashed", f"opscope internal error: {type(self.failure).__name__}: {self.failure}"
            with self.writer.editing_manifest() as manifest:  # (the writer thread still runs)
                manifest["notes"] = self.notes + self.modules.said
                compiled = self.compiled.manifest()
                if compiled is not None:
                    manifest["compiled"] = compiled
                if self.recorder.plan is not None:  # tensor sizes, estimate, where tensor_limit_mb stopped capture
                    self.recorder.plan.finish(manifest)
            self.writer.close(status, error)
        if failure is not None and status == "crashed" and error == str(failure):
            raise failure
        if status == "complete" and self.writer.error is not None:  # met writing the last steps
            raise self.writer.error

    def _remove_hooks(self) -> None:
        if self._level is not None:
            self._level.deactivate()
            self._level.remove()
        self._watch_modules(False)
        self.compiled.remove()
        self._watch_optimizers(False)
        self.scaler_hooks.remove()
        self.recomputations.remove()
        if self.collective_calls is not None:
            self.collective_calls.remove()
            self.collective_calls = None

    def _collective(self, delta: int) -> None:
        self.collective_depth = max(0, self.collective_depth + delta)

    def internal_error(self, exc: BaseException) -> None:
        """An error inside opscope itself: stop capturing, keep what was captured, say so once.
        The user's run goes on untouched."""
        if self.failure is None:
            self.failure = exc
            self.capturing = False
            if self._level is not None:
                self._level.stop_capture()
            message = (f"opscope dump stopped capturing at step {self.clock.step} after an internal error "
                       f"({type(exc).__name__}: {exc}); your run goes on. Please report this with the traceback.")
            self.notes.append(message)
            import traceback
            import warnings

            self.notes.append("".join(traceback.format_exception(exc))[-2000:])
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _forked(self) -> None:
        self.active = self.capturing = False
        self.started = False
        if self._level is not None:  # the child inherits the parent thread's observer
            self._level.forked()

    def _atexit(self) -> None:
        self.finish("complete")

    def _note_unreached(self) -> None:
        last = self.cfg.steps.last
        if last is not None and self.clock.step < last:
            missing = sorted(s for s in self.cfg.steps.steps or () if s > self.clock.step)
            self.notes.append(f"the run stopped at step {self.clock.step}; selected steps {missing} were never reached")

    def _note_disk_wait(self) -> None:
        note = self.writer.wait_note() if isinstance(self.writer, DumpWriter) else None
        if note is not None:
            self.notes.append(note)

    # -- steps -------------------------------------------------------------------------
    def _enter_step(self, step: int) -> None:
        if not self.active or self.failure is not None:
            return
        self.compiled.poll()  # torch.compile may have loaded dynamo since
        probe = step not in self.cfg.steps and self._probe_due(step)
        if step in self.cfg.steps or probe:
            if not self._handles:  # back from steps not selected: the optimizer's phase starts over
                self.phase = "forward"
                self._watch_optimizers(True)
            self._watch_modules(True)
            self.recorder.begin_step(step, probe=probe)
            self.capturing = True
            self.started_level().activate()
            return
        self.capturing = False
        level = self.started_level()
        if level.on:  # the first step after a captured one (later ones find nothing to undo)
            level.deactivate()
            self.recorder.idle()
        if self.clock.manual and not self.modules.stack:
            # steps end at d.step() only: until a captured step, module calls and optimizer steps
            # need no watching (global module hooks put every module call on torch's slower path,
            # and the optimizer's hooks would run Python twice a step): nothing of opscope runs
            # between two boundaries of a step not selected
            self._watch_modules(False)
            self._watch_optimizers(False)

    def _watch_modules(self, on: bool) -> None:
        if on != self._modules_on:
            self._modules_on = on
            if on:
                self.modules.install()
            else:
                self.modules.remove()

    def _watch_optimizers(self, on: bool) -> None:
        """torch's global optimizer step hooks, installed (``on``) or removed."""
        if on and not self._handles:
            from torch.optim import optimizer as opt

            hooks = self.optimizer_hooks
            self._handles = [opt.register_optimizer_step_pre_hook(hooks.pre),
                             opt.register_optimizer_step_post_hook(hooks.post)]
        elif not on:
            for h in self._handles:
                h.remove()
            self._handles = []

    def _probe_due(self, step: int) -> bool:
        """Measure the step just before a tensor window opens, to say its size beforehand
        (not needed when the size is known already: suspects, estimate_from)."""
        plan, selected = self.recorder.plan, self.cfg.steps.steps
        if plan is None or plan.estimate is not None or not selected:
            return False
        return step + 1 == min(selected)

    def _boundary(self, finished: int, step: int) -> None:
        if self.capturing:
            self.capturing = False
            try:
                self.recorder.end_step()
            except OpscopeError:
                raise
            except Exception as exc:
                self.internal_error(exc)
        self._enter_step(step)

    # -- phases ------------------------------------------------------------------------
    def backward_ran(self) -> None:
        """An op of the autograd engine ran: from now on, until the optimizer step or the next
        forward, ops are ``backward`` (gradient clipping, GradScaler unscaling, a manual
        all-reduce run between ``loss.backward()`` and ``optimizer.step()``). The native
        observer flips its own phase likewise."""
        if self.phase == "forward":
            self.phase = "backward"

    def _outer_module_call(self, module: Any = None) -> None:
        """The outermost module is called: a forward pass starts (before the step boundary
        it may resolve, whose capture starts in this phase)."""
        self.compiled.poll()  # torch.compile may have loaded dynamo since
        if self.phase != "optimizer":
            self.phase = "forward"
            if self.capturing:
                self.started_level().set_phase("forward")
        self.clock.outer_module_call(module)

    def started_level(self) -> levels.Level:
        """The capture level; the hooks that call this are installed by :meth:`start` after it."""
        if self._level is None:
            raise RuntimeError("opscope internal error: a capture hook ran before the dump's level existed")
        return self._level

    # -- helpers -----------------------------------------------------------------------
    def source(self) -> str | None:
        """The user's innermost frame outside torch and opscope, as ``file:line (function)``."""
        frame: FrameType | None = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if not name.startswith(_LIBRARY_DIRS) and not name.startswith("<"):
                return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
            frame = frame.f_back
        return None

    def manifest(self) -> dict[str, Any]:
        """The manifest a dump of this session starts with (its status is written at the end)."""
        return run_info.manifest(self.cfg)


# Frames inside these directories are library code, never "the user's line".
_LIBRARY_DIRS = tuple(os.path.dirname(m.__file__) + os.sep
                      for m in (torch, sys.modules["opscope"], contextlib) if m.__file__ is not None)
