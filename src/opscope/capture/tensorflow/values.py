"""The values of a TensorFlow dump's records: statistics of host arrays, and the full tensor
handed to the dump writer when ``data="tensor"`` (a part of
:class:`~opscope.capture.tensorflow.session.TFDumpSession`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from opscope.capture.tensorflow import absent
from opscope.capture.tensorflow import stats as st
from opscope.capture.tensorflow.plan import GraphPlan
from opscope.capture.tensorflow.rows import Value
from opscope.config import DumpConfig
from opscope.storage.writer import DumpWriter


class TFValues:
    """Measuring arrays into record values; the session provides these attributes."""

    cfg: DumpConfig
    writer: DumpWriter | None
    notes: list[str]
    clock: Any
    _keys: int

    def _guard(self, fn: Any, *args: Any) -> Any:
        raise NotImplementedError

    def _measure(self, tensor: Any) -> Value | None:
        try:
            arr = st.array_of(tensor)
        except Exception:  # a tensor with no host buffer (a resource, a variant)
            return None
        return self._value(arr)

    def _measure_all(self, plan: GraphPlan, arrays: list[Any]) -> list[Value | None]:
        """A graph run's values: numpy arrays (a 0-d tensor comes as a numpy scalar); an
        absent one (the graph that ran has no such tensor) without statistics or data."""
        arrays = [np.asarray(a) for a in arrays]
        stats = st.many_stats(arrays)
        name = st.name_of  # what _value gives for statistics, without a call per array
        values = [self._value(a, s) if self.cfg.data == "tensor" and not absent.is_missing(a.shape)
                  else (name(a), list(a.shape), a.size, s, None, None) for a, s in zip(arrays, stats, strict=True)]
        return absent.values(plan, values, self.notes)

    def _value(self, arr: Any, stats: tuple[Any, ...] | None = None) -> Value:
        stats = st.host_stats(arr) if stats is None else stats
        data = key = None
        if self.cfg.data != "tensor":
            return st.name_of(arr), list(arr.shape), int(arr.size), stats, None, None
        dtype, shape, buf = st.stored_buffer(arr)
        if self.writer is not None and dtype != "object":
            self._keys += 1
            key = f"v{self._keys}"
            data = self._guard(self.writer.add_tensor, self.clock.step, key, dtype, shape, buf, buf.nbytes)
        return dtype, shape, int(arr.size), stats, data, key

