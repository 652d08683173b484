"""Layer level: a Keras layer dump (``tf-layer``) against the module dump of its PyTorch port.

Calls are the layers' and modules' forward calls, in the order they return. They match:

1. **by name**: a Keras layer and a torch module of the same path (after the mapping file's
   ``modules`` renames) whose outputs have the same size;
2. **by order and kind**: the rest, sequence-aligned: a Keras layer goes with a torch module
   of a corresponding class (``Dense`` / ``Linear``, ``Conv2D`` / ``Conv2d``:
   :data:`~opscope.compare.crossframework.tables.keras.LAYER_TO_TORCH`) and an output of the
   same size; ties go to the closer output norm.

A Keras layer with an activation (``Dense(16, activation="relu")``) stands for the torch
module and the activation module that reads its output (``Linear`` then ``ReLU``): its
output pairs with the activation's, and the torch module's own output stays unpaired.
When the port's activation is another one (``Tanh``), they still pair, with a note, so
that the verdict names the layer.

Gradients handed to the optimizer pair through their layers: ``dense_1/kernel`` goes with
``<the module dense_1 matched>.weight`` (:data:`~opscope.compare.crossframework.tables.keras.PARAM_NAMES`),
or by name where the mapping file's ``params`` renamed it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from opscope.compare.align import OpCall
from opscope.compare.crossframework.matcher import Claims
from opscope.compare.crossframework.runs import Match
from opscope.compare.crossframework.sides import Side, is_forward
from opscope.compare.crossframework.tables.keras import ACTIVATION_MODULES, ACTIVATIONS, PARAM_NAMES
from opscope.compare.crossframework.tables.table import OpTable


def match_layers(t: Side, r: Side, claims: Claims) -> None:
    """Fill ``claims`` with the matched layer calls and gradients of a Keras and a torch side."""
    foreign, torch = (t, r) if t.foreign else (r, t)
    assert foreign.table is not None
    matcher = _LayerMatcher(foreign, torch, foreign.table, claims, t is foreign)
    matcher.by_name()
    matcher.by_order()
    matcher.gradients()


def layer_args(call: OpCall) -> dict[str, Any]:
    """The Keras layer's settings recorded with its rows (activation, data_format)."""
    raw = call.rows[0].get("args")
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def exit_seq(call: OpCall) -> int:
    """When the call returned: the sequence number of its last row."""
    return max(int(row["seq"]) for row in call.rows)


