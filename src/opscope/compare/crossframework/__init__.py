"""Alignment across frameworks: a PyTorch dump against an ONNX Runtime dump (either side may
be the target), or two ONNX Runtime dumps (an fp16 copy against its fp32 original, one
provider or optimisation level against another).

The two sides' op names differ (``aten.addmm.default`` / ``onnx::Gemm``) and one torch op
may be several ONNX nodes or the reverse, so calls are not paired by name. Within one
(rank, step), per module path:

1. **Ops** (aten and api levels) are sequence-aligned with the foreign side's
   :meth:`OpTable.corresponds <opscope.compare.crossframework.tables.OpTable.corresponds>` as
   the match predicate. A torch op may also match a run of ONNX nodes that
   :meth:`~opscope.compare.crossframework.tables.OpTable.is_decomposition` accepts (GELU as
   Div/Erf/Add/Mul/Mul): its output pairs with the run's last node, the inner nodes stay
   unpaired. One ONNX node may match a run of torch ops that
   :meth:`~opscope.compare.crossframework.tables.OpTable.is_fusion` accepts (ORT's fused nodes), paired
   with the run's last op. A BatchNorm folded into the preceding Conv pairs the ONNX
   ``Conv`` output with the torch batch-norm output; the torch convolution is left unpaired.
2. **Modules** (module level): a torch module's output pairs with the last output of its
   module subtree on the ONNX side that leaves the subtree.
3. **Inputs and parameters**: model inputs pair with graph inputs (same content first), and
   parameters by name; an op's inputs pair where their producers are paired.
4. An element-preserving op on one side only (a view, a reshape, a cast) is judged as an
   identity, as in same-framework alignment; every other one-sided op is left unpaired
   and its rows are folded into the call of the paired op that consumes its output (its
   ``cseq``), so that call's verdict sees the inputs of the whole region it stands for.

Two ONNX dumps pair nodes of the same name and op first, then the rest as above with op
equality as the predicate.

Nothing here is ONNX-specific: what the aligner knows of a framework other than torch is
its :class:`~opscope.compare.crossframework.tables.OpTable`, found by the dump's capture
level. Another framework (TensorFlow; msprobe or MindSpore dumps read into opscope records)
is a new table in :mod:`opscope.compare.crossframework.tables` (and a reader), not an edit
here.

Modules, in the order data flows through them:

- :mod:`~.levels` — a dump's capture level; :func:`is_cross` picks this aligner.
- :mod:`~.tables` — the op-table interface and the per-framework tables (``tables/onnx.py``);
  :mod:`~.torchnames` — the torch op vocabulary the tables map onto.
- :mod:`~.sides` — a :class:`~.sides.Side`: one dump's calls and their data flow.
- :mod:`~.runs` — sequence alignment with runs (decompositions, fusions) in one module.
- :mod:`~.matcher` — :class:`~.matcher.CallMatcher` fills :class:`~.matcher.Claims` with matched calls.
- :mod:`~.pairing` — :class:`~.pairing.RowPairing` pairs the rows of the matched calls.
- :mod:`~.aligner` — :func:`align_partition` drives the three.
- :mod:`~.layers` and :mod:`~.layouts` — a layer-level dump (a Keras model, table
  ``tables/keras.py``) against the module dump of its PyTorch port: layers matched by name
  or by order and kind instead of the :class:`~.matcher.CallMatcher`, and the Keras tensors
  read in torch's layout (channels-last activations, kernels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opscope.compare.crossframework.levels import (
           TORCH_LEVELS,
           dump_level,
           is_cross,
           manifest_warnings,
)
from opscope.compare.crossframework.tables import OpTable, register_table, table_for

if TYPE_CHECKING:
    from opscope.compare.align import Pair


def align_partition(t_rows: list[dict[str, Any]], r_rows: list[dict[str, Any]],
                    t_level: str | None, r_level: str | None) -> list[Pair]:
    """Align one (rank, step) of two dumps of which at least one is a foreign (non-torch) dump
    (:func:`.aligner.align_partition`, imported on the first call: a compare of two torch
    dumps never needs the matcher, ~15 ms of imports at every start)."""
    from opscope.compare.crossframework.aligner import align_partition as align

    return align(t_rows, r_rows, t_level, r_level)

__all__ = ["TORCH_LEVELS", "OpTable", "align_partition", "dump_level", "is_cross", "manifest_warnings",
           "register_table", "table_for"]
