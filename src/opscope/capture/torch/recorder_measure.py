"""How the Python path's recorder measures a row's tensor and stores its data (the half of
:class:`~opscope.capture.torch.recorder.Recorder` that touches tensor memory)."""

from __future__ import annotations

from typing import Any

import torch

from opscope.capture.torch.modules import PLAIN_TENSORS
from opscope.capture.torch.stats import cpu_stats, device_stats
from opscope.capture.torch.suspects import TensorPlan
from opscope.capture.torch.worker import NativeStats, tensor_buffer
from opscope.model.records import COL, STATS, SUBCLASS_NOTE, WRAPPED_NOTE
from opscope.storage.writer import DumpWriter

_ID, _DATA, _KEY, _NOTE, _STEP = COL["id"], COL["data"], COL["key"], COL["note"], COL["step"]
_STRIDED = torch.strided
_dispatch_keys = torch._C._dispatch_keys
_PYTHON_KEY = torch._C.DispatchKey.Python
_FUNCTORCH_KEYS = tuple(getattr(torch._C.DispatchKey, k) for k in (
    "FuncTorchBatched", "FuncTorchGradWrapper", "Functionalize"))
_level = torch._C._functorch.maybe_current_level  # None outside torch.func's transforms
_DisableTorchFunction = torch._C.DisableTorchFunction


def unreadable(t: torch.Tensor) -> str | None:
    """Why ``t``'s elements cannot be read here, if they cannot: a subclass dispatched to Python
    (FSDP's DTensor parameters, FakeTensor) may say "cpu" while it holds no data of its own, and
    torch.vmap's batched tensors and torch.func.grad's wrappers hold no storage (as natively)."""
    if t.__class__ not in PLAIN_TENSORS:
        return SUBCLASS_NOTE if _dispatch_keys(t).has(_PYTHON_KEY) else None
    if _level() is None:
        return None
    keys = _dispatch_keys(t)
    return WRAPPED_NOTE if any(keys.has(k) for k in _FUNCTORCH_KEYS) else None


class Measuring:
    """A row's statistics (on the native worker thread, the calling thread or the device) and
    its tensor, handed to the writer."""

    probing: bool
    worker: NativeStats | None
    meta_skipped: int
    engine: str
    device_jobs: list[tuple[list[Any], Any]]
    writer: DumpWriter
    plan: TensorPlan | None

    def _measure(self, row: list[Any], t: torch.Tensor, data: bool) -> None:
        if self.probing:
            return  # a size probe: shapes and dtypes are all it needs
        why = unreadable(t)
        if why is not None:
            row[_NOTE] = why
            return
        if self.worker is not None and t.is_cpu and t.layout is _STRIDED:
            self.worker.submit(row, t, data)
            return
        device = t.device.type
        if device == "meta":
            row[_NOTE] = "meta tensor: no data, not measured"
            self.meta_skipped += 1
            return
        if t.layout != torch.strided or t.is_quantized:
            row[_NOTE] = f"{t.layout} tensor: not measured"
            return
        if device == "cpu" and self.worker is not None:
            self.worker.submit(row, t, data)
            return
        if device == "cpu" and self.engine != "torch":
            row[STATS] = cpu_stats(t)
        else:
            # torch's own calls: where a hook (the optimizer's, a backward's outside
            # Tensor.backward) measures while the api level's TorchFunctionMode is active, they are
            # no calls of the user's (before session 43 they were recorded: an api dump with the
            # torch engine held four times its rows, the hash's bitwise_xor_, stack and sums)
            with _DisableTorchFunction():
                self.device_jobs.append((row, device_stats(t)))
        if data:
            with _DisableTorchFunction():  # (as above: the copy and its bytes are no calls of the user's)
                row[_DATA] = self._store(row, t.detach().to("cpu", copy=True).contiguous())

    def _publish(self, row: list[Any], buffer: Any) -> str | None:
        """Hand the writer the bytes the native thread copied for ``row`` (dtype and shape
        are the row's own)."""
        if getattr(self.writer, "error", None) is not None:
            return None  # the disk failed: the error reaches the user once, from the step
        if self.plan is not None and not self.plan.admit(row, buffer.nbytes, _where(row)):
            return None  # past tensor_limit_mb: statistics only from here on
        key = f"r{row[_ID]}"
        row[_KEY] = key
        return self.writer.add_tensor(row[_STEP], key, row[11], row[12], buffer, buffer.nbytes)

    def _store(self, row: list[Any], copy: torch.Tensor) -> str | None:
        dtype, shape, raw, nbytes = tensor_buffer(copy)
        if self.plan is not None and not self.plan.admit(row, nbytes, _where(row)):
            return None  # past tensor_limit_mb: statistics only from here on
        key = f"r{row[_ID]}"
        row[_KEY] = key
        return self.writer.add_tensor(row[_STEP], key, dtype, shape, raw, nbytes)


def _where(row: list[Any]) -> tuple[Any, ...]:
    return (row[_STEP], row[COL["phase"]], row[COL["module"]], row[COL["op"]], row[COL["io"]], row[COL["slot"]])