class _LayerMatcher:
    def __init__(self, foreign: Side, torch: Side, table: OpTable, claims: Claims, foreign_is_target: bool) -> None:
        self.foreign, self.torch, self.table, self.claims = foreign, torch, table, claims
        self.foreign_is_target = foreign_is_target
        self.f_calls = sorted((c for c in foreign.calls if is_forward(c) and c.outputs()), key=exit_seq)
        self.p_calls = sorted((c for c in torch.calls if is_forward(c) and c.outputs()), key=exit_seq)
        self.partner: dict[int, list[OpCall]] = {}  # Keras call seq -> the torch calls it stands for

    # -- candidates ---------------------------------------------------------------------
    def run_for(self, f: OpCall, p: OpCall) -> list[OpCall] | None:
        """The torch calls ``f`` stands for, starting at ``p``: ``[p]``, or ``[p, activation]``
        when the Keras layer applies an activation (None: no such module reads p's output)."""
        activation = layer_args(f).get("activation")
        if not activation or self.table.to_torch.get(f.op, frozenset()) & ACTIVATIONS:
            return [p]
        readers = self.torch.consumers.get(p.outputs()[0]["id"], [])
        follower = next((c for c in readers if c.op in ACTIVATIONS and is_forward(c) and c.outputs()), None)
        return None if follower is None else [p, follower]

    def score(self, f: OpCall, run: list[OpCall], by_kind: bool) -> float:
        """How well ``f`` matches the torch ``run`` (0: not at all)."""
        out_f, out_p = f.outputs()[0], run[-1].outputs()[0]
        if out_f.get("numel") != out_p.get("numel"):
            return 0.0
        kind = f.op == run[0].op or self.table.corresponds(f.op, run[0].op)
        if by_kind and not kind:
            return 0.0
        s = 4.0 if kind else 2.0
        activation = layer_args(f).get("activation")
        if len(run) > 1 and run[-1].op not in ACTIVATION_MODULES.get(str(activation), frozenset()):
            s -= 1.0  # another activation than Keras': still the same place in the model
        na, nb = out_f.get("norm"), out_p.get("norm")
        if na is not None and nb is not None and math.isfinite(na) and math.isfinite(nb):
            s += 1.0 - min(1.0, abs(na - nb) / max(abs(na), abs(nb), 1e-30))
        return s

    def claim(self, f: OpCall, run: list[OpCall]) -> None:
        self.partner[f.seq] = run
        note = self._note(f, run)
        for slot, f_row in enumerate(f.outputs()):
            p_outs = run[-1].outputs()
            if slot < len(p_outs) and p_outs[slot].get("numel") == f_row.get("numel"):
                self._add(f, run, f_row, p_outs[slot], note)
        self._params(f, run)
        if len(run) > 1:
            self.claims.notes[(self.torch.name, run[0].seq)] = (
                f"{run[0].op} {run[0].module}: no Keras layer of its own ({f.op} {f.module} applies "
                f"{layer_args(f).get('activation')} inside; its output is paired with {run[-1].op} {run[-1].module}'s)")

    def _params(self, f: OpCall, run: list[OpCall]) -> None:
        """The Keras layer's weights against the torch module's parameters (``kernel`` / ``weight``)."""
        ins = [row for row in f.inputs() if row.get("io") == "input"]
        free = [row for row in run[0].inputs() if row.get("io") == "param"]
        for f_row in (row for row in f.inputs() if row.get("io") == "param" and row.get("param")):
            own = PARAM_NAMES.get(str(f_row.get("orig_param") or f_row["param"]).rsplit("/", 1)[-1])
            p_row = next((p for p in free if str(p.get("param") or "").rsplit(".", 1)[-1] == own
                          and p.get("numel") == f_row.get("numel")), None)
            if p_row is not None:
                free.remove(p_row)
                if ins:
                    f_row["layer_input"] = ins[0]["id"]  # the layout of a kernel's input axis (layouts.py)
                self._add(f, run, f_row, p_row, f"{f_row['param']} against {p_row['param']}")

    def _note(self, f: OpCall, run: list[OpCall]) -> str:
        if len(run) == 1:
            return ""
        activation = layer_args(f).get("activation")
        same = run[-1].op in ACTIVATION_MODULES.get(str(activation), frozenset())
        return (f"{f.op} {f.module} applies {activation}: its output against {run[-1].op} {run[-1].module}"
                + ("" if same else f" (a different activation: Keras applies {activation}, the port {run[-1].op})"))

    def _add(self, f: OpCall, run: list[OpCall], f_row: dict[str, Any], p_row: dict[str, Any], note: str) -> None:
        t_calls, r_calls = ([f], run) if self.foreign_is_target else (run, [f])
        self.claims.claim(Match(t_calls, r_calls, note, rows=(f_row, p_row)))

    # -- passes -------------------------------------------------------------------------
    def by_name(self) -> None:
        by_module: dict[str, list[OpCall]] = defaultdict(list)
        for p in self.p_calls:
            by_module[p.module].append(p)
        used: set[int] = set()
        for f in self.f_calls:
            for p in by_module.get(f.module, []):
                run = self.run_for(f, p) if p.seq not in used else None
                if run and not any(c.seq in used for c in run) and self.score(f, run, by_kind=False):
                    used.update(c.seq for c in run)
                    self.claim(f, run)
                    break

    def by_order(self) -> None:
        """The calls left, sequence-aligned by kind and output size (dynamic programming)."""
        taken = {c.seq for run in self.partner.values() for c in run}
        fs = [f for f in self.f_calls if f.seq not in self.partner]
        ps = [p for p in self.p_calls if p.seq not in taken]
        n, m = len(fs), len(ps)
        if not n or not m or n * m > 250_000:
            return
        score = [[0.0] * (m + 1) for _ in range(n + 1)]
        move: dict[tuple[int, int], int] = {}  # 0 skip f, 1 skip p, k >= 2: match f with k - 1 torch calls
        for i in range(n - 1, -1, -1):
            for j in range(m - 1, -1, -1):
                best, how = score[i + 1][j], 0
                if score[i][j + 1] > best:
                    best, how = score[i][j + 1], 1
                run = self.run_for(fs[i], ps[j])
                if run and (len(run) == 1 or (j + 1 < m and ps[j + 1] is run[1])):
                    s = self.score(fs[i], run, by_kind=True)
                    if s and score[i + 1][j + len(run)] + s > best:
                        best, how = score[i + 1][j + len(run)] + s, len(run) + 1
                score[i][j], move[(i, j)] = best, how
        i = j = 0
        while i < n and j < m:
            how = move[(i, j)]
            if how >= 2:
                self.claim(fs[i], ps[j:j + how - 1])
            i, j = (i + 1, j) if how == 0 else (i, j + 1) if how == 1 else (i + 1, j + how - 1)

    def gradients(self) -> None:
        """Each gradient the Keras optimizer got against the torch one of the same parameter."""
        owners = {self._orig(c, "module"): run[0].module for c in self.f_calls
                  if (run := self.partner.get(c.seq)) is not None}
        inputs = {self._orig(c, "module"): ins[0]["id"] for c in self.f_calls
                  if c.seq in self.partner and (ins := [r for r in c.inputs() if r.get("io") == "input"])}
        p_grads = {str(row["param"]): row for row in self.torch.rows if row.get("io") == "grad" and row.get("param")}
        used: set[int] = set()
        for f_row in self.foreign.rows:
            if f_row.get("io") != "grad" or not f_row.get("param"):
                continue
            keras_path = str(f_row.get("orig_param") or f_row["param"])
            name = torch_param(keras_path, owners)
            layer = owner_layer(keras_path, inputs)
            if layer is not None:
                f_row["layer_input"] = inputs[layer]  # the layout of a kernel's input axis (layouts.py)
            p_row = p_grads.get(str(f_row["param"])) or (p_grads.get(name) if name else None)
            if p_row is None or id(p_row) in used or p_row.get("numel") != f_row.get("numel"):
                continue
            used.add(id(p_row))
            f_call, p_call = self.foreign.call_of[f_row["id"]], self.torch.call_of[p_row["id"]]
            self._add(f_call, [p_call], f_row, p_row, f"gradient of {f_row['param']} against {p_row['param']}")

    @staticmethod
    def _orig(call: OpCall, column: str) -> str:
        row = call.rows[0]
        return str(row.get(f"orig_{column}", row.get(column)) or "")


def owner_layer(keras_path: str, layers: dict[str, Any]) -> str | None:
    """The layer (a key of ``layers``) that owns a Keras variable: the longest layer path
    that the variable's path ends with (``mlp/dense_1/kernel`` -> ``dense_1``)."""
    parts = keras_path.split("/")
    for start in range(len(parts) - 1):
        if ".".join(parts[start:-1]) in layers:
            return ".".join(parts[start:-1])
    return None


def torch_param(keras_path: str, owners: dict[str, str]) -> str | None:
    """The torch name of a Keras variable: ``mlp/dense_1/kernel`` with layer ``dense_1``
    matched to module ``fc1`` -> ``fc1.weight`` (None: its layer matched nothing)."""
    own = PARAM_NAMES.get(keras_path.rsplit("/", 1)[-1])
    layer = owner_layer(keras_path, owners)
    if own is None or layer is None:
        return None
    return f"{owners[layer]}.{own}" if owners[layer] else own


__all__ = ["exit_seq", "layer_args", "match_layers", "owner_layer", "torch_param"]
